//! Qwen3.5 decode graphs on a GPU: decode steps of the hybrid replayed from CUDA graphs give the
//! same sampled tokens and the same logits, bit for bit, as the eager path on the same batches
//! (bucket-sized ones: 1 and 8 sequences; 3 sequences run padded to the bucket of 4, whose GEMMs
//! have more rows than the eager ones, so there tokens are asserted equal and logits within the
//! dtype's tolerance, and whether they are bitwise is printed), on the three tiny `qwen3_5`
//! fixtures at f32 / fp16 / bf16; the graphs really ran (counted replays). Midway every sequence
//! moves to another state slot (its state copied there, the old slot zeroed), so a graph that had
//! baked the slots in would read zeros and differ from the eager run.
//!
//! Overlap (`engine.overlap`): the hybrid runner queues steps on CUDA (`queues_steps` true): a
//! step submitted ahead with its tokens fed on the device from the step before gives the same
//! tokens as the same steps run one by one (runner level, graphs on and off, every fixture and
//! dtype), and the engine with overlap on gives every request the same tokens as with overlap
//! off (greedy and seeded sampling, a shared prompt prefix so hybrid prefix checkpoints are taken
//! and restored while steps are queued); the engine-level decode speed with overlap on / off is
//! printed. Batch invariance with graphs on (the default) is `cuda_qwen3_5_models`'
//! `batched_greedy_equals_each_alone_on_the_gpu`.
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
use kiln::engine::{
    spawn, test_support, Completion, EngineConfig, GenerateRequest, Prompt, SamplingParams,
};
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
        push_seq(&mut batch, p, 0, table(i), want(i), Some(slots[i]));
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
            push_seq(&mut next, &[id], lens[i], table(i), want(i), Some(slots[i]));
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
                let (same_tokens, same_logits, worst) = compare_steps(&eager, &replayed);
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
            push_seq(
                &mut next,
                &[id],
                32 + k,
                table(i),
                LogitsFor::Sample(SamplingRow::greedy()),
                Some(i as u32),
            );
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
    for dtype in half_dtypes() {
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

/// `n` sequences (prompts of different lengths) prefilled, then `steps` decode steps, every
/// sequence sampled greedily on the device; `pipelined`: each decode step is submitted before the
/// previous one is collected, its tokens fed on the device. Returns each sequence's tokens.
fn decode_tokens(
    m: &mut Qwen3_5<CudaBackend>,
    n: usize,
    steps: usize,
    pipelined: bool,
) -> Vec<Vec<u32>> {
    let vocab = m.vocab_size() as u32;
    let per_seq = MAX_MODEL_LEN / BLOCK;
    let table = |i: usize| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect::<Vec<_>>();
    let greedy = || LogitsFor::Sample(SamplingRow::greedy());
    let mut batch = ForwardBatch::default();
    let mut lens = Vec::new();
    for i in 0..n {
        let p: Vec<u32> = (0..(5 + 29 * i) % 90 + 3)
            .map(|t| (t as u32 * 17 + i as u32 * 11 + 2) % vocab)
            .collect();
        lens.push(p.len());
        push_seq(&mut batch, &p, 0, table(i), greedy(), Some(i as u32));
    }
    for i in 0..n {
        m.reset_state_slot(i as u32).expect("reset slot");
    }
    let decode = |lens: &[usize], ids: &[u32]| {
        let mut b = ForwardBatch::default();
        for i in 0..n {
            push_seq(
                &mut b,
                &[ids[i]],
                lens[i],
                table(i),
                greedy(),
                Some(i as u32),
            );
        }
        b
    };
    step_tokens(m, batch, n, steps, pipelined, |_, ids| {
        let b = decode(&lens, ids);
        for l in &mut lens {
            *l += 1;
        }
        b
    })
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn hybrid_steps_submitted_ahead_with_fed_tokens_give_the_same_tokens() {
    let steps = 12;
    let mut failures = Vec::new();
    for path in MODELS {
        let files = ModelFiles::open(&root().join(path)).expect("model");
        for dtype in dtypes() {
            for graphs in [true, false] {
                let mut m = model(&files, dtype, graphs);
                assert!(m.queues_steps(), "the CUDA hybrid runner queues steps");
                for n in [1usize, 3, 8] {
                    let sync = decode_tokens(&mut m, n, steps, false);
                    let piped = decode_tokens(&mut m, n, steps, true);
                    let same = sync == piped;
                    println!(
                        "RESULT hybrid_overlap model={path} dtype={dtype} graphs={graphs} seqs={n} \
                         steps={steps} tokens_equal={same}"
                    );
                    if !same {
                        failures.push(format!(
                            "{path} {dtype} graphs={graphs} n={n}: {sync:?} vs {piped:?}"
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// The tiny hybrid behind the engine (byte tokenizer; token-id prompts inside the 128-token
/// vocabulary), overlap on or off: every request's completion and the decode tokens/s (completion
/// tokens over the wall time of the whole batch).
fn engine_run(
    files: &ModelFiles,
    dtype: &str,
    overlap: bool,
    reqs: &[GenerateRequest],
) -> (Vec<Completion>, f64) {
    let per_seq = MAX_MODEL_LEN / BLOCK;
    let runner = Qwen3_5::load(
        gpu(dtype, "auto"),
        &files.config,
        files.weights.as_ref(),
        BLOCK,
        MAX_SEQS * per_seq * 2 + 1,
        2 * MAX_SEQS,
    )
    .expect("load")
    .reserve_workspace(512, MAX_SEQS)
    .with_decode_graphs(MAX_SEQS, MAX_MODEL_LEN);
    let cfg = EngineConfig {
        max_num_seqs: MAX_SEQS,
        max_num_batched_tokens: 512,
        max_model_len: MAX_MODEL_LEN,
        block_size: BLOCK,
        enable_prefix_caching: true,
        overlap,
        ..EngineConfig::default()
    };
    let h = spawn(
        Box::new(runner),
        test_support::byte_tokenizer(),
        cfg,
        "tiny-qwen3_5",
    )
    .expect("engine starts");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let t0 = std::time::Instant::now();
    let out: Vec<Completion> = rt.block_on(async {
        let pending: Vec<_> = reqs.iter().cloned().map(|r| h.submit(r)).collect();
        let mut out = Vec::new();
        for p in pending {
            out.push(p.await.expect("completion"));
        }
        out
    });
    let secs = t0.elapsed().as_secs_f64();
    h.shutdown();
    let tokens: u32 = out.iter().map(|c| c.usage.completion_tokens).sum();
    (out, tokens as f64 / secs)
}

/// `cuda_qwen3_5_graphs-<hash> --ignored --nocapture engine_overlap` (see the header).
#[test]
#[ignore = "needs a GPU: see the header"]
fn engine_overlap_on_and_off_give_the_same_tokens() {
    let files = ModelFiles::open(&root().join(MODELS[0])).expect("model");
    // 16 requests (8 run at once) sharing a 40-token prefix (prefix checkpoints of the state are
    // taken and restored), greedy and seeded sampling mixed, different lengths.
    let shared: Vec<u32> = (0..40u32).map(|t| (t * 7 + 3) % 128).collect();
    let reqs: Vec<GenerateRequest> = (0..16u32)
        .map(|i| {
            let mut ids = shared.clone();
            ids.extend((0..(3 + 11 * i) % 50).map(|t| (t * 13 + i * 5 + 1) % 128));
            GenerateRequest {
                prompt: Prompt::TokenIds(ids),
                sampling: SamplingParams {
                    max_tokens: Some(24 + 8 * (i % 4)),
                    temperature: if i % 2 == 0 { 0.0 } else { 0.8 },
                    seed: Some(u64::from(i) + 1),
                    ..SamplingParams::default()
                },
                deadline: None,
            }
        })
        .collect();
    let mut ok = true;
    for dtype in half_dtypes() {
        // A first engine of the dtype in this process pays one-time costs (lazily loaded kernel
        // modules, cuBLAS set-up) inside its timed span: a warm-up run, not counted, goes first.
        let _ = engine_run(&files, dtype, true, &reqs);
        let (off, off_tps) = engine_run(&files, dtype, false, &reqs);
        let (on, on_tps) = engine_run(&files, dtype, true, &reqs);
        let key = |c: &Completion| (c.token_ids.clone(), c.finish_reason);
        let same =
            off.iter().map(key).collect::<Vec<_>>() == on.iter().map(key).collect::<Vec<_>>();
        let cached: u32 = on.iter().map(|c| c.usage.cached_prompt_tokens).sum();
        println!(
            "RESULT hybrid_engine_overlap model=tiny-qwen3_5 dtype={dtype} requests={} tokens_equal={same} \
             cached_prompt_tokens={cached} overlap_off_tok_s={off_tps:.0} overlap_on_tok_s={on_tps:.0} speedup={:.2}",
            reqs.len(),
            on_tps / off_tps
        );
        ok &= same;
    }
    assert!(ok, "overlap changed some request's tokens");
}
