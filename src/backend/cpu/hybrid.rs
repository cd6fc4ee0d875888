//! [`HybridBackend`] for the CPU: argument checks, then the bodies in [`super::gdn`] on the
//! backend's thread pool.

use std::collections::HashSet;

use super::gdn::{self, CpuStateCache, Form};
use super::{check_len, CpuBackend};
use crate::backend::hybrid::{GdnParams, HybridBackend, StateSpec};
use crate::backend::{BackendError, StepInput};

/// `Err(InvalidArgument)` unless every sequence of `step` with tokens names a distinct slot of
/// `spec`.
fn check_slots(step: &StepInput, spec: &StateSpec) -> Result<(), BackendError> {
    let mut seen = HashSet::new();
    for (i, s) in step.seqs.iter().enumerate().filter(|(_, s)| s.len > 0) {
        let slot = s.state_slot.ok_or_else(|| {
            BackendError::InvalidArgument(format!(
                "sequence {i} of a hybrid-model step has no state slot"
            ))
        })?;
        check_slot(spec, slot)?;
        if !seen.insert(slot) {
            return Err(BackendError::InvalidArgument(format!(
                "state slot {slot} is used by two sequences of one step"
            )));
        }
    }
    Ok(())
}

/// `Err(InvalidArgument)` unless `slot` is a slot of `spec`.
fn check_slot(spec: &StateSpec, slot: u32) -> Result<(), BackendError> {
    if slot as usize >= spec.num_slots {
        return Err(BackendError::InvalidArgument(format!(
            "state slot {slot} of {}",
            spec.num_slots
        )));
    }
    Ok(())
}

impl HybridBackend for CpuBackend {
    type StateCache = CpuStateCache;

    fn create_state_cache(&self, spec: &StateSpec) -> Result<CpuStateCache, BackendError> {
        if spec.conv_kernel < 2 {
            return Err(BackendError::InvalidArgument(format!(
                "conv kernel {} (at least 2 taps)",
                spec.conv_kernel
            )));
        }
        CpuStateCache::new(*spec).ok_or_else(|| {
            BackendError::OutOfMemory(format!(
                "cannot allocate {} state slots of {} bytes",
                spec.num_slots,
                spec.bytes_per_slot()
            ))
        })
    }

    fn reset_state_slot(&self, cache: &mut CpuStateCache, slot: u32) -> Result<(), BackendError> {
        check_slot(&cache.spec, slot)?;
        cache.reset(slot as usize);
        Ok(())
    }

    fn copy_state_slot(
        &self,
        cache: &mut CpuStateCache,
        src: u32,
        dst: u32,
    ) -> Result<(), BackendError> {
        check_slot(&cache.spec, src)?;
        check_slot(&cache.spec, dst)?;
        cache.copy_slot(src as usize, dst as usize);
        Ok(())
    }

    fn split_query_gate(
        &self,
        qg: &Vec<f32>,
        q: &mut Vec<f32>,
        gate: &mut Vec<f32>,
        tokens: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError> {
        let n = tokens * heads * head_dim;
        check_len("split_query_gate input", qg.len(), 2 * n)?;
        check_len("split_query_gate q", q.len(), n)?;
        check_len("split_query_gate gate", gate.len(), n)?;
        gdn::split_query_gate(&qg[..2 * n], &mut q[..n], &mut gate[..n], head_dim);
        Ok(())
    }

    fn sigmoid_mul(
        &self,
        x: &mut Vec<f32>,
        gate: &Vec<f32>,
        len: usize,
    ) -> Result<(), BackendError> {
        check_len("sigmoid_mul x", x.len(), len)?;
        check_len("sigmoid_mul gate", gate.len(), len)?;
        self.pool
            .install(|| gdn::sigmoid_mul(&mut x[..len], &gate[..len]));
        Ok(())
    }

    fn gdn_conv1d(
        &self,
        cache: &mut CpuStateCache,
        layer: usize,
        mixed: &Vec<f32>,
        weight: &Vec<f32>,
        step: &StepInput,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        let spec = cache.spec;
        if layer >= spec.num_layers {
            return Err(BackendError::InvalidArgument(format!(
                "GDN layer {layer} of {}",
                spec.num_layers
            )));
        }
        check_slots(step, &spec)?;
        let n = step.num_tokens() * spec.conv_dim;
        check_len("gdn_conv1d input", mixed.len(), n)?;
        check_len("gdn_conv1d output", out.len(), n)?;
        check_len(
            "gdn_conv1d weight",
            weight.len(),
            spec.conv_dim * spec.conv_kernel,
        )?;
        self.pool.install(|| {
            gdn::conv1d(cache, layer, &mixed[..n], weight, step, &mut out[..n]);
        });
        Ok(())
    }

    fn gdn_recurrence(
        &self,
        cache: &mut CpuStateCache,
        layer: usize,
        qkv: &Vec<f32>,
        a: &Vec<f32>,
        b: &Vec<f32>,
        a_log: &Vec<f32>,
        dt_bias: &Vec<f32>,
        step: &StepInput,
        params: &GdnParams,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        params.check_fits(&cache.spec, layer)?;
        check_slots(step, &cache.spec)?;
        let t = step.num_tokens();
        let nv = params.num_value_heads;
        check_len("gdn qkv", qkv.len(), t * params.conv_dim())?;
        check_len("gdn a", a.len(), t * nv)?;
        check_len("gdn b", b.len(), t * nv)?;
        check_len("gdn A_log", a_log.len(), nv)?;
        check_len("gdn dt_bias", dt_bias.len(), nv)?;
        check_len("gdn output", out.len(), t * params.value_dim())?;
        self.pool.install(|| {
            gdn::recurrence(
                cache,
                layer,
                qkv,
                a,
                b,
                a_log,
                dt_bias,
                step,
                params,
                &mut out[..t * params.value_dim()],
                Form::Auto,
            )
        });
        Ok(())
    }

    fn rms_norm_1p(
        &self,
        x: &Vec<f32>,
        weight: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.norm_rows("rms_norm_1p", x, weight, out, rows, dim, |x, w, o| {
            gdn::rms_norm_1p(x, w, o, dim, eps)
        })
    }

    fn add_rms_norm_1p(
        &self,
        residual: &mut Vec<f32>,
        delta: &Vec<f32>,
        weight: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.add_norm_rows(
            "add_rms_norm_1p",
            residual,
            delta,
            weight,
            out,
            rows,
            dim,
            |r, d, w, o| gdn::add_rms_norm_1p(r, d, w, o, dim, eps),
        )
    }

    fn gated_rms_norm(
        &self,
        x: &Vec<f32>,
        z: &Vec<f32>,
        weight: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let n = rows * dim;
        check_len("gated_rms_norm x", x.len(), n)?;
        check_len("gated_rms_norm z", z.len(), n)?;
        check_len("gated_rms_norm output", out.len(), n)?;
        check_len("gated_rms_norm weight", weight.len(), dim)?;
        self.pool
            .install(|| gdn::gated_rms_norm(&x[..n], &z[..n], weight, &mut out[..n], dim, eps));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StepSeq;

    #[test]
    fn slots_are_checked() {
        let b = CpuBackend::new(1).unwrap();
        let spec = StateSpec {
            num_slots: 2,
            num_layers: 1,
            conv_dim: 2,
            conv_kernel: 2,
            num_value_heads: 1,
            key_head_dim: 1,
            value_head_dim: 1,
        };
        let mut cache = b.create_state_cache(&spec).unwrap();
        let seq = |start, slot| StepSeq {
            token_start: start,
            len: 1,
            cached_len: 0,
            block_table: vec![],
            state_slot: slot,
        };
        let step = |seqs: Vec<StepSeq>| StepInput {
            token_ids: vec![0; seqs.len()],
            positions: vec![0; seqs.len()],
            slot_mapping: vec![0; seqs.len()],
            seqs,
            logit_rows: vec![],
            block_size: 1,
        };
        let (x, w) = (vec![1.0; 4], vec![1.0; 4]);
        let mut out = vec![0.0; 4];
        for bad in [
            step(vec![seq(0, None)]),
            step(vec![seq(0, Some(2))]),
            step(vec![seq(0, Some(1)), seq(1, Some(1))]),
        ] {
            assert!(matches!(
                b.gdn_conv1d(&mut cache, 0, &x, &w, &bad, &mut out),
                Err(BackendError::InvalidArgument(_))
            ));
        }
        let ok = step(vec![seq(0, Some(1)), seq(1, Some(0))]);
        b.gdn_conv1d(&mut cache, 0, &x, &w, &ok, &mut out).unwrap();
        assert!(b.reset_state_slot(&mut cache, 2).is_err());
        b.copy_state_slot(&mut cache, 1, 0).unwrap();
        assert_eq!(cache.slot_layer(0, 0), cache.slot_layer(1, 0));
        b.reset_state_slot(&mut cache, 1).unwrap();
        assert!(cache.slot_layer(1, 0).0.iter().all(|&v| v == 0.0));
    }
}
