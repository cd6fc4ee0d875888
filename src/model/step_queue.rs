//! The steps a runner submitted and has not collected yet, shared by the llama and Qwen3.5 runners.
//!
//! With `engine.overlap` the engine submits step N+1 before it collects step N, so at most two
//! steps are queued. A queued step holds its raw logits rows (downloaded at submission) and its
//! pending device sampling; collecting it waits for the sampled ids only. On a backend that
//! computes steps at submission ([`Backend::queues_steps`] false) nothing is queued: the runner
//! runs the step at once and returns [`Submitted::done`].

use std::collections::VecDeque;

use crate::backend::Backend;
use crate::error::EngineError;
use crate::model::step::{Feed, ForwardOutput, Submitted};

/// One submitted step: what its collection returns.
pub(crate) struct QueuedStep<B: Backend> {
    /// Sequence number ([`Submitted::queued`]); set by [`StepQueue::push`].
    pub(crate) seq: u64,
    /// Raw logits rows (`Last` / `All`), already on the host.
    pub(crate) logits: Vec<f32>,
    /// The step's device sampling, if any row samples.
    pub(crate) pending: Option<B::PendingSamples>,
}

impl<B: Backend> QueuedStep<B> {
    /// A step with nothing computed yet (no logits rows, no sampling).
    pub(crate) fn empty() -> QueuedStep<B> {
        QueuedStep {
            seq: 0,
            logits: Vec::new(),
            pending: None,
        }
    }

    /// Wait for the step's sampled ids on `backend`.
    pub(crate) fn finish(self, backend: &B) -> Result<ForwardOutput, EngineError> {
        let samples = match self.pending {
            Some(p) => backend.sample_collect(p)?,
            None => Vec::new(),
        };
        Ok(ForwardOutput {
            logits: self.logits,
            samples,
        })
    }
}

/// Submitted, uncollected steps, oldest first (at most two).
pub(crate) struct StepQueue<B: Backend> {
    steps: VecDeque<QueuedStep<B>>,
    /// Sequence number of the last submitted step.
    next_seq: u64,
}

impl<B: Backend> Default for StepQueue<B> {
    fn default() -> StepQueue<B> {
        StepQueue {
            steps: VecDeque::new(),
            next_seq: 0,
        }
    }
}

impl<B: Backend> StepQueue<B> {
    /// A blocking `forward` is only allowed with nothing queued.
    pub(crate) fn ensure_empty(&self) -> Result<(), EngineError> {
        if self.steps.is_empty() {
            Ok(())
        } else {
            Err(EngineError::Internal(
                "forward while submitted steps are not collected".into(),
            ))
        }
    }

    /// Whether a step may be queued on `backend`, checked before any of its work is launched:
    /// `Some(feeds)` as (token, sampling row of the last queued step) pairs when it is queued,
    /// `None` when `backend` computes steps at submission (the runner then runs `forward`).
    /// Errors: fed tokens for such a backend, or a third step before the first was collected.
    pub(crate) fn admit(
        &self,
        backend: &B,
        feeds: &[Feed],
    ) -> Result<Option<Vec<(u32, u32)>>, EngineError> {
        if !backend.queues_steps() {
            if !feeds.is_empty() {
                return Err(EngineError::Internal(format!(
                    "{} fed tokens for a runner on {}, which computes steps at submission",
                    feeds.len(),
                    backend.name()
                )));
            }
            return Ok(None);
        }
        if self.steps.len() >= 2 {
            return Err(EngineError::Internal(
                "a third step submitted before the first was collected".into(),
            ));
        }
        Ok(Some(
            feeds
                .iter()
                .map(|f| (f.token as u32, f.row as u32))
                .collect(),
        ))
    }

    /// The pending sampling of the last queued step: where a new step's fed tokens come from.
    pub(crate) fn last_pending(&self) -> Option<&B::PendingSamples> {
        self.steps.back().and_then(|p| p.pending.as_ref())
    }

    /// Queue a step launched after [`StepQueue::admit`] said `Some`.
    pub(crate) fn push(&mut self, step: QueuedStep<B>) -> Submitted {
        self.next_seq += 1;
        self.steps.push_back(QueuedStep {
            seq: self.next_seq,
            ..step
        });
        Submitted::queued(self.next_seq)
    }

    /// Collect `step`: its output when it was computed at submission, else the oldest queued
    /// step (which `step` must name) finished on `backend`.
    pub(crate) fn collect(
        &mut self,
        backend: &B,
        step: Submitted,
    ) -> Result<ForwardOutput, EngineError> {
        let step = match step.into_output() {
            Ok(done) => return Ok(done),
            Err(s) => s,
        };
        let Some(q) = self.steps.pop_front() else {
            return Err(EngineError::Internal("collect with no step queued".into()));
        };
        if step.queued_seq() != Some(q.seq) {
            return Err(EngineError::Internal(format!(
                "collected step {:?}, but the oldest queued one is {}",
                step.queued_seq(),
                q.seq
            )));
        }
        q.finish(backend)
    }
}

/// The [`crate::model::step::ModelRunner`] methods of a runner that queues its steps through a
/// [`StepQueue`], shared by the llama and Qwen3.5 runners (expand it inside their `impl
/// ModelRunner` block): the config and geometry accessors, `forward` (nothing may be queued),
/// `submit` / `collect` through the queue, `queues_steps` and `copy_block` on the backend. It
/// reads the runner's fields `config` ([`crate::model::ModelConfig`]), `geometry`, `backend`,
/// `kv_cache` and `steps` ([`crate::model::step_submit::StepState`], for its queue), and its
/// method `run(batch, feeds) -> Result<QueuedStep<B>, _>`.
macro_rules! queued_runner_methods {
    () => {
        fn vocab_size(&self) -> usize {
            self.config.vocab_size
        }

        fn max_position_embeddings(&self) -> usize {
            self.config.max_position_embeddings
        }

        fn cache_geometry(&self) -> $crate::model::step::CacheGeometry {
            self.geometry
        }

        fn device_name(&self) -> String {
            self.backend.name()
        }

        fn forward(
            &mut self,
            batch: &$crate::model::step::ForwardBatch,
        ) -> Result<$crate::model::step::ForwardOutput, $crate::error::EngineError> {
            self.steps.queue.ensure_empty()?;
            let q = self.run(batch, &[])?;
            q.finish(&self.backend)
        }

        fn submit(
            &mut self,
            batch: &$crate::model::step::ForwardBatch,
            feeds: &[$crate::model::step::Feed],
        ) -> Result<$crate::model::step::Submitted, $crate::error::EngineError> {
            let Some(feeds) = self.steps.queue.admit(&self.backend, feeds)? else {
                return Ok($crate::model::step::Submitted::done(self.forward(batch)?));
            };
            let q = self.run(batch, &feeds)?;
            Ok(self.steps.queue.push(q))
        }

        fn collect(
            &mut self,
            step: $crate::model::step::Submitted,
        ) -> Result<$crate::model::step::ForwardOutput, $crate::error::EngineError> {
            self.steps.queue.collect(&self.backend, step)
        }

        fn queues_steps(&self) -> bool {
            self.backend.queues_steps()
        }

        fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), $crate::error::EngineError> {
            Ok(self.backend.copy_block(&mut self.kv_cache, src, dst)?)
        }
    };
}
pub(crate) use queued_runner_methods;
