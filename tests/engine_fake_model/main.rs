//! The engine end to end against a deterministic fake model (no weights, fast, CI).
//!
//! `FakeRunner` stores, for every token it computes, a hash of the sequence's whole history
//! into the KV slot named by the block table, and derives each logits row from ALL the slots of
//! the sequence read back through its block table. So the tokens a request gets depend on the
//! scheduler handing the runner correct block tables: a wrong table, a block shared when it
//! should not be, or a preempted sequence resumed from the wrong state changes the outputs (or
//! makes the runner report a slot it never wrote). Outputs are compared between runs that must
//! agree (tiny vs large KV cache, alone vs batched), never against hard-coded tokens.
//!
//! Split by concept: `fake.rs` (the fake runner and its reference), `generation.rs` (tokens, the
//! prefix cache, preemption, limits, stop rules, logprobs), `faults.rs` (panics, OOM, bad requests,
//! shutdown, stats, chat prompts), `overlap.rs` (overlap on = off); the test setup is here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln::engine::test_support;
use kiln::engine::{
    spawn, ChatMessage, Completion, EngineConfig, EngineHandle, FinishReason, GenerateRequest,
    Prompt, SamplingParams,
};
use kiln::error::EngineError;
use kiln::model::step::{
    CacheGeometry, Deferred, Feed, ForwardBatch, ForwardOutput, LogitsFor, ModelRunner, Submitted,
};
use kiln::sampling::sample_row;
use kiln::tokenizer::Tokenizer;

mod fake;
mod faults;
mod generation;
mod overlap;

use fake::*;

struct Setup {
    num_blocks: usize,
    block_size: usize,
    max_pos: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    prefix_caching: bool,
    step_delay: Duration,
    panic_on_token: Option<u32>,
    oom_on_token: Option<u32>,
    /// Run the fake model behind a device-like queue ([`Deferred`]), so the engine overlaps:
    /// it builds and submits step N+1 before step N is computed.
    overlap: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            num_blocks: 512,
            block_size: 4,
            max_pos: 512,
            max_num_seqs: 16,
            max_num_batched_tokens: 256,
            prefix_caching: true,
            step_delay: Duration::ZERO,
            panic_on_token: None,
            oom_on_token: None,
            overlap: false,
        }
    }
}

impl Setup {
    fn start(self) -> (EngineHandle, Probe) {
        let probe = Probe::default();
        let runner = FakeRunner {
            block_size: self.block_size,
            kv: vec![vec![None; self.block_size]; self.num_blocks],
            max_pos: self.max_pos,
            step_delay: self.step_delay,
            panic_on_token: self.panic_on_token,
            oom_on_token: self.oom_on_token,
            probe: probe.clone(),
        };
        let cfg = EngineConfig {
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            block_size: self.block_size,
            enable_prefix_caching: self.prefix_caching,
            overlap: self.overlap,
            ..EngineConfig::default()
        };
        let runner: Box<dyn ModelRunner> = if self.overlap {
            Box::new(InFlightCheck {
                inner: Deferred::new(runner),
                check_reuse: !self.prefix_caching,
                probe: probe.clone(),
            })
        } else {
            Box::new(runner)
        };
        let handle = spawn(runner, byte_tokenizer(), cfg, "fake").expect("engine starts");
        (handle, probe)
    }
}

fn text_request(text: &str, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Text(text.into()),
        sampling,
        deadline: None,
    }
}

fn greedy(max_tokens: u32) -> SamplingParams {
    SamplingParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Prompts of mixed lengths (5 to 68 bytes), all different.
fn prompts(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!("request {i}: {}", "the quick brown fox ".repeat(i % 4))
                .chars()
                .take(5 + i * 9)
                .collect()
        })
        .collect()
}

/// Submit all at once and wait for all.
async fn run_all(
    h: &EngineHandle,
    reqs: Vec<GenerateRequest>,
) -> Vec<Result<Completion, EngineError>> {
    let pending: Vec<_> = reqs.into_iter().map(|r| h.submit(r)).collect();
    let mut out = Vec::new();
    for p in pending {
        out.push(p.await);
    }
    out
}

/// The text of byte tokens, `<eos>` skipped (it is special).
fn visible_text(ids: &[u32]) -> String {
    String::from_utf8(
        ids.iter()
            .filter(|&&t| t != EOS)
            .map(|&t| t as u8)
            .collect(),
    )
    .expect("utf-8")
}

fn tokens(results: &[Result<Completion, EngineError>]) -> Vec<Vec<u32>> {
    results
        .iter()
        .map(|r| r.as_ref().expect("completion").token_ids.clone())
        .collect()
}

async fn wait_for(h: &EngineHandle, what: &str, cond: impl Fn(&kiln::engine::EngineStats) -> bool) {
    let t0 = Instant::now();
    loop {
        let s = h.stats().await.expect("engine alive");
        if cond(&s) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
