//! Decode graphs on a GPU: a decode step replayed from a CUDA graph gives the same sampled
//! tokens and the same logits, bit for bit, as the eager path on the same batch (a bucket-sized
//! one); a padded batch (a size between buckets) gives the same tokens and logits within the
//! dtype's tolerance (its GEMMs have more rows than the eager ones, and cuBLAS may pick another
//! kernel for them: f32 5 → 8 rows differed by 5e-5 on the H200); and the graphs really ran
//! (counted replays).
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run`):
//! `KILN_TEST_MODEL=/tmp/k/SmolLM2.gguf cuda_graphs-<hash> --ignored --test-threads=1 --nocapture`
//! and for the sm_70 path `source .gpu/shared/env70.sh` first (see tests/cuda_parity.rs).
//! Each test prints `RESULT` lines for docs/gpu-validation.md. Batch invariance with graphs on
//! (the default) is `cuda_parity`'s `batched_greedy_equals_each_alone_on_the_gpu`.
#![cfg(feature = "cuda")]

mod common;

use common::*;
use std::path::PathBuf;

use kiln::model::files::ModelFiles;
use kiln::model::llama::Llama;
use kiln::model::step::{ForwardBatch, ForwardOutput, LogitsFor, ModelRunner, SeqSlice};
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
    let want = |i: usize| {
        if i.is_multiple_of(2) {
            LogitsFor::Sample(SamplingRow::greedy())
        } else {
            LogitsFor::Last
        }
    };
    let table = |i: usize| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect::<Vec<_>>();
    let mut batch = ForwardBatch::default();
    for (i, p) in prompts.iter().enumerate() {
        batch.seqs.push(SeqSlice {
            start: batch.token_ids.len(),
            len: p.len(),
            cached_len: 0,
            block_table: table(i),
            logits: want(i),
            state_slot: None,
        });
        batch.token_ids.extend(p);
    }
    let mut outs = Vec::new();
    let mut lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    for _ in 0..=steps {
        let out = r.forward(&batch).expect("forward");
        let v = vocab as usize;
        let (mut sample, mut row) = (out.samples.iter(), 0);
        let mut next = ForwardBatch::default();
        for i in 0..n {
            let id = if i.is_multiple_of(2) {
                sample
                    .next()
                    .expect("sample")
                    .as_ref()
                    .expect("sampled")
                    .token_id
            } else {
                let l = &out.logits[row * v..(row + 1) * v];
                row += 1;
                (0..v)
                    .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
                    .unwrap() as u32
            };
            next.seqs.push(SeqSlice {
                start: i,
                len: 1,
                cached_len: lens[i],
                block_table: table(i),
                logits: want(i),
                state_slot: None,
            });
            next.token_ids.push(id);
            lens[i] += 1;
        }
        outs.push(out);
        batch = next;
    }
    outs
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn replayed_decode_steps_equal_the_eager_path_bit_for_bit() {
    let path = std::env::var("KILN_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("tests/fixtures/tiny-llama"));
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
            let (mut same_tokens, mut same_logits, mut worst) = (true, true, 0f32);
            for (e, r) in eager.iter().zip(&replayed) {
                let ids = |o: &ForwardOutput| {
                    o.samples
                        .iter()
                        .map(|s| s.as_ref().map(|s| s.token_id).ok())
                        .collect::<Vec<_>>()
                };
                same_tokens &= ids(e) == ids(r);
                same_logits &= bits(&e.logits) == bits(&r.logits);
                worst = worst.max(max_diff(&e.logits, &r.logits));
            }
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
