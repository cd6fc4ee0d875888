//! [`ModelRunner`] for [`Qwen3_5`]: a step runs eagerly over the runner's step metadata, or,
//! when it is decode-only and fits a bucket of the decode graphs
//! ([`Qwen3_5::with_decode_graphs`]), padded to the bucket and replayed from its graph; raw
//! logits rows are downloaded at once and sampling is queued on the device. On a backend that
//! queues steps (CUDA) [`ModelRunner::submit`] returns before the device has finished (at most
//! two steps in flight, as the llama runner), the ids sampled by one step fed on the device into
//! the next (`Feed`), so `engine.overlap` builds step N+1 while the GPU runs step N.

use super::{forward, Mixer, Qwen3_5};
use crate::backend::hybrid::HybridBackend;
use crate::error::EngineError;
use crate::model::step::{ForwardBatch, ModelRunner};
use crate::model::step_queue::{queued_runner_methods, QueuedStep};
use crate::model::step_submit::{runner_step_input, submit_step, StepBuffers};

impl<B: HybridBackend> ModelRunner for Qwen3_5<B> {
    queued_runner_methods!();

    fn weight_bytes(&self) -> u64 {
        let b = &self.backend;
        let w = &self.weights;
        let mut total = 0usize;
        for l in &w.layers {
            total += [&l.gate_proj, &l.up_proj, &l.down_proj]
                .iter()
                .map(|m| b.weight_bytes(m))
                .sum::<usize>();
            total += match &l.mixer {
                Mixer::Linear(g) => [
                    &g.in_proj_qkv,
                    &g.in_proj_z,
                    &g.in_proj_a,
                    &g.in_proj_b,
                    &g.out_proj,
                ]
                .iter()
                .map(|m| b.weight_bytes(m))
                .sum::<usize>(),
                Mixer::Full(a) => [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]
                    .iter()
                    .map(|m| b.weight_bytes(m))
                    .sum::<usize>(),
            };
        }
        let head = w.lm_head.as_ref().unwrap_or(&w.embed_tokens);
        (total + b.weight_bytes(head)) as u64
    }

    fn reset_state_slot(&mut self, slot: u32) -> Result<(), EngineError> {
        Ok(self.backend.reset_state_slot(&mut self.states, slot)?)
    }

    fn copy_state_slot(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        Ok(self.backend.copy_state_slot(&mut self.states, src, dst)?)
    }
}

impl<B: HybridBackend> Qwen3_5<B> {
    /// Queue one step: its metadata, `feeds` (token, sampling row of the last queued step)
    /// copied on the device from that step's sampled ids, the layers and the logits, then the
    /// sampling (queued, not waited for). Raw logits rows (`Last` / `All`) are downloaded here.
    /// State-slot copies the engine asks for between submissions are queued on the same stream,
    /// so a prefix checkpoint copies the state the step submitted before it leaves.
    fn run(
        &mut self,
        batch: &ForwardBatch,
        feeds: &[(u32, u32)],
    ) -> Result<QueuedStep<B>, EngineError> {
        let input = runner_step_input(batch, &self.geometry, &self.config)?;
        if input.num_tokens() == 0 {
            return Ok(QueuedStep::empty());
        }
        if let Some(i) = input
            .seqs
            .iter()
            .position(|s| s.len > 0 && s.state_slot.is_none())
        {
            return Err(EngineError::Internal(format!(
                "malformed forward batch: sequence {i} of a hybrid model has no state slot"
            )));
        }
        let gdn = self.gdn_params();
        let Qwen3_5 {
            backend,
            config,
            weights,
            kv_cache,
            states,
            steps,
            ..
        } = self;
        let (backend, config, weights) = (&*backend, &*config, &*weights);
        submit_step(
            backend,
            steps,
            batch,
            &input,
            feeds,
            config.vocab_size,
            |tokens, rows| forward::Workspace::new(backend, config, &gdn, weights, tokens, rows),
            |ws, st, t, rows| {
                forward::queue(
                    weights, backend, config, &gdn, kv_cache, states, ws, st, t, rows,
                )
            },
        )
    }
}

impl<B: HybridBackend> StepBuffers<B> for forward::Workspace<B> {
    fn capacity(&self) -> (usize, usize) {
        (self.tokens, self.rows)
    }

    fn logits(&self) -> &B::Logits {
        &self.logits
    }
}
