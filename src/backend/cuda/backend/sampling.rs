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
/// i32 / f32 parameters per row (`iparams` / `fparams` strides in sampling.cu).
const PARAMS_PER_ROW: usize = 8;

/// f32 logits rows `[rows, vocab]` on the device (in a buffer that may hold more rows: a
/// runner keeps one and refills it with [`crate::backend::Backend::logits_into`]).
#[derive(Debug)]
pub struct CudaLogits {
    data: CudaSlice<f32>,
    rows: usize,
    vocab: usize,
}

/// Whether `d` is answered by the argmax alone: greedy, no logprobs, and every penalty neutral
/// (repetition 1, presence 0, frequency 0 leave each logit bit for bit as it is).
pub(crate) fn is_plain_greedy(d: &SamplingRow) -> bool {
    d.inv_temperature().is_none()
        && d.logprobs.is_none()
        && (d.penalties.is_empty()
            || (d.repetition_penalty == 1.0
                && d.presence_penalty == 0.0
                && d.frequency_penalty == 0.0))
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

/// `v` rounded up to a multiple of 8.
fn align8(v: usize) -> usize {
    v.div_ceil(8) * 8
}

/// Descriptors laid out as `sample_rows` reads them (see the header of sampling.cu).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PackedRows {
    /// `[rows, 8]`: logits row, top_k, greedy, penalty start, penalty end, logprobs N (-1 off),
    /// output offset in pairs, unused.
    pub(crate) iparams: Vec<i32>,
    /// `[rows, 8]`: 1/temperature, top_p, min_p, repetition, presence, frequency, unused ×2.
    pub(crate) fparams: Vec<f32>,
    /// `[rows]`: the uniforms (0 when greedy).
    pub(crate) draws: Vec<f64>,
    /// `[entries, 3]`: token, repeated, count.
    pub(crate) pens: Vec<i32>,
    /// Pairs of output per row start at `offsets[r]`; `logprobs[r]` is its N, when requested.
    pub(crate) offsets: Vec<usize>,
    pub(crate) logprobs: Vec<Option<usize>>,
    /// Total output pairs.
    pub(crate) out_pairs: usize,
}

/// Lay out `rows` (logits row, descriptor) for logits of `n_rows` rows of `vocab` tokens.
pub(crate) fn pack_rows(
    rows: &[(usize, &SamplingRow)],
    n_rows: usize,
    vocab: usize,
) -> Result<PackedRows, BackendError> {
    let bad = |m: String| Err(BackendError::InvalidArgument(m));
    if vocab == 0 || vocab > i32::MAX as usize {
        return bad(format!("sampling over a vocabulary of {vocab}"));
    }
    let mut p = PackedRows {
        iparams: Vec::with_capacity(rows.len() * PARAMS_PER_ROW),
        fparams: Vec::with_capacity(rows.len() * PARAMS_PER_ROW),
        draws: Vec::with_capacity(rows.len()),
        pens: Vec::new(),
        offsets: Vec::with_capacity(rows.len()),
        logprobs: Vec::with_capacity(rows.len()),
        out_pairs: 0,
    };
    for &(row, d) in rows {
        if row >= n_rows {
            return bad(format!("sample row {row} of {n_rows} logits rows"));
        }
        if d.penalties.windows(2).any(|w| w[0].token >= w[1].token) {
            return bad("penalty entries must be distinct and in ascending token order".into());
        }
        let pen_start = p.pens.len() / 3;
        for e in &d.penalties {
            // Ids past i32 are outside any vocabulary: the kernel skips negative ids too.
            p.pens.push(i32::try_from(e.token).unwrap_or(-1));
            p.pens.push(e.repeated as i32);
            p.pens.push(e.count.min(i32::MAX as u32) as i32);
        }
        let inv_t = d.inv_temperature();
        let top_k = if d.top_k > 0 && (d.top_k as usize) < vocab {
            d.top_k as i32
        } else {
            0
        };
        let n_logprobs = d.logprobs.map(|n| (n as usize).min(vocab));
        p.offsets.push(p.out_pairs);
        p.iparams.extend_from_slice(&[
            row as i32,
            top_k,
            inv_t.is_none() as i32,
            pen_start as i32,
            (p.pens.len() / 3) as i32,
            n_logprobs.map_or(-1, |n| n as i32),
            p.out_pairs as i32,
            0,
        ]);
        p.fparams.extend_from_slice(&[
            inv_t.unwrap_or(0.0),
            d.top_p,
            d.min_p,
            d.repetition_penalty,
            d.presence_penalty,
            d.frequency_penalty,
            0.0,
            0.0,
        ]);
        p.draws.push(if inv_t.is_some() {
            d.draw.unwrap_or(0.0)
        } else {
            0.0
        });
        p.out_pairs += 1 + n_logprobs.unwrap_or(0);
        p.logprobs.push(n_logprobs);
    }
    if p.out_pairs > i32::MAX as usize || p.pens.len() / 3 > i32::MAX as usize {
        return bad(format!("{} output pairs in one sampling call", p.out_pairs));
    }
    Ok(p)
}

/// The kernel's `(id, logprob bits)` pairs back to one result per row.
pub(crate) fn unpack(out: &[i32], p: &PackedRows) -> Vec<Result<Sampled, SampleError>> {
    let pair = |k: usize| (out[2 * k], f32::from_bits(out[2 * k + 1] as u32));
    p.offsets
        .iter()
        .zip(&p.logprobs)
        .map(|(&at, &n)| {
            let (id, lp) = pair(at);
            if id < 0 {
                return Err(SampleError::NoFiniteLogit);
            }
            Ok(Sampled {
                token_id: id as u32,
                logprob: n.map(|_| lp),
                top: (0..n.unwrap_or(0))
                    .map(|j| {
                        let (t, l) = pair(at + 1 + j);
                        (t as u32, l)
                    })
                    .collect(),
            })
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Penalty;

    #[test]
    fn only_plain_greedy_rows_take_the_argmax_fast_path() {
        let pen = Penalty {
            token: 3,
            repeated: true,
            count: 1,
        };
        assert!(is_plain_greedy(&SamplingRow::greedy()));
        // Penalties that leave every logit as it is keep the fast path.
        let neutral = SamplingRow {
            penalties: vec![pen],
            ..SamplingRow::greedy()
        };
        assert!(is_plain_greedy(&neutral));
        for row in [
            SamplingRow {
                logprobs: Some(0),
                ..SamplingRow::greedy()
            },
            SamplingRow {
                temperature: 0.7,
                draw: Some(0.5),
                ..SamplingRow::greedy()
            },
            SamplingRow {
                repetition_penalty: 1.2,
                ..neutral.clone()
            },
            SamplingRow {
                presence_penalty: 0.5,
                ..neutral.clone()
            },
            SamplingRow {
                frequency_penalty: 0.5,
                ..neutral.clone()
            },
        ] {
            assert!(!is_plain_greedy(&row), "{row:?}");
        }
        // A temperature without a draw is greedy (sample_row's rule), so it takes the fast path.
        assert!(is_plain_greedy(&SamplingRow {
            temperature: 0.7,
            ..SamplingRow::greedy()
        }));
    }

    #[test]
    fn packing_lays_out_params_penalties_and_output_pairs() {
        let a = SamplingRow {
            temperature: 0.5,
            top_k: 100,
            top_p: 0.9,
            logprobs: Some(3),
            repetition_penalty: 1.2,
            penalties: vec![
                Penalty {
                    token: 4,
                    repeated: true,
                    count: 0,
                },
                Penalty {
                    token: 9,
                    repeated: false,
                    count: 2,
                },
            ],
            draw: Some(0.25),
            ..SamplingRow::greedy()
        };
        let g = SamplingRow {
            logprobs: Some(0),
            draw: Some(0.7), // temperature 0: greedy, the draw is dropped
            ..SamplingRow::greedy()
        };
        let p = pack_rows(&[(2, &a), (0, &g), (1, &SamplingRow::greedy())], 3, 50).unwrap();
        assert_eq!(&p.iparams[..8], &[2, 0, 0, 0, 2, 3, 0, 0]); // top_k 100 ≥ vocab: off
        assert_eq!(&p.iparams[8..16], &[0, 0, 1, 2, 2, 0, 4, 0]);
        assert_eq!(&p.iparams[16..], &[1, 0, 1, 2, 2, -1, 5, 0]);
        assert_eq!(p.fparams[0], 2.0);
        assert_eq!(p.fparams[1], 0.9);
        assert_eq!(p.fparams[3], 1.2);
        assert_eq!(p.draws, vec![0.25, 0.0, 0.0]);
        assert_eq!(p.pens, vec![4, 1, 0, 9, 0, 2]);
        assert_eq!(p.out_pairs, 6);
        // Kernel output: row 0 token 7 with 3 alternatives, row 1 token 1, row 2 failed.
        let lp = |x: f32| x.to_bits() as i32;
        let out = [
            7,
            lp(-0.5),
            7,
            lp(-0.5),
            3,
            lp(-1.0),
            8,
            lp(-2.0),
            1,
            lp(-0.1),
            -1,
            0,
        ];
        let r = unpack(&out, &p);
        assert_eq!(
            r[0],
            Ok(Sampled {
                token_id: 7,
                logprob: Some(-0.5),
                top: vec![(7, -0.5), (3, -1.0), (8, -2.0)],
            })
        );
        assert_eq!(
            r[1],
            Ok(Sampled {
                token_id: 1,
                logprob: Some(-0.1),
                top: vec![],
            })
        );
        assert_eq!(r[2], Err(SampleError::NoFiniteLogit));
        assert!(pack_rows(&[(3, &a)], 3, 50).is_err());
        let unsorted = SamplingRow {
            penalties: vec![a.penalties[1], a.penalties[0]],
            ..a.clone()
        };
        assert!(pack_rows(&[(0, &unsorted)], 3, 50).is_err());
    }
}
