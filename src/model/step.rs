//! The step contract between the engine and a loaded model: what one step of continuous
//! batching asks for ([`ForwardBatch`]: new tokens, per-sequence slices over block tables,
//! which logits to return) and what it gives back ([`ForwardOutput`]), and the
//! [`ModelRunner`] trait every architecture implements. The engine (scheduler, sampler) builds
//! batches above this module; backends below it see only the checked integer layout
//! ([`StepInput`], made by [`ForwardBatch::step_input`]).
//!
//! Invariants a batch must satisfy (checked by [`ForwardBatch::step_input`]): every token
//! belongs to exactly one sequence slice; a slice's block table covers `cached_len + len`
//! tokens with in-range block ids; token ids are in the vocabulary and positions below the
//! model's limit.

use crate::backend::{Backend, StepInput, StepSeq};
use crate::error::EngineError;
use crate::sampling::{SampleError, Sampled, SamplingRow};

/// What a sequence needs from a forward step's logits.
#[derive(Debug, Clone, PartialEq)]
pub enum LogitsFor {
    /// Nothing (an intermediate prefill chunk).
    None,
    /// The raw f32 logits row of the last token of the slice.
    Last,
    /// The raw f32 logits rows of every token of the slice (`kiln probe --positions all`).
    All,
    /// A token sampled on the device from the last token's logits, as the descriptor says;
    /// only the token (and the requested logprobs) reach the host.
    Sample(SamplingRow),
}

impl LogitsFor {
    /// Logits rows this sequence occupies in the step (`len` new tokens).
    pub fn rows(&self, len: usize) -> usize {
        match self {
            LogitsFor::None => 0,
            LogitsFor::Last | LogitsFor::Sample(_) => 1,
            LogitsFor::All => len,
        }
    }
}

/// What a forward step returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardOutput {
    /// Raw f32 logits, row-major `[rows, vocab]`: 1 row per `LogitsFor::Last` and `len` per
    /// `LogitsFor::All` sequence, in the order of `batch.seqs`.
    pub logits: Vec<f32>,
    /// One result per `LogitsFor::Sample` sequence, in the order of `batch.seqs` (a row whose
    /// logits have no finite maximum fails alone).
    pub samples: Vec<Result<Sampled, SampleError>>,
}

impl ForwardOutput {
    /// The step's answer from the logits rows `logits` holds (laid out in the order of
    /// `batch.seqs`, as [`ForwardBatch::step_input`] lays them out): raw rows are downloaded for
    /// the `Last` / `All` sequences, and the `Sample` sequences' rows are sampled by the backend
    /// (rows past the batch's own, e.g. the padding of a decode graph, are never read).
    pub fn from_logits<B: Backend>(
        b: &B,
        vocab_size: usize,
        logits: &B::Logits,
        batch: &ForwardBatch,
    ) -> Result<ForwardOutput, EngineError> {
        let mut out = ForwardOutput::default();
        let picks = download_raw_rows(b, vocab_size, logits, batch, &mut out.logits)?;
        if !picks.is_empty() {
            out.samples = b.sample(logits, &picks)?;
        }
        Ok(out)
    }
}

/// The raw logits rows of `batch`'s `Last` / `All` sequences downloaded from `logits` (rows as
/// [`ForwardBatch::step_input`] lays them out) and appended to `raw`, in batch order; returns the
/// (row, sampling row) picks of its `Sample` sequences for the backend's sampler. Rows past the
/// batch's own (e.g. the padding of a decode graph) are never read.
pub(crate) fn download_raw_rows<'a, B: Backend>(
    b: &B,
    vocab_size: usize,
    logits: &B::Logits,
    batch: &'a ForwardBatch,
    raw: &mut Vec<f32>,
) -> Result<Vec<(usize, &'a SamplingRow)>, EngineError> {
    let mut row = 0;
    let mut picks = Vec::new();
    for s in &batch.seqs {
        let n = s.logits.rows(s.len);
        match &s.logits {
            LogitsFor::None => {}
            LogitsFor::Sample(desc) => picks.push((row, desc)),
            LogitsFor::Last | LogitsFor::All => {
                let at = raw.len();
                raw.resize(at + n * vocab_size, 0.0);
                b.download_logits(logits, row, &mut raw[at..])?;
            }
        }
        row += n;
    }
    Ok(picks)
}

/// A token of a submitted batch that the step submitted just before it samples, so the host
/// does not know it when it builds the batch (the engine builds step N+1 while the device runs
/// step N): `token_ids[token]` holds a placeholder (any in-vocabulary id), and the runner puts
/// there the id sampled for sampling row `row` (the `row`-th `LogitsFor::Sample` sequence, in
/// batch order) of the previous submitted step before anything reads it. A row whose sampling
/// failed feeds token 0 (its sequence fails when that step is collected, and the engine
/// discards what this step computes for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feed {
    /// Index into [`ForwardBatch::token_ids`].
    pub token: usize,
    /// Sampling row of the previous submitted step.
    pub row: usize,
}

/// A step [`ModelRunner::submit`] accepted: either already computed (runners that run a step
/// synchronously, such as the CPU's) or queued on the device, its answer fetched by
/// [`ModelRunner::collect`]. Steps are collected in the order they were submitted.
#[derive(Debug)]
pub struct Submitted(SubmittedState);

#[derive(Debug)]
enum SubmittedState {
    Done(ForwardOutput),
    Queued(u64),
}

impl Submitted {
    /// A step computed at submission.
    pub fn done(out: ForwardOutput) -> Submitted {
        Submitted(SubmittedState::Done(out))
    }

    /// A step queued on the device under the runner's sequence number `seq`.
    pub fn queued(seq: u64) -> Submitted {
        Submitted(SubmittedState::Queued(seq))
    }

    /// The answer, when the step was computed at submission (its feeds for the next step can
    /// then be resolved on the host).
    pub fn output(&self) -> Option<&ForwardOutput> {
        match &self.0 {
            SubmittedState::Done(o) => Some(o),
            SubmittedState::Queued(_) => None,
        }
    }

    /// The runner's sequence number of a queued step.
    pub fn queued_seq(&self) -> Option<u64> {
        match self.0 {
            SubmittedState::Done(_) => None,
            SubmittedState::Queued(s) => Some(s),
        }
    }

    /// The answer of a step computed at submission; `Err(self)` for a queued one.
    pub fn into_output(self) -> Result<ForwardOutput, Submitted> {
        match self.0 {
            SubmittedState::Done(o) => Ok(o),
            SubmittedState::Queued(_) => Err(self),
        }
    }
}

/// `batch` with every feed resolved on the host from `prev`, the answer of the step submitted
/// before it (what a runner that computes steps at submission needs). A feed of a row that failed
/// to sample, or past `prev`'s rows, gets token 0 (see [`Feed`]).
pub fn resolve_feeds(batch: &mut ForwardBatch, feeds: &[Feed], prev: &ForwardOutput) {
    for f in feeds {
        let id = match prev.samples.get(f.row) {
            Some(Ok(s)) => s.token_id,
            _ => 0,
        };
        if let Some(t) = batch.token_ids.get_mut(f.token) {
            *t = id;
        }
    }
}

/// Any runner behind a device-like queue: [`ModelRunner::submit`] only records the step, and
/// [`ModelRunner::collect`] computes it then (its feeds resolved from the step before it), so the
/// work happens after the engine has built and submitted the next step, as on a GPU. The
/// reference semantics of submit / collect, used to test the engine's overlap on the CPU runner
/// and on test models. Block and state-slot copies run at once, not queued: not for a hybrid
/// model's prefix checkpoints (which copy the state a queued step leaves).
pub struct Deferred<R: ModelRunner> {
    /// The runner that computes the steps.
    pub inner: R,
    queue: std::collections::VecDeque<(u64, ForwardBatch, Vec<Feed>)>,
    next: u64,
    /// The answer of the last computed step (what its successor's feeds read).
    last: ForwardOutput,
}

impl<R: ModelRunner> Deferred<R> {
    /// `inner` behind a queue.
    pub fn new(inner: R) -> Deferred<R> {
        Deferred {
            inner,
            queue: Default::default(),
            next: 0,
            last: ForwardOutput::default(),
        }
    }

    /// Steps submitted and not yet collected, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = &ForwardBatch> {
        self.queue.iter().map(|q| &q.1)
    }
}

impl<R: ModelRunner> ModelRunner for Deferred<R> {
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
        self.inner.device_name()
    }
    fn weight_bytes(&self) -> u64 {
        self.inner.weight_bytes()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, EngineError> {
        let s = self.submit(batch, &[])?;
        self.collect(s)
    }
    fn submit(&mut self, batch: &ForwardBatch, feeds: &[Feed]) -> Result<Submitted, EngineError> {
        if self.queue.len() >= 2 {
            return Err(EngineError::Internal(
                "a third step submitted before the first was collected".into(),
            ));
        }
        self.next += 1;
        self.queue
            .push_back((self.next, batch.clone(), feeds.to_vec()));
        Ok(Submitted::queued(self.next))
    }
    fn collect(&mut self, step: Submitted) -> Result<ForwardOutput, EngineError> {
        let Some((seq, mut batch, feeds)) = self.queue.pop_front() else {
            return Err(EngineError::Internal("collect with no step queued".into()));
        };
        if step.queued_seq() != Some(seq) {
            return Err(EngineError::Internal(format!(
                "collected {:?}, but the oldest queued step is {seq}",
                step.queued_seq()
            )));
        }
        resolve_feeds(&mut batch, &feeds, &self.last);
        match self.inner.forward(&batch) {
            Ok(out) => {
                self.last = out.clone();
                Ok(out)
            }
            Err(e) => {
                self.last = ForwardOutput::default();
                Err(e)
            }
        }
    }
    fn queues_steps(&self) -> bool {
        true
    }
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        self.inner.copy_block(src, dst)
    }
    fn reset_state_slot(&mut self, slot: u32) -> Result<(), EngineError> {
        self.inner.reset_state_slot(slot)
    }
    fn copy_state_slot(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        self.inner.copy_state_slot(src, dst)
    }
}

/// One sequence's part of a forward step.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqSlice {
    /// Offset of this sequence's tokens in [`ForwardBatch::token_ids`].
    pub start: usize,
    /// Number of new tokens this step (1 for decode; a chunk for prefill).
    pub len: usize,
    /// Tokens already in the KV cache for this sequence before this step (the new tokens take
    /// positions `cached_len .. cached_len + len`).
    pub cached_len: usize,
    /// Physical KV block ids, in order; covers at least `cached_len + len` tokens.
    pub block_table: Vec<u32>,
    /// Which logits to return.
    pub logits: LogitsFor,
    /// Recurrent-state slot (hybrid models such as Qwen3.5; `None` for pure attention models).
    pub state_slot: Option<u32>,
}

/// Everything the model needs for one step of continuous batching.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardBatch {
    /// New tokens of all sequences, concatenated: `[num_tokens]`.
    pub token_ids: Vec<u32>,
    /// Per-sequence slices, in the order logits are returned.
    pub seqs: Vec<SeqSlice>,
}

/// KV-cache geometry a runner was built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheGeometry {
    /// Tokens per block.
    pub block_size: usize,
    /// Physical blocks available.
    pub num_blocks: usize,
    /// Recurrent-state slots (0 for pure attention models).
    pub num_state_slots: usize,
}

/// A loaded model bound to a backend and its KV cache. Implemented once per architecture
/// family, generic over `Backend`; the engine thread holds it as `Box<dyn ModelRunner>`.
pub trait ModelRunner: Send {
    /// Vocabulary size (length of every logits row).
    fn vocab_size(&self) -> usize;
    /// The model's own context limit (`max_position_embeddings`).
    fn max_position_embeddings(&self) -> usize;
    /// The KV-cache geometry.
    fn cache_geometry(&self) -> CacheGeometry;
    /// Human-readable backend description for logs.
    fn device_name(&self) -> String;
    /// Bytes the weight matrices occupy on the device (what a decode step streams), for
    /// roofline figures; 0 when unknown.
    fn weight_bytes(&self) -> u64 {
        0
    }
    /// Run one step: raw logits rows for the `Last` / `All` sequences and sampled tokens for
    /// the `Sample` ones (see [`ForwardOutput`]). Writes K/V of the new tokens into the blocks
    /// named by each block table.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, EngineError>;
    /// Queue one step whose `feeds` tokens come from the step submitted before it (see
    /// [`Feed`]); its answer comes from [`ModelRunner::collect`], steps in submission order. At
    /// most two steps are submitted and not yet collected. Writes K/V of the new tokens as
    /// [`ModelRunner::forward`] does; what it computes is the same as `forward` on the batch with
    /// its feeds resolved. The default runs the step at once (`feeds` must be empty: the engine
    /// resolves them on the host when the previous step was computed at submission).
    fn submit(&mut self, batch: &ForwardBatch, feeds: &[Feed]) -> Result<Submitted, EngineError> {
        if !feeds.is_empty() {
            return Err(EngineError::Internal(format!(
                "{} fed tokens for a runner that computes steps at submission (resolve them on \
                 the host)",
                feeds.len()
            )));
        }
        Ok(Submitted::done(self.forward(batch)?))
    }
    /// The answer of the oldest submitted step (waits for the device). Only the sampled ids
    /// (and requested logprobs) cross to the host here.
    fn collect(&mut self, step: Submitted) -> Result<ForwardOutput, EngineError> {
        step.into_output().map_err(|s| {
            EngineError::Internal(format!(
                "step {:?} was queued, but this runner queues none",
                s.queued_seq()
            ))
        })
    }
    /// Whether [`ModelRunner::submit`] queues steps on a device (and returns before they are
    /// computed): the engine then builds the next step while the device runs this one
    /// (`engine.overlap`). Runners that compute at submission gain nothing from it.
    fn queues_steps(&self) -> bool {
        false
    }
    /// Copy the KV contents of block `src` into block `dst` (all layers).
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), EngineError>;
    /// Reset recurrent state slot `slot` to zeros (hybrid models); a no-op otherwise.
    fn reset_state_slot(&mut self, _slot: u32) -> Result<(), EngineError> {
        Ok(())
    }
    /// Copy recurrent state slot `src` into `dst` (hybrid models: prefix checkpoints). Models
    /// without state slots have nothing to copy: `Internal`.
    fn copy_state_slot(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        Err(EngineError::Internal(format!(
            "copy of state slot {src} into {dst}: this model has no state slots"
        )))
    }
}

impl ForwardBatch {
    /// Lay out this batch for a cache of `num_blocks` blocks of `block_size` tokens and a model of
    /// `vocab_size` tokens and `max_positions` positions. Errors name what is wrong: token ids
    /// or positions out of range are `InvalidInput`; inconsistent slices or block tables are
    /// `Internal` (a scheduler bug).
    pub fn step_input(
        &self,
        block_size: usize,
        num_blocks: usize,
        vocab_size: usize,
        max_positions: usize,
    ) -> Result<StepInput, EngineError> {
        let num_tokens = self.token_ids.len();
        if let Some(&bad) = self.token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(EngineError::InvalidInput(format!(
                "token id {bad} is out of the vocabulary (size {vocab_size})"
            )));
        }
        let internal = |m: String| EngineError::Internal(format!("malformed forward batch: {m}"));
        let mut positions = vec![u32::MAX; num_tokens];
        let mut slot_mapping = vec![0u32; num_tokens];
        let mut logit_rows = Vec::new();
        let mut seqs = Vec::with_capacity(self.seqs.len());
        for (i, s) in self.seqs.iter().enumerate() {
            let end = s.start.checked_add(s.len).filter(|&e| e <= num_tokens);
            let Some(end) = end else {
                return Err(internal(format!(
                    "sequence {i} covers tokens {}..{}+{} of {num_tokens}",
                    s.start, s.start, s.len
                )));
            };
            let context = s.cached_len + s.len;
            if context > max_positions {
                return Err(EngineError::InvalidInput(format!(
                    "sequence {i} reaches {context} tokens, past the model's {max_positions} positions"
                )));
            }
            if s.block_table.len() * block_size < context {
                return Err(internal(format!(
                    "sequence {i}: block table of {} blocks cannot hold {context} tokens",
                    s.block_table.len()
                )));
            }
            if let Some(&b) = s.block_table.iter().find(|&&b| b as usize >= num_blocks) {
                return Err(internal(format!(
                    "sequence {i}: block {b} is out of range ({num_blocks} blocks)"
                )));
            }
            for t in 0..s.len {
                let tok = s.start + t;
                if positions[tok] != u32::MAX {
                    return Err(internal(format!("token {tok} belongs to two sequences")));
                }
                let pos = s.cached_len + t;
                positions[tok] = pos as u32;
                let block = s.block_table[pos / block_size] as usize;
                slot_mapping[tok] = (block * block_size + pos % block_size) as u32;
            }
            match s.logits {
                LogitsFor::None => {}
                LogitsFor::Last | LogitsFor::Sample(_) if s.len > 0 => {
                    logit_rows.push((end - 1) as u32)
                }
                LogitsFor::Last | LogitsFor::Sample(_) => {
                    return Err(internal(format!("sequence {i} wants logits of no tokens")))
                }
                LogitsFor::All => logit_rows.extend((s.start..end).map(|t| t as u32)),
            }
            seqs.push(StepSeq {
                token_start: s.start,
                len: s.len,
                cached_len: s.cached_len,
                block_table: s.block_table.clone(),
                state_slot: s.state_slot,
            });
        }
        if let Some(tok) = positions.iter().position(|&p| p == u32::MAX) {
            return Err(internal(format!("token {tok} belongs to no sequence")));
        }
        Ok(StepInput {
            token_ids: self.token_ids.clone(),
            positions,
            slot_mapping,
            seqs,
            logit_rows,
            block_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(
        start: usize,
        len: usize,
        cached_len: usize,
        table: Vec<u32>,
        logits: LogitsFor,
    ) -> SeqSlice {
        SeqSlice {
            start,
            len,
            cached_len,
            block_table: table,
            logits,
            state_slot: None,
        }
    }

    #[test]
    fn step_input_maps_positions_slots_and_logit_rows() {
        // Sequence 0: a 3-token prefill chunk after 2 cached tokens, blocks [5, 1] of size 4:
        // positions 2, 3, 4 → slots 5*4+2, 5*4+3, 1*4+0. Sequence 1: one decode at position 0.
        let batch = ForwardBatch {
            token_ids: vec![10, 11, 12, 13],
            seqs: vec![
                seq(0, 3, 2, vec![5, 1], LogitsFor::All),
                seq(3, 1, 0, vec![2], LogitsFor::Last),
            ],
        };
        let s = batch.step_input(4, 8, 100, 100).unwrap();
        assert_eq!(s.positions, vec![2, 3, 4, 0]);
        assert_eq!(s.slot_mapping, vec![22, 23, 4, 8]);
        assert_eq!(s.logit_rows, vec![0, 1, 2, 3]);
        assert_eq!(s.seqs[0].context_len(), 5);
    }

    #[test]
    fn step_input_rejects_bad_batches() {
        let ok = |b: &ForwardBatch| b.step_input(4, 8, 100, 100);
        let short_table = ForwardBatch {
            token_ids: vec![1; 5],
            seqs: vec![seq(0, 5, 0, vec![0], LogitsFor::Last)],
        };
        assert!(matches!(ok(&short_table), Err(EngineError::Internal(_))));
        let bad_block = ForwardBatch {
            token_ids: vec![1],
            seqs: vec![seq(0, 1, 0, vec![8], LogitsFor::Last)],
        };
        assert!(matches!(ok(&bad_block), Err(EngineError::Internal(_))));
        let uncovered = ForwardBatch {
            token_ids: vec![1, 2],
            seqs: vec![seq(0, 1, 0, vec![0], LogitsFor::Last)],
        };
        assert!(matches!(ok(&uncovered), Err(EngineError::Internal(_))));
        let bad_token = ForwardBatch {
            token_ids: vec![100],
            seqs: vec![seq(0, 1, 0, vec![0], LogitsFor::Last)],
        };
        assert!(matches!(ok(&bad_token), Err(EngineError::InvalidInput(_))));
        let too_long = ForwardBatch {
            token_ids: vec![1],
            seqs: vec![seq(0, 1, 100, vec![0; 26], LogitsFor::Last)],
        };
        assert!(matches!(
            too_long.step_input(4, 30, 100, 100),
            Err(EngineError::InvalidInput(_))
        ));
    }
}
