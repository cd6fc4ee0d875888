//! The continuous-batching scheduler (after vLLM v1's): which sequences run in the next step,
//! with how many tokens each, over a paged KV cache.
//!
//! There are no separate prefill and decode phases. Every sequence has `num_tokens` (prompt +
//! generated) and `num_computed_tokens` (in the KV cache); a step gives each scheduled sequence
//! up to `num_tokens − num_computed_tokens` new tokens: 1 for a decode, a chunk for a prefill.
//! A step:
//! 1. walks the running sequences oldest first, giving each its tokens under the token budget
//!    (`max_num_batched_tokens`); when its blocks cannot be allocated, the NEWEST running
//!    sequence is preempted (blocks freed, back to the front of the waiting queue, recomputed
//!    later from prompt + generated tokens) until they can, or until it was the newest itself;
//! 2. if nothing was preempted, admits waiting sequences in FIFO order while the budget,
//!    `max_num_seqs` and free blocks allow: first the longest prefix of full blocks found in the
//!    prefix cache, then a chunk of the rest.
//!
//! Invariants:
//! - every sequence is in exactly one of `waiting` / `running`, with the matching status;
//! - a waiting sequence holds no block and has `num_computed_tokens == 0`;
//! - `running.len() ≤ max_num_seqs`, and a step schedules at most `max_num_batched_tokens`
//!   tokens;
//! - `running` is in admission order, so its last entry is the newest (the preemption victim);
//! - the prefix-cache hit of an admission is capped at `num_tokens − 1` tokens, so at least the
//!   last token is computed and produces logits;
//! - every admitted sequence fits in the cache alone (`max_len − 1 ≤ num_blocks × block_size`),
//!   so the oldest running sequence can always get its blocks by preempting newer ones: the
//!   engine always makes progress;
//! - with state slots (hybrid models), every running sequence holds its own slot and no waiting
//!   one holds any; admission stops when none is free, preemption and removal give it back;
//! - a hybrid model's prefix hit is used only up to the longest prefix with a state checkpoint
//!   (the state after the skipped tokens is copied from it); a longer cached prefix gets a
//!   checkpoint: the prefill chunk stops at its end and the engine copies the state there;
//! - a request that could never fit (prompt + 1 > `max_model_len`, or a prompt larger than the
//!   whole cache) is refused at admission (`InvalidInput` / `Oom`) and never queued.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::engine::handle::RequestId;
use crate::engine::kv_cache::{BlockManager, StateCheckpoints, StateSlots};
use crate::engine::sequence::{Sequence, SequenceStatus};
use crate::error::EngineError;

/// Limits the scheduler enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most running sequences.
    pub max_num_seqs: usize,
    /// Token budget of one step.
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt + completion).
    pub max_model_len: usize,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence.
    pub id: RequestId,
    /// Tokens computed this step (positions `cached_len .. cached_len + num_new_tokens`).
    pub num_new_tokens: usize,
    /// Tokens already in the KV cache before this step.
    pub cached_len: usize,
    /// Whether this step reaches the end of the sequence, so its logits are sampled.
    pub sample: bool,
    /// Hybrid models: copy this prefix-checkpoint slot into the sequence's state slot before
    /// the step (its `cached_len` tokens were served from the prefix cache).
    pub restore_state_from: Option<u32>,
}

/// What one step runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// Sequences in this step, in batch order.
    pub scheduled: Vec<ScheduledSeq>,
    /// Sequences preempted while scheduling this step.
    pub preempted: Vec<RequestId>,
    /// Total new tokens in this step.
    pub num_batched_tokens: usize,
}

/// Waiting and running sequences over one KV cache.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: BlockManager,
    states: StateSlots,
    checkpoints: StateCheckpoints,
    seqs: HashMap<RequestId, Sequence>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    num_preemptions: u64,
}

impl Scheduler {
    /// A scheduler over `kv`.
    pub fn new(cfg: SchedulerConfig, kv: BlockManager) -> Self {
        Scheduler {
            cfg,
            kv,
            states: StateSlots::new(0),
            checkpoints: StateCheckpoints::default(),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
        }
    }

    /// Give every running sequence one of `n` recurrent-state slots (hybrid models): taken at
    /// admission, given back on preemption and removal; with every slot taken, nothing more is
    /// admitted. 0 (the default) means the model has no recurrent state.
    pub fn with_state_slots(mut self, n: usize) -> Self {
        self.states = StateSlots::new(n);
        self
    }

    /// Keep prefix checkpoints of the recurrent state in `n` slots after the running ones
    /// (hybrid models with prefix caching): a prompt whose cached prefix has a checkpoint
    /// skips that prefix; one whose cached prefix has none recomputes it and leaves a
    /// checkpoint there (its prefill chunk stops at the prefix end). Without checkpoints a
    /// hybrid model's prefix-cache hits are not used (the state after them is unknown).
    pub fn with_state_checkpoints(mut self, n: usize) -> Self {
        self.checkpoints = StateCheckpoints::new(self.states.total() as u32, n);
        self
    }

    /// The checkpoint slots (for restarts and stats).
    pub fn state_checkpoints(&self) -> &StateCheckpoints {
        &self.checkpoints
    }

    /// The state slots (read-only; for stats and the engine's restart).
    pub fn state_slots(&self) -> &StateSlots {
        &self.states
    }

    /// The limits.
    pub fn config(&self) -> SchedulerConfig {
        self.cfg
    }

    /// The block manager (read-only; for stats).
    pub fn kv(&self) -> &BlockManager {
        &self.kv
    }

    /// Tokens the whole cache holds.
    pub fn cache_capacity_tokens(&self) -> usize {
        self.kv.num_blocks() * self.kv.block_size()
    }

    /// Check that a prompt of `prompt_len` tokens can ever run, and return the length at which
    /// its generation stops: prompt + `max_tokens`, capped by `max_model_len` and by what the
    /// whole cache holds (`num_blocks × block_size` computed tokens, plus the last sampled one).
    pub fn admission_limit(
        &self,
        prompt_len: usize,
        max_tokens: Option<u32>,
    ) -> Result<usize, EngineError> {
        let max_model_len = self.cfg.max_model_len;
        if prompt_len == 0 {
            return Err(EngineError::InvalidInput("the prompt is empty".into()));
        }
        if prompt_len + 1 > max_model_len {
            return Err(EngineError::InvalidInput(format!(
                "the prompt has {prompt_len} tokens; with at least 1 generated token that exceeds max_model_len ({max_model_len})"
            )));
        }
        let capacity = self.cache_capacity_tokens();
        if prompt_len > capacity {
            return Err(EngineError::Oom(format!(
                "the prompt has {prompt_len} tokens but the whole KV cache holds {capacity} ({} blocks of {} tokens)",
                self.kv.num_blocks(),
                self.kv.block_size()
            )));
        }
        let wanted = max_tokens.map_or(usize::MAX, |m| prompt_len.saturating_add(m as usize));
        Ok(wanted.min(max_model_len).min(capacity + 1))
    }

    /// Queue a sequence built with [`Scheduler::admission_limit`]'s result as its `max_len`.
    pub fn add(&mut self, seq: Sequence) {
        debug_assert_eq!(seq.status, SequenceStatus::Waiting);
        debug_assert!(seq.max_len <= self.cache_capacity_tokens() + 1);
        self.waiting.push_back(seq.id);
        self.seqs.insert(seq.id, seq);
    }

    /// Whether no sequence is waiting or running.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Sequences waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Running sequences.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Preemptions since start.
    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    /// A sequence by id.
    pub fn get(&self, id: RequestId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    /// A sequence by id, mutably (the engine samples into it).
    pub fn get_mut(&mut self, id: RequestId) -> Option<&mut Sequence> {
        self.seqs.get_mut(&id)
    }

    /// Ids of every sequence, waiting and running.
    pub fn ids(&self) -> Vec<RequestId> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .copied()
            .collect()
    }

    /// Take a sequence out (finished, failed or cancelled), freeing its blocks.
    pub fn remove(&mut self, id: RequestId) -> Option<Sequence> {
        let mut seq = self.seqs.remove(&id)?;
        match seq.status {
            SequenceStatus::Running => self.running.retain(|&r| r != id),
            SequenceStatus::Waiting => self.waiting.retain(|&w| w != id),
        }
        self.kv.free(&mut seq.blocks);
        self.states.give_back(&mut seq.state_slot);
        Some(seq)
    }

    /// Plan the next step.
    pub fn schedule(&mut self, now: Instant) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_num_batched_tokens;

        // 1. Running sequences, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let n = seq.num_uncomputed().min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let cached_len = seq.num_computed_tokens;
            let n = cut_at_checkpoint(seq.checkpoint_at, cached_len, n);
            let sample = cached_len + n == seq.num_tokens();
            let mut fits = true;
            loop {
                let seq = self.seqs.get_mut(&id).expect("running ids are in seqs");
                if self
                    .kv
                    .allocate(&mut seq.blocks, &[], cached_len + n)
                    .is_ok()
                {
                    break;
                }
                let victim = self.running.pop().expect("the current sequence is running");
                self.preempt(victim);
                out.preempted.push(victim);
                if victim == id {
                    fits = false;
                    break;
                }
            }
            if !fits {
                break;
            }
            out.scheduled.push(ScheduledSeq {
                id,
                num_new_tokens: n,
                cached_len,
                sample,
                restore_state_from: None,
            });
            budget -= n;
            i += 1;
        }

        // 2. Waiting sequences, FIFO, unless this step had to preempt.
        if out.preempted.is_empty() {
            while let Some(&id) = self.waiting.front() {
                if budget == 0 || self.running.len() >= self.cfg.max_num_seqs {
                    break;
                }
                // A hybrid model's sequence runs only with a state slot of its own.
                let slot = if self.states.enabled() {
                    match self.states.take() {
                        Some(s) => Some(s),
                        None => break,
                    }
                } else {
                    None
                };
                let bs = self.kv.block_size();
                let seq = self.seqs.get_mut(&id).expect("waiting ids are in seqs");
                // Cap the hit so at least the last token is computed (its logits are needed).
                let max_hit_blocks = ((seq.num_tokens() - 1) / bs).min(seq.block_hashes.len());
                let mut hits = self.kv.lookup_prefix(&seq.block_hashes[..max_hit_blocks]);
                let mut restore = None;
                if self.states.enabled() {
                    // Only the longest hit prefix whose state is checkpointed can be skipped;
                    // a longer shared prefix gets a checkpoint at its end this time.
                    let k = (1..=hits.len())
                        .rev()
                        .find(|&k| self.checkpoints.contains(&seq.block_hashes[k - 1]))
                        .unwrap_or(0);
                    if k > 0 {
                        restore = self.checkpoints.use_checkpoint(&seq.block_hashes[k - 1]);
                    }
                    seq.checkpoint_at =
                        (self.checkpoints.enabled() && hits.len() > k).then_some(hits.len() * bs);
                    hits.truncate(k);
                }
                let num_cached = hits.len() * bs;
                let n = cut_at_checkpoint(
                    seq.checkpoint_at,
                    num_cached,
                    (seq.num_tokens() - num_cached).min(budget),
                );
                if self
                    .kv
                    .allocate(&mut seq.blocks, &hits, num_cached + n)
                    .is_err()
                {
                    self.states.give_back(&mut { slot });
                    break;
                }
                seq.state_slot = slot;
                self.kv.record_lookup(max_hit_blocks * bs, num_cached);
                self.waiting.pop_front();
                self.running.push(id);
                seq.status = SequenceStatus::Running;
                seq.num_computed_tokens = num_cached;
                seq.cached_prompt_tokens
                    .get_or_insert(num_cached.min(seq.prompt_len));
                seq.times.first_scheduled.get_or_insert(now);
                let sample = num_cached + n == seq.num_tokens();
                out.scheduled.push(ScheduledSeq {
                    id,
                    num_new_tokens: n,
                    cached_len: num_cached,
                    sample,
                    restore_state_from: restore,
                });
                budget -= n;
            }
        }
        out.num_batched_tokens = self.cfg.max_num_batched_tokens - budget;
        out
    }

    /// Record that a step's forward pass succeeded: advance each sequence's computed tokens and
    /// offer its newly full blocks to the prefix cache. Returns the state copies `(sequence
    /// slot, checkpoint slot)` the engine must make now for the sequences that reached their
    /// checkpoint (hybrid models).
    pub fn complete_step(&mut self, scheduled: &[ScheduledSeq]) -> Vec<(u32, u32)> {
        let mut copies = Vec::new();
        let bs = self.kv.block_size();
        for s in scheduled {
            if let Some(seq) = self.seqs.get_mut(&s.id) {
                seq.num_computed_tokens = s.cached_len + s.num_new_tokens;
                self.kv.cache_full_blocks(
                    &mut seq.blocks,
                    &seq.block_hashes,
                    seq.num_computed_tokens,
                );
                if let Some(at) = seq.checkpoint_at {
                    if seq.num_computed_tokens >= at {
                        seq.checkpoint_at = None;
                        let hash = seq.block_hashes.get((at / bs).wrapping_sub(1));
                        if let (true, Some(h), Some(slot)) =
                            (seq.num_computed_tokens == at, hash, seq.state_slot)
                        {
                            if let Some(dst) = self.checkpoints.insert(*h) {
                                copies.push((slot, dst));
                            }
                        }
                    }
                }
            }
        }
        copies
    }

    /// Free a running sequence's blocks and queue it for recomputation, first in line.
    fn preempt(&mut self, id: RequestId) {
        let seq = self.seqs.get_mut(&id).expect("preempted ids are in seqs");
        self.kv.free(&mut seq.blocks);
        self.states.give_back(&mut seq.state_slot);
        seq.reset_for_recompute();
        self.waiting.push_front(id);
        self.num_preemptions += 1;
    }
}

/// `n` new tokens from `cached_len`, stopped at `checkpoint_at` when that lies inside them.
fn cut_at_checkpoint(checkpoint_at: Option<usize>, cached_len: usize, n: usize) -> usize {
    match checkpoint_at {
        Some(at) if at > cached_len && at < cached_len + n => at - cached_len,
        _ => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::SamplingParams;
    use crate::engine::test_support::byte_tokenizer;

    fn scheduler(
        num_blocks: usize,
        bs: usize,
        max_num_seqs: usize,
        budget: usize,
        caching: bool,
    ) -> Scheduler {
        let cfg = SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: budget,
            max_model_len: 1000,
        };
        Scheduler::new(cfg, BlockManager::new(num_blocks, bs, caching))
    }

    fn prompt(seed: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| (seed * 31 + i * 7) % 200).collect()
    }

    fn add(s: &mut Scheduler, id: RequestId, ids: Vec<u32>, max_tokens: u32) {
        let max_len = s
            .admission_limit(ids.len(), Some(max_tokens))
            .expect("admissible");
        let bs = s.kv().block_size();
        let seq = Sequence::new(
            id,
            ids,
            &SamplingParams::default(),
            &[],
            max_len,
            bs,
            None,
            Instant::now(),
        );
        s.add(seq);
    }

    /// One engine step without a model: schedule, mark computed, sample `a` where due, drop
    /// finished sequences. Checks the invariants after it.
    fn step(s: &mut Scheduler) -> SchedulerOutput {
        let tok = byte_tokenizer();
        let out = s.schedule(Instant::now());
        s.complete_step(&out.scheduled);
        let mut row = vec![0.0f32; 257];
        row[b'a' as usize] = 1.0;
        let bs = s.kv().block_size();
        for sc in out.scheduled.iter().filter(|sc| sc.sample) {
            let seq = s.get_mut(sc.id).expect("scheduled");
            if seq
                .sample_and_append(&row, &tok, bs, Instant::now())
                .expect("sample")
                .is_some()
            {
                s.remove(sc.id);
            }
        }
        s.check_invariants();
        out
    }

    fn shares(out: &SchedulerOutput) -> Vec<(RequestId, usize, usize, bool)> {
        out.scheduled
            .iter()
            .map(|s| (s.id, s.cached_len, s.num_new_tokens, s.sample))
            .collect()
    }

    impl Scheduler {
        fn check_invariants(&self) {
            self.kv.check_invariants();
            assert!(self.running.len() <= self.cfg.max_num_seqs);
            assert_eq!(self.running.len() + self.waiting.len(), self.seqs.len());
            for id in &self.waiting {
                let s = &self.seqs[id];
                assert_eq!(s.status, SequenceStatus::Waiting);
                assert!(
                    s.blocks.is_empty() && s.num_computed_tokens == 0 && s.state_slot.is_none(),
                    "waiting {id} holds state"
                );
            }
            let mut used = 0;
            for id in &self.running {
                let s = &self.seqs[id];
                assert_eq!(s.status, SequenceStatus::Running);
                assert!(s.blocks.table.len() * self.kv.block_size() >= s.num_computed_tokens);
                used += s.blocks.table.len();
            }
            // Blocks can be shared, so the tables hold at least the used blocks.
            assert!(used >= self.kv.num_used());
            if self.states.enabled() {
                let mut slots: Vec<u32> = self
                    .running
                    .iter()
                    .map(|id| self.seqs[id].state_slot.expect("running holds a slot"))
                    .collect();
                slots.sort_unstable();
                slots.dedup();
                assert_eq!(slots.len(), self.running.len(), "slots are not shared");
                assert_eq!(self.states.num_used(), self.running.len());
            }
        }
    }

    #[test]
    fn a_long_prompt_is_prefilled_in_chunks_under_the_budget() {
        let mut s = scheduler(64, 4, 4, 8, false);
        add(&mut s, 1, prompt(1, 20), 2);
        assert_eq!(shares(&step(&mut s)), vec![(1, 0, 8, false)]);
        assert_eq!(shares(&step(&mut s)), vec![(1, 8, 8, false)]);
        assert_eq!(shares(&step(&mut s)), vec![(1, 16, 4, true)]);
        assert_eq!(shares(&step(&mut s)), vec![(1, 20, 1, true)]);
        assert!(s.is_empty(), "max_tokens 2 reached");
    }

    #[test]
    fn decodes_and_a_prefill_chunk_share_a_step() {
        let mut s = scheduler(64, 4, 4, 8, false);
        add(&mut s, 1, prompt(1, 4), 10);
        assert_eq!(shares(&step(&mut s)), vec![(1, 0, 4, true)]);
        add(&mut s, 2, prompt(2, 10), 10);
        // Decode of 1 takes one token of the budget; 2 gets a 7-token chunk, then the rest.
        assert_eq!(
            shares(&step(&mut s)),
            vec![(1, 4, 1, true), (2, 0, 7, false)]
        );
        assert_eq!(
            shares(&step(&mut s)),
            vec![(1, 5, 1, true), (2, 7, 3, true)]
        );
        let out = step(&mut s);
        assert_eq!(out.num_batched_tokens, 2);
    }

    #[test]
    fn max_num_seqs_bounds_the_running_set() {
        let mut s = scheduler(64, 4, 2, 100, false);
        for id in 1..=3 {
            add(&mut s, id, prompt(id as u32, 3), 1);
        }
        assert_eq!(step(&mut s).scheduled.len(), 2);
        // Both finished (max_tokens 1); the third is admitted now.
        assert_eq!(shares(&step(&mut s)), vec![(3, 0, 3, true)]);
    }

    #[test]
    fn the_newest_sequence_is_preempted_and_recomputed_first() {
        // 4 blocks of 4 tokens. Two 7-token prompts take 2 blocks each.
        let mut s = scheduler(4, 4, 4, 64, false);
        add(&mut s, 1, prompt(1, 7), 20);
        add(&mut s, 2, prompt(2, 7), 20);
        assert_eq!(step(&mut s).scheduled.len(), 2);
        // Both now hold 8 tokens (7 computed): the 8th still fits in 2 blocks.
        assert!(step(&mut s).preempted.is_empty());
        // The 9th token needs a third block for sequence 1: sequence 2 (newest) is preempted.
        let out = step(&mut s);
        assert_eq!(out.preempted, vec![2]);
        assert_eq!(shares(&out), vec![(1, 8, 1, true)]);
        let two = s.get(2).expect("kept");
        assert_eq!(
            (two.status, two.num_computed_tokens, two.num_tokens()),
            (SequenceStatus::Waiting, 0, 9)
        );
        assert_eq!(s.num_preemptions(), 1);
        // It waits while 1 holds 3 blocks and cannot fit (9 tokens = 3 blocks > 1 free).
        assert_eq!(shares(&step(&mut s)), vec![(1, 9, 1, true)]);
        // Finish 1 (20 tokens would need 5 blocks: capped to capacity, see admission_limit).
        while s.get(1).is_some() {
            step(&mut s);
        }
        // 2 is recomputed from prompt + its generated tokens in one chunk.
        let out = step(&mut s);
        assert_eq!(shares(&out), vec![(2, 0, 9, true)]);
    }

    #[test]
    fn a_preempted_sequence_rehits_its_own_cached_blocks() {
        // 4 blocks of 4. Sequence 1: 7-token prompt, 3 new tokens; sequence 2: 4-token prompt.
        let mut s = scheduler(4, 4, 4, 64, true);
        add(&mut s, 1, prompt(1, 7), 3);
        add(&mut s, 2, prompt(2, 4), 20);
        step(&mut s); // 1: 2 blocks, 2: 1 block (full and hashed once computed)
        step(&mut s); // 2 takes the last free block for its 5th token
                      // 1 needs a third block: 2 is preempted. Its unhashed block goes to the free list (and
                      // to 1); its hashed first block goes to the evictable LRU. 1 reaches max_tokens.
        let out = step(&mut s);
        assert_eq!(out.preempted, vec![2]);
        assert!(s.get(1).is_none());
        // 2 comes back with its first block served from the cache: 4 of its 6 tokens.
        assert_eq!(shares(&step(&mut s)), vec![(2, 4, 2, true)]);
        assert_eq!(
            s.get(2).expect("running").cached_prompt_tokens,
            Some(0),
            "set at first admission"
        );
    }

    #[test]
    fn prefix_hits_leave_the_last_token_to_compute() {
        let mut s = scheduler(16, 4, 4, 64, true);
        let p = prompt(5, 8);
        add(&mut s, 1, p.clone(), 1);
        step(&mut s);
        assert!(s.is_empty());
        // Same 8 tokens: 2 full blocks cached, but only 1 may be used ((8 - 1) / 4).
        add(&mut s, 2, p.clone(), 1);
        assert_eq!(shares(&step(&mut s)), vec![(2, 4, 4, true)]);
        // One more token: both blocks hit, one token computed.
        let mut longer = p.clone();
        longer.push(9);
        add(&mut s, 3, longer, 1);
        let out = s.schedule(Instant::now());
        assert_eq!(shares(&out), vec![(3, 8, 1, true)]);
        assert_eq!(s.get(3).expect("running").cached_prompt_tokens, Some(8));
        assert_eq!(s.kv().prefix_cache_stats().hit_tokens, 4 + 8);
    }

    #[test]
    fn admission_refuses_what_can_never_fit() {
        // 4 blocks of 4 tokens: the cache holds 16 tokens.
        let cfg = SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 64,
            max_model_len: 10,
        };
        let s = Scheduler::new(cfg, BlockManager::new(4, 4, false));
        assert!(matches!(
            s.admission_limit(10, None),
            Err(EngineError::InvalidInput(_))
        ));
        assert!(matches!(
            s.admission_limit(0, None),
            Err(EngineError::InvalidInput(_))
        ));
        assert_eq!(s.admission_limit(9, None), Ok(10));
        assert_eq!(s.admission_limit(3, Some(2)), Ok(5));
        let big = Scheduler::new(
            SchedulerConfig {
                max_model_len: 100,
                ..cfg
            },
            BlockManager::new(4, 4, false),
        );
        assert!(matches!(
            big.admission_limit(17, None),
            Err(EngineError::Oom(_))
        ));
        // 16 tokens computed + the last one sampled.
        assert_eq!(big.admission_limit(16, None), Ok(17));
    }

    #[test]
    fn removing_a_sequence_frees_its_blocks() {
        let mut s = scheduler(8, 4, 4, 64, false);
        add(&mut s, 1, prompt(1, 10), 5);
        add(&mut s, 2, prompt(2, 3), 5);
        step(&mut s);
        assert_eq!(s.kv().num_used(), 4);
        assert!(s.remove(1).is_some());
        assert_eq!(s.kv().num_used(), 1);
        assert_eq!(s.num_running(), 1);
        s.check_invariants();
    }

    #[test]
    fn state_slots_bound_the_running_set_and_follow_preemption() {
        // 4 blocks of 4 tokens, 2 state slots: the third sequence waits for a slot.
        let mut s = scheduler(4, 4, 8, 64, false).with_state_slots(2);
        add(&mut s, 1, prompt(1, 3), 20);
        add(&mut s, 2, prompt(2, 3), 20);
        add(&mut s, 3, prompt(3, 3), 1);
        let out = step(&mut s);
        assert_eq!(out.scheduled.len(), 2);
        let slots: Vec<_> = [1, 2]
            .iter()
            .map(|&id| s.get(id).unwrap().state_slot)
            .collect();
        assert_eq!(slots, vec![Some(0), Some(1)]);
        assert_eq!(s.get(3).unwrap().state_slot, None);
        // Sequence 2 is removed: 3 takes its slot.
        s.remove(2);
        let out = step(&mut s);
        assert_eq!(shares(&out), vec![(1, 3, 1, true), (3, 0, 3, true)]);
        assert!(
            s.get(3).is_none(),
            "3 finished (max_tokens 1) and gave its slot back"
        );
        assert_eq!(s.state_slots().num_used(), 1);
        // 1 keeps growing alone; nothing else is running, so nothing is preempted.
        add(&mut s, 4, prompt(4, 7), 20);
        let mut preempted = false;
        for _ in 0..12 {
            let out = step(&mut s);
            if out.preempted.contains(&4) {
                preempted = true;
                assert_eq!(
                    s.get(4).unwrap().state_slot,
                    None,
                    "a preempted sequence holds no slot"
                );
            }
        }
        assert!(preempted, "the cache of 16 tokens cannot hold both");
    }
}
