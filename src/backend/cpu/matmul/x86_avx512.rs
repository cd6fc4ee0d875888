//! AVX-512 (F + BW) kernels: 16 f32 lanes per accumulator (`__m512`).
//!
//! Same contract as the AVX2 kernels: exact dequantization with a separate multiply and add in
//! ggml's order; every dot is `acc = fma(x, w, acc)` over 16-element vectors in `k` order
//! (the `k` tail through a masked load), then [`hsum`].

use std::arch::x86_64::*;

use super::{layout, ExactKernels};
use crate::tensor::WeightDType;

/// Token for the AVX-512 kernel set; exists only on CPUs with AVX-512 F/BW/VL, FMA and F16C.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx512(());

impl Avx512 {
    /// The token, if this CPU runs AVX-512 F + BW + VL (with FMA and F16C).
    pub(super) fn detect() -> Option<Avx512> {
        (is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        .then_some(Avx512(()))
    }
}

/// Register tile: activation rows.
const MR: usize = 4;
/// Register tile: weight rows (4 × 6 accumulators + 6 weights + 1 activation of 32 registers).
const NR: usize = 6;

impl ExactKernels for Avx512 {
    const LANES: usize = 16;
    const MR: usize = MR;
    const NR: usize = NR;

    fn dequant_row(self, dtype: WeightDType, row: &[u8], out: &mut [f32]) {
        assert_eq!(dtype.row_bytes(out.len()), Some(row.len()), "{dtype:?} row");
        // SAFETY: `self` exists only when the CPU has AVX-512 F/BW/VL, FMA and F16C; `row`
        // holds exactly `out.len()` elements of `dtype` (checked above).
        unsafe { dequant_row(dtype, row, out) }
    }

    fn has_gemv(self, dtype: WeightDType) -> bool {
        matches!(
            dtype,
            WeightDType::Q8_0 | WeightDType::Q4_0 | WeightDType::Q4_1
        )
    }

    fn gemv(self, dtype: WeightDType, rows: &[u8], rb: usize, x: &[f32], out: &mut [f32]) {
        assert_eq!(dtype.row_bytes(x.len()), Some(rb), "{dtype:?} row");
        assert_eq!(rows.len(), rb * out.len(), "gemv rows");
        // SAFETY: CPU features as above; `rows` holds `out.len()` rows of `rb` bytes, each
        // `x.len()` elements of `dtype` (checked above).
        unsafe {
            match dtype {
                WeightDType::Q8_0 => gemv::<Q8_0>(rows, rb, x, out),
                WeightDType::Q4_0 => gemv::<Q4_0>(rows, rb, x, out),
                WeightDType::Q4_1 => gemv::<Q4_1>(rows, rb, x, out),
                _ => panic!("no fused AVX-512 GEMV for {dtype:?}"),
            }
        }
    }

    fn tile(
        self,
        x: &[f32],
        k: usize,
        mr: usize,
        panel: &[f32],
        kp: usize,
        nr: usize,
        out: &mut [f32],
    ) {
        let k16 = k.next_multiple_of(16);
        assert!((1..=MR).contains(&mr) && (1..=NR).contains(&nr) && kp >= k16);
        assert!(x.len() >= mr * k && panel.len() >= (nr - 1) * kp + k16 && out.len() >= mr * nr);
        // SAFETY: CPU features as above; `x` has `mr` rows of `k`, `panel` has `nr` rows of
        // stride `kp` readable up to `k` rounded up to 16 (checked above), `out` has `mr × nr`.
        unsafe {
            tile_dispatch!(
                tile,
                mr,
                nr,
                (x.as_ptr(), k, panel.as_ptr(), kp, out),
                [1, 2, 3, 4],
                [1, 2, 3, 4, 5, 6]
            )
        }
    }
}

/// Horizontal sum of 16 lanes in a fixed order: halves added lane-wise down to 1.
#[inline(always)]
unsafe fn hsum(v: __m512) -> f32 {
    // SAFETY: register-only AVX-512/AVX/SSE operations; the caller enables AVX-512 F.
    unsafe {
        let s8 = _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
        );
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
        _mm_cvtss_f32(s1)
    }
}

/// The f16 at `p` as f32 in all 16 lanes, through the f16 table `t` (a broadcast load).
#[inline(always)]
unsafe fn splat_f16(p: *const u8, t: *const f32) -> __m512 {
    // SAFETY: 2 readable bytes at `p` (caller); `t` has an entry for every u16.
    unsafe { _mm512_set1_ps(*t.add((p as *const u16).read_unaligned() as usize)) }
}

/// A 32-element ggml block expanded into two 16-lane vectors, in element order.
trait Block {
    /// Stored bytes per block.
    const BYTES: usize;
    /// The block at `p`, exactly dequantized (`t`: the f16 table).
    ///
    /// # Safety
    /// `Self::BYTES` readable bytes at `p`; `t` is `layout::f16_table()`; AVX-512 F/BW enabled.
    unsafe fn load(p: *const u8, t: *const f32) -> [__m512; 2];
}

struct Q8_0;
struct Q4_0;
struct Q4_1;

impl Block for Q8_0 {
    const BYTES: usize = layout::Q8_0_BYTES;
    #[inline(always)]
    unsafe fn load(p: *const u8, t: *const f32) -> [__m512; 2] {
        // SAFETY: 34 readable bytes at `p` (caller).
        unsafe {
            let d = splat_f16(p, t);
            let q0 = _mm_loadu_si128(p.add(2) as *const __m128i);
            let q1 = _mm_loadu_si128(p.add(18) as *const __m128i);
            [
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d),
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d),
            ]
        }
    }
}

/// The 16 bytes at `p` zero-extended into the 32-bit lanes of (`lo`, `hi`): lane `i` of `lo`
/// holds byte `i` (low nibble in bits 0..4), lane `i` of `hi` holds byte `i >> 4` (high nibble
/// in bits 0..4). `vpermps` reads only bits 0..4 of each index lane, so no masking is needed.
#[inline(always)]
unsafe fn nibble_indices(p: *const u8) -> (__m512i, __m512i) {
    // SAFETY: 16 readable bytes at `p` (caller).
    unsafe {
        let z = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
        (z, _mm512_srli_epi32(z, 4))
    }
}

/// `[0.0, 1.0, …, 15.0]`: every 4-bit code as f32.
#[inline(always)]
unsafe fn codes() -> __m512 {
    // SAFETY: register-only AVX-512 F operation.
    unsafe {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    }
}

// Q4_0 / Q4_1 have only 16 possible values per block: build them once per block with ggml's
// own operations (`(q − 8) · d`, `q · d + m`, exact f32 products and sums of the same
// operands, so bit-identical) and look each element up with `vpermps`.

impl Block for Q4_0 {
    const BYTES: usize = layout::Q4_0_BYTES;
    #[inline(always)]
    unsafe fn load(p: *const u8, t: *const f32) -> [__m512; 2] {
        // SAFETY: 18 readable bytes at `p` (caller).
        unsafe {
            let d = splat_f16(p, t);
            let table = _mm512_mul_ps(_mm512_sub_ps(codes(), _mm512_set1_ps(8.0)), d);
            let (lo, hi) = nibble_indices(p.add(2));
            [
                _mm512_permutexvar_ps(lo, table),
                _mm512_permutexvar_ps(hi, table),
            ]
        }
    }
}

impl Block for Q4_1 {
    const BYTES: usize = layout::Q4_1_BYTES;
    #[inline(always)]
    unsafe fn load(p: *const u8, t: *const f32) -> [__m512; 2] {
        // SAFETY: 20 readable bytes at `p` (caller).
        unsafe {
            let d = splat_f16(p, t);
            let m = splat_f16(p.add(2), t);
            let table = _mm512_add_ps(_mm512_mul_ps(codes(), d), m);
            let (lo, hi) = nibble_indices(p.add(4));
            [
                _mm512_permutexvar_ps(lo, table),
                _mm512_permutexvar_ps(hi, table),
            ]
        }
    }
}

/// Fused dequantize-and-dot of `out.len()` rows with `x`, four rows at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn gemv<B: Block>(rows: &[u8], rb: usize, x: &[f32], out: &mut [f32]) {
    let nb = x.len() / layout::QK;
    let mut r = 0;
    while r + 4 <= out.len() {
        // SAFETY: rows r..r+4 exist (`rows.len() = rb · out.len()`), each with `nb` blocks of
        // `B::BYTES`; `x` has `nb · 32` elements.
        unsafe { gemv_rows::<B, 4>(rows.as_ptr().add(r * rb), rb, nb, x.as_ptr(), &mut out[r..]) };
        r += 4;
    }
    while r < out.len() {
        // SAFETY: row r exists, as above.
        unsafe { gemv_rows::<B, 1>(rows.as_ptr().add(r * rb), rb, nb, x.as_ptr(), &mut out[r..]) };
        r += 1;
    }
}

#[inline(always)]
unsafe fn gemv_rows<B: Block, const R: usize>(
    w: *const u8,
    rb: usize,
    nb: usize,
    x: *const f32,
    out: &mut [f32],
) {
    // SAFETY: bounds guaranteed by the caller (`gemv`).
    unsafe {
        let t = layout::f16_table().as_ptr();
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            let xp = x.add(b * layout::QK);
            let xv = [_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16))];
            for r in 0..R {
                let wv = B::load(w.add(r * rb + b * B::BYTES), t);
                acc[r] = _mm512_fmadd_ps(xv[0], wv[0], acc[r]);
                acc[r] = _mm512_fmadd_ps(xv[1], wv[1], acc[r]);
            }
        }
        for r in 0..R {
            out[r] = hsum(acc[r]);
        }
    }
}

/// `M × N` dots of activation rows (stride `k`) with panel rows (stride `kp`, zero padded).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn tile<const M: usize, const N: usize>(
    x: *const f32,
    k: usize,
    panel: *const f32,
    kp: usize,
    out: &mut [f32],
) {
    // SAFETY: `M` rows of `k` floats at `x`, `N` rows of stride `kp` readable up to `k`
    // rounded up to 16 at `panel` (caller); the tail reads of `x` are masked.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); N]; M];
        let full = k / 16;
        for v in 0..full {
            let mut w = [_mm512_setzero_ps(); N];
            for j in 0..N {
                w[j] = _mm512_loadu_ps(panel.add(j * kp + v * 16));
            }
            for i in 0..M {
                let xv = _mm512_loadu_ps(x.add(i * k + v * 16));
                for j in 0..N {
                    acc[i][j] = _mm512_fmadd_ps(xv, w[j], acc[i][j]);
                }
            }
        }
        if !k.is_multiple_of(16) {
            let mask: __mmask16 = (1u16 << (k % 16)) - 1;
            for i in 0..M {
                let xv = _mm512_maskz_loadu_ps(mask, x.add(i * k + full * 16));
                for j in 0..N {
                    let w = _mm512_loadu_ps(panel.add(j * kp + full * 16));
                    acc[i][j] = _mm512_fmadd_ps(xv, w, acc[i][j]);
                }
            }
        }
        for i in 0..M {
            for j in 0..N {
                out[i * N + j] = hsum(acc[i][j]);
            }
        }
    }
}

/// Exact dequantization of one row with AVX-512 (K-quants through the scalar code).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn dequant_row(dtype: WeightDType, row: &[u8], out: &mut [f32]) {
    let k = out.len();
    let o = out.as_mut_ptr();
    let p = row.as_ptr();
    // SAFETY: in every arm, `row` holds exactly `k` elements of `dtype` (caller), so each block
    // or 16-element group read below is in bounds, and each store is within `out[..k]`.
    unsafe {
        match dtype {
            WeightDType::F32 => std::ptr::copy_nonoverlapping(p, o as *mut u8, 4 * k),
            WeightDType::F16 => {
                let mut t = 0;
                while t + 16 <= k {
                    let h = _mm256_loadu_si256(p.add(2 * t) as *const __m256i);
                    _mm512_storeu_ps(o.add(t), _mm512_cvtph_ps(h));
                    t += 16;
                }
                layout::dequant_row(dtype, &row[2 * t..], &mut out[t..]);
            }
            WeightDType::BF16 => {
                let mut t = 0;
                while t + 16 <= k {
                    let h = _mm256_loadu_si256(p.add(2 * t) as *const __m256i);
                    let w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
                    _mm512_storeu_ps(o.add(t), _mm512_castsi512_ps(w));
                    t += 16;
                }
                layout::dequant_row(dtype, &row[2 * t..], &mut out[t..]);
            }
            WeightDType::Q8_0 => blocks::<Q8_0>(p, k, o),
            WeightDType::Q4_0 => blocks::<Q4_0>(p, k, o),
            WeightDType::Q4_1 => blocks::<Q4_1>(p, k, o),
            WeightDType::Q4K
            | WeightDType::Q6K
            | WeightDType::I32
            | WeightDType::I64
            | WeightDType::U8
            | WeightDType::I8
            | WeightDType::F8E4M3 => layout::dequant_row(dtype, row, out),
        }
    }
}

/// Dequantize `k / 32` blocks of `B` from `p` into `o`.
#[inline(always)]
unsafe fn blocks<B: Block>(p: *const u8, k: usize, o: *mut f32) {
    // SAFETY: `k / 32` blocks readable at `p` and `k` floats writable at `o` (caller).
    unsafe {
        let t = layout::f16_table().as_ptr();
        for b in 0..k / layout::QK {
            let [v0, v1] = B::load(p.add(b * B::BYTES), t);
            _mm512_storeu_ps(o.add(b * layout::QK), v0);
            _mm512_storeu_ps(o.add(b * layout::QK + 16), v1);
        }
    }
}
