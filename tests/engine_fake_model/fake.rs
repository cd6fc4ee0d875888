//! The deterministic fake model: `FakeRunner` (KV slots holding history hashes, logits derived from every slot read back through the block table), its reference, and `InFlightCheck`.

use super::*;

pub(crate) const VOCAB: usize = 257;
pub(crate) const EOS: u32 = 256;
pub(crate) const CHAT_TEMPLATE: &str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";

/// The engine tests' byte-level tokenizer (ids 0..256 = bytes, 256 = `<eos>`) with a chat template.
pub(crate) fn byte_tokenizer() -> Tokenizer {
    let mut t = test_support::byte_tokenizer();
    t.chat_template = Some(CHAT_TEMPLATE.into());
    t
}

pub(crate) fn mix(h: u64, x: u64) -> u64 {
    // splitmix64 finalizer over h ^ x.
    let mut z = (h ^ x).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What the fake model stores for the token at `pos` given the previous slot's value.
pub(crate) fn slot_value(prev: u64, token: u32, pos: usize) -> u64 {
    mix(prev, token as u64 | (pos as u64) << 32)
}

/// The fake model's logits for a sequence whose slots hold `slots` (one per position).
/// Lowercase letters and space get +3 (so greedy text is readable ASCII), EOS gets +10 on
/// about one position in 13, everything else is noise in [0, 1).
pub(crate) fn fake_row(slots: &[u64]) -> Vec<f32> {
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
pub(crate) fn reference_slots(history: &[u32]) -> Vec<u64> {
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
pub(crate) struct Probe {
    /// Tokens the runner computed, over all steps.
    pub(crate) computed_tokens: Arc<AtomicUsize>,
    /// Sequences per forward step.
    pub(crate) batch_sizes: Arc<Mutex<Vec<usize>>>,
    /// Tokens fed on the "device" to a step submitted while the one before it was queued.
    pub(crate) fed_ahead: Arc<AtomicUsize>,
}

pub(crate) struct FakeRunner {
    pub(crate) block_size: usize,
    /// `[num_blocks][block_size]` slots: (position, value) of the token written there.
    pub(crate) kv: Vec<Vec<Option<(usize, u64)>>>,
    pub(crate) max_pos: usize,
    pub(crate) step_delay: Duration,
    pub(crate) panic_on_token: Option<u32>,
    /// Fail a step holding this token with `Oom`, as a device out-of-memory would.
    pub(crate) oom_on_token: Option<u32>,
    pub(crate) probe: Probe,
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
pub(crate) struct InFlightCheck {
    pub(crate) inner: Deferred<FakeRunner>,
    pub(crate) check_reuse: bool,
    pub(crate) probe: Probe,
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
