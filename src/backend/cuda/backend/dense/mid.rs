//! Which `mma` kernel and tile take a step of at most [`MMA_SMALL_MAX_ROWS`] rows
//! (`KILN_DENSE_MID`, read at the backend's creation): a speed choice only, since every kernel
//! of the family and every tile give the same bits (dense.cu, "ONE NUMERIC PATH").
//!
//! The small kernel's tile covers 16 outputs × 8·rg rows (rg = 1, 2, 4, 8). Main picked the
//! tile by rows alone (8 → rg1, 16 → rg2, else rg4), so a 33–64-row step ran two 32-row tiles
//! and read every weight twice. Measured on the H200 (branch `mma64`, run 1, SmolLM2 shapes,
//! weights rotated past the L2): the best tile depends on the grid more than on the weight
//! reads. A small weight wants many blocks (o_proj 576 × 576 at 64 rows: rg1 3.4 µs, rg4 5.0,
//! rg8 5.1); a wide one few (gate|up 3072 × 576 at 64 rows: rg8 6.2, rg4 6.4, rg1 7.9). The
//! rule ([`MidRows::row_groups`]): the smallest rg whose grid stays within a warp budget
//! (`warps_per_sm` × SMs warps, 14 per SM by default), else the tile that covers the rows in
//! one block. The vocabulary-sized lm_head (49 152 × 576) is slow on every small tile at 32–64
//! rows (64 µs at 64 rows on rg8: each block re-reads all 64 rows of x for its 16 outputs) and
//! takes the pipelined GEMM from 17 rows ([`MidRows::gemm_takes`]; 32 µs at 64 rows).
//!
//! The fused ops with the RMSNorm prologue keep the rows rule (their prologue's cost grows with
//! the row blocks, unmeasured on finer tiles), with rg [`MidRows::rg_mid`] for 33–64 rows.

use super::options::MMA_SMALL_MAX_ROWS;
use crate::backend::BackendError;

/// The tile choice for steps of at most [`MMA_SMALL_MAX_ROWS`] rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MidRows {
    /// Launches without the norm prologue pick the smallest row group whose grid has at most
    /// this many warps per SM (`Some`, default 14: `auto` / `warpsN`), or the rows rule
    /// (`None`: `rg4` / `rg8`).
    pub warps_per_sm: Option<usize>,
    /// The rows rule's row group for 33–64 rows: 8 (the default: one 64-row tile) or 4 (main's:
    /// two 32-row tiles).
    pub rg_mid: usize,
    /// Unfused matmuls of 17–64 rows on weights with at least this many outputs take the
    /// pipelined GEMM (default 16 384: the lm_heads; `usize::MAX`: never, `nogemm`).
    pub gemm_n: usize,
    /// The fused ops with the RMSNorm prologue take steps of at most this many rows; larger
    /// fused steps run `rms_norm` and then the unfused op (the same bits). Default
    /// [`MMA_SMALL_MAX_ROWS`] (the fused layer's own bound, `KILN_FUSED_DECODE_ROWS`, is 16).
    pub norm_rows: usize,
    /// A 64-row tile takes its wide form (rg8w: 32 outputs per block, x read half as often;
    /// K ≤ 1024) for weights of at least this many outputs (`usize::MAX`, the default: never).
    pub wide_min_n: usize,
    /// The GPU's SMs (the warp budget's unit).
    pub sms: usize,
}

impl MidRows {
    /// The default on a GPU of `sms` SMs.
    pub fn new(sms: usize) -> MidRows {
        MidRows {
            warps_per_sm: Some(14),
            rg_mid: 8,
            gemm_n: 16_384,
            norm_rows: MMA_SMALL_MAX_ROWS,
            wide_min_n: usize::MAX,
            sms: sms.max(1),
        }
    }

    /// `KILN_DENSE_MID` on a GPU of `sms` SMs: unset or empty = [`MidRows::new`].
    pub fn from_env(sms: usize) -> Result<MidRows, BackendError> {
        match std::env::var("KILN_DENSE_MID") {
            Err(_) => Ok(MidRows::new(sms)),
            Ok(v) => MidRows::parse(&v, sms),
        }
    }

    /// Parse a `KILN_DENSE_MID` value, comma-separated: `auto` / `warpsN` (the warp budget, N
    /// per SM), `rg4` / `rg8` (the rows rule, with that row group for 33–64 rows: `rg4` is
    /// main's choice), `gemmN` / `nogemm` (the GEMM for 17–64 rows from N outputs, or never),
    /// `normN` (the norm prologue up to N rows), `wideN` (the wide 64-row tile from N outputs);
    /// e.g. `rg4,nogemm`. What is not named keeps its default; anything else is an error.
    pub fn parse(v: &str, sms: usize) -> Result<MidRows, BackendError> {
        let mut m = MidRows::new(sms);
        let bad = |p: &str| {
            BackendError::InvalidArgument(format!(
                "KILN_DENSE_MID={v:?}: {p:?} is not auto, warps<N>, rg4, rg8, gemm<N>, nogemm, \
                 norm<N> or wide<N>"
            ))
        };
        for p in v.split(',').map(|p| p.trim().to_ascii_lowercase()) {
            let num = |pre: &str| p.strip_prefix(pre).and_then(|n| n.parse::<usize>().ok());
            match p.as_str() {
                "" => {}
                "auto" => m.warps_per_sm = Some(14),
                "rg4" | "rg8" => {
                    m.warps_per_sm = None;
                    m.rg_mid = if p == "rg4" { 4 } else { 8 };
                }
                "nogemm" => m.gemm_n = usize::MAX,
                _ => {
                    if let Some(n) = num("warps").filter(|&n| n > 0) {
                        m.warps_per_sm = Some(n);
                    } else if let Some(n) = num("gemm") {
                        m.gemm_n = n;
                    } else if let Some(n) = num("norm") {
                        m.norm_rows = n.min(MMA_SMALL_MAX_ROWS);
                    } else if let Some(n) = num("wide") {
                        m.wide_min_n = n;
                    } else {
                        return Err(bad(&p));
                    }
                }
            }
        }
        Ok(m)
    }

    /// What the backend's name shows of it, e.g. ` [mma tiles: 14 warps/SM, gemm n>=16384]`.
    pub fn describe(self) -> String {
        let mut s = match self.warps_per_sm {
            Some(w) => format!(" [mma tiles: {w} warps/SM"),
            None => format!(" [mma tiles: by rows, rg{} at 33-64", self.rg_mid),
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

    /// The rows rule: the tile that covers `rows` rows in one block (1 up to 8 rows, 2 up to
    /// 16, 4 up to 32, then [`MidRows::rg_mid`]).
    pub fn rows_rule(self, rows: usize) -> usize {
        match rows {
            0..=8 => 1,
            9..=16 => 2,
            17..=32 => 4,
            _ => self.rg_mid,
        }
    }

    /// Row groups (of 8 rows) per tile of the small kernel for a step of `rows` rows on `n`
    /// outputs with `slices` K slices (warps per block); `norm`: a launch with the RMSNorm
    /// prologue (the rows rule). Otherwise, under the warp budget, the smallest of 1, 2, 4, 8
    /// whose grid (n / 16 × rows / 8rg blocks of `slices` warps) has at most
    /// `warps_per_sm × sms` warps, else the rows rule.
    pub fn row_groups(self, rows: usize, n: usize, slices: usize, norm: bool) -> usize {
        let Some(w) = self.warps_per_sm.filter(|_| !norm) else {
            return self.rows_rule(rows);
        };
        let budget = w * self.sms;
        [1, 2, 4, 8]
            .into_iter()
            .find(|&rg| n.div_ceil(16) * rows.div_ceil(8 * rg) * slices <= budget)
            .unwrap_or_else(|| self.rows_rule(rows))
    }

    /// Whether an unfused matmul of `rows` rows (≤ [`MMA_SMALL_MAX_ROWS`]) on `n` outputs takes
    /// the pipelined GEMM rather than the small kernel.
    pub fn gemm_takes(self, rows: usize, n: usize) -> bool {
        rows > 16 && n >= self.gemm_n
    }
}
