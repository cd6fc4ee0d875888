//! Queueing one step on the device, the part the llama and Qwen3.5 runners share: the step's
//! metadata (a decode graph bucket's padded copy, or the eager step's buffers), tokens fed from
//! the last queued step, the runner's layers, the raw logits rows and the queued sampling.
//!
//! The runner supplies its workspace type ([`StepBuffers`]), how to make one and how to queue its
//! layers into it; the rest (which bucket, when to remake the workspace, graphs or eager, the
//! logits rows) is here, once.

use crate::backend::{Backend, StepInput};
use crate::error::EngineError;
use crate::model::llama::decode_graphs::{DecodeGraphs, Fed};
use crate::model::step::{download_raw_rows, CacheGeometry, ForwardBatch};
use crate::model::step_queue::{QueuedStep, StepQueue};
use crate::model::ModelConfig;

/// A runner's persistent per-step buffers.
pub(crate) trait StepBuffers<B: Backend> {
    /// The (tokens, logits rows) the buffers were made for.
    fn capacity(&self) -> (usize, usize);
    /// f32 logits `[rows, vocab]`, written by the layers.
    fn logits(&self) -> &B::Logits;
}

/// The per-step state of a runner, the same in the llama and Qwen3.5 runners (`W`: its
/// workspace type), which [`submit_step`] reads and updates.
pub(crate) struct StepState<B: Backend, W> {
    /// Activations and logits kept across steps: made at the first step, remade (larger) for a
    /// step it cannot hold.
    pub(crate) workspace: Option<W>,
    /// The eager steps' metadata on the device, made at the first eager step and refilled.
    pub(crate) step: Option<B::Step>,
    /// Decode graphs (the runners' `with_decode_graphs`); `None`: every step runs eagerly.
    pub(crate) graphs: Option<DecodeGraphs<B>>,
    /// Least (tokens, logits rows) a workspace is made for.
    pub(crate) reserve: (usize, usize),
    /// Submitted steps not yet collected (at most two).
    pub(crate) queue: StepQueue<B>,
}

impl<B: Backend, W> Default for StepState<B, W> {
    fn default() -> StepState<B, W> {
        StepState {
            workspace: None,
            step: None,
            graphs: None,
            reserve: (0, 0),
            queue: StepQueue::default(),
        }
    }
}

/// Queue `input` (built from `batch`): its metadata, `feeds` (token, sampling row of the last
/// queued step) copied on the device from that step's sampled ids, `layers(ws, step, tokens,
/// rows)`, then the sampling (queued, not waited for). Raw logits rows (`Last` / `All`) are
/// downloaded here. A decode-only step that fits a graph bucket runs padded to the bucket
/// (`tokens` = `rows` = its size). `make(tokens, rows)` makes a workspace when there is none or
/// the step needs a larger one: at least as large as reserved and as the one it replaces (the
/// graphs, which recorded the old buffers, are cleared).
#[allow(clippy::too_many_arguments)]
pub(crate) fn submit_step<B, W>(
    backend: &B,
    s: &mut StepState<B, W>,
    batch: &ForwardBatch,
    input: &StepInput,
    feeds: &[(u32, u32)],
    vocab: usize,
    make: impl FnOnce(usize, usize) -> Result<W, EngineError> + Send,
    mut layers: impl FnMut(&mut W, &B::Step, usize, usize) -> Result<(), EngineError> + Send,
) -> Result<QueuedStep<B>, EngineError>
where
    B: Backend,
    W: StepBuffers<B> + Send,
{
    let StepState {
        workspace,
        step,
        graphs,
        reserve,
        queue,
    } = s;
    let (mut graphs, reserve) = (graphs.as_mut(), *reserve);
    let from: Option<Fed<'_, B>> = match (feeds.is_empty(), queue.last_pending()) {
        (true, _) => None,
        (false, Some(p)) => Some((p, feeds)),
        (false, None) => {
            return Err(EngineError::Internal(format!(
                "{} fed tokens, but no queued step samples",
                feeds.len()
            )))
        }
    };
    let mut q = QueuedStep::empty();
    backend.run_step(|| {
        let bucket = graphs.as_ref().and_then(|g| g.bucket_for(input));
        let (t, rows) = match bucket {
            Some(b) => (b.size, b.size),
            None => (input.num_tokens(), input.logit_rows.len()),
        };
        if !workspace.as_ref().is_some_and(|w| {
            let (wt, wr) = w.capacity();
            wt >= t && wr >= rows
        }) {
            let (old_t, old_r) = workspace.as_ref().map_or((0, 0), |w| w.capacity());
            *workspace = None;
            if let Some(g) = graphs.as_mut() {
                g.clear();
            }
            let tokens = t.max(reserve.0).max(old_t);
            let rows = rows.max(reserve.1).max(old_r).max(1);
            *workspace = Some(make(tokens, rows)?);
        }
        let ws = workspace.as_mut().expect("made above");
        match (bucket, graphs.as_mut()) {
            (Some(bucket), Some(g)) => {
                g.run_with(bucket, backend, input, from, |st| layers(ws, st, t, rows))?;
            }
            _ => {
                match step {
                    Some(st) => backend.update_step(st, input)?,
                    None => *step = Some(backend.prepare_step(input)?),
                }
                let st = step.as_mut().expect("made above");
                if let Some((p, f)) = from {
                    backend.feed_tokens(st, p, f)?;
                }
                layers(ws, st, t, rows)?;
            }
        }
        // Raw rows for `Last` / `All`, sampling queued for `Sample` (rows past the batch's own,
        // e.g. a graph's padding, are never read).
        let picks = download_raw_rows(backend, vocab, ws.logits(), batch, &mut q.logits)?;
        if !picks.is_empty() {
            q.pending = Some(backend.sample_submit(ws.logits(), &picks)?);
        }
        Ok::<(), EngineError>(())
    })?;
    Ok(q)
}

/// `batch`'s step metadata for a runner of `config` over a KV cache of `geometry`
/// ([`ForwardBatch::step_input`] with the runner's limits).
pub(crate) fn runner_step_input(
    batch: &ForwardBatch,
    geometry: &CacheGeometry,
    config: &ModelConfig,
) -> Result<StepInput, EngineError> {
    batch.step_input(
        geometry.block_size,
        geometry.num_blocks,
        config.vocab_size,
        config.max_position_embeddings,
    )
}

/// The end of every runner's layers: the step's `rows` logits rows of the final-normed `h`
/// `[tokens, hidden]` gathered into `last` `[rows, hidden]`, then their f32 logits through
/// `lm_head` into `logits` `[rows, vocab]`. Nothing when `rows` is 0.
#[allow(clippy::too_many_arguments)]
pub(crate) fn queue_logits<B: Backend>(
    b: &B,
    h: &B::Buffer,
    step: &B::Step,
    hidden: usize,
    rows: usize,
    lm_head: &B::Weight,
    last: &mut B::Buffer,
    logits: &mut B::Logits,
) -> Result<(), EngineError> {
    if rows == 0 {
        return Ok(());
    }
    b.gather_rows(h, step, hidden, last)?;
    b.logits_into(last, rows, lm_head, logits)?;
    Ok(())
}
