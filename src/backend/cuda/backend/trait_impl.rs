//! The [`Backend`] trait on [`CudaBackend`]: each method checks what is its own to check, opens
//! its profiling span (`KILN_PROFILE_OPS`) and forwards to the child module of `backend.rs` that
//! owns the op (that file's header lists them).

use super::{
    dense_rope, dev_err, fused, graph, load, profile_rows, rope_kv, rowwise, ComputeDType,
    CudaBackend, CudaBuffer, CudaKvCache, CudaLogits, CudaPendingSamples, CudaRope, CudaStep,
    CudaWeight, PrefillVariant,
};
use crate::backend::rope::{cos_sin_table, RopeSpec};
use crate::backend::{
    AttentionParams, Backend, BackendError, KvCacheSpec, PinnedShape, StepGraph, StepInput,
};
use crate::sampling::{SampleError, Sampled, SamplingRow};
use crate::tensor::TensorView;

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type Weight = CudaWeight;
    type KvCache = CudaKvCache;
    type Rope = CudaRope;
    type Step = CudaStep;
    type Logits = CudaLogits;
    type PendingSamples = CudaPendingSamples;

    fn name(&self) -> String {
        self.device_name.clone()
    }

    fn alloc(&self, len: usize) -> Result<CudaBuffer, BackendError> {
        Ok(CudaBuffer {
            data: self.alloc_bytes(len * self.dtype.size())?,
            len,
            dtype: self.dtype,
        })
    }

    fn alloc_f32(&self, len: usize) -> Result<CudaBuffer, BackendError> {
        Ok(CudaBuffer {
            data: self.alloc_bytes(len * 4)?,
            len,
            dtype: ComputeDType::F32,
        })
    }

    fn upload(&self, data: &[f32]) -> Result<CudaBuffer, BackendError> {
        Ok(CudaBuffer {
            data: self.upload_host_f32(data)?,
            len: data.len(),
            dtype: self.dtype,
        })
    }

    fn download(&self, src: &CudaBuffer, dst: &mut [f32]) -> Result<(), BackendError> {
        load::download(self, src, dst)
    }

    fn weight_bytes(&self, w: &CudaWeight) -> usize {
        w.data.len()
            + w.packed.as_ref().map_or(0, |p| p.bytes())
            + w.gguf.as_ref().map_or(0, |p| p.bytes())
    }

    fn upload_linear(
        &self,
        name: &str,
        linear: &crate::tensor::LinearView<'_>,
    ) -> Result<CudaWeight, BackendError> {
        match linear {
            crate::tensor::LinearView::Dense(view) => self.upload_weight(name, view),
            crate::tensor::LinearView::Packed(p) => self.upload_packed(name, p),
        }
    }

    fn upload_weight(&self, name: &str, view: &TensorView<'_>) -> Result<CudaWeight, BackendError> {
        load::upload_weight(self, name, view)
    }

    fn upload_gate_up(
        &self,
        name: &str,
        parts: &[TensorView<'_>; 2],
    ) -> Result<CudaWeight, BackendError> {
        let w = self.upload_weight_rows(name, parts)?;
        self.interleave_gate_up(w)
    }

    fn gate_up_swiglu(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        scratch: &mut CudaBuffer,
        out: &mut CudaBuffer,
        inter: usize,
    ) -> Result<(), BackendError> {
        fused::gate_up_swiglu(self, x, rows, w, scratch, out, inter)
    }

    fn fused_decode_rows(&self, ws: &[&CudaWeight]) -> usize {
        if ws.iter().all(|w| self.fused_takes(w)) {
            self.fused_rows
        } else {
            0
        }
    }

    fn norm_matmul(
        &self,
        x: &CudaBuffer,
        weight: &CudaBuffer,
        eps: f32,
        rows: usize,
        dim: usize,
        w: &CudaWeight,
        h: &mut CudaBuffer,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        fused::norm_matmul(self, x, weight, eps, rows, dim, w, h, out)
    }

    fn norm_matmul_rope_write(
        &self,
        x: &CudaBuffer,
        weight: &CudaBuffer,
        eps: f32,
        rows: usize,
        dim: usize,
        w: &CudaWeight,
        h: &mut CudaBuffer,
        qkv: &mut CudaBuffer,
        q_out: &mut CudaBuffer,
        cache: &mut CudaKvCache,
        layer: usize,
        rope: &CudaRope,
        step: &CudaStep,
        params: &AttentionParams,
    ) -> Result<(), BackendError> {
        dense_rope::norm_matmul_rope_write(
            self, x, weight, eps, rows, dim, w, h, qkv, q_out, cache, layer, rope, step, params,
        )
    }

    fn norm_gate_up_swiglu(
        &self,
        x: &CudaBuffer,
        weight: &CudaBuffer,
        eps: f32,
        rows: usize,
        dim: usize,
        w: &CudaWeight,
        h: &mut CudaBuffer,
        scratch: &mut CudaBuffer,
        out: &mut CudaBuffer,
        inter: usize,
    ) -> Result<(), BackendError> {
        fused::norm_gate_up_swiglu(self, x, weight, eps, rows, dim, w, h, scratch, out, inter)
    }

    fn matmul_residual(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        delta: &mut CudaBuffer,
        residual: &mut CudaBuffer,
        n: usize,
    ) -> Result<(), BackendError> {
        fused::matmul_residual(self, x, rows, w, delta, residual, n)
    }

    fn upload_vector(&self, name: &str, view: &TensorView<'_>) -> Result<CudaBuffer, BackendError> {
        load::upload_vector(self, name, view)
    }

    fn create_kv_cache(&self, spec: &KvCacheSpec) -> Result<CudaKvCache, BackendError> {
        let per_layer =
            spec.num_blocks * spec.block_size * spec.slot_elems() * self.kv_elem_bytes();
        let mut k = Vec::with_capacity(spec.num_layers);
        let mut v = Vec::with_capacity(spec.num_layers);
        for _ in 0..spec.num_layers {
            k.push(self.alloc_bytes(per_layer)?);
            v.push(self.alloc_bytes(per_layer)?);
        }
        Ok(CudaKvCache { spec: *spec, k, v })
    }

    fn kv_bytes_per_block(&self, spec: &KvCacheSpec) -> usize {
        spec.bytes_per_block(self.kv_elem_bytes())
    }

    fn create_rope(&self, spec: &RopeSpec) -> Result<CudaRope, BackendError> {
        let (cos, sin) = cos_sin_table(spec);
        Ok(CudaRope {
            spec: *spec,
            cos: self.stream.clone_htod(&cos).map_err(dev_err)?,
            sin: self.stream.clone_htod(&sin).map_err(dev_err)?,
        })
    }

    fn prepare_step(&self, step: &StepInput) -> Result<CudaStep, BackendError> {
        let mut st = CudaStep::with_capacity(&self.stream, CudaStep::len_for(step))?;
        st.fill(&self.stream, step)?;
        self.prof.note_step(profile_rows(step));
        Ok(st)
    }

    fn update_step(&self, st: &mut CudaStep, step: &StepInput) -> Result<(), BackendError> {
        st.fill(&self.stream, step)?;
        st.pinned_context = 0;
        self.prof.note_step(profile_rows(step));
        Ok(())
    }

    fn update_step_pinned(
        &self,
        st: &mut CudaStep,
        step: &StepInput,
        shape: &PinnedShape,
    ) -> Result<(), BackendError> {
        st.fill(&self.stream, step)?;
        if st.max_context > shape.max_context {
            return Err(BackendError::InvalidArgument(format!(
                "a step of context {} pinned to {}",
                st.max_context, shape.max_context
            )));
        }
        st.pinned_context = shape.max_context;
        self.prof.note_step(profile_rows(step));
        Ok(())
    }

    fn supports_graphs(&self) -> bool {
        true
    }

    fn begin_capture(&self) -> Result<(), BackendError> {
        graph::begin(self)?;
        self.prof.set_capturing(true);
        Ok(())
    }

    fn end_capture(&self) -> Result<Box<dyn StepGraph>, BackendError> {
        self.prof.set_capturing(false);
        graph::end(self)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.stream.synchronize().map_err(dev_err)
    }

    fn run_step<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        // cudarc binds the context before each call it makes; binding here as well keeps raw
        // driver calls made inside `f` on this device.
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!(error = ?e, "Could not bind the CUDA context to the engine thread.");
        }
        if !self.prof.on() {
            return f();
        }
        self.prof.begin_step(&self.stream, &self.k.gpu_sleep);
        let r = f();
        self.prof.end_step(&self.stream);
        r
    }

    fn embedding(
        &self,
        table: &CudaWeight,
        step: &CudaStep,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        rowwise::embedding(self, table, step, out)
    }

    fn rms_norm(
        &self,
        x: &CudaBuffer,
        weight: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        rowwise::rms_norm(self, x, weight, out, rows, dim, eps)
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaBuffer,
        delta: &CudaBuffer,
        weight: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        rowwise::add_rms_norm(self, residual, delta, weight, out, rows, dim, eps)
    }

    fn matmul(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "matmul");
        if w.swiglu_rows {
            return Err(BackendError::InvalidArgument(
                "a gate|up weight from upload_gate_up is for gate_up_swiglu only".into(),
            ));
        }
        self.matmul_checked(["matmul input", "matmul output"], x, rows, w, out)
    }

    fn rope(
        &self,
        q: &mut CudaBuffer,
        k: &mut CudaBuffer,
        rope: &CudaRope,
        step: &CudaStep,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError> {
        rope_kv::rope(self, q, k, rope, step, num_heads, num_kv_heads, head_dim)
    }

    fn write_kv(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        k: &CudaBuffer,
        v: &CudaBuffer,
        step: &CudaStep,
    ) -> Result<(), BackendError> {
        rope_kv::write_kv(self, cache, layer, k, v, step)
    }

    fn paged_attention(
        &self,
        q: &CudaBuffer,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "paged_attention");
        self.check_attention(q, cache, layer, step, params, out)?;
        if step.num_tokens == 0 {
            return Ok(());
        }
        let variant = PrefillVariant::for_head_dim(params.head_dim);
        let Some(variant) = variant.filter(|_| step.prefill_tiles > 0) else {
            // Decode only, or a head_dim the tiled kernel lacks: split-K over every token.
            return self.launch_split_k(q, cache, layer, step, params, out, None, false, None);
        };
        self.launch_prefill(variant, q, cache, layer, step, params, out, None)?;
        if step.split_tokens > 0 {
            let index = step.split_index();
            self.launch_split_k(
                q,
                cache,
                layer,
                step,
                params,
                out,
                Some(&index),
                false,
                None,
            )?;
        }
        Ok(())
    }

    fn silu_mul(
        &self,
        gate: &CudaBuffer,
        up: &CudaBuffer,
        out: &mut CudaBuffer,
        len: usize,
    ) -> Result<(), BackendError> {
        rowwise::silu_mul(self, gate, up, out, len)
    }

    fn add(&self, x: &mut CudaBuffer, y: &CudaBuffer, len: usize) -> Result<(), BackendError> {
        rowwise::add(self, x, y, len)
    }

    fn gather_rows(
        &self,
        x: &CudaBuffer,
        step: &CudaStep,
        dim: usize,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        rowwise::gather_rows(self, x, step, dim, out)
    }

    fn logits(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
    ) -> Result<CudaLogits, BackendError> {
        let mut out = self.alloc_logits_rows(rows, w.n)?;
        self.logits_f32_into(x, rows, w, &mut out)?;
        Ok(out)
    }

    fn alloc_logits(&self, rows: usize, vocab: usize) -> Result<CudaLogits, BackendError> {
        self.alloc_logits_rows(rows, vocab)
    }

    fn logits_into(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaLogits,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "logits_into");
        self.logits_f32_into(x, rows, w, out)
    }

    fn qkv_rope_write(
        &self,
        qkv: &CudaBuffer,
        q_out: &mut CudaBuffer,
        cache: &mut CudaKvCache,
        layer: usize,
        rope: &CudaRope,
        step: &CudaStep,
        params: &AttentionParams,
        qk_norm: Option<(&CudaBuffer, &CudaBuffer, f32)>,
    ) -> Result<(), BackendError> {
        rope_kv::qkv_rope_write(self, qkv, q_out, cache, layer, rope, step, params, qk_norm)
    }

    fn swiglu(
        &self,
        gate_up: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        inter: usize,
    ) -> Result<(), BackendError> {
        rowwise::swiglu(self, gate_up, out, rows, inter)
    }

    fn download_logits(
        &self,
        logits: &CudaLogits,
        first_row: usize,
        dst: &mut [f32],
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "download_logits");
        self.download_logits_rows(logits, first_row, dst)
    }

    fn sample(
        &self,
        logits: &CudaLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        let _t = self.prof.op(&self.stream, "sample");
        self.sample_rows(logits, rows)
    }

    fn sample_submit(
        &self,
        logits: &CudaLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<CudaPendingSamples, BackendError> {
        let _t = self.prof.op(&self.stream, "sample");
        self.queue_sample(logits, rows)
    }

    fn sample_collect(
        &self,
        pending: CudaPendingSamples,
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        self.collect_sample(pending)
    }

    fn queues_steps(&self) -> bool {
        true
    }

    fn feed_tokens(
        &self,
        step: &mut CudaStep,
        from: &CudaPendingSamples,
        feeds: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "feed_tokens");
        self.feed_step_tokens(step, from, feeds)
    }

    fn copy_block(&self, cache: &mut CudaKvCache, src: u32, dst: u32) -> Result<(), BackendError> {
        rope_kv::copy_block(self, cache, src, dst)
    }
}
