//! Qwen3.5 decode graphs on a GPU: decode steps of the hybrid replayed from CUDA graphs give the
//! same sampled tokens and the same logits, bit for bit, as the eager path on the same batches
//! (bucket-sized ones: 1 and 8 sequences; 3 sequences run padded to the bucket of 4, whose GEMMs
//! have more rows than the eager ones, so there tokens are asserted equal and logits within the
//! dtype's tolerance, and whether they are bitwise is printed), on the three tiny `qwen3_5`
//! fixtures at f32 / fp16 / bf16; the graphs really ran (counted replays). Midway every sequence
//! moves to another state slot (its state copied there, the old slot zeroed), so a graph that had
//! baked the slots in would read zeros and differ from the eager run.
//!
//! Overlap (`engine.overlap`): the hybrid runner computes a step at submission (it does not
//! queue steps, `ModelRunner::queues_steps` is false), so the engine resolves fed tokens on the
//! host and overlap on / off run these same `forward` calls; batch invariance with graphs on (the
//! default) is `cuda_qwen3_5_models`' `batched_greedy_equals_each_alone_on_the_gpu`.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run`),
//! from the repository root:
//! `cuda_qwen3_5_graphs-<hash> --ignored --test-threads=1 --nocapture`
//! and for the sm_70 path `source .gpu/shared/env70.sh` first. Each case prints a `RESULT` line
//! for docs/gpu-validation.md.
#![cfg(feature = "cuda")]

mod common;

use common::*;

use kiln::backend::cuda::CudaBackend;
use kiln::model::files::ModelFiles;
use kiln::model::qwen3_5::Qwen3_5;
use kiln::model::step::{ForwardBatch, ForwardOutput, LogitsFor, ModelRunner, SeqSlice};
use kiln::sampling::SamplingRow;

const MODELS: [&str; 3] = [
    "tests/fixtures/tiny-qwen3_5",
    "tests/fixtures/tiny-qwen3_5-vl",
    "tests/fixtures/tiny-qwen3_5-hd256",
];
const BLOCK: usize = 16;
const MAX_MODEL_LEN: usize = 256;
const MAX_SEQS: usize = 8;
/// Decode steps after the prefill; the slots move before step `MOVE_AT`.
const STEPS: usize = 10;
const MOVE_AT: usize = 5;

fn model(files: &ModelFiles, dtype: &str, graphs: bool) -> Qwen3_5<CudaBackend> {
    let per_seq = MAX_MODEL_LEN / BLOCK;
    let m = Qwen3_5::load(
        gpu(dtype, "auto"),
        &files.config,
        files.weights.as_ref(),
        BLOCK,
        MAX_SEQS * per_seq + 1,
        2 * MAX_SEQS,
    )
    .expect("load")
    .reserve_workspace(512, MAX_SEQS);
    if graphs {
        m.with_decode_graphs(MAX_SEQS, MAX_MODEL_LEN)
    } else {
        m
    }
}

/// `n` prompts of different lengths in slots `0..n`; even sequences are sampled on the device
/// (greedy), odd ones return raw logits; prefill, then `STEPS` decode steps, the sequences moved
/// to slots `n..2n` before step `MOVE_AT`. Returns every step's output.
fn run(m: &mut Qwen3_5<CudaBackend>, n: usize) -> Vec<ForwardOutput> {
    let vocab = m.vocab_size() as u32;
    let per_seq = MAX_MODEL_LEN / BLOCK;
    let prompts: Vec<Vec<u32>> = (0..n as u32)
        .map(|s| {
            (0..(3 + 41 * s) % 200 + 2)
                .map(|i| (i * 31 + s * 7 + 3) % vocab)
                .collect()
        })
        .collect();
    let want = alternate_logits;
    let table = |i: usize| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect::<Vec<_>>();
    let mut slots: Vec<u32> = (0..n as u32).collect();
    let mut batch = ForwardBatch::default();
    for (i, p) in prompts.iter().enumerate() {
        batch.seqs.push(SeqSlice {
            start: batch.token_ids.len(),
            len: p.len(),
            cached_len: 0,
            block_table: table(i),
            logits: want(i),
            state_slot: Some(slots[i]),
        });
        batch.token_ids.extend(p);
    }
    let mut outs = Vec::new();
    let mut lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    for step in 0..=STEPS {
        let out = m.forward(&batch).expect("forward");
        if step + 1 == MOVE_AT {
            for (i, s) in slots.iter_mut().enumerate() {
                let to = (n + i) as u32;
                m.copy_state_slot(*s, to).expect("copy slot");
                m.reset_state_slot(*s).expect("reset slot");
                *s = to;
            }
        }
        let ids = next_tokens(&out, n, vocab as usize);
        let mut next = ForwardBatch::default();
        for i in 0..n {
            let id = ids[i];
            next.seqs.push(SeqSlice {
                start: i,
                len: 1,
                cached_len: lens[i],
                block_table: table(i),
                logits: want(i),
                state_slot: Some(slots[i]),
            });
            next.token_ids.push(id);
            lens[i] += 1;
        }
        outs.push(out);
        batch = next;
    }
    outs
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn replayed_hybrid_decode_steps_equal_the_eager_path() {
    let mut failures = Vec::new();
    for path in MODELS {
        let files = ModelFiles::open(&root().join(path)).expect("model");
        for dtype in dtypes() {
            for n in [1usize, 3, 8] {
                let eager = run(&mut model(&files, dtype, false), n);
                let mut g = model(&files, dtype, true);
                let replayed = run(&mut g, n);
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
                    same_logits &= bits_equal(&e.logits, &r.logits);
                    worst = worst.max(max_diff(&e.logits, &r.logits));
                }
                let bucket = n.next_power_of_two();
                // Prefill is eager; the first decode step records; the other steps replay.
                let close = if bucket == n {
                    same_logits
                } else {
                    worst <= tol(dtype)
                };
                let ok =
                    !stats.disabled && stats.replays == (STEPS - 1) as u64 && same_tokens && close;
                println!(
                    "RESULT hybrid_graphs model={path} dtype={dtype} seqs={n} bucket={bucket} \
                     replays={} recorded={} graph_bytes={} tokens_equal={same_tokens} \
                     logits_bitwise={same_logits} max_abs_diff={worst:e} {}",
                    stats.replays,
                    stats.recorded,
                    stats.device_bytes,
                    if ok { "ok" } else { "FAIL" }
                );
                if !ok {
                    failures.push(format!("{path} {dtype} n={n}: {stats:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Decode speed of the tiny hybrid through the runner, graphs on and off: `n` sequences (each a
/// 32-token prompt, prefilled together), then `steps` decode steps, every sequence sampled
/// greedily on the device (the sampled ids read back each step, as the engine does). Prints
/// tokens/s of the decode steps (wall time, after 8 warm-up steps that also record the graph);
/// asserts only that both runs made the same tokens.
fn decode_speed(
    files: &ModelFiles,
    dtype: &str,
    graphs: bool,
    n: usize,
    steps: usize,
) -> (f64, Vec<u32>) {
    let per_seq = MAX_MODEL_LEN / BLOCK;
    let mut m = Qwen3_5::load(
        gpu(dtype, "auto"),
        &files.config,
        files.weights.as_ref(),
        BLOCK,
        n * per_seq + 1,
        n,
    )
    .expect("load")
    .reserve_workspace(512, n);
    if graphs {
        m = m.with_decode_graphs(n, MAX_MODEL_LEN);
    }
    let vocab = m.vocab_size() as u32;
    let table = |i: usize| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect::<Vec<_>>();
    let mut batch = ForwardBatch::default();
    for i in 0..n {
        batch.seqs.push(SeqSlice {
            start: batch.token_ids.len(),
            len: 32,
            cached_len: 0,
            block_table: table(i),
            logits: LogitsFor::Sample(SamplingRow::greedy()),
            state_slot: Some(i as u32),
        });
        batch
            .token_ids
            .extend((0..32u32).map(|t| (t * 13 + i as u32 * 5 + 1) % vocab));
    }
    let warm = 8;
    let mut tokens = Vec::new();
    let mut start = std::time::Instant::now();
    for k in 0..=warm + steps {
        if k == warm + 1 {
            start = std::time::Instant::now();
        }
        let out = m.forward(&batch).expect("forward");
        let mut next = ForwardBatch::default();
        for (i, s) in out.samples.iter().enumerate() {
            let id = s.as_ref().expect("sampled").token_id;
            tokens.push(id);
            next.seqs.push(SeqSlice {
                start: i,
                len: 1,
                cached_len: 32 + k,
                block_table: table(i),
                logits: LogitsFor::Sample(SamplingRow::greedy()),
                state_slot: Some(i as u32),
            });
            next.token_ids.push(id);
        }
        batch = next;
    }
    let secs = start.elapsed().as_secs_f64();
    (n as f64 * steps as f64 / secs, tokens)
}

/// `cuda_qwen3_5_graphs-<hash> --ignored --nocapture hybrid_decode_speed` (see the header).
#[test]
#[ignore = "needs a GPU: a measurement, printed"]
fn hybrid_decode_speed_with_and_without_graphs() {
    let files = ModelFiles::open(&root().join(MODELS[0])).expect("model");
    let steps = 200;
    let mut same = true;
    for dtype in ["bf16", "fp16"] {
        for n in [1usize, 16] {
            let (eager, te) = decode_speed(&files, dtype, false, n, steps);
            let (graphs, tg) = decode_speed(&files, dtype, true, n, steps);
            same &= te == tg;
            println!(
                "RESULT hybrid_decode_speed model=tiny-qwen3_5 dtype={dtype} seqs={n} steps={steps} \
                 eager_tok_s={eager:.0} graphs_tok_s={graphs:.0} speedup={:.2} tokens_equal={}",
                graphs / eager,
                te == tg
            );
        }
    }
    assert!(same, "graphs changed the tokens");
}
