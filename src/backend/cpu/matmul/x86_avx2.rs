//! AVX2 + FMA + F16C kernels: 8 f32 lanes per accumulator (`__m256`).
//!
//! Exact dequantization uses a separate multiply and add (never FMA), in ggml's order, so the
//! values equal `layout::dequant_row` bit for bit. Every dot is `acc = fma(x, w, acc)` over
//! 8-element vectors in `k` order, then [`hsum`].

use std::arch::x86_64::*;

use super::{layout, ExactKernels};
use crate::tensor::WeightDType;

/// Token for the AVX2 kernel set; exists only on CPUs with AVX2, FMA and F16C.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx2(());

impl Avx2 {
    /// The token, if this CPU runs AVX2 + FMA + F16C.
    pub(super) fn detect() -> Option<Avx2> {
        (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        .then_some(Avx2(()))
    }
}

/// Register tile: activation rows.
const MR: usize = 4;
/// Register tile: weight rows (4 × 3 accumulators + 3 weights + 1 activation = 16 registers).
const NR: usize = 3;

impl ExactKernels for Avx2 {
    const LANES: usize = 8;
    const MR: usize = MR;
    const NR: usize = NR;

    fn dequant_row(self, dtype: WeightDType, row: &[u8], out: &mut [f32]) {
        assert_eq!(dtype.row_bytes(out.len()), Some(row.len()), "{dtype:?} row");
        // SAFETY: `self` exists only when the CPU has AVX2/FMA/F16C; `row` holds exactly
        // `out.len()` elements of `dtype` (checked above).
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
                _ => panic!("no fused AVX2 GEMV for {dtype:?}"),
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
        let k8 = k.next_multiple_of(8);
        assert!((1..=MR).contains(&mr) && (1..=NR).contains(&nr) && kp >= k8);
        assert!(x.len() >= mr * k && panel.len() >= (nr - 1) * kp + k8 && out.len() >= mr * nr);
        // SAFETY: CPU features as above; `x` has `mr` rows of `k`, `panel` has `nr` rows of
        // stride `kp` readable up to `k` rounded up to 8 (checked above), `out` has `mr × nr`.
        unsafe {
            tile_dispatch!(
                tile,
                mr,
                nr,
                (x.as_ptr(), k, panel.as_ptr(), kp, out),
                [1, 2, 3, 4],
                [1, 2, 3]
            )
        }
    }
}

/// Horizontal sum of 8 lanes in a fixed order: (l0+l4, l1+l5, l2+l6, l3+l7), then pairs.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only AVX/SSE operations; the caller runs with AVX enabled.
    unsafe {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
        _mm_cvtss_f32(s1)
    }
}

/// The f16 at `p` as f32 in all 8 lanes, through the f16 table `t` (a broadcast load).
#[inline(always)]
unsafe fn splat_f16(p: *const u8, t: *const f32) -> __m256 {
    // SAFETY: 2 readable bytes at `p` (caller); `t` has an entry for every u16.
    unsafe { _mm256_set1_ps(*t.add((p as *const u16).read_unaligned() as usize)) }
}

/// Lanes 0..8 of 8 bytes, zero- or sign-extended, as f32.
#[inline(always)]
unsafe fn u8x8_to_f32(v: __m128i) -> __m256 {
    // SAFETY: register-only AVX2 operations.
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)) }
}

#[inline(always)]
unsafe fn i8x8_to_f32(v: __m128i) -> __m256 {
    // SAFETY: register-only AVX2 operations.
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)) }
}

/// A 32-element ggml block the fused kernels expand into four 8-lane vectors, in element order.
trait Block {
    /// Stored bytes per block.
    const BYTES: usize;
    /// The block at `p`, exactly dequantized (`t`: the f16 table).
    ///
    /// # Safety
    /// `Self::BYTES` readable bytes at `p`; `t` is `layout::f16_table()`; AVX2/FMA enabled.
    unsafe fn load(p: *const u8, t: *const f32) -> [__m256; 4];
}

struct Q8_0;
struct Q4_0;
struct Q4_1;

impl Block for Q8_0 {
    const BYTES: usize = layout::Q8_0_BYTES;
    #[inline(always)]
    unsafe fn load(p: *const u8, t: *const f32) -> [__m256; 4] {
        // SAFETY: 34 readable bytes at `p` (caller); unaligned loads of 8 bytes at 2..34.
        unsafe {
            let d = splat_f16(p, t);
            let q = |i: usize| _mm_loadl_epi64(p.add(2 + 8 * i) as *const __m128i);
            [
                _mm256_mul_ps(i8x8_to_f32(q(0)), d),
                _mm256_mul_ps(i8x8_to_f32(q(1)), d),
                _mm256_mul_ps(i8x8_to_f32(q(2)), d),
                _mm256_mul_ps(i8x8_to_f32(q(3)), d),
            ]
        }
    }
}

/// The 16 packed nibble bytes at `p` as (low nibbles, high nibbles), one per byte.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (__m128i, __m128i) {
    // SAFETY: 16 readable bytes at `p` (caller).
    unsafe {
        let q = _mm_loadu_si128(p as *const __m128i);
        let mask = _mm_set1_epi8(0x0f);
        (
            _mm_and_si128(q, mask),
            _mm_and_si128(_mm_srli_epi16(q, 4), mask),
        )
    }
}

impl Block for Q4_0 {
    const BYTES: usize = layout::Q4_0_BYTES;
    #[inline(always)]
    unsafe fn load(p: *const u8, t: *const f32) -> [__m256; 4] {
        // SAFETY: 18 readable bytes at `p` (caller).
        unsafe {
            let d = splat_f16(p, t);
            let (lo, hi) = nibbles(p.add(2));
            let eight = _mm_set1_epi8(8);
            let (lo, hi) = (_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight));
            [
                _mm256_mul_ps(i8x8_to_f32(lo), d),
                _mm256_mul_ps(i8x8_to_f32(_mm_unpackhi_epi64(lo, lo)), d),
                _mm256_mul_ps(i8x8_to_f32(hi), d),
                _mm256_mul_ps(i8x8_to_f32(_mm_unpackhi_epi64(hi, hi)), d),
            ]
        }
    }
}

impl Block for Q4_1 {
    const BYTES: usize = layout::Q4_1_BYTES;
    #[inline(always)]
    unsafe fn load(p: *const u8, t: *const f32) -> [__m256; 4] {
        // SAFETY: 20 readable bytes at `p` (caller).
        unsafe {
            let d = splat_f16(p, t);
            let m = splat_f16(p.add(2), t);
            let (lo, hi) = nibbles(p.add(4));
            let f = |v: __m128i| _mm256_add_ps(_mm256_mul_ps(u8x8_to_f32(v), d), m);
            [
                f(lo),
                f(_mm_unpackhi_epi64(lo, lo)),
                f(hi),
                f(_mm_unpackhi_epi64(hi, hi)),
            ]
        }
    }
}

/// Fused dequantize-and-dot of `out.len()` rows with `x`, four rows at a time (one activation
/// load feeds four rows; one accumulator per row).
#[target_feature(enable = "avx2,fma,f16c")]
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
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let xp = x.add(b * layout::QK);
            let xv = [
                _mm256_loadu_ps(xp),
                _mm256_loadu_ps(xp.add(8)),
                _mm256_loadu_ps(xp.add(16)),
                _mm256_loadu_ps(xp.add(24)),
            ];
            for r in 0..R {
                let wv = B::load(w.add(r * rb + b * B::BYTES), t);
                for v in 0..4 {
                    acc[r] = _mm256_fmadd_ps(xv[v], wv[v], acc[r]);
                }
            }
        }
        for r in 0..R {
            out[r] = hsum(acc[r]);
        }
    }
}

/// Mask of the first `n` (< 8) lanes, for `_mm256_maskload_ps`.
#[inline(always)]
unsafe fn tail_mask(n: usize) -> __m256i {
    // SAFETY: register-only AVX operations.
    unsafe {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx)
    }
}

/// `M × N` dots of activation rows (stride `k`) with panel rows (stride `kp`, zero padded).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const M: usize, const N: usize>(
    x: *const f32,
    k: usize,
    panel: *const f32,
    kp: usize,
    out: &mut [f32],
) {
    // SAFETY: `M` rows of `k` floats at `x`, `N` rows of stride `kp` readable up to `k`
    // rounded up to 8 at `panel` (caller); the tail reads of `x` are masked.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); N]; M];
        let full = k / 8;
        for v in 0..full {
            let mut w = [_mm256_setzero_ps(); N];
            for j in 0..N {
                w[j] = _mm256_loadu_ps(panel.add(j * kp + v * 8));
            }
            for i in 0..M {
                let xv = _mm256_loadu_ps(x.add(i * k + v * 8));
                for j in 0..N {
                    acc[i][j] = _mm256_fmadd_ps(xv, w[j], acc[i][j]);
                }
            }
        }
        if !k.is_multiple_of(8) {
            let mask = tail_mask(k % 8);
            for i in 0..M {
                let xv = _mm256_maskload_ps(x.add(i * k + full * 8), mask);
                for j in 0..N {
                    let w = _mm256_loadu_ps(panel.add(j * kp + full * 8));
                    acc[i][j] = _mm256_fmadd_ps(xv, w, acc[i][j]);
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

/// Exact dequantization of one row with AVX2 (K-quants through the scalar code).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_row(dtype: WeightDType, row: &[u8], out: &mut [f32]) {
    let k = out.len();
    let o = out.as_mut_ptr();
    let p = row.as_ptr();
    // SAFETY: in every arm, `row` holds exactly `k` elements of `dtype` (caller), so each block
    // or 8-element group read below is in bounds, and each store is within `out[..k]`.
    unsafe {
        match dtype {
            WeightDType::F32 => std::ptr::copy_nonoverlapping(p, o as *mut u8, 4 * k),
            WeightDType::F16 => {
                let mut t = 0;
                while t + 8 <= k {
                    let h = _mm_loadu_si128(p.add(2 * t) as *const __m128i);
                    _mm256_storeu_ps(o.add(t), _mm256_cvtph_ps(h));
                    t += 8;
                }
                layout::dequant_row(dtype, &row[2 * t..], &mut out[t..]);
            }
            WeightDType::BF16 => {
                let mut t = 0;
                while t + 8 <= k {
                    let h = _mm_loadu_si128(p.add(2 * t) as *const __m128i);
                    let w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
                    _mm256_storeu_ps(o.add(t), _mm256_castsi256_ps(w));
                    t += 8;
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
            let v = B::load(p.add(b * B::BYTES), t);
            for (i, v) in v.into_iter().enumerate() {
                _mm256_storeu_ps(o.add(b * layout::QK + 8 * i), v);
            }
        }
    }
}
