//! [`HybridBackend`] on CUDA: the state slots ([`CudaStateCache`], f32 on the device) and the
//! launches of `kernels/gdn.cu` (causal conv + its state, the fused delta-rule scan, the gated
//! RMSNorm, the gated attention's query/gate split and sigmoid gate).
//!
//! Every op reads the step's per-sequence metadata from the [`CudaStep`] (`seq_meta`: token
//! start, length, cached length, state slot; `token_seq`), allocates nothing and never waits
//! for the device, so a decode step can be captured in a CUDA graph. Argument checks use the
//! host copy the step keeps of each sequence's `(len, slot)`.
//!
//! The delta rule: sequences with at least [`CudaStateCache::chunked_min_len`] new tokens take
//! the chunked form (C = 64, tensor cores; `gdn_chunk.rs`, 16-bit compute dtypes),
//! the others (decode tokens, short prefills, and everything at f32) a sequential scan over the
//! sequence's new tokens with the state in registers (`gdn.cu`). Both are the CPU's math up to
//! float rounding.
//!
//! The `gdn.cu` kernels all wait (`griddepcontrol.wait`) before touching memory, so their
//! launches carry the programmatic-dependent-launch attribute where the backend has PDL
//! (`CudaBackend::pdl`, sm_90+, `KILN_PDL`): a kernel's launch overlaps the previous one's tail.

use std::collections::HashSet;

mod conv_scan;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::gdn_chunk::{self, ChunkKernels, ChunkWorkspace, DEFAULT_CHUNKED_MIN_LEN};
use super::launch::KernelArgs;
use super::{check_len, dev_err, CudaBackend, CudaBuffer, CudaKvCache, CudaRope, CudaStep};
use crate::backend::cuda::device::CudaError;
use crate::backend::hybrid::{GatedQkv, GatedQkvOut, GdnParams, HybridBackend, StateSpec};
use crate::backend::{AttentionParams, BackendError};

/// The op stems of `gdn.cu`; each exists as `{op}_{f32,f16,bf16}`.
pub const GDN_OPS: [&str; 10] = [
    "gdn_conv1d",
    "gdn_conv1d_vec",
    "gdn_conv_state",
    "gdn_scan",
    "gdn_scan_v4",
    "gated_rms_norm",
    "gated_rms_norm_vec",
    "split_query_gate",
    "sigmoid_mul",
    "rms_norm_1p",
];

/// Threads per block of `gdn_scan` (`GDN_THREADS`).
const SCAN_THREADS: usize = 128;
/// Lanes sharing one value column in `gdn_scan` (8: key head dims that are multiples of 8; a
/// warp per column measured slower at decode batch 1 and 64, docs/benchmarks.md).
const SCAN_LANES: usize = 8;
/// Largest key head the scan keeps in registers (`GDN_MAX_DK`).
const SCAN_MAX_DK: usize = 128;
/// Largest conv kernel (`GDN_MAX_KERNEL`).
const MAX_CONV_KERNEL: usize = 8;
/// Threads per block of the conv kernels.
const CONV_THREADS: usize = 128;
/// Largest grid y (tokens per conv launch).
const MAX_GRID_Y: usize = 65535;
/// The conv kernel of `gdn_conv1d_vec` (`GDN_VEC_KERNEL`, Qwen3.5's).
const VEC_CONV_KERNEL: usize = 4;
/// Tokens per thread of `gdn_conv1d_vec` (each thread loads `kernel − 1` rows more than it
/// uses, 3 / 16 extra reads, of rows the neighbouring run reads too: L2 hits).
const VEC_CONV_RUN: usize = 16;
/// Steps of at least this many tokens take `gdn_conv1d_vec` (measured 3.0–3.2× faster at 8K and
/// 32K tokens, docs/benchmarks.md); smaller ones the one-thread-per-channel `gdn_conv1d`, which
/// measured 0.25–0.8 µs faster at decode batch 1 and 64 than the 8-channel kernel with one
/// token per thread.
const VEC_CONV_MIN_TOKENS: usize = 2048;
/// Threads per block of `gated_rms_norm_vec`.
const NORM_VEC_THREADS: usize = 128;

/// The `gdn.cu` entry points for one compute dtype.
#[derive(Debug, Clone)]
pub(crate) struct GdnKernels {
    conv1d: CudaFunction,
    /// `conv_dim` a multiple of 8, a kernel of [`VEC_CONV_KERNEL`], steps of at least
    /// [`VEC_CONV_MIN_TOKENS`] tokens: 128-bit loads.
    conv1d_vec: CudaFunction,
    conv_state: CudaFunction,
    scan: CudaFunction,
    /// `dk` a multiple of 32: the state and q^ / k^ through 128-bit accesses.
    scan_v4: CudaFunction,
    /// The chunked prefill (16-bit compute dtypes only).
    pub(super) chunk: Option<ChunkKernels>,
    gated_rms_norm: CudaFunction,
    /// `dim` a multiple of 8: a few lanes per row, 128-bit accesses.
    gated_rms_norm_vec: CudaFunction,
    split_query_gate: CudaFunction,
    sigmoid_mul: CudaFunction,
    /// The `(1 + w)` RMSNorm: all in the compute dtype, and (16-bit dtypes) with an f32
    /// residual / an f32 input.
    pub(super) rms_norm_1p: CudaFunction,
    pub(super) rms_norm_1p_rf32: Option<CudaFunction>,
    pub(super) rms_norm_1p_xf32: Option<CudaFunction>,
}

impl GdnKernels {
    /// Resolve the entry points for dtype suffix `t` through `get` (name → function).
    pub(crate) fn resolve(
        get: &impl Fn(String) -> Result<CudaFunction, CudaError>,
        t: &str,
    ) -> Result<GdnKernels, CudaError> {
        let f = |op: &str| get(format!("{op}_{t}"));
        Ok(GdnKernels {
            conv1d: f("gdn_conv1d")?,
            conv1d_vec: f("gdn_conv1d_vec")?,
            conv_state: f("gdn_conv_state")?,
            scan: f("gdn_scan")?,
            scan_v4: f("gdn_scan_v4")?,
            chunk: ChunkKernels::resolve(get, t)?,
            gated_rms_norm: f("gated_rms_norm")?,
            gated_rms_norm_vec: f("gated_rms_norm_vec")?,
            split_query_gate: f("split_query_gate")?,
            sigmoid_mul: f("sigmoid_mul")?,
            rms_norm_1p: f("rms_norm_1p")?,
            rms_norm_1p_rf32: (t != "f32")
                .then(|| get(format!("rms_norm_1p_{t}_rf32")))
                .transpose()?,
            rms_norm_1p_xf32: (t != "f32")
                .then(|| get(format!("rms_norm_1p_{t}_xf32")))
                .transpose()?,
        })
    }
}

/// The state slots of every GDN layer on the device, f32: conv `[slots, layers, kernel − 1,
/// conv_dim]` (oldest row first) and recurrent `[slots, layers, value_heads, dv, dk]` (each
/// value column's `dk` entries contiguous: transposed against the CPU's `[.., dk, dv]`).
#[derive(Debug)]
pub struct CudaStateCache {
    spec: StateSpec,
    conv: CudaSlice<f32>,
    rec: CudaSlice<f32>,
    /// New tokens from which a sequence takes the chunked delta rule; `None`: always the scan.
    chunked_min_len: Option<usize>,
    chunk_ws: ChunkWorkspace,
}

impl CudaStateCache {
    /// The geometry.
    pub fn spec(&self) -> &StateSpec {
        &self.spec
    }

    /// New tokens from which a sequence takes the chunked delta rule (16-bit compute dtypes and
    /// head shapes it takes); `None`: the sequential scan for every sequence.
    pub fn chunked_min_len(&self) -> Option<usize> {
        self.chunked_min_len
    }

    /// Choose the delta-rule path (tests and benches compare the two; the default is
    /// `Some(DEFAULT_CHUNKED_MIN_LEN)`). `Some(0)` is taken as `Some(1)`.
    pub fn set_chunked_min_len(&mut self, min_len: Option<usize>) {
        self.chunked_min_len = min_len.map(|n| n.max(1));
    }
}

/// `Err(InvalidArgument)` unless every sequence of `step` with tokens names a distinct slot of
/// `spec`, or has no slot and no cached tokens (a decode graph's padding row: the kernels give
/// it a zero state and write none; the model checks that its real sequences have slots).
fn check_slots(step: &CudaStep, spec: &StateSpec) -> Result<(), BackendError> {
    let mut seen = HashSet::new();
    for (i, s) in step.seq_slots.iter().enumerate() {
        if s.len == 0 {
            continue;
        }
        let Some(slot) = s.slot else {
            if s.cached_len == 0 {
                continue;
            }
            return Err(BackendError::InvalidArgument(format!(
                "sequence {i} of a hybrid-model step has {} cached tokens and no state slot",
                s.cached_len
            )));
        };
        check_slot(spec, slot)?;
        if !seen.insert(slot) {
            return Err(BackendError::InvalidArgument(format!(
                "state slot {slot} is used by two sequences of one step"
            )));
        }
    }
    Ok(())
}

fn check_slot(spec: &StateSpec, slot: u32) -> Result<(), BackendError> {
    if slot as usize >= spec.num_slots {
        return Err(BackendError::InvalidArgument(format!(
            "state slot {slot} of {}",
            spec.num_slots
        )));
    }
    Ok(())
}

fn check_layer(spec: &StateSpec, layer: usize) -> Result<(), BackendError> {
    if layer >= spec.num_layers {
        return Err(BackendError::InvalidArgument(format!(
            "GDN layer {layer} of {}",
            spec.num_layers
        )));
    }
    Ok(())
}

fn elementwise(len: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (len.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// Slot `slot`'s conv state `[kernel − 1, conv_dim]` and recurrent state `[value_heads, dk,
    /// dv]` (the CPU's layout) of GDN layer `layer`, on the host (tests; synchronizes).
    pub fn download_state(
        &self,
        cache: &CudaStateCache,
        slot: u32,
        layer: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), BackendError> {
        let spec = cache.spec;
        check_slot(&spec, slot)?;
        check_layer(&spec, layer)?;
        let at = slot as usize * spec.num_layers + layer;
        let (cn, rn) = (spec.conv_elems(), spec.recurrent_elems());
        let mut conv = vec![0.0f32; cn];
        self.stream
            .memcpy_dtoh(&cache.conv.slice(at * cn..(at + 1) * cn), &mut conv)
            .map_err(dev_err)?;
        let mut t = vec![0.0f32; rn];
        self.stream
            .memcpy_dtoh(&cache.rec.slice(at * rn..(at + 1) * rn), &mut t)
            .map_err(dev_err)?;
        let (nv, dk, dv) = (spec.num_value_heads, spec.key_head_dim, spec.value_head_dim);
        let mut rec = vec![0.0f32; rn];
        for h in 0..nv {
            for j in 0..dv {
                for i in 0..dk {
                    rec[(h * dk + i) * dv + j] = t[(h * dv + j) * dk + i];
                }
            }
        }
        Ok((conv, rec))
    }

    /// `(slot elements of conv, of recurrent)`: one slot's share of each buffer.
    fn slot_elems(spec: &StateSpec) -> (usize, usize) {
        (
            spec.num_layers * spec.conv_elems(),
            spec.num_layers * spec.recurrent_elems(),
        )
    }
}

/// Copy `n` elements at `src` to `dst` within one device buffer (ranges do not overlap).
fn copy_within(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    buf: &mut CudaSlice<f32>,
    src: usize,
    dst: usize,
    n: usize,
) -> Result<(), BackendError> {
    if src < dst {
        let (lo, mut hi) = buf.split_at_mut(dst);
        let from = lo.slice(src..src + n);
        let mut to = hi.slice_mut(0..n);
        stream.memcpy_dtod(&from, &mut to).map_err(dev_err)
    } else {
        let (mut lo, hi) = buf.split_at_mut(src);
        let from = hi.slice(0..n);
        let mut to = lo.slice_mut(dst..dst + n);
        stream.memcpy_dtod(&from, &mut to).map_err(dev_err)
    }
}

impl HybridBackend for CudaBackend {
    type StateCache = CudaStateCache;

    fn create_state_cache(&self, spec: &StateSpec) -> Result<CudaStateCache, BackendError> {
        if spec.conv_kernel < 2 || spec.conv_kernel > MAX_CONV_KERNEL {
            return Err(BackendError::Unsupported(format!(
                "conv kernel {} (the CUDA kernels take 2..={MAX_CONV_KERNEL} taps)",
                spec.conv_kernel
            )));
        }
        let (cn, rn) = CudaBackend::slot_elems(spec);
        Ok(CudaStateCache {
            spec: *spec,
            conv: self
                .stream
                .alloc_zeros::<f32>((spec.num_slots * cn).max(1))
                .map_err(dev_err)?,
            rec: self
                .stream
                .alloc_zeros::<f32>((spec.num_slots * rn).max(1))
                .map_err(dev_err)?,
            chunked_min_len: Some(DEFAULT_CHUNKED_MIN_LEN),
            chunk_ws: ChunkWorkspace::default(),
        })
    }

    fn prefill_workspace_bytes(&self, p: &GdnParams, max_tokens: usize, max_seqs: usize) -> usize {
        if !self.has_chunked_prefill(p) || max_tokens == 0 {
            return 0;
        }
        p.chunk_workspace(max_tokens, max_seqs.max(1)).bytes()
    }

    fn reserve_prefill_workspace(
        &self,
        cache: &mut CudaStateCache,
        p: &GdnParams,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<(), BackendError> {
        let bytes = self.reserve_chunk_workspace(&mut cache.chunk_ws, p, max_tokens, max_seqs)?;
        tracing::info!(
            max_num_batched_tokens = max_tokens,
            max_num_seqs = max_seqs,
            workspace_mib = bytes as f64 / (1 << 20) as f64,
            "GDN chunked-prefill workspace reserved."
        );
        Ok(())
    }

    fn reset_state_slot(&self, cache: &mut CudaStateCache, slot: u32) -> Result<(), BackendError> {
        check_slot(&cache.spec, slot)?;
        let (cn, rn) = CudaBackend::slot_elems(&cache.spec);
        let s = slot as usize;
        let mut c = cache.conv.slice_mut(s * cn..(s + 1) * cn);
        self.stream.memset_zeros(&mut c).map_err(dev_err)?;
        let mut r = cache.rec.slice_mut(s * rn..(s + 1) * rn);
        self.stream.memset_zeros(&mut r).map_err(dev_err)
    }

    fn copy_state_slot(
        &self,
        cache: &mut CudaStateCache,
        src: u32,
        dst: u32,
    ) -> Result<(), BackendError> {
        check_slot(&cache.spec, src)?;
        check_slot(&cache.spec, dst)?;
        if src == dst {
            return Ok(());
        }
        let (cn, rn) = CudaBackend::slot_elems(&cache.spec);
        let (s, d) = (src as usize, dst as usize);
        copy_within(&self.stream, &mut cache.conv, s * cn, d * cn, cn)?;
        copy_within(&self.stream, &mut cache.rec, s * rn, d * rn, rn)
    }

    fn gated_qkv_rope_write(
        &self,
        x: &GatedQkv<'_, CudaBackend>,
        rope: &CudaRope,
        cache: &mut CudaKvCache,
        layer: usize,
        step: &CudaStep,
        out: GatedQkvOut<'_, CudaBackend>,
    ) -> Result<(), BackendError> {
        self.gated_qkv_fused(x, rope, cache, layer, step, out)
    }

    fn gated_paged_attention(
        &self,
        q: &CudaBuffer,
        gate: &CudaBuffer,
        tokens: usize,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        if tokens != step.num_tokens {
            return Err(BackendError::InvalidArgument(format!(
                "gated_paged_attention: {tokens} tokens in a step of {}",
                step.num_tokens
            )));
        }
        let gate = super::OutputGate::contiguous(gate, params);
        self.paged_attention_gated(q, gate, cache, layer, step, params, out)
    }

    fn split_query_gate(
        &self,
        qg: &CudaBuffer,
        q: &mut CudaBuffer,
        gate: &mut CudaBuffer,
        tokens: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "split_query_gate");
        let n = tokens * heads * head_dim;
        check_len("split_query_gate input", qg.len, 2 * n)?;
        check_len("split_query_gate q", q.len, n)?;
        check_len("split_query_gate gate", gate.len, n)?;
        for (what, b) in [("input", qg), ("q", &*q), ("gate", &*gate)] {
            self.expect_compute(&format!("split_query_gate {what}"), b)?;
        }
        if n == 0 {
            return Ok(());
        }
        let (nl, hd) = (n as i64, head_dim as i32);
        let mut b = self.stream.launch_builder(&self.k.gdn.split_query_gate);
        b.arg(&qg.data)
            .arg(&mut q.data)
            .arg(&mut gate.data)
            .arg(&nl)
            .arg(&hd);
        // SAFETY: qg holds 2n elements, q and gate n (checked, all compute dtype); the kernel
        // guards i < n.
        unsafe { b.launch(elementwise(n)) }.map_err(dev_err)?;
        Ok(())
    }

    fn sigmoid_mul(
        &self,
        x: &mut CudaBuffer,
        gate: &CudaBuffer,
        len: usize,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "sigmoid_mul");
        check_len("sigmoid_mul x", x.len, len)?;
        check_len("sigmoid_mul gate", gate.len, len)?;
        self.expect_compute("sigmoid_mul x", x)?;
        self.expect_compute("sigmoid_mul gate", gate)?;
        if len == 0 {
            return Ok(());
        }
        let n = len as i64;
        let mut b = self.stream.launch_builder(&self.k.gdn.sigmoid_mul);
        b.arg(&mut x.data).arg(&gate.data).arg(&n);
        // SAFETY: both hold at least `len` compute-dtype elements; the kernel guards i < n.
        unsafe { b.launch(elementwise(len)) }.map_err(dev_err)?;
        Ok(())
    }

    fn gdn_conv1d(
        &self,
        cache: &mut CudaStateCache,
        layer: usize,
        mixed: &CudaBuffer,
        weight: &CudaBuffer,
        step: &CudaStep,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        conv_scan::gdn_conv1d(self, cache, layer, mixed, weight, step, out)
    }

    fn gdn_recurrence(
        &self,
        cache: &mut CudaStateCache,
        layer: usize,
        qkv: &CudaBuffer,
        a: &CudaBuffer,
        b: &CudaBuffer,
        a_log: &CudaBuffer,
        dt_bias: &CudaBuffer,
        step: &CudaStep,
        params: &GdnParams,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        conv_scan::gdn_recurrence(
            self, cache, layer, qkv, a, b, a_log, dt_bias, step, params, out,
        )
    }

    fn rms_norm_1p(
        &self,
        x: &CudaBuffer,
        weight: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.norm_1p(x, None, weight, out, rows, dim, eps)
    }

    fn add_rms_norm_1p(
        &self,
        residual: &mut CudaBuffer,
        delta: &CudaBuffer,
        weight: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.norm_1p(delta, Some(residual), weight, out, rows, dim, eps)
    }

    fn gated_rms_norm(
        &self,
        x: &CudaBuffer,
        z: &CudaBuffer,
        weight: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "gated_rms_norm");
        let n = rows * dim;
        check_len("gated_rms_norm x", x.len, n)?;
        check_len("gated_rms_norm z", z.len, n)?;
        check_len("gated_rms_norm output", out.len, n)?;
        check_len("gated_rms_norm weight", weight.len, dim)?;
        for (what, b) in [("x", x), ("z", z), ("weight", weight), ("output", &*out)] {
            self.expect_compute(&format!("gated_rms_norm {what}"), b)?;
        }
        if n == 0 {
            return Ok(());
        }
        let d = dim as i32;
        if dim.is_multiple_of(8) {
            // Lanes per row: enough for one 8-element chunk each, a power of two, at most 32.
            let lpr = (dim / 8).next_power_of_two().min(32);
            let rows_per_block = NORM_VEC_THREADS / lpr;
            let (rows_i, lpr_i) = (rows as i64, lpr as i32);
            let st = &self.stream;
            let mut b = KernelArgs::new();
            b.buf(&x.data, st)
                .buf(&z.data, st)
                .buf(&weight.data, st)
                .buf(&out.data, st)
                .i64(rows_i)
                .i32(d)
                .f32(eps)
                .i32(lpr_i);
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(rows_per_block) as u32, 1, 1),
                block_dim: (NORM_VEC_THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: x, z and out hold rows × dim elements and weight dim (checked), each its
            // own allocation (256-byte aligned) with dim a multiple of 8, so every 8-element
            // access is aligned and inside its row; lpr divides the block (a power of two ≤ 32)
            // and the kernel guards row < rows after the warp-wide shuffles. It waits (PDL)
            // before any access.
            unsafe {
                self.launch_args(
                    &self.k.gdn.gated_rms_norm_vec,
                    cfg,
                    &mut b,
                    self.pdl_packed(),
                )
            }?;
            return Ok(());
        }
        let st = &self.stream;
        let mut b = KernelArgs::new();
        b.buf(&x.data, st)
            .buf(&z.data, st)
            .buf(&weight.data, st)
            .buf(&out.data, st)
            .i32(d)
            .f32(eps);
        let threads = (dim.div_ceil(32) * 32).min(1024) as u32;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x, z and out hold rows × dim elements and weight dim (checked); blockDim is a
        // multiple of 32 and at most 1024, as block_sum needs. The kernel waits (PDL) before
        // any access.
        unsafe { self.launch_args(&self.k.gdn.gated_rms_norm, cfg, &mut b, self.pdl_packed()) }?;
        Ok(())
    }
}
