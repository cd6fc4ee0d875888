//! Typed kernel handles: every entry point the backend launches, resolved once when the backend
//! is created for its compute dtype and KV storage, so a launch reads a field instead of
//! formatting a name and looking it up in a map (what each step did ~450 times before).

use std::collections::HashMap;

use cudarc::driver::CudaFunction;

use crate::backend::cuda::attention_plan::{DecodeVariant, PrefillVariant};
use crate::backend::cuda::device::CudaError;

/// The launched entry points for one (compute dtype `t`, KV storage `c`) pair.
#[derive(Debug, Clone)]
pub(crate) struct Kernels {
    /// `embedding_{t}`: row gather in the compute dtype (embedding, `gather_rows`).
    pub embedding: CudaFunction,
    /// `embedding_{t}_to_f32` (the f32 residual stream); `None` when `t` is f32, where
    /// `embedding` already writes f32.
    pub embedding_to_f32: Option<CudaFunction>,
    /// `silu_mul_{t}`.
    pub silu_mul: CudaFunction,
    /// `swiglu_{t}`: silu(gate) · up over a fused gate|up row.
    pub swiglu: CudaFunction,
    /// `swiglu_il_{t}`: the same over a gate|up product interleaved for the mma epilogue.
    pub swiglu_il: CudaFunction,
    /// `add_{t}`.
    pub add: CudaFunction,
    /// `rms_norm_{t}`: x, residual and out in the compute dtype.
    pub rms_norm: CudaFunction,
    /// `rms_norm_{t}_rf32`: f32 residual; `None` when `t` is f32.
    pub rms_norm_rf32: Option<CudaFunction>,
    /// `rms_norm_{t}_xf32`: f32 input, no residual; `None` when `t` is f32.
    pub rms_norm_xf32: Option<CudaFunction>,
    /// `rope_{t}`.
    pub rope: CudaFunction,
    /// `kv_write_{t}_{c}`.
    pub kv_write: CudaFunction,
    /// `qkv_rope_write_{t}_{c}`: per-head norm + RoPE + KV write of a fused q|k|v row.
    pub qkv_rope_write: CudaFunction,
    /// `kv_copy_block_b{bytes of c}`.
    pub kv_copy_block: CudaFunction,
    /// `attention_{t}_{c}`: the split-K kernel.
    pub attention_split_k: CudaFunction,
    /// `attention_serial_{t}_{c}`: the first split-K kernel, for head_dim > 64.
    pub attention_split_k_serial: CudaFunction,
    /// `attention_combine_{t}`.
    pub attention_combine: CudaFunction,
    /// `attention_prefill_{t}_{c}_{d}`, in the order of [`PrefillVariant::ALL`].
    pub attention_prefill: Vec<CudaFunction>,
    /// `attention_decode_{t}_{c}_d{dim}_g{group}`, in the order of [`DecodeVariant::all`].
    pub attention_decode: Vec<CudaFunction>,
    /// `attention_decode_combine_{t}`.
    pub attention_decode_combine: CudaFunction,
    /// `attention_decode_mma_{t}_{c}_d{64,128,256}`: the tensor-core decode kernels; `None` below
    /// sm_80, for f32 compute and with `KILN_DECODE_MMA=0`.
    pub attention_decode_mma: Option<super::DecodeMmaKernels>,
    /// `dequant_{q8_0,q4_0,q4_1}_{t}`.
    pub dequant_q8_0: CudaFunction,
    /// See `dequant_q8_0`.
    pub dequant_q4_0: CudaFunction,
    /// See `dequant_q8_0`.
    pub dequant_q4_1: CudaFunction,
    /// `sample_rows` (f32 logits whatever `t`).
    pub sample_rows: CudaFunction,
    /// `argmax_rows`: the greedy fast path.
    pub argmax_rows: CudaFunction,
    /// `w4_gemv{V}_{t}`: the 1–8-row packed 4-bit GEMV's builds (tensor cores,
    /// `kernels/w4a16_gemv.cu`) and the one that runs (`KILN_W4_GEMV`); `None` when `t` is f32.
    pub w4_gemv: Option<super::w4a16::GemvFast>,
    /// `w4_gemv32_{t}`: packed 4-bit GEMV over 32-row blocks (9–32 rows of the generic layouts); `None` when `t` is f32.
    pub w4_gemv32: Option<CudaFunction>,
    /// `w4_gemvx1_{t}` / `w4_gemvx2_{t}`: the x-staged packed 4-bit GEMV (9–32 rows of the
    /// common layouts, 16-row tiles, one / two m16 output tiles per block); `None` when `t` is f32.
    pub w4_gemvx1: Option<CudaFunction>,
    /// See `w4_gemvx1`.
    pub w4_gemvx2: Option<CudaFunction>,
    /// `w4_gemm_{t}`: packed 4-bit GEMM (tensor cores); `None` when `t` is f32.
    pub w4_gemm: Option<CudaFunction>,
    /// `w4g_{gemm,tile,split}_{t}`: the sm_90 packed 4-bit GEMMs of `kernels/w4a16_gemm.cu`;
    /// `None` below sm_90 (the module is not built there) or when `t` is f32.
    pub w4g_gemm: Option<super::w4a16::WideKernels>,
    /// `w4b_gemv_{t}`: the sm_90+ bulk-copy packed 4-bit GEMV of `kernels/w4a16_bulk.cu` and its
    /// settings (`KILN_W4_BULK*`); `None` below sm_90 (the module is not built there) or when
    /// `t` is f32.
    pub w4_bulk: Option<super::w4a16::BulkGemv>,
    /// `w4_gemvxc*_{t}`: the sm_90+ cluster packed 4-bit GEMV for 9–16 rows of
    /// `kernels/w4a16_xs.cu` and its setting (`KILN_W4_XC`); `None` below sm_90 (the module is
    /// not built there) or when `t` is f32.
    pub w4_xc: Option<super::w4a16::XcGemv>,
    /// `w4_gemvxr*_{t}`: the sm_90+ cluster packed 4-bit GEMV for 17–64 rows of
    /// `kernels/w4a16_xr.cu` and its setting (`KILN_W4_XR`); `None` below sm_90 (the module is
    /// not built there) or when `t` is f32.
    pub w4_xr: Option<super::w4a16::XrGemv>,
    /// `w4_fma_{t}`: packed 4-bit matmul on CUDA cores (sm_70 / sm_75, f32).
    pub w4_fma: CudaFunction,
    /// `w4s70_{gemv,gemm}_f16`: the sm_70 / sm_75 tensor-core packed 4-bit matmuls; `None`
    /// unless the module was built (sm_70 / sm_75) and `t` is f16.
    pub w4_sm70: Option<super::w4a16::Sm70Kernels>,
    /// `gpu_sleep`: holds the GPU for a time (the profiler's gate, `KILN_PROFILE_OPS`).
    pub gpu_sleep: CudaFunction,
    pub feed_tokens: CudaFunction,
    /// `dense_xwt_{t}` and its f32-output twin (16-bit compute dtypes only).
    pub dense_xwt: Option<(CudaFunction, CudaFunction)>,
    /// `dense_mma_*_{t}`: the tensor-core dense matmuls (16-bit compute dtypes only).
    pub dense_mma: Option<super::dense::MmaKernels>,
    /// `dense_gemm_t{0..3}_*_{t}`: the pipelined dense GEMM above 64 rows (`dense_gemm.cu`) and
    /// `KILN_DENSE_GEMM`; `None` below sm_80 (the module is not built there), for f32 compute and
    /// with `KILN_DENSE_GEMM=0` (then `dense_mma_large` runs).
    pub dense_gemm: Option<super::dense_gemm::GemmKernels>,
    /// `dense_mma_small_rg{1,2,4,8}_norm_rope_{t}_{c}`: the q|k|v matmul with the RMSNorm prologue
    /// and the RoPE + KV-write epilogue (16-bit compute dtypes only).
    pub dense_rope: Option<[super::dense::SmallFn; 4]>,
    /// The Gated DeltaNet entry points (`gdn.cu`).
    pub gdn: super::gdn::GdnKernels,
    /// `gated_qkv_rope_write_{t}_{c}`: Qwen3.5's fused pre-attention (`gated_attention.cu`).
    pub gated_qkv: CudaFunction,
    /// The GGUF kept-quantized entry points (`gguf_mm.cu`).
    pub gguf: super::gguf::GgufKernels,
}

impl Kernels {
    /// Pick the entry points for compute dtype suffix `t`, KV storage suffix `c` and KV element
    /// bytes `kv_bytes` out of every loaded function (`all`, by name).
    pub fn resolve(
        all: &HashMap<String, CudaFunction>,
        t: &str,
        c: &str,
        kv_bytes: usize,
    ) -> Result<Kernels, CudaError> {
        let get = |name: String| -> Result<CudaFunction, CudaError> {
            all.get(&name).cloned().ok_or(CudaError::MissingKernel {
                module: "(any)",
                function: name,
            })
        };
        let wide = t != "f32";
        let opt = |name: String| -> Result<Option<CudaFunction>, CudaError> {
            if wide {
                get(name).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(Kernels {
            embedding: get(format!("embedding_{t}"))?,
            embedding_to_f32: opt(format!("embedding_{t}_to_f32"))?,
            silu_mul: get(format!("silu_mul_{t}"))?,
            swiglu: get(format!("swiglu_{t}"))?,
            swiglu_il: get(format!("swiglu_il_{t}"))?,
            add: get(format!("add_{t}"))?,
            rms_norm: get(format!("rms_norm_{t}"))?,
            rms_norm_rf32: opt(format!("rms_norm_{t}_rf32"))?,
            rms_norm_xf32: opt(format!("rms_norm_{t}_xf32"))?,
            rope: get(format!("rope_{t}"))?,
            kv_write: get(format!("kv_write_{t}_{c}"))?,
            qkv_rope_write: get(format!("qkv_rope_write_{t}_{c}"))?,
            kv_copy_block: get(format!("kv_copy_block_b{kv_bytes}"))?,
            attention_split_k: get(format!("attention_{t}_{c}"))?,
            attention_split_k_serial: get(format!("attention_serial_{t}_{c}"))?,
            attention_combine: get(format!("attention_combine_{t}"))?,
            attention_prefill: PrefillVariant::ALL
                .iter()
                .map(|v| get(v.kernel_name(t, c)))
                .collect::<Result<_, _>>()?,
            attention_decode: DecodeVariant::all()
                .map(|v| get(v.kernel_name(t, c)))
                .collect::<Result<_, _>>()?,
            attention_decode_combine: get(format!("attention_decode_combine_{t}"))?,
            attention_decode_mma: super::DecodeMmaKernels::resolve(all, t, c, kv_bytes)?,
            dequant_q8_0: get(format!("dequant_q8_0_{t}"))?,
            dequant_q4_0: get(format!("dequant_q4_0_{t}"))?,
            dequant_q4_1: get(format!("dequant_q4_1_{t}"))?,
            sample_rows: get("sample_rows".into())?,
            argmax_rows: get("argmax_rows".into())?,
            w4_gemv: super::w4a16::GemvFast::resolve(all, t)
                .map_err(|e| CudaError::Setting(e.to_string()))?,
            w4_gemv32: opt(format!("w4_gemv32_{t}"))?,
            w4_gemvx1: opt(format!("w4_gemvx1_{t}"))?,
            w4_gemvx2: opt(format!("w4_gemvx2_{t}"))?,
            w4_gemm: opt(format!("w4_gemm_{t}"))?,
            // Only where its module is built (KernelModule::builds_for: sm_90+), whose entry
            // points are checked at load.
            w4g_gemm: if wide {
                super::w4a16::WideKernels::resolve(all, t)
            } else {
                None
            },
            w4_bulk: if wide {
                super::w4a16::BulkGemv::resolve(all, t)
                    .map_err(|e| CudaError::Setting(e.to_string()))?
            } else {
                None
            },
            w4_xc: if wide {
                super::w4a16::XcGemv::resolve(all, t)
                    .map_err(|e| CudaError::Setting(e.to_string()))?
            } else {
                None
            },
            w4_xr: if wide {
                super::w4a16::XrGemv::resolve(all, t)
                    .map_err(|e| CudaError::Setting(e.to_string()))?
            } else {
                None
            },
            w4_fma: get(format!("w4_fma_{t}"))?,
            w4_sm70: super::w4a16::Sm70Kernels::resolve(all, t),
            gpu_sleep: get("gpu_sleep".into())?,
            feed_tokens: get("feed_tokens".into())?,
            dense_xwt: match (
                opt(format!("dense_xwt_{t}"))?,
                opt(format!("dense_xwt_{t}_f32"))?,
            ) {
                (Some(a), Some(b)) => Some((a, b)),
                _ => None,
            },
            dense_mma: if wide {
                let mk = super::dense::MmaKernels::resolve(&get, t)?;
                allow_small_shared(mk.rg8())?;
                Some(mk)
            } else {
                None
            },
            dense_gemm: super::dense_gemm::GemmKernels::resolve(all, t)?,
            dense_rope: if wide {
                let r = |rg: u32| {
                    super::dense::SmallFn::new(get(super::dense::MmaKernels::rope_name(rg, t, c))?)
                };
                let fs = [r(1)?, r(2)?, r(4)?, r(8)?];
                allow_small_shared([&fs[3].f])?;
                Some(fs)
            } else {
                None
            },
            gdn: super::gdn::GdnKernels::resolve(&get, t)?,
            gated_qkv: get(format!("gated_qkv_rope_write_{t}_{c}"))?,
            gguf: super::gguf::GgufKernels::resolve(&get, t)?,
        })
    }

    /// The decode kernel of `variant`.
    pub fn decode(&self, variant: DecodeVariant) -> &CudaFunction {
        &self.attention_decode[variant.index()]
    }

    /// The prefill kernel of `variant`.
    pub fn prefill(&self, variant: PrefillVariant) -> &CudaFunction {
        let i = PrefillVariant::ALL
            .iter()
            .position(|v| *v == variant)
            .unwrap_or(0);
        &self.attention_prefill[i]
    }
}

/// Allow the small `mma` kernel's 64-row tile its dynamic shared memory (up to
/// [`super::dense::MMA_SMALL_MAX_SHARED`], above the 48 KiB a kernel gets without opting in).
fn allow_small_shared<const N: usize>(fs: [&CudaFunction; N]) -> Result<(), CudaError> {
    for f in fs {
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            super::dense::MMA_SMALL_MAX_SHARED as i32,
        )?;
    }
    Ok(())
}
