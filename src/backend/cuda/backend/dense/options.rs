//! The switches of the batch-invariant dense matmuls (read once, at the backend's creation):
//! `KILN_DENSE_MATMUL` ([`DenseMatmul`]), `KILN_FUSED_DECODE_ROWS` (the fused decode layer's
//! bound, [`fused_rows_from_env`]) and `KILN_PDL` ([`pdl_from_env`]); `KILN_DENSE_MID` is
//! `mid.rs`'s. Moved out of `dense.rs` (the launches stay there); none of them changes a row's
//! bits under `mma`, only which kernel (or which fused / unfused composition) computes them.

use super::super::ComputeDType;
use crate::backend::cuda::nvrtc::Arch;
use crate::backend::BackendError;

/// Rows up to which the `mma` path takes the small kernel (a speed choice only: both kernels
/// give the same bits).
pub const MMA_SMALL_MAX_ROWS: usize = 64;

/// Largest step (tokens) whose llama layers take the fused decode ops when
/// `KILN_FUSED_DECODE_ROWS` is unset and the dense matmul is cuBLAS. Measured on the H200
/// (docs/benchmarks.md, branch `launch`): fused 1 row +13.6% over cuBLAS, fused 16 rows −7.5%
/// (the 16-row tile of the small kernel is slower than cuBLAS there), 64 rows −33%. 1..8 rows run
/// the same 8-row tile as 1 row, so 8 is the bound; 2..8 rows were not measured on their own.
pub const DEFAULT_FUSED_DECODE_ROWS: usize = 8;

/// The same under `KILN_DENSE_MATMUL=mma` (the default on sm_80+ with 16-bit compute): the small
/// kernel's 16-row tile. There the unfused ops run the same `mma` kernels, so fusing up to 16
/// rows saves launches without a slower tile (docs/benchmarks.md, `inv6`). Beyond 16 rows the
/// fused layer loses on the H200 (branch `mma64`, run 1: SmolLM2 bf16 at 64 sequences 30.0K
/// tok/s fused to 64 rows against 54.3K fused to 16): its RMSNorm prologue re-reads every row's
/// f32 residual in each of the n / 16 blocks (norm + gate|up at 64 rows 28 µs against 9.4 µs
/// for `rms_norm` + the matmul).
pub const DEFAULT_FUSED_DECODE_ROWS_MMA: usize = 16;

/// `KILN_FUSED_DECODE_ROWS` for a backend whose dense matmul is `dense`: unset or empty = the
/// default of that kind ([`default_fused_rows`]), `0` = off, else a row count (clamped to
/// [`MMA_SMALL_MAX_ROWS`]); anything else is an error.
pub fn fused_rows_from_env(dense: DenseMatmul) -> Result<usize, BackendError> {
    match std::env::var("KILN_FUSED_DECODE_ROWS") {
        Err(_) => Ok(default_fused_rows(dense)),
        Ok(v) => parse_fused_rows(&v, dense),
    }
}

/// The fused decode rows when `KILN_FUSED_DECODE_ROWS` is unset: [`DEFAULT_FUSED_DECODE_ROWS_MMA`]
/// under `mma` (batch-invariant across the fused / unfused boundary), [`DEFAULT_FUSED_DECODE_ROWS`]
/// under cuBLAS (fast; not batch-invariant anyway), 0 under `fma` (the fused ops would be a
/// second numeric path beside the `fma` kernel).
pub fn default_fused_rows(dense: DenseMatmul) -> usize {
    match dense {
        DenseMatmul::Mma => DEFAULT_FUSED_DECODE_ROWS_MMA,
        DenseMatmul::Cublas => DEFAULT_FUSED_DECODE_ROWS,
        DenseMatmul::Fma => 0,
    }
}

/// Parse a `KILN_FUSED_DECODE_ROWS` value for a backend whose dense matmul is `dense` (empty:
/// [`default_fused_rows`]).
pub fn parse_fused_rows(v: &str, dense: DenseMatmul) -> Result<usize, BackendError> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(default_fused_rows(dense));
    }
    v.parse::<usize>()
        .map(|n| n.min(MMA_SMALL_MAX_ROWS))
        .map_err(|_| {
            BackendError::InvalidArgument(format!(
                "KILN_FUSED_DECODE_ROWS={v:?}: expected a row count (0 = off)"
            ))
        })
}

/// `KILN_PDL`: programmatic dependent launch on (unset, `1`, `true`, `on`) or off (`0`, `false`,
/// `off`).
pub fn pdl_from_env() -> Result<bool, BackendError> {
    super::super::launch::env_switch("KILN_PDL", true)
}

/// Which kernel runs the dense 16-bit matmuls of a backend (`KILN_DENSE_MATMUL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseMatmul {
    /// cuBLAS (`KILN_DENSE_MATMUL=cublas` / `0` / `false`; the default for f32 compute):
    /// fastest at prefill sizes, but its kernel and reduction order depend on the row count (not
    /// batch-invariant).
    Cublas,
    /// `dense_xwt` on CUDA cores (`fma`; also `1` / `true`, the switch's first meaning; the
    /// default below sm_80 with a 16-bit dtype).
    Fma,
    /// The tensor-core kernels (`mma`; the default on sm_80+ with a 16-bit dtype); `fma` on GPUs
    /// below sm_80.
    Mma,
}

impl DenseMatmul {
    /// The choice of `KILN_DENSE_MATMUL`; unset or empty: `default` (what
    /// [`DenseMatmul::default_for`] gives for the backend). An unknown value is an error (a typo
    /// must not silently change the numerics).
    pub fn from_env(default: DenseMatmul) -> Result<DenseMatmul, BackendError> {
        match std::env::var("KILN_DENSE_MATMUL") {
            Err(_) => Ok(default),
            Ok(v) => Self::parse(&v, default),
        }
    }

    /// The default when `KILN_DENSE_MATMUL` is unset, for kernels built for `arch` and compute
    /// dtype `dtype`: a batch-invariant kernel wherever one takes the dtype — `mma` (tensor
    /// cores) on sm_80+ and `fma` (CUDA cores) below sm_80 (V100 / T4: no `mma` kernels there;
    /// decode-sized steps cost about what cuBLAS's do, prefill-sized ones are several times
    /// slower, docs/benchmarks.md) for a 16-bit dtype; cuBLAS for f32 compute (no dense kernel
    /// takes f32), which is not batch-invariant. `KILN_DENSE_MATMUL=cublas` trades the
    /// invariance for cuBLAS's speed anywhere.
    pub fn default_for(arch: Arch, dtype: ComputeDType) -> DenseMatmul {
        match dtype {
            ComputeDType::F32 => DenseMatmul::Cublas,
            _ if arch.major >= 8 => DenseMatmul::Mma,
            _ => DenseMatmul::Fma,
        }
    }

    /// Parse a `KILN_DENSE_MATMUL` value (case-insensitive; empty: `default`).
    pub fn parse(v: &str, default: DenseMatmul) -> Result<DenseMatmul, BackendError> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" => Ok(default),
            "cublas" | "0" | "false" | "off" => Ok(DenseMatmul::Cublas),
            "fma" | "1" | "true" => Ok(DenseMatmul::Fma),
            "mma" => Ok(DenseMatmul::Mma),
            other => Err(BackendError::InvalidArgument(format!(
                "KILN_DENSE_MATMUL={other:?}: expected cublas, fma or mma"
            ))),
        }
    }
}
