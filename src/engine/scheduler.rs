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
//! - with overlap (a step built while the previous one runs on the device), a sequence whose
//!   pending tokens already reach its `max_len` is not scheduled again (that token ends it),
//!   and a waiting sequence with a pending token is not admitted before the token is known;
//! - the blocks and state slot of a sequence removed or preempted while a submitted step that
//!   names them is not yet collected ([`Scheduler::step_submitted`]) are held back, and reused
//!   only once that step is collected ([`Scheduler::step_collected`]): the device may still
//!   write them;
//! - a request that could never fit (prompt + 1 > `max_model_len`, or a prompt larger than the
//!   whole cache) is refused at admission (`InvalidInput` / `Oom`) and never queued.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::engine::handle::RequestId;
use crate::engine::kv_cache::{BlockManager, SeqBlocks, StateCheckpoints, StateSlots};
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
    /// Last collected step (engine numbering).
    collected: u64,
    /// Blocks and state slots of sequences gone while a step naming them is in flight: (that
    /// step, blocks, slot), freed at its collection.
    deferred: Vec<(u64, SeqBlocks, Option<u32>)>,
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
            collected: 0,
            deferred: Vec::new(),
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
        self.release(&mut seq);
        Some(seq)
    }

    /// Free `seq`'s blocks and state slot now, or once the last submitted step naming them is
    /// collected.
    fn release(&mut self, seq: &mut Sequence) {
        if seq.last_step > self.collected {
            let blocks = std::mem::take(&mut seq.blocks);
            let slot = seq.state_slot.take();
            self.deferred.push((seq.last_step, blocks, slot));
        } else {
            self.kv.free(&mut seq.blocks);
            self.states.give_back(&mut seq.state_slot);
        }
    }

    /// Record that the engine submitted step `step` (numbered from 1, increasing) with
    /// `scheduled`: their blocks are held until it is collected.
    pub fn step_submitted(&mut self, step: u64, scheduled: &[ScheduledSeq]) {
        for s in scheduled {
            if let Some(seq) = self.seqs.get_mut(&s.id) {
                seq.last_step = step;
            }
        }
    }

    /// Record that step `step` (and every earlier one) was collected: blocks and slots held for
    /// it are free again.
    pub fn step_collected(&mut self, step: u64) {
        self.collected = self.collected.max(step);
        let mut i = 0;
        while i < self.deferred.len() {
            if self.deferred[i].0 <= self.collected {
                let (_, mut blocks, mut slot) = self.deferred.swap_remove(i);
                self.kv.free(&mut blocks);
                self.states.give_back(&mut slot);
            } else {
                i += 1;
            }
        }
    }

    /// Blocks held back for steps in flight.
    pub fn num_deferred_blocks(&self) -> usize {
        self.deferred.iter().map(|d| d.1.table.len()).sum()
    }

    /// Whether scheduling the next step now can need no preemption: the free blocks cover
    /// every running sequence's remaining tokens (a conservative bound; the engine collects the
    /// step in flight first when this fails, so that preemption frees blocks at once).
    pub fn fits_without_preemption(&self) -> bool {
        let need: usize = self
            .running
            .iter()
            .map(|id| {
                let seq = &self.seqs[id];
                let n = seq.num_uncomputed().min(self.cfg.max_num_batched_tokens);
                self.kv
                    .blocks_for(seq.num_computed_tokens + n)
                    .saturating_sub(seq.blocks.table.len())
            })
            .sum();
        need <= self.kv.num_free()
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
            // A pending token that reaches max_len ends the sequence: nothing more to compute.
            if n == 0 || (seq.pending > 0 && seq.num_tokens() >= seq.max_len) {
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
                if self.seqs[&id].pending > 0 {
                    // Preempted with a token still being sampled: readmitted once it is known.
                    self.states.give_back(&mut { slot });
                    break;
                }
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
        let mut seq = self.seqs.remove(&id).expect("preempted ids are in seqs");
        self.release(&mut seq);
        seq.reset_for_recompute();
        self.seqs.insert(id, seq);
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
mod tests;
