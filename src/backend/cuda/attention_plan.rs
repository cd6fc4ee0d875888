//! How one step's attention is split between the two CUDA attention kernels (kernels/attention.cu).
//!
//! Sequences with more than one new token (prefill chunks) go to the tiled flash-style kernel
//! `attention_prefill_*`: their new tokens are cut into tiles of at most [`TILE_TOKENS`]
//! consecutive tokens, and each tile's K/V tiles are staged in shared memory once for all its
//! queries and all query heads of a GQA group. One-token sequences (decode) go to the split-K
//! kernel `attention_*`, which parallelizes over the keys instead. The two launches cover disjoint
//! token sets, so a mixed step runs both.
//!
//! One-token sequences (and, for [`crate::backend::cuda::CudaBackend::paged_attention_split_k`],
//! every token) go to the decode kernel of `kernels/attention_decode.cu` when the shapes fit
//! [`DecodeVariant`], else to the older split-K kernels; its split of the keys is
//! [`decode_part_len`] (rows up to [`DECODE_SINGLE_PART_KEYS`] keys in one part), that of its
//! tensor-core twin (attention_decode_mma.cu) [`DecodeSplit`] ([`DecodeSplit::for_shape`] by
//! default), and [`DecodeOptions`] says how it is launched (the merge of a row's parts in the same
//! launch, PDL, the split).
//!
//! Everything here is host-side and built once per step in `prepare_step`: the tile table and the
//! split-K token list are uploaded together as one `i32` buffer (tiles first).

use crate::backend::StepInput;

/// Query tokens per prefill tile (`FA_TILE_TOKENS` in attention.cu).
pub const TILE_TOKENS: usize = 32;
/// Keys per K/V tile of the prefill kernel (`FA_KEYS`).
pub const TILE_KEYS: usize = 32;
/// Threads per block of the prefill kernel (`FA_WARPS * 32`).
pub const PREFILL_THREADS: u32 = 4 * 32;
/// `i32`s per tile in the uploaded table: sequence, first token, tokens, first position.
pub const TILE_FIELDS: usize = 4;
/// Dynamic shared memory every device gives without an opt-in.
pub const DEFAULT_SHARED_BYTES: usize = 48 * 1024;

/// One step's attention layout, in host memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttentionPlan {
    /// `[n_tiles, TILE_FIELDS]`: (sequence index, index of the tile's first token, tokens in the
    /// tile, absolute position of its first token), latest last-position first (the longest
    /// blocks start first).
    pub tiles: Vec<u32>,
    /// Tokens of one-token sequences, for the split-K kernel.
    pub split_tokens: Vec<u32>,
    /// Largest context (`cached_len + len`) among the split-K tokens' sequences.
    pub split_max_context: usize,
}

impl AttentionPlan {
    /// Tiles for every sequence with `len > 1`, the rest as split-K tokens.
    pub fn new(step: &StepInput) -> AttentionPlan {
        let mut tiles: Vec<[u32; TILE_FIELDS]> = Vec::new();
        let mut plan = AttentionPlan::default();
        for (i, s) in step.seqs.iter().enumerate() {
            match s.len {
                0 => {}
                1 => {
                    plan.split_tokens.push(s.token_start as u32);
                    plan.split_max_context = plan.split_max_context.max(s.context_len());
                }
                len => {
                    for off in (0..len).step_by(TILE_TOKENS) {
                        let n = TILE_TOKENS.min(len - off);
                        tiles.push([
                            i as u32,
                            (s.token_start + off) as u32,
                            n as u32,
                            (s.cached_len + off) as u32,
                        ]);
                    }
                }
            }
        }
        // Causal work grows with the tile's last position: schedule the longest tiles first.
        tiles.sort_by_key(|t| std::cmp::Reverse(t[3] + t[2]));
        plan.tiles = tiles.into_iter().flatten().collect();
        plan
    }

    /// Number of prefill tiles.
    pub fn num_tiles(&self) -> usize {
        self.tiles.len() / TILE_FIELDS
    }

    /// The uploaded form: tiles, then split-K tokens.
    pub fn packed(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(self.tiles.len() + self.split_tokens.len());
        v.extend_from_slice(&self.tiles);
        v.extend_from_slice(&self.split_tokens);
        v
    }
}

/// A compiled size class of the prefill kernel (template `DPL` in attention.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillVariant {
    /// Entry-point suffix, `d64 | d128 | d256`.
    pub suffix: &'static str,
    /// Largest head_dim it holds (32 dims per lane × DPL).
    pub max_head_dim: usize,
    /// Query rows per block (`FaShape<DPL>::ROWS`).
    pub rows: usize,
}

impl PrefillVariant {
    /// Every variant, smallest first.
    pub const ALL: [PrefillVariant; 3] = [
        PrefillVariant {
            suffix: "d64",
            max_head_dim: 64,
            rows: 32,
        },
        PrefillVariant {
            suffix: "d128",
            max_head_dim: 128,
            rows: 32,
        },
        PrefillVariant {
            suffix: "d256",
            max_head_dim: 256,
            rows: 16,
        },
    ];

    /// The variant for `head_dim`, or `None` when the prefill kernel does not support it (head_dim
    /// must be a positive multiple of 4 and at most 256); the split-K kernel then takes every token.
    pub fn for_head_dim(head_dim: usize) -> Option<PrefillVariant> {
        if head_dim == 0 || !head_dim.is_multiple_of(4) {
            return None;
        }
        Self::ALL.into_iter().find(|v| head_dim <= v.max_head_dim)
    }

    /// Dynamic shared memory of one block, bytes: Q rows, one K/V tile (rows padded to a multiple of
    /// 32 plus 4 floats) and P, all f32 (see attention.cu).
    pub fn shared_bytes(&self, head_dim: usize) -> usize {
        let kstride = head_dim.div_ceil(32) * 32 + 4;
        4 * (self.rows * head_dim + TILE_KEYS * kstride + self.rows * TILE_KEYS)
    }

    /// Blocks along the grid's z axis: row chunks of one tile's `TILE_TOKENS * group` rows.
    pub fn row_chunks(&self, group: usize) -> usize {
        (TILE_TOKENS * group).div_ceil(self.rows)
    }

    /// Entry point name for compute dtype `t` and KV storage `kv`.
    pub fn kernel_name(&self, t: &str, kv: &str) -> String {
        format!("attention_prefill_{t}_{kv}_{}", self.suffix)
    }
}

/// Threads per block of the decode kernel (`DEC_WARPS * 32` in attention_decode.cu).
pub const DECODE_THREADS: u32 = 4 * 32;
/// Fewest keys per part of the decode kernel (`DEC_MIN_PART`).
pub const DECODE_MIN_PART: usize = 128;
/// Most parts a row's keys are split into (`DEC_MAX_PARTS`).
pub const DECODE_MAX_PARTS: usize = 128;
/// Part lengths are multiples of this (`DEC_PART_ALIGN`).
pub const DECODE_PART_ALIGN: usize = 64;
/// Blocks the decode launch aims for: about two waves of the 4 blocks per SM the kernel's
/// register bound (`DEC_MIN_BLOCKS`) lets an H200's 132 SMs hold; the split of the keys does not
/// depend on it, only how many blocks share a row's parts.
pub const DECODE_TARGET_BLOCKS: usize = 1024;

/// Rows of at most this many keys are one part of the decode kernel (`single_keys`): one block
/// per KV head walks them in one pass and writes the output, with no partials and no merge. At
/// SmolLM2's shape a 150-key row was 2 parts of 128 (6 blocks, a merge); see docs/benchmarks.md
/// ("single-pass short decode rows").
pub const DECODE_SINGLE_PART_KEYS: usize = 256;

/// Most merge work (`group · head_dim · slots` partial values) the in-launch merge takes: one
/// block per (row, KV head) merges every part of its group's heads, so wide groups of wide heads
/// with many parts (the 27B's 6 × 256 at 8K keys, 64 slots: 98 304) are slower merged in one
/// block than by the combine kernel's block per (row, query head) (60.6 against 50.1 µs at one
/// row; docs/benchmarks.md). A function of the shapes and the slot bound only, so a graph's
/// launches never follow the data; the bits are the same either way.
pub const DECODE_MERGE_IN_LAUNCH_MAX: usize = 32 * 1024;

/// Whether the in-launch merge takes a launch of this group, head width and slot count.
pub fn decode_merge_in_launch(group: usize, head_dim: usize, slots: usize) -> bool {
    group * head_dim * slots <= DECODE_MERGE_IN_LAUNCH_MAX
}

/// How [`crate::backend::cuda::CudaBackend`] runs the decode kernel. The default is what every
/// step uses; the others exist for the before / after comparisons and the equality tests
/// (`tests/cuda_attention.rs`, `tests/cuda_long_context.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Rows of at most this many keys are one part ([`DECODE_SINGLE_PART_KEYS`]; 0 = the split
    /// rule alone, as before the single-pass rule).
    pub single_part_keys: usize,
    /// Merge a row's parts in the same launch (the last block of a (row, KV head) to finish
    /// merges) instead of the second `attention_decode_combine_*` launch, where
    /// [`decode_merge_in_launch`] takes the shapes. Same bits either way.
    pub merge_in_launch: bool,
    /// Launch with programmatic dependent launch when the backend's kernels carry the wait
    /// (sm_90+ and `KILN_PDL` on); `false` never does.
    pub pdl: bool,
    /// Under PDL, stage a block's first K/V tile before `griddepcontrol.wait` when it holds only
    /// earlier steps' keys (attention_decode.cu's header). Same bits either way.
    pub prefetch: bool,
    /// The split of long rows for the tensor-core kernel (attention_decode_mma.cu;
    /// attention_decode.cu keeps its compile-time rule, [`DecodeSplit::OLD`]); `None` is
    /// [`DecodeSplit::for_shape`] of the launch's shapes. A constant of a model's launches:
    /// every row's split follows its context alone.
    pub mma_split: Option<DecodeSplit>,
    /// Launch the tensor-core kernel as before this option existed, whatever the fields above
    /// say: [`DecodeSplit::OLD`] with no single-part bound, no PDL, no prefetch, partials merged
    /// by attention_decode.cu's combine. For the before / after timings only (its merge sums in
    /// another order: not the bits of the other launches). No effect on attention_decode.cu.
    pub mma_legacy: bool,
    /// Measurement only (the timeline of `tests/cuda_long_context.rs`): run only this launch of
    /// the tensor-core decode (its kernel or its combine), so the output is not the attention.
    pub mma_only: Option<MmaLaunch>,
}

/// One of the two launches of the tensor-core decode ([`DecodeOptions::mma_only`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaLaunch {
    /// `attention_decode_mma_*` (writes the partials, or the output of one-part rows).
    Main,
    /// `attention_decode_mma_combine_*` (merges the partials).
    Combine,
}

/// How a long row's keys are cut into parts (the tensor-core decode kernel's `dmma_part_len`): a
/// row of at most `single_keys` keys (the launch's `single_part_keys`) is one part, a longer one
/// `ceil(ctx / max_parts)` keys rounded up to [`DECODE_PART_ALIGN`], at least `min_part` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeSplit {
    /// Fewest keys per part.
    pub min_part: usize,
    /// Most parts per row (at most [`DECODE_MMA_MAX_SLOTS`]).
    pub max_parts: usize,
}

/// Most parts a row of the tensor-core kernel may have (`DMMA_MAX_SLOTS`: its combine's registers).
pub const DECODE_MMA_MAX_SLOTS: usize = 256;

/// Blocks one long row of the tensor-core kernel aims for over all its KV heads
/// ([`DecodeSplit::for_shape`]).
pub const DECODE_MMA_ROW_BLOCKS: usize = 256;

impl DecodeSplit {
    /// attention_decode.cu's rule ([`DECODE_MIN_PART`], [`DECODE_MAX_PARTS`]), the tensor-core
    /// kernel's before this type existed.
    pub const OLD: DecodeSplit = DecodeSplit {
        min_part: DECODE_MIN_PART,
        max_parts: DECODE_MAX_PARTS,
    };
    /// The tensor-core kernel's split for a model with `n_kv_heads` KV heads of `head_dim` and KV
    /// elements of `kv_bytes` (the default): parts of at least [`DECODE_MIN_PART`] keys, at most
    /// `blocks / n_kv_heads` parts per row rounded down to a power of two (8..=128), where
    /// `blocks` is [`DECODE_MMA_ROW_BLOCKS`] (256: two blocks per SM of an H100 / H200, one wave),
    /// twice that for fp8 at head_dim 256 (blocks of 2 warps that fit 4 per SM, and whose fp8
    /// widening wants more warps in flight). A function of the model's shapes alone (never of the
    /// batch or the device), so a row's bits still follow its context only. On the H200
    /// (docs/benchmarks.md, `lctx`, one row): the 27B shape (4 KV heads) at 32K keys, bf16, 41 µs
    /// in 64 parts against 51 µs in the 128 of [`DecodeSplit::OLD`] (512 blocks: two waves at 3
    /// blocks per SM), e5m2 27 µs in 128 parts against 37 µs in 64; the Qwen3-like 8 KV heads at
    /// 8K 13 µs in 32 parts against 16 µs in 64. Fewer, longer parts also write fewer partials at
    /// 16 / 64 rows.
    pub fn for_shape(n_kv_heads: usize, head_dim: usize, kv_bytes: usize) -> DecodeSplit {
        let blocks = if kv_bytes == 1 && head_dim >= 256 {
            2 * DECODE_MMA_ROW_BLOCKS
        } else {
            DECODE_MMA_ROW_BLOCKS
        };
        let per = (blocks / n_kv_heads.max(1)).clamp(8, 128);
        DecodeSplit {
            min_part: DECODE_MIN_PART,
            max_parts: 1 << per.ilog2(),
        }
    }

    /// Keys per part for a row of `ctx` keys (rows of at most `single_keys` keys: one part).
    pub fn part_len(&self, ctx: usize, single_keys: usize) -> usize {
        if ctx <= single_keys {
            return ctx.max(1);
        }
        ctx.div_ceil(self.max_parts)
            .div_ceil(DECODE_PART_ALIGN)
            .saturating_mul(DECODE_PART_ALIGN)
            .max(self.min_part)
    }

    /// Parts of a row of `ctx` keys.
    pub fn parts(&self, ctx: usize, single_keys: usize) -> usize {
        ctx.div_ceil(self.part_len(ctx, single_keys)).max(1)
    }

    /// Partial slots per (row, head) for rows of at most `max_ctx` keys: `ceil(max_ctx /
    /// min_part)` capped at `max_parts` (a bound on every row's parts; the count itself is not
    /// monotonic in the context), 1 when every row is one part.
    pub fn slots(&self, max_ctx: usize, single_keys: usize) -> usize {
        if max_ctx <= single_keys {
            return 1;
        }
        max_ctx.div_ceil(self.min_part).clamp(1, self.max_parts)
    }

    /// Whether the tensor-core kernel and its combine take this split (0 < min_part, 1 ≤ max_parts
    /// ≤ [`DECODE_MMA_MAX_SLOTS`]).
    pub fn is_valid(&self) -> bool {
        self.min_part > 0 && (1..=DECODE_MMA_MAX_SLOTS).contains(&self.max_parts)
    }
}

impl Default for DecodeOptions {
    fn default() -> DecodeOptions {
        DecodeOptions {
            single_part_keys: DECODE_SINGLE_PART_KEYS,
            merge_in_launch: true,
            pdl: true,
            prefetch: true,
            mma_split: None,
            mma_legacy: false,
            mma_only: None,
        }
    }
}

impl DecodeOptions {
    /// The decode launch as it was before the single-pass rule, the in-launch merge, PDL and the
    /// prefetch before the wait.
    pub const TWO_PASS: DecodeOptions = DecodeOptions {
        single_part_keys: 0,
        merge_in_launch: false,
        pdl: false,
        prefetch: false,
        mma_split: None,
        mma_legacy: false,
        mma_only: None,
    };

    /// The default launch with the tensor-core kernel launched as before this branch
    /// ([`DecodeOptions::mma_legacy`]): the "before" of the speed comparisons.
    pub const MMA_LEGACY: DecodeOptions = DecodeOptions {
        single_part_keys: DECODE_SINGLE_PART_KEYS,
        merge_in_launch: true,
        pdl: true,
        prefetch: true,
        mma_split: Some(DecodeSplit::OLD),
        mma_legacy: true,
        mma_only: None,
    };
}

/// Keys per part for a row of `ctx` keys (`decode_part_len` in attention_decode.cu): a function
/// of the context (and the constant `single_keys`) alone, so a row's bits never depend on its
/// batch, grid or graph padding. A row of at most `single_keys` keys is one part.
pub fn decode_part_len(ctx: usize, single_keys: usize) -> usize {
    if ctx <= single_keys {
        return ctx.max(1);
    }
    ctx.div_ceil(DECODE_MAX_PARTS)
        .div_ceil(DECODE_PART_ALIGN)
        .saturating_mul(DECODE_PART_ALIGN)
        .max(DECODE_MIN_PART)
}

/// Parts a row of `ctx` keys is split into (at most [`DECODE_MAX_PARTS`]).
pub fn decode_parts(ctx: usize, single_keys: usize) -> usize {
    ctx.div_ceil(decode_part_len(ctx, single_keys)).max(1)
}

/// Partial slots per (row, head) for rows of at most `max_ctx` keys: a bound on the parts any of
/// them can have (1 = no partials, the kernel writes the output directly), whatever
/// `single_keys` (that rule only merges parts). Not `decode_parts(max_ctx, 0)`: the part count is not monotonic in the context (16 384 keys make 128
/// parts of 128, 16 385 keys 86 parts of 192), so the bound is `ceil(max_ctx / DECODE_MIN_PART)`
/// capped at [`DECODE_MAX_PARTS`].
pub fn decode_slots(max_ctx: usize) -> usize {
    max_ctx.div_ceil(DECODE_MIN_PART).clamp(1, DECODE_MAX_PARTS)
}

/// The grid's z extent: blocks per (row, KV head), each taking every z-th part; enough blocks to
/// fill the GPU, never more than the parts there can be (1 when every row is one part).
pub fn decode_grid_z(rows: usize, kv_heads: usize, max_ctx: usize, single_keys: usize) -> usize {
    if max_ctx <= single_keys {
        return 1;
    }
    DECODE_TARGET_BLOCKS
        .div_ceil((rows * kv_heads).max(1))
        .clamp(1, decode_slots(max_ctx))
}

/// A compiled size class of the decode kernel (templates `DV`, `GB` in attention_decode.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeVariant {
    /// Widest head it holds (`d64 | d128 | d256`).
    pub max_head_dim: usize,
    /// Largest GQA group (query heads per KV head) it holds (`g4 | g8`).
    pub max_group: usize,
}

impl DecodeVariant {
    /// Head-width classes, smallest first.
    pub const DIMS: [usize; 3] = [64, 128, 256];
    /// Group classes, smallest first.
    pub const GROUPS: [usize; 2] = [4, 8];

    /// The variant for these shapes, or `None` when the decode kernel does not take them (head_dim
    /// must be a positive multiple of 8 up to 256, the group at most 8): the older split-K kernels
    /// then run.
    pub fn for_shape(head_dim: usize, group: usize) -> Option<DecodeVariant> {
        if head_dim == 0 || !head_dim.is_multiple_of(8) || group == 0 {
            return None;
        }
        let max_head_dim = *Self::DIMS.iter().find(|&&d| head_dim <= d)?;
        let max_group = *Self::GROUPS.iter().find(|&&g| group <= g)?;
        Some(DecodeVariant {
            max_head_dim,
            max_group,
        })
    }

    /// Every variant, in the order of the handles (`Kernels::attention_decode`).
    pub fn all() -> impl Iterator<Item = DecodeVariant> {
        Self::DIMS.into_iter().flat_map(|d| {
            Self::GROUPS.into_iter().map(move |g| DecodeVariant {
                max_head_dim: d,
                max_group: g,
            })
        })
    }

    /// Position in [`DecodeVariant::all`].
    pub fn index(&self) -> usize {
        let d = Self::DIMS.iter().position(|&d| d == self.max_head_dim);
        let g = Self::GROUPS.iter().position(|&g| g == self.max_group);
        d.unwrap_or(0) * Self::GROUPS.len() + g.unwrap_or(0)
    }

    /// Entry point name for compute dtype `t` and KV storage `kv`.
    pub fn kernel_name(&self, t: &str, kv: &str) -> String {
        format!(
            "attention_decode_{t}_{kv}_d{}_g{}",
            self.max_head_dim, self.max_group
        )
    }
}

#[cfg(test)]
mod tests;
