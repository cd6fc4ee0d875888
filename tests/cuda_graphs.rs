//! Decode graphs on a GPU: a decode step replayed from a CUDA graph gives the same sampled
//! tokens and the same logits, bit for bit, as the eager path on the same batch (a bucket-sized
//! one); a padded batch (a size between buckets) gives the same tokens and logits within the
//! dtype's tolerance (its GEMMs have more rows than the eager ones, and cuBLAS may pick another
//! kernel for them: f32 5 → 8 rows differed by 5e-5 on the H200); and the graphs really ran
//! (counted replays). Overlap: steps submitted ahead, their decode tokens fed on the device from
//! the previous step's sampled ids (`ModelRunner::submit` / `collect`), give the same tokens as
//! the synchronous loop, with graphs and eagerly.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run`):
//! `KILN_TEST_MODEL=/tmp/k/SmolLM2.gguf cuda_graphs-<hash> --ignored --test-threads=1 --nocapture`
//! and for the sm_70 path `source .gpu/shared/env70.sh` first (see tests/cuda_parity.rs).
//! Each test prints `RESULT` lines for docs/gpu-validation.md. Batch invariance with graphs on
//! (the default) is `cuda_parity`'s `batched_greedy_equals_each_alone_on_the_gpu`.
#![cfg(feature = "cuda")]

mod common;

use common::*;

use kiln::model::files::ModelFiles;
use kiln::model::llama::Llama;
use kiln::model::step::{ForwardBatch, ForwardOutput, LogitsFor, ModelRunner};
use kiln::sampling::SamplingRow;

const BLOCK: usize = 16;
const BLOCKS: usize = 512;
const MAX_MODEL_LEN: usize = 1024;
const MAX_SEQS: usize = 8;

fn llama(files: &ModelFiles, dtype: &str, graphs: bool) -> Llama<kiln::backend::cuda::CudaBackend> {
    let m = Llama::load(
        gpu(dtype, "auto"),
        &files.config,
        files.weights.as_ref(),
        BLOCK,
        BLOCKS + 1,
    )
    .expect("load")
    .reserve_workspace(512, MAX_SEQS);
    if graphs {
        m.with_decode_graphs(MAX_SEQS, MAX_MODEL_LEN)
    } else {
        m
    }
}

/// `n` prompts of different lengths; even sequences are sampled on the device (greedy), odd ones
/// return raw logits; prefill, then `steps` decode steps. Returns every step's output.
fn run(r: &mut dyn ModelRunner, n: usize, steps: usize) -> Vec<ForwardOutput> {
    let vocab = r.vocab_size() as u32;
    let per_seq = MAX_MODEL_LEN / BLOCK;
    let prompts: Vec<Vec<u32>> = (0..n as u32)
        .map(|s| {
            (0..(3 + 41 * s) % 600 + 2)
                .map(|i| (i * 31 + s * 7 + 3) % vocab.min(5000))
                .collect()
        })
        .collect();
    let want = alternate_logits;
    let table = |i: usize| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect::<Vec<_>>();
    let mut batch = ForwardBatch::default();
    for (i, p) in prompts.iter().enumerate() {
        push_seq(&mut batch, p, 0, table(i), want(i), None);
    }
    let mut outs = Vec::new();
    let mut lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    for _ in 0..=steps {
        let out = r.forward(&batch).expect("forward");
        let ids = next_tokens(&out, n, vocab as usize);
        let mut next = ForwardBatch::default();
        for i in 0..n {
            let id = ids[i];
            push_seq(&mut next, &[id], lens[i], table(i), want(i), None);
            lens[i] += 1;
        }
        outs.push(out);
        batch = next;
    }
    outs
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn replayed_decode_steps_equal_the_eager_path_bit_for_bit() {
    let path = test_model_path();
    let files = ModelFiles::open(&path).expect("model");
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let steps = 10;
    let mut failures = Vec::new();
    for dtype in dtypes() {
        for n in [1usize, 2, 3, 4, 5, 8] {
            let eager = run(&mut llama(&files, dtype, false), n, steps);
            let mut g = llama(&files, dtype, true);
            let replayed = run(&mut g, n, steps);
            let stats = g.graph_stats().expect("graphs on");
            let (same_tokens, same_logits, worst) = compare_steps(&eager, &replayed);
            println!(
                "RESULT graphs model={name} dtype={dtype} seqs={n} bucket={} replays={} \
                 recorded={} graph_bytes={} tokens_equal={same_tokens} logits_bitwise={same_logits} \
                 max_abs_diff={worst:e}",
                n.next_power_of_two(),
                stats.replays,
                stats.recorded,
                stats.device_bytes
            );
            // Prefill is eager; the first decode step records; the other steps replay.
            let bucket_sized = n.is_power_of_two() || n == MAX_SEQS;
            let close = if bucket_sized {
                same_logits
            } else {
                worst <= tol(dtype)
            };
            let ok = !stats.disabled && stats.replays == (steps - 1) as u64 && same_tokens && close;
            if !ok {
                failures.push(format!("{dtype} n={n}: {stats:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// `n` sequences decoded `steps` tokens each, every one sampled on the device: greedy, seeded
/// sampling with fixed draws, and logprobs mixed (both output layouts of the sampler). With
/// `pipelined`, step k+1 is submitted before step k is collected, its tokens fed from step k's
/// sampled ids on the device; else each step is collected and its tokens put in the next batch.
fn decode_tokens(
    r: &mut dyn ModelRunner,
    n: usize,
    steps: usize,
    pipelined: bool,
) -> Vec<Vec<u32>> {
    let vocab = r.vocab_size() as u32;
    let per_seq = MAX_MODEL_LEN / BLOCK;
    let table = |i: usize| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect::<Vec<_>>();
    let row = |i: usize, k: usize| match i % 3 {
        0 => SamplingRow::greedy(),
        1 => SamplingRow {
            temperature: 0.8,
            top_p: 0.9,
            draw: Some(((i * 37 + k * 11) % 100) as f64 / 100.0),
            ..SamplingRow::greedy()
        },
        _ => SamplingRow {
            logprobs: Some(2),
            ..SamplingRow::greedy()
        },
    };
    let mut lens = Vec::new();
    let mut batch = ForwardBatch::default();
    for i in 0..n {
        let p: Vec<u32> = (0..(5 + 37 * i as u32) % 300 + 2)
            .map(|t| (t * 31 + i as u32 * 7 + 3) % vocab.min(5000))
            .collect();
        lens.push(p.len());
        push_seq(
            &mut batch,
            &p,
            0,
            table(i),
            LogitsFor::Sample(row(i, 0)),
            None,
        );
    }
    let decode = |lens: &[usize], k: usize, ids: &[u32]| {
        let mut b = ForwardBatch::default();
        for i in 0..n {
            push_seq(
                &mut b,
                &[ids[i]],
                lens[i],
                table(i),
                LogitsFor::Sample(row(i, k)),
                None,
            );
        }
        b
    };
    step_tokens(r, batch, n, steps, pipelined, |k, ids| {
        let b = decode(&lens, k, ids);
        for l in &mut lens {
            *l += 1;
        }
        b
    })
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn steps_submitted_ahead_with_fed_tokens_give_the_same_tokens() {
    let path = test_model_path();
    let files = ModelFiles::open(&path).expect("model");
    let steps = 12;
    let mut failures = Vec::new();
    for dtype in dtypes() {
        for graphs in [true, false] {
            // One runner per case: every run prefills its sequences from position 0 (the cache's
            // old contents past a context are never read), so runs can share it.
            eprintln!("PROGRESS load {dtype} graphs={graphs}");
            let mut a = llama(&files, dtype, graphs);
            assert!(a.queues_steps(), "the CUDA runner queues steps");
            for n in [1usize, 3, 8] {
                let sync = decode_tokens(&mut a, n, steps, false);
                let piped = decode_tokens(&mut a, n, steps, true);
                let same = sync == piped;
                println!(
                    "RESULT overlap dtype={dtype} graphs={graphs} seqs={n} steps={steps} tokens_equal={same}"
                );
                if !same {
                    failures.push(format!(
                        "{dtype} graphs={graphs} n={n}: {sync:?} vs {piped:?}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
