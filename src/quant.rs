//! ggml block layouts and their exact reference dequantization, one row at a time.
//!
//! A quantized row of `n` elements is `n / block_elems` consecutive blocks; every block below is
//! `#[repr(C)]`, has no padding, is `bytemuck::Pod`, and has the byte size ggml's
//! `static_assert`s give (`block_q4_0` = 18, `block_q4_1` = 20, `block_q8_0` = 34,
//! `block_q4_K` = 144, `block_q6_K` = 210). Their alignment is 2 (the `f16` fields), so a row
//! from a GGUF map (offsets aligned to 32) can be viewed as `&[Block]` with [`blocks`]; the CPU
//! kernels in `src/backend/cpu/` read the same structs.
//!
//! [`dequantize_row`] reproduces ggml's `dequantize_row_*` reference functions bit for bit:
//! every product and sum is a separately rounded f32 operation in ggml's order (no fused
//! multiply-add), and f16 → f32 is exact. Element `j` of block `i` lands at `out[i * QK + j]`
//! with the in-block orders documented on each struct.

pub mod packed;

use half::{bf16, f16};

use crate::tensor::{TensorView, WeightDType};

/// Elements per block of the 32-element formats (`QK4_0`, `QK4_1`, `QK8_0`).
pub const QK: usize = 32;
/// Elements per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in a `block_q4_K` (`K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// `block_q8_0`: 32 elements `x[j] = qs[j] · d`.
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants, element `j` in `qs[j]`.
    pub qs: [i8; QK],
}

/// `block_q4_0`: 32 elements `x[j] = (nibble_j − 8) · d`; element `j < 16` is the low nibble of
/// `qs[j]`, element `j + 16` its high nibble.
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}

/// `block_q4_1`: 32 elements `x[j] = nibble_j · d + m`, nibble order as [`BlockQ4_0`].
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (added after scaling).
    pub m: f16,
    /// Nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}

/// `block_q4_K`: 256 elements in 8 sub-blocks of 32, each with a 6-bit scale `sc` and min `mn`
/// (packed in `scales`, see [`BlockQ4K::scale_min`]): `x = (d·sc) · nibble − (dmin·mn)`.
/// Sub-blocks come in pairs over 32 bytes of `qs`: for chunk `c` (0..4) and `l` (0..32),
/// element `64c + l` is the low nibble of `qs[32c + l]` (sub-block `2c`), element `64c + 32 + l`
/// its high nibble (sub-block `2c + 1`).
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    /// Super-block scale for the sub-block scales.
    pub d: f16,
    /// Super-block scale for the sub-block mins.
    pub dmin: f16,
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// Nibbles.
    pub qs: [u8; QK_K / 2],
}

impl BlockQ4K {
    /// Scale and min (each 0..64) of sub-block `j` (0..8), ggml's `get_scale_min_k4`: sub-blocks
    /// 0–3 use the low 6 bits of `scales[j]` / `scales[j + 4]`; sub-blocks 4–7 take their low 4
    /// bits from `scales[j + 4]` (scale: low nibble, min: high nibble) and their top 2 bits from
    /// the top bits of `scales[j − 4]` (scale) and `scales[j]` (min).
    pub fn scale_min(&self, j: usize) -> (u8, u8) {
        let q = &self.scales;
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }
}

/// `block_q6_K`: 256 elements in 16 sub-blocks of 16 with signed 8-bit scales:
/// `x = d · sc · (q − 32)`, `q` 6 bits = 4 low bits from `ql` + 2 high bits from `qh`.
/// Two halves of 128 elements (`h` = 0, 1; `ql` advances 64, `qh` 32, `scales` 8 per half);
/// within a half, for `l` in 0..32:
/// - element `l`:      low nibble of `ql[l]`,      bits 0–1 of `qh[l]`, scale `scales[l/16]`
/// - element `l + 32`: low nibble of `ql[l + 32]`, bits 2–3 of `qh[l]`, scale `scales[l/16 + 2]`
/// - element `l + 64`: high nibble of `ql[l]`,     bits 4–5 of `qh[l]`, scale `scales[l/16 + 4]`
/// - element `l + 96`: high nibble of `ql[l + 32]`, bits 6–7 of `qh[l]`, scale `scales[l/16 + 6]`
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// A ggml block type and its dequantization.
pub trait QuantBlock: bytemuck::Pod {
    /// The [`WeightDType`] stored as these blocks.
    const DTYPE: WeightDType;
    /// Elements per block.
    const ELEMS: usize;
    /// Writes the block's `ELEMS` values into `out[..ELEMS]`, exactly as ggml's reference.
    fn dequantize(&self, out: &mut [f32]);
}

impl QuantBlock for BlockQ8_0 {
    const DTYPE: WeightDType = WeightDType::Q8_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, &q) in out[..QK].iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }
}

impl QuantBlock for BlockQ4_0 {
    const DTYPE: WeightDType = WeightDType::Q4_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, &b) in self.qs.iter().enumerate() {
            let x0 = i32::from(b & 0x0F) - 8;
            let x1 = i32::from(b >> 4) - 8;
            out[j] = x0 as f32 * d;
            out[j + QK / 2] = x1 as f32 * d;
        }
    }
}

impl QuantBlock for BlockQ4_1 {
    const DTYPE: WeightDType = WeightDType::Q4_1;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let m = self.m.to_f32();
        for (j, &b) in self.qs.iter().enumerate() {
            let x0 = f32::from(b & 0x0F);
            let x1 = f32::from(b >> 4);
            out[j] = x0 * d + m;
            out[j + QK / 2] = x1 * d + m;
        }
    }
}

impl QuantBlock for BlockQ4K {
    const DTYPE: WeightDType = WeightDType::Q4K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        for c in 0..QK_K / 64 {
            let (sc1, m1) = self.scale_min(2 * c);
            let (sc2, m2) = self.scale_min(2 * c + 1);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let q = &self.qs[32 * c..32 * c + 32];
            let y = &mut out[64 * c..64 * c + 64];
            for l in 0..32 {
                y[l] = d1 * f32::from(q[l] & 0xF) - m1;
                y[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
            }
        }
    }
}

impl QuantBlock for BlockQ6K {
    const DTYPE: WeightDType = WeightDType::Q6K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for h in 0..2 {
            let ql = &self.ql[64 * h..64 * h + 64];
            let qh = &self.qh[32 * h..32 * h + 32];
            let sc = &self.scales[8 * h..8 * h + 8];
            let y = &mut out[128 * h..128 * h + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                // ggml: `d * sc[is] * q` evaluates (d · sc) first, then · q.
                y[l] = d * f32::from(sc[is]) * q1 as f32;
                y[l + 32] = d * f32::from(sc[is + 2]) * q2 as f32;
                y[l + 64] = d * f32::from(sc[is + 4]) * q3 as f32;
                y[l + 96] = d * f32::from(sc[is + 6]) * q4 as f32;
            }
        }
    }
}

/// `bytes` viewed as blocks of `B`, or `None` when `bytes` is not a whole number of blocks or
/// is not 2-byte aligned (mapped GGUF tensors always are).
pub fn blocks<B: QuantBlock>(bytes: &[u8]) -> Option<&[B]> {
    bytemuck::try_cast_slice(bytes).ok()
}

/// Dequantizes every block of `bytes` into `out` (aligned or not).
fn dequantize_blocks<B: QuantBlock>(bytes: &[u8], out: &mut [f32]) {
    let size = std::mem::size_of::<B>();
    match blocks::<B>(bytes) {
        Some(bs) => {
            for (b, y) in bs.iter().zip(out.chunks_exact_mut(B::ELEMS)) {
                b.dequantize(y);
            }
        }
        None => {
            for (chunk, y) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(B::ELEMS)) {
                bytemuck::pod_read_unaligned::<B>(chunk).dequantize(y);
            }
        }
    }
}

/// Dequantizes one stored row (`bytes` = `dtype.row_bytes(out.len())` bytes) into `out`, exactly
/// as ggml's reference `dequantize_row_*` / `ggml_fp16_to_fp32_row` / `ggml_bf16_to_fp32_row`.
/// Plain floats are little-endian and may be unaligned.
///
/// # Panics
/// When `out.len()` is not a whole number of blocks or `bytes` has the wrong length for it
/// (the caller sizes both from the tensor shape; a mismatch is a bug, as in ggml's asserts).
pub fn dequantize_row(dtype: WeightDType, bytes: &[u8], out: &mut [f32]) {
    let expected = dtype.row_bytes(out.len());
    assert_eq!(
        expected,
        Some(bytes.len()),
        "dequantize_row: {dtype:?} row of {} elements needs {expected:?} bytes, got {}",
        out.len(),
        bytes.len()
    );
    match dtype {
        WeightDType::F32 => {
            for (y, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *y = f32::from_le_bytes(c.try_into().expect("chunk of 4"));
            }
        }
        WeightDType::F16 => {
            for (y, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightDType::BF16 => {
            for (y, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightDType::Q8_0 => dequantize_blocks::<BlockQ8_0>(bytes, out),
        WeightDType::Q4_0 => dequantize_blocks::<BlockQ4_0>(bytes, out),
        WeightDType::Q4_1 => dequantize_blocks::<BlockQ4_1>(bytes, out),
        WeightDType::Q4K => dequantize_blocks::<BlockQ4K>(bytes, out),
        WeightDType::Q6K => dequantize_blocks::<BlockQ6K>(bytes, out),
        // The parts of packed linears, element by element (exact except i32 / i64 values
        // beyond 2^24, which no part holds as a value: words are unpacked, not converted).
        WeightDType::I32 => {
            for (y, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *y = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
            }
        }
        WeightDType::I64 => {
            for (y, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                *y = i64::from_le_bytes(c.try_into().expect("chunk of 8")) as f32;
            }
        }
        WeightDType::U8 => {
            for (y, &b) in out.iter_mut().zip(bytes) {
                *y = f32::from(b);
            }
        }
        WeightDType::I8 => {
            for (y, &b) in out.iter_mut().zip(bytes) {
                *y = f32::from(b as i8);
            }
        }
        WeightDType::F8E4M3 => {
            for (y, &b) in out.iter_mut().zip(bytes) {
                *y = packed::fp8_e4m3_to_f32(b);
            }
        }
    }
}

/// Row `row` of a tensor viewed as `[rows, shape.last()]`, dequantized into `out`
/// (`out.len()` = `shape.last()`).
///
/// # Panics
/// When `row` is out of range or `out` has the wrong length.
pub fn dequantize_view_row(view: &TensorView<'_>, row: usize, out: &mut [f32]) {
    let cols = view.shape.last().copied().unwrap_or(1);
    assert_eq!(out.len(), cols, "dequantize_view_row: output length");
    let row_bytes = view
        .dtype
        .row_bytes(cols)
        .expect("a TensorView's last axis is whole blocks");
    let start = row * row_bytes;
    dequantize_row(view.dtype, &view.data[start..start + row_bytes], out);
}

/// The whole tensor as f32, row-major in its Hugging Face shape (the exact reference path; the
/// engine's fast path reads the blocks directly instead).
pub fn dequantize_view(view: &TensorView<'_>) -> Vec<f32> {
    let cols = view.shape.last().copied().unwrap_or(1);
    let mut out = vec![0.0; view.numel()];
    if cols == 0 {
        return out;
    }
    let row_bytes = view
        .dtype
        .row_bytes(cols)
        .expect("a TensorView's last axis is whole blocks");
    for (y, x) in out
        .chunks_exact_mut(cols)
        .zip(view.data.chunks_exact(row_bytes))
    {
        dequantize_row(view.dtype, x, y);
    }
    out
}

#[cfg(test)]
mod tests;
