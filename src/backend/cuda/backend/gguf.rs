//! GGUF Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K weights kept quantized on the device: upload in the gguf tile layout
//! ([`crate::tensor::gguf_tiles`]), the matmul and the embedding gather through
//! `kernels/gguf_mm.cu`.
//!
//! Kernel choice ([`GgufKernel`]): on sm_80+ with a 16-bit compute dtype, `gguf_gemv` for steps
//! of 1–16 rows and `gguf_gemm` for larger ones, both `mma.sync.m16n8k16` over the same fragments
//! and the same K slices (chosen from K alone), so they agree bit for bit and a row's result does
//! not depend on its batch; elsewhere (sm_70 / sm_75, f32) `gguf_fma`, one kernel for every row
//! count. Nothing here allocates per call, and every launch takes fixed pointers
//! (graph-capturable).
//!
//! Opt-in: `KILN_GGUF_GPU_WEIGHTS=quantized` (read at each upload). The default is still the old
//! path, GGUF blocks dequantized to the compute dtype at load and multiplied with cuBLAS, because
//! these kernels are slower than cuBLAS on the dequantized weights today (`docs/benchmarks.md`).

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, DevicePtr, LaunchConfig, PushKernelArg};

use super::{dev_err, ComputeDType, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::cuda::device::CudaError;
use crate::backend::BackendError;
use crate::tensor::gguf_tiles::{GgufFormat, GgufTiles, TILE_N};
use crate::tensor::TensorView;

/// Rows the GEMV covers; larger steps run the GEMM (same numerics).
pub const GEMV_MAX_ROWS: usize = 16;

/// Which GGUF matmul kernel runs (tests force one; the backend picks by rows and arch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufKernel {
    /// Tensor-core GEMV: one m16 tile per block row (any row count; picked for 1–16).
    Gemv,
    /// Tensor-core GEMM, 128 × 64 block tiles (picked above 16 rows).
    Gemm,
    /// CUDA-core FMA kernel: sm_70 / sm_75 and the f32 compute dtype.
    Fma,
}

/// The entry points of one format for the compute dtype.
#[derive(Debug, Clone)]
struct FormatKernels {
    gemv: Option<CudaFunction>,
    gemm: Option<CudaFunction>,
    fma: CudaFunction,
    gather: CudaFunction,
    /// Gather into f32 (the f32 residual stream); `None` when the compute dtype is f32.
    gather_to_f32: Option<CudaFunction>,
}

/// The `gguf_mm.cu` entry points for one compute dtype, by format (the order of [`FORMATS`]).
#[derive(Debug, Clone)]
pub(crate) struct GgufKernels {
    by_format: [FormatKernels; 5],
}

/// Every format kept quantized, in the order of [`GgufKernels`].
pub const FORMATS: [GgufFormat; 5] = [
    GgufFormat::Q4_0,
    GgufFormat::Q4_1,
    GgufFormat::Q8_0,
    GgufFormat::Q4K,
    GgufFormat::Q6K,
];

fn index(f: GgufFormat) -> usize {
    match f {
        GgufFormat::Q4_0 => 0,
        GgufFormat::Q4_1 => 1,
        GgufFormat::Q8_0 => 2,
        GgufFormat::Q4K => 3,
        GgufFormat::Q6K => 4,
    }
}

impl GgufKernels {
    /// Resolve the entry points for dtype suffix `t` through `get` (name → function).
    pub(crate) fn resolve(
        get: &impl Fn(String) -> Result<CudaFunction, CudaError>,
        t: &str,
    ) -> Result<GgufKernels, CudaError> {
        let wide = t != "f32";
        let one = |f: GgufFormat| -> Result<FormatKernels, CudaError> {
            let s = f.suffix();
            let opt = |name: String| wide.then(|| get(name)).transpose();
            Ok(FormatKernels {
                gemv: opt(format!("gguf_gemv_{s}_{t}"))?,
                gemm: opt(format!("gguf_gemm_{s}_{t}"))?,
                fma: get(format!("gguf_fma_{s}_{t}"))?,
                gather: get(format!("gguf_gather_{s}_{t}"))?,
                gather_to_f32: opt(format!("gguf_gather_{s}_{t}_to_f32"))?,
            })
        };
        Ok(GgufKernels {
            by_format: [
                one(FORMATS[0])?,
                one(FORMATS[1])?,
                one(FORMATS[2])?,
                one(FORMATS[3])?,
                one(FORMATS[4])?,
            ],
        })
    }

    fn of(&self, f: GgufFormat) -> &FormatKernels {
        &self.by_format[index(f)]
    }
}

/// The device parts of a GGUF weight besides its values (which are `CudaWeight::data`).
#[derive(Debug)]
pub struct CudaGgufParts {
    format: GgufFormat,
    /// The block parameters (`GgufTiles::scales`).
    scales: CudaSlice<u8>,
    /// The second parameter array (`GgufTiles::aux`: Q4_1 mins, K-quant super-block scales).
    aux: Option<CudaSlice<u8>>,
    n_pad: usize,
    k_blocks: usize,
    k_slices: usize,
}

impl CudaGgufParts {
    /// Device bytes besides the values.
    pub fn bytes(&self) -> usize {
        self.scales.len() + self.aux.as_ref().map_or(0, |m| m.len())
    }
}

/// Whether GGUF blocks of `view` stay quantized on the device (`KILN_GGUF_GPU_WEIGHTS=quantized`).
pub fn keeps_quantized(view: &TensorView<'_>) -> bool {
    crate::tensor::gguf_tiles::keep_quantized_requested()
        && GgufFormat::of(view.dtype).is_some()
        && view.shape.len() == 2
}

impl CudaBackend {
    /// A 2-D Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K weight in the gguf tile layout, or `None` when `view` is not kept
    /// quantized ([`keeps_quantized`]).
    pub(super) fn upload_gguf(
        &self,
        name: &str,
        view: &TensorView<'_>,
    ) -> Result<Option<CudaWeight>, BackendError> {
        if !keeps_quantized(view) {
            return Ok(None);
        }
        let t = GgufTiles::from_view(view)
            .map_err(|e| BackendError::InvalidArgument(format!("`{name}`: {e}")))?;
        let data = self
            .stream
            .clone_htod(bytemuck::cast_slice::<u32, u8>(&t.qweight))
            .map_err(dev_err)?;
        let scales = self.stream.clone_htod(&t.scales).map_err(dev_err)?;
        let aux = match &t.aux {
            Some(m) => Some(self.stream.clone_htod(m).map_err(dev_err)?),
            None => None,
        };
        tracing::debug!(
            module = name,
            format = t.format.suffix(),
            n = t.n,
            k = t.k,
            k_slices = t.k_slices,
            bytes = t.bytes(),
            "GGUF weight uploaded in the gguf tile layout."
        );
        Ok(Some(CudaWeight {
            data,
            n: t.n,
            k: t.k,
            packed: None,
            gguf: Some(Box::new(CudaGgufParts {
                format: t.format,
                scales,
                aux,
                n_pad: t.n_pad,
                k_blocks: t.k_blocks(),
                k_slices: t.k_slices,
            })),
            swiglu_rows: false,
        }))
    }

    /// Whether the tensor-core GGUF kernels run here (sm_80+, 16-bit compute dtype).
    pub fn gguf_tensor_cores(&self) -> bool {
        self.arch.major >= 8 && self.dtype != ComputeDType::F32
    }

    /// The kernel the backend runs for a step of `rows` rows.
    pub fn gguf_kernel_for(&self, rows: usize) -> GgufKernel {
        if !self.gguf_tensor_cores() {
            GgufKernel::Fma
        } else if rows <= GEMV_MAX_ROWS {
            GgufKernel::Gemv
        } else {
            GgufKernel::Gemm
        }
    }

    /// The format of a weight kept quantized, `None` for any other.
    pub fn gguf_format(&self, w: &CudaWeight) -> Option<GgufFormat> {
        w.gguf.as_ref().map(|p| p.format)
    }

    /// `out[rows, n] = x[rows, k] · wᵀ` for a GGUF `w` with the given kernel (what
    /// [`crate::backend::Backend::matmul`] does with the kernel of [`Self::gguf_kernel_for`]).
    /// For tests and benchmarks that compare the kernels.
    pub fn matmul_gguf_with(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuffer,
        kernel: GgufKernel,
    ) -> Result<(), BackendError> {
        let Some(parts) = &w.gguf else {
            return Err(BackendError::InvalidArgument(
                "matmul_gguf_with: not a GGUF weight kept quantized".into(),
            ));
        };
        let what = ["matmul input", "matmul output"];
        self.with_matmul_ptrs(what, x, rows, w, out, |xp, op| {
            // SAFETY: x and out hold rows × k and rows × n compute-dtype elements (checked by
            // with_matmul_ptrs) and stay alive (guards) for the call.
            unsafe { self.gguf_matmul(w, parts, rows, xp, op, false, kernel) }
        })
    }

    /// Launch the GGUF matmul.
    ///
    /// # Safety
    /// `xp` points to `rows × w.k` compute-dtype elements and `op` to `rows × w.n` elements of
    /// the compute dtype (or f32 when `out_f32`), live on this stream.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gguf_matmul(
        &self,
        w: &CudaWeight,
        parts: &CudaGgufParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
        kernel: GgufKernel,
    ) -> Result<(), BackendError> {
        let fk = self.k.gguf.of(parts.format);
        let tc = self.gguf_tensor_cores();
        let f = match kernel {
            GgufKernel::Gemv => fk.gemv.as_ref().filter(|_| tc),
            GgufKernel::Gemm => fk.gemm.as_ref().filter(|_| tc),
            GgufKernel::Fma => Some(&fk.fma),
        }
        .ok_or_else(|| {
            BackendError::Unsupported(format!(
                "{kernel:?} GGUF matmul needs sm_80+ and a 16-bit dtype ({})",
                self.device_name
            ))
        })?;
        let (block, grid) = match kernel {
            GgufKernel::Gemv => (
                32 * parts.k_slices,
                (parts.n_pad / (2 * TILE_N), rows.div_ceil(16)),
            ),
            GgufKernel::Gemm => (128, (parts.n_pad / 64, rows.div_ceil(128))),
            GgufKernel::Fma => (
                32 * parts.k_slices,
                (parts.n_pad / TILE_N, rows.div_ceil(16)),
            ),
        };
        let (qp, _q) = w.data.device_ptr(&self.stream);
        let (sp, _s) = parts.scales.device_ptr(&self.stream);
        let mg = parts.aux.as_ref().map(|z| z.device_ptr(&self.stream));
        let mp: u64 = mg.as_ref().map_or(0, |(p, _)| *p);
        let (m, k, n) = (rows as i32, w.k as i32, w.n as i32);
        let (kb, ks) = (parts.k_blocks as i32, parts.k_slices as i32);
        let of32 = i32::from(out_f32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&xp).arg(&m).arg(&k).arg(&qp).arg(&sp).arg(&mp);
        b.arg(&kb).arg(&ks).arg(&n).arg(&op).arg(&of32);
        let cfg = LaunchConfig {
            grid_dim: (grid.0 as u32, grid.1 as u32, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the parts were built by GgufTiles for this weight (n_pad / 8 tiles of k_blocks
        // blocks, scales and aux of the same tiles, aux present for every format that reads it); the grid covers n_pad outputs and
        // ceil(rows / tile) row tiles, and the kernels read x only below (rows, k) and write out
        // only below (rows, n) — the caller vouches for x and out.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// `out[i, :] = table[ids[i], :]` for `n` rows of a GGUF table kept quantized, each value
    /// rounded to the compute dtype (what the dequantized table would hold), written in
    /// `out_dtype` (the compute dtype, or f32 for the f32 residual stream).
    ///
    /// # Safety
    /// `ids` holds `n` row indices below `table.n`; `out` holds `n × table.k` elements of
    /// `out_dtype`.
    pub(super) unsafe fn gguf_gather(
        &self,
        table: &CudaWeight,
        parts: &CudaGgufParts,
        ids: &CudaView<'_, i32>,
        n: usize,
        out: &mut CudaSlice<u8>,
        out_dtype: ComputeDType,
    ) -> Result<(), BackendError> {
        let fk = self.k.gguf.of(parts.format);
        let f = self.for_dtype(
            "embedding output",
            out_dtype,
            &fk.gather,
            fk.gather_to_f32.as_ref(),
        )?;
        if n == 0 {
            return Ok(());
        }
        let (kb, k) = (parts.k_blocks as i32, table.k as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(ids).arg(&table.data).arg(&parts.scales);
        let null: u64 = 0;
        match &parts.aux {
            Some(m) => b.arg(m),
            None => b.arg(&null),
        };
        b.arg(&kb).arg(&k).arg(out);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller's promise on ids and out; the table's tiles cover every row below
        // table.n and every column below k (GgufTiles); aux is read only by the formats that have
        // it (Q4_1, Q4_K, Q6_K).
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }
}
