//! Tests of the matmul kernels against a naive dequantize-then-dot reference (f64 sums), on
//! random data, for every dtype and every instruction set this CPU runs.

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Exact-mode tolerance: `|out − ref| ≤ EXACT_REL · Σ_t |x_t · w_t| + 1e-30`. f32 sums of up
/// to a few thousand terms in 8 or 16 lanes stay far inside this (the bound is ~100 ulp).
const EXACT_REL: f32 = 1e-5;

/// Every dtype with its test inner dimensions (`k` a multiple of the block size; odd for the
/// unblocked float types so the masked tails run).
fn cases() -> Vec<(WeightDType, Vec<usize>)> {
    vec![
        (WeightDType::F32, vec![1, 7, 37, 131]),
        (WeightDType::F16, vec![5, 37, 131]),
        (WeightDType::BF16, vec![5, 37, 131]),
        (WeightDType::Q8_0, vec![32, 96, 160]),
        (WeightDType::Q4_0, vec![32, 96, 160]),
        (WeightDType::Q4_1, vec![32, 96, 160]),
        (WeightDType::Q4K, vec![256, 512]),
        (WeightDType::Q6K, vec![256, 512]),
    ]
}

/// A sane f16 scale (no NaN / inf / huge values), as its two bytes.
fn scale_bytes(rng: &mut StdRng, signed: bool) -> [u8; 2] {
    let mut v = rng.random_range(0.001f32..0.05);
    if signed && rng.random::<bool>() {
        v = -v;
    }
    f16::from_f32(v).to_le_bytes()
}

/// Random stored bytes of an `[n, k]` tensor of `dtype` with finite, model-like values.
fn random_weight(rng: &mut StdRng, dtype: WeightDType, n: usize, k: usize) -> Vec<u8> {
    let rb = dtype.row_bytes(k).unwrap();
    let mut data = vec![0u8; n * rb];
    match dtype {
        WeightDType::F32 => {
            for c in data.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes());
            }
        }
        WeightDType::F16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(rng.random_range(-1.0f32..1.0)).to_le_bytes());
            }
        }
        WeightDType::BF16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&bf16::from_f32(rng.random_range(-1.0f32..1.0)).to_le_bytes());
            }
        }
        _ => {
            rng.fill(&mut data[..]);
            let bb = dtype.block_bytes();
            for b in data.chunks_exact_mut(bb) {
                match dtype {
                    WeightDType::Q8_0 | WeightDType::Q4_0 => {
                        b[0..2].copy_from_slice(&scale_bytes(rng, true))
                    }
                    WeightDType::Q4_1 | WeightDType::Q4K => {
                        b[0..2].copy_from_slice(&scale_bytes(rng, true));
                        b[2..4].copy_from_slice(&scale_bytes(rng, true));
                    }
                    WeightDType::Q6K => b[208..210].copy_from_slice(&scale_bytes(rng, true)),
                    _ => unreachable!(),
                }
            }
        }
    }
    data
}

/// Element `t` of the stored row `row`, computed independently of `layout` from the ggml
/// definitions (element-wise, f64 where it is exact to do so).
fn ref_elem(dtype: WeightDType, row: &[u8], t: usize) -> f32 {
    let h = |i: usize| f16::from_bits(u16::from_le_bytes([row[i], row[i + 1]])).to_f32();
    match dtype {
        WeightDType::F32 => f32::from_le_bytes(row[4 * t..4 * t + 4].try_into().unwrap()),
        WeightDType::F16 => h(2 * t),
        WeightDType::BF16 => {
            f32::from_bits((u16::from_le_bytes([row[2 * t], row[2 * t + 1]]) as u32) << 16)
        }
        WeightDType::Q8_0 => {
            let b = 34 * (t / 32);
            row[b + 2 + t % 32] as i8 as f32 * h(b)
        }
        WeightDType::Q4_0 | WeightDType::Q4_1 => {
            let bb = if dtype == WeightDType::Q4_0 { 18 } else { 20 };
            let qs = if dtype == WeightDType::Q4_0 { 2 } else { 4 };
            let (b, j) = (bb * (t / 32), t % 32);
            let byte = row[b + qs + j % 16];
            let q = if j < 16 { byte & 15 } else { byte >> 4 } as i32;
            if dtype == WeightDType::Q4_0 {
                (q - 8) as f32 * h(b)
            } else {
                q as f32 * h(b) + h(b + 2)
            }
        }
        WeightDType::Q4K => {
            let (b, j) = (144 * (t / 256), t % 256);
            let sc = &row[b + 4..b + 16];
            let sub = j / 32;
            let (s, m) = if sub < 4 {
                (sc[sub] & 63, sc[sub + 4] & 63)
            } else {
                (
                    (sc[sub + 4] & 15) | ((sc[sub - 4] >> 6) << 4),
                    (sc[sub + 4] >> 4) | ((sc[sub] >> 6) << 4),
                )
            };
            // Sub-blocks 2g and 2g+1 share the 32 bytes qs[32g..32g+32]: low then high nibbles.
            let byte = row[b + 16 + 32 * (sub / 2) + j % 32];
            let q = if sub % 2 == 0 { byte & 15 } else { byte >> 4 };
            (h(b) * s as f32) * q as f32 - h(b + 2) * m as f32
        }
        WeightDType::Q6K => {
            let (b, j) = (210 * (t / 256), t % 256);
            let (half, l) = (j / 128, j % 128);
            // Quarter `l / 32` of the half: ql low/high nibble of byte l%32 (+32), qh bits 2·quarter.
            let (quarter, l32) = (l / 32, l % 32);
            let ql = row[b + 64 * half + l32 + if quarter % 2 == 1 { 32 } else { 0 }];
            let low = if quarter < 2 { ql & 15 } else { ql >> 4 };
            let qh = (row[b + 128 + 32 * half + l32] >> (2 * quarter)) & 3;
            let q = (low | (qh << 4)) as i32 - 32;
            let sc = row[b + 192 + 8 * half + l32 / 16 + 2 * quarter] as i8;
            (h(b + 208) * sc as f32) * q as f32
        }
        other => panic!("{other:?} is not a matmul weight"),
    }
}

/// Naive reference: `out[i, j] = Σ_t x[i, t] · w_j[t]` in f64, plus `Σ |x · w|` for the bound.
fn reference(
    x: &[f32],
    m: usize,
    k: usize,
    dtype: WeightDType,
    data: &[u8],
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let rb = dtype.row_bytes(k).unwrap();
    let mut out = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for j in 0..n {
        let w: Vec<f32> = (0..k)
            .map(|t| ref_elem(dtype, &data[j * rb..(j + 1) * rb], t))
            .collect();
        for i in 0..m {
            for t in 0..k {
                let p = x[i * k + t] as f64 * w[t] as f64;
                out[i * n + j] += p;
                mag[i * n + j] += p.abs();
            }
        }
    }
    (out, mag)
}

fn random_x(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

#[test]
fn scalar_dequant_matches_elementwise_reference() {
    let mut rng = StdRng::seed_from_u64(1);
    for (dtype, ks) in cases() {
        for k in ks {
            let row = random_weight(&mut rng, dtype, 1, k);
            let mut out = vec![0.0f32; k];
            layout::dequant_row(dtype, &row, &mut out);
            for t in 0..k {
                let r = ref_elem(dtype, &row, t);
                assert_eq!(
                    out[t].to_bits(),
                    r.to_bits(),
                    "{dtype:?} k={k} t={t}: {} vs {r}",
                    out[t]
                );
            }
        }
    }
}

/// Every ISA's dequantization is bit-identical to the scalar one.
#[test]
fn simd_dequant_is_bit_exact() {
    fn check<K: ExactKernels>(kern: K, name: &str) {
        let mut rng = StdRng::seed_from_u64(2);
        for (dtype, ks) in cases() {
            for k in ks {
                let row = random_weight(&mut rng, dtype, 1, k);
                let (mut a, mut b) = (vec![0.0f32; k], vec![1.0f32; k]);
                layout::dequant_row(dtype, &row, &mut a);
                kern.dequant_row(dtype, &row, &mut b);
                for t in 0..k {
                    assert_eq!(
                        a[t].to_bits(),
                        b[t].to_bits(),
                        "{name} {dtype:?} k={k} t={t}"
                    );
                }
            }
        }
    }
    check(scalar::Scalar, "scalar");
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(kern) = x86_avx2::Avx2::detect() {
            check(kern, "avx2");
        }
        if let Some(kern) = x86_avx512::Avx512::detect() {
            check(kern, "avx512");
        }
    }
}

/// Runs `matmul_on(isa, mode, ..)` for every dtype, odd shapes, and every available ISA, and
/// hands each result with its reference to `check`.
fn for_each_product(mode: MatmulMode, mut check: impl FnMut(&str, &[f32], &[f64], &[f64])) {
    let mut rng = StdRng::seed_from_u64(3);
    for isa in Isa::available() {
        for (dtype, ks) in cases() {
            for &k in &ks {
                // (70, 13): more rows than one cache block (MC = 64).
                for (m, n) in [
                    (1, 1),
                    (1, 13),
                    (3, 5),
                    (7, 67),
                    (17, 9),
                    (5, 130),
                    (70, 13),
                ] {
                    let data = random_weight(&mut rng, dtype, n, k);
                    let x = random_x(&mut rng, m * k);
                    let shape = [n, k];
                    let w = TensorView {
                        dtype,
                        shape: &shape,
                        data: &data,
                    };
                    let mut out = vec![f32::NAN; m * n];
                    matmul_on(isa, mode, &x, m, k, &w, &mut out);
                    let (want, mag) = reference(&x, m, k, dtype, &data, n);
                    let label = format!("{isa} {mode:?} {dtype:?} m={m} n={n} k={k}");
                    check(&label, &out, &want, &mag);
                }
            }
        }
    }
}

#[test]
fn exact_matches_reference_for_every_dtype_and_isa() {
    for_each_product(MatmulMode::Exact, |label, out, want, mag| {
        for (idx, ((&o, &r), &a)) in out.iter().zip(want).zip(mag).enumerate() {
            let err = (o as f64 - r).abs();
            assert!(
                err <= EXACT_REL as f64 * a + 1e-30,
                "{label} [{idx}]: got {o}, want {r} (|Δ| {err:e}, Σ|xw| {a})"
            );
        }
    });
}

/// A row's result is bit-identical whether it is computed alone (GEMV path), inside a batch
/// (tiled path, any tile position) or with any number of threads.
#[test]
fn results_do_not_depend_on_batch_or_threads() {
    let mut rng = StdRng::seed_from_u64(4);
    let (m, n, k) = (11, 203, 576);
    let pools: Vec<rayon::ThreadPool> = [1, 3]
        .into_iter()
        .map(|t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        })
        .collect();
    for isa in Isa::available() {
        for dtype in [
            WeightDType::F32,
            WeightDType::BF16,
            WeightDType::Q8_0,
            WeightDType::Q4_0,
            WeightDType::Q4_1,
            WeightDType::Q4K,
            WeightDType::Q6K,
        ] {
            let k = if dtype.block_elems() == 256 { 512 } else { k };
            let data = random_weight(&mut rng, dtype, n, k);
            let x = random_x(&mut rng, m * k);
            let shape = [n, k];
            let w = TensorView {
                dtype,
                shape: &shape,
                data: &data,
            };
            let mut batched = vec![0.0f32; m * n];
            pools[1].install(|| matmul_on(isa, MatmulMode::Exact, &x, m, k, &w, &mut batched));
            for (p, pool) in pools.iter().enumerate() {
                for i in [0, 5, m - 1] {
                    let mut alone = vec![0.0f32; n];
                    pool.install(|| {
                        matmul_on(
                            isa,
                            MatmulMode::Exact,
                            &x[i * k..(i + 1) * k],
                            1,
                            k,
                            &w,
                            &mut alone,
                        )
                    });
                    for j in 0..n {
                        assert_eq!(
                            alone[j].to_bits(),
                            batched[i * n + j].to_bits(),
                            "{isa} {dtype:?} pool {p} row {i} col {j}"
                        );
                    }
                }
                // A sub-batch starting at an odd row lands rows on other tile positions.
                let mut sub = vec![0.0f32; 3 * n];
                pool.install(|| {
                    matmul_on(isa, MatmulMode::Exact, &x[2 * k..5 * k], 3, k, &w, &mut sub)
                });
                assert!(
                    sub.iter()
                        .zip(&batched[2 * n..5 * n])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa} {dtype:?} pool {p}: sub-batch differs"
                );
            }
        }
    }
}

#[test]
fn empty_dimensions() {
    let data = vec![0u8; 0];
    let shape = [0, 32];
    let w = TensorView {
        dtype: WeightDType::Q8_0,
        shape: &shape,
        data: &data,
    };
    let mut out = vec![];
    matmul(&[0.0; 64], 2, 32, &w, &mut out);
    let shape = [3, 0];
    let w = TensorView {
        dtype: WeightDType::F32,
        shape: &shape,
        data: &data,
    };
    let mut out = vec![f32::NAN; 6];
    matmul(&[], 2, 0, &w, &mut out);
    assert_eq!(out, vec![0.0; 6]);
}

#[test]
#[should_panic(expected = "not a whole number")]
fn k_must_be_whole_blocks() {
    let data = vec![0u8; 34];
    let shape = [1, 33];
    let w = TensorView {
        dtype: WeightDType::Q8_0,
        shape: &shape,
        data: &data,
    };
    matmul(&[0.0; 33], 1, 33, &w, &mut [0.0]);
}

#[test]
#[should_panic(expected = "out is not")]
fn out_shape_is_checked() {
    let data = vec![0u8; 4 * 8];
    let shape = [2, 4];
    let w = TensorView {
        dtype: WeightDType::F32,
        shape: &shape,
        data: &data,
    };
    matmul(&[0.0; 8], 2, 4, &w, &mut [0.0; 3]);
}

#[test]
fn isa_names_round_trip() {
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
        assert_eq!(isa.as_str().parse::<Isa>(), Ok(isa));
    }
    assert!("sse".parse::<Isa>().is_err());
    assert!(Isa::available().contains(&Isa::Scalar));
    assert!(Isa::best().is_supported());
}

#[test]
fn activation_quantization_round_trips() {
    let mut rng = StdRng::seed_from_u64(5);
    let (m, k) = (3, 96);
    let mut x = random_x(&mut rng, m * k);
    x[32..64].fill(0.0); // an all-zero block: scale 0, codes 0
    let a = fast::QuantizedRows::new(&x, m, k);
    for i in 0..m {
        for t in 0..k {
            let b = i * a.nb + t / 32;
            let (q, d) = (a.qs[i * k + t], a.d[b]);
            assert!(q != i8::MIN, "codes stay in -127..=127");
            assert!(
                (x[i * k + t] - q as f32 * d).abs() <= 0.5 * d * (1.0 + 1e-6),
                "row {i} t {t}"
            );
        }
        for b in 0..a.nb {
            let s: i32 = a.qs[i * k + 32 * b..i * k + 32 * b + 32]
                .iter()
                .map(|&q| q as i32)
                .sum();
            assert_eq!(a.sum[i * a.nb + b], s);
        }
    }
    assert_eq!(a.d[1], 0.0);
    assert!(a.qs[32..64].iter().all(|&q| q == 0));
}

/// Every ISA's activation quantization is bit-identical to the portable one.
#[test]
fn simd_quantization_is_bit_exact() {
    fn check<K: FastKernels>(kern: K, name: &str) {
        let mut rng = StdRng::seed_from_u64(9);
        let (m, k) = (5, 192);
        let mut x = random_x(&mut rng, m * k);
        x[64..96].fill(0.0);
        x[100] = 1e-30;
        // Exact ties: with max 127 in the block, d = 1 and x · 1 = 2.5 rounds to even (2).
        x[160] = 127.0;
        x[161] = 2.5;
        x[162] = -3.5;
        let (a, b) = (fast::QuantizedRows::new(&x, m, k), kern.quantize(&x, m, k));
        assert_eq!(a.qs, b.qs, "{name}");
        assert_eq!(a.sum, b.sum, "{name}");
        assert!(
            a.d.iter()
                .zip(&b.d)
                .all(|(p, q)| p.to_bits() == q.to_bits()),
            "{name}"
        );
        assert_eq!((a.qs[161], a.qs[162]), (2, -4), "ties to even");
    }
    check(fast::ScalarFast, "scalar");
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(kern) = x86_avx2_fast::Avx2Fast::detect() {
            check(kern, "avx2");
        }
        if let Some(kern) = x86_avx512_fast::Avx512Fast::detect() {
            check(kern, "avx512");
        }
    }
}

/// The fast mode computes `Σ w · x̂` where `x̂ = q · d` is the quantized activation: checked
/// against that in f64 (tight), and against the exact product within the quantization bound.
#[test]
fn fast_matches_reference_on_quantized_activations() {
    let mut rng = StdRng::seed_from_u64(6);
    for isa in Isa::available() {
        for dtype in [WeightDType::Q8_0, WeightDType::Q4_0, WeightDType::Q4_1] {
            for k in [32, 64, 96, 160, 576] {
                for (m, n) in [(1, 1), (1, 13), (3, 5), (7, 67), (17, 9), (5, 130)] {
                    let data = random_weight(&mut rng, dtype, n, k);
                    let x = random_x(&mut rng, m * k);
                    let shape = [n, k];
                    let w = TensorView {
                        dtype,
                        shape: &shape,
                        data: &data,
                    };
                    let mut out = vec![f32::NAN; m * n];
                    matmul_on(isa, MatmulMode::Fast, &x, m, k, &w, &mut out);
                    let a = fast::QuantizedRows::new(&x, m, k);
                    let xhat: Vec<f32> = (0..m * k).map(|t| a.qs[t] as f32 * a.d[t / 32]).collect();
                    let (want, mag) = reference(&xhat, m, k, dtype, &data, n);
                    let (exact, _) = reference(&x, m, k, dtype, &data, n);
                    let rb = dtype.row_bytes(k).unwrap();
                    for i in 0..m {
                        for j in 0..n {
                            let idx = i * n + j;
                            let o = out[idx] as f64;
                            let err = (o - want[idx]).abs();
                            let label = format!("{isa} {dtype:?} m={m} n={n} k={k} [{i},{j}]");
                            assert!(
                                err <= 1e-5 * mag[idx] + 1e-30,
                                "{label}: {o} vs {} ({err:e})",
                                want[idx]
                            );
                            // |x − x̂| ≤ d/2 per element.
                            let bound: f64 = (0..k)
                                .map(|t| {
                                    let wt = ref_elem(dtype, &data[j * rb..(j + 1) * rb], t) as f64;
                                    wt.abs() * 0.5 * a.d[i * a.nb + t / 32] as f64
                                })
                                .sum();
                            assert!(
                                (o - exact[idx]).abs() <= bound * 1.001 + 1e-5 * mag[idx],
                                "{label}: vs exact"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fast_results_do_not_depend_on_batch_or_threads() {
    let mut rng = StdRng::seed_from_u64(8);
    let (m, n, k) = (11, 203, 576);
    let pools: Vec<rayon::ThreadPool> = [1, 3]
        .into_iter()
        .map(|t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        })
        .collect();
    for isa in Isa::available() {
        for dtype in [WeightDType::Q8_0, WeightDType::Q4_0, WeightDType::Q4_1] {
            let data = random_weight(&mut rng, dtype, n, k);
            let x = random_x(&mut rng, m * k);
            let shape = [n, k];
            let w = TensorView {
                dtype,
                shape: &shape,
                data: &data,
            };
            let mut batched = vec![0.0f32; m * n];
            pools[1].install(|| matmul_on(isa, MatmulMode::Fast, &x, m, k, &w, &mut batched));
            for pool in &pools {
                for i in [0, 6, m - 1] {
                    let mut alone = vec![0.0f32; n];
                    pool.install(|| {
                        matmul_on(
                            isa,
                            MatmulMode::Fast,
                            &x[i * k..(i + 1) * k],
                            1,
                            k,
                            &w,
                            &mut alone,
                        )
                    });
                    assert!(
                        alone
                            .iter()
                            .zip(&batched[i * n..(i + 1) * n])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa} {dtype:?} row {i}"
                    );
                }
            }
        }
    }
}

/// Fast vs exact on SmolLM2-sized shapes (long k, more rows than a cache block, thousands of
/// columns): the activation rounding keeps every output within 2% of the largest one.
#[test]
fn fast_close_to_exact_on_model_shapes() {
    let mut rng = StdRng::seed_from_u64(10);
    for isa in Isa::available() {
        for dtype in [WeightDType::Q8_0, WeightDType::Q4_1] {
            for (m, n, k) in [
                (1, 576, 1536),
                (37, 576, 1536),
                (70, 192, 576),
                (3, 4100, 576),
            ] {
                let data = random_weight(&mut rng, dtype, n, k);
                let x = random_x(&mut rng, m * k);
                let shape = [n, k];
                let w = TensorView {
                    dtype,
                    shape: &shape,
                    data: &data,
                };
                let (mut fast_out, mut exact_out) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
                matmul_on(isa, MatmulMode::Fast, &x, m, k, &w, &mut fast_out);
                matmul_on(isa, MatmulMode::Exact, &x, m, k, &w, &mut exact_out);
                let scale = exact_out.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let err = fast_out
                    .iter()
                    .zip(&exact_out)
                    .fold(0.0f32, |a, (p, q)| a.max((p - q).abs()));
                assert!(
                    err <= 0.02 * scale,
                    "{isa} {dtype:?} m={m} n={n} k={k}: max |Δ| {err} vs max |y| {scale}"
                );
            }
        }
    }
}
