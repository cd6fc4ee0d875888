//! ggml block layouts as the matmul kernels read them, and the exact scalar dequantization of
//! one row (the portable fallback, and the panel fill for the K-quants on every ISA).
//!
//! Layouts (little-endian, no padding; `d`, `m`, `dmin` are IEEE f16):
//! - Q8_0 (34 bytes / 32 elements): `d`, `qs: [i8; 32]`; `w[j] = qs[j] · d`.
//! - Q4_0 (18 bytes / 32): `d`, `qs: [u8; 16]`; `w[j] = ((qs[j] & 15) − 8) · d`,
//!   `w[j + 16] = ((qs[j] >> 4) − 8) · d`.
//! - Q4_1 (20 bytes / 32): `d`, `m`, `qs: [u8; 16]`; `w[j] = (qs[j] & 15) · d + m`,
//!   `w[j + 16] = (qs[j] >> 4) · d + m`.
//! - Q4_K (144 bytes / 256): `d`, `dmin`, `scales: [u8; 12]` (eight 6-bit scale/min pairs),
//!   `qs: [u8; 128]`; sub-block `s` of 32 elements: `w = (d · sc_s) · q − dmin · m_s`.
//! - Q6_K (210 bytes / 256): `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d`;
//!   `w = (d · sc) · (q6 − 32)` with one scale per 16 elements.
//!
//! "Exact" means each weight is computed with the same f32 operations, in the same order, as
//! ggml's reference `dequantize_row_*` (product, then sum: never a fused multiply-add), so the
//! SIMD kernels, this scalar code and the reference all produce the same bits.

use std::sync::OnceLock;

use half::{bf16, f16};

use crate::tensor::WeightDType;

/// Bytes of a Q8_0 block.
pub(super) const Q8_0_BYTES: usize = 34;
/// Bytes of a Q4_0 block.
pub(super) const Q4_0_BYTES: usize = 18;
/// Bytes of a Q4_1 block.
pub(super) const Q4_1_BYTES: usize = 20;
/// Elements per Q8_0 / Q4_0 / Q4_1 block.
pub(super) const QK: usize = 32;

/// The f16 at `b[i..i + 2]` as f32.
#[inline(always)]
pub(super) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Every f16 (by its bits) as f32: 256 KiB, built once. The SIMD kernels read a block's scale
/// with an integer load and a broadcast straight from this table (load-port work only) instead
/// of a `vcvtph2ps` and a register broadcast on the vector ports.
pub(super) fn f16_table() -> &'static [f32] {
    static TABLE: OnceLock<Box<[f32]>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|h| f16::from_bits(h).to_f32()).collect())
}

/// Dequantize the whole stored row `row` (`dtype.row_bytes(out.len())` bytes) into `out`.
///
/// # Panics
/// If `row` does not hold exactly `out.len()` elements of `dtype`.
pub(super) fn dequant_row(dtype: WeightDType, row: &[u8], out: &mut [f32]) {
    assert_eq!(
        dtype.row_bytes(out.len()),
        Some(row.len()),
        "a {dtype:?} row of {} elements",
        out.len()
    );
    match dtype {
        WeightDType::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        WeightDType::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WeightDType::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WeightDType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(Q8_0_BYTES)) {
                let d = f16_at(b, 0);
                for (o, &q) in o.iter_mut().zip(&b[2..]) {
                    *o = (q as i8) as f32 * d;
                }
            }
        }
        WeightDType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(Q4_0_BYTES)) {
                let d = f16_at(b, 0);
                for (j, &q) in b[2..].iter().enumerate() {
                    o[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
                    o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        WeightDType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(Q4_1_BYTES)) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for (j, &q) in b[4..].iter().enumerate() {
                    o[j] = (q & 0x0f) as f32 * d + m;
                    o[j + 16] = (q >> 4) as f32 * d + m;
                }
            }
        }
        WeightDType::Q4K => {
            for (o, b) in out.chunks_exact_mut(256).zip(row.chunks_exact(144)) {
                dequant_q4k_block(b, o);
            }
        }
        WeightDType::Q6K => {
            for (o, b) in out.chunks_exact_mut(256).zip(row.chunks_exact(210)) {
                dequant_q6k_block(b, o);
            }
        }
        // Parts of packed linears are never a matmul weight (`WeightDType::is_weight`); their
        // element values, for completeness.
        WeightDType::I32
        | WeightDType::I64
        | WeightDType::U8
        | WeightDType::I8
        | WeightDType::F8E4M3 => crate::quant::dequantize_row(dtype, row, out),
    }
}

/// The 6-bit scale and min of Q4_K sub-block `j` (0..8) from the 12 packed `scales` bytes:
/// sub-blocks 0..4 keep theirs in the low 6 bits of bytes `j` / `j + 4`; sub-blocks 4..8 combine
/// a nibble of byte `j + 4` with the top 2 bits of bytes `j − 4` / `j`.
#[inline(always)]
fn q4k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// One Q4_K super-block (144 bytes) into 256 values. Each group of 64 elements reads 32 bytes
/// of `qs`: low nibbles are the first 32 elements (sub-block `2g`), high nibbles the next 32.
fn dequant_q4k_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for g in 0..4 {
        let (sc1, m1) = q4k_scale_min(2 * g, scales);
        let (sc2, m2) = q4k_scale_min(2 * g + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * g..32 * g + 32];
        let o = &mut out[64 * g..64 * g + 64];
        for l in 0..32 {
            o[l] = d1 * (q[l] & 0x0f) as f32 - min1;
            o[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

/// One Q6_K super-block (210 bytes) into 256 values, in two halves of 128: each half reads 64
/// bytes of `ql` (low nibbles), 32 of `qh` (2 high bits × 4) and 8 scales.
fn dequant_q6k_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let o = &mut out[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |i: usize| d * (sc[i] as i8) as f32;
            o[l] = s(is) * q1 as f32;
            o[l + 32] = s(is + 2) * q2 as f32;
            o[l + 64] = s(is + 4) * q3 as f32;
            o[l + 96] = s(is + 6) * q4 as f32;
        }
    }
}
