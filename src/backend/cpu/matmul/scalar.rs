//! Portable kernels: plain Rust, no intrinsics (any target; the fallback on x86-64 without
//! AVX2). Eight lanes per dot, as an `[f32; 8]` array the compiler may vectorize.

use super::{layout, ExactKernels};
use crate::tensor::WeightDType;

/// The portable kernel set (always available).
#[derive(Debug, Clone, Copy)]
pub(super) struct Scalar;

/// Lanes per dot product.
const LANES: usize = 8;

/// `Σ_t a[t] · b[t]` over `a.len()` terms in [`LANES`] lanes, reduced pairwise.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b[..a.len()].chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for l in 0..ar.len() {
        acc[l] += ar[l] * br[l];
    }
    let a4 = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (a4[0] + a4[2]) + (a4[1] + a4[3])
}

impl ExactKernels for Scalar {
    const LANES: usize = LANES;
    const MR: usize = 4;
    const NR: usize = 4;

    fn dequant_row(self, dtype: WeightDType, row: &[u8], out: &mut [f32]) {
        layout::dequant_row(dtype, row, out);
    }

    fn has_gemv(self, _dtype: WeightDType) -> bool {
        false
    }

    fn gemv(self, dtype: WeightDType, _rows: &[u8], _rb: usize, _x: &[f32], _out: &mut [f32]) {
        panic!("no fused scalar GEMV for {dtype:?}");
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
        for i in 0..mr {
            let xi = &x[i * k..i * k + k];
            for j in 0..nr {
                out[i * nr + j] = dot(xi, &panel[j * kp..j * kp + k]);
            }
        }
    }
}
