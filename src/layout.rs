//! The scale-factor layout of CUTLASS SM100/SM120, cuBLAS and PyTorch `to_blocked`, and the
//! prepacked layout of weight values.
//!
//! Scales of an R x S matrix (S = K/16) are stored in 512-byte tiles of 128 rows x 4 scale
//! columns; R is padded to a multiple of 128 and S to a multiple of 4, K-blocks innermost.
//! Padding bytes exist in memory and are zero: the kernels read them, and 0 * NaN would poison
//! valid outputs.
//!
//! Weight values (a B operand's packed e2m1 bytes) come in two layouts ([`WeightLayout`]): the
//! standard K-major rows `(batch, rows, K/2)` PyTorch and checkpoints hold, and the prepacked one
//! the Hopper kernels stream in whole blocks: K cut into chunks of [`PREPACK_CHUNK_BYTES`] bytes
//! (256 values), each chunk of every row of a batch stored together, `(batch, ceil(K/256), rows,
//! 128)`, the last chunk's bytes past K zero. A TMA box of the kernels (128 or 64 bytes of K of
//! up to 256 rows) is then one contiguous block of memory instead of one piece a row, one row
//! pitch apart. The scales keep their tiled layout, which the kernels already read as
//! contiguous 512-byte chunks.

use crate::error::{check_len, checked_product, try_zeros, Error, Result};
use std::fmt;

/// Bytes of K of one prepacked chunk (256 values; `BSG_PREPACK_CHUNK_BYTES` in the launch ABI).
pub const PREPACK_CHUNK_BYTES: usize = crate::sys::PREPACK_CHUNK_BYTES;

/// The layout of a weight tensor's packed values (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// K-major rows, `(batch, rows, K/2)` bytes: as PyTorch and checkpoints hold them.
    #[default]
    Standard,
    /// Chunks of [`PREPACK_CHUNK_BYTES`] bytes of K, each for every row: `(batch, ceil(K/256),
    /// rows, 128)` bytes, zero past K. Hopper (SM90) kernels only.
    Prepacked,
}

impl fmt::Display for WeightLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightLayout::Standard => "standard",
            WeightLayout::Prepacked => "prepacked",
        })
    }
}

impl WeightLayout {
    /// The launch ABI's value (`bsg::WeightLayout`).
    pub(crate) fn abi(self) -> i32 {
        self as i32
    }
}

/// Prepacked chunks of a K extent: `ceil(K / 256)`.
pub const fn prepack_chunks(k: usize) -> usize {
    (k / 2).div_ceil(PREPACK_CHUNK_BYTES)
}

/// Bytes of the prepacked values of `(batch, rows, k)` (saturating, as the scale sizes).
pub const fn prepacked_bytes((batch, rows, k): (usize, usize, usize)) -> usize {
    prepack_chunks(k).saturating_mul(rows).saturating_mul(PREPACK_CHUNK_BYTES).saturating_mul(batch)
}

/// Every piece of K that one row holds in one prepacked chunk, as (offset in the standard layout,
/// offset in the prepacked one, length), for `batch` values of `rows` x `k`.
fn chunk_pieces(rows: usize, k: usize, batch: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let (row_bytes, chunks) = (k / 2, prepack_chunks(k));
    (0..batch * rows).flat_map(move |lr| {
        let (l, r) = (lr / rows, lr % rows);
        (0..chunks).map(move |c| {
            let len = PREPACK_CHUNK_BYTES.min(row_bytes - c * PREPACK_CHUNK_BYTES);
            (lr * row_bytes + c * PREPACK_CHUNK_BYTES, ((l * chunks + c) * rows + r) * PREPACK_CHUNK_BYTES, len)
        })
    })
}

/// The rules of the two value layouts' sizes.
const STANDARD_RULE: &str = "batch * rows * K / 2 bytes (standard layout)";
const PREPACKED_RULE: &str = "batch * ceil(K / 256) * rows * 128 bytes (prepacked layout)";

/// The sizes of `(batch, rows, K)` values, (standard bytes, prepacked bytes), after checking that
/// K is even (two e2m1 values a byte); or [`Error::SizeLimit`] where one does not fit in `usize`.
fn value_sizes(rows: usize, k: usize, batch: usize) -> Result<(usize, usize)> {
    if !k.is_multiple_of(2) {
        return Err(Error::KMultiple { k, multiple: 2, why: "two e2m1 values per byte" });
    }
    let standard = checked_product("values", STANDARD_RULE, &[("batch", batch), ("rows", rows), ("K / 2", k / 2)])?;
    let dims = [("batch", batch), ("K / 256 rounded up", prepack_chunks(k)), ("rows", rows), ("bytes a chunk", PREPACK_CHUNK_BYTES)];
    Ok((standard, checked_product("prepacked values", PREPACKED_RULE, &dims)?))
}

/// Packed values `(batch, rows, K/2)` into the prepacked layout (zeros past K), on the host: the
/// GPU's transform ([`crate::Nvfp4Tensor::prepack`]) writes the same bytes. Fails where K is
/// odd or `src` does not hold `batch * rows * K / 2` bytes.
pub fn prepack_values(src: &[u8], (batch, rows, k): (usize, usize, usize)) -> Result<Vec<u8>> {
    let (standard, total) = value_sizes(rows, k, batch)?;
    check_len("values", src.len(), standard, STANDARD_RULE)?;
    if total == 0 {
        return Ok(Vec::new()); // no values: nothing to move (rows or batch may still be huge)
    }
    let mut out = try_zeros("prepacked values", total)?;
    for (std_at, packed_at, len) in chunk_pieces(rows, k, batch) {
        out[packed_at..packed_at + len].copy_from_slice(&src[std_at..std_at + len]);
    }
    Ok(out)
}

/// The prepacked layout back to `(batch, rows, K/2)` (the bytes past K are dropped). Fails where
/// K is odd or `src` does not hold [`prepacked_bytes`]`((batch, rows, k))` bytes.
pub fn unpack_values(src: &[u8], (batch, rows, k): (usize, usize, usize)) -> Result<Vec<u8>> {
    let (total, prepacked) = value_sizes(rows, k, batch)?;
    check_len("values", src.len(), prepacked, PREPACKED_RULE)?;
    if total == 0 {
        return Ok(Vec::new());
    }
    let mut out = try_zeros("values", total)?;
    for (std_at, packed_at, len) in chunk_pieces(rows, k, batch) {
        out[std_at..std_at + len].copy_from_slice(&src[packed_at..packed_at + len]);
    }
    Ok(out)
}

/// Elements of K that share one scale (NVFP4 vector size).
pub const SF_VEC: usize = 16;
/// Rows of one scale tile.
pub const SF_TILE_ROWS: usize = 128;
/// Scale columns of one scale tile.
pub const SF_TILE_COLS: usize = 4;
/// Bytes of one scale tile.
pub const SF_TILE_BYTES: usize = SF_TILE_ROWS * SF_TILE_COLS;

// The sizes below saturate at `usize::MAX` where the exact size does not fit: no buffer is that
// long, so a length check against a saturated size fails instead of passing a wrapped one.
// [`checked_sf_bytes`] says whether the size is exact.

/// Rows padded to the tile: `ceil(rows / 128) * 128` (saturating).
pub const fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(SF_TILE_ROWS).saturating_mul(SF_TILE_ROWS)
}

/// Scale columns padded to the tile: `ceil(cols / 4) * 4` (saturating).
pub const fn padded_sf_cols(sf_cols: usize) -> usize {
    sf_cols.div_ceil(SF_TILE_COLS).saturating_mul(SF_TILE_COLS)
}

/// Scale columns of a K extent: `k / 16` (K is a multiple of 16 wherever scales exist).
pub const fn sf_cols(k: usize) -> usize {
    k / SF_VEC
}

/// Bytes of one batch's scales for `rows` x `k`: `padded_rows * padded_sf_cols` (saturating).
pub const fn sf_batch_bytes(rows: usize, k: usize) -> usize {
    padded_rows(rows).saturating_mul(padded_sf_cols(sf_cols(k)))
}

/// Bytes of the tiled scales of `(batch, rows, k)`: `batch` buffers of [`sf_batch_bytes`]
/// (saturating).
pub const fn sf_bytes((batch, rows, k): (usize, usize, usize)) -> usize {
    sf_batch_bytes(rows, k).saturating_mul(batch)
}

/// [`sf_bytes`], or `None` where it does not fit in `usize`.
pub const fn checked_sf_bytes((batch, rows, k): (usize, usize, usize)) -> Option<usize> {
    if batch == 0 {
        return Some(0); // no batch: no bytes, however large one would be
    }
    let (r, c) = (rows.div_ceil(SF_TILE_ROWS), sf_cols(k).div_ceil(SF_TILE_COLS));
    match r.checked_mul(c) {
        // One tile is 512 bytes.
        Some(tiles) => match tiles.checked_mul(SF_TILE_BYTES) {
            Some(per) => per.checked_mul(batch),
            None => None,
        },
        None => None,
    }
}

/// Byte offset of scale (row `r`, scale column `s`) within one batch, for a matrix whose padded
/// scale-column count is `sp` (a multiple of 4). Batch `l` adds `l * sf_batch_bytes(..)`. For
/// positions inside a layout whose bytes fit in `usize` (`checked_sf_bytes` is `Some`): the arithmetic
/// is unchecked, as in an indexing loop (it wraps outside them, meaningless but no panic).
pub const fn sf_offset(r: usize, s: usize, sp: usize) -> usize {
    let tile = (r / 128).wrapping_mul(sp / 4).wrapping_add(s / 4).wrapping_mul(512);
    tile.wrapping_add((r % 32) * 16 + ((r % 128) / 32) * 4 + (s % 4))
}

/// Byte offset of the scale of element (batch `l`, row `r`, K index `k_elem`) in a buffer for
/// `rows` x `k` (inside a layout whose bytes fit in `usize`, as [`sf_offset`]).
pub const fn sf_offset_elem(l: usize, r: usize, k_elem: usize, rows: usize, k: usize) -> usize {
    l.wrapping_mul(sf_batch_bytes(rows, k)).wrapping_add(sf_offset(r, k_elem / SF_VEC, padded_sf_cols(sf_cols(k))))
}

/// The sizes of `(batch, rows, sf_cols)` scales, (row-major bytes, tiled bytes), or
/// [`Error::SizeLimit`] where one does not fit in `usize`.
fn scale_sizes(rows: usize, sf_cols: usize, batch: usize) -> Result<(usize, usize)> {
    let row_major = checked_product("row-major scales", "batch * rows * scale columns", &[("batch", batch), ("rows", rows), ("scale columns", sf_cols)])?;
    let dims = [("batch", batch), ("rows rounded up to 128", padded_rows(rows)), ("scale columns rounded up to 4", padded_sf_cols(sf_cols))];
    Ok((row_major, checked_product("tiled scale bytes", "batch * padded rows * padded scale columns", &dims)?))
}

/// `out` (`out_len` zero bytes) with every scale of `(batch, rows, sf_cols)` copied from `src`,
/// `index(row-major index, tiled index)` giving (index into out, index into src).
fn move_scales(src: &[u8], out_len: usize, what: &'static str, rows: usize, sf_cols: usize, batch: usize, index: impl Fn(usize, usize) -> (usize, usize)) -> Result<Vec<u8>> {
    if out_len == 0 {
        return Ok(Vec::new()); // no scales: no loop over rows, however many
    }
    let (sp, mut out) = (padded_sf_cols(sf_cols), try_zeros(what, out_len)?);
    let per = padded_rows(rows) * sp; // fits: out or src holds batch of them
    for l in 0..batch {
        for r in 0..rows {
            for s in 0..sf_cols {
                let (o, i) = index((l * rows + r) * sf_cols + s, l * per + sf_offset(r, s, sp));
                out[o] = src[i];
            }
        }
    }
    Ok(out)
}

/// Converts row-major scales `(batch, rows, sf_cols)` into the tiled layout, zero padding. Fails
/// where `src` does not hold `batch * rows * sf_cols` bytes or the tiled size does not fit.
pub fn to_tiled(src: &[u8], (batch, rows, sf_cols): (usize, usize, usize)) -> Result<Vec<u8>> {
    let (row_major, tiled) = scale_sizes(rows, sf_cols, batch)?;
    check_len("row-major scales", src.len(), row_major, "batch * rows * scale columns")?;
    move_scales(src, tiled, "tiled scales", rows, sf_cols, batch, |rm, t| (t, rm))
}

/// Converts tiled scales back to row-major `(batch, rows, sf_cols)`, dropping the padding. Fails
/// where `tiled` does not hold `batch * padded_rows(rows) * padded_sf_cols(sf_cols)` bytes.
pub fn from_tiled(tiled: &[u8], (batch, rows, sf_cols): (usize, usize, usize)) -> Result<Vec<u8>> {
    let (row_major, tiled_len) = scale_sizes(rows, sf_cols, batch)?;
    check_len("tiled scales", tiled.len(), tiled_len, "batch * rows rounded up to 128 * scale columns rounded up to 4")?;
    move_scales(tiled, row_major, "row-major scales", rows, sf_cols, batch, |rm, t| (rm, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contest's `sfa_permuted` view: a tensor of shape (32, 4, rest_m, 4, rest_k, L) whose
    /// memory order is (rest_m, rest_k, 32, 4, 4) per batch, batch outermost.
    #[allow(clippy::too_many_arguments)]
    fn contest_view_offset(i32_: usize, i4: usize, rm: usize, j4: usize, rk: usize, l: usize,
                           rest_m: usize, rest_k: usize) -> usize {
        let per_batch = rest_m * rest_k * 512;
        l * per_batch + rm * rest_k * 512 + rk * 512 + i32_ * 16 + i4 * 4 + j4
    }

    #[test]
    fn tiled_equals_contest_view() {
        let (rows, k, batch) = (300, 16 * 11, 2);
        let (rest_m, rest_k) = (padded_rows(rows) / 128, padded_sf_cols(sf_cols(k)) / 4);
        for l in 0..batch {
            for r in 0..rows {
                for s in 0..sf_cols(k) {
                    let (i32_, i4, rm) = (r % 32, (r % 128) / 32, r / 128);
                    let (j4, rk) = (s % 4, s / 4);
                    assert_eq!(
                        sf_offset_elem(l, r, s * 16, rows, k),
                        contest_view_offset(i32_, i4, rm, j4, rk, l, rest_m, rest_k)
                    );
                }
            }
        }
    }

    #[test]
    fn torch_to_blocked_equivalence() {
        // PyTorch: view(R/128,128,S/4,4).permute(0,2,1,3).reshape(-1,4,32,4).transpose(1,2)
        // Within a (128 x 4) block, element (i, j) goes to (i % 32) * 16 + (i / 32) * 4 + j.
        let (rows, s) = (256, 8);
        let sp = padded_sf_cols(s);
        let mut seen = vec![false; padded_rows(rows) * sp];
        for r in 0..rows {
            for c in 0..s {
                let (rb, cb, i, j) = (r / 128, c / 4, r % 128, c % 4);
                let want = (rb * (sp / 4) + cb) * 512 + (i % 32) * 16 + (i / 32) * 4 + j;
                assert_eq!(sf_offset(r, c, sp), want);
                assert!(!seen[want], "offset {want} hit twice");
                seen[want] = true;
            }
        }
        assert!(seen.iter().all(|&x| x), "layout is a bijection on full tiles");
    }

    #[test]
    fn round_trip_odd_shapes() {
        for &(rows, cols, batch) in &[(1, 1, 1), (127, 3, 2), (129, 5, 1), (33, 4, 3), (256, 8, 1), (1000, 17, 2)] {
            let src: Vec<u8> = (0..rows * cols * batch).map(|i| (i * 7 + 3) as u8 | 1).collect();
            let tiled = to_tiled(&src, (batch, rows, cols)).unwrap();
            assert_eq!(tiled.len(), batch * padded_rows(rows) * padded_sf_cols(cols));
            assert_eq!(from_tiled(&tiled, (batch, rows, cols)).unwrap(), src);
            // Exactly the padding is zero (every source byte is odd, so nonzero).
            let nonzero = tiled.iter().filter(|&&b| b != 0).count();
            assert_eq!(nonzero, src.len());
        }
    }

    #[test]
    fn prepack_round_trip() {
        // K of whole chunks, a partial last chunk, and less than one chunk.
        for &(rows, k, batch) in &[(3, 512, 2), (5, 7168, 1), (130, 288, 3), (7, 32, 2), (1, 2080, 1)] {
            let src: Vec<u8> = (0..batch * rows * k / 2).map(|i| (i * 13 + 5) as u8 | 1).collect();
            let packed = prepack_values(&src, (batch, rows, k)).unwrap();
            assert_eq!(packed.len(), batch * (k / 2).div_ceil(128) * rows * 128);
            assert_eq!(unpack_values(&packed, (batch, rows, k)).unwrap(), src, "{rows} {k} {batch}");
            // Exactly the bytes past K are zero (every source byte is odd).
            assert_eq!(packed.iter().filter(|&&b| b != 0).count(), src.len());
            // Byte j of chunk c of row r of batch l, as the launch ABI states it.
            let chunks = (k / 2).div_ceil(128);
            for (l, r, kb) in [(batch - 1, rows - 1, k / 2 - 1), (0, rows / 2, (k / 2) / 3), (batch / 2, 0, 0)] {
                let (c, j) = (kb / 128, kb % 128);
                assert_eq!(packed[((l * chunks + c) * rows + r) * 128 + j], src[(l * rows + r) * (k / 2) + kb]);
            }
        }
        assert_eq!(prepacked_bytes((1, usize::MAX, 256)), usize::MAX);
    }

    /// A review probe: outside its precondition the offset overflowed, a panic in builds with
    /// overflow checks; it wraps, as its docs call it unchecked.
    #[test]
    fn offsets_outside_a_layout_do_not_panic() {
        let _ = sf_offset(usize::MAX, usize::MAX, usize::MAX);
        let _ = sf_offset_elem(usize::MAX, usize::MAX, usize::MAX, usize::MAX, usize::MAX);
        assert_eq!(sf_offset(129, 5, 8), 2 * 512 + 512 + 16 + 1);
    }

    /// A review probe: with batch 0 the scales take 0 bytes, and `checked_sf_bytes` answered
    /// `None` (does not fit) where rows x K alone overflowed; it agrees with `sf_bytes` and the
    /// exact product everywhere.
    #[test]
    fn checked_sizes_are_the_exact_ones() {
        assert_eq!(checked_sf_bytes((0, usize::MAX, usize::MAX)), Some(0));
        let vals = [0usize, 1, 2, 15, 16, 17, 127, 128, 129, 1 << 20, 1 << 32, 1 << 40, usize::MAX / 512, usize::MAX / 3, usize::MAX - 1, usize::MAX];
        for &rows in &vals {
            for &k in &vals {
                for &batch in &vals {
                    let exact = (rows.div_ceil(128) as u128 * 128).saturating_mul(sf_cols(k).div_ceil(4) as u128 * 4).saturating_mul(batch as u128);
                    let want = usize::try_from(exact).ok();
                    assert_eq!(checked_sf_bytes((batch, rows, k)), want, "{rows} {k} {batch}");
                    assert_eq!(sf_bytes((batch, rows, k)), want.unwrap_or(usize::MAX), "{rows} {k} {batch}");
                }
            }
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(sf_batch_bytes(128, 256), 128 * 16);
        assert_eq!(sf_batch_bytes(1, 32), 128 * 4);
        assert_eq!(sf_batch_bytes(129, 80), 256 * 8);
        assert_eq!(sf_bytes((3, 129, 80)), 3 * 256 * 8);
        assert_eq!(checked_sf_bytes((3, 129, 80)), Some(3 * 256 * 8));
        // Beyond usize: saturated, and None from the checked form (issue 25, finding 5).
        for (rows, k, batch) in [(1, (1 << 31) - 32, 1 << 30), (usize::MAX, 16, 1), (1, usize::MAX, 1), (1, 16, usize::MAX)] {
            assert_eq!(checked_sf_bytes((batch, rows, k)), None, "{rows} {k} {batch}");
            assert_eq!(sf_bytes((batch, rows, k)), usize::MAX, "{rows} {k} {batch}");
        }
        assert_eq!(padded_rows(usize::MAX), usize::MAX);
    }
}
