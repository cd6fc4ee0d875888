//! The engine end to end against a deterministic fake model (no weights, fast, CI).
//!
//! `FakeRunner` stores, for every token it computes, a hash of the sequence's whole history
//! into the KV slot named by the block table, and derives each logits row from ALL the slots of
//! the sequence read back through its block table. So the tokens a request gets depend on the
//! scheduler handing the runner correct block tables: a wrong table, a block shared when it
//! should not be, or a preempted sequence resumed from the wrong state changes the outputs (or
//! makes the runner report a slot it never wrote). Outputs are compared between runs that must
//! agree (tiny vs large KV cache, alone vs batched), never against hard-coded tokens.

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

const VOCAB: usize = 257;
const EOS: u32 = 256;
const CHAT_TEMPLATE: &str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";

/// The engine tests' byte-level tokenizer (ids 0..256 = bytes, 256 = `<eos>`) with a chat template.
fn byte_tokenizer() -> Tokenizer {
    let mut t = test_support::byte_tokenizer();
    t.chat_template = Some(CHAT_TEMPLATE.into());
    t
}

fn mix(h: u64, x: u64) -> u64 {
    // splitmix64 finalizer over h ^ x.
    let mut z = (h ^ x).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What the fake model stores for the token at `pos` given the previous slot's value.
fn slot_value(prev: u64, token: u32, pos: usize) -> u64 {
    mix(prev, token as u64 | (pos as u64) << 32)
}

/// The fake model's logits for a sequence whose slots hold `slots` (one per position).
/// Lowercase letters and space get +3 (so greedy text is readable ASCII), EOS gets +10 on
/// about one position in 13, everything else is noise in [0, 1).
fn fake_row(slots: &[u64]) -> Vec<f32> {
    let fin = slots.iter().fold(0x5EED, |acc, &s| mix(acc, s));
    (0..VOCAB as u64)
        .map(|v| {
            let noise = (mix(fin, v) >> 40) as f32 / (1u64 << 24) as f32;
            let t = v as u8;
            let bonus = if v < 256 && (t.is_ascii_lowercase() || t == b' ') {
                3.0
            } else if v == EOS as u64 && fin % 13 == 0 {
                10.0
            } else {
                0.0
            };
            noise + bonus
        })
        .collect()
}

/// The slot values of a token history, computed directly (what a correct cache holds).
fn reference_slots(history: &[u32]) -> Vec<u64> {
    let mut prev = 0x1234;
    history
        .iter()
        .enumerate()
        .map(|(pos, &t)| {
            prev = slot_value(prev, t, pos);
            prev
        })
        .collect()
}

#[derive(Clone, Default)]
struct Probe {
    /// Tokens the runner computed, over all steps.
    computed_tokens: Arc<AtomicUsize>,
    /// Sequences per forward step.
    batch_sizes: Arc<Mutex<Vec<usize>>>,
    /// Tokens fed on the "device" to a step submitted while the one before it was queued.
    fed_ahead: Arc<AtomicUsize>,
}

struct FakeRunner {
    block_size: usize,
    /// `[num_blocks][block_size]` slots: (position, value) of the token written there.
    kv: Vec<Vec<Option<(usize, u64)>>>,
    max_pos: usize,
    step_delay: Duration,
    panic_on_token: Option<u32>,
    /// Fail a step holding this token with `Oom`, as a device out-of-memory would.
    oom_on_token: Option<u32>,
    probe: Probe,
}

impl FakeRunner {
    fn slot(&self, table: &[u32], pos: usize) -> Result<(usize, usize), EngineError> {
        let b = *table.get(pos / self.block_size).ok_or_else(|| {
            EngineError::Internal(format!("block table too short for position {pos}"))
        })?;
        Ok((b as usize, pos % self.block_size))
    }
}

impl ModelRunner for FakeRunner {
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn max_position_embeddings(&self) -> usize {
        self.max_pos
    }
    fn cache_geometry(&self) -> CacheGeometry {
        CacheGeometry {
            block_size: self.block_size,
            num_blocks: self.kv.len(),
            num_state_slots: 0,
        }
    }
    fn device_name(&self) -> String {
        "fake".into()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, EngineError> {
        std::thread::sleep(self.step_delay);
        if let Some(t) = self.panic_on_token {
            assert!(
                !batch.token_ids.contains(&t),
                "fake model asked to panic on token {t}"
            );
        }
        if let Some(t) = self.oom_on_token.filter(|t| batch.token_ids.contains(t)) {
            return Err(EngineError::Oom(format!("fake device OOM on token {t}")));
        }
        self.probe
            .batch_sizes
            .lock()
            .expect("lock")
            .push(batch.seqs.len());
        let mut out = ForwardOutput::default();
        for s in &batch.seqs {
            if s.len == 0 {
                // A real model has no hidden state for a token it does not compute.
                return Err(EngineError::Internal(
                    "empty slice in a forward batch".into(),
                ));
            }
            let mut prev = if s.cached_len == 0 {
                0x1234
            } else {
                let (b, i) = self.slot(&s.block_table, s.cached_len - 1)?;
                match self.kv[b][i] {
                    Some((p, v)) if p == s.cached_len - 1 => v,
                    other => {
                        return Err(EngineError::Internal(format!(
                            "slot for position {} holds {other:?}",
                            s.cached_len - 1
                        )))
                    }
                }
            };
            for k in 0..s.len {
                let pos = s.cached_len + k;
                prev = slot_value(prev, batch.token_ids[s.start + k], pos);
                let (b, i) = self.slot(&s.block_table, pos)?;
                self.kv[b][i] = Some((pos, prev));
            }
            self.probe
                .computed_tokens
                .fetch_add(s.len, Ordering::Relaxed);
            let end = s.cached_len + s.len;
            let rows: Vec<usize> = match s.logits {
                LogitsFor::None => vec![],
                LogitsFor::Last | LogitsFor::Sample(_) => vec![end],
                LogitsFor::All => (s.cached_len + 1..=end).collect(),
            };
            for n in rows {
                let mut slots = Vec::with_capacity(n);
                for pos in 0..n {
                    let (b, i) = self.slot(&s.block_table, pos)?;
                    match self.kv[b][i] {
                        Some((p, v)) if p == pos => slots.push(v),
                        other => {
                            return Err(EngineError::Internal(format!(
                                "slot for position {pos} holds {other:?}"
                            )))
                        }
                    }
                }
                let row = fake_row(&slots);
                // Sampling rows go through the pure function, as the CPU backend does.
                match &s.logits {
                    LogitsFor::Sample(desc) => out.samples.push(sample_row(&row, desc)),
                    _ => out.logits.extend(row),
                }
            }
        }
        Ok(out)
    }
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        self.kv[dst as usize] = self.kv[src as usize].clone();
        Ok(())
    }
}

/// A queued runner that checks, at each submission, that no block a queued (not yet computed)
/// step writes for one sequence appears in another sequence's block table: a block must not be
/// handed to a new owner while the device may still write it. Sequences are told apart by the
/// first block of their table, which holds only with prefix caching off (`check_reuse`).
struct InFlightCheck {
    inner: Deferred<FakeRunner>,
    check_reuse: bool,
    probe: Probe,
}

impl ModelRunner for InFlightCheck {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn max_position_embeddings(&self) -> usize {
        self.inner.max_position_embeddings()
    }
    fn cache_geometry(&self) -> CacheGeometry {
        self.inner.cache_geometry()
    }
    fn device_name(&self) -> String {
        "fake, queued".into()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, EngineError> {
        self.inner.forward(batch)
    }
    fn submit(&mut self, batch: &ForwardBatch, feeds: &[Feed]) -> Result<Submitted, EngineError> {
        if self.check_reuse {
            for queued in self.inner.queued() {
                for q in &queued.seqs {
                    for s in &batch.seqs {
                        let reused = q.block_table.iter().find(|b| s.block_table.contains(b));
                        if let (Some(b), true) = (reused, q.block_table[0] != s.block_table[0]) {
                            return Err(EngineError::Internal(format!(
                                "block {b} is handed to another sequence while a queued step writes it"
                            )));
                        }
                    }
                }
            }
        }
        if self.inner.queued().next().is_some() {
            self.probe
                .fed_ahead
                .fetch_add(feeds.len(), Ordering::Relaxed);
        }
        self.inner.submit(batch, feeds)
    }
    fn collect(&mut self, step: Submitted) -> Result<ForwardOutput, EngineError> {
        self.inner.collect(step)
    }
    fn queues_steps(&self) -> bool {
        true
    }
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        self.inner.copy_block(src, dst)
    }
}

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

#[tokio::test]
async fn greedy_tokens_follow_the_model_exactly() {
    // The reference: the fake model's argmax over a history computed without any cache.
    let (h, _) = Setup::default().start();
    let prompt = "hello kiln";
    let c = h
        .submit(text_request(prompt, greedy(12)))
        .await
        .expect("ok");
    let mut history: Vec<u32> = prompt.bytes().map(u32::from).collect();
    for &t in &c.token_ids {
        let row = fake_row(&reference_slots(&history));
        let best = (0..VOCAB)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .expect("vocab");
        assert_eq!(t as usize, best);
        history.push(t);
    }
    assert_eq!(c.token_ids.len(), 12);
    assert_eq!(c.finish_reason, FinishReason::Length);
    assert_eq!(c.text, visible_text(&c.token_ids));
}

#[tokio::test]
async fn preemption_under_a_tiny_kv_budget_gives_the_same_tokens() {
    let reqs = || {
        prompts(8)
            .iter()
            .map(|p| text_request(p, greedy(24)))
            .collect::<Vec<_>>()
    };
    let total_needed: usize = prompts(8).iter().map(|p| p.len() + 24 - 1).sum();

    // The reference: a cache with room for everything, no prefix sharing (exact token count).
    let (big, big_probe) = Setup {
        prefix_caching: false,
        ..Setup::default()
    }
    .start();
    let expected = tokens(&run_all(&big, reqs()).await);
    assert_eq!(
        big_probe.computed_tokens.load(Ordering::Relaxed),
        total_needed,
        "no recompute with room"
    );

    // 24 blocks of 4 = 96 tokens: one request (≤ 68 + 24 tokens) fits, eight do not.
    for prefix_caching in [false, true] {
        let (tiny, probe) = Setup {
            num_blocks: 24,
            max_num_batched_tokens: 16, // also forces chunked prefill
            prefix_caching,
            // Steps of ≥ 2 ms: all eight submissions land while the first request still runs,
            // even when this thread is descheduled on a loaded machine (else "requests shared
            // steps" below could fail by timing alone).
            step_delay: Duration::from_millis(2),
            ..Setup::default()
        }
        .start();
        let got = tokens(&run_all(&tiny, reqs()).await);
        assert_eq!(got, expected, "prefix_caching={prefix_caching}");
        if !prefix_caching {
            let computed = probe.computed_tokens.load(Ordering::Relaxed);
            assert!(
                computed > total_needed,
                "preemption recomputed tokens ({computed} vs {total_needed})"
            );
        }
        assert!(
            probe
                .batch_sizes
                .lock()
                .expect("lock")
                .iter()
                .any(|&n| n > 1),
            "requests shared steps"
        );
        let stats = tiny.stats().await.expect("alive");
        assert_eq!(
            (stats.running, stats.waiting, stats.kv_blocks_used),
            (0, 0, 0),
            "{stats:?}"
        );
    }
}

#[tokio::test]
async fn a_repeated_prompt_is_served_from_the_prefix_cache() {
    let (h, probe) = Setup::default().start();
    let prompt = "a shared system prompt that is long enough for several blocks";
    let first = h.submit(text_request(prompt, greedy(8))).await.expect("ok");
    let computed = probe.computed_tokens.load(Ordering::Relaxed);
    let second = h.submit(text_request(prompt, greedy(8))).await.expect("ok");
    assert_eq!(first.usage.cached_prompt_tokens, 0);
    // Blocks of 4: the full blocks before the last token are reused (it is always computed).
    assert_eq!(prompt.len(), 61);
    assert_eq!(second.usage.cached_prompt_tokens, 60);
    assert_eq!(second.usage.prompt_tokens, 61);
    assert_eq!(second.token_ids, first.token_ids);
    // 1 prompt token, then 7 decode steps (the 8th token is sampled, never computed).
    assert_eq!(
        probe.computed_tokens.load(Ordering::Relaxed) - computed,
        1 + 7
    );
    // A block-aligned prompt: 60 tokens = 15 full blocks, of which 14 are reused.
    let aligned = &prompt[..60];
    let first = h
        .submit(text_request(aligned, greedy(4)))
        .await
        .expect("ok");
    let second = h
        .submit(text_request(aligned, greedy(4)))
        .await
        .expect("ok");
    assert_eq!(second.usage.cached_prompt_tokens, 56);
    assert_eq!(second.token_ids, first.token_ids);
}

#[tokio::test]
async fn a_prompt_over_max_model_len_fails_alone() {
    let (h, _) = Setup {
        max_pos: 64,
        ..Setup::default()
    }
    .start();
    assert_eq!(h.info().max_model_len, 64);
    let long = "x".repeat(64); // 64 + 1 > 64
    let mut reqs: Vec<_> = prompts(3)
        .iter()
        .map(|p| text_request(p, greedy(5)))
        .collect();
    reqs.insert(1, text_request(&long, greedy(5)));
    let results = run_all(&h, reqs).await;
    assert!(
        matches!(&results[1], Err(EngineError::InvalidInput(m)) if m.contains("max_model_len")),
        "{:?}",
        results[1]
    );
    for i in [0, 2, 3] {
        assert_eq!(results[i].as_ref().expect("ok").token_ids.len(), 5);
    }
    // A prompt that fits max_model_len but not the whole cache is Oom.
    let (small, _) = Setup {
        num_blocks: 4,
        max_pos: 64,
        ..Setup::default()
    }
    .start();
    let r = small.submit(text_request(&"y".repeat(20), greedy(2))).await;
    assert!(matches!(r, Err(EngineError::Oom(_))), "{r:?}");
    // Generation stops at max_model_len (Length) even without max_tokens.
    let c = h
        .submit(text_request(
            "abc",
            SamplingParams {
                ignore_eos: true,
                ..Default::default()
            },
        ))
        .await;
    let c = c.expect("ok");
    assert_eq!(
        (
            c.usage.prompt_tokens + c.usage.completion_tokens,
            c.finish_reason
        ),
        (64, FinishReason::Length)
    );
}

#[tokio::test]
async fn cancelling_frees_the_blocks() {
    let (h, _) = Setup {
        step_delay: Duration::from_millis(2),
        ..Setup::default()
    }
    .start();
    let pending = h.submit(text_request("a long generation", greedy(10_000)));
    wait_for(&h, "the request to run", |s| {
        s.running == 1 && s.kv_blocks_used > 0
    })
    .await;
    drop(pending);
    wait_for(&h, "the blocks to be freed", |s| {
        s.running == 0 && s.waiting == 0 && s.kv_blocks_used == 0
    })
    .await;
    // The engine still serves.
    assert_eq!(
        h.submit(text_request("next", greedy(3)))
            .await
            .expect("ok")
            .token_ids
            .len(),
        3
    );
}

#[tokio::test]
async fn a_deadline_fails_only_its_request() {
    let (h, _) = Setup {
        step_delay: Duration::from_millis(2),
        ..Setup::default()
    }
    .start();
    let late = GenerateRequest {
        deadline: Some(Instant::now() + Duration::from_millis(60)),
        ..text_request("slow", greedy(10_000))
    };
    let results = run_all(&h, vec![late, text_request("quick", greedy(4))]).await;
    assert!(
        matches!(&results[0], Err(EngineError::Timeout(_))),
        "{:?}",
        results[0]
    );
    assert_eq!(results[1].as_ref().expect("ok").token_ids.len(), 4);
    let stats = h.stats().await.expect("alive");
    assert_eq!(stats.kv_blocks_used, 0);
}

#[tokio::test]
async fn the_same_seed_gives_the_same_tokens_alone_or_batched() {
    let sampled = |seed| SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        seed: Some(seed),
        max_tokens: Some(20),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let (h, _) = Setup::default().start();
    let alone = h
        .submit(text_request("seeded", sampled(42)))
        .await
        .expect("ok")
        .token_ids;
    let mut batch: Vec<_> = prompts(6)
        .iter()
        .enumerate()
        .map(|(i, p)| text_request(p, sampled(i as u64)))
        .collect();
    batch.insert(3, text_request("seeded", sampled(42)));
    let results = run_all(&h, batch).await;
    assert_eq!(results[3].as_ref().expect("ok").token_ids, alone);
    let other = h
        .submit(text_request("seeded", sampled(43)))
        .await
        .expect("ok")
        .token_ids;
    assert_ne!(other, alone, "a different seed samples differently");
}

#[tokio::test]
async fn stop_strings_end_generation_and_are_not_returned() {
    let (h, _) = Setup::default().start();
    let full = h
        .submit(text_request("tell me", greedy(40)))
        .await
        .expect("ok");
    assert!(
        full.text.is_ascii() && full.text.len() >= 30,
        "{:?}",
        full.text
    );
    let stop = full.text[12..15].to_string();
    let cut = full.text.find(&stop).expect("present");
    let sampling = SamplingParams {
        stop: vec!["never there".into(), stop.clone()],
        ..greedy(40)
    };
    let c = h
        .submit(text_request("tell me", sampling))
        .await
        .expect("ok");
    assert_eq!(c.finish_reason, FinishReason::Stop);
    assert_eq!(c.text, full.text[..cut], "stop string {stop:?}");
    // The tokens up to the one completing the stop string are kept.
    let completing = (1..=full.token_ids.len())
        .find(|&n| visible_text(&full.token_ids[..n]).contains(&stop))
        .expect("the stop string is in the text");
    assert_eq!(c.token_ids, full.token_ids[..completing]);
}

#[tokio::test]
async fn eos_ends_generation_unless_ignored() {
    let (h, _) = Setup::default().start();
    let sampling = SamplingParams {
        max_tokens: Some(200),
        ..SamplingParams::default()
    };
    let results = run_all(
        &h,
        prompts(4)
            .iter()
            .map(|p| text_request(p, sampling.clone()))
            .collect(),
    )
    .await;
    let stopped: Vec<_> = results
        .iter()
        .map(|r| r.as_ref().expect("ok"))
        .filter(|c| c.finish_reason == FinishReason::Stop)
        .collect();
    assert!(
        !stopped.is_empty(),
        "EOS is likely within 200 tokens for these prompts"
    );
    for c in stopped {
        assert_eq!(c.token_ids.last(), Some(&EOS));
        assert!(!c.text.contains("<eos>"));
        assert_eq!(c.text.len(), c.token_ids.len() - 1);
        assert!(c.timings.queue <= c.timings.ttft && c.timings.ttft <= c.timings.total);
    }
}

#[tokio::test]
async fn logprobs_are_the_log_softmax_of_the_model_row() {
    let (h, _) = Setup::default().start();
    let prompt = "logprobs";
    let sampling = SamplingParams {
        logprobs: Some(3),
        ..greedy(6)
    };
    let c = h.submit(text_request(prompt, sampling)).await.expect("ok");
    let lps = c.logprobs.expect("requested");
    assert_eq!(lps.len(), 6);
    let mut history: Vec<u32> = prompt.bytes().map(u32::from).collect();
    for (lp, &t) in lps.iter().zip(&c.token_ids) {
        let row = fake_row(&reference_slots(&history));
        let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln() as f32;
        assert_eq!(lp.token_id, t);
        assert!((lp.logprob - (row[t as usize] - lse)).abs() < 1e-5);
        assert_eq!(lp.top.len(), 3);
        assert_eq!(lp.top[0].token_id, t, "greedy picks the most likely token");
        assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        assert_eq!(
            lp.token,
            if t == EOS {
                "<eos>".to_string()
            } else {
                visible_text(&[t])
            }
        );
        history.push(t);
    }
}

#[tokio::test]
async fn a_panic_in_a_step_fails_its_requests_and_the_engine_keeps_serving() {
    let (h, _) = Setup {
        panic_on_token: Some(200),
        ..Setup::default()
    }
    .start();
    let bad = GenerateRequest::new(Prompt::TokenIds(vec![1, 2, 200]));
    let r = h.submit(bad).await;
    assert!(
        matches!(&r, Err(EngineError::Internal(m)) if m.contains("panic")),
        "{r:?}"
    );
    let ok = h
        .submit(text_request("still alive", greedy(3)))
        .await
        .expect("ok");
    assert_eq!(ok.token_ids.len(), 3);
    assert_eq!(h.stats().await.expect("alive").kv_blocks_used, 0);
}

/// A device out-of-memory in a step (the CUDA backend maps it to `Oom`) fails that step's
/// requests as `Oom` (which the daemon retries); the engine frees their blocks and goes on.
#[tokio::test]
async fn an_oom_in_a_step_fails_its_requests_with_oom_and_the_engine_keeps_serving() {
    let (h, _) = Setup {
        oom_on_token: Some(201),
        ..Setup::default()
    }
    .start();
    let r = h
        .submit(GenerateRequest::new(Prompt::TokenIds(vec![5, 6, 201])))
        .await;
    assert!(
        matches!(&r, Err(EngineError::Oom(m)) if m.contains("201")),
        "{r:?}"
    );
    let ok = h
        .submit(text_request("still alive", greedy(3)))
        .await
        .expect("ok");
    assert_eq!(ok.token_ids.len(), 3);
    assert_eq!(h.stats().await.expect("alive").kv_blocks_used, 0);
}

#[tokio::test]
async fn bad_requests_are_refused_with_invalid_input() {
    let (h, _) = Setup::default().start();
    let cases = [
        GenerateRequest::new(Prompt::TokenIds(vec![])),
        GenerateRequest::new(Prompt::TokenIds(vec![1, VOCAB as u32])),
        text_request(
            "x",
            SamplingParams {
                top_p: 1.5,
                ..SamplingParams::default()
            },
        ),
    ];
    for req in cases {
        let r = h.submit(req).await;
        assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    }
}

#[tokio::test]
async fn shutdown_cancels_pending_requests() {
    let (h, _) = Setup {
        step_delay: Duration::from_millis(2),
        ..Setup::default()
    }
    .start();
    let pending = h.submit(text_request("forever", greedy(100_000)));
    wait_for(&h, "the request to run", |s| s.running == 1).await;
    h.shutdown();
    assert_eq!(pending.await, Err(EngineError::Cancelled));
    assert!(h.stats().await.is_none(), "the engine thread is gone");
}

#[tokio::test]
async fn stats_follow_the_work() {
    let (h, _) = Setup::default().start();
    let before = h.stats().await.expect("alive");
    h.submit(text_request("count me", greedy(5)))
        .await
        .expect("ok");
    let after = h.stats().await.expect("alive");
    assert_eq!(after.generated_tokens - before.generated_tokens, 5);
    assert_eq!(after.prompt_tokens - before.prompt_tokens, 8);
    assert!(after.steps >= before.steps + 5);
    assert_eq!(after.kv_blocks_total, 512);
}

#[tokio::test]
async fn chat_prompts_are_rendered_with_the_template() {
    let (h, _) = Setup::default().start();
    let messages = vec![
        ChatMessage {
            role: "system".into(),
            content: "be brief".into(),
        },
        ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        },
    ];
    let chat = GenerateRequest {
        prompt: Prompt::Chat {
            messages,
            template_kwargs: Default::default(),
        },
        sampling: greedy(6),
        deadline: None,
    };
    let c = h.submit(chat).await.expect("ok");
    let rendered = "<system>be brief\n<user>hi\n<assistant>";
    assert_eq!(c.usage.prompt_tokens as usize, rendered.len());
    let plain = h
        .submit(text_request(rendered, greedy(6)))
        .await
        .expect("ok");
    assert_eq!(c.token_ids, plain.token_ids);
}

/// The same requests with and without overlap: every request's tokens, text and finish reason.
async fn overlap_agrees(setup: impl Fn(bool) -> Setup, reqs: impl Fn() -> Vec<GenerateRequest>) {
    let run = |overlap: bool| {
        let (h, probe) = setup(overlap).start();
        let reqs = reqs();
        async move { (run_all(&h, reqs).await, probe) }
    };
    let (plain, _) = run(false).await;
    let (overlapped, probe) = run(true).await;
    let key = |r: &Result<Completion, EngineError>| {
        let c = r.as_ref().expect("completion");
        (c.token_ids.clone(), c.text.clone(), c.finish_reason)
    };
    assert_eq!(
        plain.iter().map(key).collect::<Vec<_>>(),
        overlapped.iter().map(key).collect::<Vec<_>>()
    );
    // The overlapped run did build steps ahead, feeding them tokens still being computed.
    assert!(probe.fed_ahead.load(Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn overlap_gives_the_same_tokens_eos_and_max_tokens() {
    // EOS stops some requests early, max_tokens the others; greedy and seeded sampling mixed.
    overlap_agrees(
        |overlap| Setup {
            overlap,
            ..Setup::default()
        },
        || {
            prompts(10)
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let sampling = SamplingParams {
                        max_tokens: Some(5 + 7 * (i as u32 % 4)),
                        temperature: if i % 2 == 0 { 0.0 } else { 0.9 },
                        seed: Some(i as u64),
                        ..SamplingParams::default()
                    };
                    text_request(p, sampling)
                })
                .collect()
        },
    )
    .await;
}

#[tokio::test]
async fn overlap_gives_the_same_tokens_with_stop_strings_and_logprobs() {
    overlap_agrees(
        |overlap| Setup {
            overlap,
            ..Setup::default()
        },
        || {
            prompts(6)
                .iter()
                .map(|p| {
                    let sampling = SamplingParams {
                        stop: vec!["e".into(), "q u".into()],
                        logprobs: Some(2),
                        ..greedy(30)
                    };
                    text_request(p, sampling)
                })
                .collect()
        },
    )
    .await;
}

#[tokio::test]
async fn overlap_with_penalties_and_preemption_gives_the_same_tokens_and_never_reuses_a_busy_block()
{
    // A tiny cache (preemption), one-token prefill chunks, prefix caching off (so the queued
    // runner can check block ownership), and penalties on some requests (those steps are
    // collected before the next is built).
    overlap_agrees(
        |overlap| Setup {
            overlap,
            num_blocks: 24,
            max_num_seqs: 6,
            max_num_batched_tokens: 8,
            prefix_caching: false,
            ..Setup::default()
        },
        || {
            prompts(9)
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let sampling = SamplingParams {
                        repetition_penalty: if i % 3 == 0 { 1.3 } else { 1.0 },
                        ..greedy(6 + i as u32 * 3)
                    };
                    text_request(p, sampling)
                })
                .collect()
        },
    )
    .await;
}

#[tokio::test]
async fn overlap_cancelling_frees_the_blocks_after_the_step_in_flight() {
    let (h, _) = Setup {
        step_delay: Duration::from_millis(2),
        overlap: true,
        prefix_caching: false,
        ..Setup::default()
    }
    .start();
    let pending = h.submit(text_request("a long generation", greedy(10_000)));
    wait_for(&h, "the request to run", |s| {
        s.running == 1 && s.kv_blocks_used > 0
    })
    .await;
    drop(pending);
    wait_for(&h, "the blocks to be freed", |s| {
        s.running == 0 && s.waiting == 0 && s.kv_blocks_used == 0
    })
    .await;
    let results = run_all(
        &h,
        prompts(5)
            .iter()
            .map(|p| text_request(p, greedy(7)))
            .collect(),
    )
    .await;
    assert!(tokens(&results).iter().all(|t| t.len() == 7));
}
