//! `Nvfp4Matrix`: an NVFP4 tensor on the host, its generators, the quantizer and dequantization.

use crate::error::{try_collect, try_vec, try_zeros, Error, Result};
use crate::formats::{e2m1_from_f32, e2m1_to_f32, e4m3_from_f32, ue4m3_to_f32, E2M1_MAX, E4M3_MAX, E4M3_NAN};
use crate::layout::{padded_rows, padded_sf_cols, sf_batch_bytes, sf_cols, sf_offset, SF_VEC};

/// A (batch, rows, K) NVFP4 tensor: packed e2m1 values, row-major with K contiguous (element 2i
/// in the low nibble), and ue4m3 scales in the tiled layout of [`crate::layout`] with zero padding,
/// plus an optional per-tensor (global) dequantization scale as NVIDIA ModelOpt checkpoints
/// carry it. The value of element (l, r, k) is `e2m1 * scale * global_scale`.
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4Matrix {
    rows: usize,
    k: usize,
    batch: usize,
    data: Vec<u8>,
    scales: Vec<u8>,
    global_scale: Option<f32>,
}

/// A small, fast, seeded generator (SplitMix64): reproducible test data without a dependency.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A uniform integer in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// A uniform f64 in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// A standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit();
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// `n` random bytes, or [`Error::HostMemory`] where the host cannot hold them.
    pub fn bytes(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut v = try_zeros::<u8>("random bytes", n)?;
        for chunk in v.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
        Ok(v)
    }
}

impl Nvfp4Matrix {
    /// Builds a matrix from its parts, checking every length and every scale byte.
    ///
    /// `shape` is `(batch, rows, k)`, as everywhere in this crate. `data` holds
    /// `batch * rows * k / 2` bytes, `scales` `batch * sf_batch_bytes(rows, k)` bytes in the tiled
    /// layout. Scale bytes must be ue4m3 (sign bit clear); 0x7F (NaN) is
    /// allowed for real scales but not in the padding, where it would poison valid outputs.
    pub fn from_parts((batch, rows, k): (usize, usize, usize), data: Vec<u8>, scales: Vec<u8>, global_scale: Option<f32>) -> Result<Self> {
        check_shape(rows, k, batch)?;
        check_lens(("data", data.len()), scales.len(), (batch, rows, k))?;
        let m = Nvfp4Matrix { rows, k, batch, data, scales, global_scale };
        m.check_scales()?;
        if let Some(g) = global_scale {
            check_global_scale(g)?;
        }
        Ok(m)
    }

    fn check_scales(&self) -> Result<()> {
        let per = sf_batch_bytes(self.rows, self.k);
        let sp = padded_sf_cols(sf_cols(self.k));
        let mut valid = vec![false; per];
        for r in 0..self.rows {
            for s in 0..sf_cols(self.k) {
                valid[sf_offset(r, s, sp)] = true;
            }
        }
        for (i, &b) in self.scales.iter().enumerate() {
            if b & 0x80 != 0 {
                return Err(Error::InvalidData { what: "scales", detail: format!("byte 0x{b:02x} at offset {i} has the sign bit set (ue4m3 has no sign)") });
            }
            if b == E4M3_NAN && !valid[i % per] {
                return Err(Error::InvalidData { what: "scales", detail: format!("padding byte at offset {i} is NaN (0x7f); padding must be finite, zero by convention") });
            }
        }
        Ok(())
    }

    /// Contest-style random data: random bytes for the values, scales the integers 0..=3 as
    /// e4m3 (zeros included), zero padding. Deterministic in `seed`.
    pub fn random_contest((batch, rows, k): (usize, usize, usize), seed: u64) -> Result<Self> {
        const SCALES: [u8; 4] = [0x00, 0x38, 0x40, 0x44]; // 0, 1, 2, 3
        Self::random_with(rows, k, batch, seed, |rng| SCALES[rng.below(4) as usize])
    }

    /// Realistic random data: random bytes for the values, scales spread log-uniformly over
    /// the e4m3 values in 2^-4 ..= 2^4. Deterministic in `seed`.
    pub fn random_realistic((batch, rows, k): (usize, usize, usize), seed: u64) -> Result<Self> {
        let (lo, hi) = (e4m3_from_f32(0.0625), e4m3_from_f32(16.0)); // 0x18 ..= 0x58
        Self::random_with(rows, k, batch, seed, |rng| lo + rng.below((hi - lo + 1) as u64) as u8)
    }

    /// N(0, 1) samples quantized with [`Self::quantize`] at global scale 1, as a tensor of real
    /// weights or activations arrives: no block is all zeros, the block scales sit near
    /// max|x| / 6. The benchmarks run on this data: the GPU's clock under load depends on the
    /// operands' bits (bench/DESIGN.md, "Data and power"). Deterministic in `seed`.
    pub fn random_gaussian((batch, rows, k): (usize, usize, usize), seed: u64) -> Result<Self> {
        check_shape(rows, k, batch)?;
        let mut rng = SplitMix64::new(seed);
        let mut x = try_vec::<f32>("generated values", batch * rows * k)?;
        x.extend((0..batch * rows * k).map(|_| rng.normal() as f32));
        Self::quantize(&x, (batch, rows, k), Some(1.0))
    }

    fn random_with(rows: usize, k: usize, batch: usize, seed: u64, mut scale: impl FnMut(&mut SplitMix64) -> u8) -> Result<Self> {
        check_shape(rows, k, batch)?;
        let mut rng = SplitMix64::new(seed);
        let n = batch * rows * k / 2;
        let mut data = try_vec::<u8>("generated values", n)?;
        while data.len() < n {
            let take = (n - data.len()).min(8);
            data.extend_from_slice(&rng.next_u64().to_le_bytes()[..take]);
        }
        let mut row_major = try_vec::<u8>("generated scales", batch * rows * sf_cols(k))?;
        row_major.extend((0..batch * rows * sf_cols(k)).map(|_| scale(&mut rng)));
        let scales = crate::layout::to_tiled(&row_major, (batch, rows, sf_cols(k)))?;
        Ok(Nvfp4Matrix { rows, k, batch, data, scales, global_scale: None })
    }

    /// Quantizes `values` of shape (batch, rows, K), row-major, with NVIDIA ModelOpt's scales
    /// (the global scale and the per-block scale relative to it), in this crate's fixed order of
    /// operations. `T` is f32, `half::f16` or `half::bf16` (widened exactly). Every step is one
    /// f32 operation rounded to nearest even, in this order:
    ///
    /// - the global scale `g`: `global_scale` where given (ModelOpt's `input_scale` for
    ///   activations, or a weight's `weight_scale_2`; finite and positive), else computed as
    ///   `amax / (6 * 448)` over the whole tensor, raised to `2^-126` (the smallest normal f32)
    ///   where it is smaller, and `g = 1` if every value is 0: `g` is then always finite, normal
    ///   and positive, so no block scale below divides by 0;
    /// - per 16-element block, `scale = ue4m3(block_amax / 6 / g)` (divisions left to right,
    ///   ue4m3 rounding to nearest even and saturating at 448, which a given `g` smaller than the
    ///   computed one can reach): never NaN, since `g > 0`. ModelOpt divides once by `6 * g`,
    ///   which rounds differently: about one block scale in millions lands on the other side of
    ///   a ue4m3 tie, so a checkpoint quantized by ModelOpt is not always reproduced byte for
    ///   byte (its bytes load as they are);
    /// - `s = ue4m3_to_f32(scale) * g`, then per value `code = e2m1(x / s)` (nearest even,
    ///   saturating at ±6).
    ///
    /// The matrix keeps `g` ([`Self::global_scale`]); [`crate::Nvfp4Tensor::upload`] carries it to
    /// the device and the GEMM folds it into alpha. A block whose scale is 0 (all zeros, or tiny
    /// next to the tensor's amax) stores scale byte 0 and codes 0 (+0), as vLLM's
    /// `scaled_fp4_quant` and FlashInfer do for zero blocks. NaN or infinite inputs are an error.
    ///
    /// ```
    /// use blockscaled_gemm::Nvfp4Matrix;
    /// let x: Vec<half::bf16> = (0..2 * 3 * 32).map(|i| half::bf16::from_f32(i as f32 - 90.0)).collect();
    /// let q = Nvfp4Matrix::quantize(&x, (2, 3, 32), None)?; // (batch, rows, K)
    /// assert_eq!((q.batch(), q.rows(), q.k()), (2, 3, 32));
    /// assert_eq!(q.global_scale(), Some(101.0 / 2688.0)); // amax / (6 * 448)
    /// let given = Nvfp4Matrix::quantize(&x, (2, 3, 32), Some(0.5))?;
    /// assert_eq!(given.global_scale(), Some(0.5));
    /// # Ok::<(), blockscaled_gemm::Error>(())
    /// ```
    pub fn quantize<T: HostFloat>(values: &[T], shape: (usize, usize, usize), global_scale: Option<f32>) -> Result<Self> {
        if let Some((index, value)) = values.iter().map(|v| v.widen_one()).enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::NonFiniteInput { index, value });
        }
        Self::quantize_unchecked(values, shape, global_scale)
    }

    /// [`Self::quantize`] without the check for NaN and infinities, which then follow the GPU
    /// quantizer's rules ([`crate::Quantizer`]): NaN does not raise its block's amax and encodes as
    /// +6 (0x7), or 0 in a block whose scale is 0; with a given global scale ±Inf makes its block's
    /// scale 448 (0x7E) and encodes as ±6. A computed global scale comes from the largest non-NaN
    /// magnitude; an infinity leaves none to compute, which is an error.
    pub fn quantize_unchecked<T: HostFloat>(values: &[T], shape: (usize, usize, usize), global_scale: Option<f32>) -> Result<Self> {
        let (batch, rows, k) = shape;
        check_shape(rows, k, batch)?;
        crate::error::check_len("values", values.len(), batch * rows * k, "batch * rows * K")?;
        if let Some(g) = global_scale {
            check_global_scale(g)?;
        }
        let values: std::borrow::Cow<'_, [f32]> = T::widen(values)?;
        let g = match global_scale {
            Some(g) => g,
            None => {
                let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
                if let Some(i) = values.iter().position(|v| v.is_infinite()).filter(|_| amax.is_infinite()) {
                    return Err(Error::InvalidData { what: "values", detail: format!("element {i} is an infinity ({}), which leaves no finite global scale to compute; pass one", values[i]) });
                }
                computed_global_scale(amax)
            }
        };
        let kb = sf_cols(k);
        let mut codes = try_zeros::<u8>("quantized codes", values.len())?;
        let mut sf_row_major = try_zeros::<u8>("block scales", batch * rows * kb)?;
        for (blk, (src, dst)) in values.chunks_exact(SF_VEC).zip(codes.chunks_exact_mut(SF_VEC)).enumerate() {
            let bamax = src.iter().fold(0f32, |m, v| m.max(v.abs()));
            let sf = e4m3_from_f32(bamax / E2M1_MAX / g);
            sf_row_major[blk] = sf;
            let s = ue4m3_to_f32(sf) * g;
            for (x, c) in src.iter().zip(dst.iter_mut()) {
                *c = if s > 0.0 { e2m1_from_f32(x / s) } else { 0 };
            }
        }
        let scales = crate::layout::to_tiled(&sf_row_major, (batch, rows, kb))?;
        Ok(Nvfp4Matrix { rows, k, batch, data: crate::formats::pack_e2m1_slice(&codes)?, scales, global_scale: Some(g) })
    }

    /// A matrix of the given rows (in that order) of every batch, with their scales; for
    /// checking a sample of a large result against the reference. Fails where `rows` is empty
    /// or names a row past the last.
    pub fn select_rows(&self, rows: &[usize]) -> Result<Nvfp4Matrix> {
        if rows.is_empty() {
            return Err(Error::InvalidData { what: "rows", detail: "none given: select at least one".into() });
        }
        if let Some(&r) = rows.iter().find(|&&r| r >= self.rows) {
            return Err(Error::Index { what: "row", index: r, len: self.rows });
        }
        let kb = sf_cols(self.k);
        let mut data = try_vec("selected rows", self.batch.saturating_mul(rows.len()).saturating_mul(self.k / 2))?;
        let mut sf = try_vec("selected rows' scales", self.batch.saturating_mul(rows.len()).saturating_mul(kb))?;
        for l in 0..self.batch {
            for &r in rows {
                data.extend_from_slice(&self.data[(l * self.rows + r) * self.k / 2..][..self.k / 2]);
                sf.extend((0..kb).map(|s| self.scale(l, r, s)));
            }
        }
        let scales = crate::layout::to_tiled(&sf, (self.batch, rows.len(), kb))?;
        Ok(Nvfp4Matrix { rows: rows.len(), k: self.k, batch: self.batch, data, scales, global_scale: self.global_scale })
    }

    /// Batch `l` alone, as a matrix of one batch (its global scale kept). Fails where `l` is not
    /// below the batch count.
    pub fn batch_slice(&self, l: usize) -> Result<Nvfp4Matrix> {
        if l >= self.batch {
            return Err(Error::Index { what: "batch", index: l, len: self.batch });
        }
        let (data_len, sf_len) = (self.rows * self.k / 2, sf_batch_bytes(self.rows, self.k));
        let data = self.data[l * data_len..][..data_len].to_vec();
        let scales = self.scales[l * sf_len..][..sf_len].to_vec();
        Ok(Nvfp4Matrix { rows: self.rows, k: self.k, batch: 1, data, scales, global_scale: self.global_scale })
    }

    /// The same codes and scales without a global scale (read as 1).
    pub fn without_global_scale(mut self) -> Nvfp4Matrix {
        self.global_scale = None;
        self
    }

    /// All values as f32, (batch, rows, k) row-major: `e2m1 * scale * global_scale`;
    /// [`Error::HostMemory`] where the host cannot hold them (8 times the packed values).
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        let g = self.global_scale.unwrap_or(1.0);
        let mut out = try_vec("dequantized values", self.batch * self.rows * self.k)?;
        for l in 0..self.batch {
            for r in 0..self.rows {
                for kk in 0..self.k {
                    out.push(self.value(l, r, kk) * g);
                }
            }
        }
        Ok(out)
    }

    /// Value of element (l, r, k) without the global scale: `e2m1 * scale`.
    ///
    /// # Panics
    /// Where an index is out of range (`l < batch`, `r < rows`, `kk < K`), as slice indexing does;
    /// [`Self::get_value`] answers `None` instead.
    pub fn value(&self, l: usize, r: usize, kk: usize) -> f32 {
        e2m1_to_f32(self.code(l, r, kk)) * ue4m3_to_f32(self.scale(l, r, kk / SF_VEC))
    }

    /// The e2m1 code of element (l, r, k).
    ///
    /// # Panics
    /// Where an index is out of range (`l < batch`, `r < rows`, `kk < K`), as slice indexing does;
    /// [`Self::get_code`] answers `None` instead.
    pub fn code(&self, l: usize, r: usize, kk: usize) -> u8 {
        self.check_index(l, r, kk, self.k);
        let byte = self.data[((l * self.rows + r) * self.k + kk) / 2];
        if kk.is_multiple_of(2) { byte & 0xF } else { byte >> 4 }
    }

    /// The scale byte of (l, r, scale column s).
    ///
    /// # Panics
    /// Where an index is out of range (`l < batch`, `r < rows`, `s < K / 16`), as slice indexing
    /// does; [`Self::get_scale`] answers `None` instead.
    pub fn scale(&self, l: usize, r: usize, s: usize) -> u8 {
        self.check_index(l, r, s, sf_cols(self.k));
        self.scales[l * sf_batch_bytes(self.rows, self.k) + sf_offset(r, s, padded_sf_cols(sf_cols(self.k)))]
    }

    /// An index past its extent would otherwise read another row's or batch's bytes silently.
    fn check_index(&self, l: usize, r: usize, col: usize, cols: usize) {
        assert!(self.in_range(l, r, col, cols), "index (batch {l}, row {r}, column {col}) of ({}, {}, {cols})", self.batch, self.rows);
    }

    fn in_range(&self, l: usize, r: usize, col: usize, cols: usize) -> bool {
        l < self.batch && r < self.rows && col < cols
    }

    /// [`Self::value`], or `None` where an index is out of range (as `slice::get`).
    pub fn get_value(&self, l: usize, r: usize, kk: usize) -> Option<f32> {
        self.in_range(l, r, kk, self.k).then(|| self.value(l, r, kk))
    }

    /// [`Self::code`], or `None` where an index is out of range.
    pub fn get_code(&self, l: usize, r: usize, kk: usize) -> Option<u8> {
        self.in_range(l, r, kk, self.k).then(|| self.code(l, r, kk))
    }

    /// [`Self::scale`], or `None` where an index is out of range.
    pub fn get_scale(&self, l: usize, r: usize, s: usize) -> Option<u8> {
        self.in_range(l, r, s, sf_cols(self.k)).then(|| self.scale(l, r, s))
    }

    /// Rows (M for A, N for B).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// K, in elements.
    pub fn k(&self) -> usize {
        self.k
    }
    /// Batch count L.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Packed values, (batch, rows, k/2) bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }
    /// Tiled scale bytes.
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }
    /// The per-tensor scale, if any.
    pub fn global_scale(&self) -> Option<f32> {
        self.global_scale
    }
    /// Scales as a row-major (batch, rows, k/16) matrix; fails only where the host cannot
    /// allocate it.
    pub fn scales_row_major(&self) -> Result<Vec<u8>> {
        crate::layout::from_tiled(&self.scales, (self.batch, self.rows, sf_cols(self.k)))
    }
    /// Padded rows of the scale layout.
    pub fn padded_rows(&self) -> usize {
        padded_rows(self.rows)
    }
}

/// The quantizer's global scale for a tensor of finite values with largest magnitude `amax`
/// (see [`Nvfp4Matrix::quantize`]): finite, normal and positive.
pub(crate) fn computed_global_scale(amax: f32) -> f32 {
    if amax > 0.0 {
        (amax / (E2M1_MAX * E4M3_MAX)).max(f32::MIN_POSITIVE)
    } else {
        1.0
    }
}

/// The lengths of an NVFP4 tensor's two buffers, (batch, rows, K): `values` = (its name, its
/// length) of the packed codes, and the tiled scales. The shape has passed [`check_shape`].
pub(crate) fn check_lens(values: (&'static str, usize), scales: usize, (batch, rows, k): (usize, usize, usize)) -> Result<()> {
    crate::error::check_len(values.0, values.1, batch * rows * k / 2, "batch * rows * K / 2 packed bytes")?;
    crate::error::check_len("scales", scales, batch * sf_batch_bytes(rows, k), "batch * ceil(rows/128)*128 * ceil(K/64)*4 tiled bytes")
}

/// A global scale multiplies every value: it must be finite and positive.
pub(crate) fn check_global_scale(g: f32) -> Result<()> {
    if !(g.is_finite() && g > 0.0) {
        return Err(Error::InvalidData { what: "global scale", detail: format!("{g}: must be finite and positive") });
    }
    Ok(())
}

/// Host element types the quantizer reads, widened exactly to f32.
pub trait HostFloat: Copy + sealed::Sealed {
    /// The values as f32 (borrowed where they already are; [`Error::HostMemory`] where the host
    /// cannot hold the copy).
    fn widen(values: &[Self]) -> Result<std::borrow::Cow<'_, [f32]>>;
    /// One value as f32 (exact).
    fn widen_one(self) -> f32;
    /// The nearest value of this type to x (ties to even; f32: x itself).
    fn narrow(x: f32) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

impl HostFloat for f32 {
    fn widen(values: &[f32]) -> Result<std::borrow::Cow<'_, [f32]>> {
        Ok(std::borrow::Cow::Borrowed(values))
    }
    fn widen_one(self) -> f32 {
        self
    }
    fn narrow(x: f32) -> Self {
        x
    }
}

// The 16-bit types widen exactly and narrow by round-to-nearest-even (`half`'s conversions).
macro_rules! half_host_float {
    ($($t:ty),*) => {$(
        impl HostFloat for $t {
            fn widen(values: &[Self]) -> Result<std::borrow::Cow<'_, [f32]>> {
                Ok(std::borrow::Cow::Owned(try_collect("the values widened to f32", values.len(), values.iter().map(|v| v.to_f32()))?))
            }
            fn widen_one(self) -> f32 {
                self.to_f32()
            }
            fn narrow(x: f32) -> Self {
                <$t>::from_f32(x)
            }
        }
    )*};
}
half_host_float!(half::f16, half::bf16);

/// Checks a matrix shape: no zero extent, K a multiple of 16, and element and scale counts that
/// fit in memory, so the products computed from the shape afterwards cannot overflow.
pub(crate) fn check_shape(rows: usize, k: usize, batch: usize) -> Result<()> {
    for (dim, value) in [("rows", rows), ("K", k), ("batch", batch)] {
        if value == 0 {
            return Err(Error::Dimension { dim, value, max: usize::MAX });
        }
    }
    if !k.is_multiple_of(SF_VEC) {
        return Err(Error::KMultiple { k, multiple: SF_VEC, why: "one scale per 16 elements of K" });
    }
    // Elements, not bytes: the quantizer's input holds 4 bytes per element, the matrix half a byte.
    let elems = crate::error::product(&[batch, rows, k]);
    let scales = crate::error::product(&[batch, padded_rows(rows), padded_sf_cols(sf_cols(k))]);
    crate::error::within(isize::MAX as u128, "the largest host allocation is isize::MAX bytes", || format!("rows = {rows}, K = {k}, batch = {batch}"),
        [("elements", "batch * rows * K", elems), ("tiled scale bytes", "batch * ceil(rows/128)*128 * ceil(K/64)*4", scales)])
}

/// The GPU quantizer's largest row count (a multiple of 128): its row loop counts in int32,
/// striding by the grid. The kernel's entry point checks it too (`BSG_QUANT_MAX_ROWS`).
pub(crate) const QUANTIZER_MAX_ROWS: usize = crate::sys::QUANT_MAX_ROWS;

/// [`check_shape`] and the GPU quantizer's limits (rows: [`QUANTIZER_MAX_ROWS`]; L in grid.z),
/// before any size is computed from the shape.
pub(crate) fn check_quantizer_dims((batch, rows, k): (usize, usize, usize)) -> Result<()> {
    check_shape(rows, k, batch)?;
    for (dim, value, max) in [("rows", rows, QUANTIZER_MAX_ROWS), ("K", k, i32::MAX as usize), ("batch", batch, crate::sys::QUANT_MAX_BATCH)] {
        if value > max {
            return Err(Error::Dimension { dim, value, max });
        }
    }
    Ok(())
}

/// Reference GEMM of two host matrices, D = alpha * ga * gb * A Bᵀ + beta * C, with A (L, M, K)
/// and B (L, N, K) and ga, gb their global scales (1 where a matrix has none), folded into alpha
/// left to right in f32 as the GEMM entry points fold them.
pub fn reference_gemm<T: crate::OutputElement>(a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, c: Option<&[T]>) -> Result<Vec<T>> {
    let p = pair_problem(a, b, alpha, beta)?;
    crate::reference::gemm(&p, &a.data, &a.scales, &b.data, &b.scales, c)
}

/// The problem of `A Bᵀ` for host matrices A (L, M, K) and B (L, N, K) (K and L must agree), with
/// both global scales folded into alpha as the GEMM entry points fold them.
pub(crate) fn pair_problem(a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32) -> Result<crate::Problem> {
    if a.k != b.k || a.batch != b.batch {
        return Err(Error::InvalidData { what: "operands", detail: format!("A is (L={}, K={}), B is (L={}, K={}): K and L must agree", a.batch, a.k, b.batch, b.k) });
    }
    let alpha = crate::problem::folded_alpha(alpha, a.global_scale.unwrap_or(1.0), b.global_scale.unwrap_or(1.0))?;
    Ok(crate::Problem::new(a.rows, b.rows, a.k).batch(a.batch).scalars(alpha, beta))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A review probe: `bytes(usize::MAX)` wrapped its capacity and grew until memory ran out.
    #[test]
    fn random_bytes_are_fallible_and_unchanged() {
        assert!(matches!(SplitMix64::new(1).bytes(usize::MAX), Err(Error::HostMemory { .. })));
        let mut r = SplitMix64::new(7);
        let want: Vec<u8> = (0..2).flat_map(|_| r.next_u64().to_le_bytes()).take(13).collect();
        assert_eq!(SplitMix64::new(7).bytes(13).unwrap(), want);
    }

    #[test]
    fn from_parts_checks_everything() {
        let ok = Nvfp4Matrix::from_parts((1, 3, 32), vec![0; 48], vec![0; 512], None);
        assert!(ok.is_ok());
        let e = Nvfp4Matrix::from_parts((1, 3, 32), vec![0; 47], vec![0; 512], None).unwrap_err();
        assert!(e.to_string().contains("data: holds 47"), "{e}");
        let e = Nvfp4Matrix::from_parts((1, 3, 32), vec![0; 48], vec![0; 500], None).unwrap_err();
        assert!(e.to_string().contains("scales: holds 500"), "{e}");
        let e = Nvfp4Matrix::from_parts((1, 3, 24), vec![0; 36], vec![0; 512], None).unwrap_err();
        assert!(e.to_string().contains("multiple of 16"), "{e}");
        let mut s = vec![0u8; 512];
        s[0] = 0x80;
        let e = Nvfp4Matrix::from_parts((1, 3, 32), vec![0; 48], s, None).unwrap_err();
        assert!(e.to_string().contains("sign bit"), "{e}");
        let mut s = vec![0u8; 512];
        s[0] = 0x7F; // row 0, column 0: a real scale, NaN allowed
        assert!(Nvfp4Matrix::from_parts((1, 3, 32), vec![0; 48], s.clone(), None).is_ok());
        s[3] = 0x7F; // column 3 is padding (K/16 = 2)
        let e = Nvfp4Matrix::from_parts((1, 3, 32), vec![0; 48], s, None).unwrap_err();
        assert!(e.to_string().contains("padding"), "{e}");
        let e = Nvfp4Matrix::from_parts((1, 3, 32), vec![0; 48], vec![0; 512], Some(f32::INFINITY)).unwrap_err();
        assert!(e.to_string().contains("global scale"), "{e}");
    }

    #[test]
    fn select_rows_keeps_values_and_scales() {
        let m = Nvfp4Matrix::random_realistic((2, 300, 64), 4).unwrap();
        let s = m.select_rows(&[299, 0, 130]).unwrap();
        for l in 0..2 {
            for (i, &r) in [299, 0, 130].iter().enumerate() {
                for kk in 0..64 {
                    assert_eq!(s.value(l, i, kk).to_bits(), m.value(l, r, kk).to_bits());
                }
            }
        }
    }

    #[test]
    fn contest_generator_style() {
        let m = Nvfp4Matrix::random_contest((2, 130, 64), 7).unwrap();
        let sf = m.scales_row_major().unwrap();
        assert!(sf.iter().all(|b| [0x00, 0x38, 0x40, 0x44].contains(b)));
        for want in [0x00, 0x38, 0x40, 0x44] {
            assert!(sf.contains(&want), "scale 0x{want:02x} never drawn");
        }
        // Padding is zero: rows 130..256 and nothing else.
        let nonzero_pad = (0..2).any(|l| (130..256).any(|r| (0..4).any(|s| m.scales[l * 256 * 4 + sf_offset(r, s, 4)] != 0)));
        assert!(!nonzero_pad);
        assert_eq!(m, Nvfp4Matrix::random_contest((2, 130, 64), 7).unwrap(), "deterministic in the seed");
        assert_ne!(m, Nvfp4Matrix::random_contest((2, 130, 64), 8).unwrap());
        let r = Nvfp4Matrix::random_realistic((1, 64, 64), 1).unwrap();
        assert!(r.scales_row_major().unwrap().iter().all(|&b| (0.0625..=16.0).contains(&ue4m3_to_f32(b))));
    }

    #[test]
    fn gaussian_generator_style() {
        let m = Nvfp4Matrix::random_gaussian((2, 130, 64), 7).unwrap();
        let mut rng = SplitMix64::new(7);
        let x: Vec<f32> = (0..2 * 130 * 64).map(|_| rng.normal() as f32).collect();
        assert_eq!(m, Nvfp4Matrix::quantize(&x, (2, 130, 64), Some(1.0)).unwrap(), "N(0, 1) of the seed, quantized at g = 1");
        // No block is all zeros (contest data has a quarter of them); the scales sit near max|x| / 6.
        let sf = m.scales_row_major().unwrap();
        assert!(sf.iter().all(|&b| (0.05..=1.0).contains(&ue4m3_to_f32(b))), "{sf:?}");
        let d = m.dequantize().unwrap();
        let mean_sq = d.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / d.len() as f64;
        assert!((0.8..1.2).contains(&mean_sq), "{mean_sq}");
        assert_ne!(m, Nvfp4Matrix::random_gaussian((2, 130, 64), 8).unwrap());
    }

    #[test]
    fn quantizer_boundaries() {
        // One block with amax 6 * 448 * g: the block scale is exactly 448 and g = 1.
        let mut v = vec![0f32; 16];
        v[0] = 2688.0; // 6 * 448
        v[1] = -448.0 * 2.5; // x / 448 = -2.5: tie between 2 and 3 -> even (2)
        v[2] = 448.0 * 0.75; // tie between 0.5 and 1 -> 1
        v[3] = 448.0 * 5.0; // tie between 4 and 6 -> 4
        v[4] = 448.0 * 0.25; // tie between 0 and 0.5 -> 0
        v[5] = 448.0 * 0.26;
        let q = Nvfp4Matrix::quantize(&v, (1, 1, 16), None).unwrap();
        assert_eq!(q.global_scale(), Some(1.0));
        assert_eq!(q.scale(0, 0, 0), 0x7E);
        let d = q.dequantize().unwrap();
        assert_eq!(&d[..6], &[2688.0, -896.0, 448.0, 1792.0, 0.0, 224.0]);
    }

    #[test]
    fn quantizer_zero_and_non_finite() {
        let z = Nvfp4Matrix::quantize(&[0.0; 64], (1, 2, 32), None).unwrap();
        assert_eq!(z.global_scale(), Some(1.0));
        assert!(z.dequantize().unwrap().iter().all(|&x| x == 0.0));
        // A block tiny next to the tensor's amax gets scale 0 and stores zeros.
        let mut v = vec![1e-12f32; 32];
        v[16] = 1e6;
        let q = Nvfp4Matrix::quantize(&v, (1, 1, 32), None).unwrap();
        assert_eq!(q.scale(0, 0, 0), 0);
        assert!(q.dequantize().unwrap()[..16].iter().all(|&x| x == 0.0));
        let mut bad = vec![1f32; 32];
        bad[17] = f32::NAN;
        let e = Nvfp4Matrix::quantize(&bad, (1, 1, 32), None).unwrap_err();
        assert!(e.to_string().contains("element 17 is NaN"), "{e}");
        bad[17] = f32::NEG_INFINITY;
        assert!(Nvfp4Matrix::quantize(&bad, (1, 1, 32), None).is_err());
    }

    /// Issue 25, finding 4: a tiny amax made `g = amax / 2688` zero and zero blocks' scales
    /// 0 / 0 = NaN (0x7F). Now g stays normal and positive, zero blocks get scale 0.
    #[test]
    fn quantizer_tiny_amax_gives_no_nan() {
        let mut v = vec![0f32; 32];
        v[20] = 1e-43;
        let q = Nvfp4Matrix::quantize(&v, (1, 1, 32), None).unwrap();
        let g = q.global_scale().unwrap();
        assert_eq!(g, f32::MIN_POSITIVE);
        assert!(q.scales().iter().all(|&b| b != E4M3_NAN), "{:?}", q.scales_row_major().unwrap());
        assert_eq!(q.scales_row_major().unwrap(), vec![0, 0], "the zero block and the one below 2^-136 get scale 0");
        assert!(q.dequantize().unwrap().iter().all(|&x| x == 0.0));
        // Every finite amax gives a finite, normal, positive global scale.
        for amax in [f32::from_bits(1), 1e-43, 1e-40, 3e-35, 1.0, 1e38, f32::MAX] {
            let g = computed_global_scale(amax);
            assert!(g.is_normal() && g > 0.0, "amax {amax}: g = {g}");
            assert!((amax / E2M1_MAX / g).is_finite() && amax / E2M1_MAX / g <= 448.0 * 1.001, "amax {amax}");
        }
        // Tiny data under the raised g (amax below 2688 * 2^-126): within a scale step where the
        // block scales are normal ue4m3 (block amax above about 1.1e-39); where they are
        // subnormal (bf16 has f32's range), no further off than 0 or one scale step, and never of
        // the wrong sign.
        let mut rng = SplitMix64::new(3);
        for (sigma, strict) in [(1e-37, true), (1e-40, false)] {
            let x: Vec<f32> = (0..64).map(|i| if i % 16 == 3 { 0.0 } else { (rng.normal() * sigma) as f32 }).collect();
            let q = Nvfp4Matrix::quantize(&x, (1, 2, 32), None).unwrap();
            let g = q.global_scale().unwrap();
            assert_eq!(g, f32::MIN_POSITIVE);
            assert!(q.scales().iter().all(|&b| b != E4M3_NAN));
            for (i, (a, d)) in x.iter().zip(q.dequantize().unwrap()).enumerate() {
                let s = ue4m3_to_f32(q.scale(0, i / 32, (i % 32) / 16)) * g;
                let within = if strict { (a - d).abs() <= s * 1.0001 } else { (a - d).abs() <= a.abs().max(s) && (d == 0.0 || d.signum() == a.signum()) };
                assert!(d.is_finite() && within, "sigma {sigma}, element {i}: {a} -> {d}, scale {s}");
            }
        }
        // A block of zeros inside ordinary data: scale byte 0, codes +0.
        let mut v: Vec<f32> = (0..48).map(|i| i as f32 - 20.0).collect();
        v[16..32].fill(0.0);
        let q = Nvfp4Matrix::quantize(&v, (1, 1, 48), None).unwrap();
        assert_eq!(q.scale(0, 0, 1), 0);
        assert!((16..32).all(|kk| q.code(0, 0, kk) == 0));
        // Huge values stay finite.
        let q = Nvfp4Matrix::quantize(&[1e38f32; 16], (1, 1, 16), None).unwrap();
        assert!(q.dequantize().unwrap().iter().all(|x| x.is_finite() && (x - 1e38).abs() <= 1e38 * 0.07));
    }

    /// Issue 25, finding 5: shapes whose counts overflow are typed errors, not panics.
    #[test]
    fn shapes_that_overflow_are_typed_errors() {
        let e = Nvfp4Matrix::quantize::<f32>(&[], (1, 1 << 32, 1 << 32), None).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "elements", value, .. } if value == 1 << 64), "{e}");
        assert!(e.to_string().contains("rows = 4294967296, K = 4294967296, batch = 1"), "{e}");
        let e = Nvfp4Matrix::quantize::<f32>(&[], (usize::MAX, usize::MAX, 1 << 32), None).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "elements", .. }), "{e}");
        let e = Nvfp4Matrix::random_contest((1 << 24, 1, 1 << 40), 1).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "elements", .. }), "{e}");
        // Elements fit, the padded scales do not: 128 padded rows per row.
        let e = Nvfp4Matrix::from_parts((1 << 56, 1, 16), vec![], vec![], None).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "tiled scale bytes", .. }), "{e}");
        // Counts that fit but memory that is not there: a typed error, not an abort.
        let e = Nvfp4Matrix::random_contest((1, 1 << 20, 1 << 40), 1).unwrap_err();
        assert!(matches!(e, Error::HostMemory { bytes, .. } if bytes == 1 << 59), "{e}");
    }

    #[test]
    fn quantizer_error_on_gaussian_data() {
        let mut rng = SplitMix64::new(42);
        let (rows, k) = (256, 1024);
        let x: Vec<f32> = (0..rows * k).map(|_| rng.normal() as f32).collect();
        let q = Nvfp4Matrix::quantize(&x, (1, rows, k), None).unwrap();
        let d = q.dequantize().unwrap();
        let num: f64 = x.iter().zip(&d).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
        let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        let rel = (num / den).sqrt();
        eprintln!("quantizer relative Frobenius error on N(0,1) {rows}x{k}: {rel:.4}");
        // e2m1 with a per-16 e4m3 scale: documented bound 0.12 (measured about 0.09-0.10).
        assert!(rel > 0.02 && rel < 0.12, "relative error {rel}");
        // Every element is within half an e2m1 step of its block's scale: |x - d| <= scale * g.
        let g = q.global_scale().unwrap();
        for (i, (a, b)) in x.iter().zip(&d).enumerate() {
            let s = ue4m3_to_f32(q.scale(0, i / k, (i % k) / 16)) * g;
            assert!((a - b).abs() <= s * 1.0001 + 1e-6, "element {i}: {a} -> {b}, scale {s}");
        }
        // 16-bit inputs quantize as their exact f32 widening does.
        let h: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
        let hw: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        assert_eq!(Nvfp4Matrix::quantize(&h, (1, rows, k), None).unwrap(), Nvfp4Matrix::quantize(&hw, (1, rows, k), None).unwrap());
        let hb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let bw: Vec<f32> = hb.iter().map(|v| v.to_f32()).collect();
        assert_eq!(Nvfp4Matrix::quantize(&hb, (1, rows, k), None).unwrap(), Nvfp4Matrix::quantize(&bw, (1, rows, k), None).unwrap());
    }

    /// The GPU quantizer's rules for NaN and infinities, on the CPU: NaN codes +6 and leaves the
    /// block's scale to the other values; an infinity saturates its block's scale and codes ±6.
    #[test]
    fn unchecked_quantizer_rules_for_nan_and_inf() {
        let mut x = vec![1.0f32; 48];
        x[2] = f32::NAN;
        x[3] = -f32::NAN;
        x[20] = f32::NEG_INFINITY;
        x[33] = 3.0;
        assert!(matches!(Nvfp4Matrix::quantize(&x, (1, 1, 48), Some(1.0)).unwrap_err(), Error::NonFiniteInput { index: 2, .. }));
        let q = Nvfp4Matrix::quantize_unchecked(&x, (1, 1, 48), Some(1.0)).unwrap();
        assert_eq!(q.scale(0, 0, 0), e4m3_from_f32(1.0 / 6.0), "NaN does not raise the block's amax");
        assert_eq!((q.code(0, 0, 2), q.code(0, 0, 3)), (0x7, 0x7), "NaN codes +6 whatever its sign");
        assert_eq!(q.scale(0, 0, 1), 0x7E, "an infinity saturates its block's scale");
        assert_eq!(q.code(0, 0, 20), 0xF, "-Inf codes -6");
        assert_eq!(q.code(0, 0, 21), 0, "1 / 448 rounds to 0");
        assert_eq!(q.scale(0, 0, 2), e4m3_from_f32(0.5), "an ordinary block is unchanged");
        let e = Nvfp4Matrix::quantize_unchecked(&x, (1, 1, 48), None).unwrap_err().to_string();
        let first = x.iter().position(|v| v.is_infinite()).unwrap();
        assert!(e.contains(&format!("element {first} is an infinity")) && e.contains("global scale"), "{e}");
    }

    /// Issue 22: a given global scale (ModelOpt's `input_scale`) is used as it is; block scales
    /// saturate at 448 where it is smaller than the data needs; a bad one is a typed error.
    #[test]
    fn quantizer_takes_a_given_global_scale() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.25).collect();
        let own = Nvfp4Matrix::quantize(&x, (1, 2, 32), None).unwrap();
        let g = own.global_scale().unwrap();
        assert_eq!(Nvfp4Matrix::quantize(&x, (1, 2, 32), Some(g)).unwrap(), own, "the computed g given back: same result");
        let given = Nvfp4Matrix::quantize(&x, (1, 2, 32), Some(2.0 * g)).unwrap();
        assert_eq!(given.global_scale(), Some(2.0 * g));
        assert_ne!(given.scales(), own.scales());
        for (i, (a, b)) in x.iter().zip(given.dequantize().unwrap()).enumerate() {
            let s = ue4m3_to_f32(given.scale(0, i / 32, (i % 32) / 16)) * 2.0 * g;
            assert!((a - b).abs() <= s * 1.0001, "element {i}: {a} -> {b}, scale {s}");
        }
        let tiny = Nvfp4Matrix::quantize(&x, (1, 2, 32), Some(g / 16.0)).unwrap();
        assert!(tiny.scales_row_major().unwrap().iter().all(|&b| b == 0x7E), "block scales saturate at 448");
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = Nvfp4Matrix::quantize(&x, (1, 2, 32), Some(bad)).unwrap_err().to_string();
            assert!(e.contains("global scale") && e.contains("finite and positive"), "{bad}: {e}");
        }
        let e = Nvfp4Matrix::quantize(&x, (2, 2, 32), None).unwrap_err().to_string();
        assert!(e.contains("values: holds 64") && e.contains("batch * rows * K"), "{e}");
    }
}
