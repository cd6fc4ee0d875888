//! AVX-512 VNNI (+ VBMI) integer-dot kernels of the fast mode: two 32-element blocks per 512-bit step
//! (lanes 0..8 hold block `b`, lanes 8..16 block `b + 1`), `vpdpbusd` for unsigned × signed
//! bytes into i32 lanes (no saturation).
//!
//! - Q4_0 / Q4_1: the unsigned side is the 4-bit code `n`; Q4_0's `−8 · Σq` is the start value
//!   of the integer accumulator (`−vpdpbusd(8, q)`, once per activation row and step).
//! - Q8_0: `w ⊕ 0x80 = w + 128` as unsigned, started from `−vpdpbusd(128, q)`.
//! - Q4_1's `mw · dx · Σq`: `fma(mw, dx · vpdpbusd(1, q), acc)` lane-wise.
//!
//! Per dot: one 16-lane f32 accumulator, `acc = fma(cvt(isum) · dw, dx, acc)` per step, in
//! block order; an odd last block runs as a half step with the upper lanes zero.

use std::arch::x86_64::*;

use super::fast::QuantizedRows;
use super::{layout, FastKernels};
use crate::tensor::WeightDType;

/// Token for the AVX-512 VNNI fast kernels.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx512Fast(());

impl Avx512Fast {
    /// The token, if this CPU runs AVX-512 F/BW/VL + VNNI + VBMI (with FMA and F16C).
    pub(super) fn detect() -> Option<Avx512Fast> {
        (is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vbmi")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        .then_some(Avx512Fast(()))
    }
}

const MR: usize = 4;
const NR: usize = 4;

impl FastKernels for Avx512Fast {
    const MR: usize = MR;
    const NR: usize = NR;

    fn quantize(self, x: &[f32], m: usize, k: usize) -> QuantizedRows {
        assert_eq!(x.len(), m * k, "quantize [{m}, {k}]");
        let mut r = QuantizedRows::zeroed(m, k);
        // SAFETY: `self` exists only when the CPU has AVX-512 F/BW; `x` and `r` hold exactly
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
        // SAFETY: `self` exists only when the CPU has AVX-512 F/BW/VL/VNNI, FMA and F16C; the
        // asserts above bound every read: `nr` weight rows of `rb` bytes (`a.nb` blocks each)
        // and activation rows `i0 .. i0 + mr` of `a`.
        unsafe {
            macro_rules! dispatch {
                ($b:ty) => {
                    match (mr, nr) {
                        (1, 1) => tile::<$b, 1, 1>(rows.as_ptr(), rb, a, i0, out),
                        (1, 2) => tile::<$b, 1, 2>(rows.as_ptr(), rb, a, i0, out),
                        (1, 3) => tile::<$b, 1, 3>(rows.as_ptr(), rb, a, i0, out),
                        (1, 4) => tile::<$b, 1, 4>(rows.as_ptr(), rb, a, i0, out),
                        (2, 1) => tile::<$b, 2, 1>(rows.as_ptr(), rb, a, i0, out),
                        (2, 2) => tile::<$b, 2, 2>(rows.as_ptr(), rb, a, i0, out),
                        (2, 3) => tile::<$b, 2, 3>(rows.as_ptr(), rb, a, i0, out),
                        (2, 4) => tile::<$b, 2, 4>(rows.as_ptr(), rb, a, i0, out),
                        (3, 1) => tile::<$b, 3, 1>(rows.as_ptr(), rb, a, i0, out),
                        (3, 2) => tile::<$b, 3, 2>(rows.as_ptr(), rb, a, i0, out),
                        (3, 3) => tile::<$b, 3, 3>(rows.as_ptr(), rb, a, i0, out),
                        (3, 4) => tile::<$b, 3, 4>(rows.as_ptr(), rb, a, i0, out),
                        (4, 1) => tile::<$b, 4, 1>(rows.as_ptr(), rb, a, i0, out),
                        (4, 2) => tile::<$b, 4, 2>(rows.as_ptr(), rb, a, i0, out),
                        (4, 3) => tile::<$b, 4, 3>(rows.as_ptr(), rb, a, i0, out),
                        (4, 4) => tile::<$b, 4, 4>(rows.as_ptr(), rb, a, i0, out),
                        _ => unreachable!(),
                    }
                };
            }
            match dtype {
                WeightDType::Q8_0 => dispatch!(Q8_0),
                WeightDType::Q4_0 => dispatch!(Q4_0),
                WeightDType::Q4_1 => dispatch!(Q4_1),
                _ => panic!("no integer dot for {dtype:?}"),
            }
        }
    }
}

/// A weight block type as the VNNI dot needs it.
trait IntBlock {
    const BYTES: usize;
    /// Whether the `mw · dx · Σq` term exists (Q4_1).
    const HAS_MIN: bool;
    /// The unsigned byte the activation sums are weighted by at the start (Q4_0: 8, Q8_0: 128).
    const BIAS: i8;
    /// Unsigned bytes of blocks `p` and `p + BYTES` (only `p` when `!two`; upper half zero).
    unsafe fn codes(p: *const u8, two: bool) -> __m512i;
}

struct Q8_0;
struct Q4_0;
struct Q4_1;

/// `([d ×8, d' ×8], [m ×8, m' ×8])` for the blocks at `p` and, when `two`, `p + bytes` (zero
/// otherwise): two broadcast loads from the f16 table `t` and one masked move each. For
/// Q8_0 / Q4_0 the `m` halves are quant bytes and never used.
#[inline(always)]
unsafe fn heads(p: *const u8, two: bool, bytes: usize, t: *const f32) -> (__m512, __m512) {
    // SAFETY: 4 readable bytes at `p`, and at `p + bytes` when `two` (caller); `t` has an
    // entry for every u16.
    unsafe {
        let h0 = (p as *const u32).read_unaligned();
        let h1 = if two {
            (p.add(bytes) as *const u32).read_unaligned()
        } else {
            0
        };
        let at = |h: u32| *t.add(h as usize);
        let d = _mm512_mask_mov_ps(
            _mm512_set1_ps(at(h0 & 0xffff)),
            0xff00,
            _mm512_set1_ps(at(h1 & 0xffff)),
        );
        let m = _mm512_mask_mov_ps(
            _mm512_set1_ps(at(h0 >> 16)),
            0xff00,
            _mm512_set1_ps(at(h1 >> 16)),
        );
        (d, m)
    }
}

/// The 4-bit codes of one or two Q4 blocks at `p` (`bytes` apart, quants at offset `qs`), as 64
/// bytes in element order: block `b` low nibbles, its high nibbles, then block `b + 1` likewise
/// (zero when `!two`). One masked load (never touching bytes past the blocks), one byte
/// permute (VBMI) that places each block's 16 quant bytes twice, a shift of the second copies
/// by 4 and a mask.
#[inline(always)]
unsafe fn nibble_codes(p: *const u8, two: bool, bytes: usize, qs: usize) -> __m512i {
    // SAFETY: the masked load reads only `bytes` (or `2 · bytes` when `two`) bytes at `p`,
    // which the caller guarantees; the rest are register operations.
    unsafe {
        let len = if two { 2 * bytes } else { bytes };
        let z = _mm512_maskz_loadu_epi8((1u64 << len) - 1, p as *const i8);
        let mut idx = [0u8; 64];
        for (i, v) in idx.iter_mut().enumerate() {
            let block = i / 32;
            *v = (block * bytes + qs + i % 16) as u8;
        }
        let idx = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
        let c = _mm512_permutexvar_epi8(idx, z);
        // Words 8..16 and 24..32 hold the second copies: shift those right by 4.
        let c = _mm512_mask_srli_epi16(c, 0xff00_ff00, c, 4);
        _mm512_and_si512(c, _mm512_set1_epi8(0x0f))
    }
}

impl IntBlock for Q8_0 {
    const BYTES: usize = layout::Q8_0_BYTES;
    const HAS_MIN: bool = false;
    const BIAS: i8 = -128; // 0x80: 128 as an unsigned byte
    #[inline(always)]
    unsafe fn codes(p: *const u8, two: bool) -> __m512i {
        // SAFETY: 34 readable bytes at `p` (and at `p + 34` when `two`), per the caller.
        unsafe {
            let lo = _mm256_loadu_si256(p.add(2) as *const __m256i);
            let v = if two {
                let hi = _mm256_loadu_si256(p.add(2 + Self::BYTES) as *const __m256i);
                _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
            } else {
                _mm512_zextsi256_si512(lo)
            };
            // w + 128 as unsigned; the zero upper half of a half step becomes 128 there, which
            // the zero activations of that half cancel.
            _mm512_xor_si512(v, _mm512_set1_epi8(Self::BIAS))
        }
    }
}

impl IntBlock for Q4_0 {
    const BYTES: usize = layout::Q4_0_BYTES;
    const HAS_MIN: bool = false;
    const BIAS: i8 = 8;
    #[inline(always)]
    unsafe fn codes(p: *const u8, two: bool) -> __m512i {
        // SAFETY: 18 readable bytes at `p` (and at `p + 18` when `two`), per the caller.
        unsafe { nibble_codes(p, two, Self::BYTES, 2) }
    }
}

impl IntBlock for Q4_1 {
    const BYTES: usize = layout::Q4_1_BYTES;
    const HAS_MIN: bool = true;
    const BIAS: i8 = 0;
    #[inline(always)]
    unsafe fn codes(p: *const u8, two: bool) -> __m512i {
        // SAFETY: 20 readable bytes at `p` (and at `p + 20` when `two`), per the caller.
        unsafe { nibble_codes(p, two, Self::BYTES, 4) }
    }
}

/// Every block of `x` into `r` (same operations as `QuantizedRows::new`: max |x|, `d = amax /
/// 127`, `q = cvtps2dq(x · (1 / d))` with round-to-nearest-even).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
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
            let (v0, v1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let (scale, inv) = super::fast::block_scale(amax);
            let inv = _mm512_set1_ps(inv);
            let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));
            let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
            let lim = _mm512_set1_epi32(127);
            let q0 = _mm512_max_epi32(
                _mm512_min_epi32(q0, lim),
                _mm512_sub_epi32(_mm512_setzero_si512(), lim),
            );
            let q1 = _mm512_max_epi32(
                _mm512_min_epi32(q1, lim),
                _mm512_sub_epi32(_mm512_setzero_si512(), lim),
            );
            _mm_storeu_si128(q.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(
                q.as_mut_ptr().add(16) as *mut __m128i,
                _mm512_cvtepi32_epi8(q1),
            );
            *d = scale;
            *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
    }
}

/// Horizontal sum of 16 lanes (the same fixed order as the exact kernels).
#[inline(always)]
unsafe fn hsum(v: __m512) -> f32 {
    // SAFETY: register-only AVX-512/AVX/SSE operations.
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

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma,f16c")]
unsafe fn tile<B: IntBlock, const M: usize, const N: usize>(
    w: *const u8,
    rb: usize,
    a: &QuantizedRows,
    i0: usize,
    out: &mut [f32],
) {
    // SAFETY: bounds checked by `Avx512Fast::tile`: `N` rows of `a.nb` blocks at `w`,
    // activation rows `i0 .. i0 + M` of `a` (`a.nb` scales each).
    unsafe {
        // Lanes 0..8 take element 0, lanes 8..16 element 1 of a 2-lane source.
        let t = layout::f16_table().as_ptr();
        let idx_dx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let zero = _mm512_setzero_si512();
        let mut acc = [[_mm512_setzero_ps(); N]; M];
        let qs = a.qs.as_ptr().add(i0 * a.k);
        let mut b = 0;
        while b < a.nb {
            let two = b + 1 < a.nb;
            // Weight side: codes, and [dw ×8, dw' ×8] (+ [mw ×8, mw' ×8]).
            let mut wv = [zero; N];
            let mut dwv = [_mm512_setzero_ps(); N];
            let mut mwv = [_mm512_setzero_ps(); N];
            for j in 0..N {
                let p = w.add(j * rb + b * B::BYTES);
                wv[j] = B::codes(p, two);
                let (d, m) = heads(p, two, B::BYTES, t);
                dwv[j] = d;
                if B::HAS_MIN {
                    mwv[j] = m;
                }
            }
            for i in 0..M {
                let row = (i0 + i) * a.nb + b;
                let xp = qs.add(i * a.k + b * layout::QK);
                let xv = if two {
                    _mm512_loadu_si512(xp as *const __m512i)
                } else {
                    _mm512_zextsi256_si512(_mm256_loadu_si256(xp as *const __m256i))
                };
                let d2 = if two {
                    _mm_castpd_ps(_mm_load_sd(a.d.as_ptr().add(row) as *const f64))
                } else {
                    _mm_load_ss(a.d.as_ptr().add(row))
                };
                let dxv = _mm512_permutexvar_ps(idx_dx, _mm512_castps128_ps512(d2));
                let start = if B::BIAS != 0 {
                    _mm512_sub_epi32(
                        zero,
                        _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(B::BIAS), xv),
                    )
                } else {
                    zero
                };
                let xs = if B::HAS_MIN {
                    let s = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), xv);
                    _mm512_mul_ps(_mm512_cvtepi32_ps(s), dxv)
                } else {
                    _mm512_setzero_ps()
                };
                for j in 0..N {
                    let isum = _mm512_dpbusd_epi32(start, wv[j], xv);
                    let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), dwv[j]);
                    acc[i][j] = _mm512_fmadd_ps(t, dxv, acc[i][j]);
                    if B::HAS_MIN {
                        acc[i][j] = _mm512_fmadd_ps(mwv[j], xs, acc[i][j]);
                    }
                }
            }
            b += 2;
        }
        for i in 0..M {
            for j in 0..N {
                out[i * N + j] = hsum(acc[i][j]);
            }
        }
    }
}
