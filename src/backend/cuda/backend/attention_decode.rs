//! The decode launch of the CUDA backend's attention ([`CudaBackend::paged_attention_decode_with`]
//! and the decode rows of [`CudaBackend::paged_attention_gated`] end here): one launch of
//! `kernels/attention_decode.cu`'s kernel or of its tensor-core twin (`attention_mma.rs`), with the
//! merge of a row's parts in the same launch or in a second combine launch. The step's division
//! of tokens and keys is `attention_plan.rs`'s; the callers are in `attention.rs`.

use std::ffi::c_void;

use cudarc::driver::{
    CudaStream, CudaView, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg, SyncOnDrop,
};

use super::attention::OutputGate;
use super::attention_mma::{DECODE_MMA_MERGE_DIMS, DECODE_MMA_MERGE_THREADS};
use super::{dev_err, CudaBackend, CudaBuffer, CudaKvCache, CudaStep};
use crate::backend::cuda::attention_plan::{
    self, DecodeOptions, DecodeSplit, DecodeVariant, MmaLaunch,
};
use crate::backend::{AttentionParams, BackendError};

impl CudaBackend {
    /// The decode kernel (attention_decode.cu, or attention_decode_mma.cu's for the shapes
    /// [`CudaBackend::decode_mma`] takes, always with the two-pass plan) over `rows.0` block rows
    /// whose contexts are at most `rows.1` keys (or the step's pinned context, when larger). A row
    /// of more than `opts.single_part_keys` keys may be split into parts, merged in the same
    /// launch (`opts.merge_in_launch` where `decode_merge_in_launch` takes the shapes: the last
    /// block of each (row, KV head) to finish) or by the combine kernel in a second launch; with
    /// `opts.pdl` (and the backend's PDL on) the launch may overlap the previous kernel's tail.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_decode(
        &self,
        variant: DecodeVariant,
        q: &CudaBuffer,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
        index: Option<&CudaView<'_, i32>>,
        (n_rows, max_context): (usize, usize),
        gate: Option<OutputGate<'_>>,
        opts: DecodeOptions,
    ) -> Result<(), BackendError> {
        let spec = cache.spec;
        let (g_row, g_head) = gate.map(|g| g.strides()).transpose()?.unwrap_or((0, 0));
        // The tensor-core kernel (attention_mma.rs; its paired twin for few rows) where it takes
        // the shapes: split `opts.mma_split` (default `DecodeSplit::for_shape`, a constant of the
        // model) with the single-part bound, partials merged by its own combine in a second
        // launch, both with PDL when `opts.pdl`; `opts.mma_legacy`: the old split, no
        // single-part bound, no PDL, attention_decode.cu's combine.
        let (hd, group) = (params.head_dim, params.num_heads / params.num_kv_heads);
        let mma = self.decode_mma(hd, group, n_rows);
        let legacy = mma.is_some() && opts.mma_legacy;
        let (opts, split) = if legacy {
            (DecodeOptions::TWO_PASS, DecodeSplit::OLD)
        } else if let Some(m) = &mma {
            let split = opts.mma_split.unwrap_or_else(|| {
                DecodeSplit::for_shape(params.num_kv_heads, params.head_dim, m.kv_bytes)
            });
            (
                DecodeOptions {
                    merge_in_launch: false,
                    ..opts
                },
                split,
            )
        } else {
            (opts, DecodeSplit::OLD)
        };
        if !split.is_valid() {
            return Err(BackendError::InvalidArgument(format!(
                "decode split {split:?}: max_parts must be 1..={}",
                attention_plan::DECODE_MMA_MAX_SLOTS
            )));
        }
        // Sized for the pinned context in a graph (shapes fixed per bucket); the split of each
        // row's keys depends on its own context only, so the bits are those of an eager step.
        let bound = max_context.max(step.pinned_context).max(1);
        let single = opts.single_part_keys;
        // Partials only when some row can have two parts.
        let slots = split.slots(bound, single);
        let grid_z = if slots == 1 {
            1
        } else {
            attention_plan::DECODE_TARGET_BLOCKS
                .div_ceil((n_rows * params.num_kv_heads).max(1))
                .clamp(1, slots)
        };
        let mut guard = if slots > 1 {
            Some(step.partials(
                &self.stream,
                n_rows * params.num_heads * slots,
                params.head_dim,
            )?)
        } else {
            None
        };
        let partials = guard.as_mut().and_then(|g| g.as_mut());
        let in_launch = opts.merge_in_launch
            && attention_plan::decode_merge_in_launch(group, params.head_dim, slots);
        let mut counters_guard = if slots > 1 && in_launch {
            Some(step.decode_counters(&self.stream, n_rows * params.num_kv_heads)?)
        } else {
            None
        };
        let counters = counters_guard.as_mut().and_then(|g| g.as_mut());
        let null: u64 = 0;
        let tables = step.block_tables();
        let token_seq = step.token_seq();
        let positions = step.positions();
        let (nh, nkv, hd, bs, mb, ns, sk) = (
            params.num_heads as i32,
            params.num_kv_heads as i32,
            params.head_dim as i32,
            spec.block_size as i32,
            step.max_blocks as i32,
            slots as i32,
            i32::try_from(single).unwrap_or(i32::MAX),
        );
        let (min_part, max_parts) = (
            i32::try_from(split.min_part).unwrap_or(i32::MAX),
            split.max_parts as i32,
        );
        // The first tile before griddepcontrol.wait (attention_decode.cu's header), bounded by
        // each sequence's cached length read from the step's `seq_meta`: only when this launch
        // may overlap its predecessor, where it pays (null: no prefetch).
        let prefetch = opts.prefetch && opts.pdl && self.pdl;
        let seq_meta = step.seq_meta();
        let scale = params.scale;
        let st = &self.stream;
        let (q_p, _s0) = q.data.device_ptr(st);
        let (kc_p, _s1) = cache.k[layer].device_ptr(st);
        let (vc_p, _s2) = cache.v[layer].device_ptr(st);
        let (bt_p, _s3) = tables.device_ptr(st);
        let (seq_p, _s4) = token_seq.device_ptr(st);
        let (pos_p, _s5) = positions.device_ptr(st);
        let (ix_p, _s6) = ptr_or_null(index, st);
        let (pf_p, _s11) = ptr_or_null(prefetch.then_some(&seq_meta), st);
        let (out_p, _s7) = out.data.device_ptr_mut(st);
        let (pm, pl, pacc) = match partials {
            Some((pm, pl, pacc)) => (Some(pm), Some(pl), Some(pacc)),
            None => (None, None, None),
        };
        let (pm_p, _s8a) = ptr_mut_or_null(pm, st);
        let (pl_p, _s8b) = ptr_mut_or_null(pl, st);
        let (pacc_p, _s8c) = ptr_mut_or_null(pacc, st);
        let (cnt_p, _s9) = ptr_mut_or_null(counters, st);
        let (gate_p, _s10) = ptr_or_null(gate.as_ref().map(|g| &g.buf.data), st);
        let ptr = |v: &u64| v as *const u64 as *mut c_void;
        let int = |v: &i32| v as *const i32 as *mut c_void;
        let mut args = [
            ptr(&q_p),
            ptr(&kc_p),
            ptr(&vc_p),
            ptr(&bt_p),
            ptr(&seq_p),
            ptr(&pos_p),
            ptr(&ix_p),
            ptr(&out_p),
            ptr(&pm_p),
            ptr(&pl_p),
            ptr(&pacc_p),
            ptr(&cnt_p),
            int(&nh),
            int(&nkv),
            int(&hd),
            int(&bs),
            int(&mb),
            int(&ns),
            int(&sk),
            ptr(&pf_p),
            &scale as *const f32 as *mut c_void,
            ptr(&gate_p),
            int(&g_row),
            int(&g_head),
        ];
        if let Some(m) = &mma {
            let mut args = [
                ptr(&q_p),
                ptr(&kc_p),
                ptr(&vc_p),
                ptr(&bt_p),
                ptr(&seq_p),
                ptr(&pos_p),
                ptr(&ix_p),
                ptr(&out_p),
                ptr(&pm_p),
                ptr(&pl_p),
                ptr(&pacc_p),
                int(&nh),
                int(&nkv),
                int(&hd),
                int(&bs),
                int(&mb),
                int(&ns),
                int(&sk),
                int(&min_part),
                int(&max_parts),
                ptr(&pf_p),
                &scale as *const f32 as *mut c_void,
                ptr(&gate_p),
                int(&g_row),
                int(&g_head),
            ];
            let cfg = LaunchConfig {
                grid_dim: (params.num_kv_heads as u32, n_rows as u32, grid_z as u32),
                block_dim: (m.threads, 1, 1),
                shared_mem_bytes: m.smem,
            };
            if opts.mma_only != Some(MmaLaunch::Combine) {
                // SAFETY: the arguments match attention_decode_mma_*'s parameter list in number,
                // order and types and outlive the call (the guards above); the same table, position,
                // index, partial and gate bounds as the kernel below, with `split` (valid: checked
                // above) and `single` giving the part counts and `slots` bounding them (the combine
                // below merges them); the tensor-core kernel needs head_dim equal to its width and
                // the group ≤ 8 (decode_mma) and `smem` bytes of dynamic shared memory, its limit
                // raised when it was resolved. Before
                // griddepcontrol.wait it reads step metadata and, with `pf_p` (the step's seq_meta,
                // [num_seqs, 4]), K/V of positions below each row's sequence's cached length
                // (earlier steps' writes), and writes only its own shared memory, so it may be
                // launched with PDL.
                unsafe { self.launch_kernel(m.func, cfg, &mut args, opts.pdl && self.pdl) }?;
            }
        } else {
            let cfg = LaunchConfig {
                grid_dim: (params.num_kv_heads as u32, n_rows as u32, grid_z as u32),
                block_dim: (attention_plan::DECODE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match attention_decode_*'s parameter list in number, order and
            // types and outlive the call (the sync guards keep every buffer in use on this stream);
            // block tables are [n_seqs, max_blocks] with ids checked against num_blocks; every row's
            // position is < its sequence's context, covered by its table; `index` holds n_rows token
            // indices < num_tokens (or is null: rows are the tokens); head_dim is a multiple of 8 ≤
            // the variant's width and the group ≤ its group bound (for_shape), so the 8-element loads
            // are aligned and in the row; partials hold n_rows × num_heads × slots (× head_dim)
            // floats and slots ≥ every row's part count (decode_slots of the bound, and 1 only when
            // every row is at most single_part_keys keys: one part), null and unread otherwise; the
            // counters (or null) hold n_rows × num_kv_heads zeros, which the kernel leaves zero; the
            // gate (or null) holds every (token, head, dim) of the rows at its strides
            // (paged_attention_gated). Before griddepcontrol.wait the kernel reads step metadata and,
            // with `pf_p` (the step's seq_meta), the K/V of positions below each row's sequence's
            // cached length (earlier steps' writes), and writes only its own shared memory, so
            // it may be launched with PDL.
            unsafe {
                self.launch_kernel(self.k.decode(variant), cfg, &mut args, opts.pdl && self.pdl)
            }?;
        }
        if slots > 1 && !legacy {
            if let Some(m) = &mma {
                let mut args = [
                    ptr(&pm_p),
                    ptr(&pl_p),
                    ptr(&pacc_p),
                    ptr(&pos_p),
                    ptr(&ix_p),
                    ptr(&out_p),
                    int(&nh),
                    int(&hd),
                    int(&ns),
                    int(&sk),
                    int(&min_part),
                    int(&max_parts),
                    ptr(&gate_p),
                    int(&g_row),
                    int(&g_head),
                ];
                let cfg = LaunchConfig {
                    grid_dim: (
                        params.num_heads as u32,
                        n_rows as u32,
                        (params.head_dim / DECODE_MMA_MERGE_DIMS) as u32,
                    ),
                    block_dim: (DECODE_MMA_MERGE_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                if opts.mma_only != Some(MmaLaunch::Main) {
                    // SAFETY: the arguments match attention_decode_mma_combine_*'s parameter list
                    // and outlive the call; it reads the partials of the rows with more than one part
                    // (the same split and single-part bound as the launch above, so the same part
                    // counts, each ≤ slots ≤ DMMA_MAX_SLOTS) and writes `out` rows of head_dim (a
                    // multiple of 64: the tensor-core widths) at the same token indices, the gate as
                    // above. It waits (griddepcontrol.wait) before reading anything the kernel above
                    // writes, so it may be launched with PDL.
                    unsafe { self.launch_kernel(m.combine, cfg, &mut args, opts.pdl && self.pdl) }?;
                }
                return Ok(());
            }
        }
        if slots > 1 && !in_launch {
            let mut b = self.stream.launch_builder(&self.k.attention_decode_combine);
            b.arg(&pm_p).arg(&pl_p).arg(&pacc_p).arg(&positions);
            match index {
                Some(ix) => b.arg(ix),
                None => b.arg(&null),
            };
            b.arg(&out_p).arg(&nh).arg(&hd).arg(&ns).arg(&sk);
            b.arg(&gate_p).arg(&g_row).arg(&g_head);
            let cfg = LaunchConfig {
                grid_dim: (params.num_heads as u32, n_rows as u32, 1),
                block_dim: (attention_plan::DECODE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: reads the partials of the rows with more than one part, written above
            // (rows with one part return at once), at the pointers the first launch was given
            // (the guards above keep them); writes `out` rows of head_dim at the same token
            // indices; the same single_keys as the first launch, so the same part counts.
            unsafe { b.launch(cfg) }.map_err(dev_err)?;
        }
        Ok(())
    }
}

/// `x`'s device pointer for reading with its sync guard, or a null pointer (and no guard) when
/// there is no `x`: the optional buffers of the decode launch.
fn ptr_or_null<'a, T, P: DevicePtr<T>>(
    x: Option<&'a P>,
    st: &'a CudaStream,
) -> (u64, Option<SyncOnDrop<'a>>) {
    x.map_or((0, None), |x| {
        let (p, s) = x.device_ptr(st);
        (p, Some(s))
    })
}

/// [`ptr_or_null`] for a buffer the launch writes.
fn ptr_mut_or_null<'a, T, P: DevicePtrMut<T>>(
    x: Option<&'a mut P>,
    st: &'a CudaStream,
) -> (u64, Option<SyncOnDrop<'a>>) {
    x.map_or((0, None), |x| {
        let (p, s) = x.device_ptr_mut(st);
        (p, Some(s))
    })
}
