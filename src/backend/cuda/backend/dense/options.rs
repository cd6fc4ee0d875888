//! The switches of the batch-invariant dense matmuls (read once, at the backend's creation):
//! `KILN_DENSE_MATMUL` ([`DenseMatmul`]), `KILN_FUSED_DECODE_ROWS` (the fused decode layer's
//! bound, [`fused_rows_from_env`]), `KILN_PDL` ([`pdl_from_env`]) and `KILN_DENSE_MID`
//! ([`MidRows`]: which `mma` kernel takes the 33–64-row steps). Moved out of `dense.rs` (the
//! launches stay there); none of them changes a row's bits under `mma`, only which kernel (or
//! which fused / unfused composition) computes them.

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

/// The same under `KILN_DENSE_MATMUL=mma` (the default on sm_80+ with 16-bit compute): the whole
/// range of the small kernel. There the unfused ops run the same `mma` kernels, so every fused
/// step is batch-invariant with the unfused ones; main fused up to 16 rows (`inv6`), 17–64-row
/// steps now take the fused layer too, on the 32-row (rg4) and 64-row (rg8) tiles of
/// [`MidRows`] (docs/benchmarks.md, branch `mma64`).
pub const DEFAULT_FUSED_DECODE_ROWS_MMA: usize = 64;

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

/// Which `mma` kernel takes the steps of 33–64 rows (`KILN_DENSE_MID`, read at the backend's
/// creation; a speed choice only: every kernel of the family gives the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MidRows {
    /// The small kernel's row group for 33–64 rows is 8 (one 64-row tile per 16 outputs, every
    /// weight read once) for weights of at least this many outputs, else 4 (two 32-row tiles,
    /// each weight read twice, twice the blocks: main's). 0 (the default): always 8;
    /// `usize::MAX`: always 4.
    pub rg8_min_n: usize,
    /// Unfused 33–64-row matmuls of weights with at least this many outputs take the pipelined
    /// GEMM instead (`usize::MAX`: never, the default).
    pub gemm_n: usize,
    /// The fused ops with the RMSNorm prologue (`norm_matmul`, `norm_gate_up_swiglu`,
    /// `norm_matmul_rope_write`) take steps of at most this many rows; larger fused steps run
    /// `rms_norm` and then the unfused op (the same bits: the prologue and `rms_norm.cu` share
    /// one order). Every block of the prologue re-reads its rows' f32 residual twice (sum of
    /// squares, then the operand), which grows with rows × n / 16 blocks. Default
    /// [`MMA_SMALL_MAX_ROWS`].
    pub norm_rows: usize,
    /// 33–64-row steps on the 64-row tile take its wide form (rg8w: 32 outputs per block, x
    /// read half as often; K ≤ 1024) for weights of at least this many outputs (`usize::MAX`:
    /// never).
    pub wide_min_n: usize,
}

impl Default for MidRows {
    fn default() -> Self {
        MidRows {
            rg8_min_n: 0,
            gemm_n: usize::MAX,
            norm_rows: MMA_SMALL_MAX_ROWS,
            wide_min_n: usize::MAX,
        }
    }
}

impl MidRows {
    /// `KILN_DENSE_MID`: unset or empty = [`MidRows::default`].
    pub fn from_env() -> Result<MidRows, BackendError> {
        match std::env::var("KILN_DENSE_MID") {
            Err(_) => Ok(MidRows::default()),
            Ok(v) => MidRows::parse(&v),
        }
    }

    /// Parse a `KILN_DENSE_MID` value: comma-separated `rg8` / `rg4` / `rg8nN` (the row group:
    /// always 8, always 4, 8 from N outputs), `gemm`
    /// (every weight) / `gemmN` (weights of at least N outputs) and `normN` (the norm prologue
    /// up to N rows), `wideN` (the wide 64-row tile from N outputs), e.g. `rg8,gemm16384,norm32`;
    /// what is not named keeps its default. Anything else is an error.
    pub fn parse(v: &str) -> Result<MidRows, BackendError> {
        let mut m = MidRows::default();
        let bad = |p: &str| {
            BackendError::InvalidArgument(format!(
                "KILN_DENSE_MID={v:?}: {p:?} is not rg4, rg8, rg8n<N>, gemm, gemm<N>, norm<N> or wide<N>"
            ))
        };
        for p in v.split(',').map(|p| p.trim().to_ascii_lowercase()) {
            match p.as_str() {
                "" => {}
                "rg4" => m.rg8_min_n = usize::MAX,
                "rg8" => m.rg8_min_n = 0,
                "gemm" => m.gemm_n = 0,
                _ => {
                    let num = |pre: &str| p.strip_prefix(pre).and_then(|n| n.parse::<usize>().ok());
                    if let Some(n) = num("rg8n") {
                        m.rg8_min_n = n;
                    } else if let Some(n) = num("gemm") {
                        m.gemm_n = n;
                    } else if let Some(n) = num("wide") {
                        m.wide_min_n = n;
                    } else if let Some(n) = num("norm") {
                        m.norm_rows = n.min(MMA_SMALL_MAX_ROWS);
                    } else {
                        return Err(bad(&p));
                    }
                }
            }
        }
        Ok(m)
    }

    /// What the backend's name shows of it: ` [33-64 rows: rg8]` (`rg4`, `rg8 n>=N`; and
    /// `, gemm n>=N`, `, norm <= N rows` where not the default).
    pub fn describe(self) -> String {
        let mut s = match self.rg8_min_n {
            0 => " [33-64 rows: rg8".to_string(),
            usize::MAX => " [33-64 rows: rg4".to_string(),
            n => format!(" [33-64 rows: rg8 n>={n}"),
        };
        if self.gemm_n != usize::MAX {
            s += &format!(", gemm n>={}", self.gemm_n);
        }
        if self.norm_rows != MMA_SMALL_MAX_ROWS {
            s += &format!(", norm <= {} rows", self.norm_rows);
        }
        if self.wide_min_n != usize::MAX {
            s += &format!(", wide n>={}", self.wide_min_n);
        }
        s + "]"
    }

    /// Row groups (of 8 rows) per tile of the small kernel for a step of `rows` rows on `n`
    /// outputs: 1 up to 8 rows, 2 up to 16, 4 up to 32, then 8 or 4 by
    /// [`MidRows::rg8_min_n`].
    pub fn row_groups(self, rows: usize, n: usize) -> usize {
        match rows {
            0..=8 => 1,
            9..=16 => 2,
            17..=32 => 4,
            _ if n >= self.rg8_min_n => 8,
            _ => 4,
        }
    }

    /// Whether an unfused matmul of `rows` rows (≤ [`MMA_SMALL_MAX_ROWS`]) on `n` outputs takes
    /// the pipelined GEMM rather than the small kernel.
    pub fn gemm_takes(self, rows: usize, n: usize) -> bool {
        rows > 32 && n >= self.gemm_n
    }
}
