//! Batch invariance across the fused / unfused llama layer (issue 8 item 9) on a GPU: under the
//! default dense matmul of sm_80+ with 16-bit compute (`mma`), a step of at most
//! `KILN_FUSED_DECODE_ROWS` tokens (16 by default under `mma`: `mma64` measured fusing past 16 rows slower) runs the fused decode ops (RMSNorm in the
//! matmul prologue, RoPE / KV write and the residual add in the epilogues) and a larger step the
//! unfused ops; a sequence's logits must have the same f32 bits either way.
//!
//! - `the_fused_norm_equals_the_unfused_norms_bit_for_bit`: the op level: `norm_matmul` (dense.cu's
//!   NORM prologue) equals `rms_norm` (the `_xf32` entry point) + `matmul`, and after an
//!   `add_rms_norm` (`_rf32`) the fused prologue on the updated residual equals its output +
//!   `matmul`, at 1, 16, 32, 40 and 64 rows (the 8-, 16-, 32- and 64-row tiles) and several widths.
//! - `a_sequence_has_the_same_logits_fused_and_unfused`: whole models (the tiny llama fixture and
//!   `KILN_TEST_MODEL` when set), bf16 and fp16: one sequence's prefill logits (every position)
//!   and those of several decode steps, computed alone (fused: 5 prefill rows, 1 decode row),
//!   beside 8 one-token sequences (fused, the 16-row tile), beside 17 two-token sequences (39 and
//!   18 rows, the 64- and 32-row tiles), beside 40 and 63 one-token sequences (45 / 41 rows; 68 /
//!   64 rows: above the default fused bound of 16 these run unfused, the config names keep the
//!   `mma64` run-1 layout where they were fused) and beside 80 two-token sequences (the GEMM), compared bit for bit with the alone run.
//!   `KILN_DENSE_MATMUL=cublas` is run too and only reported (it is not batch-invariant). On the
//!   sm_70 path (`KILN_CUDA_ARCH=compute_70`) the default is `fma` (nothing fused, one kernel for
//!   every step) and fp16 alone: asserted the same way.
//!
//! Every comparison prints a `RESULT` line (model, dtype, dense kind, configuration, phase, rows,
//! bits equal, max |Δ|); a failed forward is reported with the batch's shape and the error, not a
//! panic, so one run shows every failure.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run --test
//! cuda_fused_invariance`):
//! `KILN_TEST_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf cuda_fused_invariance-<hash> --ignored
//! --test-threads=1 --nocapture` (from the repository root).
#![cfg(feature = "cuda")]

mod common;

use std::path::Path;

use common::dense::{residual_from, weight_f32};
use common::*;
use kiln::backend::cuda::{CudaBackend, DenseMatmul};
use kiln::backend::Backend;
use kiln::engine::{Device, EngineConfig};
use kiln::model::files::ModelFiles;
use kiln::model::runner::build_runner_for;
use kiln::model::step::{ForwardBatch, LogitsFor, ModelRunner};

/// A backend whose dense matmuls take `kind` (`None`: the default, `KILN_DENSE_MATMUL` unset).
fn backend(dtype: &str, kind: Option<&str>) -> CudaBackend {
    // SAFETY (edition 2021: a safe call): the tests run on one thread (`--test-threads=1`).
    match kind {
        Some(k) => std::env::set_var("KILN_DENSE_MATMUL", k),
        None => std::env::remove_var("KILN_DENSE_MATMUL"),
    }
    let b = gpu(dtype, "auto");
    std::env::remove_var("KILN_DENSE_MATMUL");
    b
}

fn weight(b: &CudaBackend, n: usize, k: usize, seed: u64) -> <CudaBackend as Backend>::Weight {
    weight_f32(b, &data(n * k, seed), n, k)
}

/// How many f32 values of `a` and `b` differ in their bits, and the max |Δ|.
fn diff(a: &[f32], b: &[f32]) -> (usize, f32) {
    if a.len() != b.len() {
        return (usize::MAX, f32::INFINITY);
    }
    let n = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    (n, max_diff(a, b))
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn the_fused_norm_equals_the_unfused_norms_bit_for_bit() {
    let mut failures = Vec::new();
    for dtype in dtypes().into_iter().filter(|d| *d != "f32") {
        let b = backend(dtype, None);
        if b.dense_matmul_kind() != DenseMatmul::Mma || b.fused_decode_limit() == 0 {
            println!(
                "RESULT fused_norm dtype={dtype} skipped: dense {:?}, fused limit {} ({})",
                b.dense_matmul_kind(),
                b.fused_decode_limit(),
                b.name()
            );
            continue;
        }
        let n = 96;
        for dim in [64usize, 576, 1000, 4096] {
            let nw = b.upload(&data(dim, 7)).expect("norm weight");
            let w = weight(&b, n, dim, 8);
            for rows in [1usize, 16, 32, 40, 64] {
                let host: Vec<f32> = data(rows * dim, 9).iter().map(|v| 3.0 * v).collect();
                let delta_host = data(rows * dim, 10);
                let eps = 1e-5;
                let fused = |x: &<CudaBackend as Backend>::Buffer| -> Vec<f32> {
                    let mut h = b.alloc(rows * dim).expect("alloc");
                    let mut out = b.alloc(rows * n).expect("alloc");
                    b.norm_matmul(x, &nw, eps, rows, dim, &w, &mut h, &mut out)
                        .expect("norm_matmul");
                    down(&b, &out, rows * n)
                };
                let unfused = |h: &<CudaBackend as Backend>::Buffer| -> Vec<f32> {
                    let mut out = b.alloc(rows * n).expect("alloc");
                    b.matmul(h, rows, &w, &mut out).expect("matmul");
                    down(&b, &out, rows * n)
                };
                // (a) rms_norm of the f32 stream (_xf32) + matmul vs the fused prologue.
                let x = residual_from(&b, &host, rows, dim);
                let mut h = b.alloc(rows * dim).expect("alloc");
                b.rms_norm(&x, &nw, &mut h, rows, dim, eps)
                    .expect("rms_norm");
                let (want, got) = (unfused(&h), fused(&x));
                let (nd_a, md_a) = diff(&want, &got);
                // (b) add_rms_norm (_rf32: residual += delta, then the norm) + matmul vs the
                // fused prologue on the residual it updated.
                let mut r = residual_from(&b, &host, rows, dim);
                let delta = b.upload(&delta_host).expect("upload");
                b.add_rms_norm(&mut r, &delta, &nw, &mut h, rows, dim, eps)
                    .expect("add_rms_norm");
                let (want, got) = (unfused(&h), fused(&r));
                let (nd_b, md_b) = diff(&want, &got);
                println!(
                    "RESULT fused_norm dtype={dtype} dim={dim} rows={rows} \
                     xf32_differing={nd_a} xf32_max_abs={md_a:e} \
                     rf32_differing={nd_b} rf32_max_abs={md_b:e}"
                );
                if nd_a != 0 || nd_b != 0 {
                    failures.push(format!(
                        "{dtype} dim {dim} rows {rows}: xf32 {nd_a} values differ (max {md_a:e}), \
                         rf32 {nd_b} (max {md_b:e})"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Tokens of the sequence under test's prompt.
const PROMPT_LEN: usize = 5;
/// Decode steps compared after the prefill.
const DECODE_STEPS: usize = 4;

/// A batch configuration: the sequence under test beside `fillers` other sequences of
/// `filler_len` prompt tokens (each then decodes one token per step, as the sequence does).
struct Config {
    name: &'static str,
    fillers: usize,
    filler_len: usize,
}

const CONFIGS: [Config; 6] = [
    // Prefill 5 rows, decode 1 row: the fused layer, one 8-row tile.
    Config {
        name: "alone",
        fillers: 0,
        filler_len: 0,
    },
    // Prefill 13 rows, decode 9: fused, the 16-row tile (row group 2).
    Config {
        name: "fused_rg2",
        fillers: 8,
        filler_len: 1,
    },
    // Prefill 39 rows, decode 18: unfused under the default bound of 16 (fused only where
    // KILN_FUSED_DECODE_ROWS raises it), the 64-row
    // tile (row group 8) and the 32-row tile (row group 4).
    Config {
        name: "fused_rg8_rg4",
        fillers: 17,
        filler_len: 2,
    },
    // Prefill 45 rows, decode 41: unfused by default (above the fused bound), the 64-row tile.
    Config {
        name: "fused_rg8",
        fillers: 40,
        filler_len: 1,
    },
    // Prefill 68 rows, decode 64: unfused (the GEMM), then the 64-row step (unfused by default).
    Config {
        name: "unfused_gemm_fused_64",
        fillers: 63,
        filler_len: 1,
    },
    // Prefill 165 rows, decode 81: unfused, the GEMM (> 64 rows).
    Config {
        name: "unfused_large",
        fillers: 80,
        filler_len: 2,
    },
];

/// A runner of `files` on GPU 0 (as `tests/common`'s `runner`, with room for 81 sequences), or
/// the error that prevented it.
fn build(files: &ModelFiles, dtype: &str) -> Result<Box<dyn ModelRunner>, String> {
    let engine = EngineConfig {
        device: Device::Cuda(0),
        dtype: dtype.into(),
        kv_cache_dtype: "auto".into(),
        max_model_len: 256,
        max_num_batched_tokens: 512,
        max_num_seqs: 128,
        gpu_memory_utilization: 0.1,
        ..EngineConfig::default()
    };
    build_runner_for(
        &files.config,
        files.weights.as_ref(),
        &engine.runner_options(),
    )
    .map_err(|e| format!("build_runner_for: {e:?}"))
}

/// The sequence under test's logits in configuration `c`: `[phase]` with phase 0 the prefill
/// (PROMPT_LEN rows) and 1..=DECODE_STEPS the decode steps (1 row each), and each step's token
/// count. The sequence sits at index 1 of the batch when there are fillers (not the first row).
fn run_config(
    r: &mut dyn ModelRunner,
    vocab: usize,
    c: &Config,
) -> Result<(Vec<Vec<f32>>, Vec<usize>), String> {
    let v = vocab.min(5000) as u32;
    let bs = r.cache_geometry().block_size;
    let per_seq = (PROMPT_LEN.max(c.filler_len) + DECODE_STEPS + 1).div_ceil(bs);
    let n = c.fillers + 1;
    let me = usize::from(c.fillers > 0);
    let prompt = |j: usize| -> Vec<u32> {
        if j == me {
            (0..PROMPT_LEN as u32).map(|i| (i * 37 + 11) % v).collect()
        } else {
            (0..c.filler_len as u32)
                .map(|i| (j as u32 * 13 + i * 7 + 3) % v)
                .collect()
        }
    };
    let table = |j: usize| ((j * per_seq) as u32..((j + 1) * per_seq) as u32).collect::<Vec<_>>();
    let mut out = Vec::new();
    let mut tokens = Vec::new();
    for phase in 0..=DECODE_STEPS {
        let mut batch = ForwardBatch::default();
        for j in 0..n {
            let p = prompt(j);
            let logits = if j == me && phase == 0 {
                LogitsFor::All
            } else {
                LogitsFor::Last
            };
            if phase == 0 {
                push_seq(&mut batch, &p, 0, table(j), logits, None);
            } else {
                let id = ((phase as u32) * 101 + j as u32 * 5 + 7) % v;
                let id = if j == me {
                    (phase as u32 * 101 + 7) % v
                } else {
                    id
                };
                push_seq(
                    &mut batch,
                    &[id],
                    p.len() + phase - 1,
                    table(j),
                    logits,
                    None,
                );
            }
        }
        let got = r.forward(&batch).map_err(|e| {
            format!(
                "forward failed: config {} phase {phase}: {} sequences, {} tokens, block size \
                 {bs}, {per_seq} blocks per sequence: {e:?}",
                c.name,
                n,
                batch.token_ids.len()
            )
        })?;
        let rows_before = if me == 1 { 1 } else { 0 };
        let my_rows = if phase == 0 { PROMPT_LEN } else { 1 };
        let at = rows_before * vocab;
        let want_len = (n - 1 + my_rows) * vocab;
        if got.logits.len() != want_len {
            return Err(format!(
                "config {} phase {phase}: {} logits, expected {want_len} ({} rows of {vocab})",
                c.name,
                got.logits.len(),
                n - 1 + my_rows
            ));
        }
        out.push(got.logits[at..at + my_rows * vocab].to_vec());
        tokens.push(batch.token_ids.len());
    }
    Ok((out, tokens))
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn a_sequence_has_the_same_logits_fused_and_unfused() {
    let mut models = vec![root().join("tests/fixtures/tiny-llama")];
    if let Ok(p) = std::env::var("KILN_TEST_MODEL") {
        models.push(p.into());
    }
    let mut failures = Vec::new();
    for path in &models {
        let name = Path::new(path)
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let files = match ModelFiles::open(path) {
            Ok(f) => f,
            Err(e) => {
                failures.push(format!("{name}: open: {e:?}"));
                continue;
            }
        };
        let vocab = files.config.vocab_size;
        // 16-bit dtypes only (f32 compute takes cuBLAS); no bf16 on a compute_70 run.
        let dtypes: Vec<&str> = dtypes().into_iter().filter(|d| *d != "f32").collect();
        for dtype in dtypes {
            for kind in [None, Some("cublas")] {
                let kind_name = kind.unwrap_or("default");
                match kind {
                    Some(k) => std::env::set_var("KILN_DENSE_MATMUL", k),
                    None => std::env::remove_var("KILN_DENSE_MATMUL"),
                }
                let probe = gpu(dtype, "auto");
                let (dense, limit) = (probe.dense_matmul_kind(), probe.fused_decode_limit());
                drop(probe);
                let built = build(&files, dtype);
                std::env::remove_var("KILN_DENSE_MATMUL");
                // Only the batch-invariant default is asserted (`mma` on sm_80+, `fma` below,
                // where nothing is fused and every step takes the one kernel); cuBLAS is reported.
                let asserted =
                    kind.is_none() && matches!(dense, DenseMatmul::Mma | DenseMatmul::Fma);
                println!(
                    "RESULT fused_invariance model={name} dtype={dtype} kind={kind_name} \
                     dense={dense:?} fused_limit={limit} asserted={asserted}"
                );
                let mut r = match built {
                    Ok(r) => r,
                    Err(e) => {
                        failures.push(format!("{name} {dtype} {kind_name}: {e}"));
                        continue;
                    }
                };
                let mut alone: Option<Vec<Vec<f32>>> = None;
                for c in &CONFIGS {
                    let (got, tokens) = match run_config(r.as_mut(), vocab, c) {
                        Ok(g) => g,
                        Err(e) => {
                            let msg = format!("{name} {dtype} {kind_name}: {e}");
                            println!("RESULT fused_invariance ERROR {msg}");
                            if asserted {
                                failures.push(msg);
                            }
                            continue;
                        }
                    };
                    let Some(want) = &alone else {
                        let finite = got.iter().flatten().all(|v| v.is_finite());
                        println!(
                            "RESULT fused_invariance model={name} dtype={dtype} kind={kind_name} \
                             config=alone tokens={tokens:?} finite={finite}"
                        );
                        if !finite && asserted {
                            failures.push(format!("{name} {dtype}: alone logits not finite"));
                        }
                        alone = Some(got);
                        continue;
                    };
                    for (phase, (w, g)) in want.iter().zip(&got).enumerate() {
                        let (nd, md) = diff(w, g);
                        let what = if phase == 0 {
                            "prefill".to_string()
                        } else {
                            format!("decode{phase}")
                        };
                        println!(
                            "RESULT fused_invariance model={name} dtype={dtype} kind={kind_name} \
                             config={} phase={what} step_tokens={} bits_equal={} \
                             differing={nd}/{} max_abs={md:e}",
                            c.name,
                            tokens[phase],
                            nd == 0,
                            w.len()
                        );
                        if nd != 0 && asserted {
                            failures.push(format!(
                                "{name} {dtype} {}: {what} ({} tokens in the step): {nd} of {} \
                                 logits differ from the alone run, max |Δ| {md:e}",
                                c.name,
                                tokens[phase],
                                w.len()
                            ));
                        }
                    }
                }
                if alone.is_none() && asserted {
                    failures.push(format!("{name} {dtype}: the alone run failed"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
