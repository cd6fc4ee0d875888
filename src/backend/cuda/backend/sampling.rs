//! The CUDA backend's logits and sampling: the lm_head GEMM writing f32 logits
//! ([`CudaLogits`]), raw-row downloads, and the host side of `kernels/sampling.cu`.
//!
//! A sampling call packs the rows' descriptors into four small arrays ([`pack_rows`]), uploads
//! them in one copy from pinned staging, runs one `sample_rows` block per row and copies back
//! only the `(id, logprob)` pairs (one D2H copy into pinned memory), which [`unpack`] turns into
//! [`Sampled`] values. The kernel reproduces [`crate::sampling::sample_row`] exactly; the packing
//! here is what it reads. Every buffer is kept in a [`SampleArena`] and reused.
//!
//! Greedy fast path: when every row is greedy, asks for no logprobs and has no effective penalty
//! ([`is_plain_greedy`]), the answer is the argmax by rank alone, so `argmax_rows` runs instead
//! (no penalized copy of the row, no radix machinery) and only the ids come back.

mod pack;

pub(crate) use pack::is_plain_greedy;
use pack::{align8, pack_rows, unpack, PackedRows};

use super::staging::Staging;
use super::{check_len, dev_err, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::BackendError;
use crate::sampling::{SampleError, Sampled, SamplingRow};

use std::sync::Arc;

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};

/// Threads per block of `sample_rows`; must equal `SAMPLE_THREADS` in sampling.cu.
const SAMPLE_THREADS: u32 = 512;

/// f32 logits rows `[rows, vocab]` on the device (in a buffer that may hold more rows: a
/// runner keeps one and refills it with [`crate::backend::Backend::logits_into`]).
#[derive(Debug)]
pub struct CudaLogits {
    data: CudaSlice<f32>,
    rows: usize,
    vocab: usize,
}

/// The sampler's reused buffers: the packed parameters (pinned staging, one upload per call),
/// the output pairs (device, and pinned host memory the host reads), and the f32 scratch of the
/// penalized rows. Grown when a call needs more; never shrunk.
#[derive(Debug)]
pub(crate) struct SampleArena {
    /// `iparams | fparams | draws | pens` (or the argmax rows), 8-byte aligned sections.
    params: Staging<u8>,
    out_dev: CudaSlice<i32>,
    scratch: CudaSlice<f32>,
}

/// Pinned ring slots the sampler's answers are copied into.
const OUT_SLOTS: usize = 2;

/// One ring slot: pinned host memory for a sampling call's outputs and the event of the copy.
#[derive(Debug)]
pub(crate) struct OutSlot {
    host: PinnedHostSlice<i32>,
    capacity: usize,
    copied: CudaEvent,
}

impl OutSlot {
    fn new(stream: &Arc<CudaStream>, capacity: usize) -> Result<OutSlot, BackendError> {
        // SAFETY: the pinned memory is only read after a copy into it has completed (its event),
        // and only the copied prefix is read.
        let host = unsafe { stream.context().alloc_pinned_with_flags::<i32>(capacity, 0) }
            .map_err(dev_err)?;
        Ok(OutSlot {
            host,
            capacity,
            copied: stream.context().new_event(None).map_err(dev_err)?,
        })
    }
}

impl Drop for OutSlot {
    fn drop(&mut self) {
        // A queued copy may still write the pinned memory: wait for it before it is freed.
        let _ = self.copied.synchronize();
    }
}

/// How a sampling call's outputs are laid out.
#[derive(Debug)]
pub(crate) enum Layout {
    /// One id per row (the greedy fast path).
    Ids,
    /// `(id, logprob)` pairs per row, as packed.
    Pairs(PackedRows),
}

/// A sampling call queued on the device ([`crate::backend::Backend::sample_submit`]).
#[derive(Debug)]
pub struct CudaPendingSamples {
    /// Ring slot its answer is copied into (`None`: no rows).
    slot: Option<usize>,
    /// Output ints copied.
    ints: usize,
    layout: Layout,
    /// Index in the sampler's device output of each row's id (what a fed token reads).
    id_at: Vec<i32>,
}

impl SampleArena {
    fn new(
        stream: &Arc<CudaStream>,
        param_bytes: usize,
        out_ints: usize,
        scratch: usize,
    ) -> Result<SampleArena, BackendError> {
        let out_ints = out_ints.max(1);
        Ok(SampleArena {
            params: Staging::new(stream, param_bytes)?,
            out_dev: stream.alloc_zeros::<i32>(out_ints).map_err(dev_err)?,
            // SAFETY: uninitialized f32 scratch; the kernel writes each row's copy before
            // reading it.
            scratch: unsafe { stream.alloc::<f32>(scratch.max(1)) }.map_err(dev_err)?,
        })
    }

    fn fits(&self, param_bytes: usize, out_ints: usize, scratch: usize) -> bool {
        self.params.capacity() >= param_bytes
            && self.out_dev.len() >= out_ints
            && self.scratch.len() >= scratch
    }
}

impl CudaBackend {
    /// Zeroed logits of `rows` rows of `vocab`.
    pub(super) fn alloc_logits_rows(
        &self,
        rows: usize,
        vocab: usize,
    ) -> Result<CudaLogits, BackendError> {
        Ok(CudaLogits {
            data: self
                .stream
                .alloc_zeros::<f32>((rows * vocab).max(1))
                .map_err(dev_err)?,
            rows,
            vocab,
        })
    }

    /// `out = x · wᵀ` with x and w in the compute dtype, accumulated and written in f32; `out`
    /// must hold `rows × w.n` values and then holds `rows` rows of `w.n`.
    pub(super) fn logits_f32_into(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaLogits,
    ) -> Result<(), BackendError> {
        check_len("logits input", x.len, rows * w.k)?;
        check_len("logits output", out.data.len(), rows * w.n)?;
        if rows > 0 {
            let (xp, _x_sync) = x.data.device_ptr(&self.stream);
            let (op, _o_sync) = out.data.device_ptr_mut(&self.stream);
            // SAFETY: x holds rows × k compute-dtype elements and `out` rows × n f32 (checked
            // above); the sync guards keep both in use on this stream for the call.
            unsafe { self.gemm_xwt(w, rows, xp, op, cublas_sys::cudaDataType::CUDA_R_32F) }?;
        }
        out.rows = rows;
        out.vocab = w.n;
        Ok(())
    }

    /// Rows `first_row ..` of `logits` into `dst` (whole rows).
    pub(super) fn download_logits_rows(
        &self,
        logits: &CudaLogits,
        first_row: usize,
        dst: &mut [f32],
    ) -> Result<(), BackendError> {
        let start = first_row * logits.vocab;
        if dst.is_empty() {
            return Ok(());
        }
        if !dst.len().is_multiple_of(logits.vocab) || start + dst.len() > logits.rows * logits.vocab
        {
            return Err(BackendError::InvalidArgument(format!(
                "logits rows {first_row}.. ({} values) of {} rows of {}",
                dst.len(),
                logits.rows,
                logits.vocab
            )));
        }
        let src = logits.data.slice(start..start + dst.len());
        self.stream.memcpy_dtoh(&src, dst).map_err(dev_err)?;
        self.stream.synchronize().map_err(dev_err)
    }

    /// Sample every `(row, descriptor)` on the device and wait for the answer; see the module
    /// header.
    pub(super) fn sample_rows(
        &self,
        logits: &CudaLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        let p = self.queue_sample(logits, rows)?;
        self.collect_sample(p)
    }

    /// Queue the sampling of every `(row, descriptor)` and the copy of its answer into a pinned
    /// ring slot, without waiting ([`CudaBackend::collect_sample`] reads it).
    pub(super) fn queue_sample(
        &self,
        logits: &CudaLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<CudaPendingSamples, BackendError> {
        if rows.is_empty() {
            return Ok(CudaPendingSamples {
                slot: None,
                ints: 0,
                layout: Layout::Ids,
                id_at: Vec::new(),
            });
        }
        if rows.iter().all(|(_, d)| is_plain_greedy(d)) {
            return self.argmax_rows(logits, rows);
        }
        let vocab = logits.vocab;
        let p = pack_rows(rows, logits.rows, vocab)?;
        // Sections of the one parameter upload, each 8-byte aligned.
        let ip_at = 0;
        let fp_at = align8(ip_at + 4 * p.iparams.len());
        let dr_at = align8(fp_at + 4 * p.fparams.len());
        let pen_at = align8(dr_at + 8 * p.draws.len());
        let total = align8(pen_at + 4 * p.pens.len().max(3));
        let out_ints = 2 * p.out_pairs;
        let mut guard = self.scratch();
        let arena = self.arena(&mut guard, total, out_ints, rows.len() * vocab)?;
        let host = arena.params.host_mut()?;
        host[ip_at..fp_at].fill(0);
        host[ip_at..ip_at + 4 * p.iparams.len()].copy_from_slice(bytemuck::cast_slice(&p.iparams));
        host[fp_at..fp_at + 4 * p.fparams.len()].copy_from_slice(bytemuck::cast_slice(&p.fparams));
        host[dr_at..dr_at + 8 * p.draws.len()].copy_from_slice(bytemuck::cast_slice(&p.draws));
        host[pen_at..total].fill(0);
        host[pen_at..pen_at + 4 * p.pens.len()].copy_from_slice(bytemuck::cast_slice(&p.pens));
        arena.params.upload(&self.stream, total)?;
        let base = arena.params.dev().device_ptr(&self.stream).0;
        let (ip, fp, dr, pens) = (
            base + ip_at as u64,
            base + fp_at as u64,
            base + dr_at as u64,
            base + pen_at as u64,
        );
        let v = vocab as i32;
        {
            let mut b = self.stream.launch_builder(&self.k.sample_rows);
            b.arg(&logits.data)
                .arg(&v)
                .arg(&ip)
                .arg(&fp)
                .arg(&dr)
                .arg(&pens)
                .arg(&mut arena.scratch)
                .arg(&mut arena.out_dev);
            let cfg = LaunchConfig {
                grid_dim: (rows.len() as u32, 1, 1),
                block_dim: (SAMPLE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: pack_rows checked every logits row index (< logits.rows) and laid out
            // 8 ints / 8 floats / 1 double per block, penalty ranges inside `pens`, and output
            // offsets whose pairs fit in `out_dev` (≥ 2 × out_pairs ints); the parameter sections
            // are 8-byte aligned inside the uploaded prefix; scratch holds ≥ rows × vocab f32.
            unsafe { b.launch(cfg) }.map_err(dev_err)?;
        }
        let id_at = p.offsets.iter().map(|&o| 2 * o as i32).collect();
        let slot = self.queue_download(&mut guard, out_ints)?;
        Ok(CudaPendingSamples {
            slot: Some(slot),
            ints: out_ints,
            layout: Layout::Pairs(p),
            id_at,
        })
    }

    /// Wait for a queued sampling call's answer (see [`CudaBackend::queue_sample`]).
    pub(super) fn collect_sample(
        &self,
        p: CudaPendingSamples,
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        let Some(slot) = p.slot else {
            return Ok(Vec::new());
        };
        let mut guard = self.scratch();
        let out = guard
            .outs
            .get_mut(slot)
            .ok_or_else(|| BackendError::Device(format!("sampling output slot {slot} is gone")))?;
        out.copied.synchronize().map_err(dev_err)?;
        let host = &out.host.as_slice().map_err(dev_err)?[..p.ints];
        Ok(match &p.layout {
            Layout::Pairs(packed) => unpack(host, packed),
            Layout::Ids => host
                .iter()
                .map(|&id| {
                    if id < 0 {
                        Err(SampleError::NoFiniteLogit)
                    } else {
                        Ok(Sampled {
                            token_id: id as u32,
                            logprob: None,
                            top: Vec::new(),
                        })
                    }
                })
                .collect(),
        })
    }

    /// Queue the copy of the first `ints` sampler outputs into the next pinned ring slot (two,
    /// used in turn: the answer of one step is read while the next one's is being written) and
    /// record its event. Returns the slot.
    fn queue_download(
        &self,
        guard: &mut std::sync::MutexGuard<'_, super::Scratch>,
        ints: usize,
    ) -> Result<usize, BackendError> {
        let scratch = &mut **guard;
        let slot = scratch.next_out;
        scratch.next_out = (slot + 1) % OUT_SLOTS;
        while scratch.outs.len() <= slot {
            scratch.outs.push(OutSlot::new(&self.stream, 1024)?);
        }
        // A slot is reused two submissions later: its previous answer was collected by then
        // (at most two pending), and its copy is waited for before its memory is touched.
        scratch.outs[slot].copied.synchronize().map_err(dev_err)?;
        if scratch.outs[slot].capacity < ints {
            scratch.outs[slot] =
                OutSlot::new(&self.stream, ints.max(2 * scratch.outs[slot].capacity))?;
        }
        let arena = scratch
            .sample
            .as_ref()
            .ok_or_else(|| BackendError::Device("the sampler has no arena".into()))?;
        let out = &mut scratch.outs[slot];
        let host = out.host.as_mut_slice().map_err(dev_err)?;
        let (src, _sync) = arena.out_dev.device_ptr(&self.stream);
        // SAFETY: `host` is pinned memory of ≥ ints ints owned by the ring slot, which is not
        // read or written again before its event (recorded right after this copy) completes
        // (`collect_sample`, and the synchronize above before a reuse or a regrowth); `src`
        // holds ≥ ints ints (the arena was sized for this call) on this stream.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut host[..ints],
                src,
                self.stream.cu_stream(),
            )
        }
        .map_err(dev_err)?;
        out.copied.record(&self.stream).map_err(dev_err)?;
        Ok(slot)
    }

    /// Overwrite token `t` of `step` with the id the pending call `from` sampled for its row
    /// `r`, for each `(t, r)` in `feeds`, on the device (see [`crate::backend::Backend::feed_tokens`]).
    pub(super) fn feed_step_tokens(
        &self,
        step: &mut super::step::CudaStep,
        from: &CudaPendingSamples,
        feeds: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        if feeds.is_empty() {
            return Ok(());
        }
        let n = feeds.len();
        let mut guard = self.scratch();
        let scratch = &mut *guard;
        if scratch.feed.as_ref().is_none_or(|f| f.capacity() < 2 * n) {
            scratch.feed = Some(Staging::new(&self.stream, (2 * n).max(256))?);
        }
        let staging = scratch.feed.as_mut().expect("made above");
        let host = staging.host_mut()?;
        for (i, &(t, r)) in feeds.iter().enumerate() {
            if t as usize >= step.num_tokens {
                return Err(BackendError::InvalidArgument(format!(
                    "fed token {t} of a step of {} tokens",
                    step.num_tokens
                )));
            }
            let at = *from.id_at.get(r as usize).ok_or_else(|| {
                BackendError::InvalidArgument(format!(
                    "feed from sampling row {r} of {}",
                    from.id_at.len()
                ))
            })?;
            host[2 * i] = t as i32;
            host[2 * i + 1] = at;
        }
        staging.upload(&self.stream, 2 * n)?;
        let arena = scratch
            .sample
            .as_ref()
            .ok_or_else(|| BackendError::Device("the sampler has no arena".into()))?;
        let count = n as i32;
        let mut ids = step.token_ids_mut();
        let mut b = self.stream.launch_builder(&self.k.feed_tokens);
        b.arg(&mut ids)
            .arg(&arena.out_dev)
            .arg(staging.dev())
            .arg(&count);
        // SAFETY: every pair names a token < step.num_tokens (checked) of the step's token ids
        // and an output index `id_at` of the sampling call that wrote `out_dev` (< its outputs,
        // which the arena holds); the kernel guards i < n.
        unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }.map_err(dev_err)?;
        Ok(())
    }

    /// The greedy fast path: `argmax_rows` over rows that [`is_plain_greedy`] accepted.
    fn argmax_rows(
        &self,
        logits: &CudaLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<CudaPendingSamples, BackendError> {
        if let Some(&(r, _)) = rows.iter().find(|(r, _)| *r >= logits.rows) {
            return Err(BackendError::InvalidArgument(format!(
                "sample row {r} of {} logits rows",
                logits.rows
            )));
        }
        let n = rows.len();
        let mut guard = self.scratch();
        let arena = self.arena(&mut guard, 4 * n, n, 0)?;
        let host = arena.params.host_mut()?;
        for (d, &(r, _)) in host.chunks_exact_mut(4).zip(rows) {
            d.copy_from_slice(&(r as i32).to_ne_bytes());
        }
        arena.params.upload(&self.stream, 4 * n)?;
        let idx = arena.params.dev().device_ptr(&self.stream).0;
        let v = logits.vocab as i32;
        {
            let mut b = self.stream.launch_builder(&self.k.argmax_rows);
            b.arg(&logits.data)
                .arg(&v)
                .arg(&idx)
                .arg(&mut arena.out_dev);
            let cfg = LaunchConfig {
                grid_dim: (n as u32, 1, 1),
                block_dim: (SAMPLE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the n row indices uploaded are < logits.rows (checked), each row holds vocab
            // f32; out_dev holds ≥ n ints.
            unsafe { b.launch(cfg) }.map_err(dev_err)?;
        }
        let slot = self.queue_download(&mut guard, n)?;
        Ok(CudaPendingSamples {
            slot: Some(slot),
            ints: n,
            layout: Layout::Ids,
            id_at: (0..n as i32).collect(),
        })
    }

    /// The sampler's arena, (re)made to hold `param_bytes` of parameters, `out_ints` outputs and
    /// `scratch` f32 of penalized rows.
    fn arena<'a>(
        &self,
        guard: &'a mut std::sync::MutexGuard<'_, super::Scratch>,
        param_bytes: usize,
        out_ints: usize,
        scratch: usize,
    ) -> Result<&'a mut SampleArena, BackendError> {
        let fits = guard
            .sample
            .as_ref()
            .is_some_and(|a| a.fits(param_bytes, out_ints, scratch));
        if !fits {
            let old = guard.sample.take();
            let at_least =
                |f: fn(&SampleArena) -> usize, want: usize| want.max(old.as_ref().map_or(0, f));
            let pb = at_least(|a| a.params.capacity(), param_bytes.max(4096));
            let oi = at_least(|a| a.out_dev.len(), out_ints.max(1024));
            let sc = at_least(|a| a.scratch.len(), scratch);
            drop(old);
            guard.sample = Some(SampleArena::new(&self.stream, pb, oi, sc)?);
        }
        Ok(guard.sample.as_mut().expect("made above"))
    }
}
