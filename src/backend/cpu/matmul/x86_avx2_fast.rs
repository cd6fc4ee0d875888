//! AVX2 integer-dot kernels of the fast mode (one 32-element block per 256-bit step).
//!
//! `vpmaddubsw` multiplies unsigned by signed bytes into saturating i16 pairs: 4-bit codes
//! (≤ 15) times activations (|q| ≤ 127) stay far below the i16 limit; for Q8_0 the usual sign
//! trick (|w| times q with w's sign) keeps every pair ≤ 2 · 128 · 127 = 32512. Per dot: one
//! 8-lane f32 accumulator (`acc += (dw·dx) · Σ-lanes`, blocks in order) plus, for Q4_1, a scalar
//! one for the `mw · dx · Σq` terms.

use std::arch::x86_64::*;

use super::fast::QuantizedRows;
use super::{layout, FastKernels};
use crate::tensor::WeightDType;

/// Token for the AVX2 fast kernels; exists only on CPUs with AVX2, FMA and F16C.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx2Fast(());

impl Avx2Fast {
    /// The token, if this CPU runs AVX2 + FMA + F16C.
    pub(super) fn detect() -> Option<Avx2Fast> {
        (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        .then_some(Avx2Fast(()))
    }
}

const MR: usize = 4;
const NR: usize = 2;

impl FastKernels for Avx2Fast {
    const MR: usize = MR;
    const NR: usize = NR;

    fn quantize(self, x: &[f32], m: usize, k: usize) -> QuantizedRows {
        assert_eq!(x.len(), m * k, "quantize [{m}, {k}]");
        let mut r = QuantizedRows::zeroed(m, k);
        // SAFETY: `self` exists only when the CPU has AVX2; `x` and `r` hold exactly
        // `m · k / 32` blocks (checked above and by `zeroed`).
        unsafe { quantize(x, &mut r) };
        r
    }

    fn tile(
        self,
        dtype: WeightDType,
        rows: &[u8],
        rb: usize,
        nr: usize,
        a: &QuantizedRows,
        i0: usize,
        mr: usize,
        out: &mut [f32],
    ) {
        assert!((1..=MR).contains(&mr) && (1..=NR).contains(&nr) && out.len() >= mr * nr);
        assert!(dtype.row_bytes(a.k) == Some(rb) && rows.len() >= nr * rb);
        assert!(a.qs.len() >= (i0 + mr) * a.k && a.d.len() >= (i0 + mr) * a.nb);
        // SAFETY: `self` exists only when the CPU has AVX2/FMA/F16C; the asserts above bound
        // every read: `nr` weight rows of `rb` bytes (`a.nb` blocks each) and activation rows
        // `i0 .. i0 + mr` of `a`.
        unsafe {
            macro_rules! dispatch {
                ($b:ty; $(($m:literal, $n:literal)),*) => {
                    match (mr, nr) {
                        $(($m, $n) => tile::<$b, $m, $n>(rows.as_ptr(), rb, a, i0, out),)*
                        _ => unreachable!(),
                    }
                };
            }
            match dtype {
                WeightDType::Q8_0 => {
                    dispatch!(Q8_0; (1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2))
                }
                WeightDType::Q4_0 => {
                    dispatch!(Q4_0; (1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2))
                }
                WeightDType::Q4_1 => {
                    dispatch!(Q4_1; (1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2))
                }
                _ => panic!("no integer dot for {dtype:?}"),
            }
        }
    }
}

/// A weight block as the integer dot needs it.
trait IntBlock {
    const BYTES: usize;
    /// Whether the `mw · dx · Σq` term exists (Q4_1).
    const HAS_MIN: bool;
    /// Activation-side correction added to the integer lanes (Q4_0: `−8 · Σq` in lane 0).
    const CORR: i32;
    /// (unsigned-side bytes, scale, min) of the block at `p`.
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32);
    /// 8 i32 lanes whose sum is `Σ w · x` (before the correction) for weights `w` from `load`.
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i;
}

struct Q8_0;
struct Q4_0;
struct Q4_1;

/// The f16 at `p` as f32, from the f16 table (an integer load and a table load).
#[inline(always)]
unsafe fn f16(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes at `p` (caller); the table has an entry for every u16.
    unsafe { *layout::f16_table().get_unchecked((p as *const u16).read_unaligned() as usize) }
}

/// 16 packed bytes at `p` as 32 bytes of codes in element order: low nibbles, then high.
#[inline(always)]
unsafe fn codes(p: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes at `p` (caller).
    unsafe {
        let q = _mm_loadu_si128(p as *const __m128i);
        let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
    }
}

/// Unsigned × signed bytes summed into 8 i32 lanes.
#[inline(always)]
unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 operations.
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
}

impl IntBlock for Q8_0 {
    const BYTES: usize = layout::Q8_0_BYTES;
    const HAS_MIN: bool = false;
    const CORR: i32 = 0;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        // SAFETY: 34 readable bytes at `p` (caller).
        unsafe { (_mm256_loadu_si256(p.add(2) as *const __m256i), f16(p), 0.0) }
    }
    #[inline(always)]
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 operations.
        unsafe { dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)) }
    }
}

impl IntBlock for Q4_0 {
    const BYTES: usize = layout::Q4_0_BYTES;
    const HAS_MIN: bool = false;
    const CORR: i32 = -8;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        // SAFETY: 18 readable bytes at `p` (caller).
        unsafe { (codes(p.add(2)), f16(p), 0.0) }
    }
    #[inline(always)]
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 operations.
        unsafe { dot_us(w, x) }
    }
}

impl IntBlock for Q4_1 {
    const BYTES: usize = layout::Q4_1_BYTES;
    const HAS_MIN: bool = true;
    const CORR: i32 = 0;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (__m256i, f32, f32) {
        // SAFETY: 20 readable bytes at `p` (caller).
        unsafe { (codes(p.add(4)), f16(p), f16(p.add(2))) }
    }
    #[inline(always)]
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 operations.
        unsafe { dot_us(w, x) }
    }
}

/// Every block of `x` into `r` (same operations as `QuantizedRows::new`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize(x: &[f32], r: &mut QuantizedRows) {
    for (b, ((d, sum), q)) in
        r.d.iter_mut()
            .zip(r.sum.iter_mut())
            .zip(r.qs.chunks_exact_mut(layout::QK))
            .enumerate()
    {
        // SAFETY: block `b` of `x` has 32 readable floats and `q` 32 writable bytes.
        unsafe {
            let p = x.as_ptr().add(b * layout::QK);
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let sign = _mm256_set1_ps(-0.0);
            let a = v.map(|v| _mm256_andnot_ps(sign, v));
            let m8 = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m1 = _mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1));
            let (scale, inv) = super::fast::block_scale(_mm_cvtss_f32(m1));
            let inv = _mm256_set1_ps(inv);
            let lim = _mm256_set1_epi32(127);
            let neg = _mm256_set1_epi32(-127);
            let qi = v.map(|v| {
                let t = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));
                _mm256_max_epi32(_mm256_min_epi32(t, lim), neg)
            });
            // Pack 4 × 8 i32 into 32 i8 in element order (packs interleave 128-bit lanes).
            let p16 = (
                _mm256_packs_epi32(qi[0], qi[1]),
                _mm256_packs_epi32(qi[2], qi[3]),
            );
            let p8 = _mm256_packs_epi16(p16.0, p16.1);
            let ordered =
                _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, ordered);
            let s8 = _mm256_add_epi32(
                _mm256_add_epi32(qi[0], qi[1]),
                _mm256_add_epi32(qi[2], qi[3]),
            );
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            *d = scale;
            *sum = _mm_cvtsi128_si32(s2) + _mm_extract_epi32(s2, 1);
        }
    }
}

/// Horizontal sum of 8 lanes (the same fixed order as the exact kernels).
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only AVX/SSE operations.
    unsafe {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
        _mm_cvtss_f32(s1)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<B: IntBlock, const M: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &QuantizedRows,
    i0: usize,
    out: &mut [f32],
) {
    // SAFETY: bounds checked by `Avx2Fast::tile`: `N` rows of `a.nb` blocks at `w`, activation
    // rows `i0 .. i0 + M` of `a`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); N]; M];
        let mut macc = [[0.0f32; N]; M];
        let qs = a.qs.as_ptr().add(i0 * a.k);
        for b in 0..a.nb {
            let mut wv = [_mm256_setzero_si256(); N];
            let mut dw = [0.0f32; N];
            let mut mw = [0.0f32; N];
            for j in 0..N {
                let (v, d, m) = B::load(w.add(j * rb + b * B::BYTES));
                wv[j] = v;
                dw[j] = d;
                mw[j] = m;
            }
            for i in 0..M {
                let row = (i0 + i) * a.nb + b;
                let xv = _mm256_loadu_si256(qs.add(i * a.k + b * layout::QK) as *const __m256i);
                let dx = *a.d.get_unchecked(row);
                let sum = *a.sum.get_unchecked(row);
                let corr = _mm256_zextsi128_si256(_mm_cvtsi32_si128(B::CORR * sum));
                for j in 0..N {
                    let mut p = B::dot(wv[j], xv);
                    if B::CORR != 0 {
                        p = _mm256_add_epi32(p, corr);
                    }
                    let s = _mm256_set1_ps(dw[j] * dx);
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[i][j]);
                    if B::HAS_MIN {
                        macc[i][j] += mw[j] * (dx * sum as f32);
                    }
                }
            }
        }
        for i in 0..M {
            for j in 0..N {
                out[i * N + j] = hsum(acc[i][j]) + macc[i][j];
            }
        }
    }
}
