//! NVFP4 number formats on the host: e2m1 (FP4) values, ue4m3 / e4m3fn and ue8m0 scales.
//!
//! Every function here is exact and branch-light; the decoders are `const fn` so tables can be
//! built at compile time. Packing follows PyTorch `float4_e2m1fn_x2`, CUTLASS `float_e2m1_t`
//! arrays and PTX `e2m1x2`: element `2i` in the low nibble, `2i+1` in the high nibble.

use crate::error::{Error, Result};

/// Magnitudes of the 8 non-negative e2m1 codes.
pub const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// Largest finite e2m1 value.
pub const E2M1_MAX: f32 = 6.0;
/// Largest finite e4m3fn value (also the largest ue4m3 scale).
pub const E4M3_MAX: f32 = 448.0;
/// The e4m3fn / ue4m3 NaN byte (sign clear).
pub const E4M3_NAN: u8 = 0x7F;

/// Decodes one e2m1 code (the low 4 bits of `code`). Codes 8..15 are the negated 0..7; 8 is -0.
#[inline]
pub const fn e2m1_to_f32(code: u8) -> f32 {
    let mag = E2M1_MAGNITUDES[(code & 7) as usize];
    if code & 8 != 0 {
        -mag
    } else {
        mag
    }
}

/// Encodes `x` as e2m1, rounding to nearest with ties to even and saturating to ±6.
///
/// The sign is kept, so values that round to zero give +0 (0x0) or -0 (0x8). NaN has no e2m1
/// code; it encodes as +6 (0x7), what PTX `cvt.rn.satfinite.e2m1x2.f32` produces.
#[inline]
pub fn e2m1_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7;
    }
    let sign = if x.is_sign_negative() { 8 } else { 0 };
    let m = x.abs();
    // Midpoints between neighbours; `<=` where the lower neighbour has the even code.
    let code = if m <= 0.25 {
        0
    } else if m < 0.75 {
        1
    } else if m <= 1.25 {
        2
    } else if m < 1.75 {
        3
    } else if m <= 2.5 {
        4
    } else if m < 3.5 {
        5
    } else if m <= 5.0 {
        6
    } else {
        7
    };
    sign | code
}

/// Packs two e2m1 codes into one byte: `lo` is the even element, `hi` the odd one.
#[inline]
pub const fn pack_e2m1(lo: u8, hi: u8) -> u8 {
    (lo & 0xF) | ((hi & 0xF) << 4)
}

/// The two e2m1 codes of a packed byte, (even element, odd element).
#[inline]
pub const fn unpack_e2m1(byte: u8) -> (u8, u8) {
    (byte & 0xF, byte >> 4)
}

/// Packs a slice of e2m1 codes two per byte; fails where their count is odd (NVFP4 rows always
/// hold an even number of values).
pub fn pack_e2m1_slice(codes: &[u8]) -> Result<Vec<u8>> {
    if !codes.len().is_multiple_of(2) {
        return Err(Error::InvalidData { what: "e2m1 codes", detail: format!("{} given; the count must be even (two codes to a byte)", codes.len()) });
    }
    Ok(codes.chunks_exact(2).map(|p| pack_e2m1(p[0], p[1])).collect())
}

/// Unpacks bytes into e2m1 codes, two per byte, low nibble first ([`Error::HostMemory`] where
/// the host cannot hold twice the bytes).
pub fn unpack_e2m1_slice(bytes: &[u8]) -> Result<Vec<u8>> {
    crate::error::try_collect("unpacked e2m1 codes", bytes.len().saturating_mul(2), bytes.iter().flat_map(|&b| [b & 0xF, b >> 4]))
}

/// Decodes an FP8 e4m3fn byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities,
/// `S.1111.111` is NaN, largest finite 448, smallest subnormal 2^-9.
#[inline]
pub fn e4m3_to_f32(bits: u8) -> f32 {
    let mag = bits & 0x7F;
    if mag == E4M3_NAN {
        return f32::NAN;
    }
    let e = (mag >> 3) as i32;
    let m = (mag & 7) as f32;
    let v = if e == 0 {
        m * (1.0 / 512.0) // subnormal: m * 2^-9
    } else {
        (1.0 + m / 8.0) * pow2(e - 7)
    };
    if bits & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// Encodes `x` as FP8 e4m3fn, rounding to nearest with ties to even and saturating to ±448
/// (PTX `cvt.rn.satfinite.e4m3x2.f32`). NaN gives 0x7F.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return E4M3_NAN;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    sign | ue4m3_magnitude(x.abs() as f64)
}

/// Decodes a ue4m3 scale byte: the bits of e4m3fn with the sign bit 0 ([`crate::formats`]). A byte with
/// the sign bit set is outside the format; it decodes as the negative e4m3fn value, and
/// [`crate::Nvfp4Matrix`] refuses such scales.
#[inline]
pub fn ue4m3_to_f32(bits: u8) -> f32 {
    e4m3_to_f32(bits)
}

/// Encodes a scale as ue4m3: like [`e4m3_from_f32`] for `x >= 0`; negative values and -0 give 0
/// (a scale has no sign), NaN gives 0x7F.
pub fn ue4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return E4M3_NAN;
    }
    if x <= 0.0 {
        return 0;
    }
    ue4m3_magnitude(x as f64)
}

/// Round-to-nearest-even of a non-negative finite `m` onto the e4m3 grid, saturating at 448.
fn ue4m3_magnitude(m: f64) -> u8 {
    if m >= E4M3_MAX as f64 {
        return 0x7E;
    }
    // Quantum of the binade (subnormals share the quantum of the smallest normal binade).
    let e = if m > 0.0 { m.log2().floor() as i32 } else { -6 };
    let e = e.max(-6);
    // log2 can be off by one ulp at binade edges; fix the exponent exactly.
    let e = if m < pow2f64(e) { e - 1 } else if m >= pow2f64(e + 1) { e + 1 } else { e }.max(-6);
    let q = pow2f64(e - 3);
    let r = round_half_even(m / q) * q; // exact: m / q has few bits above the point
    if r >= E4M3_MAX as f64 {
        return 0x7E;
    }
    if r < pow2f64(-6) {
        return (r / pow2f64(-9)) as u8; // subnormal, mantissa only
    }
    let e = r.log2().floor() as i32;
    let e = if r < pow2f64(e) { e - 1 } else if r >= pow2f64(e + 1) { e + 1 } else { e };
    let m = (r / pow2f64(e) * 8.0) as u8 - 8;
    (((e + 7) as u8) << 3) | m
}

/// Decodes a ue8m0 scale (MX formats): 2^(e-127); 0xFF is NaN.
#[inline]
pub fn ue8m0_to_f32(bits: u8) -> f32 {
    if bits == 0xFF {
        f32::NAN
    } else {
        pow2f64(bits as i32 - 127) as f32
    }
}

/// Encodes a positive finite `x` as the smallest ue8m0 power of two not below it (the rounding
/// MX quantizers use so that `x / scale` stays in range). Clamps to 2^-127 ..= 2^127; NaN,
/// infinities and non-positive values give 0xFF (NaN).
pub fn ue8m0_from_f32_ceil(x: f32) -> u8 {
    if !x.is_finite() || x <= 0.0 {
        return 0xFF;
    }
    let mut e = (x as f64).log2().ceil() as i32;
    if pow2f64(e - 1) >= x as f64 {
        e -= 1; // log2 rounding put us one binade high
    }
    (e.clamp(-127, 127) + 127) as u8
}

const BF16_MAX: f64 = 3.3895313892515355e38; // (2 - 2^-7) * 2^127

/// Rounds `x` once, to nearest even, onto a binary format with `sig` significant bits, smallest
/// normal exponent `emin` (subnormals below) and largest finite `max`; overflow gives infinity.
/// The result is exactly representable in that format.
fn round_f64_to(x: f64, sig: i32, emin: i32, max: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let a = x.abs();
    let e = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023; // f64 subnormals give -1023
    let q = pow2f64(e.max(emin) - (sig - 1));
    let r = round_half_even(a / q) * q; // exact: division and product by a power of two
    let r = if r > max { f64::INFINITY } else { r };
    r.copysign(x)
}

#[inline]
fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (r - x).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

#[inline]
fn pow2(e: i32) -> f32 {
    pow2f64(e) as f32
}

#[inline]
fn pow2f64(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// A one-byte storage type: `u8` or one of cudarc's typed bytes.
/// The storage and output traits below are implemented in this crate only: a launch moves as
/// many bytes per element as the type's tag says, so another type could not be trusted to match.
mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for float4::F4E2M1x2 {}
    impl Sealed for float8::F8E4M3 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for f32 {}
}

macro_rules! byte_storage {
    ($(#[$doc:meta])* $name:ident: $($t:ty),+) => {
        $(#[$doc])*
        pub trait $name: Copy + Send + Sync + 'static + sealed::Sealed {
            /// The raw byte.
            fn to_byte(self) -> u8;
            /// From a raw byte.
            fn from_byte(b: u8) -> Self;
        }
        impl $name for u8 {
            fn to_byte(self) -> u8 { self }
            fn from_byte(b: u8) -> Self { b }
        }
        $(impl $name for $t {
            fn to_byte(self) -> u8 { self.to_bits() }
            fn from_byte(b: u8) -> Self { <$t>::from_bits(b) }
        })+
    };
}

byte_storage!(
    /// Storage types accepted for packed e2m1 buffers (two values per byte): `u8` and cudarc's
    /// `float4::F4E2M1x2` (feature `f4`).
    PackedFp4: float4::F4E2M1x2
);
byte_storage!(
    /// Storage types accepted for ue4m3 scale buffers: `u8` and `float8::F8E4M3` (cudarc feature
    /// `f8`, PyTorch `float8_e4m3fn`).
    ScaleByte: float8::F8E4M3
);

/// Output element types of the GEMM: `half::f16`, `half::bf16` and `f32` (sealed: `OUT` sets
/// the bytes each element gets).
///
/// ```compile_fail
/// // A 2-byte type claiming 4-byte outputs is refused at compile time.
/// #[derive(Clone, Copy, Debug, PartialEq)]
/// struct Narrow(u16);
/// impl blockscaled_gemm::OutputElement for Narrow {
///     const OUT: blockscaled_gemm::OutType = blockscaled_gemm::OutType::F32;
///     fn from_f64(_: f64) -> Self { Narrow(0) }
///     fn to_f64(self) -> f64 { 0.0 }
/// }
/// ```
pub trait OutputElement: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static + sealed::Sealed {
    /// The runtime tag of this type.
    const OUT: crate::OutType;
    /// Rounds (to nearest even) from f64, once.
    fn from_f64(x: f64) -> Self;
    /// Widens exactly.
    fn to_f64(self) -> f64;
}

impl OutputElement for half::f16 {
    const OUT: crate::OutType = crate::OutType::F16;
    fn from_f64(x: f64) -> Self {
        // `half::f16::from_f64` goes through f32 on some targets and can round twice.
        half::f16::from_f64(round_f64_to(x, 11, -14, 65504.0))
    }
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
}

impl OutputElement for half::bf16 {
    const OUT: crate::OutType = crate::OutType::Bf16;
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(round_f64_to(x, 8, -126, BF16_MAX))
    }
    fn to_f64(self) -> f64 {
        half::bf16::to_f64(self)
    }
}

impl OutputElement for f32 {
    const OUT: crate::OutType = crate::OutType::F32;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// e4m3fn decoded through f32 bit patterns, independent of `e4m3_to_f32`'s arithmetic.
    fn e4m3_by_bits(b: u8) -> f32 {
        let s = ((b >> 7) as u32) << 31;
        let e = ((b >> 3) & 0xF) as u32;
        let m = (b & 7) as u32;
        if e == 0xF && m == 7 {
            return f32::NAN;
        }
        if e == 0 {
            // m * 2^-9, built as a normal f32 when m != 0
            if m == 0 {
                return f32::from_bits(s);
            }
            let lz = m.leading_zeros() - 29; // m has 3 bits
            let mm = (m << (lz + 1)) & 7;
            let ee = 127 - 7 - lz;
            return f32::from_bits(s | (ee << 23) | (mm << 20));
        }
        f32::from_bits(s | ((e + 127 - 7) << 23) | (m << 20))
    }

    #[test]
    fn e2m1_all_codes() {
        let want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        for c in 0..16u8 {
            let v = e2m1_to_f32(c);
            assert_eq!(v.to_bits(), (want[c as usize] as f32).to_bits(), "code {c}");
            assert_eq!(e2m1_from_f32(v), c, "round trip of code {c}");
        }
    }

    #[test]
    fn e2m1_encode_matches_brute_force_nearest_even() {
        // Every multiple of 1/64 in [-8, 8]: nearest code by search, ties to the even code.
        for i in -512..=512 {
            let x = i as f32 / 64.0;
            let mut best = 0u8;
            let mut best_d = f32::INFINITY;
            for c in 0..8u8 {
                let d = (x.abs().min(6.0) - E2M1_MAGNITUDES[c as usize]).abs();
                if d < best_d || (d == best_d && c % 2 == 0) {
                    best = c;
                    best_d = d;
                }
            }
            let want = best | if x.is_sign_negative() { 8 } else { 0 };
            assert_eq!(e2m1_from_f32(x), want, "x = {x}");
        }
        assert_eq!(e2m1_from_f32(1e9), 7);
        assert_eq!(e2m1_from_f32(-1e9), 15);
        assert_eq!(e2m1_from_f32(f32::INFINITY), 7);
        assert_eq!(e2m1_from_f32(f32::NAN), 7);
        assert_eq!(e2m1_from_f32(-0.1), 8);
    }

    #[test]
    fn e4m3_all_256_codes() {
        for b in 0..=255u8 {
            let v = e4m3_to_f32(b);
            let w = e4m3_by_bits(b);
            if (b & 0x7F) == 0x7F {
                assert!(v.is_nan() && w.is_nan(), "0x{b:02x} must be NaN");
                continue;
            }
            assert_eq!(v.to_bits(), w.to_bits(), "0x{b:02x}: {v} vs {w}");
            assert_eq!(e4m3_from_f32(v), b, "round trip 0x{b:02x} ({v})");
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    }

    #[test]
    fn e4m3_encode_rounds_to_nearest_even_and_saturates() {
        // Midpoints between every pair of neighbours round to the even mantissa.
        let vals: Vec<(u8, f32)> = (0..0x7Eu8).map(|b| (b, e4m3_to_f32(b))).collect();
        for w in vals.windows(2) {
            let (b0, v0) = w[0];
            let (b1, v1) = w[1];
            let mid = ((v0 as f64 + v1 as f64) / 2.0) as f32;
            let even = if b0 % 2 == 0 { b0 } else { b1 };
            assert_eq!(e4m3_from_f32(mid), even, "midpoint of 0x{b0:02x} and 0x{b1:02x}");
            let below = f32::from_bits(mid.to_bits() - 1);
            let above = f32::from_bits(mid.to_bits() + 1);
            assert_eq!(e4m3_from_f32(below), b0);
            assert_eq!(e4m3_from_f32(above), b1);
        }
        assert_eq!(e4m3_from_f32(449.0), 0x7E);
        assert_eq!(e4m3_from_f32(1e30), 0x7E);
        assert_eq!(e4m3_from_f32(-1e30), 0xFE);
        assert_eq!(e4m3_from_f32(f32::INFINITY), 0x7E);
        assert_eq!(e4m3_from_f32(f32::NAN), 0x7F);
        assert_eq!(e4m3_from_f32(2f32.powi(-11)), 0); // below half the smallest subnormal: 0
        assert_eq!(e4m3_from_f32(2f32.powi(-10)), 0); // tie with 0 and 2^-9: even (0)
        assert_eq!(e4m3_from_f32(1.5 * 2f32.powi(-10)), 1);
        assert_eq!(ue4m3_from_f32(-3.0), 0);
        assert_eq!(ue4m3_from_f32(3.0), e4m3_from_f32(3.0));
    }

    #[test]
    fn interop_with_float8_and_float4() {
        for b in 0..=255u8 {
            let f = float8::F8E4M3::from_bits(b);
            let ours = e4m3_to_f32(b);
            let theirs = f.to_f32();
            assert!(ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()), "0x{b:02x}");
            assert_eq!(<float8::F8E4M3 as ScaleByte>::from_byte(b).to_bits(), b);
            let p = <float4::F4E2M1x2 as PackedFp4>::from_byte(b);
            let (lo, hi) = p.to_f32_pair();
            assert_eq!((lo, hi), (e2m1_to_f32(b & 0xF), e2m1_to_f32(b >> 4)), "0x{b:02x}");
        }
    }

    #[test]
    fn ue8m0() {
        assert_eq!(ue8m0_to_f32(127), 1.0);
        assert_eq!(ue8m0_to_f32(0), 2f32.powi(-127));
        assert!(ue8m0_to_f32(0xFF).is_nan());
        assert_eq!(ue8m0_from_f32_ceil(1.0), 127);
        assert_eq!(ue8m0_from_f32_ceil(1.5), 128);
        assert_eq!(ue8m0_from_f32_ceil(0.25), 125);
        assert_eq!(ue8m0_from_f32_ceil(0.0), 0xFF);
        for e in 1..=254u8 {
            assert_eq!(ue8m0_from_f32_ceil(ue8m0_to_f32(e)), e);
        }
    }

    #[test]
    fn packing_low_nibble_first() {
        assert_eq!(pack_e2m1(0x1, 0xA), 0xA1);
        assert_eq!(unpack_e2m1(0xA1), (0x1, 0xA));
        let codes: Vec<u8> = (0..16).collect();
        let packed = pack_e2m1_slice(&codes).unwrap();
        assert_eq!(packed[0], 0x10);
        assert_eq!(unpack_e2m1_slice(&packed).unwrap(), codes);
    }

    #[test]
    fn half_rounds_once_from_f64() {
        // 1 + 2^-11 + 2^-40 is just above the f16 midpoint: must round up (a detour through f32
        // would drop the 2^-40 and round to even, down).
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(<half::f16 as OutputElement>::from_f64(x).to_f64(), 1.0 + 2f64.powi(-10));
        let y = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(<half::bf16 as OutputElement>::from_f64(y).to_f64(), 1.0 + 2f64.powi(-7));
        // Ties to even, subnormals, overflow.
        let f = |x: f64| <half::f16 as OutputElement>::from_f64(x).to_f64();
        assert_eq!(f(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(f(1.0 + 3.0 * 2f64.powi(-11)), 1.0 + 2.0 * 2f64.powi(-10));
        assert_eq!(f(2f64.powi(-25)), 0.0); // half the smallest subnormal: tie to 0
        assert_eq!(f(1.5 * 2f64.powi(-24)), 2.0 * 2f64.powi(-24));
        assert_eq!(f(-65504.0), -65504.0);
        assert_eq!(f(65519.99), 65504.0);
        assert_eq!(f(65520.0), f64::INFINITY); // midpoint to the next binade rounds up
        assert_eq!(<half::bf16 as OutputElement>::from_f64(1e39).to_f64(), f64::INFINITY);
        // Agrees with half's own conversion wherever f32 holds x exactly (no double rounding).
        let mut rng = crate::SplitMix64::new(3);
        for _ in 0..100_000 {
            let x = f32::from_bits(rng.next_u64() as u32);
            if !x.is_finite() {
                continue;
            }
            assert_eq!(f(x as f64).to_bits(), half::f16::from_f32(x).to_f64().to_bits(), "{x:e}");
            let b = <half::bf16 as OutputElement>::from_f64(x as f64);
            assert_eq!(b.to_bits(), half::bf16::from_f32(x).to_bits(), "{x:e}");
        }
    }
}
