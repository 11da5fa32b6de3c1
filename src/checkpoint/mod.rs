//! NVFP4 checkpoints as they ship: a linear layer of a safetensors file in NVIDIA ModelOpt's or
//! compressed-tensors' names, turned into this crate's operand (the tiled scale layout, the
//! global scale in this crate's convention), and mixture-of-experts stacks of them.
//!
//! | | ModelOpt | compressed-tensors |
//! |---|---|---|
//! | packed e2m1, U8 `[N, K/2]` | `weight` | `weight_packed` |
//! | block scales, F8_E4M3 `[N, K/16]`, row-major | `weight_scale` | `weight_scale` |
//! | per-tensor scale, F32 `[]` or `[1]` | `weight_scale_2` | `weight_global_scale` |
//! | activations' per-tensor scale (optional) | `input_scale` | `input_global_scale` |
//!
//! Element `2i` of a row sits in the low nibble of its byte in both. ModelOpt's per-tensor
//! scales multiply (value = e2m1 * block scale * `weight_scale_2`); compressed-tensors' divide
//! (value = e2m1 * block scale / `weight_global_scale`), so this crate's global scale is
//! `weight_scale_2`, or `1 / weight_global_scale`, and likewise for the activations.
//!
//! A checkpoint is one safetensors file or a sharded one: a directory or its
//! `model.safetensors.index.json`, whose `weight_map` names each tensor's shard. Only the files'
//! headers are parsed when it is opened (each shard's once); each layer reads its own tensors,
//! from whichever shards hold them. Where an `hf_quant_config.json` beside the files (ModelOpt's)
//! names a `quant_algo`, it must be NVFP4 (or W4A16_NVFP4, or MIXED_PRECISION with the layer's
//! entry NVFP4), and a layer with an AWQ `pre_quant_scale` is refused: this loader implements
//! NVFP4's scales only.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Error, Result};

mod header;
use crate::layout::to_tiled;
use crate::matrix::Nvfp4Matrix;
use crate::tensor::Nvfp4Tensor;

/// Which exporter's names a layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Convention {
    /// NVIDIA ModelOpt: `weight`, `weight_scale`, `weight_scale_2`, `input_scale`.
    ModelOpt,
    /// compressed-tensors (vLLM, llm-compressor): `weight_packed`, `weight_scale`,
    /// `weight_global_scale`, `input_global_scale` (reciprocal scales).
    CompressedTensors,
}

/// One linear layer of a checkpoint, as this crate's operands.
#[derive(Clone, Debug)]
pub struct CheckpointLayer {
    /// The weight (1, N, K): codes, tiled scales and its global scale (this crate's convention).
    pub weight: Nvfp4Matrix,
    /// The activations' global scale (this crate's convention: the quantizer's `global_scale`),
    /// where the checkpoint gives one.
    pub input_scale: Option<f32>,
    /// The names it was read under.
    pub convention: Convention,
}

/// A layer's checked tensors before they become operands.
struct RawLayer {
    n: usize,
    k: usize,
    /// The (N, K) of the whole layer, where `n` and `k` are a part's (fused: the N summed).
    whole: (usize, usize),
    data: Vec<u8>,
    scales: Vec<u8>,
    global: f32,
    input_scale: Option<f32>,
    convention: Convention,
}

/// The headers of a checkpoint's safetensors files (one, or every shard of an index): every
/// tensor's dtype, shape, byte range and file.
#[derive(Debug)]
pub struct Checkpoint {
    /// What was opened: the file, or the index (also where a directory was given).
    path: PathBuf,
    shards: Vec<Shard>,
    tensors: HashMap<String, TensorEntry>,
    /// What `hf_quant_config.json` says per layer: MIXED_PRECISION's `quant_algo` per layer
    /// prefix, and the modules it leaves unquantized.
    quant: QuantConfig,
}

/// One safetensors file of a checkpoint: where its data starts, and its length when opened.
#[derive(Debug)]
struct Shard {
    path: PathBuf,
    data_start: u64,
    file_len: u64,
}

#[derive(Debug, Clone)]
struct TensorEntry {
    dtype: String,
    shape: Vec<usize>,
    range: (u64, u64),
    /// Index into `Checkpoint::shards`.
    shard: usize,
}

/// The largest header this reads (safetensors' own limit).
const MAX_HEADER: u64 = 100_000_000;

/// The index a sharded checkpoint's directory holds (Hugging Face's name).
const INDEX: &str = "model.safetensors.index.json";

/// A region's rows are read apart where the bytes between them reach this (a seek is cheaper
/// than reading them), or a page and eight times the bytes kept; as whole rows otherwise.
const SKIP_BYTES: usize = 64 << 10;

/// How many bytes of whole rows a region's read takes at a time.
const SPAN_BYTES: usize = 8 << 20;

/// ModelOpt's quantization config, beside the weights.
const QUANT_CONFIG: &str = "hf_quant_config.json";

fn bad(tensor: impl Into<String>, rule: impl Into<String>) -> Error {
    Error::Checkpoint { tensor: tensor.into(), rule: rule.into() }
}

/// Refuses a path that is not a regular file (after symlinks) before it is opened: opening a
/// FIFO blocks until a writer comes, and a device or socket never ends.
fn regular_file(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    if meta.is_file() { Ok(()) } else { Err(bad(path.display().to_string(), "is not a regular file (a checkpoint is a .safetensors file, its index, or their directory)")) }
}

/// A JSON file beside the shards (the index, `hf_quant_config.json`), read whole: a regular file
/// of at most MAX_HEADER bytes, so a damaged one cannot fill the host's memory.
fn read_json_file(path: &Path) -> Result<Vec<u8>> {
    regular_file(path)?;
    let io = |source: std::io::Error| Error::Io { path: path.display().to_string(), source };
    let f = File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let too_long = |len| bad(path.display().to_string(), format!("{len} bytes: a JSON file beside the shards has at most {MAX_HEADER}"));
    if len > MAX_HEADER {
        return Err(too_long(len));
    }
    // Bounded however the file grows after the check.
    let mut bytes = Vec::new();
    f.take(MAX_HEADER + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > MAX_HEADER {
        return Err(too_long(bytes.len() as u64));
    }
    Ok(bytes)
}

/// `extra` appended to `v`, or [`Error::HostMemory`] where the host cannot hold the result.
fn append(v: &mut Vec<u8>, extra: &[u8], what: &'static str) -> Result<()> {
    v.try_reserve_exact(extra.len()).map_err(|_| Error::HostMemory { what, bytes: v.len().saturating_add(extra.len()) })?;
    v.extend_from_slice(extra);
    Ok(())
}

impl Checkpoint {
    /// Opens a checkpoint and reads its headers (no tensor data): `path` is a `.safetensors`
    /// file, a `*.index.json` (Hugging Face's `weight_map` of tensor name to shard file, the
    /// shards beside it), or a directory: its `model.safetensors.index.json` if it has one, else
    /// its one `*.safetensors` file (none, or several without an index: an error naming the
    /// directory). Each shard's header is read once, and every tensor the index maps must be in
    /// its shard's header. Where `hf_quant_config.json` lies beside the files (ModelOpt's) and
    /// names a `quant_algo` other than NVFP4 (or W4A16_NVFP4, the same weights), the checkpoint is
    /// refused: the scales of other algorithms (NVFP4_AWQ, W4A8_NVFP4_FP8, ...) mean something this
    /// loader does not implement; MIXED_PRECISION's `quantized_layers` are checked per layer, as
    /// each is read, and a layer its `exclude_modules` leaves unquantized is named as such.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source: std::io::Error| Error::Io { path: path.display().to_string(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            let algos = check_quant_config(path)?;
            let index = path.join(INDEX);
            if index.is_file() {
                return Ok(Self::open_index(&index)?.with_quant_config(algos));
            }
            let mut files = Vec::new();
            for entry in std::fs::read_dir(path).map_err(io)? {
                let p = entry.map_err(io)?.path();
                if p.extension().and_then(|e| e.to_str()) == Some("safetensors") && p.is_file() {
                    files.push(p);
                }
            }
            files.sort();
            let dir = path.display().to_string();
            return match files.as_slice() {
                [] => Err(bad(dir, format!("holds no *.safetensors file and no {INDEX}"))),
                [one] => Ok(Self::open_file(one)?.with_quant_config(algos)),
                several => Err(bad(dir, format!("holds {} *.safetensors files and no {INDEX}: open their index, or one file", several.len()))),
            };
        }
        let algos = check_quant_config(path.parent().unwrap_or(Path::new("")))?;
        // open_index and read_header refuse a path that is not a regular file.
        let is_index = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(".index.json"));
        Ok((if is_index { Self::open_index(path) } else { Self::open_file(path) })?.with_quant_config(algos))
    }

    /// What the quant config says per layer, checked as each layer is read.
    fn with_quant_config(mut self, quant: QuantConfig) -> Self {
        self.quant = quant;
        self
    }

    /// One safetensors file.
    fn open_file(file: &Path) -> Result<Self> {
        let (shard, tensors) = read_header(file, 0)?;
        Ok(Checkpoint { path: file.to_path_buf(), shards: vec![shard], tensors, quant: QuantConfig::default() })
    }

    /// An index and the shards its `weight_map` names, in its directory.
    fn open_index(index: &Path) -> Result<Self> {
        let idx = index.display().to_string();
        let text = read_json_file(index)?;
        let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| bad(idx.clone(), format!("the index is not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad(idx.clone(), "the index needs a \"weight_map\" object (tensor name -> shard file)"))?;
        let dir = index.parent().unwrap_or(Path::new(""));
        let mut shards: Vec<Shard> = Vec::new();
        let mut headers: Vec<HashMap<String, TensorEntry>> = Vec::new();
        let mut ids: HashMap<&str, usize> = HashMap::new();
        // One file under several spellings (`a`, `./a`, a symbolic link to it) is one shard, its
        // header read once. (Hard links to one file stay apart: a second header read, no harm.)
        let mut by_file: HashMap<PathBuf, usize> = HashMap::new();
        let mut tensors = HashMap::with_capacity(map.len());
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| bad(name.clone(), format!("{idx} maps it to {file}: a shard is a file name (a JSON string)")))?;
            let id = match ids.get(file) {
                Some(&id) => id,
                None => {
                    if !plain_name(file) {
                        return Err(bad(
                            name.clone(),
                            format!("{idx} maps it to shard {file:?}: shards are relative names inside {} (no absolute path, no ..)", dir.display()),
                        ));
                    }
                    let path = dir.join(file);
                    let canonical = std::fs::canonicalize(&path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
                    let id = match by_file.get(&canonical) {
                        Some(&id) => id,
                        None => {
                            let id = shards.len();
                            let (shard, header) = read_header(&path, id)?;
                            shards.push(shard);
                            headers.push(header);
                            by_file.insert(canonical, id);
                            id
                        }
                    };
                    ids.insert(file, id);
                    id
                }
            };
            let entry = headers
                .get(id)
                .and_then(|h| h.get(name))
                .ok_or_else(|| bad(name.clone(), format!("{idx} maps it to shard {file}, whose header does not hold it")))?;
            tensors.insert(name.clone(), entry.clone());
        }
        Ok(Checkpoint { path: index.to_path_buf(), shards, tensors, quant: QuantConfig::default() })
    }

    /// The safetensors files whose headers were read: the one file, or the index's shards in
    /// the order they were first named, each once, under the first name the index gave it
    /// (joined to the index's directory).
    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Tensor `name`'s dtype as the header writes it (`"BF16"`, `"F32"`, `"U8"`, `"F8_E4M3"`, ...)
    /// and its shape, from the header alone.
    pub fn tensor_info(&self, name: &str) -> Result<(&str, &[usize])> {
        let e = self.entry(name)?;
        Ok((e.dtype.as_str(), e.shape.as_slice()))
    }

    /// Tensor `name`'s bytes as the file stores them (row-major, little-endian elements), after
    /// checking that its byte range holds its shape in its dtype: the checkpoint's other tensors
    /// (the router, norms, embeddings, layers left unquantized) through the same reader, so an
    /// engine parses the headers once. Refused for a dtype whose element size this reader does
    /// not know.
    pub fn tensor_bytes(&self, name: &str) -> Result<Vec<u8>> {
        let e = self.entry(name)?;
        let shape: Vec<Option<usize>> = e.shape.iter().map(|&d| Some(d)).collect();
        self.read(name, &e.dtype, &shape, "its dtype")
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors.get(name).ok_or_else(|| bad(name, format!("not in {}", self.path.display())))
    }

    /// The bytes of tensor `name`, checked to be `dtype` with `shape` (`None` in `shape`: any
    /// extent there).
    fn read(&self, name: &str, dtype: &str, shape: &[Option<usize>], what: &str) -> Result<Vec<u8>> {
        self.read_region(name, dtype, shape, what, None)
    }

    /// Tensor `name`'s header entry, checked to be `dtype` with `shape` (`None`: any extent) and
    /// to hold the bytes they make; with its element size.
    fn checked_entry(&self, name: &str, dtype: &str, shape: &[Option<usize>], what: &str) -> Result<(&TensorEntry, u64)> {
        let e = self.entry(name)?;
        if e.dtype != dtype {
            return Err(bad(name, format!("dtype {}: {what} is {dtype}", e.dtype)));
        }
        let fits = e.shape.len() == shape.len() && e.shape.iter().zip(shape).all(|(&got, want)| want.is_none_or(|w| w == got));
        if !fits {
            let want: Vec<String> = shape.iter().map(|d| d.map_or("_".into(), |d| d.to_string())).collect();
            return Err(bad(name, format!("shape {:?}: {what} is [{}]", e.shape, want.join(", "))));
        }
        let elem: u64 = match dtype {
            "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
            "BF16" | "F16" | "I16" | "U16" => 2,
            "F32" | "I32" | "U32" => 4,
            "F64" | "I64" | "U64" => 8,
            other => return Err(bad(name, format!("dtype {other}: its element size is not known to this reader"))),
        };
        let want_bytes = e.shape.iter().try_fold(elem, |acc, &d| acc.checked_mul(d as u64));
        if want_bytes != Some(e.range.1 - e.range.0) {
            return Err(bad(name, format!("holds {} bytes, its dtype and shape {:?} make {want_bytes:?}", e.range.1 - e.range.0, e.shape)));
        }
        Ok((e, elem))
    }

    /// [`Self::read`], of only `region` where given: rows `region.0` of a 2-D tensor of 1-byte
    /// elements and bytes `region.1` of each, row after row. The whole tensor's dtype, shape and
    /// byte count are checked first; only the region's bytes are read (a row at a time where it
    /// cuts the rows).
    fn read_region(&self, name: &str, dtype: &str, shape: &[Option<usize>], what: &str, region: Option<(&Range<usize>, &Range<usize>)>) -> Result<Vec<u8>> {
        let (e, elem) = self.checked_entry(name, dtype, shape, what)?;
        let shard = self.shards.get(e.shard).ok_or_else(|| bad(name, format!("shard {} of {} files", e.shard, self.shards.len())))?;
        let io = |source: std::io::Error| Error::Io { path: shard.path.display().to_string(), source };
        let mut f = File::open(&shard.path).map_err(io)?;
        if f.metadata().map_err(io)?.len() != shard.file_len {
            return Err(bad(shard.path.display().to_string(), "the file changed since it was opened"));
        }
        let start = shard.data_start + e.range.0;
        let len = usize::try_from(e.range.1 - e.range.0).map_err(|_| bad(name, format!("{} bytes: more than this host addresses", e.range.1 - e.range.0)))?;
        let Some((rows, cols)) = region else {
            let mut bytes = crate::error::try_zeros::<u8>("a checkpoint tensor", len)?;
            f.seek(SeekFrom::Start(start)).map_err(io)?;
            f.read_exact(&mut bytes).map_err(io)?;
            return Ok(bytes);
        };
        // The callers check their ranges against the header with their own rule; this guards
        // the arithmetic below whatever they pass.
        let row_bytes = match e.shape[..] {
            [r, c] if elem == 1 && !rows.is_empty() && !cols.is_empty() && rows.end <= r && cols.end <= c => c,
            _ => return Err(bad(name, format!("rows {rows:?}, bytes {cols:?} of each: a non-empty region of a 2-D tensor of 1-byte elements, shape {:?} {}", e.shape, e.dtype))),
        };
        // Within the tensor's `len` bytes, so none of this overflows.
        let mut bytes = crate::error::try_zeros::<u8>("a checkpoint tensor's region", rows.len() * cols.len())?;
        let gap = row_bytes - cols.len();
        if gap == 0 {
            f.seek(SeekFrom::Start(start + (rows.start * row_bytes) as u64)).map_err(io)?;
            f.read_exact(&mut bytes).map_err(io)?;
        } else if gap >= SKIP_BYTES || (gap >= 4096 && gap > 8 * cols.len()) {
            // Gaps worth a seek (long, or pages mostly of bytes not kept): each row's columns
            // alone.
            for (row, out) in rows.clone().zip(bytes.chunks_exact_mut(cols.len())) {
                f.seek(SeekFrom::Start(start + (row * row_bytes + cols.start) as u64)).map_err(io)?;
                f.read_exact(out).map_err(io)?;
            }
        } else {
            // Short gaps (a K cut of a row of a few KB): the disk reads their pages anyway, so
            // whole rows in spans of about SPAN_BYTES, the columns kept; a read call a span, not
            // two a row.
            let per_span = (SPAN_BYTES / row_bytes).max(1);
            let mut span = crate::error::try_zeros::<u8>("a checkpoint read's span", per_span.min(rows.len()) * row_bytes)?;
            f.seek(SeekFrom::Start(start + (rows.start * row_bytes) as u64)).map_err(io)?;
            for out in bytes.chunks_mut(per_span * cols.len()) {
                let n = out.len() / cols.len();
                let span = &mut span[..n * row_bytes];
                f.read_exact(span).map_err(io)?;
                for (row, o) in span.chunks_exact(row_bytes).zip(out.chunks_exact_mut(cols.len())) {
                    o.copy_from_slice(&row[cols.clone()]);
                }
            }
        }
        Ok(bytes)
    }

    /// A per-tensor F32 scale (shape `[]` or `[1]`), finite and positive.
    fn scalar(&self, name: &str) -> Result<f32> {
        let shape: &[Option<usize>] = if self.entry(name)?.shape.is_empty() { &[] } else { &[Some(1)] };
        let b = self.read(name, "F32", shape, "a per-tensor scale")?;
        let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if !(v.is_finite() && v > 0.0) {
            return Err(bad(name, format!("{v}: a per-tensor scale must be finite and positive")));
        }
        Ok(v)
    }

    /// The layer `prefix`'s weight shape (N, K) from the header alone, after the checks
    /// [`Self::layer`] makes before it reads data: to size host or device memory before reading
    /// a layer that may be large.
    pub fn layer_dims(&self, prefix: &str) -> Result<(usize, usize)> {
        let convention = self.convention(prefix)?;
        self.weight_dims(prefix, convention)
    }

    /// The layer's (N, K) from the header, checked: the packed weight U8 [N, K/2], N >= 1, K a
    /// positive multiple of 16, and the block scales F8_E4M3 [N, K/16], each holding the bytes
    /// its shape makes.
    fn weight_dims(&self, prefix: &str, convention: Convention) -> Result<(usize, usize)> {
        let w_name = format!("{prefix}.{}", tensor_names(convention)[0]);
        let we = self.entry(&w_name)?;
        if we.dtype != "U8" {
            return Err(bad(w_name, format!("dtype {}: the packed weight is U8 (two e2m1 codes a byte)", we.dtype)));
        }
        if we.shape.len() != 2 {
            return Err(bad(w_name, format!("shape {:?}: the packed weight is [N, K/2]", we.shape)));
        }
        let (n, k) = (we.shape[0], we.shape[1].checked_mul(2).unwrap_or(0));
        if n == 0 || k == 0 || k % 16 != 0 {
            return Err(bad(w_name, format!("shape {:?}: N >= 1 and K = 2 * {} must be a positive multiple of 16 (one scale per 16 values)", we.shape, we.shape[1])));
        }
        self.checked_entry(&w_name, "U8", &[Some(n), Some(k / 2)], "the packed weight")?;
        self.checked_entry(&format!("{prefix}.weight_scale"), "F8_E4M3", &[Some(n), Some(k / 16)], "the block scales, [N, K/16]")?;
        Ok((n, k))
    }

    /// Which exporter's names the layer `prefix` uses, from the header alone, after the checks
    /// that refuse the layer whatever its tensors hold (its `quant_algo`, an AWQ scale). Every
    /// scale this module returns is already in this crate's convention whichever it is; this
    /// says which one the file was read under (what [`CheckpointLayer::convention`] holds, for
    /// the device loaders, which return only the operands).
    pub fn convention(&self, prefix: &str) -> Result<Convention> {
        let has = |s: &str| self.tensors.contains_key(&format!("{prefix}.{s}"));
        let convention = if has("weight_packed") {
            Convention::CompressedTensors
        } else if has("weight") {
            Convention::ModelOpt
        } else {
            return Err(bad(format!("{prefix}.weight"), format!("not in {}, nor {prefix}.weight_packed (compressed-tensors)", self.path.display())));
        };
        // An excluded module keeps its unquantized weight under the ModelOpt name; say so rather
        // than "dtype BF16" (a U8 weight loads: the tensors decide, so the patterns are matched
        // only for a weight that will not load, not on every layer's read).
        if let Some(e) = self.tensors.get(&format!("{prefix}.weight")).filter(|e| e.dtype != "U8") {
            if let Some(pattern) = self.quant.exclude.iter().find(|p| glob_match(p, prefix)) {
                return Err(bad(prefix, format!("excluded from quantization by {QUANT_CONFIG} (exclude_modules \"{pattern}\"): its weight is {} {:?}, not NVFP4; read it with Checkpoint::tensor_bytes", e.dtype, e.shape)));
            }
        }
        if let Some(algo) = self.quant.algos.as_ref().and_then(|m| m.get(prefix)) {
            if !weights_are_nvfp4(algo) {
                return Err(bad(prefix, format!("{QUANT_CONFIG} gives this layer quant_algo {algo}: only NVFP4 (or W4A16_NVFP4) weights load here")));
            }
        }
        let awq = format!("{prefix}.pre_quant_scale");
        if self.tensors.contains_key(&awq) {
            return Err(bad(
                awq,
                "an AWQ pre-quantization scale (the activations are multiplied by it per input channel before they are quantized): this loader does not apply it, so the layer's results would be wrong",
            ));
        }
        Ok(convention)
    }

    /// A layer's tensors as the file holds them, checked: packed codes, row-major scales, the
    /// global and input scales in this crate's convention. With `part`, only its rows and K
    /// range (checked against the header before anything is read), and only their bytes read.
    fn raw_layer(&self, prefix: &str, part: Option<&Part>) -> Result<RawLayer> {
        let convention = self.convention(prefix)?;
        let w_name = format!("{prefix}.{}", tensor_names(convention)[0]);
        let (n_all, k_all) = self.weight_dims(prefix, convention)?;
        let (rows, k) = match part {
            Some(p) => (p.rows.clone(), p.k.clone()),
            None => (0..n_all, 0..k_all),
        };
        if rows.is_empty() || rows.end > n_all {
            return Err(bad(prefix, format!("rows {rows:?}: a non-empty range within the weight's {n_all} rows")));
        }
        if k.is_empty() || k.end > k_all || !k.start.is_multiple_of(16) || !k.end.is_multiple_of(16) {
            return Err(bad(prefix, format!("K range {k:?}: a non-empty range within K = {k_all} that starts and ends on a multiple of 16 (whole scale blocks)")));
        }
        let data = self.read_region(&w_name, "U8", &[Some(n_all), Some(k_all / 2)], "the packed weight", Some((&rows, &(k.start / 2..k.end / 2))))?;
        let s_name = format!("{prefix}.weight_scale");
        let blocks = k.start / 16..k.end / 16;
        let scales = self.read_region(&s_name, "F8_E4M3", &[Some(n_all), Some(k_all / 16)], "the block scales, [N, K/16]", Some((&rows, &blocks)))?;
        if let Some(i) = scales.iter().position(|&b| b & 0x80 != 0 || b == 0x7F) {
            let b = scales[i];
            let why = if b & 0x7F == 0x7F { "NaN" } else { "negative" };
            let (row, block) = (rows.start + i / blocks.len(), blocks.start + i % blocks.len());
            return Err(bad(&s_name, format!("element {} (row {row}, block {block}) is {why} (byte 0x{b:02x}): block scales are finite and non-negative", row * (k_all / 16) + block)));
        }
        let (global, input_scale) = self.scalars(prefix, convention)?;
        Ok(RawLayer { n: rows.len(), k: k.len(), whole: (n_all, k_all), data, scales, global, input_scale, convention })
    }

    /// The layer's weight global scale and activations' scale (if the file has one) in this
    /// crate's convention, checked: positive normal f32s.
    fn scalars(&self, prefix: &str, convention: Convention) -> Result<(f32, Option<f32>)> {
        let [_, g_name, in_name] = tensor_names(convention).map(|s| format!("{prefix}.{s}"));
        let to_ours = |v: f32, name: &str| -> Result<f32> {
            let g = match convention {
                Convention::ModelOpt => v,
                Convention::CompressedTensors => 1.0 / v,
            };
            if !(g.is_finite() && g > 0.0 && g.is_normal()) {
                return Err(bad(name, format!("{v} gives the global scale {g}: it must be a positive normal f32")));
            }
            Ok(g)
        };
        let global = to_ours(self.scalar(&g_name)?, &g_name)?;
        let input_scale = if self.tensors.contains_key(&in_name) { Some(to_ours(self.scalar(&in_name)?, &in_name)?) } else { None };
        Ok((global, input_scale))
    }

    /// The layer `prefix`'s weight global scale and activations' scale (None where the file has
    /// none), in this crate's convention, reading only those two scalars (after the header checks
    /// of [`Self::layer_dims`]: names, and the weight's and block scales' dtypes, shapes and
    /// byte counts): to gather per-expert input scales
    /// without reading the weights.
    pub fn layer_scales(&self, prefix: &str) -> Result<(f32, Option<f32>)> {
        let convention = self.convention(prefix)?;
        self.weight_dims(prefix, convention)?;
        self.scalars(prefix, convention)
    }

    /// The linear layer `prefix` (e.g. `model.layers.0.mlp.down_proj`): its weight (1, N, K)
    /// with tiled scales and global scale, and the activations' scale if the file has one, in
    /// whichever convention its names follow.
    pub fn layer(&self, prefix: &str) -> Result<CheckpointLayer> {
        self.raw_layer(prefix, None)?.into_layer()
    }

    /// [`Self::layer`] on the device: the packed weight and its row-major block scales are
    /// uploaded as the file holds them (after the same checks) and the scales re-tiled on the GPU
    /// ([`Nvfp4Tensor::from_row_major_scales`]), in `stream`'s order. Returns the weight and the
    /// activations' scale, both in this crate's convention ([`Self::convention`] says which names
    /// the file used). Not during CUDA graph capture (it allocates and copies).
    pub fn layer_to_device(&self, prefix: &str, stream: &Arc<CudaStream>) -> Result<(Nvfp4Tensor, Option<f32>)> {
        // Refused before the file is read: a layer can be large.
        refuse_capture("Checkpoint::layer_to_device", stream)?;
        self.raw_layer(prefix, None)?.into_device(stream)
    }

    /// A tensor-parallel shard of the layer `prefix`: its weight rows `rows` (output features,
    /// as a column-parallel split cuts q/k/v or gate/up) and its input features `k` (as a
    /// row-parallel split cuts o_proj or down_proj), as one layer of shape (1, rows.len(),
    /// k.len()) with the layer's global and input scales, which are per tensor and so shared by
    /// every shard. `k` starts and ends on a multiple of 16 (whole scale blocks); the GEMMs add
    /// their own rules (K a multiple of 32). The ranges are checked against the header before
    /// anything is read, and only the shard's rows are read (a K cut of rows of a few KB reads
    /// them whole, as the disk would, and keeps its columns; of longer rows, only its columns).
    ///
    /// ```no_run
    /// # fn main() -> blockscaled_gemm::Result<()> {
    /// let ck = blockscaled_gemm::checkpoint::Checkpoint::open("model.safetensors")?;
    /// let (rank, ranks) = (1, 4);
    /// let (n, k) = ck.layer_dims("model.layers.0.mlp.down_proj")?;
    /// // down_proj is row-parallel: each rank takes a quarter of K and sums its partial outputs.
    /// let part = ck.layer_shard("model.layers.0.mlp.down_proj", 0..n, k / ranks * rank..k / ranks * (rank + 1))?;
    /// # Ok(()) }
    /// ```
    pub fn layer_shard(&self, prefix: &str, rows: Range<usize>, k: Range<usize>) -> Result<CheckpointLayer> {
        self.raw_layer(prefix, Some(&Part { rows, k }))?.into_layer()
    }

    /// [`Self::layer_shard`] on the device, as [`Self::layer_to_device`] uploads a whole layer.
    /// Not during CUDA graph capture.
    pub fn layer_shard_to_device(&self, prefix: &str, rows: Range<usize>, k: Range<usize>, stream: &Arc<CudaStream>) -> Result<(Nvfp4Tensor, Option<f32>)> {
        refuse_capture("Checkpoint::layer_shard_to_device", stream)?;
        self.raw_layer(prefix, Some(&Part { rows, k }))?.into_device(stream)
    }

    /// Fused shards (q/k/v, gate/up): the layers `prefixes` stacked along N in that order, as
    /// one layer, for one GEMM over all of them. They must share K, the weight's global scale and
    /// the input scale (an engine's fused projection quantized as one tensor exports them
    /// equal): different global scales cannot share one tensor without re-rounding the block
    /// scales, so they are an error naming both (run one GEMM per shard then).
    pub fn fused(&self, prefixes: &[&str]) -> Result<CheckpointLayer> {
        self.fused_raw(prefixes, &|| DENSE_UNEQUAL_GLOBALS.to_string(), None)?.into_layer()
    }

    /// [`Self::fused`] on the device: the shards' packed weights and row-major scales uploaded as
    /// stored, the scales re-tiled on the GPU (as [`Self::layer_to_device`]). Returns the weight
    /// and the activations' scale. Not during CUDA graph capture.
    pub fn fused_to_device(&self, prefixes: &[&str], stream: &Arc<CudaStream>) -> Result<(Nvfp4Tensor, Option<f32>)> {
        refuse_capture("Checkpoint::fused_to_device", stream)?;
        self.fused_raw(prefixes, &|| DENSE_UNEQUAL_GLOBALS.to_string(), None)?.into_device(stream)
    }

    /// The shards of [`Self::fused`], checked and stacked as stored (scales row-major); with
    /// `part`, the same part of each.
    fn fused_raw(&self, prefixes: &[&str], unequal_globals: &dyn Fn() -> String, part: Option<&Part>) -> Result<RawLayer> {
        let (first, rest) = prefixes.split_first().ok_or_else(|| Error::InvalidData { what: "prefixes", detail: "none: a fused layer has at least one shard".into() })?;
        let mut base = self.raw_layer(first, part)?;
        let first_n = base.whole.0;
        let name = |c: Convention, p: &str, i: usize| format!("{p}.{}", tensor_names(c)[i]);
        for p in rest {
            let l = self.raw_layer(p, part)?;
            if l.whole.1 != base.whole.1 {
                return Err(bad(name(l.convention, p, 0), format!("K = {}: {first} has K = {}; fused shards share K", l.whole.1, base.whole.1)));
            }
            // One rows range cuts each shard at the same rows: a tensor-parallel split only where
            // the shards have equal N (gate and up), not q/k/v's or a fused gate_up's halves.
            if part.is_some() && l.whole.0 != first_n {
                return Err(bad(name(l.convention, p, 0), format!("N = {}: {first} has N = {first_n}; shards cut at the same rows have equal N (cut shards of different N one by one, with layer_shard)", l.whole.0)));
            }
            if l.global != base.global {
                return Err(bad(name(l.convention, p, 1), format!("global scale {:?}, {} has {:?} (this crate's convention): {}", l.global, name(base.convention, first, 1), base.global, unequal_globals())));
            }
            if l.input_scale != base.input_scale {
                return Err(bad(name(l.convention, p, 2), format!("{:?}, {first} has {:?}: fused shards share the activations' scale", l.input_scale, base.input_scale)));
            }
            append(&mut base.data, &l.data, "fused shards' packed weights")?;
            append(&mut base.scales, &l.scales, "fused shards' block scales")?;
            base.n += l.n;
            // Parts are read, not wholes: the wholes' sum is bounded only by the files' sizes.
            base.whole.0 = base.whole.0.checked_add(l.whole.0).ok_or_else(|| bad(p.to_string(), "the fused shards' rows overflow usize"))?;
        }
        Ok(base)
    }

    /// A mixture-of-experts stack: the layers `prefix_of(0)`, ..., `prefix_of(experts - 1)` (for
    /// example `|e| format!("model.layers.3.mlp.experts.{e}.down_proj")`) as one (E, N, K)
    /// matrix of global scale 1, and each expert's global scale: the B operand and the
    /// `expert_scales` of [`crate::BlockScaledGemm::moe_gemm`]. Every expert must have the same N
    /// and K. An expert may be fused shards stacked along N, as [`Self::fused`] stacks them:
    /// `prefix_of` then returns their prefixes, e.g. gate then up for the gate-up GEMM whose
    /// output [`crate::Quantizer::quantize_moe_swiglu_into`] takes (gate in the first half of
    /// each row):
    ///
    /// ```no_run
    /// # fn main() -> blockscaled_gemm::Result<()> {
    /// let ck = blockscaled_gemm::checkpoint::Checkpoint::open("model.safetensors")?;
    /// let p = |e: usize, w: &str| format!("model.layers.3.mlp.experts.{e}.{w}");
    /// let (gate_up, expert_scales) = ck.experts(256, |e| [p(e, "gate_proj"), p(e, "up_proj")])?;
    /// // One activation scale for all experts' inputs: the largest of theirs.
    /// let input_scale = ck.experts_input_scale(256, |e| p(e, "gate_proj"))?;
    /// # Ok(()) }
    /// ```
    ///
    /// The experts' input scales are not read here ([`Self::experts_input_scale`]).
    pub fn experts<P: ExpertShards>(&self, experts: usize, prefix_of: impl Fn(usize) -> P) -> Result<(Nvfp4Matrix, Vec<f32>)> {
        self.experts_raw(experts, prefix_of, None)?.into_matrix()
    }

    /// [`Self::experts`] on the device: the experts' packed weights and row-major scales uploaded
    /// as stored, the scales re-tiled on the GPU into E batches. Returns the (E, N, K) tensor
    /// (global scale 1) and each expert's global scale. Not during CUDA graph capture.
    pub fn experts_to_device<P: ExpertShards>(&self, experts: usize, prefix_of: impl Fn(usize) -> P, stream: &Arc<CudaStream>) -> Result<(Nvfp4Tensor, Vec<f32>)> {
        // Refused before the files are read: a stack is several GB of host memory (DeepSeek-V3's
        // gate-up experts of one layer: about 4.2 GB).
        refuse_capture("Checkpoint::experts_to_device", stream)?;
        self.experts_raw(experts, prefix_of, None)?.into_device(stream)
    }

    /// A tensor-parallel shard of [`Self::experts`]: of every expert's layer (of each of its
    /// fused shards) the weight rows `rows` and the input features `k`, as
    /// [`Self::layer_shard`] cuts one layer, stacked into (E, S * rows.len(), k.len()) for S
    /// shards an expert. So a gate-up stack given as gate and up shards and cut at `rows` keeps
    /// each expert's gate rows, then its up rows, as the SwiGLU quantizer wants them; a down
    /// stack is cut along `k`. An expert's shards must have equal N (one range cuts each at the
    /// same rows), and every expert the same number of shards and the same whole N and K. A
    /// checkpoint that stores one fused `gate_up_proj` an expert holds gate and up in one
    /// tensor: a rows cut of it would keep gate rows only, so cut such a stack along `k` alone.
    /// The ranges are checked against each layer's header before its bytes are read, and only
    /// the shards' rows are read (a K cut of rows of a few KB reads whole rows, as the disk
    /// does, and keeps its columns).
    ///
    /// ```no_run
    /// # fn main() -> blockscaled_gemm::Result<()> {
    /// let ck = blockscaled_gemm::checkpoint::Checkpoint::open("model.safetensors")?;
    /// let p = |e: usize, w: &str| format!("model.layers.3.mlp.experts.{e}.{w}");
    /// let (rank, ranks, width, hidden) = (1, 8, 2048, 7168);
    /// let cut = width / ranks * rank..width / ranks * (rank + 1);
    /// let (gate_up, gate_up_scales) = ck.experts_shard(256, |e| [p(e, "gate_proj"), p(e, "up_proj")], cut.clone(), 0..hidden)?;
    /// let (down, down_scales) = ck.experts_shard(256, |e| p(e, "down_proj"), 0..hidden, cut)?;
    /// # Ok(()) }
    /// ```
    pub fn experts_shard<P: ExpertShards>(&self, experts: usize, prefix_of: impl Fn(usize) -> P, rows: Range<usize>, k: Range<usize>) -> Result<(Nvfp4Matrix, Vec<f32>)> {
        self.experts_raw(experts, prefix_of, Some(&Part { rows, k }))?.into_matrix()
    }

    /// [`Self::experts_shard`] on the device, as [`Self::experts_to_device`] uploads a whole
    /// stack. Not during CUDA graph capture.
    pub fn experts_shard_to_device<P: ExpertShards>(&self, experts: usize, prefix_of: impl Fn(usize) -> P, rows: Range<usize>, k: Range<usize>, stream: &Arc<CudaStream>) -> Result<(Nvfp4Tensor, Vec<f32>)> {
        refuse_capture("Checkpoint::experts_shard_to_device", stream)?;
        self.experts_raw(experts, prefix_of, Some(&Part { rows, k }))?.into_device(stream)
    }

    /// The largest input scale (this crate's convention) of the experts' layers `prefix_of(e)`
    /// (every shard of each), reading only their scalars ([`Self::layer_scales`]): the one
    /// activation scale that [`crate::BlockScaledGemm::moe_gemm`] and the quantizer take for the
    /// stacked activations of all experts. The largest, since with a smaller one the activations
    /// calibrated to a larger scale would clip at FP4's largest value. None where no expert has
    /// an input scale (weight-only exports); an error naming the first expert without one where
    /// others have one.
    pub fn experts_input_scale<P: ExpertShards>(&self, experts: usize, prefix_of: impl Fn(usize) -> P) -> Result<Option<f32>> {
        check_experts(experts)?;
        let mut found: Option<(f32, String)> = None;
        let mut missing: Option<String> = None;
        for e in 0..experts {
            let p = prefix_of(e);
            let shards = p.shards();
            if shards.is_empty() {
                return Err(Error::InvalidData { what: "prefixes", detail: format!("none for expert {e}: an expert's layer has at least one shard") });
            }
            for prefix in shards {
                match self.layer_scales(prefix)?.1 {
                    Some(v) => {
                        if found.as_ref().is_none_or(|(m, _)| v > *m) {
                            found = Some((v, prefix.to_string()));
                        }
                    }
                    None => {
                        missing.get_or_insert_with(|| prefix.to_string());
                    }
                }
                if let (Some((_, with)), Some(without)) = (&found, &missing) {
                    return Err(bad(without, format!("has no input scale, and {with} has one: an expert stack's layers all have one or none")));
                }
            }
        }
        Ok(found.map(|(v, _)| v))
    }

    /// The experts of [`Self::experts`], checked and stacked as stored.
    fn experts_raw<P: ExpertShards>(&self, experts: usize, prefix_of: impl Fn(usize) -> P, part: Option<&Part>) -> Result<ExpertStack> {
        check_experts(experts)?;
        let (mut data, mut scales, mut globals) = (Vec::new(), Vec::new(), Vec::new());
        let mut nk = None;
        for e in 0..experts {
            let p = prefix_of(e);
            let shards = p.shards();
            // Shards of one expert under different global scales (gate and up exported apart): the
            // grouped GEMM takes one factor an expert, and this loader does not re-round block
            // scales, so the advice differs from a dense fused layer's.
            let l = self.fused_raw(&shards, &|| format!("expert {e}'s fused shards need one global scale (the grouped GEMM takes one factor an expert, and this loader does not re-round block scales to a common one); load the shards as separate expert stacks, one grouped GEMM each"), part)?;
            // The whole layers compared, not only the parts: a part that fits two different
            // experts would otherwise stack them silently.
            match nk {
                None => {
                    nk = Some((l.n, l.k, l.whole));
                    // The stack's size once, from the first expert: a typed error now for a count
                    // the host cannot hold, and no regrowth per expert.
                    let reserve = |v: &mut Vec<u8>, each: usize, what: &'static str| {
                        let bytes = each.checked_mul(experts).ok_or(Error::HostMemory { what, bytes: usize::MAX })?;
                        v.try_reserve_exact(bytes).map_err(|_| Error::HostMemory { what, bytes })
                    };
                    reserve(&mut data, l.data.len(), "an expert stack's packed weights")?;
                    reserve(&mut scales, l.scales.len(), "an expert stack's block scales")?;
                }
                // The part and the whole: experts of different shard counts can have equal
                // wholes and unequal parts, and the reverse.
                Some((n, k, first)) if (n, k, first) != (l.n, l.k, l.whole) => {
                    return Err(bad(
                        format!("{}.{}", shards[0], tensor_names(l.convention)[0]),
                        format!("(N, K) = {:?}, {:?} of them read: expert 0 has {first:?}, {:?} read; an expert stack shares N and K", l.whole, (l.n, l.k), (n, k)),
                    ));
                }
                _ => {}
            }
            append(&mut data, &l.data, "an expert stack's packed weights")?;
            append(&mut scales, &l.scales, "an expert stack's block scales")?;
            globals.push(l.global);
        }
        let (n, k, _) = nk.expect("at least one expert");
        Ok(ExpertStack { n, k, data, scales, globals })
    }
}

/// The layer prefixes of one expert for [`Checkpoint::experts`]: one (`String`, `&str`), or
/// fused shards stacked along N in order (an array, `Vec` or slice of `String` or `&str`).
pub trait ExpertShards {
    /// The prefixes, at least one.
    fn shards(&self) -> Vec<&str>;
}
impl ExpertShards for String {
    fn shards(&self) -> Vec<&str> {
        vec![self.as_str()]
    }
}
impl ExpertShards for &str {
    fn shards(&self) -> Vec<&str> {
        vec![*self]
    }
}
impl<T: AsRef<str>, const S: usize> ExpertShards for [T; S] {
    fn shards(&self) -> Vec<&str> {
        self.iter().map(AsRef::as_ref).collect()
    }
}
impl<T: AsRef<str>> ExpertShards for Vec<T> {
    fn shards(&self) -> Vec<&str> {
        self.iter().map(AsRef::as_ref).collect()
    }
}
impl<T: AsRef<str>> ExpertShards for &[T] {
    fn shards(&self) -> Vec<&str> {
        self.iter().map(AsRef::as_ref).collect()
    }
}

/// What a dense fused layer whose shards have different global scales can do instead.
const DENSE_UNEQUAL_GLOBALS: &str = "fused shards need one global scale (run a GEMM per shard)";

/// An expert stack has at least one expert.
fn check_experts(experts: usize) -> Result<()> {
    if experts == 0 {
        return Err(Error::InvalidData { what: "experts", detail: "0: an expert stack has at least one expert".into() });
    }
    Ok(())
}

/// An expert stack as stored: N, K, the packed values, the row-major scales (E batches) and
/// each expert's global scale.
struct ExpertStack {
    n: usize,
    k: usize,
    data: Vec<u8>,
    scales: Vec<u8>,
    globals: Vec<f32>,
}

impl ExpertStack {
    /// The (E, N, K) matrix of global scale 1 (scales tiled on the host), and each expert's scale.
    fn into_matrix(self) -> Result<(Nvfp4Matrix, Vec<f32>)> {
        let shape = (self.globals.len(), self.n, self.k);
        Ok((Nvfp4Matrix::from_parts(shape, self.data, to_tiled(&self.scales, (shape.0, shape.1, shape.2 / 16))?, None)?, self.globals))
    }

    /// Uploaded as stored, the scales tiled on the GPU.
    fn into_device(self, stream: &Arc<CudaStream>) -> Result<(Nvfp4Tensor, Vec<f32>)> {
        let (values, scales) = (stream.clone_htod(&self.data)?, stream.clone_htod(&self.scales)?);
        Ok((Nvfp4Tensor::from_row_major_scales(values, &scales, (self.globals.len(), self.n, self.k), 1.0, stream)?, self.globals))
    }
}

/// Which part of a layer a tensor-parallel rank reads: weight rows, and K in whole scale blocks.
struct Part {
    rows: Range<usize>,
    k: Range<usize>,
}

impl RawLayer {
    /// The layer as a (1, N, K) matrix, scales tiled on the host.
    fn into_layer(self) -> Result<CheckpointLayer> {
        let weight = Nvfp4Matrix::from_parts((1, self.n, self.k), self.data, to_tiled(&self.scales, (1, self.n, self.k / 16))?, Some(self.global))?;
        Ok(CheckpointLayer { weight, input_scale: self.input_scale, convention: self.convention })
    }

    /// Uploaded as stored, the scales tiled on the GPU; with the activations' scale.
    fn into_device(self, stream: &Arc<CudaStream>) -> Result<(Nvfp4Tensor, Option<f32>)> {
        let (values, scales) = (stream.clone_htod(&self.data)?, stream.clone_htod(&self.scales)?);
        Ok((Nvfp4Tensor::from_row_major_scales(values, &scales, (1, self.n, self.k), self.global, stream)?, self.input_scale))
    }
}

/// The device conversions upload and allocate: not during CUDA graph capture (a typed error
/// before anything is queued).
fn refuse_capture(call: &'static str, stream: &Arc<CudaStream>) -> Result<()> {
    if crate::gemm::capture_check(stream)? {
        return Err(Error::NotCapturable { call, why: "it uploads the weights and allocates", fix: "load the weights before capturing" });
    }
    Ok(())
}

/// Reads the header of the safetensors file `path`, shard `id` of its checkpoint: the file's
/// data start and length, and its tensors.
fn read_header(path: &Path, id: usize) -> Result<(Shard, HashMap<String, TensorEntry>)> {
    let io = |source: std::io::Error| Error::Io { path: path.display().to_string(), source };
    regular_file(path)?;
    let mut f = File::open(path).map_err(io)?;
    let file_len = f.metadata().map_err(io)?.len();
    let file = path.display().to_string();
    if file_len < 8 {
        return Err(bad(file, format!("{file_len} bytes: a safetensors file starts with an 8-byte header length")));
    }
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(io)?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || 8 + n > file_len {
        return Err(bad(file, format!("header of {n} bytes: the file holds {file_len} bytes (not a safetensors file?)")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io)?;
    let entries = header::parse(&header).map_err(|e| match e {
        header::HeaderError::NotJson(e) => bad(file.clone(), format!("header is not a JSON object of tensor entries: {e}")),
        header::HeaderError::Entry { name, rule } => bad(name, format!("in the header of {file}: {rule}")),
    })?;
    let data_start = 8 + n;
    let mut tensors = HashMap::with_capacity(entries.len());
    for header::Entry { name, dtype, shape, offsets } in entries {
        let entry = TensorEntry { dtype, shape, range: offsets, shard: id };
        if entry.range.0 > entry.range.1 {
            return Err(bad(name, format!("data_offsets {:?} in {file}: the begin is past the end", entry.range)));
        }
        if data_start.checked_add(entry.range.1).is_none_or(|end| end > file_len) {
            return Err(bad(name, format!("data_offsets {:?} lie outside the {} data bytes of {file}", entry.range, file_len - data_start)));
        }
        if tensors.contains_key(&name) {
            return Err(bad(name, format!("named twice in the header of {file}")));
        }
        tensors.insert(name, entry);
    }
    check_fully_indexed(&tensors, file_len - data_start, &file)?;
    Ok((Shard { path: path.to_path_buf(), data_start, file_len }, tensors))
}

/// The safetensors rule the `safetensors` crate enforces (so `--input` and a checkpoint accept the
/// same files): the tensors' byte ranges, in order, tile the data exactly, with no overlap, no
/// hole and nothing after the last. Ranges are within the data already.
fn check_fully_indexed(tensors: &HashMap<String, TensorEntry>, data_len: u64, file: &str) -> Result<()> {
    let mut by_start: Vec<(&String, (u64, u64))> = tensors.iter().map(|(n, e)| (n, e.range)).collect();
    by_start.sort_by_key(|&(n, r)| (r, n));
    let mut end = 0u64;
    let mut prev: Option<&String> = None;
    for (name, (a, b)) in by_start {
        if a != end {
            let after = prev.map_or(String::new(), |p| format!(" ({p} ends at {end})"));
            let what = if a < end { format!("overlap the tensor before{after}") } else { format!("leave data bytes {end}..{a} unused{after}") };
            return Err(bad(name.clone(), format!("data_offsets [{a}, {b}] {what} in {file}: a safetensors file's tensors must cover its data exactly, without overlap or holes")));
        }
        (end, prev) = (b, Some(name));
    }
    if end != data_len {
        let last = prev.map_or("no tensor".into(), |p| format!("the last tensor, {p}, ends at {end}"));
        return Err(bad(file, format!("{} bytes of data follow the tensors ({last} of {data_len}): a safetensors file's tensors must cover its data exactly", data_len - end)));
    }
    Ok(())
}

/// A shard name of an index: relative, with no `..` (it stays inside the index's directory).
fn plain_name(file: &str) -> bool {
    use std::path::Component;
    let p = Path::new(file);
    p.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) && p.components().any(|c| matches!(c, Component::Normal(_)))
}

/// Whether a ModelOpt `quant_algo` stores the weights as this loader reads them (NVFP4, or
/// W4A16_NVFP4: the same weights, no activation scale).
fn weights_are_nvfp4(algo: &str) -> bool {
    algo.eq_ignore_ascii_case("NVFP4") || algo.eq_ignore_ascii_case("W4A16_NVFP4")
}

/// What a ModelOpt quant config says of the layers: MIXED_PRECISION's per-layer algorithms, and
/// the modules left unquantized (`exclude_modules`, fnmatch patterns).
#[derive(Debug, Default)]
struct QuantConfig {
    algos: Option<HashMap<String, String>>,
    exclude: Vec<String>,
}

/// `name` against an fnmatch pattern of `*` (any run) and `?` (one character), as ModelOpt's
/// `exclude_modules` are written; other characters (`[` included: no classes) match themselves.
fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// ModelOpt's `hf_quant_config.json` in `dir`, if there is one: its `quant_algo`
/// (`quantization.quant_algo`, or `quant_algo` at the top level) must be NVFP4, or
/// MIXED_PRECISION, whose `quantized_layers` map each layer prefix to its own `quant_algo`
/// (returned, and checked per layer when it is read); its `exclude_modules` are returned too. No
/// file, or no such key: nothing to check.
fn check_quant_config(dir: &Path) -> Result<QuantConfig> {
    let path = dir.join(QUANT_CONFIG);
    let file = path.display().to_string();
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(QuantConfig::default()),
        _ => regular_file(&path)?,
    }
    let text = read_json_file(&path)?;
    let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| bad(file.clone(), format!("not JSON: {e}")))?;
    let q = json.get("quantization").filter(|q| q.get("quant_algo").is_some()).unwrap_or(&json);
    let exclude = q.get("exclude_modules").and_then(|e| e.as_array()).map(|a| a.iter().filter_map(|p| p.as_str().map(String::from)).collect()).unwrap_or_default();
    let algos = match q.get("quant_algo") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(a)) if weights_are_nvfp4(a) => None,
        Some(serde_json::Value::String(a)) if a.eq_ignore_ascii_case("MIXED_PRECISION") => {
            let layers = q.get("quantized_layers").and_then(|l| l.as_object()).ok_or_else(|| bad(file.clone(), "quant_algo MIXED_PRECISION needs a \"quantized_layers\" object"))?;
            let algos = layers
                .iter()
                .map(|(prefix, cfg)| (prefix.clone(), cfg.get("quant_algo").and_then(|a| a.as_str()).unwrap_or("(none)").to_string()))
                .collect();
            Some(algos)
        }
        Some(a) => {
            return Err(bad(
                file,
                format!("quant_algo {a}: only NVFP4 (also W4A16_NVFP4, or MIXED_PRECISION per layer) is supported (weight_scale_2 multiplying, input_scale = activation amax / (6 * 448)); this algorithm's tensors would load with the wrong meaning"),
            ))
        }
    };
    Ok(QuantConfig { algos, exclude })
}

/// The name of a layer's packed weight in a convention.
/// A layer's tensor names (after its prefix) by convention: the packed weight, the weight's
/// global scale, the activations' scale.
fn tensor_names(c: Convention) -> [&'static str; 3] {
    match c {
        Convention::ModelOpt => ["weight", "weight_scale_2", "input_scale"],
        Convention::CompressedTensors => ["weight_packed", "weight_global_scale", "input_global_scale"],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    /// (name, dtype, shape, bytes) of one tensor to write.
    type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

    /// A file or folder (`path`) in a temporary folder of this test process (`dir`), which is
    /// removed when the guard drops, so test runs leave nothing in the system's temporary folder.
    struct Scratch {
        dir: PathBuf,
        path: PathBuf,
    }
    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.path
        }
    }
    impl AsRef<Path> for Scratch {
        fn as_ref(&self) -> &Path {
            &self.path
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A safetensors file of (name, dtype, shape, bytes) in a fresh temporary folder.
    fn write(tag: &str, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Scratch {
        let mut s = fresh_dir(tag);
        s.path = s.dir.join("model.safetensors");
        write_to(&s.path, tensors);
        s
    }

    /// A safetensors file of (name, dtype, shape, bytes) at `path`.
    fn write_to(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, TensorView<'_>)> = tensors.iter().map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
        std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
    }

    /// An empty temporary folder of this test process (emptied if an earlier run left it).
    fn fresh_dir(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("bsg-checkpoint-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { path: dir.clone(), dir }
    }

    /// An index at `path` whose weight_map maps each (tensor, shard file).
    fn write_index(path: &Path, map: &[(&str, &str)]) {
        let weight_map: serde_json::Map<String, serde_json::Value> = map.iter().map(|(t, f)| (t.to_string(), serde_json::Value::String(f.to_string()))).collect();
        let json = serde_json::json!({ "metadata": { "total_size": 0 }, "weight_map": serde_json::Value::Object(weight_map) });
        std::fs::write(path, serde_json::to_vec(&json).unwrap()).unwrap();
    }

    /// `tensors` written into the shard files `shard_of` names, in `dir`, with the index
    /// `model.safetensors.index.json` mapping each to its shard; returns the index's path.
    fn write_sharded(dir: &Path, tensors: &[Tensor], shard_of: &dyn Fn(&str) -> &'static str) -> PathBuf {
        let mut files: Vec<&'static str> = tensors.iter().map(|t| shard_of(&t.0)).collect();
        files.sort_unstable();
        files.dedup();
        for f in &files {
            let part: Vec<Tensor> = tensors.iter().filter(|t| shard_of(&t.0) == *f).cloned().collect();
            write_to(&dir.join(f), &refs(&part));
        }
        let map: Vec<(&str, &str)> = tensors.iter().map(|t| (t.0.as_str(), shard_of(&t.0))).collect();
        let index = dir.join("model.safetensors.index.json");
        write_index(&index, &map);
        index
    }

    fn f32s(v: f32) -> Vec<u8> {
        v.to_le_bytes().to_vec()
    }

    /// A quantized weight and the tensors ModelOpt or compressed-tensors would export for it.
    fn layer_tensors(prefix: &str, conv: Convention, n: usize, k: usize, seed: u64, input: Option<f32>) -> (Nvfp4Matrix, Vec<Tensor>) {
        let mut rng = crate::SplitMix64::new(seed);
        let x: Vec<f32> = (0..n * k).map(|_| rng.normal() as f32).collect();
        let m = Nvfp4Matrix::quantize(&x, (1, n, k), None).unwrap();
        let g = m.global_scale().unwrap();
        let (w, gs, inn, gv, iv) = match conv {
            Convention::ModelOpt => ("weight", "weight_scale_2", "input_scale", g, input),
            Convention::CompressedTensors => ("weight_packed", "weight_global_scale", "input_global_scale", 1.0 / g, input.map(|s| 1.0 / s)),
        };
        let mut t = vec![
            (format!("{prefix}.{w}"), Dtype::U8, vec![n, k / 2], m.data().to_vec()),
            (format!("{prefix}.weight_scale"), Dtype::F8_E4M3, vec![n, k / 16], m.scales_row_major().unwrap()),
            (format!("{prefix}.{gs}"), Dtype::F32, vec![], f32s(gv)),
        ];
        if let Some(v) = iv {
            t.push((format!("{prefix}.{inn}"), Dtype::F32, vec![1], f32s(v)));
        }
        (m, t)
    }

    fn refs(t: &[Tensor]) -> Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> {
        t.iter().map(|(a, b, c, d)| (a.as_str(), *b, c.clone(), d.clone())).collect()
    }

    #[test]
    fn tensor_parallel_shards_cut_rows_and_k() {
        let (m, t) = layer_tensors("l", Convention::CompressedTensors, 48, 96, 6, Some(0.01));
        let file = write("shards", &refs(&t));
        let ck = Checkpoint::open(&file).unwrap();
        let whole = ck.layer("l").unwrap();
        let rm = m.scales_row_major().unwrap();
        for (rows, k) in [(8..24, 16..80), (0..48, 0..96), (47..48, 80..96), (0..1, 0..16)] {
            let s = ck.layer_shard("l", rows.clone(), k.clone()).unwrap();
            assert_eq!((s.weight.batch(), s.weight.rows(), s.weight.k()), (1, rows.len(), k.len()));
            let want_data: Vec<u8> = rows.clone().flat_map(|r| m.data()[r * 48 + k.start / 2..r * 48 + k.end / 2].to_vec()).collect();
            let want_sf: Vec<u8> = rows.clone().flat_map(|r| rm[r * 6 + k.start / 16..r * 6 + k.end / 16].to_vec()).collect();
            assert_eq!(s.weight.data(), &want_data[..], "{rows:?} {k:?}");
            assert_eq!(s.weight.scales_row_major().unwrap(), want_sf, "{rows:?} {k:?}");
            assert_eq!((s.weight.global_scale(), s.input_scale, s.convention), (whole.weight.global_scale(), whole.input_scale, whole.convention));
        }
        assert_eq!(ck.layer_shard("l", 0..48, 0..96).unwrap().weight.scales(), whole.weight.scales());
        for (rows, k) in [(0..0, 0..96), (40..49, 0..96), (0..48, 8..40), (0..48, 16..40), (0..48, 0..112), (0..48, 32..32)] {
            let e = ck.layer_shard("l", rows.clone(), k.clone()).unwrap_err().to_string();
            assert!(e.starts_with("l: "), "{rows:?} {k:?}: {e}");
        }
    }

    /// A shard reads only its own bytes: a NaN scale outside it does not refuse it, one inside
    /// is named at its place in the whole tensor; and stacking a part of two layers of different
    /// K (or of experts of different N) is refused although the part fits both.
    #[test]
    fn shards_read_their_own_bytes_and_compare_whole_layers() {
        let (_, mut t) = layer_tensors("l", Convention::ModelOpt, 48, 96, 7, None);
        t[1].3[40 * 6 + 2] = 0x7F; // row 40, block 2
        let file = write("shard-nan", &refs(&t));
        let ck = Checkpoint::open(&file).unwrap();
        let e = ck.layer("l").unwrap_err().to_string();
        assert!(e.contains("element 242 (row 40, block 2) is NaN"), "{e}");
        assert!(ck.layer_shard("l", 0..40, 0..96).is_ok() && ck.layer_shard("l", 0..48, 48..96).is_ok());
        let e = ck.layer_shard("l", 8..48, 32..96).unwrap_err().to_string();
        assert!(e.contains("element 242 (row 40, block 2) is NaN"), "{e}");

        let (_, a) = layer_tensors("a", Convention::ModelOpt, 32, 64, 8, None);
        let (_, mut b) = layer_tensors("b", Convention::ModelOpt, 32, 96, 9, None);
        b[2].3 = a[2].3.clone(); // one global scale, as fused shards have
        let file = write("shard-k", &refs(&[a, b].concat()));
        let ck = Checkpoint::open(&file).unwrap();
        let e = ck.fused_raw(&["a", "b"], &|| String::new(), Some(&Part { rows: 0..32, k: 0..64 })).err().unwrap().to_string();
        assert!(e.starts_with("b.weight: K = 96: a has K = 64"), "{e}");

        let (_, e0) = layer_tensors("x.0", Convention::ModelOpt, 32, 64, 10, None);
        let (_, e1) = layer_tensors("x.1", Convention::ModelOpt, 48, 64, 11, None);
        let file = write("shard-n", &refs(&[e0, e1].concat()));
        let ck = Checkpoint::open(&file).unwrap();
        let e = ck.experts_shard(2, |e| format!("x.{e}"), 0..16, 0..64).unwrap_err().to_string();
        assert!(e.starts_with("x.1.weight: (N, K) = (48, 64), (16, 64) of them read: expert 0 has (32, 64)"), "{e}");
        // Experts of equal wholes and different shard counts: [a; b] against [c], all 32 rows.
        let (_, a) = layer_tensors("y.0a", Convention::ModelOpt, 16, 64, 12, None);
        let (_, mut b) = layer_tensors("y.0b", Convention::ModelOpt, 16, 64, 13, None);
        let (_, mut c) = layer_tensors("y.1", Convention::ModelOpt, 32, 64, 14, None);
        (b[2].3, c[2].3) = (a[2].3.clone(), a[2].3.clone());
        let file = write("shard-count", &refs(&[a, b, c].concat()));
        let ck = Checkpoint::open(&file).unwrap();
        let two = |e: usize| if e == 0 { vec!["y.0a".to_string(), "y.0b".into()] } else { vec!["y.1".to_string()] };
        assert_eq!(ck.experts(2, two).unwrap().0.rows(), 32, "the wholes stack");
        let e = ck.experts_shard(2, two, 0..8, 0..64).unwrap_err().to_string();
        assert!(e.starts_with("y.1.weight: (N, K) = (32, 64), (8, 64) of them read: expert 0 has (32, 64), (16, 64) read"), "{e}");
        // Shards of different N cut at one rows range: refused (not a tensor-parallel split);
        // whole, they fuse.
        let (_, q) = layer_tensors("q", Convention::ModelOpt, 32, 64, 15, None);
        let (_, mut kv) = layer_tensors("kv", Convention::ModelOpt, 16, 64, 16, None);
        kv[2].3 = q[2].3.clone();
        let file = write("shard-qkv", &refs(&[q, kv].concat()));
        let qkv = Checkpoint::open(&file).unwrap();
        assert_eq!(qkv.fused(&["q", "kv"]).unwrap().weight.rows(), 48);
        let e = qkv.fused_raw(&["q", "kv"], &|| String::new(), Some(&Part { rows: 0..8, k: 0..64 })).err().unwrap().to_string();
        assert!(e.starts_with("kv.weight: N = 16: q has N = 32; shards cut at the same rows have equal N"), "{e}");
        // A count of experts no host holds: a typed error after the first expert, not a regrowth per expert.
        let e = ck.experts(usize::MAX, |_| "y.1").unwrap_err();
        assert!(matches!(e, Error::HostMemory { .. }), "{e:?}");
    }

    /// A region reads the bytes a whole read would give there, by each of its three ways: whole
    /// rows at once, rows in spans of SPAN_BYTES (two spans here), and a seek a row (gaps of
    /// SKIP_BYTES or more, or of a page and more than eight times the bytes kept).
    #[test]
    fn region_reads_agree_with_whole_reads() {
        let bytes = |n: usize, seed: u64| -> Vec<u8> { (0..n as u64).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed).wrapping_shr(29) as u8).collect() };
        let (tall, wide, mid) = ((SPAN_BYTES / 2048 + 104, 2048), (3, SKIP_BYTES + 64), (4, 8192));
        let file = write("regions", &[("tall", Dtype::U8, vec![tall.0, tall.1], bytes(tall.0 * tall.1, 1)), ("wide", Dtype::U8, vec![wide.0, wide.1], bytes(wide.0 * wide.1, 2)), ("mid", Dtype::U8, vec![mid.0, mid.1], bytes(mid.0 * mid.1, 3))]);
        let ck = Checkpoint::open(&file).unwrap();
        for (name, (r, c), rows, cols) in [
            ("tall", tall, 0..tall.0, 100..612),
            ("tall", tall, 5..tall.0 - 1, 0..2048),
            ("tall", tall, 4095..4097, 2047..2048),
            ("tall", tall, 17..4113, 1..2047),
            ("wide", wide, 0..3, 16..48),
            ("wide", wide, 1..3, 0..wide.1 - 1),
            ("mid", mid, 1..4, 16..32),
            ("mid", mid, 0..4, 0..4096),
        ] {
            let whole = ck.read(name, "U8", &[Some(r), Some(c)], "t").unwrap();
            let want: Vec<u8> = rows.clone().flat_map(|row| whole[row * c + cols.start..row * c + cols.end].to_vec()).collect();
            let got = ck.read_region(name, "U8", &[Some(r), Some(c)], "t", Some((&rows, &cols))).unwrap();
            assert!(got == want, "{name} {rows:?} {cols:?}");
        }
        for (rows, cols) in [(0..0, 0..8), (0..3, 8..8), (0..4, 0..8), (0..3, 0..wide.1 + 1)] {
            let e = ck.read_region("wide", "U8", &[Some(3), Some(wide.1)], "t", Some((&rows, &cols))).unwrap_err().to_string();
            assert!(e.starts_with("wide: rows"), "{rows:?} {cols:?}: {e}");
        }
    }

    /// An expert stack's tensor-parallel shard is each expert's fused shards cut alike: gate
    /// rows then up rows for a column-parallel gate-up, a K range for a row-parallel down.
    #[test]
    fn expert_stacks_shard_every_expert_alike() {
        let p = |e: usize, w: &str| format!("mlp.experts.{e}.{w}");
        let (_, t) = gate_up_experts(3, Convention::CompressedTensors, &|_| None);
        let file = write("gate-up-shard", &refs(&t));
        let ck = Checkpoint::open(&file).unwrap();
        let (whole, scales) = ck.experts(3, |e| [p(e, "gate_proj"), p(e, "up_proj")]).unwrap();
        for (rows, k) in [(8..24, 0..64), (0..32, 16..48), (31..32, 48..64)] {
            let (w, s) = ck.experts_shard(3, |e| [p(e, "gate_proj"), p(e, "up_proj")], rows.clone(), k.clone()).unwrap();
            assert_eq!((w.batch(), w.rows(), w.k(), w.global_scale(), &s), (3, 2 * rows.len(), k.len(), None, &scales));
            for e in 0..3 {
                let (gate, up) = (ck.layer_shard(&p(e, "gate_proj"), rows.clone(), k.clone()).unwrap(), ck.layer_shard(&p(e, "up_proj"), rows.clone(), k.clone()).unwrap());
                let b = w.batch_slice(e).unwrap();
                assert_eq!(b.data(), [gate.weight.data(), up.weight.data()].concat(), "{rows:?} {k:?} expert {e}");
                assert_eq!(b.scales_row_major().unwrap(), [gate.weight.scales_row_major().unwrap(), up.weight.scales_row_major().unwrap()].concat());
                // The whole stack's rows, cut on the host, agree.
                let wb = whole.batch_slice(e).unwrap();
                let want: Vec<usize> = rows.clone().chain(rows.clone().map(|r| r + 32)).collect();
                let cut = wb.select_rows(&want).unwrap();
                let kb = (k.start / 2..k.end / 2, 32);
                let want_data: Vec<u8> = cut.data().chunks(kb.1).flat_map(|r| r[kb.0.clone()].to_vec()).collect();
                assert_eq!(b.data(), &want_data[..]);
            }
        }
        let e = ck.experts_shard(3, |e| p(e, "down_proj"), 0..8, 0..64).unwrap_err().to_string();
        assert!(e.starts_with("mlp.experts.0.down_proj.weight: not in"), "{e}");
        let e = ck.experts_shard(3, |e| p(e, "up_proj"), 0..33, 0..64).unwrap_err().to_string();
        assert!(e.starts_with("mlp.experts.0.up_proj: rows 0..33"), "{e}");
    }

    #[test]
    fn other_tensors_read_through_the_same_headers() {
        let (_, mut t) = layer_tensors("l", Convention::ModelOpt, 32, 64, 5, None);
        let router: Vec<u8> = (0..2 * 3 * 2).map(|i| i as u8).collect();
        t.push(("gate.weight".into(), Dtype::BF16, vec![2, 3], router.clone()));
        t.push(("bias".into(), Dtype::F32, vec![3], f32s(1.5).repeat(3)));
        let file = write("other-tensors", &refs(&t));
        let ck = Checkpoint::open(&file).unwrap();
        assert_eq!(ck.tensor_info("gate.weight").unwrap(), ("BF16", &[2usize, 3][..]));
        assert_eq!(ck.tensor_bytes("gate.weight").unwrap(), router);
        assert_eq!(ck.tensor_bytes("bias").unwrap(), f32s(1.5).repeat(3));
        assert_eq!(ck.tensor_info("l.weight").unwrap(), ("U8", &[32usize, 32][..]));
        assert_eq!(ck.tensor_bytes("l.weight").unwrap(), t[0].3);
        let e = ck.tensor_bytes("gate.bias").unwrap_err().to_string();
        assert!(e.starts_with("gate.bias: not in"), "{e}");
    }

    #[test]
    fn both_conventions_give_the_quantized_matrix() {
        for (conv, tag) in [(Convention::ModelOpt, "modelopt"), (Convention::CompressedTensors, "ct")] {
            let (m, t) = layer_tensors("model.layers.0.mlp.down_proj", conv, 130, 96, 1, Some(0.0123));
            let file = write(tag, &refs(&t));
            let ck = Checkpoint::open(&file).unwrap();
            let l = ck.layer("model.layers.0.mlp.down_proj").unwrap();
            assert_eq!(l.convention, conv);
            assert_eq!(ck.convention("model.layers.0.mlp.down_proj").unwrap(), conv, "from the header alone");
            assert!(ck.convention("model.layers.0.mlp.up_proj").is_err(), "a layer the file lacks");
            assert_eq!(l.weight.data(), m.data());
            assert_eq!(l.weight.scales(), m.scales(), "tiled as the quantizer tiles them");
            let want_g = match conv {
                Convention::ModelOpt => m.global_scale().unwrap(),
                Convention::CompressedTensors => 1.0 / (1.0 / m.global_scale().unwrap()),
            };
            assert_eq!(l.weight.global_scale(), Some(want_g));
            let want_in = if conv == Convention::ModelOpt { 0.0123f32 } else { 1.0 / (1.0 / 0.0123f32) };
            assert_eq!(l.input_scale, Some(want_in));
        }
    }

    #[test]
    fn fused_shards_stack_along_n() {
        // Three shards of one tensor's quantization (one global scale), as a fused q/k/v exports.
        let mut rng = crate::SplitMix64::new(21);
        let (k, ns) = (64, [48usize, 16, 80]);
        let x: Vec<f32> = (0..ns.iter().sum::<usize>() * k).map(|_| rng.normal() as f32).collect();
        let whole = Nvfp4Matrix::quantize(&x, (1, 144, k), None).unwrap();
        let g = whole.global_scale().unwrap();
        let (mut t, mut at) = (Vec::new(), 0);
        for (name, n) in ["q", "k", "v"].into_iter().zip(ns) {
            let part = whole.select_rows(&(at..at + n).collect::<Vec<_>>()).unwrap();
            t.push((format!("{name}.weight"), Dtype::U8, vec![n, k / 2], part.data().to_vec()));
            t.push((format!("{name}.weight_scale"), Dtype::F8_E4M3, vec![n, k / 16], part.scales_row_major().unwrap()));
            t.push((format!("{name}.weight_scale_2"), Dtype::F32, vec![], f32s(g)));
            at += n;
        }
        let file = write("fused", &refs(&t));
        let ck = Checkpoint::open(&file).unwrap();
        let l = ck.fused(&["q", "k", "v"]).unwrap();
        assert_eq!((l.weight.data(), l.weight.scales(), l.weight.global_scale()), (whole.data(), whole.scales(), Some(g)));
        // A shard with another global scale is refused, naming it.
        t[5].3 = f32s(g * 2.0);
        let file = write("fused-bad", &refs(&t));
        let ck = Checkpoint::open(&file).unwrap();
        let e = ck.fused(&["q", "k", "v"]).unwrap_err().to_string();
        assert!(e.starts_with("k.weight_scale_2: global scale") && e.contains("run a GEMM per shard"), "{e}");
        assert!(ck.fused(&[]).is_err());
    }

    #[test]
    fn fused_shards_name_their_input_scale_by_convention() {
        // Two shards of one quantization (one global scale) whose activations' scales differ.
        let mut rng = crate::SplitMix64::new(23);
        let k = 64;
        let x: Vec<f32> = (0..64 * k).map(|_| rng.normal() as f32).collect();
        let whole = Nvfp4Matrix::quantize(&x, (1, 64, k), None).unwrap();
        let g = whole.global_scale().unwrap();
        let conventions = [("weight", "weight_scale_2", "input_scale", g), ("weight_packed", "weight_global_scale", "input_global_scale", 1.0 / g)];
        for (w, gs, inn, gv) in conventions {
            let mut t = Vec::new();
            for (i, name) in ["gate", "up"].into_iter().enumerate() {
                let part = whole.select_rows(&(32 * i..32 * (i + 1)).collect::<Vec<_>>()).unwrap();
                t.push((format!("{name}.{w}"), Dtype::U8, vec![32, k / 2], part.data().to_vec()));
                t.push((format!("{name}.weight_scale"), Dtype::F8_E4M3, vec![32, k / 16], part.scales_row_major().unwrap()));
                t.push((format!("{name}.{gs}"), Dtype::F32, vec![], f32s(gv)));
                t.push((format!("{name}.{inn}"), Dtype::F32, vec![1], f32s(0.5 + i as f32)));
            }
            let file = write(&format!("fused-{inn}"), &refs(&t));
            let e = Checkpoint::open(&file).unwrap().fused(&["gate", "up"]).unwrap_err().to_string();
            assert!(e.starts_with(&format!("up.{inn}: ")) && e.contains("share the activations' scale"), "{e}");
        }
    }

    #[test]
    fn element_2i_is_the_low_nibble() {
        // Byte 0x21: element 0 is code 1 (0.5), element 1 code 2 (1.0); scale 0x38 is 1.0.
        let t = [
            ("l.weight", Dtype::U8, vec![1, 8], vec![0x21u8; 8]),
            ("l.weight_scale", Dtype::F8_E4M3, vec![1, 1], vec![0x38]),
            ("l.weight_scale_2", Dtype::F32, vec![], f32s(1.0)),
        ];
        let file = write("nibbles", &t);
        let l = Checkpoint::open(&file).unwrap().layer("l").unwrap();
        assert_eq!((l.weight.value(0, 0, 0), l.weight.value(0, 0, 1)), (0.5, 1.0));
        assert_eq!(l.input_scale, None);
    }

    #[test]
    fn expert_stacks_carry_each_experts_scale() {
        let mut all = Vec::new();
        let mut want = Vec::new();
        for e in 0..3 {
            let (m, t) = layer_tensors(&format!("mlp.experts.{e}.up_proj"), Convention::ModelOpt, 64, 128, 10 + e as u64, None);
            all.extend(t);
            want.push(m);
        }
        let file = write("experts", &refs(&all));
        let ck = Checkpoint::open(&file).unwrap();
        let (w, scales) = ck.experts(3, |e| format!("mlp.experts.{e}.up_proj")).unwrap();
        assert_eq!((w.batch(), w.rows(), w.k(), w.global_scale()), (3, 64, 128, None));
        for (e, m) in want.iter().enumerate() {
            assert_eq!(w.batch_slice(e).unwrap().data(), m.data());
            assert_eq!(w.batch_slice(e).unwrap().scales(), m.scales());
            assert_eq!(scales[e], m.global_scale().unwrap());
        }
        let e = ck.experts(4, |e| format!("mlp.experts.{e}.up_proj")).unwrap_err().to_string();
        assert!(e.starts_with("mlp.experts.3.up_proj.weight: not in"), "{e}");
    }

    /// Per expert, gate and up quantized as one tensor (one global scale), exported as two
    /// layers: the stack of [gate; up] per expert is each expert's fused layer, in order.
    fn gate_up_experts(experts: usize, conv: Convention, inputs: &dyn Fn(usize) -> Option<f32>) -> (Vec<Nvfp4Matrix>, Vec<Tensor>) {
        let (n, k) = (32, 64);
        let (mut whole, mut all) = (Vec::new(), Vec::new());
        for e in 0..experts {
            let (m, _) = layer_tensors("x", conv, 2 * n, k, 40 + e as u64, None);
            for (i, w) in ["gate_proj", "up_proj"].into_iter().enumerate() {
                let part = m.select_rows(&(i * n..(i + 1) * n).collect::<Vec<_>>()).unwrap();
                let g = m.global_scale().unwrap();
                let (wn, gs, inn, gv, iv) = match conv {
                    Convention::ModelOpt => ("weight", "weight_scale_2", "input_scale", g, inputs(e)),
                    Convention::CompressedTensors => ("weight_packed", "weight_global_scale", "input_global_scale", 1.0 / g, inputs(e).map(|v| 1.0 / v)),
                };
                let prefix = format!("mlp.experts.{e}.{w}");
                all.push((format!("{prefix}.{wn}"), Dtype::U8, vec![n, k / 2], part.data().to_vec()));
                all.push((format!("{prefix}.weight_scale"), Dtype::F8_E4M3, vec![n, k / 16], part.scales_row_major().unwrap()));
                all.push((format!("{prefix}.{gs}"), Dtype::F32, vec![], f32s(gv)));
                if let Some(v) = iv {
                    all.push((format!("{prefix}.{inn}"), Dtype::F32, vec![1], f32s(v)));
                }
            }
            whole.push(m);
        }
        (whole, all)
    }

    #[test]
    fn expert_stacks_of_fused_gate_and_up() {
        let p = |e: usize, w: &str| format!("mlp.experts.{e}.{w}");
        for conv in [Convention::ModelOpt, Convention::CompressedTensors] {
            let (whole, t) = gate_up_experts(3, conv, &|e| Some([0.5f32, 2.0, 1.0][e]));
            let file = write(&format!("gate-up-{conv:?}"), &refs(&t));
            let ck = Checkpoint::open(&file).unwrap();
            let (w, scales) = ck.experts(3, |e| [p(e, "gate_proj"), p(e, "up_proj")]).unwrap();
            assert_eq!((w.batch(), w.rows(), w.k(), w.global_scale()), (3, 64, 64, None));
            for (e, m) in whole.iter().enumerate() {
                let b = w.batch_slice(e).unwrap();
                assert_eq!((b.data(), b.scales()), (m.data(), m.scales()), "expert {e}: [gate; up] as quantized whole");
                let fused = ck.fused(&[&p(e, "gate_proj"), &p(e, "up_proj")]).unwrap();
                assert_eq!((fused.weight.data(), Some(scales[e])), (b.data(), fused.weight.global_scale()));
            }
            // The other forms of the same shards agree.
            let (v, _) = ck.experts(3, |e| vec![p(e, "gate_proj"), p(e, "up_proj")]).unwrap();
            assert_eq!(v.data(), w.data());
            // Input scales: the largest, read alone; and each layer's as `layer` reads it.
            let want = |v: f32| if conv == Convention::ModelOpt { v } else { 1.0 / (1.0 / v) };
            assert_eq!(ck.experts_input_scale(3, |e| [p(e, "gate_proj"), p(e, "up_proj")]).unwrap(), Some(want(2.0)));
            let l = ck.layer(&p(1, "up_proj")).unwrap();
            assert_eq!(ck.layer_scales(&p(1, "up_proj")).unwrap(), (l.weight.global_scale().unwrap(), l.input_scale));
            assert!(ck.experts(0, |e| p(e, "up_proj")).is_err() && ck.experts_input_scale(0, |e| p(e, "up_proj")).is_err());
            // An expert without shards: refused by both, as a fused layer without shards is.
            assert!(ck.experts(1, |_| Vec::<String>::new()).is_err());
            let e = ck.experts_input_scale(1, |_| Vec::<String>::new()).unwrap_err().to_string();
            assert!(e.contains("at least one shard"), "{e}");
        }
        // No expert with an input scale: None. Some with and some without: the first without is named.
        let (_, t) = gate_up_experts(2, Convention::ModelOpt, &|_| None);
        let gate_up_none = write("gate-up-none", &refs(&t));
        let ck = Checkpoint::open(&gate_up_none).unwrap();
        assert_eq!(ck.experts_input_scale(2, |e| p(e, "up_proj")).unwrap(), None);
        let (_, t) = gate_up_experts(3, Convention::ModelOpt, &|e| (e != 1).then_some(0.25));
        let gate_up_mixed = write("gate-up-mixed", &refs(&t));
        let ck = Checkpoint::open(&gate_up_mixed).unwrap();
        let e = ck.experts_input_scale(3, |e| p(e, "up_proj")).unwrap_err().to_string();
        assert!(e.starts_with("mlp.experts.1.up_proj: has no input scale, and mlp.experts.0.up_proj has one"), "{e}");
        // An expert's shards with different global scales: refused as fused shards are.
        let (_, mut t) = gate_up_experts(2, Convention::ModelOpt, &|_| None);
        let i = t.iter().position(|x| x.0 == "mlp.experts.1.up_proj.weight_scale_2").unwrap();
        t[i].3 = f32s(3.0);
        let gate_up_globals = write("gate-up-globals", &refs(&t));
        let ck = Checkpoint::open(&gate_up_globals).unwrap();
        let e = ck.experts(2, |e| [p(e, "gate_proj"), p(e, "up_proj")]).unwrap_err().to_string();
        assert!(e.starts_with("mlp.experts.1.up_proj.weight_scale_2: global scale 3.0") && e.contains("expert 1's fused shards") && e.contains("separate expert stacks"), "{e}");
        // ... and the separate stacks load.
        let (_, up_scales) = ck.experts(2, |e| p(e, "up_proj")).unwrap();
        assert_eq!(up_scales[1], 3.0);
    }

    #[test]
    fn mutated_files_give_errors_never_panics() {
        // A valid file with random bytes changed (in the length prefix, the JSON header and the
        // data) and truncations: every open and every reader either succeeds or returns an error.
        let p = "model.layers.0.mlp.experts.0.down_proj";
        let (_, t) = layer_tensors(p, Convention::ModelOpt, 32, 64, 4, Some(0.5));
        let good = write("mutate-src", &refs(&t));
        let bytes = std::fs::read(&good.path).unwrap();
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let dir = fresh_dir("mutate");
        let mut rng = crate::SplitMix64::new(0x5afe);
        let mut counts = [0usize; 3];
        for round in 0..600u32 {
            let mut b = bytes.clone();
            match round % 4 {
                // Digits, brackets and quotes of the header, where its numbers and structure live.
                0 | 1 => {
                    for _ in 0..=rng.below(3) {
                        let i = 8 + rng.below(header_len as u64) as usize;
                        const EDITS: &[u8] = b"0123456789[]{},:\"-9e";
                        b[i] = EDITS[rng.below(EDITS.len() as u64) as usize];
                    }
                }
                2 => {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] ^= 1 << rng.below(8);
                }
                _ => b.truncate(rng.below(b.len() as u64) as usize),
            }
            let path = dir.dir.join(format!("m{round}.safetensors"));
            std::fs::write(&path, &b).unwrap();
            let outcome = std::panic::catch_unwind(|| match Checkpoint::open(&path) {
                Ok(ck) => {
                    let read = ck.layer(p).is_ok();
                    let _ = ck.layer_dims(p);
                    let _ = ck.fused(&[p, p]);
                    let _ = ck.experts(1, |e| format!("model.layers.0.mlp.experts.{e}.down_proj"));
                    let _ = ck.layer_scales(p);
                    let _ = ck.experts_input_scale(1, |_| p);
                    let _ = ck.experts(1, |_| [p, p]);
                    let _ = ck.layer_shard(p, 3..20, 16..48);
                    let _ = ck.experts_shard(2, |_| [p, p], 0..32, 32..64);
                    if read { 2 } else { 1 }
                }
                Err(_) => 0,
            });
            let Ok(reached) = outcome else { panic!("round {round}: a mutated file made a reader panic") };
            counts[reached] += 1;
            std::fs::remove_file(&path).ok();
        }
        // The mutations reach every stage: files refused on open, opened but a layer refused,
        // and read (a changed data byte is a valid code or scale as often as not).
        assert!(counts.iter().all(|&c| c >= 20), "refused / layer refused / read: {counts:?}");
    }

    #[test]
    fn bad_files_name_the_tensor_and_the_rule() {
        let p = "l";
        let (_, good) = layer_tensors(p, Convention::ModelOpt, 32, 64, 3, None);
        let check = |tag: &str, edit: &dyn Fn(&mut Vec<Tensor>), want: &str| {
            let mut t = good.clone();
            edit(&mut t);
            let file = write(tag, &refs(&t));
            let e = Checkpoint::open(&file).and_then(|c| c.layer(p)).unwrap_err().to_string();
            assert!(e.contains(want), "{tag}: {e}");
        };
        check("missing", &|t| t.retain(|x| x.0 != "l.weight_scale"), "l.weight_scale: not in");
        check("noweight", &|t| t.retain(|x| x.0 != "l.weight"), "l.weight: not in");
        check("dtype", &|t| t[1].1 = Dtype::U8, "l.weight_scale: dtype U8: the block scales");
        check("wdtype", &|t| {
            t[0].1 = Dtype::BF16;
            t[0].2 = vec![32, 16];
        }, "l.weight: dtype BF16: the packed weight is U8");
        check("nan-ff", &|t| t[1].3[2] = 0xFF, "element 2 (row 0, block 2) is NaN");
        check("shape", &|t| {
            t[1].2 = vec![16, 8];
        }, "l.weight_scale: shape [16, 8]");
        check("k16", &|t| {
            t[0].2 = vec![32, 36];
            t[0].3 = vec![0; 32 * 36];
        }, "positive multiple of 16");
        check("nan", &|t| t[1].3[5] = 0x7F, "element 5 (row 1, block 1) is NaN");
        check("neg", &|t| t[1].3[0] = 0x81, "is negative");
        check("g0", &|t| t[2].3 = f32s(0.0), "l.weight_scale_2: 0: a per-tensor scale must be finite and positive");
        check("gnan", &|t| t[2].3 = f32s(f32::NAN), "must be finite and positive");
        check("gshape", &|t| {
            t[2].2 = vec![2];
            t[2].3 = [f32s(1.0), f32s(1.0)].concat();
        }, "a per-tensor scale is [1]");
        // Not a safetensors file at all.
        let dir = fresh_dir("junk");
        std::fs::write(dir.join("x"), b"\xff\xff\xff\xff\xff\xff\xff\x7fjunk").unwrap();
        assert!(Checkpoint::open(dir.join("x")).unwrap_err().to_string().contains("not a safetensors file?"));
        assert!(matches!(Checkpoint::open(dir.join("missing")).unwrap_err(), Error::Io { .. }));
    }

    /// A FIFO (or any file that is not regular) is refused before it is opened: opening one for
    /// reading would block until a writer came. The call runs on a thread so that a regression
    /// fails the test instead of hanging it. Where `mkfifo` is missing, a Unix socket file (not
    /// regular either) takes its place, so the refusal is still checked.
    #[cfg(unix)]
    #[test]
    fn files_that_are_not_regular_are_refused() {
        let dir = fresh_dir("fifo");
        let fifo = dir.join("model.safetensors");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("mkfifo is not available: a Unix socket file instead of a FIFO");
            std::os::unix::net::UnixListener::bind(&fifo).expect("a Unix socket file");
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || tx.send(Checkpoint::open(&path).map(|_| ()).map_err(|e| e.to_string())).unwrap());
        let e = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("Checkpoint::open on a FIFO returned").unwrap_err();
        assert!(e.contains("is not a regular file") && e.contains(&fifo.display().to_string()), "{e}");
    }

    /// The safetensors crate's rule, which `--input` files meet: the data offsets tile the data
    /// exactly. Overlapping ranges, a hole and trailing bytes are refused, naming the tensor (or
    /// the file) and the rule.
    #[test]
    fn data_offsets_must_tile_the_data() {
        let p = "l";
        let (_, good) = layer_tensors(p, Convention::ModelOpt, 32, 64, 3, None);
        let file = write("tile", &refs(&good));
        let bytes = std::fs::read(&*file).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let data = &bytes[8 + n..];
        // The file as written with its header edited by `edit`, and `extra` bytes after the data.
        // The error of opening the edited file and reading the layer, and the file's path.
        let run = |tag: &str, edit: &dyn Fn(&mut serde_json::Value), extra: &[u8]| -> (String, String) {
            let mut h = header.clone();
            edit(&mut h);
            let hj = serde_json::to_vec(&h).unwrap();
            let out = [&(hj.len() as u64).to_le_bytes()[..], &hj, data, extra].concat();
            let dir = fresh_dir(tag);
            let path = dir.join("model.safetensors");
            std::fs::write(&path, out).unwrap();
            // layer_dims makes the header's checks layer makes before reading.
            (Checkpoint::open(&path).and_then(|c| c.layer_dims(p).and_then(|_| c.layer(p))).unwrap_err().to_string(), path.display().to_string())
        };
        let check = |tag: &str, edit: &dyn Fn(&mut serde_json::Value), extra: &[u8], want: &[&str]| {
            let (e, path) = run(tag, edit, extra);
            for w in want {
                assert!(e.contains(w), "{tag}: {e}");
            }
            assert!(e.contains(&path), "{tag}: the file is named: {e}");
        };
        let offs = |h: &serde_json::Value, t: &str| -> (u64, u64) {
            let o = &h[t]["data_offsets"];
            (o[0].as_u64().unwrap(), o[1].as_u64().unwrap())
        };
        let (s0, s1) = offs(&header, "l.weight_scale");
        // The later of the weight and its scales moved onto the other's first bytes: in the data
        // alone, overlapping.
        let (first, later) = if offs(&header, "l.weight").0 < s0 { ("l.weight", "l.weight_scale") } else { ("l.weight_scale", "l.weight") };
        let ((f0, _), (l0, l1)) = (offs(&header, first), offs(&header, later));
        check("overlap", &|h| h[later]["data_offsets"] = serde_json::json!([f0, f0 + (l1 - l0)]), b"", &["overlap the tensor before", "data_offsets"]);
        // A one-byte-shorter scale range: a hole (and the scales' size no longer matches, but the
        // layout is checked first, when the file is opened).
        check("hole", &|h| h["l.weight_scale"]["data_offsets"] = serde_json::json!([s0 + 1, s1]), b"", &["l.weight_scale: data_offsets", "unused"]);
        check("trailing", &|_| {}, b"garbage!", &["8 bytes of data follow the tensors"]);
        check("reversed", &|h| h["l.weight_scale"]["data_offsets"] = serde_json::json!([s1, s0]), b"", &["l.weight_scale: data_offsets", "the begin is past the end"]);
        // Shapes that do not make the bytes the ranges hold: refused from the header alone.
        let (e, _) = run("wbytes", &|h| h["l.weight"]["shape"] = serde_json::json!([32, 64]), b"");
        assert!(e.starts_with("l.weight: holds 1024 bytes, its dtype and shape [32, 64] make Some(2048)"), "{e}");
        let (e, _) = run("sbytes", &|h| h["l.weight_scale"]["shape"] = serde_json::json!([32, 2]), b"");
        assert!(e.starts_with("l.weight_scale: shape [32, 2]: the block scales"), "{e}");
        // A tensor named twice (the second entry would have replaced the first).
        let dir = fresh_dir("twice");
        let twice = dir.join("model.safetensors");
        let h = br#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
        std::fs::write(&twice, [&(h.len() as u64).to_le_bytes()[..], h, &[7]].concat()).unwrap();
        let e = Checkpoint::open(&twice).unwrap_err().to_string();
        assert!(e.starts_with("t: named twice in the header of"), "{e}");
        // A file too short to hold the header's length.
        let dir = fresh_dir("short");
        let short = dir.join("model.safetensors");
        std::fs::write(&short, [1u8, 0, 0]).unwrap();
        let e = Checkpoint::open(&short).unwrap_err().to_string();
        assert!(e.contains("3 bytes: a safetensors file starts with an 8-byte header length"), "{e}");
        // The file unedited opens.
        Checkpoint::open(&*file).unwrap().layer(p).unwrap();
    }

    /// The checkpoint's layer `prefix`: codes, tiled scales, global and input scale, convention.
    fn layer_parts(ck: &Checkpoint, prefix: &str) -> (Vec<u8>, Vec<u8>, Option<f32>, Option<f32>, Convention) {
        let l = ck.layer(prefix).unwrap();
        (l.weight.data().to_vec(), l.weight.scales().to_vec(), l.weight.global_scale(), l.input_scale, l.convention)
    }

    #[test]
    fn a_layer_split_over_shards_loads_as_from_one_file() {
        for (conv, tag) in [(Convention::ModelOpt, "modelopt"), (Convention::CompressedTensors, "ct")] {
            let p = "model.layers.0.mlp.down_proj";
            let (m, t) = layer_tensors(p, conv, 96, 128, 31, Some(0.0217));
            let file = write(&format!("one-{tag}"), &refs(&t));
            let one = Checkpoint::open(&file).unwrap();
            let dir = fresh_dir(&format!("sharded-{tag}"));
            // The weight and its global scale in one shard, the block scales and input scale in the other.
            let index = write_sharded(&dir, &t, &|name: &str| -> &'static str {
                if name.ends_with(".weight_scale") || name.contains("input") { "model-00002-of-00002.safetensors" } else { "model-00001-of-00002.safetensors" }
            });
            let want = layer_parts(&one, p);
            assert_eq!(want.0.as_slice(), m.data());
            for ck in [Checkpoint::open(&index).unwrap(), Checkpoint::open(&dir).unwrap()] {
                assert_eq!(ck.files().len(), 2, "{tag}");
                assert_eq!(ck.names(), one.names(), "{tag}");
                assert_eq!(layer_parts(&ck, p), want, "{tag}");
            }
            // One shard under several spellings is one file, its header read once.
            let spelled = ["model-00001-of-00002.safetensors", "./model-00001-of-00002.safetensors", ".//./model-00001-of-00002.safetensors"];
            let map: Vec<(&str, &str)> = t.iter().enumerate().map(|(i, x)| (x.0.as_str(), if x.0.ends_with(".weight_scale") || x.0.contains("input") { "model-00002-of-00002.safetensors" } else { spelled[i % 3] })).collect();
            let alias = dir.join("alias.index.json");
            write_index(&alias, &map);
            let ck = Checkpoint::open(&alias).unwrap();
            assert_eq!(ck.files().len(), 2, "{tag}: {:?}", ck.files());
            assert_eq!(layer_parts(&ck, p), want, "{tag}");
        }
    }

    #[test]
    fn experts_span_shards() {
        let (mut all, mut want) = (Vec::new(), Vec::new());
        for e in 0..4 {
            let (m, t) = layer_tensors(&format!("mlp.experts.{e}.down_proj"), Convention::ModelOpt, 32, 64, 40 + e as u64, None);
            all.extend(t);
            want.push(m);
        }
        let dir = fresh_dir("experts-sharded");
        // Experts 0 and 1 in the first shard, 2 and 3 in the second, and expert 1's block scales
        // in the second as well.
        let shard = |name: &str| -> &'static str {
            if name.starts_with("mlp.experts.0.") || (name.starts_with("mlp.experts.1.") && !name.ends_with(".weight_scale")) {
                "model-00001-of-00002.safetensors"
            } else {
                "model-00002-of-00002.safetensors"
            }
        };
        write_sharded(&dir, &all, &shard);
        let ck = Checkpoint::open(&dir).unwrap();
        assert_eq!(ck.files().len(), 2);
        let (w, scales) = ck.experts(4, |e| format!("mlp.experts.{e}.down_proj")).unwrap();
        assert_eq!((w.batch(), w.rows(), w.k()), (4, 32, 64));
        for (e, m) in want.iter().enumerate() {
            assert_eq!(w.batch_slice(e).unwrap().data(), m.data());
            assert_eq!(w.batch_slice(e).unwrap().scales(), m.scales());
            assert_eq!(scales[e], m.global_scale().unwrap());
        }
        let file = write("experts-one", &refs(&all));
        let one = Checkpoint::open(&file).unwrap();
        let (w1, scales1) = one.experts(4, |e| format!("mlp.experts.{e}.down_proj")).unwrap();
        assert_eq!((w.data(), w.scales(), &scales), (w1.data(), w1.scales(), &scales1));
        assert!(matches!(ck.experts(5, |e| format!("mlp.experts.{e}.down_proj")).unwrap_err(), Error::Checkpoint { .. }));
    }

    #[test]
    fn bad_indexes_and_directories_are_typed_errors() {
        let (_, t) = layer_tensors("l", Convention::ModelOpt, 32, 64, 7, None);
        let dir = fresh_dir("bad-index");
        write_to(&dir.join("a.safetensors"), &refs(&t[..2]));
        write_to(&dir.join("b.safetensors"), &refs(&t[2..]));
        let names: Vec<&str> = t.iter().map(|x| x.0.as_str()).collect();
        let (w, s, g) = (names[0], names[1], names[2]);
        let index = dir.join("model.safetensors.index.json");
        // Good: it opens, and the layer loads.
        write_index(&index, &[(w, "a.safetensors"), (s, "a.safetensors"), (g, "b.safetensors")]);
        Checkpoint::open(&index).unwrap().layer("l").unwrap();
        // A shard file that is not there.
        write_index(&index, &[(w, "a.safetensors"), (s, "a.safetensors"), (g, "c.safetensors")]);
        assert!(matches!(Checkpoint::open(&index).unwrap_err(), Error::Io { .. }));
        // A tensor its shard does not hold.
        write_index(&index, &[(w, "a.safetensors"), (s, "b.safetensors"), (g, "b.safetensors")]);
        match Checkpoint::open(&index).unwrap_err() {
            Error::Checkpoint { tensor, .. } => assert_eq!(tensor, s),
            e => panic!("{e}"),
        }
        // Shard names outside the index's directory, though the file is there.
        let sub = dir.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        let sub_index = sub.join("model.safetensors.index.json");
        std::fs::copy(dir.join("a.safetensors"), sub.join("a.safetensors")).unwrap();
        let abs = dir.join("b.safetensors").display().to_string();
        for shard in ["../b.safetensors", abs.as_str(), "", "x/../../b.safetensors"] {
            // The other tensors' shard is good: the error is g's.
            write_index(&sub_index, &[(w, "a.safetensors"), (s, "a.safetensors"), (g, shard)]);
            match Checkpoint::open(&sub_index).unwrap_err() {
                Error::Checkpoint { tensor, .. } => assert_eq!(tensor, g, "{shard:?}"),
                e => panic!("{shard:?}: {e}"),
            }
            write_index(&sub_index, &[(g, shard)]);
            assert!(matches!(Checkpoint::open(&sub_index).unwrap_err(), Error::Checkpoint { .. }), "{shard:?}");
        }
        // Not an index: no weight_map, or not JSON.
        std::fs::write(&index, b"{\"metadata\": {}}").unwrap();
        assert!(matches!(Checkpoint::open(&index).unwrap_err(), Error::Checkpoint { .. }));
        std::fs::write(&index, b"junk").unwrap();
        assert!(matches!(Checkpoint::open(&index).unwrap_err(), Error::Checkpoint { .. }));
        // A directory of two files and no index, and one of none.
        std::fs::remove_file(&index).unwrap();
        match Checkpoint::open(&dir).unwrap_err() {
            Error::Checkpoint { tensor, .. } => assert_eq!(tensor, dir.display().to_string()),
            e => panic!("{e}"),
        }
        assert!(matches!(Checkpoint::open(fresh_dir("empty")).unwrap_err(), Error::Checkpoint { .. }));
        // A directory of one file opens it.
        let single = write("single", &refs(&t));
        let ck = Checkpoint::open(single.parent().unwrap()).unwrap();
        assert_eq!(ck.files(), vec![&*single]);
        ck.layer("l").unwrap();
    }

    #[test]
    fn hf_quant_config_must_name_nvfp4() {
        let (_, t) = layer_tensors("l", Convention::ModelOpt, 32, 64, 8, Some(0.01));
        let dir = fresh_dir("quant-config");
        let file = dir.join("model.safetensors");
        write_to(&file, &refs(&t));
        let config = dir.join("hf_quant_config.json");
        let nested = |algo: &str| format!(r#"{{"producer": {{"name": "modelopt", "version": "0.29.0"}}, "quantization": {{"quant_algo": "{algo}", "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": ["lm_head"]}}}}"#);
        for refused in [nested("NVFP4_AWQ"), nested("W4A8_NVFP4_FP8"), r#"{"quant_algo": "FP8"}"#.to_string()] {
            std::fs::write(&config, &refused).unwrap();
            for opened in [&*dir, file.as_path()] {
                match Checkpoint::open(opened).unwrap_err() {
                    Error::Checkpoint { tensor, rule } => {
                        assert_eq!(tensor, config.display().to_string());
                        assert!(rule.contains("only NVFP4"), "{rule}");
                    }
                    e => panic!("{e}"),
                }
            }
        }
        for accepted in [nested("NVFP4"), r#"{"quant_algo": "NVFP4"}"#.to_string(), r#"{"producer": {"name": "modelopt"}}"#.to_string()] {
            std::fs::write(&config, &accepted).unwrap();
            Checkpoint::open(&dir).unwrap().layer("l").unwrap();
            Checkpoint::open(&file).unwrap().layer("l").unwrap();
        }
        // Beside an index, too.
        std::fs::write(&config, nested("NVFP4_AWQ")).unwrap();
        let index = dir.join("model.safetensors.index.json");
        let map: Vec<(&str, &str)> = t.iter().map(|x| (x.0.as_str(), "model.safetensors")).collect();
        write_index(&index, &map);
        assert!(matches!(Checkpoint::open(&index).unwrap_err(), Error::Checkpoint { .. }));
        std::fs::write(&config, nested("NVFP4")).unwrap();
        Checkpoint::open(&index).unwrap().layer("l").unwrap();
        // Side files past the header limit are refused by their length, not read whole (a
        // probe's sparse 4 GiB one was read into memory first). Sparse: no disk is used.
        for big in [&config, &index] {
            let kept = std::fs::read(big).unwrap();
            std::fs::File::create(big).unwrap().set_len(MAX_HEADER + 1).unwrap();
            match Checkpoint::open(&index).unwrap_err() {
                Error::Checkpoint { tensor, rule } => {
                    assert_eq!(tensor, big.display().to_string());
                    assert!(rule.contains("at most 100000000"), "{rule}");
                }
                e => panic!("{e}"),
            }
            std::fs::write(big, kept).unwrap();
        }
        // The weight's shape from the header alone, after the same checks as `layer`.
        assert_eq!(Checkpoint::open(&index).unwrap().layer_dims("l").unwrap(), (32, 64));
        assert!(matches!(Checkpoint::open(&index).unwrap().layer_dims("other").unwrap_err(), Error::Checkpoint { .. }));
    }

    #[test]
    fn excluded_modules_are_named() {
        let (_, mut t) = layer_tensors("model.layers.0.mlp.down_proj", Convention::ModelOpt, 32, 64, 74, None);
        t.push(("lm_head.weight".into(), Dtype::BF16, vec![4, 64], vec![0x3f; 4 * 64 * 2]));
        t.push(("model.layers.0.mlp.gate.weight".into(), Dtype::BF16, vec![2, 64], vec![0x3f; 2 * 64 * 2]));
        let file = write("excluded", &refs(&t));
        let dir = file.parent().unwrap().to_path_buf();
        std::fs::write(dir.join("hf_quant_config.json"), br#"{"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head", "*.mlp.gate", "model.layers.0.mlp.down_pro?"]}}"#).unwrap();
        let ck = Checkpoint::open(&dir).unwrap();
        for (name, pattern) in [("lm_head", "lm_head"), ("model.layers.0.mlp.gate", "*.mlp.gate")] {
            let e = ck.layer(name).unwrap_err().to_string();
            assert!(e.contains(&format!("exclude_modules \"{pattern}\"")) && e.contains("BF16") && e.contains("tensor_bytes"), "{e}");
        }
        // A pattern that matches an NVFP4 layer: its tensors decide, and it loads.
        ck.layer("model.layers.0.mlp.down_proj").unwrap();
        for (p, n, want) in [("*", "", true), ("a*b", "ab", true), ("a*b", "axxb", true), ("a*b", "axxbc", false), ("?", "", false), ("a?c", "abc", true), ("*.x", "y.x", true), ("*.x", "y.xz", false), ("**a", "ba", true), ("*", "*x", true), ("a*", "a*", true), ("*b", "*", false)] {
            assert_eq!(glob_match(p, n), want, "{p} ~ {n}");
        }
    }

    #[test]
    fn mixed_precision_quant_config_is_checked_per_layer() {
        let (_, mut t) = layer_tensors("a", Convention::ModelOpt, 32, 64, 71, None);
        t.extend(layer_tensors("b", Convention::ModelOpt, 32, 64, 72, None).1);
        t.extend(layer_tensors("c", Convention::ModelOpt, 32, 64, 73, None).1);
        let file = write("mixed", &refs(&t));
        let dir = file.parent().unwrap().to_path_buf();
        let cfg = dir.join("hf_quant_config.json");
        std::fs::write(
            &cfg,
            br#"{"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {"a": {"quant_algo": "NVFP4", "group_size": 16}, "b": {"quant_algo": "W4A8_AWQ"}}}}"#,
        )
        .unwrap();
        for ck in [Checkpoint::open(&dir).unwrap(), Checkpoint::open(&file).unwrap()] {
            ck.layer("a").unwrap();
            ck.layer("c").unwrap(); // not in quantized_layers: its tensors decide
            match ck.layer("b").unwrap_err() {
                Error::Checkpoint { tensor, rule } => assert!(tensor == "b" && rule.contains("W4A8_AWQ"), "{tensor}: {rule}"),
                e => panic!("{e}"),
            }
        }
        std::fs::write(&cfg, br#"{"quantization": {"quant_algo": "MIXED_PRECISION"}}"#).unwrap();
        assert!(matches!(Checkpoint::open(&dir).unwrap_err(), Error::Checkpoint { .. }));
        std::fs::write(&cfg, br#"{"quantization": {"quant_algo": "W4A16_NVFP4"}}"#).unwrap();
        Checkpoint::open(&dir).unwrap().layer("b").unwrap();
        std::fs::remove_file(&cfg).unwrap();
    }

    #[test]
    fn awq_pre_quant_scales_are_refused() {
        let (_, mut t) = layer_tensors("l", Convention::ModelOpt, 32, 64, 9, Some(0.01));
        t.push(("l.pre_quant_scale".to_string(), Dtype::BF16, vec![64], [0x80u8, 0x3f].repeat(64)));
        let (_, other) = layer_tensors("o", Convention::ModelOpt, 32, 64, 10, None);
        t.extend(other);
        let file = write("awq", &refs(&t));
        let ck = Checkpoint::open(&file).unwrap();
        let named = |r: Result<()>| match r.unwrap_err() {
            Error::Checkpoint { tensor, rule } => {
                assert_eq!(tensor, "l.pre_quant_scale");
                assert!(rule.contains("AWQ"), "{rule}");
            }
            e => panic!("{e}"),
        };
        named(ck.layer("l").map(|_| ()));
        named(ck.fused(&["o", "l"]).map(|_| ()));
        named(ck.experts(1, |_| "l".to_string()).map(|_| ()));
        ck.layer("o").unwrap();
    }
}
