//! The CPU backend: f32 activations, weights kept in their stored encoding, rayon threads.
//!
//! It is the numerical reference for every other backend, so it favours exactness: weights are
//! dequantized exactly as stored (never re-quantized), norms and softmax run in f32 (norm sums
//! in f64), and every row of every op is computed independently of the others, so a row's
//! result does not depend on what else is in the batch.
//!
//! The op bodies live in [`ops`] (row-wise and elementwise), [`attention`] (paged KV cache and
//! attention) and [`matmul`] (SIMD kernels straight on the stored blocks, exact mode: f32
//! activations × exactly dequantized weights); [`reference`] keeps the plain
//! dequantize-and-dot matmul as the oracle for them. This file checks arguments and runs each
//! op on the backend's own thread pool.

pub mod attention;
pub mod gdn;
mod hybrid;
pub mod matmul;
mod norm_rows;
pub mod ops;
pub mod reference;
mod rope_kv;
mod sample;
mod weight;

use crate::backend::rope::{cos_sin_table, RopeSpec};
use crate::backend::{
    AttentionParams, Backend, BackendError, KvCacheDType, KvCacheSpec, StepInput,
};
use crate::sampling::{SampleError, Sampled, SamplingRow};
use crate::tensor::{LinearView, TensorView};

pub use attention::CpuKvCache;
pub use weight::CpuWeight;

/// The RoPE table on the host.
#[derive(Debug, Clone)]
pub struct CpuRope {
    /// Parameters the table was built for.
    pub spec: RopeSpec,
    /// `[max_positions, rotary_dim / 2]`.
    pub cos: Vec<f32>,
    /// `[max_positions, rotary_dim / 2]`.
    pub sin: Vec<f32>,
}

/// f32 logits rows in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuLogits {
    /// Row-major `[rows, vocab]`.
    pub data: Vec<f32>,
    /// Row length.
    pub vocab: usize,
}

/// The CPU backend: a rayon pool of `threads` workers.
#[derive(Debug)]
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    /// KV-cache encoding new caches round through (see [`KvCacheDType`]).
    kv_storage: KvCacheDType,
    /// `qkv_rope_write`'s split q, k, v (and normed k) rows, kept between calls so a layer
    /// allocates nothing once the largest step has run.
    qkv_scratch: std::sync::Mutex<[Vec<f32>; 4]>,
    /// Report [`Backend::queues_steps`] (tests of a runner's queued path without a GPU).
    queued: bool,
}

impl CpuBackend {
    /// A backend with `threads` workers (0 = one per available core).
    pub fn new(threads: usize) -> Result<CpuBackend, BackendError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("kiln-cpu-{i}"))
            .build()
            .map_err(|e| BackendError::Device(format!("cannot start the CPU thread pool: {e}")))?;
        Ok(CpuBackend {
            pool,
            kv_storage: KvCacheDType::Same,
            qkv_scratch: Default::default(),
            queued: false,
        })
    }

    /// Report [`Backend::queues_steps`], so a runner takes its queued path (submit / collect,
    /// fed tokens patched into the step by [`Backend::feed_tokens`] from the previous answer).
    /// Each op still computes at once: this exists to test that path without a GPU.
    pub fn with_queued_steps(mut self, on: bool) -> CpuBackend {
        self.queued = on;
        self
    }

    /// Round every value written to the KV caches this backend creates through `storage`
    /// (`engine.kv_cache_dtype`): the numerics of a GPU fp8 cache, in f32 memory.
    pub fn with_kv_storage(mut self, storage: KvCacheDType) -> CpuBackend {
        self.kv_storage = storage;
        self
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

/// `Err(InvalidArgument)` unless `len >= need` (`what` names the buffer; formatted only then).
fn check_len(what: impl std::fmt::Display, len: usize, need: usize) -> Result<(), BackendError> {
    if len < need {
        return Err(BackendError::InvalidArgument(format!(
            "{what}: {len} elements, need {need}"
        )));
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;
    type Weight = CpuWeight;
    type KvCache = CpuKvCache;
    type Rope = CpuRope;
    type Step = StepInput;
    type Logits = CpuLogits;
    type PendingSamples = Vec<Result<Sampled, SampleError>>;

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads())
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>, BackendError> {
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|_| {
            BackendError::OutOfMemory(format!("cannot allocate {len} f32 activations"))
        })?;
        v.resize(len, 0.0);
        Ok(v)
    }

    fn alloc_f32(&self, len: usize) -> Result<Vec<f32>, BackendError> {
        self.alloc(len)
    }

    fn upload(&self, data: &[f32]) -> Result<Vec<f32>, BackendError> {
        Ok(data.to_vec())
    }

    fn download(&self, src: &Vec<f32>, dst: &mut [f32]) -> Result<(), BackendError> {
        if src.len() != dst.len() {
            return Err(BackendError::InvalidArgument(format!(
                "download of {} elements into {}",
                src.len(),
                dst.len()
            )));
        }
        dst.copy_from_slice(src);
        Ok(())
    }

    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        match &w.packed {
            Some(p) => p.stored_bytes(),
            None => w.bytes().len(),
        }
    }

    fn upload_linear(
        &self,
        name: &str,
        linear: &LinearView<'_>,
    ) -> Result<CpuWeight, BackendError> {
        match linear {
            LinearView::Dense(view) => self.upload_weight(name, view),
            LinearView::Packed(p) => {
                p.validate()
                    .map_err(|e| BackendError::InvalidArgument(format!("`{name}`: {e}")))?;
                Ok(CpuWeight::packed(p))
            }
        }
    }

    fn upload_weight(&self, name: &str, view: &TensorView<'_>) -> Result<CpuWeight, BackendError> {
        let bad = |m: String| BackendError::InvalidArgument(format!("`{name}`: {m}"));
        let &[rows, cols] = view.shape else {
            return Err(bad(format!(
                "expected a 2-D weight, found shape {:?}",
                view.shape
            )));
        };
        if !view.dtype.is_weight() {
            return Err(bad(format!(
                "{:?} is the type of a packed linear's part, not of a weight",
                view.dtype
            )));
        }
        let row_bytes = view.dtype.row_bytes(cols).ok_or_else(|| {
            bad(format!(
                "{cols} columns are not whole {:?} blocks",
                view.dtype
            ))
        })?;
        if view.data.len() != rows * row_bytes {
            return Err(bad(format!(
                "{} bytes for shape {:?} of {:?}",
                view.data.len(),
                view.shape,
                view.dtype
            )));
        }
        Ok(CpuWeight::new(
            view.dtype,
            view.shape.to_vec(),
            view.data.to_vec(),
        ))
    }

    fn upload_vector(&self, name: &str, view: &TensorView<'_>) -> Result<Vec<f32>, BackendError> {
        let &[n] = view.shape else {
            return Err(BackendError::InvalidArgument(format!(
                "`{name}`: expected a 1-D tensor, found shape {:?}",
                view.shape
            )));
        };
        if view.dtype.row_bytes(n) != Some(view.data.len()) {
            return Err(BackendError::InvalidArgument(format!(
                "`{name}`: {} bytes of {:?} for {n} elements",
                view.data.len(),
                view.dtype
            )));
        }
        let mut out = vec![0.0; n];
        reference::dequantize_row(view.dtype, view.data, &mut out);
        Ok(out)
    }

    fn create_kv_cache(&self, spec: &KvCacheSpec) -> Result<CpuKvCache, BackendError> {
        let per_layer = spec.num_blocks * spec.block_size * spec.slot_elems();
        // Fail cleanly instead of aborting when the budget exceeds what the host can give.
        let mut probe: Vec<f32> = Vec::new();
        probe.try_reserve_exact(per_layer).map_err(|_| {
            BackendError::OutOfMemory(format!(
                "cannot allocate a KV cache of {} blocks",
                spec.num_blocks
            ))
        })?;
        drop(probe);
        Ok(CpuKvCache::new(*spec, self.kv_storage))
    }

    fn kv_bytes_per_block(&self, spec: &KvCacheSpec) -> usize {
        spec.bytes_per_block(std::mem::size_of::<f32>())
    }

    fn create_rope(&self, spec: &RopeSpec) -> Result<CpuRope, BackendError> {
        if spec.rotary_dim == 0 || !spec.rotary_dim.is_multiple_of(2) {
            return Err(BackendError::InvalidArgument(format!(
                "rotary dim {} must be even and positive",
                spec.rotary_dim
            )));
        }
        let (cos, sin) = cos_sin_table(spec);
        Ok(CpuRope {
            spec: *spec,
            cos,
            sin,
        })
    }

    fn prepare_step(&self, step: &StepInput) -> Result<StepInput, BackendError> {
        Ok(step.clone())
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn run_step<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        // Ops called from inside the pool run their `install` inline.
        self.pool.install(f)
    }

    fn embedding(
        &self,
        table: &CpuWeight,
        step: &StepInput,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        if table.packed.is_some() {
            return Err(BackendError::Unsupported(
                "an embedding table stored as a packed linear".into(),
            ));
        }
        let (vocab, hidden) = (table.shape[0], table.shape[1]);
        check_len("embedding output", out.len(), step.num_tokens() * hidden)?;
        if let Some(&id) = step.token_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(BackendError::InvalidArgument(format!(
                "token id {id} ≥ vocabulary {vocab}"
            )));
        }
        self.pool.install(|| {
            ops::embedding(
                table,
                &step.token_ids,
                &mut out[..step.num_tokens() * hidden],
            )
        });
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        weight: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.norm_rows("rms_norm", x, weight, out, rows, dim, |x, w, o| {
            ops::rms_norm(x, w, o, dim, eps)
        })
    }

    fn add_rms_norm(
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
            "add_rms_norm",
            residual,
            delta,
            weight,
            out,
            rows,
            dim,
            |r, d, w, o| ops::add_rms_norm(r, d, w, o, dim, eps),
        )
    }

    fn matmul(
        &self,
        x: &Vec<f32>,
        rows: usize,
        w: &CpuWeight,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        let (n, k) = (w.shape[0], w.shape[1]);
        check_len("matmul input", x.len(), rows * k)?;
        check_len("matmul output", out.len(), rows * n)?;
        if let Some(p) = &w.packed {
            // Packed 4-bit: dequantized row by row on the fly (the reference path).
            self.pool.install(|| {
                matmul::packed::matmul_packed(&x[..rows * k], rows, &p.view(), &mut out[..rows * n])
            });
            return Ok(());
        }
        // Exact mode (f32 activations × exactly dequantized blocks), SIMD, on the backend's pool.
        self.pool
            .install(|| matmul::matmul(&x[..rows * k], rows, k, &w.view(), &mut out[..rows * n]));
        Ok(())
    }

    fn rope(
        &self,
        q: &mut Vec<f32>,
        k: &mut Vec<f32>,
        rope: &CpuRope,
        step: &StepInput,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError> {
        rope_kv::rope(self, q, k, rope, step, num_heads, num_kv_heads, head_dim)
    }

    fn write_kv(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        step: &StepInput,
    ) -> Result<(), BackendError> {
        rope_kv::write_kv(cache, layer, k, v, step)
    }

    fn paged_attention(
        &self,
        q: &Vec<f32>,
        cache: &CpuKvCache,
        layer: usize,
        step: &StepInput,
        params: &AttentionParams,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        rope_kv::paged_attention(self, q, cache, layer, step, params, out)
    }

    fn silu_mul(
        &self,
        gate: &Vec<f32>,
        up: &Vec<f32>,
        out: &mut Vec<f32>,
        len: usize,
    ) -> Result<(), BackendError> {
        check_len("silu_mul gate", gate.len(), len)?;
        check_len("silu_mul up", up.len(), len)?;
        check_len("silu_mul output", out.len(), len)?;
        self.pool
            .install(|| ops::silu_mul(&gate[..len], &up[..len], &mut out[..len]));
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) -> Result<(), BackendError> {
        check_len("add x", x.len(), len)?;
        check_len("add y", y.len(), len)?;
        self.pool.install(|| ops::add(&mut x[..len], &y[..len]));
        Ok(())
    }

    fn gather_rows(
        &self,
        x: &Vec<f32>,
        step: &StepInput,
        dim: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        check_len("gather_rows input", x.len(), step.num_tokens() * dim)?;
        check_len("gather_rows output", out.len(), step.logit_rows.len() * dim)?;
        if let Some(&r) = step
            .logit_rows
            .iter()
            .find(|&&r| r as usize >= step.num_tokens())
        {
            return Err(BackendError::InvalidArgument(format!(
                "logit row {r} of {} tokens",
                step.num_tokens()
            )));
        }
        ops::gather_rows(x, &step.logit_rows, dim, out);
        Ok(())
    }

    fn logits(&self, x: &Vec<f32>, rows: usize, w: &CpuWeight) -> Result<CpuLogits, BackendError> {
        sample::logits(self, x, rows, w)
    }

    fn alloc_logits(&self, rows: usize, vocab: usize) -> Result<CpuLogits, BackendError> {
        sample::alloc_logits(self, rows, vocab)
    }

    fn logits_into(
        &self,
        x: &Vec<f32>,
        rows: usize,
        w: &CpuWeight,
        out: &mut CpuLogits,
    ) -> Result<(), BackendError> {
        sample::logits_into(self, x, rows, w, out)
    }

    fn qkv_rope_write(
        &self,
        qkv: &Vec<f32>,
        q_out: &mut Vec<f32>,
        cache: &mut CpuKvCache,
        layer: usize,
        rope: &CpuRope,
        step: &StepInput,
        params: &AttentionParams,
        qk_norm: Option<(&Vec<f32>, &Vec<f32>, f32)>,
    ) -> Result<(), BackendError> {
        rope_kv::qkv_rope_write(self, qkv, q_out, cache, layer, rope, step, params, qk_norm)
    }

    fn swiglu(
        &self,
        gate_up: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
        inter: usize,
    ) -> Result<(), BackendError> {
        use rayon::prelude::*;
        check_len("swiglu gate_up", gate_up.len(), rows * 2 * inter)?;
        check_len("swiglu output", out.len(), rows * inter)?;
        if inter == 0 {
            return Ok(());
        }
        self.pool.install(|| {
            out[..rows * inter]
                .par_chunks_mut(inter)
                .zip(gate_up[..rows * 2 * inter].par_chunks(2 * inter))
                .for_each(|(o, gu)| {
                    let (g, u) = gu.split_at(inter);
                    ops::silu_mul(g, u, o);
                })
        });
        Ok(())
    }

    fn download_logits(
        &self,
        logits: &CpuLogits,
        first_row: usize,
        dst: &mut [f32],
    ) -> Result<(), BackendError> {
        sample::download_logits(logits, first_row, dst)
    }

    fn sample_submit(
        &self,
        logits: &CpuLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        self.sample(logits, rows)
    }

    fn sample_collect(
        &self,
        pending: Vec<Result<Sampled, SampleError>>,
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        Ok(pending)
    }

    fn queues_steps(&self) -> bool {
        self.queued
    }

    fn feed_tokens(
        &self,
        step: &mut StepInput,
        from: &Vec<Result<Sampled, SampleError>>,
        feeds: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        sample::feed_tokens(step, from, feeds)
    }

    fn sample(
        &self,
        logits: &CpuLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        sample::sample(self, logits, rows)
    }

    fn copy_block(&self, cache: &mut CpuKvCache, src: u32, dst: u32) -> Result<(), BackendError> {
        let n = cache.spec.num_blocks;
        if src as usize >= n || dst as usize >= n {
            return Err(BackendError::InvalidArgument(format!(
                "copy_block {src} → {dst} of {n} blocks"
            )));
        }
        if src != dst {
            cache.copy_block(src as usize, dst as usize);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
