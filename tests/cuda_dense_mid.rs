//! The batch-invariant `mma` path at 17–64 rows (`KILN_DENSE_MID`, the small kernel's 64-row
//! tile `dense_mma_small_rg8`) on a GPU:
//! - every row group of the small kernel (rg1 / rg2 / rg4 / rg8 and the wide rg8w, any of them at
//!   any row count),
//!   the dispatch (`MmaKernel::Small`) and the GEMM give the same bits for every epilogue the
//!   probe has (compute dtype, f32, SwiGLU) at 1..64 rows (33, 40, 57, 64 among them), on
//!   SmolLM2's shapes, a ragged one and K = 5120 / 8192 (16 slices: the rg8 tile's 64 KiB of
//!   shared memory, above the default 48 KiB);
//! - the fused decode ops at 17–64 rows (the rg4 / rg8 NORM prologue with its multi-row sum of
//!   squares, the RES epilogue, the NORM_ROPE q|k|v) equal the unfused ops bit for bit, on a
//!   backend with `KILN_DENSE_MID=rg8` (the default), `rg4` (main's tile), `norm32` and `wide0`
//!   (the wide tile);
//! - timings (`RESULT mid_time` / `mid_fused_time` lines for docs/benchmarks.md): the SmolLM2
//!   shapes at 16 / 32 / 48 / 64 rows through each row group, the GEMM (auto, t1, t3) and cuBLAS,
//!   weights rotated over copies that do not fit the L2 (what a decode step streams), PDL on;
//!   the fused ops against their unfused compositions at 32 and 64 rows.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run --test
//! cuda_dense_mid`): `cuda_dense_mid-<hash> --ignored --test-threads=1 --nocapture`
//! (`KILN_MID_DTYPES=bf16` limits the dtypes of the bit tests; the timings are bf16).
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::*;
use kiln::backend::cuda::{CudaBackend, DenseMatmul, GemmTile, MmaKernel, MmaOut};
use kiln::backend::{AttentionParams, Backend, KvCacheSpec, RopeSpec};
use kiln::model::step::{ForwardBatch, LogitsFor, SeqSlice};
use kiln::tensor::{TensorView, WeightDType};

type Buf = <CudaBackend as Backend>::Buffer;
type Weight = <CudaBackend as Backend>::Weight;

/// A `mma` backend with `KILN_DENSE_MID=mid` (`""`: the default) and the fused decode ops up to
/// 64 rows (both read at creation); `kind` the dense matmul.
fn backend(dtype: &str, kind: &str, mid: &str) -> CudaBackend {
    // SAFETY (edition 2021: a safe call): the tests run on one thread (`--test-threads=1`).
    std::env::set_var("KILN_DENSE_MATMUL", kind);
    std::env::set_var("KILN_DENSE_MID", mid);
    std::env::set_var("KILN_FUSED_DECODE_ROWS", "64");
    let b = gpu(dtype, "auto");
    std::env::remove_var("KILN_DENSE_MATMUL");
    std::env::remove_var("KILN_DENSE_MID");
    std::env::remove_var("KILN_FUSED_DECODE_ROWS");
    b
}

/// The 16-bit dtypes of the bit tests (`KILN_MID_DTYPES`, default both).
fn mid_dtypes() -> Vec<&'static str> {
    let v = std::env::var("KILN_MID_DTYPES").unwrap_or_else(|_| "bf16,fp16".into());
    dtypes()
        .into_iter()
        .filter(|d| *d != "f32" && v.split(',').any(|x| x.trim() == *d))
        .collect()
}

/// A weight [n, k] of pseudo-random values in [-1, 1) rounded to the 16-bit dtype (a block of
/// 1 000 003 values, prime, repeated), uploaded as 16-bit data.
fn weight(b: &CudaBackend, dtype: &str, n: usize, k: usize, seed: u64) -> Weight {
    upload16(b, dtype, &host16(dtype, n, k, seed), n, k)
}

/// The 16-bit bits of [`weight`]'s values.
fn host16(dtype: &str, n: usize, k: usize, seed: u64) -> Vec<u16> {
    let block = data(1_000_003, seed);
    let conv: Vec<u16> = block
        .iter()
        .map(|&v| {
            if dtype == "bf16" {
                half::bf16::from_f32(v).to_bits()
            } else {
                half::f16::from_f32(v).to_bits()
            }
        })
        .collect();
    let mut host = Vec::with_capacity(n * k);
    while host.len() < n * k {
        let take = (n * k - host.len()).min(conv.len());
        host.extend_from_slice(&conv[..take]);
    }
    host
}

/// Upload 16-bit bits `host` as an [n, k] weight.
fn upload16(b: &CudaBackend, dtype: &str, host: &[u16], n: usize, k: usize) -> Weight {
    let shape = [n, k];
    let view = TensorView {
        dtype: if dtype == "bf16" {
            WeightDType::BF16
        } else {
            WeightDType::F16
        },
        shape: &shape,
        data: bytemuck::cast_slice(host),
    };
    b.upload_weight("w", &view).expect("upload")
}

fn run_bits(
    b: &CudaBackend,
    x: &Buf,
    rows: usize,
    w: &Weight,
    kernel: MmaKernel,
    out: MmaOut,
) -> Vec<u32> {
    let mut o = b.mma_probe_alloc(rows, w, out).expect("alloc");
    b.mma_probe_run(x, rows, w, kernel, &mut o).expect("run");
    b.mma_probe_bits(&o).expect("download")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const ROWS: [usize; 12] = [1, 7, 8, 16, 17, 31, 32, 33, 40, 57, 63, 64];

/// (n, k, name) of the bit test: SmolLM2's shapes (q|k|v, o, gate|up, down, lm_head), a ragged
/// one, and K = 5120 / 8192 (16 slices: 64 KiB of partials in the rg8 tile).
const SHAPES: [(usize, usize, &str); 8] = [
    (960, 576, "qkv"),
    (576, 576, "o"),
    (3072, 576, "gate|up"),
    (576, 1536, "down"),
    (49152, 576, "lm_head"),
    (208, 200, "ragged"),
    (256, 5120, "k5120"),
    (160, 8192, "k8192"),
];

/// Every row group, the dispatch and the GEMM give the bits of the 8-row tile (rg1), and a row's
/// bits do not depend on the call's row count (rows r of the 64-row rg8 call = the r-row call).
#[test]
#[ignore = "needs a GPU: see the header"]
fn every_row_group_and_the_gemm_give_the_same_bits_at_1_to_64_rows() {
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for dtype in mid_dtypes() {
        let b = backend(dtype, "mma", "");
        if b.dense_matmul_kind() != DenseMatmul::Mma {
            println!(
                "RESULT mid_bits dtype={dtype} skipped: no tensor-core kernels on this target"
            );
            continue;
        }
        for (i, &(n, k, name)) in SHAPES.iter().enumerate() {
            let w = weight(&b, dtype, n, k, 500 + i as u64);
            let x = b.upload(&data(64 * k, 600 + i as u64)).unwrap();
            let outs: &[MmaOut] = if n % 16 == 0 {
                &[MmaOut::Same, MmaOut::F32, MmaOut::Swiglu]
            } else {
                &[MmaOut::Same, MmaOut::F32]
            };
            for &out in outs {
                let full = run_bits(&b, &x, 64, &w, MmaKernel::SmallRg(8), out);
                let per_row = full.len() / 64;
                let mut bad = Vec::new();
                for rows in ROWS {
                    let want = run_bits(&b, &x, rows, &w, MmaKernel::SmallRg(1), out);
                    let mut kernels = vec![
                        ("rg2", MmaKernel::SmallRg(2)),
                        ("rg4", MmaKernel::SmallRg(4)),
                        ("rg8", MmaKernel::SmallRg(8)),
                        ("small", MmaKernel::Small),
                    ];
                    if k <= 1024 {
                        kernels.push(("rg8w", MmaKernel::SmallWide));
                    }
                    if rows > 16 {
                        kernels.push(("gemm", MmaKernel::Gemm));
                        kernels.push(("gemm_t3", MmaKernel::GemmTile(GemmTile::T3)));
                    }
                    for (kname, kernel) in kernels {
                        checked += 1;
                        if run_bits(&b, &x, rows, &w, kernel, out) != want {
                            bad.push(format!("{kname}@{rows}"));
                        }
                    }
                    if want[..] != full[..rows * per_row] {
                        bad.push(format!("prefix@{rows}"));
                    }
                }
                let ok = bad.is_empty();
                println!(
                    "RESULT mid_bits dtype={dtype} shape={name} n={n} k={k} out={out:?} \
                     rows={ROWS:?} all_equal_rg1={ok} {}",
                    bad.join(",")
                );
                if !ok {
                    failures.push(format!("{dtype} {name} {out:?}: {bad:?}"));
                }
            }
        }
    }
    println!(
        "RESULT mid_bits comparisons={checked} failures={}",
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// An f32 residual-stream buffer holding `host` rounded to the compute dtype (zeros plus the
/// values through `add_rms_norm`'s residual update).
fn residual_from(b: &CudaBackend, host: &[f32], rows: usize, dim: usize) -> Buf {
    let mut r = b.alloc_f32(rows * dim).unwrap();
    let delta = b.upload(host).unwrap();
    let ones = b.upload(&vec![1.0; dim]).unwrap();
    let mut scratch = b.alloc(rows * dim).unwrap();
    b.add_rms_norm(&mut r, &delta, &ones, &mut scratch, rows, dim, 1e-5)
        .unwrap();
    r
}

/// SmolLM2's layer: hidden, q|k|v outputs, intermediate.
const HIDDEN: usize = 576;
const QKV_N: usize = 960;
const INTER: usize = 1536;

/// The weights of one SmolLM2-shaped layer on `b`.
struct Layer {
    norm_w: Buf,
    qkv: Weight,
    o: Weight,
    gu: Weight,
    down: Weight,
}

fn layer(b: &CudaBackend) -> Layer {
    let (gh, uh) = (data(INTER * HIDDEN, 95), data(INTER * HIDDEN, 96));
    let shape = [INTER, HIDDEN];
    let gv = TensorView {
        dtype: WeightDType::F32,
        shape: &shape,
        data: bytemuck::cast_slice(&gh),
    };
    let uv = TensorView {
        data: bytemuck::cast_slice(&uh),
        ..gv
    };
    let w = |n: usize, k: usize, seed: u64| {
        let host = data(n * k, seed);
        let shape = [n, k];
        let view = TensorView {
            dtype: WeightDType::F32,
            shape: &shape,
            data: bytemuck::cast_slice(&host),
        };
        b.upload_weight("w", &view).unwrap()
    };
    Layer {
        norm_w: b
            .upload(
                &data(HIDDEN, 91)
                    .iter()
                    .map(|v| 1.0 + 0.5 * v)
                    .collect::<Vec<_>>(),
            )
            .unwrap(),
        qkv: w(QKV_N, HIDDEN, 92),
        o: w(HIDDEN, HIDDEN, 93),
        gu: b.upload_gate_up("gu", &[gv, uv]).unwrap(),
        down: w(HIDDEN, INTER, 94),
    }
}

/// The fused ops of `rows` rows (fused = true) or their unfused compositions: the q|k|v of
/// `norm_matmul`, the SwiGLU output of `norm_gate_up_swiglu`, the residual after o_proj's and
/// down_proj's `matmul_residual`, as f32 bits.
fn layer_ops(
    b: &CudaBackend,
    l: &Layer,
    x_host: &[f32],
    a_host: &[f32],
    rows: usize,
    fused: bool,
) -> Vec<Vec<u32>> {
    let eps = 1e-5;
    let x = residual_from(b, &x_host[..rows * HIDDEN], rows, HIDDEN);
    let mut h = b.alloc(rows * HIDDEN).unwrap();
    let mut qkv = b.alloc(rows * QKV_N).unwrap();
    let mut scratch = b.alloc(rows * 2 * INTER).unwrap();
    let mut act = b.alloc(rows * INTER).unwrap();
    if fused {
        b.norm_matmul(&x, &l.norm_w, eps, rows, HIDDEN, &l.qkv, &mut h, &mut qkv)
            .unwrap();
        b.norm_gate_up_swiglu(
            &x,
            &l.norm_w,
            eps,
            rows,
            HIDDEN,
            &l.gu,
            &mut h,
            &mut scratch,
            &mut act,
            INTER,
        )
        .unwrap();
    } else {
        b.rms_norm(&x, &l.norm_w, &mut h, rows, HIDDEN, eps)
            .unwrap();
        b.matmul(&h, rows, &l.qkv, &mut qkv).unwrap();
        b.gate_up_swiglu(&h, rows, &l.gu, &mut scratch, &mut act, INTER)
            .unwrap();
    }
    let mut out = vec![
        bits(&down(b, &qkv, rows * QKV_N)),
        bits(&down(b, &act, rows * INTER)),
    ];
    for (w, k) in [(&l.o, HIDDEN), (&l.down, INTER)] {
        let xin = b.upload(&a_host[..rows * k]).unwrap();
        let mut r = residual_from(b, &x_host[..rows * HIDDEN], rows, HIDDEN);
        let mut delta = b.alloc(rows * HIDDEN).unwrap();
        if fused {
            b.matmul_residual(&xin, rows, w, &mut delta, &mut r, HIDDEN)
                .unwrap();
        } else {
            b.matmul(&xin, rows, w, &mut delta).unwrap();
            b.add_rms_norm(&mut r, &delta, &l.norm_w, &mut h, rows, HIDDEN, eps)
                .unwrap();
        }
        out.push(bits(&down(b, &r, rows * HIDDEN)));
    }
    out
}

/// The fused decode ops at 17–64 rows equal the unfused ops bit for bit (NORM prologue with the
/// multi-row sum of squares of rg4 / rg8, RES epilogue), on the rg8 and the rg4 backend, and the
/// two backends agree; rows r of the 64-row step equal the r-row step.
#[test]
#[ignore = "needs a GPU: see the header"]
fn the_fused_ops_at_17_to_64_rows_equal_the_unfused_ones_bit_for_bit() {
    let mut failures = Vec::new();
    for dtype in mid_dtypes() {
        let bs = [
            ("rg8", backend(dtype, "mma", "")),
            ("rg4", backend(dtype, "mma", "rg4")),
            ("rg8_norm32", backend(dtype, "mma", "norm32")),
            ("rg8w", backend(dtype, "mma", "wide0")),
        ];
        if bs[0].1.dense_matmul_kind() != DenseMatmul::Mma {
            println!("RESULT mid_fused dtype={dtype} skipped: no tensor-core kernels");
            continue;
        }
        let x_host: Vec<f32> = data(64 * HIDDEN, 90).iter().map(|v| 3.0 * v).collect();
        let a_host = data(64 * INTER, 97);
        let mut first: Option<Vec<Vec<Vec<u32>>>> = None;
        for (mid, b) in &bs {
            let l = layer(b);
            let full = layer_ops(b, &l, &x_host, &a_host, 64, true);
            let mut per_rows = Vec::new();
            for rows in ROWS {
                let f = layer_ops(b, &l, &x_host, &a_host, rows, true);
                let u = layer_ops(b, &l, &x_host, &a_host, rows, false);
                let names = ["norm_qkv", "norm_swiglu", "res_o", "res_down"];
                let neq: Vec<&str> = (0..4).filter(|&i| f[i] != u[i]).map(|i| names[i]).collect();
                let pre: Vec<&str> = (0..4)
                    .filter(|&i| f[i][..] != full[i][..f[i].len()])
                    .map(|i| names[i])
                    .collect();
                let ok = neq.is_empty() && pre.is_empty();
                println!(
                    "RESULT mid_fused dtype={dtype} mid={mid} rows={rows} fused_eq_unfused={} \
                     eq_rows_of_64={} ok={ok} {neq:?} {pre:?}",
                    neq.is_empty(),
                    pre.is_empty()
                );
                if !ok {
                    failures.push(format!("{dtype} {mid} rows {rows}: {neq:?} {pre:?}"));
                }
                per_rows.push(f);
            }
            match &first {
                None => first = Some(per_rows),
                Some(f0) => {
                    let same = *f0 == per_rows;
                    println!("RESULT mid_fused dtype={dtype} mid={mid} eq_rg8_backend={same}");
                    if !same {
                        failures.push(format!("{dtype} {mid}: differs from rg8"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The fused q|k|v + RoPE + KV write (`norm_matmul_rope_write`, NORM_ROPE) at 17–64 rows equals
/// `norm_matmul` then `qkv_rope_write` bit for bit (q directly, k / v through a paged attention
/// over each cache with the same q), on the rg8 and rg4 backends, fp8 and 16-bit caches.
#[test]
#[ignore = "needs a GPU: see the header"]
fn the_fused_rope_write_at_17_to_64_rows_equals_the_unfused_pair() {
    let (heads, kv_heads, hd) = (9usize, 3usize, 64usize);
    let params = AttentionParams {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    let num_blocks = 4096;
    let mut failures = Vec::new();
    for dtype in mid_dtypes() {
        for (mid, kv) in [("", "auto"), ("rg4", "auto"), ("", "fp8_e4m3")] {
            std::env::set_var("KILN_DENSE_MATMUL", "mma");
            std::env::set_var("KILN_DENSE_MID", mid);
            std::env::set_var("KILN_FUSED_DECODE_ROWS", "64");
            let b = gpu(dtype, kv);
            std::env::remove_var("KILN_DENSE_MATMUL");
            std::env::remove_var("KILN_DENSE_MID");
            std::env::remove_var("KILN_FUSED_DECODE_ROWS");
            if b.dense_matmul_kind() != DenseMatmul::Mma {
                println!("RESULT mid_rope dtype={dtype} skipped");
                continue;
            }
            let rope = b
                .create_rope(&RopeSpec {
                    rotary_dim: hd,
                    theta: 10000.0,
                    max_positions: 2048,
                })
                .unwrap();
            let spec = KvCacheSpec {
                num_layers: 1,
                num_blocks,
                block_size: 16,
                num_kv_heads: kv_heads,
                head_dim: hd,
            };
            let l = layer(&b);
            let x_host: Vec<f32> = data(64 * HIDDEN, 73).iter().map(|v| 3.0 * v).collect();
            for rows in [17usize, 32, 33, 40, 57, 64] {
                // Sequence r at position 5 + 29 r (< 1 900), blocks of its own.
                let mut next_block = 0;
                let batch = ForwardBatch {
                    token_ids: vec![1; rows],
                    seqs: (0..rows)
                        .map(|r| {
                            let pos = 5 + 29 * r;
                            let nb = (pos + 1).div_ceil(16);
                            next_block += nb;
                            SeqSlice {
                                start: r,
                                len: 1,
                                cached_len: pos,
                                block_table: (next_block - nb..next_block)
                                    .map(|b| b as u32)
                                    .collect(),
                                logits: LogitsFor::Last,
                                state_slot: None,
                            }
                        })
                        .collect(),
                };
                let input = batch.step_input(16, num_blocks, 50, 2048).unwrap();
                let st = b.prepare_step(&input).unwrap();
                let x = residual_from(&b, &x_host[..rows * HIDDEN], rows, HIDDEN);
                let mut h = b.alloc(rows * HIDDEN).unwrap();
                let sentinel = vec![7.0f32; rows * QKV_N];
                let mut qkv = b.upload(&sentinel).unwrap();
                let mut q_f = b.alloc(rows * heads * hd).unwrap();
                let mut cache_f = b.create_kv_cache(&spec).unwrap();
                b.norm_matmul_rope_write(
                    &x,
                    &l.norm_w,
                    1e-5,
                    rows,
                    HIDDEN,
                    &l.qkv,
                    &mut h,
                    &mut qkv,
                    &mut q_f,
                    &mut cache_f,
                    0,
                    &rope,
                    &st,
                    &params,
                )
                .unwrap();
                let fused_ran = bits(&down(&b, &qkv, rows * QKV_N)) == bits(&sentinel);
                let mut q_u = b.alloc(rows * heads * hd).unwrap();
                let mut cache_u = b.create_kv_cache(&spec).unwrap();
                b.rms_norm(&x, &l.norm_w, &mut h, rows, HIDDEN, 1e-5)
                    .unwrap();
                b.matmul(&h, rows, &l.qkv, &mut qkv).unwrap();
                b.qkv_rope_write(&qkv, &mut q_u, &mut cache_u, 0, &rope, &st, &params, None)
                    .unwrap();
                let mut att_f = b.alloc(rows * heads * hd).unwrap();
                let mut att_u = b.alloc(rows * heads * hd).unwrap();
                b.paged_attention(&q_u, &cache_f, 0, &st, &params, &mut att_f)
                    .unwrap();
                b.paged_attention(&q_u, &cache_u, 0, &st, &params, &mut att_u)
                    .unwrap();
                let n = rows * heads * hd;
                let q_eq = bits(&down(&b, &q_f, n)) == bits(&down(&b, &q_u, n));
                let kv_eq = bits(&down(&b, &att_f, n)) == bits(&down(&b, &att_u, n));
                let ok = fused_ran && q_eq && kv_eq;
                println!(
                    "RESULT mid_rope dtype={dtype} mid={} kv={kv} rows={rows} fused_ran={fused_ran} \
                     q_bits_equal={q_eq} kv_bits_equal={kv_eq} ok={ok}",
                    if mid.is_empty() { "rg8" } else { mid }
                );
                if !ok {
                    failures.push(format!("{dtype} {mid} {kv} rows {rows}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Median µs per call of `f(i)` (i = the call's index, for rotating weights): a warm-up round of
/// `copies` calls, then 5 reps of `iters` back-to-back calls, each rep ended by a synchronize.
fn median_us(b: &CudaBackend, copies: usize, mut f: impl FnMut(usize)) -> f64 {
    for i in 0..copies {
        f(i);
    }
    b.synchronize().unwrap();
    let iters = copies.max(64);
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let s = Instant::now();
            for i in 0..iters {
                f(i % copies);
            }
            b.synchronize().unwrap();
            s.elapsed().as_secs_f64() * 1e6 / iters as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[2]
}

/// Copies of an `n × k` weight that together pass 120 MB (more than the L2), at most 64.
fn copies_for(n: usize, k: usize) -> usize {
    (120_000_000 / (n * k * 2)).clamp(1, 64)
}

/// µs per call of the SmolLM2 shapes at 1 and 16–64 rows: each small-kernel row group (with
/// the x words preloaded, and as before `mma64`: `_nopre`), the GEMM (auto, t1, t3) and cuBLAS
/// (bf16, weights rotated).
#[test]
#[ignore = "needs a GPU: see the header"]
fn mid_rows_kernel_timings() {
    let dtype = "bf16";
    let b = backend(dtype, "mma", "");
    if b.dense_matmul_kind() != DenseMatmul::Mma {
        println!("RESULT mid_time skipped: no tensor-core kernels on this target");
        return;
    }
    let blas = backend(dtype, "cublas", "");
    // The small kernels as before `mma64` (each k block's x words loaded just before its mmas).
    std::env::set_var("KILN_DENSE_BPRE", "0");
    let nopre = backend(dtype, "mma", "");
    std::env::remove_var("KILN_DENSE_BPRE");
    // (n, k, name, output): the lm_head writes f32 logits, gate|up the SwiGLU.
    let shapes = [
        (960usize, 576usize, "qkv", MmaOut::Same),
        (576, 576, "o", MmaOut::Same),
        (3072, 576, "gate|up", MmaOut::Swiglu),
        (576, 1536, "down", MmaOut::Same),
        (49152, 576, "lm_head", MmaOut::F32),
    ];
    for (si, &(n, k, name, out)) in shapes.iter().enumerate() {
        let copies = copies_for(n, k);
        // The same values in every copy (distinct allocations: what matters is the traffic).
        let host = host16(dtype, n, k, 700 + si as u64);
        let ws: Vec<Weight> = (0..copies)
            .map(|_| upload16(&b, dtype, &host, n, k))
            .collect();
        let wbs: Vec<Weight> = (0..copies)
            .map(|_| upload16(&blas, dtype, &host, n, k))
            .collect();
        let wns: Vec<Weight> = (0..copies)
            .map(|_| upload16(&nopre, dtype, &host, n, k))
            .collect();
        for rows in [1usize, 16, 32, 48, 64] {
            let x = b.upload(&data(rows * k, 800)).unwrap();
            let xb = blas.upload(&data(rows * k, 800)).unwrap();
            let xn = nopre.upload(&data(rows * k, 800)).unwrap();
            let mut line = format!(
                "RESULT mid_time dtype={dtype} shape={name} n={n} k={k} rows={rows} copies={copies}"
            );
            let mut kernels = vec![
                ("rg1", MmaKernel::SmallRg(1)),
                ("rg2", MmaKernel::SmallRg(2)),
                ("rg4", MmaKernel::SmallRg(4)),
                ("rg8", MmaKernel::SmallRg(8)),
                ("gemm", MmaKernel::Gemm),
                ("t1", MmaKernel::GemmTile(GemmTile::T1)),
                ("t3", MmaKernel::GemmTile(GemmTile::T3)),
            ];
            if k <= 1024 {
                kernels.push(("rg8w", MmaKernel::SmallWide));
            }
            for (kname, kernel) in kernels {
                let mut o = b.mma_probe_alloc(rows, &ws[0], out).unwrap();
                let us = median_us(&b, copies, |i| {
                    b.mma_probe_run(&x, rows, &ws[i], kernel, &mut o).unwrap()
                });
                line += &format!(" {kname}={us:.2}");
            }
            for rg in [1usize, 2, 4, 8] {
                let kernel = MmaKernel::SmallRg(rg);
                let mut o = nopre.mma_probe_alloc(rows, &wns[0], out).unwrap();
                let us = median_us(&nopre, copies, |i| {
                    nopre
                        .mma_probe_run(&xn, rows, &wns[i], kernel, &mut o)
                        .unwrap()
                });
                line += &format!(" rg{rg}_nopre={us:.2}");
            }
            // cuBLAS: the plain product (its SwiGLU / f32 forms are separate kernels or the
            // logits path; the product is what the tiles compete with).
            let mut o = blas.alloc(rows * n).unwrap();
            let us = median_us(&blas, copies, |i| {
                blas.matmul(&xb, rows, &wbs[i], &mut o).unwrap()
            });
            line += &format!(" cublas={us:.2} (us)");
            println!("{line}");
        }
    }
}

/// µs per call of the fused decode ops against their unfused compositions at 32 and 64 rows,
/// on the rg8 and rg4 backends (bf16, one SmolLM2-shaped layer's weights rotated over 16
/// copies: 16 × 6.5 MB).
#[test]
#[ignore = "needs a GPU: see the header"]
fn mid_rows_fused_op_timings() {
    let dtype = "bf16";
    for mid in ["", "rg4", "wide0"] {
        let b = backend(dtype, "mma", mid);
        if b.dense_matmul_kind() != DenseMatmul::Mma {
            println!("RESULT mid_fused_time skipped: no tensor-core kernels on this target");
            return;
        }
        let copies = 16;
        let ls: Vec<Layer> = (0..copies).map(|_| layer(&b)).collect();
        let eps = 1e-5;
        for rows in [16usize, 32, 48, 64] {
            let x_host: Vec<f32> = data(rows * HIDDEN, 90).iter().map(|v| 3.0 * v).collect();
            let mut x = residual_from(&b, &x_host, rows, HIDDEN);
            let a = b.upload(&data(rows * INTER, 97)).unwrap();
            let mut h = b.alloc(rows * HIDDEN).unwrap();
            let mut qkv = b.alloc(rows * QKV_N).unwrap();
            let mut scratch = b.alloc(rows * 2 * INTER).unwrap();
            let mut act = b.alloc(rows * INTER).unwrap();
            let mut delta = b.alloc(rows * HIDDEN).unwrap();
            let mut t = Vec::new();
            t.push((
                "norm_qkv_fused",
                median_us(&b, copies, |i| {
                    let l = &ls[i];
                    b.norm_matmul(&x, &l.norm_w, eps, rows, HIDDEN, &l.qkv, &mut h, &mut qkv)
                        .unwrap()
                }),
            ));
            t.push((
                "norm_qkv_unfused",
                median_us(&b, copies, |i| {
                    let l = &ls[i];
                    b.rms_norm(&x, &l.norm_w, &mut h, rows, HIDDEN, eps)
                        .unwrap();
                    b.matmul(&h, rows, &l.qkv, &mut qkv).unwrap()
                }),
            ));
            t.push((
                "norm_swiglu_fused",
                median_us(&b, copies, |i| {
                    let l = &ls[i];
                    b.norm_gate_up_swiglu(
                        &x,
                        &l.norm_w,
                        eps,
                        rows,
                        HIDDEN,
                        &l.gu,
                        &mut h,
                        &mut scratch,
                        &mut act,
                        INTER,
                    )
                    .unwrap()
                }),
            ));
            t.push((
                "norm_swiglu_unfused",
                median_us(&b, copies, |i| {
                    let l = &ls[i];
                    b.rms_norm(&x, &l.norm_w, &mut h, rows, HIDDEN, eps)
                        .unwrap();
                    b.gate_up_swiglu(&h, rows, &l.gu, &mut scratch, &mut act, INTER)
                        .unwrap()
                }),
            ));
            t.push((
                "res_down_fused",
                median_us(&b, copies, |i| {
                    let l = &ls[i];
                    b.matmul_residual(&a, rows, &l.down, &mut delta, &mut x, HIDDEN)
                        .unwrap()
                }),
            ));
            t.push((
                "res_down_unfused",
                median_us(&b, copies, |i| {
                    let l = &ls[i];
                    b.matmul(&a, rows, &l.down, &mut delta).unwrap();
                    b.add_rms_norm(&mut x, &delta, &l.norm_w, &mut h, rows, HIDDEN, eps)
                        .unwrap()
                }),
            ));
            let mut line = format!(
                "RESULT mid_fused_time dtype={dtype} mid={} rows={rows}",
                if mid.is_empty() { "rg8" } else { mid }
            );
            for (name, us) in t {
                line += &format!(" {name}={us:.2}");
            }
            println!("{line} (us)");
        }
    }
}
