//! The pipelined batch-invariant dense GEMM (`kernels/dense_gemm.cu`, sm_80+): what
//! `KILN_DENSE_MATMUL=mma` runs above [`super::dense::MMA_SMALL_MAX_ROWS`] rows (prefill, large
//! batches) in place of `dense_mma_large`. The kernel performs exactly the per-element arithmetic
//! of dense.cu's `mma` kernels (the same fragments, K slices of [`super::dense::slice_blocks`],
//! the same slice order), so the three agree bit for bit at every row count; it stages the weight
//! and x tiles through a 3–4-stage cp.async ring in shared memory, which `dense_mma_large` does
//! not. `KILN_DENSE_GEMM_PREFETCH=1` (read when the kernels are compiled, a measurement switch;
//! same bits) builds it with two fragment register sets (the next k block's words read before
//! this one's mmas).
//!
//! The block tile ([`GemmTile`]) is chosen per launch from (n, rows) and the SM count
//! ([`GemmTile::auto`]); a tile never changes the bits. `KILN_DENSE_GEMM` ([`GemmChoice`], read
//! when the backend is created): unset / `auto` / `1` the GEMM with the automatic tile, `t0`..`t5`
//! one tile always, `0` / `large` / `off` `dense_mma_large` (for A/B comparisons).
//!
//! For the GPU tests: [`CudaBackend::mma_probe_alloc`] / [`CudaBackend::mma_probe_run`] /
//! [`CudaBackend::mma_probe_bits`] run any `mma` kernel (small, large, GEMM of any tile) with any
//! of the epilogues the GEMM has (compute dtype, f32, SwiGLU) into a raw output buffer.

use std::collections::HashMap;
use std::sync::OnceLock;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

use super::dense::{Epilogue, MmaKernel};
use super::{dev_err, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::cuda::device::CudaError;
use crate::backend::BackendError;

/// A block tile of `dense_gemm.cu` (the `t{i}` of its entry points; same order and sizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmTile {
    /// 128 outputs × 128 rows, 8 warps of 64 × 32, 128 KiB of shared memory (1 block / SM).
    T0,
    /// 64 × 64, 4 warps of 32 × 32, 64 KiB (3 blocks / SM).
    T1,
    /// 128 × 64, 4 warps of 64 × 32, 96 KiB (2 blocks / SM).
    T2,
    /// 64 × 32, 4 warps of 32 × 16, 48 KiB (4 blocks / SM): the small grids.
    T3,
    /// 128 × 192, 8 warps of 64 × 48, 160 KiB (1 block / SM): fewer shared-memory reads per mma.
    T4,
    /// 128 × 96, 4 warps of 64 × 48, 3 stages, 84 KiB (2 blocks / SM).
    T5,
}

impl GemmTile {
    /// Every tile, in entry-point order.
    pub const ALL: [GemmTile; 6] = [
        GemmTile::T0,
        GemmTile::T1,
        GemmTile::T2,
        GemmTile::T3,
        GemmTile::T4,
        GemmTile::T5,
    ];

    /// The `i` of `dense_gemm_t{i}_*`.
    pub fn index(self) -> usize {
        self as usize
    }

    /// (outputs, rows) of the block tile.
    pub fn tile(self) -> (usize, usize) {
        match self {
            GemmTile::T0 => (128, 128),
            GemmTile::T1 => (64, 64),
            GemmTile::T2 => (128, 64),
            GemmTile::T3 => (64, 32),
            GemmTile::T4 => (128, 192),
            GemmTile::T5 => (128, 96),
        }
    }

    /// Threads per block (32 × warps).
    fn threads(self) -> u32 {
        match self {
            GemmTile::T0 | GemmTile::T4 => 256,
            _ => 128,
        }
    }

    /// Pipeline stages (the kernel's `ST`).
    fn stages(self) -> usize {
        match self {
            GemmTile::T5 => 3,
            _ => 4,
        }
    }

    /// Dynamic shared memory (bytes): stages × 2 k blocks × (outputs + rows) × 64 bytes.
    pub fn shared_bytes(self) -> usize {
        let (bn, bm) = self.tile();
        self.stages() * 2 * (bn + bm) * 64
    }

    /// Relative throughput of an SM running this tile, fitted to the H200's table (bf16, the
    /// 27B's and SmolLM2's shapes at 512 and 4 096 rows, docs/benchmarks.md `dgemm6` run 2: t0
    /// 211–231 TFLOP/s on the 27B's full grids; with these weights [`GemmTile::auto`] picks a
    /// tile within 0.88 of the best measured on each of the 20 shapes × row counts, 0.98 on
    /// average).
    fn efficiency(self) -> f64 {
        match self {
            GemmTile::T0 => 1.0,
            GemmTile::T1 => 0.88,
            GemmTile::T2 => 0.87,
            GemmTile::T3 => 0.55,
            GemmTile::T4 => 0.9,
            GemmTile::T5 => 0.97,
        }
    }

    /// Blocks of a launch on `n` outputs and `rows` rows.
    fn blocks(self, n: usize, rows: usize) -> usize {
        let (bn, bm) = self.tile();
        n.div_ceil(bn) * rows.div_ceil(bm)
    }

    /// The modelled time of a launch on `sms` SMs: the busiest SM's blocks × a block's outputs
    /// ÷ the tile's efficiency (every SM throughput-bound; small grids lose to idle SMs).
    fn cost(self, n: usize, rows: usize, sms: usize) -> f64 {
        let (bn, bm) = self.tile();
        self.blocks(n, rows).div_ceil(sms.max(1)) as f64 * (bn * bm) as f64 / self.efficiency()
    }

    /// The automatic tile for `n` outputs and `rows` rows on `sms` SMs: the least
    /// [`GemmTile::cost`] (ties to the larger tile).
    pub fn auto(n: usize, rows: usize, sms: usize) -> GemmTile {
        let mut best = GemmTile::T4;
        for t in [
            GemmTile::T0,
            GemmTile::T5,
            GemmTile::T2,
            GemmTile::T1,
            GemmTile::T3,
        ] {
            if t.cost(n, rows, sms) < best.cost(n, rows, sms) {
                best = t;
            }
        }
        best
    }
}

/// `KILN_DENSE_GEMM`: what the `mma` path runs above 64 rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmChoice {
    /// `dense_mma_large` (`0`, `off`, `false`, `large`).
    Large,
    /// The GEMM, tile by [`GemmTile::auto`] (unset, empty, `1`, `on`, `true`, `auto`).
    Auto,
    /// The GEMM, always this tile (`t0` .. `t5`).
    Tile(GemmTile),
}

impl GemmChoice {
    /// Parse a `KILN_DENSE_GEMM` value (case-insensitive); an unknown one is an error.
    pub fn parse(v: &str) -> Result<GemmChoice, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "1" | "on" | "true" | "auto" => Ok(GemmChoice::Auto),
            "0" | "off" | "false" | "large" => Ok(GemmChoice::Large),
            "t0" => Ok(GemmChoice::Tile(GemmTile::T0)),
            "t1" => Ok(GemmChoice::Tile(GemmTile::T1)),
            "t2" => Ok(GemmChoice::Tile(GemmTile::T2)),
            "t3" => Ok(GemmChoice::Tile(GemmTile::T3)),
            "t4" => Ok(GemmChoice::Tile(GemmTile::T4)),
            "t5" => Ok(GemmChoice::Tile(GemmTile::T5)),
            other => Err(format!(
                "KILN_DENSE_GEMM={other:?}: expected auto, 0 (dense_mma_large) or t0..t5"
            )),
        }
    }

    /// The choice of `KILN_DENSE_GEMM` (unset: [`GemmChoice::Auto`]).
    pub fn from_env() -> Result<GemmChoice, String> {
        std::env::var("KILN_DENSE_GEMM").map_or(Ok(GemmChoice::Auto), |v| Self::parse(&v))
    }
}

/// The `dense_gemm_*` entry points of one 16-bit compute dtype, by [`GemmTile::index`], and the
/// backend's [`GemmChoice`].
#[derive(Debug)]
pub(crate) struct GemmKernels {
    /// Output in the compute dtype.
    same: [CudaFunction; 6],
    /// f32 output (the lm_head).
    f32: [CudaFunction; 6],
    /// The SwiGLU epilogue (interleaved gate|up weight, output `n / 2` wide).
    swiglu: [CudaFunction; 6],
    /// `KILN_DENSE_GEMM` at the backend's creation.
    pub choice: GemmChoice,
    /// The GPU's SM count (read at the first launch).
    sms: OnceLock<usize>,
}

impl Clone for GemmKernels {
    fn clone(&self) -> Self {
        GemmKernels {
            same: self.same.clone(),
            f32: self.f32.clone(),
            swiglu: self.swiglu.clone(),
            choice: self.choice,
            sms: self
                .sms
                .get()
                .map_or_else(OnceLock::new, |&v| OnceLock::from(v)),
        }
    }
}

impl GemmKernels {
    /// The entry point names for dtype suffix `t` (f16 / bf16), as dense_gemm.cu defines them.
    pub fn names(t: &str) -> Vec<String> {
        (0..GemmTile::ALL.len())
            .flat_map(|i| {
                [
                    format!("dense_gemm_t{i}_{t}"),
                    format!("dense_gemm_t{i}_{t}_f32"),
                    format!("dense_gemm_t{i}_swiglu_{t}"),
                ]
            })
            .collect()
    }

    /// Resolve them out of every loaded function (`all`) and allow each its dynamic shared
    /// memory (above the default 48 KB a kernel must opt in). `None` where the module is not
    /// loaded (below sm_80: `KernelModule::builds_for`; every name is checked at load where it
    /// is), for a 32-bit dtype, or with `KILN_DENSE_GEMM=0` (then `dense_mma_large` runs).
    pub fn resolve(
        all: &HashMap<String, CudaFunction>,
        t: &str,
    ) -> Result<Option<GemmKernels>, CudaError> {
        let choice = GemmChoice::from_env().map_err(CudaError::Setting)?;
        if t == "f32" || choice == GemmChoice::Large {
            return Ok(None);
        }
        let get = |name: String| all.get(&name).cloned();
        let set = |v: [Option<CudaFunction>; 6]| -> Result<Option<[CudaFunction; 6]>, CudaError> {
            let [Some(a), Some(b), Some(c), Some(d), Some(e), Some(f)] = v else {
                return Ok(None);
            };
            for (f, tile) in [&a, &b, &c, &d, &e, &f].into_iter().zip(GemmTile::ALL) {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    tile.shared_bytes() as i32,
                )?;
            }
            Ok(Some([a, b, c, d, e, f]))
        };
        let same = set(std::array::from_fn(|i| get(format!("dense_gemm_t{i}_{t}"))))?;
        let f32 = set(std::array::from_fn(|i| {
            get(format!("dense_gemm_t{i}_{t}_f32"))
        }))?;
        let swiglu = set(std::array::from_fn(|i| {
            get(format!("dense_gemm_t{i}_swiglu_{t}"))
        }))?;
        Ok(match (same, f32, swiglu) {
            (Some(same), Some(f32), Some(swiglu)) => Some(GemmKernels {
                same,
                f32,
                swiglu,
                choice,
                sms: OnceLock::new(),
            }),
            _ => None,
        })
    }
}

/// What a probe run writes ([`CudaBackend::mma_probe_run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaOut {
    /// `[rows, n]` in the compute dtype.
    Same,
    /// `[rows, n]` in f32 (the lm_head's variant).
    F32,
    /// `[rows, n / 2]` in the compute dtype: silu(gate) · up of an interleaved gate|up weight
    /// (any weight with `n % 16 == 0` gives the kernels something to compare).
    Swiglu,
}

/// A raw output buffer for [`CudaBackend::mma_probe_run`].
#[derive(Debug)]
pub struct MmaProbeOut {
    data: CudaSlice<u8>,
    kind: MmaOut,
    elems: usize,
}

impl CudaBackend {
    /// The kernel the `mma` path runs above 64 rows: the GEMM unless `KILN_DENSE_GEMM=0` (or its
    /// module is not loaded), else `dense_mma_large`.
    pub(super) fn mma_big_kernel(&self) -> MmaKernel {
        match self.k.dense_gemm.as_ref().map(|g| g.choice) {
            Some(GemmChoice::Tile(t)) => MmaKernel::GemmTile(t),
            Some(GemmChoice::Auto) => MmaKernel::Gemm,
            Some(GemmChoice::Large) | None => MmaKernel::Large,
        }
    }

    /// Launch the GEMM (`tile`: `None` = [`GemmTile::auto`]) for `rows` rows of `w`.
    ///
    /// # Safety
    /// As `CudaBackend::mma_matmul`: `xp` holds `rows × w.k` compute-dtype elements, 16-byte
    /// aligned, `op` the epilogue's output (`rows × w.n` of the compute dtype or f32, or
    /// `rows × w.n / 2` for SwiGLU), live on this stream; `w` dense, `w.k % 8 == 0`.
    pub(super) unsafe fn gemm_launch(
        &self,
        w: &CudaWeight,
        rows: usize,
        xp: u64,
        op: u64,
        epilogue: Epilogue,
        tile: Option<GemmTile>,
    ) -> Result<(), BackendError> {
        let Some(gk) = self.k.dense_gemm.as_ref() else {
            return Err(BackendError::Unsupported(format!(
                "the pipelined dense GEMM (sm_80+, 16-bit compute, KILN_DENSE_GEMM not 0) on {}",
                self.device_name
            )));
        };
        let tile = tile.unwrap_or_else(|| {
            let sms = *gk.sms.get_or_init(|| {
                let a = cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
                self.ctx.attribute(a).map_or(1, |v| v.max(1) as usize)
            });
            GemmTile::auto(w.n, rows, sms)
        });
        let i = tile.index();
        let f = match epilogue {
            Epilogue::Same => &gk.same[i],
            Epilogue::F32 => &gk.f32[i],
            Epilogue::Swiglu => &gk.swiglu[i],
            Epilogue::Residual => {
                return Err(BackendError::Unsupported(
                    "the dense GEMM with the residual epilogue".into(),
                ))
            }
        };
        let (bn, bm) = tile.tile();
        let cfg = LaunchConfig {
            grid_dim: (w.n.div_ceil(bn) as u32, rows.div_ceil(bm) as u32, 1),
            block_dim: (tile.threads(), 1, 1),
            shared_mem_bytes: tile.shared_bytes() as u32,
        };
        // SAFETY: as this function's contract: x holds rows × k and out the epilogue's elements;
        // w is a live n × k allocation (256-byte aligned, k a multiple of 8: every 16-byte copy
        // is aligned and in bounds; the kernel copies nothing at or past row m, output n or
        // column k and stores only below (m, n)); the dynamic shared memory is the tile's, which
        // `GemmKernels::resolve` allowed the function; the GEMM entry points take (x, w, out, m,
        // n, k, sb).
        unsafe { self.launch_mma_xw(f, cfg, w, rows, xp, op) }
    }

    /// A zeroed output buffer of `kind` for `rows` rows of `w` (tests).
    pub fn mma_probe_alloc(
        &self,
        rows: usize,
        w: &CudaWeight,
        kind: MmaOut,
    ) -> Result<MmaProbeOut, BackendError> {
        let (elems, size) = match kind {
            MmaOut::Same => (rows * w.n, self.dtype.size()),
            MmaOut::F32 => (rows * w.n, 4),
            MmaOut::Swiglu => (rows * (w.n / 2), self.dtype.size()),
        };
        Ok(MmaProbeOut {
            data: self.alloc_bytes(elems * size)?,
            kind,
            elems,
        })
    }

    /// `out = x · wᵀ` (with `out`'s epilogue) through `kernel`, whatever the backend's
    /// `KILN_DENSE_MATMUL` and `KILN_DENSE_GEMM` (tests and benchmarks comparing the kernels).
    pub fn mma_probe_run(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        kernel: MmaKernel,
        out: &mut MmaProbeOut,
    ) -> Result<(), BackendError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        super::check_len("mma probe input", x.len, rows * w.k)?;
        self.expect_compute("mma probe input", x)?;
        if w.packed.is_some() || w.gguf.is_some() {
            return Err(BackendError::InvalidArgument(
                "mma_probe_run takes dense weights only".into(),
            ));
        }
        let (want, epilogue) = match out.kind {
            MmaOut::Same => (rows * w.n, Epilogue::Same),
            MmaOut::F32 => (rows * w.n, Epilogue::F32),
            MmaOut::Swiglu if w.n.is_multiple_of(16) => (rows * (w.n / 2), Epilogue::Swiglu),
            MmaOut::Swiglu => {
                return Err(BackendError::InvalidArgument(format!(
                    "mma probe: SwiGLU needs n % 16 == 0 (n = {})",
                    w.n
                )))
            }
        };
        super::check_len("mma probe output", out.elems, want)?;
        let (xp, _x_sync) = x.data.device_ptr(&self.stream);
        let (op, _o_sync) = out.data.device_ptr_mut(&self.stream);
        // SAFETY: x holds rows × k compute-dtype elements and out the epilogue's (checked
        // above, its element size set by its kind at allocation); the sync guards keep both in
        // use for the call.
        unsafe { self.mma_matmul(w, rows, xp, op, epilogue, kernel, None) }
    }

    /// The raw bits of a probe output: each element's 16 (compute dtype) or 32 (f32) bits.
    pub fn mma_probe_bits(&self, out: &MmaProbeOut) -> Result<Vec<u32>, BackendError> {
        let host: Vec<u8> = self.stream.clone_dtoh(&out.data).map_err(dev_err)?;
        Ok(if out.kind == MmaOut::F32 {
            host.chunks_exact(4)
                .take(out.elems)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        } else {
            host.chunks_exact(2)
                .take(out.elems)
                .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_env_switch_parses_and_rejects_typos() {
        assert_eq!(GemmChoice::parse(""), Ok(GemmChoice::Auto));
        assert_eq!(GemmChoice::parse("Auto"), Ok(GemmChoice::Auto));
        assert_eq!(GemmChoice::parse("0"), Ok(GemmChoice::Large));
        assert_eq!(GemmChoice::parse("large"), Ok(GemmChoice::Large));
        assert_eq!(GemmChoice::parse("t2"), Ok(GemmChoice::Tile(GemmTile::T2)));
        assert_eq!(GemmChoice::parse("t5"), Ok(GemmChoice::Tile(GemmTile::T5)));
        assert!(GemmChoice::parse("t6").is_err());
        assert!(GemmChoice::parse("yes please").is_err());
    }

    #[test]
    fn tiles_match_the_kernel_and_the_auto_choice_fills_the_gpu() {
        // dense_gemm.cu's tiles: shared memory 4 stages × 2 k blocks × (BN + BM) × 64 bytes.
        assert_eq!(GemmTile::T0.shared_bytes(), 128 * 1024);
        assert_eq!(GemmTile::T1.shared_bytes(), 64 * 1024);
        assert_eq!(GemmTile::T2.shared_bytes(), 96 * 1024);
        assert_eq!(GemmTile::T3.shared_bytes(), 48 * 1024);
        assert_eq!(GemmTile::T4.shared_bytes(), 160 * 1024);
        assert_eq!(GemmTile::T5.shared_bytes(), 84 * 1024);
        for t in GemmTile::ALL {
            assert_eq!(GemmTile::ALL[t.index()], t);
        }
        // The H200 picks of docs/benchmarks.md (`dgemm6` run 2), each the measured best or
        // within 0.88 of it: 27B down 5120 × 4096 rows: t0 (20 blocks on the busiest SM).
        assert_eq!(GemmTile::auto(5120, 4096, 132), GemmTile::T0);
        // 27B q|gate 10240 × 512 rows: t1's 1 280 blocks (320 t0 blocks are 2.4 waves).
        assert_eq!(GemmTile::auto(10240, 512, 132), GemmTile::T1);
        // SmolLM2's o 576 × 512: 72 t1 blocks (t3's 144 put two on some SMs).
        assert_eq!(GemmTile::auto(576, 512, 132), GemmTile::T1);
        // SmolLM2's k|v 192 × 512: t3.
        assert_eq!(GemmTile::auto(192, 512, 132), GemmTile::T3);
        // A tiny grid: t3's 3 blocks.
        assert_eq!(GemmTile::auto(64, 65, 132), GemmTile::T3);
    }
}
