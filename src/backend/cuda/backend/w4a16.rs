//! 4-bit linears (int4 formats and NVFP4) kept packed on the device: upload in the w4 tile
//! layout ([`crate::tensor::packed_tiles`]) and the matmul through `kernels/w4a16.cu` (the
//! kernels' `fp4` flag selects the e2m1 decode).
//!
//! Kernel choice ([`W4Kernel`]): on sm_80+ with a 16-bit compute dtype, the GEMV for steps of
//! 1–[`GEMV_MAX_ROWS`] rows (on the common layouts `w4_gemv`, 8-row blocks, for 1–8 rows and the
//! x-staged `w4_gemvx1` / `w4_gemvx2`, 16-row tiles, for 9–32; `w4_gemv32`, 32-row blocks,
//! otherwise) and a GEMM for larger ones (on sm_90 / sm_100 the GEMMs of the child module
//! `w4a16_gemm.rs`, chosen by the row count; elsewhere the GEMV's 32-row blocks to
//! [`GEMV_MID_ROWS`] rows, then `w4_gemm`), all `mma.sync.m16n8k16` over the same fragments and
//! the same K slices (chosen from K alone), so they agree bit for bit and a row's result does not
//! depend on its batch; on sm_70 / sm_75 with fp16 the mma m8n8k4 kernels of the child module
//! `w4a16_sm70.rs` (same contract); elsewhere (f32) `w4_fma`, one kernel for every row count.
//! On sm_90+ steps of 17–64 rows run the rule of the child module `w4a16_xr.rs` where it
//! applies (`KILN_W4_XR`, on by default: the cluster GEMV with 32 x rows per CTA for 17–32 and
//! 49–64 rows, the 9–16-row cluster GEMV with 3 row tiles for 33–48; same bits).
//! On sm_90+ the 1–8-row steps may run the child module `w4a16_bulk.rs` instead (`w4b_gemv`: the
//! same arithmetic, its weights streamed by bulk copies into shared memory; `KILN_W4_BULK`).
//! The GEMM uses `stages` × [`GEMM_STAGE_BYTES`] of dynamic shared memory (opted in per launch).
//! Nothing here allocates per call, and every launch takes fixed pointers (graph-capturable).
//!
//! Programmatic dependent launch: the GEMV kernels (`w4_gemv`, `w4_gemvx1` / `w4_gemvx2`,
//! `w4_gemv32`) load their first weights and (scale, zero) words, then wait
//! (`griddepcontrol.wait`) before reading x, so they are launched with the PDL attribute where
//! the backend has PDL (`CudaBackend::pdl`, sm_90+, `KILN_PDL`): a GEMV's blocks start during the
//! previous kernel's tail and overlap their first DRAM loads with it; `w4_gemv` and
//! `w4_gemvx1` / `w4_gemvx2` let the next kernel launch after their main loop by default
//! (`KILN_PDL_GEMV_TRIGGER`). Timing only: no kernel's arithmetic depends on it.

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use super::launch::KernelArgs;
use super::{dev_err, mixed, ComputeDType, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::BackendError;
use crate::tensor::packed_tiles::{W4Tiles, W4Values, PAD_N, TILE_N};
use crate::tensor::PackedLinear;

// The sm_70 / sm_75 tensor-core kernels (`kernels/w4a16_sm70.cu`), a child module: it reads the
// private packed parts.
#[path = "w4a16_sm70.rs"]
mod sm70;
pub(crate) use sm70::Sm70Kernels;

// The sm_90+ GEMMs (`kernels/w4a16_gemm.cu`), a child module for the same reason.
#[path = "w4a16_gemm.rs"]
mod wide;
pub(crate) use wide::WideKernels;

// The sm_90+ bulk-copy GEMV (`kernels/w4a16_bulk.cu`), a child module for the same reason.
#[path = "w4a16_bulk.rs"]
mod bulk;
pub(crate) use bulk::BulkGemv;

#[path = "w4a16_xc.rs"] // the sm_90+ cluster GEMV for 9–16 rows (`kernels/w4a16_xs.cu`)
mod xc;
pub(crate) use xc::XcGemv;
#[path = "w4a16_xr.rs"] // the sm_90+ cluster GEMV for 17–64 rows (`kernels/w4a16_xr.cu`)
mod xr;
pub(crate) use xr::XrGemv;
#[path = "w4a16_gemv.rs"] // the 1–8-row GEMV and its builds (`kernels/w4a16_gemv.cu`)
mod gemv;
pub use gemv::W4_GEMV_VARIANTS;
pub(crate) use gemv::{w4_gemv_defines, w4_gemv_names, GemvFast};

/// Rows the GEMV always covers; larger steps run [`W4Kernel::Gemm`], which picks by the row
/// count and the weight (same numerics, so every switch is a speed choice only).
pub const GEMV_MAX_ROWS: usize = 32;

/// Most rows [`W4Kernel::Gemm`] runs on the GEMV's 32-row blocks where the sm_90 GEMMs do not
/// apply. 128: on the H200 the GEMM's 128-row block tiles leave most SMs idle below a few
/// hundred rows (its time is flat from 32 to 128 rows), and the GEMV's 32-row blocks, each
/// decoding its weights again, ran one Qwen3.5-27B decode step's linears in 36.1 ms at 64 rows
/// against 80.4 (`w4_gemm`) and in 64.9 against 81.3 at 128; at 192 they were level (97.4 /
/// 101.6) and at 256 the GEMM won (126.3 / 101.6). `tests/cuda_w4a16_midm.rs`, docs/benchmarks.md.
/// Where the sm_90 GEMMs apply, their cluster split-K beats both from 33 rows on.
pub const GEMV_MID_ROWS: usize = 128;

/// Rows of one `w4_gemv` block (`kernels/w4a16.cu` RG = 1); steps up to this many rows run it
/// when the layout allows ([`CudaPackedParts::gemv_fast_ok`]).
const GEMV8_ROWS: usize = 8;

/// Rows of one x-staged `w4_gemvx1` / `w4_gemvx2` block (RG = 2); 9–[`GEMV_MAX_ROWS`]-row steps
/// run them, in row tiles of this many, on the fast layouts ([`CudaPackedParts::gemv_fast_ok`]).
const GEMVX_ROWS: usize = 16;

/// `w4_gemvx2` (two m16 tiles per block sharing the x stages) runs when its grid has at least this
/// many blocks (2 per SM on the H200); else `w4_gemvx1` (docs/benchmarks.md, "the x-staged GEMV").
const GEMVX2_MIN_BLOCKS: usize = 256;

/// Rows of one `w4_gemv32` block (RG = 4).
const GEMV32_ROWS: usize = 32;

/// Shared memory of one GEMM pipeline stage: 128 x rows of one 128-column k block (32 KB) and
/// 16 n8 weight tiles of it (8 KB); `kernels/w4a16.cu` `W4_GEMM_STAGE_BYTES`.
const GEMM_STAGE_BYTES: usize = 128 * 256 + 16 * 512;

/// Whether the packed GEMVs and the Qwen3.5 small kernels take PDL by default (where
/// `KILN_PDL` is on): see [`pdl_packed_from_env`].
const PDL_PACKED_DEFAULT: bool = true;

/// `KILN_PDL_PACKED`: programmatic dependent launch for the packed GEMVs (`w4_gemv`,
/// `w4_gemvx1` / `w4_gemvx2`, `w4_gemv32`) and the Qwen3.5 small kernels (`rms_norm_1p`, the
/// `gdn.cu` kernels, `silu_mul`) on (`1`, `true`, `on`) or off (`0`, `false`, `off`); unset:
/// [`PDL_PACKED_DEFAULT`]. Only where `KILN_PDL` is on (the backend's PDL, sm_90+).
pub fn pdl_packed_from_env() -> Result<bool, BackendError> {
    super::launch::env_switch("KILN_PDL_PACKED", PDL_PACKED_DEFAULT)
}

/// Where the fast GEMVs (`w4_gemv`, `w4_gemvx1` / `w4_gemvx2`) let the next kernel launch under
/// PDL by default: see [`trigger_late_from_env`].
const TRIGGER_LATE_DEFAULT: bool = true;

/// `KILN_PDL_GEMV_TRIGGER`: where the fast GEMVs call `griddepcontrol.launch_dependents` —
/// `start` (first thing: the next grid may become resident once all of this grid's blocks have
/// started) or `end` (after each block's main loop: the next grid fills this one's tail, no
/// earlier); unset: [`TRIGGER_LATE_DEFAULT`]. Only matters where they run with PDL.
pub fn trigger_late_from_env() -> Result<bool, BackendError> {
    match std::env::var("KILN_PDL_GEMV_TRIGGER") {
        Err(_) => Ok(TRIGGER_LATE_DEFAULT),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" => Ok(TRIGGER_LATE_DEFAULT),
            "start" => Ok(false),
            "end" => Ok(true),
            other => Err(BackendError::InvalidArgument(format!(
                "KILN_PDL_GEMV_TRIGGER={other:?}: expected start or end"
            ))),
        },
    }
}

/// Which packed-matmul kernel runs (tests force one; the backend picks by rows and arch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum W4Kernel {
    /// Tensor-core GEMV: one m16 output tile per block, 8-, 16- or 32-row blocks (any row count;
    /// picked for 1–[`GEMV_MAX_ROWS`], and by [`W4Kernel::Gemm`] to [`GEMV_MID_ROWS`] where the
    /// sm_90 GEMMs do not apply).
    Gemv,
    /// The bulk-copy GEMV (`kernels/w4a16_bulk.cu`, sm_90+, 1–8 rows on the layouts of
    /// `w4_gemv`; same bits) forced: an error where it does not apply. [`W4Kernel::Gemv`] runs
    /// it for 1–8 rows where `KILN_W4_BULK` is on (`w4a16_bulk.rs`).
    GemvBulk,
    /// Tensor-core GEMM (picked above [`GEMV_MAX_ROWS`] rows), the kernel by the step's shape: on
    /// sm_90 / sm_100 where they apply, the GEMMs of `w4a16_gemm.rs` (cluster split-K while the
    /// step has few 64 × 128 tiles, one-CTA 64 × 128 tiles to 2048 rows, 128 × 256 tiles above;
    /// on sm_90 the warp-specialised warpgroup-MMA `w4g_ws` (256 × 128 tiles) above 1024 rows and
    /// at 1024 rows on grids of ≥ 160 of its blocks);
    /// elsewhere the GEMV's 32-row blocks to [`GEMV_MID_ROWS`] rows, then `w4_gemm` (128 × 128
    /// block tiles staged by cp.async).
    Gemm,
    /// `w4_gemm` forced (tests and benchmarks compare it with the others).
    GemmBase,
    /// The wide `w4g_gemm` (128 × 256) where the sm_90 GEMMs apply
    /// (`CudaBackend::w4_wide_gemm_applies`), else `w4_gemm`.
    GemmWide,
    /// The 64 × 128 `w4g_tile` where the sm_90 GEMMs apply, else `w4_gemm`.
    GemmTile,
    /// The cluster split-K `w4g_split` where the sm_90 GEMMs apply and the weight has 8 K slices
    /// (`w4g_tile` for other slice counts), else `w4_gemm`.
    GemmSplit,
    /// The warpgroup-MMA `w4g_wgmma` (256 × 128 tiles) where the sm_90 GEMMs apply on an sm_90
    /// GPU, `w4g_gemm` on sm_100, else `w4_gemm`.
    GemmWgmma,
    /// The warp-specialised warpgroup-MMA `w4g_ws` (256 × 128 tiles, a producer warpgroup) where
    /// the sm_90 GEMMs apply on an sm_90 GPU, `w4g_gemm` on sm_100, else `w4_gemm`.
    GemmWs,
    /// The 17–64-row cluster GEMV (`kernels/w4a16_xr.cu`, sm_90+, weights of 8 K slices on the
    /// layouts of `w4_gemv`; same bits) forced at any row count: an error where it does not
    /// apply. [`W4Kernel::Gemv`] / [`W4Kernel::Gemm`] run it for 17–64 rows where `KILN_W4_XR` is
    /// on (`w4a16_xr.rs`).
    GemvXr,
    /// CUDA-core FMA kernel: sm_70 / sm_75 and the f32 compute dtype.
    Fma,
}

/// The device parts of a packed linear besides its 4-bit words (which are `CudaWeight::data`).
#[derive(Debug)]
pub struct CudaPackedParts {
    /// Scales in the compute dtype, `[Np/8][GS][8]`.
    scales: CudaSlice<u8>,
    /// Zero points u8 `[Np/8][GS][8]`; `None` = symmetric (8).
    zeros: Option<CudaSlice<u8>>,
    /// Tile column → input column (act-order).
    perm: Option<CudaSlice<u8>>,
    n_pad: usize,
    k_blocks: usize,
    k_slices: usize,
    group_shift: u32,
    groups: usize,
    /// Integer or e2m1 (NVFP4) nibbles.
    values: W4Values,
}

impl CudaPackedParts {
    /// Whether the 8-row `w4_gemv` and the x-staged `w4_gemvx1` / `w4_gemvx2` (fast variants
    /// only) can run this layout: whole 128-column k blocks of x (k % 128 == 0), no act-order permutation, and
    /// NVFP4 or groups of ≥ 32 columns (`kernels/w4a16.cu` `W4_TC_ENTRIES`; the same test the
    /// 32-row kernel makes).
    fn gemv_fast_ok(&self, k: usize) -> bool {
        self.perm.is_none()
            && k.is_multiple_of(128)
            && (self.values == W4Values::E2m1 || self.group_shift > 0)
    }

    /// Device bytes besides the 4-bit words.
    pub fn bytes(&self) -> usize {
        self.scales.len()
            + self.zeros.as_ref().map_or(0, |z| z.len())
            + self.perm.as_ref().map_or(0, |p| p.len())
    }
}

impl CudaBackend {
    /// Repack a 4-bit linear (int4 or NVFP4) into the tile layout and upload it; `g_idx` layouts
    /// the tiles cannot hold are `Unsupported`, naming the module.
    pub(super) fn upload_packed(
        &self,
        name: &str,
        p: &PackedLinear<'_>,
    ) -> Result<CudaWeight, BackendError> {
        let t = W4Tiles::from_packed(p)
            .map_err(|e| BackendError::Unsupported(format!("`{name}` on {}: {e}", self.name_())))?;
        debug_assert_eq!(t.n_pad % PAD_N, 0);
        let qweight = self
            .stream
            .clone_htod(bytemuck::cast_slice::<u32, u8>(&t.qweight))
            .map_err(dev_err)?;
        let scales = self.upload_host_f32(&t.scales)?;
        let zeros = match &t.zeros {
            Some(z) => Some(self.stream.clone_htod(z).map_err(dev_err)?),
            None => None,
        };
        let perm = match &t.perm {
            Some(pm) => Some(
                self.stream
                    .clone_htod(bytemuck::cast_slice::<i32, u8>(pm))
                    .map_err(dev_err)?,
            ),
            None => None,
        };
        tracing::debug!(
            module = name,
            scheme = %p.scheme,
            n = t.n,
            k = t.k,
            k_slices = t.k_slices,
            act_order = t.perm.is_some(),
            values = ?t.values,
            "Packed linear uploaded in the w4 tile layout."
        );
        Ok(CudaWeight {
            data: qweight,
            n: t.n,
            k: t.k,
            packed: Some(Box::new(CudaPackedParts {
                scales,
                zeros,
                perm,
                n_pad: t.n_pad,
                k_blocks: t.k_blocks(),
                k_slices: t.k_slices,
                group_shift: t.group_shift(),
                groups: t.groups,
                values: t.values,
            })),
            gguf: None,
            swiglu_rows: false,
        })
    }

    fn name_(&self) -> &str {
        &self.device_name
    }

    /// `(out_features, in_features)` of a weight, dense or packed.
    pub fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        (w.n, w.k)
    }

    /// The kernel the backend runs for a step of `rows` rows.
    pub fn w4_kernel_for(&self, rows: usize) -> W4Kernel {
        if self.k.w4_sm70.is_some() {
            return sm70::kernel_for(rows);
        }
        if !self.w4_tensor_cores() {
            W4Kernel::Fma
        } else if rows <= GEMV_MAX_ROWS {
            W4Kernel::Gemv
        } else {
            W4Kernel::Gemm
        }
    }

    /// cp.async stages of the GEMM: 3 where a block may use ≥ 120 KB of shared memory (sm_80,
    /// sm_90, sm_100: 163 / 227 / 227 KB), else 2 (80 KB: sm_86 / sm_89 / sm_120 have 99 KB).
    fn w4_gemm_stages(&self) -> usize {
        if matches!(
            (self.arch.major, self.arch.minor),
            (8, 0) | (9, 0) | (10, 0)
        ) {
            3
        } else {
            2
        }
    }

    /// Whether kernels that support it are launched with programmatic dependent launch
    /// (`KILN_PDL` on sm_90+ kernels, see `launch.rs`).
    pub fn pdl(&self) -> bool {
        self.pdl
    }

    /// Whether the packed GEMVs and the Qwen3.5 small kernels (`rms_norm_1p`, the GDN kernels,
    /// `silu_mul`) are launched with PDL: [`Self::pdl`] and `KILN_PDL_PACKED`
    /// ([`pdl_packed_from_env`]).
    pub(super) fn pdl_packed(&self) -> bool {
        self.pdl && self.pdl_packed
    }

    /// Turn programmatic dependent launch off, or back on where the backend allows it (sm_90+
    /// kernels with the tensor-core dense kernels; the packed GEMVs and the Qwen3.5 small kernels
    /// with it), and place the fast GEMVs' trigger (`KILN_PDL_GEMV_TRIGGER`: late = after the
    /// main loop); returns whether PDL is now on. For benchmarks that compare them in one process.
    pub fn set_pdl(&mut self, pdl: bool, trigger_late: bool) -> bool {
        self.pdl = pdl && self.arch.major >= 9 && self.k.dense_mma.is_some();
        self.pdl_packed = pdl;
        self.w4_trigger_late = trigger_late;
        self.pdl
    }

    /// Whether the tensor-core kernels run here (sm_80+ with a 16-bit compute dtype, or the
    /// sm_70 / sm_75 kernels with fp16).
    pub fn w4_tensor_cores(&self) -> bool {
        (self.arch.major >= 8 && self.dtype != ComputeDType::F32) || self.k.w4_sm70.is_some()
    }

    /// `out[rows, n] = x[rows, k] · wᵀ` for a packed `w` with the given kernel (what
    /// [`crate::backend::Backend::matmul`] does with the kernel of [`Self::w4_kernel_for`]).
    /// For tests and benchmarks that compare the kernels.
    pub fn matmul_w4_with(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuffer,
        kernel: W4Kernel,
    ) -> Result<(), BackendError> {
        super::check_len("matmul input", x.len, rows * w.k)?;
        super::check_len("matmul output", out.len, rows * w.n)?;
        if x.dtype != self.dtype {
            return Err(mixed("matmul input", x.dtype, self.dtype));
        }
        if out.dtype != self.dtype {
            return Err(mixed("matmul output", out.dtype, self.dtype));
        }
        let Some(parts) = &w.packed else {
            return Err(BackendError::InvalidArgument(
                "matmul_w4_with: a dense weight".into(),
            ));
        };
        if rows == 0 {
            return Ok(());
        }
        let (xp, _x) = x.data.device_ptr(&self.stream);
        let (op, _o) = out.data.device_ptr(&self.stream);
        // SAFETY: x and out hold rows × k and rows × n compute-dtype elements (checked above) and
        // stay alive (guards) for the call.
        unsafe { self.packed_matmul(w, parts, rows, xp, op, false, kernel) }
    }

    /// Launch the packed matmul.
    ///
    /// # Safety
    /// `xp` points to `rows × w.k` compute-dtype elements and `op` to `rows × w.n` elements of
    /// the compute dtype (or f32 when `out_f32`), live on this stream.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn packed_matmul(
        &self,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
        kernel: W4Kernel,
    ) -> Result<(), BackendError> {
        if let Some(mid) = self.w4_mid_runs(parts, w.k, rows, kernel) {
            // SAFETY: the caller's guarantees, passed on unchanged.
            return unsafe { self.packed_mid(w, parts, rows, xp, op, out_f32, mid) };
        }
        if kernel == W4Kernel::GemvXr {
            return Err(BackendError::Unsupported(format!(
                "the 17–64-row cluster GEMV runs weights of 8 K slices on the common layouts on \
                 sm_90+ with a 16-bit dtype ({}, {rows} rows, {} × {})",
                self.device_name, w.n, w.k
            )));
        }
        let wide_kind = match kernel {
            W4Kernel::Gemm => Some(wide::WideKind::for_rows(
                rows,
                parts.n_pad,
                parts.k_slices,
                self.w4g_wgmma_ok(),
                wide::ws_enabled(),
            )),
            W4Kernel::GemmWide => Some(wide::WideKind::Wide),
            W4Kernel::GemmTile => Some(wide::WideKind::Tile),
            W4Kernel::GemmSplit => Some(wide::WideKind::Split),
            W4Kernel::GemmWgmma => Some(wide::WideKind::Wgmma),
            W4Kernel::GemmWs => Some(wide::WideKind::Ws),
            _ => None,
        };
        if let Some(kind) = wide_kind.filter(|_| self.w4g_gemm_ok(parts, w.k)) {
            // SAFETY: the caller's guarantees, passed on unchanged.
            return unsafe { self.packed_gemm_wide(w, parts, rows, xp, op, out_f32, kind) };
        }
        let kernel = match kernel {
            // The GEMM choice without the sm_90 kernels (not on the sm_70 / sm_75 path, which
            // has its own): the GEMV's 32-row blocks while they beat `w4_gemm`.
            W4Kernel::Gemm if rows <= GEMV_MID_ROWS && self.k.w4_sm70.is_none() => W4Kernel::Gemv,
            W4Kernel::GemmBase
            | W4Kernel::GemmWide
            | W4Kernel::GemmTile
            | W4Kernel::GemmSplit
            | W4Kernel::GemmWgmma
            | W4Kernel::GemmWs => W4Kernel::Gemm,
            other => other,
        };
        if self.w4_bulk_runs(kernel, parts, w.k, rows) {
            // SAFETY: the caller's guarantees, passed on unchanged.
            return unsafe { self.packed_gemv_bulk(w, parts, rows, xp, op, out_f32) };
        }
        if kernel == W4Kernel::GemvBulk {
            return Err(BackendError::Unsupported(format!(
                "the bulk packed GEMV runs 1–8 rows of the common layouts on sm_90+ with a \
                 16-bit dtype ({}, {rows} rows)",
                self.device_name
            )));
        }
        if let (Some(s70), W4Kernel::Gemv | W4Kernel::Gemm) = (&self.k.w4_sm70, kernel) {
            // SAFETY: the caller's guarantees, passed on unchanged.
            return unsafe {
                self.packed_matmul_sm70(s70, w, parts, rows, xp, op, out_f32, kernel)
            };
        }
        // 9+ rows, or fewer where the cluster GEMV takes them (7–8 rows on K = 17408 by default,
        // `w4a16_xc.rs` `default_min_rows`; `KILN_W4_XC_MIN_ROWS`).
        if kernel == W4Kernel::Gemv
            && self.w4_tensor_cores()
            && parts.gemv_fast_ok(w.k)
            && (rows > GEMV8_ROWS || self.w4_xc_runs(parts, w.k, rows).is_some())
        {
            // SAFETY: the caller's guarantees, passed on unchanged.
            return unsafe { self.packed_gemv_xs(w, parts, rows, xp, op, out_f32) };
        }
        // Rows of one GEMV block: 8 (fast layouts, up to 8 rows) or 32.
        let gemv_rows = if parts.gemv_fast_ok(w.k) && rows <= GEMV8_ROWS {
            GEMV8_ROWS
        } else {
            GEMV32_ROWS
        };
        let f = match kernel {
            W4Kernel::Gemv => match gemv_rows {
                GEMV8_ROWS => self.w4_gemv_function(parts.n_pad),
                _ => self.k.w4_gemv32.as_ref(),
            }
            .filter(|_| self.w4_tensor_cores()),
            W4Kernel::Gemm
            | W4Kernel::GemmBase
            | W4Kernel::GemmWide
            | W4Kernel::GemmTile
            | W4Kernel::GemmSplit
            | W4Kernel::GemmWgmma
            | W4Kernel::GemmWs => self.k.w4_gemm.as_ref().filter(|_| self.w4_tensor_cores()),
            W4Kernel::Fma => Some(&self.k.w4_fma),
            // Launched above or refused there.
            W4Kernel::GemvBulk | W4Kernel::GemvXr => None,
        }
        .ok_or_else(|| {
            BackendError::Unsupported(format!(
                "{kernel:?} packed matmul needs sm_80+ and a 16-bit dtype ({})",
                self.device_name
            ))
        })?;
        let (block, grid) = match kernel {
            W4Kernel::Gemv | W4Kernel::GemvBulk | W4Kernel::GemvXr => (
                32 * parts.k_slices,
                (self.w4v_grid(parts, gemv_rows), rows.div_ceil(gemv_rows)),
            ),
            W4Kernel::Gemm
            | W4Kernel::GemmBase
            | W4Kernel::GemmWide
            | W4Kernel::GemmTile
            | W4Kernel::GemmSplit
            | W4Kernel::GemmWgmma
            | W4Kernel::GemmWs => (256, (parts.n_pad.div_ceil(128), rows.div_ceil(128))),
            W4Kernel::Fma => (
                32 * parts.k_slices,
                (parts.n_pad / TILE_N, rows.div_ceil(16)),
            ),
        };
        let (qp, _q) = w.data.device_ptr(&self.stream);
        let (sp, _s) = parts.scales.device_ptr(&self.stream);
        let zg = parts.zeros.as_ref().map(|z| z.device_ptr(&self.stream));
        let pg = parts.perm.as_ref().map(|p| p.device_ptr(&self.stream));
        let zp: u64 = zg.as_ref().map_or(0, |(p, _)| *p);
        let pp: u64 = pg.as_ref().map_or(0, |(p, _)| *p);
        let (m, k, n) = (rows as i32, w.k as i32, w.n as i32);
        let (kb, ks, gc, gs) = (
            parts.k_blocks as i32,
            parts.k_slices as i32,
            parts.group_shift as i32,
            parts.groups as i32,
        );
        let of32 = i32::from(out_f32);
        let fp4 = i32::from(parts.values == W4Values::E2m1);
        let (stages, tiles) = (self.w4_gemm_stages() as i32, (parts.n_pad / TILE_N) as i32);
        let shared = match kernel {
            W4Kernel::Gemm => {
                let bytes = stages as usize * GEMM_STAGE_BYTES;
                // Above the default 48 KB a kernel must opt in; idempotent and cheap (a driver
                // attribute, no stream work, so graph capture is unaffected).
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
                .map_err(dev_err)?;
                bytes as u32
            }
            _ => 0,
        };
        let cfg = LaunchConfig {
            grid_dim: (grid.0 as u32, grid.1 as u32, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: shared,
        };
        if kernel == W4Kernel::Gemv {
            // The GEMVs wait (PDL) before reading x or writing out; `w4_gemv` (8-row blocks)
            // takes the trigger's place (0 first, 1 after the main loop) as its last parameter.
            let mut a = KernelArgs::new();
            a.ptr(xp).i32(m).i32(k).ptr(qp).ptr(sp).ptr(zp).ptr(pp);
            a.i32(kb)
                .i32(ks)
                .i32(gc)
                .i32(gs)
                .i32(n)
                .ptr(op)
                .i32(of32)
                .i32(fp4);
            if gemv_rows == GEMV8_ROWS {
                a.i32(i32::from(self.w4_trigger_late));
            }
            // SAFETY: as the launch below; the parameters match `w4_gemv_*` (W4_ARGS + trig) or
            // `w4_gemv32_*` (W4_ARGS), and the GEMV kernels read only weights before their
            // griddepcontrol.wait, which makes the PDL attribute allowed.
            return unsafe { self.launch_args(f, cfg, &mut a, self.pdl_packed()) };
        }
        let mut b = self.stream.launch_builder(f);
        b.arg(&xp)
            .arg(&m)
            .arg(&k)
            .arg(&qp)
            .arg(&sp)
            .arg(&zp)
            .arg(&pp);
        b.arg(&kb)
            .arg(&ks)
            .arg(&gc)
            .arg(&gs)
            .arg(&n)
            .arg(&op)
            .arg(&of32)
            .arg(&fp4);
        if kernel == W4Kernel::Gemm {
            b.arg(&stages).arg(&tiles);
        }
        // SAFETY: the parts were built by W4Tiles for this weight (n_pad / 8 tiles of k_blocks
        // blocks, groups stored groups, perm of k entries); the grid covers n_pad outputs and
        // ceil(rows / tile) row tiles, and the kernels read x only below (rows, k) and write out
        // only below (rows, n) — the caller vouches for x and out.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// Launch the x-staged GEMV (`kernels/w4a16.cu` `w4_gemv_xs`: `w4_gemvx2`, two m16 tiles
    /// per block, when that grid has at least [`GEMVX2_MIN_BLOCKS`] blocks, else `w4_gemvx1`)
    /// for a step of 9..=32 rows on a fast layout, in row tiles of [`GEMVX_ROWS`] (the cluster
    /// GEMV of `w4a16_xc.rs` where it applies).
    ///
    /// # Safety
    /// As [`Self::packed_matmul`].
    unsafe fn packed_gemv_xs(
        &self,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
    ) -> Result<(), BackendError> {
        if let Some(build) = self.w4_xc_runs(parts, w.k, rows) {
            // SAFETY: the caller's guarantees, passed on unchanged.
            return unsafe { self.packed_gemv_xc(w, parts, rows, xp, op, out_f32, build) };
        }
        let (tiles, row_tiles) = (parts.n_pad / (2 * TILE_N), rows.div_ceil(GEMVX_ROWS));
        let p = 1 + usize::from(tiles / 2 * row_tiles >= GEMVX2_MIN_BLOCKS);
        let f = [&self.k.w4_gemvx1, &self.k.w4_gemvx2][p - 1]
            .as_ref()
            .ok_or_else(|| {
                BackendError::Unsupported(format!(
                    "the x-staged packed GEMV needs sm_80+ and a 16-bit dtype ({})",
                    self.device_name
                ))
            })?;
        let ks = parts.k_slices;
        // x stages: ks slices x 2 stages x 16 rows x 128 B, reused by the slice sums (<= 32 KB).
        let shared = ks * 2 * GEMVX_ROWS * 128;
        debug_assert!(p * ks * GEMVX_ROWS * 16 * 4 <= shared);
        let (qp, _q) = w.data.device_ptr(&self.stream);
        let (sp, _s) = parts.scales.device_ptr(&self.stream);
        let zg = parts.zeros.as_ref().map(|z| z.device_ptr(&self.stream));
        let zp: u64 = zg.as_ref().map_or(0, |(p, _)| *p);
        let pp: u64 = 0;
        let (m, k, n) = (rows as i32, w.k as i32, w.n as i32);
        let (kb, ksi, gc, gs) = (
            parts.k_blocks as i32,
            ks as i32,
            parts.group_shift as i32,
            parts.groups as i32,
        );
        let of32 = i32::from(out_f32);
        let fp4 = i32::from(parts.values == W4Values::E2m1);
        let mut a = KernelArgs::new();
        a.ptr(xp).i32(m).i32(k).ptr(qp).ptr(sp).ptr(zp).ptr(pp);
        a.i32(kb)
            .i32(ksi)
            .i32(gc)
            .i32(gs)
            .i32(n)
            .ptr(op)
            .i32(of32)
            .i32(fp4)
            .i32(i32::from(self.w4_trigger_late));
        let cfg = LaunchConfig {
            grid_dim: ((tiles / p) as u32, row_tiles as u32, 1),
            block_dim: ((32 * ks * p) as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        // SAFETY: as in `packed_matmul`: the parts match the weight (a fast layout: no perm,
        // k % 128 == 0; n_pad is a multiple of 64, so tiles is even), the grid covers n_pad
        // outputs in tiles of 16 P and ceil(rows / 16) row tiles, and the kernel reads x only
        // below (rows, k) and writes out only below (rows, n); it reads only weights before its
        // griddepcontrol.wait (the PDL attribute is allowed).
        unsafe { self.launch_args(f, cfg, &mut a, self.pdl_packed()) }
    }
}
