//! Exact dequantization of packed 4-bit linears ([`PackedLinear`]): the CPU reference every
//! kernel is checked against.
//!
//! Row `n` of the logical weight `W [N, K]` is rebuilt in f32 as (layouts in
//! [`crate::tensor::packed`]; `g = g_idx[k]` when present, else `k / G`):
//! - compressed-tensors int4: `W[n,k] = (u_q − u_zp) · scale[n, g]`, `u_q` nibble `k % 8` of
//!   `weight_packed[n, k / 8]`, `u_zp` nibble `n % 8` of `weight_zero_point[n / 8, g]`
//!   (8 when symmetric: the stored `+8` offsets cancel);
//! - NVFP4: `W[n,k] = e2m1(nibble) · (fp8(scale[n, k / 16]) / global_scale)`, element `2j` in
//!   the low nibble of byte `j` of the row;
//! - AutoAWQ GEMM: `W[n,k] = (q − z) · s[g, n]`, `q` nibble `AWQ_REVERSE_ORDER[n % 8]` of
//!   `qweight[k, n / 8]`, `z` the same nibble of `qzeros[g, n / 8]`;
//! - GPTQ: `W[n,k] = (q − z') · s[g, n]`, `q` nibble `k % 8` of `qweight[k / 8, n]`, `z'` nibble
//!   `n % 8` of `qzeros[g, n / 8]`, plus one in the `gptq` (v1) convention.
//!
//! Every integer difference is exact, and one f32 product with the (16- or 32-bit) scale is
//! exact too (≤ 5 + 24 significant bits), so the int4 formats are dequantized without rounding;
//! NVFP4 rounds once, in `scale / global_scale` (the association compressed-tensors uses).

use half::{bf16, f16};

use crate::tensor::{PackedLinear, PackedScheme, TensorView, WeightDType};

/// AutoAWQ's pack order: nibble `i` of a word holds output column `8c + AWQ_ORDER[i]`.
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
/// The inverse: output column `n` sits in nibble `AWQ_REVERSE_ORDER[n % 8]` of word `n / 8`.
pub const AWQ_REVERSE_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// E2M1 (FP4) magnitudes by the low three bits; bit 3 is the sign.
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The FP4 value of a nibble (`sign | idx`).
#[inline]
pub fn fp4_e2m1(nibble: u8) -> f32 {
    let v = E2M1[(nibble & 7) as usize];
    if nibble & 8 != 0 {
        -v
    } else {
        v
    }
}

/// OCP fp8 E4M3 (`float8_e4m3fn`, bias 7, no infinities; `0x7F` / `0xFF` are NaN) as f32,
/// exactly.
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = (b >> 3) & 0xF;
    let man = b & 7;
    if exp == 0xF && man == 7 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        // Subnormal: man/8 · 2^-6.
        f32::from(man) * (1.0 / 512.0)
    } else {
        (1.0 + f32::from(man) / 8.0) * f32::powi(2.0, i32::from(exp) - 7)
    };
    sign * mag
}

/// Element `i` of an i32 tensor (little-endian; any alignment).
#[inline]
fn i32_at(v: &TensorView<'_>, i: usize) -> i32 {
    let b = &v.data[4 * i..4 * i + 4];
    i32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Nibble `j` (bits `4j..4j+4`) of i32 element `i`.
#[inline]
fn nibble(v: &TensorView<'_>, i: usize, j: usize) -> i32 {
    (i32_at(v, i) as u32 >> (4 * j) & 0xF) as i32
}

/// Element `i` of an F32 / F16 / BF16 / F8E4M3 tensor as f32 (exact).
///
/// # Panics
/// On another dtype (a [`PackedLinear::validate`]d linear never has one).
#[inline]
pub fn float_at(v: &TensorView<'_>, i: usize) -> f32 {
    let d = v.data;
    match v.dtype {
        WeightDType::F32 => {
            f32::from_le_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]])
        }
        WeightDType::F16 => f16::from_le_bytes([d[2 * i], d[2 * i + 1]]).to_f32(),
        WeightDType::BF16 => bf16::from_le_bytes([d[2 * i], d[2 * i + 1]]).to_f32(),
        WeightDType::F8E4M3 => fp8_e4m3_to_f32(d[i]),
        other => panic!("float_at: {other:?} is not a float type"),
    }
}

/// The group of input column `k`.
#[inline]
fn group_of(p: &PackedLinear<'_>, k: usize, g: usize) -> usize {
    match &p.g_idx {
        Some(gi) => i32_at(gi, k) as usize,
        None => k / g,
    }
}

/// Row `n` of the logical weight, dequantized exactly into `out` (`out.len()` = K).
///
/// # Panics
/// When `n ≥ N`, `out` has the wrong length, or `p` was not [`PackedLinear::validate`]d (an
/// out-of-range index into a part).
pub fn dequantize_packed_row(p: &PackedLinear<'_>, n: usize, out: &mut [f32]) {
    let (nn, k) = (p.out_features, p.in_features);
    assert!(n < nn, "dequantize_packed_row: row {n} of {nn}");
    assert_eq!(out.len(), k, "dequantize_packed_row: output length");
    let g = p.scheme.group_size();
    let groups = p.num_groups();
    match p.scheme {
        PackedScheme::CtInt4 { symmetric, .. } => {
            let words = k / 8;
            for (kk, o) in out.iter_mut().enumerate() {
                let gr = group_of(p, kk, g);
                let q = nibble(&p.qweight, n * words + kk / 8, kk % 8);
                let zp = match (&p.zeros, symmetric) {
                    (Some(z), false) => nibble(z, (n / 8) * groups + gr, n % 8),
                    _ => 8,
                };
                *o = (q - zp) as f32 * float_at(&p.scales, n * groups + gr);
            }
        }
        PackedScheme::CtNvfp4 => {
            let gs = float_at(
                p.global_scale
                    .as_ref()
                    .expect("a validated NVFP4 linear has a global scale"),
                0,
            );
            let row = &p.qweight.data[n * (k / 2)..(n + 1) * (k / 2)];
            for (j, o) in out.chunks_exact_mut(2).enumerate() {
                let s = float_at(&p.scales, n * (k / 16) + (2 * j) / 16) / gs;
                o[0] = fp4_e2m1(row[j] & 0xF) * s;
                o[1] = fp4_e2m1(row[j] >> 4) * s;
            }
        }
        PackedScheme::AwqGemm { .. } => {
            let z = p.zeros.as_ref().expect("a validated AWQ linear has qzeros");
            let (cols, nib) = (nn / 8, AWQ_REVERSE_ORDER[n % 8]);
            for (kk, o) in out.iter_mut().enumerate() {
                let gr = kk / g;
                let q = nibble(&p.qweight, kk * cols + n / 8, nib);
                let zp = nibble(z, gr * cols + n / 8, nib);
                *o = (q - zp) as f32 * float_at(&p.scales, gr * nn + n);
            }
        }
        PackedScheme::Gptq { zero_minus_one, .. } => {
            let z = p
                .zeros
                .as_ref()
                .expect("a validated GPTQ linear has qzeros");
            let cols = nn / 8;
            for (kk, o) in out.iter_mut().enumerate() {
                let gr = group_of(p, kk, g);
                let q = nibble(&p.qweight, (kk / 8) * nn + n, kk % 8);
                let zp = nibble(z, gr * cols + n / 8, n % 8) + i32::from(zero_minus_one);
                *o = (q - zp) as f32 * float_at(&p.scales, gr * nn + n);
            }
        }
    }
}

/// The whole logical weight `[N, K]` in f32, row-major (tests and the reference matmul).
pub fn dequantize_packed(p: &PackedLinear<'_>) -> Vec<f32> {
    let k = p.in_features;
    let mut out = vec![0.0; p.out_features * k];
    for (n, row) in out.chunks_exact_mut(k).enumerate() {
        dequantize_packed_row(p, n, row);
    }
    out
}

#[cfg(test)]
mod tests;
