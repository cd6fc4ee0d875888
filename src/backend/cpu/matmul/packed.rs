//! Matmul with packed 4-bit linears (compressed-tensors int4 / NVFP4, AutoAWQ GEMM, GPTQ):
//! the CPU reference that dequantizes on the fly.
//!
//! `out[i, j] = Σ_t x[i, t] · W[j, t]`, where row `j` of `W` is rebuilt in f32 by
//! [`dequantize_packed_row`] (exact: see [`crate::quant::packed`]) into a per-thread buffer of
//! `K` floats and dotted with every activation row; no f32 copy of the matrix is kept. Threads
//! split the weight rows (rayon, current pool).
//!
//! **Batch invariance.** Each output is one dot product over `t` in [`LANES`] fixed lanes
//! (lane `l` sums the terms `t ≡ l mod LANES` in increasing `t`, then the lanes are added in
//! order), whatever `m`, the thread split or the other rows: a row's result does not depend on
//! its batch (tested below).

use rayon::prelude::*;

use crate::quant::packed::dequantize_packed_row;
use crate::tensor::{PackedLinear, PackedScheme, TensorView, WeightDType};

use super::HugePageBytes;

/// Lanes of the fixed-order dot product.
pub const LANES: usize = 8;

/// Weight rows per rayon task.
const ROWS_PER_TASK: usize = 8;

/// One part of a packed linear, owned.
#[derive(Debug, Clone)]
struct OwnedPart {
    dtype: WeightDType,
    shape: Vec<usize>,
    bytes: HugePageBytes,
}

impl OwnedPart {
    fn copy(v: &TensorView<'_>) -> OwnedPart {
        OwnedPart {
            dtype: v.dtype,
            shape: v.shape.to_vec(),
            bytes: HugePageBytes::copy_from(v.data),
        }
    }

    fn view(&self) -> TensorView<'_> {
        TensorView {
            dtype: self.dtype,
            shape: &self.shape,
            data: &self.bytes,
        }
    }
}

/// A packed linear copied into host memory, parts as stored (nothing expanded).
#[derive(Debug, Clone)]
pub struct PackedWeight {
    scheme: PackedScheme,
    out_features: usize,
    in_features: usize,
    qweight: OwnedPart,
    scales: OwnedPart,
    zeros: Option<OwnedPart>,
    g_idx: Option<OwnedPart>,
    global_scale: Option<OwnedPart>,
}

impl PackedWeight {
    /// Copy a [`PackedLinear::validate`]d linear's parts.
    pub fn copy_from(p: &PackedLinear<'_>) -> PackedWeight {
        PackedWeight {
            scheme: p.scheme,
            out_features: p.out_features,
            in_features: p.in_features,
            qweight: OwnedPart::copy(&p.qweight),
            scales: OwnedPart::copy(&p.scales),
            zeros: p.zeros.as_ref().map(OwnedPart::copy),
            g_idx: p.g_idx.as_ref().map(OwnedPart::copy),
            global_scale: p.global_scale.as_ref().map(OwnedPart::copy),
        }
    }

    /// The parts, borrowed.
    pub fn view(&self) -> PackedLinear<'_> {
        PackedLinear {
            scheme: self.scheme,
            out_features: self.out_features,
            in_features: self.in_features,
            qweight: self.qweight.view(),
            scales: self.scales.view(),
            zeros: self.zeros.as_ref().map(OwnedPart::view),
            g_idx: self.g_idx.as_ref().map(OwnedPart::view),
            global_scale: self.global_scale.as_ref().map(OwnedPart::view),
        }
    }

    /// The scheme.
    pub fn scheme(&self) -> PackedScheme {
        self.scheme
    }

    /// Bytes held (all parts as stored).
    pub fn stored_bytes(&self) -> usize {
        self.view().stored_bytes()
    }
}

/// `Σ_t a[t] · b[t]` in [`LANES`] fixed lanes (see the module docs).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] += x * y;
    }
    acc.iter().fold(0.0, |s, v| s + v)
}

/// `out[i, j] = Σ_t x[i, t] · W[j, t]`; `x`: `[m, K]` f32, `w`: a validated packed linear
/// `[N, K]`, `out`: `[m, N]`, overwritten.
///
/// # Panics
/// If the lengths do not match the shapes (a bug in the caller).
pub fn matmul_packed(x: &[f32], m: usize, w: &PackedLinear<'_>, out: &mut [f32]) {
    let (n, k) = (w.out_features, w.in_features);
    assert_eq!(x.len(), m * k, "matmul_packed: x is not [{m}, {k}]");
    assert_eq!(out.len(), m * n, "matmul_packed: out is not [{m}, {n}]");
    if m == 0 || n == 0 {
        return;
    }
    // Transposed result `[N, m]`: each task owns whole rows of it.
    let mut out_t = vec![0.0f32; n * m];
    out_t
        .par_chunks_mut(ROWS_PER_TASK * m)
        .enumerate()
        .for_each_init(
            || vec![0.0f32; k],
            |row, (task, chunk)| {
                for (r, o) in chunk.chunks_exact_mut(m).enumerate() {
                    dequantize_packed_row(w, task * ROWS_PER_TASK + r, row);
                    for (i, y) in o.iter_mut().enumerate() {
                        *y = dot(&x[i * k..(i + 1) * k], row);
                    }
                }
            },
        );
    for (j, col) in out_t.chunks_exact(m).enumerate() {
        for (i, &v) in col.iter().enumerate() {
            out[i * n + j] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::quant::packed::dequantize_packed;

    /// Random parts of a valid `scheme` linear `[n, k]`: words and zeros uniformly random,
    /// scales positive.
    pub(crate) struct RandomPacked {
        scheme: PackedScheme,
        n: usize,
        k: usize,
        parts: Vec<(Vec<usize>, WeightDType, Vec<u8>)>,
    }

    impl RandomPacked {
        pub(crate) fn new(scheme: PackedScheme, n: usize, k: usize, seed: u64) -> RandomPacked {
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let mut bytes = |len: usize| -> Vec<u8> { (0..len).map(|_| r.random()).collect() };
            let g = scheme.group_size();
            let groups = k.div_ceil(g);
            let bf16 = |vals: usize, seed: u64| -> Vec<u8> {
                let mut r = rand::rngs::StdRng::seed_from_u64(seed);
                (0..vals)
                    .flat_map(|_| half::bf16::from_f32(r.random_range(0.001..0.05)).to_le_bytes())
                    .collect()
            };
            let parts = match scheme {
                PackedScheme::CtInt4 { symmetric, .. } => {
                    let mut p = vec![
                        (vec![n, k / 8], WeightDType::I32, bytes(n * k / 2)),
                        (
                            vec![n, groups],
                            WeightDType::BF16,
                            bf16(n * groups, seed + 1),
                        ),
                    ];
                    if !symmetric {
                        p.push((
                            vec![n.div_ceil(8), groups],
                            WeightDType::I32,
                            bytes(n.div_ceil(8) * groups * 4),
                        ));
                    }
                    p
                }
                PackedScheme::CtNvfp4 => vec![
                    (vec![n, k / 2], WeightDType::U8, bytes(n * k / 2)),
                    // fp8 scales in [2^-4, 2^2): exponent field 3..9, any mantissa.
                    (
                        vec![n, k / 16],
                        WeightDType::F8E4M3,
                        bytes(n * k / 16)
                            .iter()
                            .map(|b| ((3 + b % 6) << 3) | (b & 7))
                            .collect(),
                    ),
                    (vec![1], WeightDType::F32, 37.5f32.to_le_bytes().to_vec()),
                ],
                PackedScheme::AwqGemm { .. } | PackedScheme::Gptq { .. } => {
                    let q = match scheme {
                        PackedScheme::AwqGemm { .. } => vec![k, n / 8],
                        _ => vec![k / 8, n],
                    };
                    vec![
                        (q, WeightDType::I32, bytes(n * k / 2)),
                        (
                            vec![groups, n],
                            WeightDType::BF16,
                            bf16(groups * n, seed + 2),
                        ),
                        (vec![groups, n / 8], WeightDType::I32, bytes(groups * n / 2)),
                    ]
                }
            };
            RandomPacked {
                scheme,
                n,
                k,
                parts,
            }
        }

        pub(crate) fn view(&self) -> PackedLinear<'_> {
            let v = |i: usize| {
                let (s, d, b) = &self.parts[i];
                TensorView {
                    dtype: *d,
                    shape: s,
                    data: b,
                }
            };
            let (zeros, global_scale) = match self.scheme {
                PackedScheme::CtNvfp4 => (None, Some(v(2))),
                _ => (self.parts.get(2).map(|_| v(2)), None),
            };
            PackedLinear {
                scheme: self.scheme,
                out_features: self.n,
                in_features: self.k,
                qweight: v(0),
                scales: v(1),
                zeros,
                g_idx: None,
                global_scale,
            }
        }
    }

    fn schemes() -> [PackedScheme; 5] {
        [
            PackedScheme::CtInt4 {
                group_size: 32,
                symmetric: false,
            },
            PackedScheme::CtInt4 {
                group_size: 128,
                symmetric: true,
            },
            PackedScheme::CtNvfp4,
            PackedScheme::AwqGemm { group_size: 64 },
            PackedScheme::Gptq {
                group_size: 64,
                zero_minus_one: true,
            },
        ]
    }

    #[test]
    fn matches_a_dense_f64_product_of_the_dequantized_weight() {
        let (n, k, m) = (40, 256, 5);
        let mut r = rand::rngs::StdRng::seed_from_u64(3);
        let x: Vec<f32> = (0..m * k).map(|_| r.random_range(-1.0..1.0)).collect();
        for (i, scheme) in schemes().into_iter().enumerate() {
            let rp = RandomPacked::new(scheme, n, k, 10 + i as u64);
            let p = rp.view();
            p.validate().unwrap();
            let w = dequantize_packed(&p);
            let mut out = vec![0.0; m * n];
            matmul_packed(&x, m, &p, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let (mut want, mut mag) = (0f64, 0f64);
                    for t in 0..k {
                        let v = f64::from(x[i * k + t]) * f64::from(w[j * k + t]);
                        want += v;
                        mag += v.abs();
                    }
                    let got = f64::from(out[i * n + j]);
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-30,
                        "{scheme}: [{i}, {j}] {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let (n, k) = (24, 128);
        let mut r = rand::rngs::StdRng::seed_from_u64(4);
        let x: Vec<f32> = (0..9 * k).map(|_| r.random_range(-1.0..1.0)).collect();
        for (i, scheme) in schemes().into_iter().enumerate() {
            let rp = RandomPacked::new(scheme, n, k, 20 + i as u64);
            let p = rp.view();
            let mut all = vec![0.0; 9 * n];
            matmul_packed(&x, 9, &p, &mut all);
            for row in [0, 4, 8] {
                let mut one = vec![0.0; n];
                matmul_packed(&x[row * k..(row + 1) * k], 1, &p, &mut one);
                assert_eq!(
                    one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    all[row * n..(row + 1) * n]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>(),
                    "{scheme}: row {row}"
                );
            }
        }
    }

    #[test]
    fn owned_copy_reads_back_the_same_parts() {
        let rp = RandomPacked::new(schemes()[0], 16, 64, 5);
        let w = PackedWeight::copy_from(&rp.view());
        assert_eq!(w.stored_bytes(), rp.view().stored_bytes());
        assert_eq!(dequantize_packed(&w.view()), dequantize_packed(&rp.view()));
    }
}
