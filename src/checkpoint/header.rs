//! The JSON header of a safetensors file, read as a stream into its tensor entries: memory in
//! proportion to the entries kept (no JSON tree of the whole header), a shape of at most
//! [`MAX_RANK`] extents, the rules of the safetensors crate otherwise (UTF-8 throughout,
//! `__metadata__` a map of strings, no field given twice). A tensor named twice is the caller's
//! to refuse, as it keeps the entries by name.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The most extents a shape may have. safetensors sets no bound; a checkpoint's tensors have a
/// few, and a header of one shape of millions of extents would otherwise cost memory in
/// proportion.
pub(super) const MAX_RANK: usize = 16;

/// One tensor of the header, as written.
pub(super) struct Entry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    /// `data_offsets`: begin and end within the data.
    pub offsets: (u64, u64),
}

/// Why a header was refused.
pub(super) enum HeaderError {
    /// Not a JSON object (the parser's message).
    NotJson(String),
    /// Tensor `name`'s entry breaks `rule`.
    Entry { name: String, rule: String },
}

/// The entries of the header `json`, in the order written.
pub(super) fn parse(json: &[u8]) -> Result<Vec<Entry>, HeaderError> {
    // Whole first: the parser does not look into the strings it skips.
    std::str::from_utf8(json).map_err(|e| HeaderError::NotJson(format!("not UTF-8: {e}")))?;
    let mut failed = None;
    let mut de = serde_json::Deserializer::from_slice(json);
    let entries = de.deserialize_map(Header { failed: &mut failed }).and_then(|v| de.end().map(|()| v));
    match (entries, failed) {
        (Ok(v), _) => Ok(v),
        // Broken JSON is the file's fault, wherever it breaks: said as such, with the entry.
        (Err(e), Some((name, _))) if matches!(e.classify(), serde_json::error::Category::Syntax | serde_json::error::Category::Eof) => Err(HeaderError::NotJson(format!("{e} (in the entry of {name})"))),
        (Err(_), Some((name, rule))) => Err(HeaderError::Entry { name, rule }),
        (Err(e), None) => Err(HeaderError::NotJson(e.to_string())),
    }
}

/// The top-level object; an entry's error is kept with its tensor's name in `failed`.
struct Header<'a> {
    failed: &'a mut Option<(String, String)>,
}

impl<'de> Visitor<'de> for Header<'_> {
    type Value = Vec<Entry>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Vec<Entry>, M::Error> {
        let mut entries = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            if name == "__metadata__" {
                // As safetensors reads it: strings to strings, or null.
                if let Err(e) = map.next_value::<Option<HashMap<String, String>>>() {
                    *self.failed = Some((name, e.to_string()));
                    return Err(e);
                }
                continue;
            }
            let (dtype, shape, offsets) = match map.next_value_seed(Fields) {
                Ok(f) => f,
                Err(e) => {
                    *self.failed = Some((name, e.to_string()));
                    return Err(e);
                }
            };
            entries.push(Entry { name, dtype, shape, offsets });
        }
        Ok(entries)
    }
}

/// One entry's object: `dtype`, `shape`, `data_offsets` (other keys skipped).
struct Fields;

impl<'de> DeserializeSeed<'de> for Fields {
    type Value = (String, Vec<usize>, (u64, u64));

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Fields {
    type Value = (String, Vec<usize>, (u64, u64));

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tensor entry (an object of dtype, shape and data_offsets)")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let (mut dtype, mut shape, mut offsets) = (None, None, None);
        let twice = |key: &str| de::Error::custom(format!("{key} given twice"));
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "dtype" if dtype.is_some() => return Err(twice(&key)),
                "shape" if shape.is_some() => return Err(twice(&key)),
                "data_offsets" if offsets.is_some() => return Err(twice(&key)),
                "dtype" => dtype = Some(map.next_value::<String>()?),
                "shape" => shape = Some(map.next_value_seed(Shape)?),
                "data_offsets" => offsets = Some(map.next_value_seed(Offsets)?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        match (dtype, shape, offsets) {
            (Some(d), Some(s), Some(o)) => Ok((d, s, o)),
            _ => Err(de::Error::custom("header entry needs dtype, shape and data_offsets")),
        }
    }
}

/// A shape: at most MAX_RANK extents, each a usize.
struct Shape;

impl<'de> DeserializeSeed<'de> for Shape {
    type Value = Vec<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<usize>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Shape {
    type Value = Vec<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a shape (an array of at most {MAX_RANK} non-negative integers)")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Vec<usize>, S::Error> {
        let mut shape = Vec::new();
        while let Some(d) = seq.next_element::<u64>()? {
            if shape.len() == MAX_RANK {
                return Err(de::Error::custom(format!("a shape of more than {MAX_RANK} extents")));
            }
            shape.push(usize::try_from(d).map_err(|_| de::Error::custom(format!("extent {d}: more than this host addresses")))?);
        }
        Ok(shape)
    }
}

/// `data_offsets`: exactly [begin, end].
struct Offsets;

impl<'de> DeserializeSeed<'de> for Offsets {
    type Value = (u64, u64);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(u64, u64), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Offsets {
    type Value = (u64, u64);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("data_offsets [begin, end]")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<(u64, u64), S::Error> {
        let two = (seq.next_element::<u64>()?, seq.next_element::<u64>()?);
        match two {
            (Some(a), Some(b)) if seq.next_element::<IgnoredAny>()?.is_none() => Ok((a, b)),
            _ => Err(de::Error::custom("data_offsets holds exactly [begin, end]")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(json: &str) -> String {
        match parse(json.as_bytes()) {
            Ok(_) => panic!("{json}: accepted"),
            Err(HeaderError::NotJson(e)) => format!("json: {e}"),
            Err(HeaderError::Entry { name, rule }) => format!("{name}: {rule}"),
        }
    }

    #[test]
    fn entries_come_in_order_and_metadata_is_skipped() {
        let e = parse(br#"{"b": {"dtype": "U8", "shape": [2, 3], "data_offsets": [0, 6], "x": [1, {"y": 2}]}, "__metadata__": {"format": "pt"}, "a": {"shape": [], "data_offsets": [6, 10], "dtype": "F32"}}"#).ok().unwrap();
        let got: Vec<_> = e.iter().map(|e| (e.name.as_str(), e.dtype.as_str(), e.shape.clone(), e.offsets)).collect();
        assert_eq!(got, [("b", "U8", vec![2, 3], (0, 6)), ("a", "F32", vec![], (6, 10))]);
        // Empty, padded with spaces to 8 bytes as writers do, metadata null; MAX_RANK extents.
        assert!(parse(b"{}").ok().unwrap().is_empty() && parse(b"{\"__metadata__\": null}   \n").ok().unwrap().is_empty());
        let rank = format!("{{\"t\": {{\"dtype\": \"U8\", \"shape\": [{}], \"data_offsets\": [0, 1]}}}}", vec!["1"; MAX_RANK].join(", "));
        assert_eq!(parse(rank.as_bytes()).ok().unwrap()[0].shape.len(), MAX_RANK);
    }

    #[test]
    fn bad_headers_name_the_tensor_and_the_rule() {
        let deep = format!("{{\"t\": {{\"dtype\": \"U8\", \"shape\": [{}], \"data_offsets\": [0, 1]}}}}", vec!["1"; MAX_RANK + 1].join(", "));
        for (json, want) in [
            (r#"{"t": {"dtype": "U8", "shape": [1]}}"#, "t: header entry needs dtype, shape and data_offsets"),
            (r#"{"t": {"dtype": 8, "shape": [1], "data_offsets": [0, 1]}}"#, "t: invalid type: integer `8`, expected a string"),
            (r#"{"t": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}"#, "t: invalid value: integer `-1`"),
            (r#"{"t": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 1]}}"#, "t: invalid type: floating point"),
            (r#"{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}"#, "t: data_offsets holds exactly [begin, end]"),
            (r#"{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}"#, "t: data_offsets holds exactly [begin, end]"),
            (r#"{"t": 3}"#, "t: invalid type: integer `3`, expected a tensor entry"),
            (&deep, "t: a shape of more than 16 extents"),
            (r#"{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "dtype": "U8"}}"#, "t: dtype given twice"),
            (r#"{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "b": {"dtype": "U8", "shape": [1]}}"#, "b: header entry needs"),
            (r#"{"__metadata__": {"n": 1}}"#, "__metadata__: invalid type: integer `1`, expected a string"),
            ("[1, 2]", "json: invalid type: sequence, expected a JSON object of tensor entries"),
            (r#"{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}} x"#, "json: trailing characters"),
            (r#"{"t": "#, "json: EOF while parsing a value at line 1 column 6 (in the entry of t)"),
            (r#"{"t": {"dtype" "U8"}}"#, "json: expected `:` at line 1 column 16 (in the entry of t)"),
        ] {
            let e = refused(json);
            assert!(e.starts_with(want), "{json}: {e}");
        }
        // A byte that is not UTF-8 in a string the parser would skip.
        assert!(matches!(parse(b"{\"t\": {\"x\": \"\xff\"}}"), Err(HeaderError::NotJson(e)) if e.starts_with("not UTF-8")));
    }
}
