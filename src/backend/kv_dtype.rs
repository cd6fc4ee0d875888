//! How the KV cache stores keys and values (`engine.kv_cache_dtype`), and exact host rounding
//! through the two fp8 encodings.
//!
//! GPUs store fp8 bytes (half the memory of a 16-bit cache). The CPU backend keeps f32 but, for
//! an fp8 setting, rounds every value written to the cache through the same encoding with the
//! same rules as the device code in `kernels/common.cuh`, bit for bit. So the CPU backend stays
//! the numerical reference for an fp8 cache (what the GPU computes can be checked exactly, and
//! the accuracy cost of fp8 can be measured on any machine); it saves no memory on the CPU.
//!
//! Encodings (OCP 8-bit floating point):
//! - `e5m2`: the upper byte of an IEEE half; max 57344. Rounding: f32 → f16 (round to nearest
//!   even), then f16 → e5m2 (round to nearest even on the dropped byte), saturating to ±57344.
//! - `e4m3` ("fn" variant): bias 7, no infinities, max 448, subnormal step 2⁻⁹. Rounding: round
//!   to nearest even on the f32 bits, saturating to ±448; below 2⁻⁶ round-half-even to multiples
//!   of 2⁻⁹.

use half::f16;

/// Storage of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDType {
    /// The compute dtype (f32 on the CPU).
    #[default]
    Same,
    /// fp8 e5m2.
    E5M2,
    /// fp8 e4m3 (fn).
    E4M3,
}

impl KvCacheDType {
    /// Parse `engine.kv_cache_dtype`: `auto`, `fp8_e5m2` or `fp8_e4m3`.
    pub fn parse(setting: &str) -> Option<KvCacheDType> {
        match setting {
            "auto" => Some(KvCacheDType::Same),
            "fp8_e5m2" => Some(KvCacheDType::E5M2),
            "fp8_e4m3" => Some(KvCacheDType::E4M3),
            _ => None,
        }
    }

    /// Kernel-name suffix of the storage (`same`, `e5m2`, `e4m3`).
    pub fn suffix(self) -> &'static str {
        match self {
            KvCacheDType::Same => "same",
            KvCacheDType::E5M2 => "e5m2",
            KvCacheDType::E4M3 => "e4m3",
        }
    }

    /// The value a cache of this storage returns after `x` is written (identity for `Same`).
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvCacheDType::Same => x,
            KvCacheDType::E5M2 => e5m2_to_f32(f32_to_e5m2(x)),
            KvCacheDType::E4M3 => e4m3_to_f32(f32_to_e4m3(x)),
        }
    }
}

/// f32 → e5m2 byte, as `f32_to_fp8e5m2` in kernels/common.cuh.
pub fn f32_to_e5m2(x: f32) -> u8 {
    let h = f16::from_f32(x).to_bits();
    if h & 0x7fff > 0x7c00 {
        return 0x7f; // NaN
    }
    let rounding = 0x7f + ((h >> 8) & 1);
    let mut r = (u32::from(h) + u32::from(rounding)) >> 8;
    if r & 0x7f > 0x7b {
        r = (r & 0x80) | 0x7b; // saturate to ±57344
    }
    r as u8
}

/// e5m2 byte → f32 (exact).
pub fn e5m2_to_f32(b: u8) -> f32 {
    f16::from_bits(u16::from(b) << 8).to_f32()
}

/// f32 → e4m3 byte, as `f32_to_fp8e4m3` in kernels/common.cuh.
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    if a.is_nan() {
        return sign | 0x7f;
    }
    if a >= 448.0 {
        return sign | 0x7e;
    }
    if a < 0.015625 {
        // Subnormal steps of 2^-9; `round_ties_even` matches CUDA's __float2int_rn.
        let m = (a * 512.0).round_ties_even() as u8;
        return sign | m; // m == 8 is the smallest normal
    }
    let mut u = a.to_bits();
    u += 0x7ffff + ((u >> 20) & 1);
    let exp = (u >> 23).wrapping_sub(120);
    let man = (u >> 20) & 0x7;
    if exp > 15 || (exp == 15 && man == 7) {
        return sign | 0x7e;
    }
    sign | ((exp << 3) | man) as u8
}

/// e4m3 byte → f32 (exact).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = (b >> 3) & 0xf;
    let man = b & 0x7;
    if exp == 0xf && man == 0x7 {
        return f32::NAN;
    }
    let v = if exp == 0 {
        f32::from(man) * 0.001953125
    } else {
        f32::from_bits(((u32::from(exp) + 120) << 23) | (u32::from(man) << 20))
    };
    sign * v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names_every_setting() {
        assert_eq!(KvCacheDType::parse("auto"), Some(KvCacheDType::Same));
        assert_eq!(KvCacheDType::parse("fp8_e5m2"), Some(KvCacheDType::E5M2));
        assert_eq!(KvCacheDType::parse("fp8_e4m3"), Some(KvCacheDType::E4M3));
        assert_eq!(KvCacheDType::parse("fp8"), None);
    }

    #[test]
    fn every_e4m3_byte_round_trips() {
        for b in 0..=255u8 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                assert_eq!(b & 0x7f, 0x7f);
                continue;
            }
            // -0 encodes as 0x80 and decodes to -0.0.
            assert_eq!(f32_to_e4m3(v), b, "byte {b:#04x} = {v}");
        }
    }

    #[test]
    fn every_e5m2_byte_round_trips() {
        for b in 0..=255u8 {
            let v = e5m2_to_f32(b);
            if v.is_nan() || v.is_infinite() {
                continue;
            }
            assert_eq!(f32_to_e5m2(v), b, "byte {b:#04x} = {v}");
        }
    }

    #[test]
    fn rounding_is_to_nearest_even_and_saturates() {
        // e4m3 near 1: steps of 1/8. 1.0625 is a tie → even mantissa (1.0); 1.1875 → 1.25.
        assert_eq!(KvCacheDType::E4M3.round(1.0625), 1.0);
        assert_eq!(KvCacheDType::E4M3.round(1.1875), 1.25);
        assert_eq!(KvCacheDType::E4M3.round(1.07), 1.125);
        assert_eq!(KvCacheDType::E4M3.round(1000.0), 448.0);
        assert_eq!(KvCacheDType::E4M3.round(-1000.0), -448.0);
        // Subnormal: 3 * 2^-9 stays, 2.5 * 2^-9 ties to even (2 * 2^-9).
        assert_eq!(KvCacheDType::E4M3.round(3.0 / 512.0), 3.0 / 512.0);
        assert_eq!(KvCacheDType::E4M3.round(2.5 / 512.0), 2.0 / 512.0);
        // e5m2 near 1: steps of 1/4. 1.125 ties → 1.0; 1.375 ties → 1.5.
        assert_eq!(KvCacheDType::E5M2.round(1.125), 1.0);
        assert_eq!(KvCacheDType::E5M2.round(1.375), 1.5);
        assert_eq!(KvCacheDType::E5M2.round(1.2), 1.25);
        assert_eq!(KvCacheDType::E5M2.round(1e6), 57344.0);
        assert_eq!(KvCacheDType::Same.round(1.2), 1.2);
    }

    #[test]
    fn relative_error_is_bounded_by_the_mantissa() {
        // Normal range: |round(x) - x| ≤ 2^-(m+1) |x| for m mantissa bits.
        for i in 1..2000 {
            let x = 0.02 + i as f32 * 0.137;
            let e4 = (KvCacheDType::E4M3.round(x) - x).abs() / x;
            assert!(e4 <= 1.0 / 16.0 + 1e-6, "e4m3 {x}: {e4}");
            let e5 = (KvCacheDType::E5M2.round(x) - x).abs() / x;
            assert!(e5 <= 1.0 / 8.0 + 1e-6, "e5m2 {x}: {e5}");
        }
    }
}
