//! The `dense_mma_*` entry points of one 16-bit compute dtype ([`MmaKernels`], resolved once at
//! load), each small-kernel function with the most threads its registers allow a block
//! ([`SmallFn`]), the tile fallback that respects it ([`fitting_tile`]) and the small kernel's
//! shared-memory size ([`small_shared_bytes`]). Split out of `dense.rs`.

use cudarc::driver::CudaFunction;

use crate::backend::cuda::device::CudaError;

/// The `dense_mma_*` entry points of one 16-bit compute dtype.
#[derive(Debug, Clone)]
pub(crate) struct MmaKernels {
    /// Small kernel, compute-dtype output, row groups 1, 2, 4, 8, then the wide 64-row tile (rg8w).
    pub small: [SmallFn; 5],
    /// Small kernel, f32 output (the lm_head).
    pub small_f32: [SmallFn; 5],
    /// Large kernel, compute-dtype output.
    pub large: CudaFunction,
    /// Large kernel, f32 output.
    pub large_f32: CudaFunction,
    /// Small kernel with the SwiGLU epilogue, row groups 1, 2, 4, 8, then the wide 64-row tile (rg8w).
    pub small_swiglu: [SmallFn; 5],
    /// Large kernel with the SwiGLU epilogue.
    pub large_swiglu: CudaFunction,
    /// Small kernel with the RMSNorm prologue (f32 residual input), row groups 1, 2, 4, 8, then the wide 64-row tile (rg8w).
    pub small_norm: [SmallFn; 5],
    /// Small kernel with the RMSNorm prologue and the SwiGLU epilogue.
    pub small_norm_swiglu: [SmallFn; 5],
    /// Small kernel with the residual-add epilogue (f32 residual output).
    pub small_res: [SmallFn; 5],
}

impl MmaKernels {
    /// The entry point names for dtype suffix `t` (f16 / bf16), as dense.cu defines them.
    pub fn names(t: &str) -> Vec<String> {
        let mut v = Vec::new();
        for rg in ["1", "2", "4", "8", "8w"] {
            v.push(format!("dense_mma_small_rg{rg}_{t}"));
            v.push(format!("dense_mma_small_rg{rg}_{t}_f32"));
            v.push(format!("dense_mma_small_rg{rg}_swiglu_{t}"));
            v.push(format!("dense_mma_small_rg{rg}_norm_{t}"));
            v.push(format!("dense_mma_small_rg{rg}_norm_swiglu_{t}"));
            v.push(format!("dense_mma_small_rg{rg}_res_{t}"));
        }
        v.push(format!("dense_mma_large_{t}"));
        v.push(format!("dense_mma_large_{t}_f32"));
        v.push(format!("dense_mma_large_swiglu_{t}"));
        v
    }

    /// The NORM_ROPE entry point of row group `rg` for compute dtype suffix `t` and KV storage
    /// suffix `c` (same / e5m2 / e4m3), as dense.cu defines it.
    pub fn rope_name(rg: u32, t: &str, c: &str) -> String {
        format!("dense_mma_small_rg{rg}_norm_rope_{t}_{c}")
    }

    /// Resolve them through `get` (by name), each small one with its block limit.
    pub fn resolve(
        get: &dyn Fn(String) -> Result<CudaFunction, CudaError>,
        t: &str,
    ) -> Result<MmaKernels, CudaError> {
        let s = |rg: &str, f32: bool| {
            SmallFn::new(get(format!(
                "dense_mma_small_rg{rg}_{t}{}",
                if f32 { "_f32" } else { "" }
            ))?)
        };
        let sw = |rg: &str| SmallFn::new(get(format!("dense_mma_small_rg{rg}_swiglu_{t}"))?);
        let var = |rg: &str, v: &str| SmallFn::new(get(format!("dense_mma_small_rg{rg}_{v}_{t}"))?);
        type Make<'a> = &'a dyn Fn(&str) -> Result<SmallFn, CudaError>;
        let five = |f: Make| -> Result<[SmallFn; 5], CudaError> {
            Ok([f("1")?, f("2")?, f("4")?, f("8")?, f("8w")?])
        };
        Ok(MmaKernels {
            small: five(&|rg| s(rg, false))?,
            small_f32: five(&|rg| s(rg, true))?,
            large: get(format!("dense_mma_large_{t}"))?,
            large_f32: get(format!("dense_mma_large_{t}_f32"))?,
            small_swiglu: five(&sw)?,
            large_swiglu: get(format!("dense_mma_large_swiglu_{t}"))?,
            small_norm: five(&|rg| var(rg, "norm"))?,
            small_norm_swiglu: five(&|rg| var(rg, "norm_swiglu"))?,
            small_res: five(&|rg| var(rg, "res"))?,
        })
    }

    /// Every small-kernel function of the 64-row tiles (rg8, rg8w), whose partials may pass the
    /// default 48 KiB of dynamic shared memory ([`small_shared_bytes`]).
    pub fn rg8(&self) -> [&CudaFunction; 12] {
        [3, 4]
            .map(|i| {
                [
                    &self.small[i].f,
                    &self.small_f32[i].f,
                    &self.small_swiglu[i].f,
                    &self.small_norm[i].f,
                    &self.small_norm_swiglu[i].f,
                    &self.small_res[i].f,
                ]
            })
            .concat()
            .try_into()
            .expect("12 functions")
    }
}

/// The row groups of the small kernel, in the order of [`MmaKernels`]' arrays (index =
/// `trailing_zeros`).
pub const MMA_ROW_GROUPS: [usize; 4] = [1, 2, 4, 8];

/// A small-kernel entry point and the most threads one of its blocks may have
/// (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`, read at load: it falls below 512 = 16 slices ×
/// 32 when the function needs more than 128 registers, as the 64-row tile may).
#[derive(Debug, Clone)]
pub(crate) struct SmallFn {
    pub f: CudaFunction,
    pub max_threads: usize,
}

impl SmallFn {
    pub fn new(f: CudaFunction) -> Result<SmallFn, CudaError> {
        let max_threads = f.max_threads_per_block()?.max(0) as usize;
        Ok(SmallFn { f, max_threads })
    }
}

/// The largest tile at most (`rg`, `nt`) (row groups, 16-output tiles per block; nt = 2: rg8w)
/// whose function, given by `pick(index into MmaKernels' arrays)`, takes a block of `threads`
/// threads: rg8w → rg8 → rg4 → rg2 → rg1 (a function of the shape and the compiled kernels,
/// never of the data; every tile gives the same bits). `None`: not even rg1 fits.
pub(crate) fn fitting_tile<'a>(
    mut rg: usize,
    mut nt: usize,
    threads: usize,
    pick: &dyn Fn(usize) -> Option<&'a SmallFn>,
) -> Option<(&'a SmallFn, usize, usize)> {
    loop {
        let i = if nt == 2 {
            4
        } else {
            rg.trailing_zeros() as usize
        };
        let sf = pick(i)?;
        if sf.max_threads >= threads {
            return Some((sf, rg, nt));
        }
        if nt == 2 {
            nt = 1;
        } else if rg > 1 {
            rg /= 2;
        } else {
            return None;
        }
    }
}

/// Dynamic shared memory of a small-kernel launch: `slices × rg × 128` f32 partials (`rg`: row
/// groups × tiles per block, 16 for rg8w). At most 16 × 8 × 512 B = 64 KiB (rg8 with 16
/// slices; rg8w is used up to 8 slices, K ≤ 1024): above the default 48 KiB, so the rg8 / rg8w
/// functions are allowed [`MMA_SMALL_MAX_SHARED`] at load (`handles.rs`; 64 KiB is what every
/// GPU from sm_75 on allows).
pub fn small_shared_bytes(slices: usize, rg: usize) -> usize {
    slices * rg * 128 * 4
}

/// The most a small-kernel launch takes ([`small_shared_bytes`] of 16 slices, row group 8).
pub const MMA_SMALL_MAX_SHARED: usize = 16 * 8 * 128 * 4;
