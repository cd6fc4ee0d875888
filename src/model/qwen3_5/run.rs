//! [`ModelRunner`] for [`Qwen3_5`]: a step runs eagerly over the runner's step metadata, or,
//! when it is decode-only and fits a bucket of the decode graphs
//! ([`Qwen3_5::with_decode_graphs`]), padded to the bucket and replayed from its graph; the
//! logits rows are then downloaded or sampled on the host side of the step.

use super::{forward, Mixer, Qwen3_5};
use crate::backend::hybrid::HybridBackend;
use crate::error::EngineError;
use crate::model::step::{CacheGeometry, ForwardBatch, ForwardOutput, ModelRunner};

impl<B: HybridBackend> ModelRunner for Qwen3_5<B> {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_position_embeddings(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn cache_geometry(&self) -> CacheGeometry {
        self.geometry
    }

    fn device_name(&self) -> String {
        self.backend.name()
    }

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

    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, EngineError> {
        let input = batch.step_input(
            self.geometry.block_size,
            self.geometry.num_blocks,
            self.config.vocab_size,
            self.config.max_position_embeddings,
        )?;
        if input.num_tokens() == 0 {
            return Ok(ForwardOutput::default());
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
            workspace,
            step,
            graphs,
            reserve,
            ..
        } = self;
        backend.run_step(|| {
            // A decode-only step that fits a graph bucket runs padded to the bucket.
            let bucket = graphs.as_ref().and_then(|g| g.bucket_for(&input));
            let (t, rows) = match bucket {
                Some(b) => (b.size, b.size),
                None => (input.num_tokens(), input.logit_rows.len()),
            };
            if !workspace
                .as_ref()
                .is_some_and(|w| w.tokens >= t && w.rows >= rows)
            {
                // First step, or one larger than any before: (re)make it, at least as large
                // as reserved and as the one it replaces. Graphs recorded its old buffers.
                let (old_t, old_r) = workspace.as_ref().map_or((0, 0), |w| (w.tokens, w.rows));
                *workspace = None;
                if let Some(g) = graphs.as_mut() {
                    g.clear();
                }
                let tokens = t.max(reserve.0).max(old_t);
                let rows = rows.max(reserve.1).max(old_r).max(1);
                *workspace = Some(forward::Workspace::new(
                    backend, config, &gdn, weights, tokens, rows,
                )?);
            }
            let ws = workspace.as_mut().expect("made above");
            match (bucket, graphs.as_mut()) {
                (Some(bucket), Some(g)) => {
                    g.run_with(bucket, backend, &input, None, |st| {
                        forward::queue(
                            weights, backend, config, &gdn, kv_cache, states, ws, st, t, rows,
                        )
                    })?;
                }
                _ => {
                    match step {
                        Some(st) => backend.update_step(st, &input)?,
                        None => *step = Some(backend.prepare_step(&input)?),
                    }
                    let st = step.as_ref().expect("made above");
                    forward::queue(
                        weights, backend, config, &gdn, kv_cache, states, ws, st, t, rows,
                    )?;
                }
            }
            // Raw rows for `Last` / `All`, device sampling for `Sample` (rows past the batch's
            // own, a graph's padding, are never read).
            ForwardOutput::from_logits(backend, config.vocab_size, &ws.logits, batch)
        })
    }

    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        Ok(self.backend.copy_block(&mut self.kv_cache, src, dst)?)
    }

    fn reset_state_slot(&mut self, slot: u32) -> Result<(), EngineError> {
        Ok(self.backend.reset_state_slot(&mut self.states, slot)?)
    }

    fn copy_state_slot(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        Ok(self.backend.copy_state_slot(&mut self.states, src, dst)?)
    }
}
