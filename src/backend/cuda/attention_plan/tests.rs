//! Tests of the step's attention plan: tiles, the decode split and the kernel variants.

use super::*;
use crate::backend::StepSeq;

fn seq(token_start: usize, len: usize, cached_len: usize) -> StepSeq {
    StepSeq {
        token_start,
        len,
        cached_len,
        block_table: vec![0; (cached_len + len).div_ceil(16)],
        state_slot: None,
    }
}

fn step(seqs: Vec<StepSeq>) -> StepInput {
    let n = seqs.iter().map(|s| s.len).sum();
    StepInput {
        token_ids: vec![0; n],
        positions: vec![0; n],
        slot_mapping: vec![0; n],
        seqs,
        logit_rows: vec![],
        block_size: 16,
    }
}

#[test]
fn prefill_chunks_become_tiles_and_decodes_split_tokens() {
    // A decode, a 70-token chunk after 700 cached tokens, an empty slice, another decode.
    let s = step(vec![
        seq(0, 1, 5),
        seq(1, 70, 700),
        seq(71, 0, 3),
        seq(71, 1, 900),
    ]);
    let p = AttentionPlan::new(&s);
    assert_eq!(p.split_tokens, vec![0, 71]);
    assert_eq!(p.split_max_context, 901);
    assert_eq!(p.num_tiles(), 3);
    // Latest first: tokens 65..71 (positions 764..770), then 33.., then 1..
    assert_eq!(
        p.tiles,
        vec![1, 65, 6, 764, 1, 33, 32, 732, 1, 1, 32, 700],
        "(seq, first token, tokens, first position) per tile"
    );
    let packed = p.packed();
    assert_eq!(&packed[12..], &[0, 71]);
}

#[test]
fn every_prefill_token_is_in_exactly_one_tile() {
    for len in [2usize, 17, 31, 32, 33, 64, 300, 1100] {
        let p = AttentionPlan::new(&step(vec![seq(0, len, 7)]));
        let mut covered = vec![0u32; len];
        for t in p.tiles.chunks(TILE_FIELDS) {
            assert!(t[2] >= 1 && t[2] as usize <= TILE_TOKENS);
            assert_eq!(t[3], t[1] + 7, "position = cached_len + offset");
            for tok in t[1]..t[1] + t[2] {
                covered[tok as usize] += 1;
            }
        }
        assert!(covered.iter().all(|&c| c == 1), "len {len}");
        assert!(p.split_tokens.is_empty());
    }
}

#[test]
fn variants_cover_head_dims_up_to_256_within_shared_memory_limits() {
    assert_eq!(
        PrefillVariant::for_head_dim(64).map(|v| v.suffix),
        Some("d64")
    );
    assert_eq!(
        PrefillVariant::for_head_dim(80).map(|v| v.suffix),
        Some("d128")
    );
    assert_eq!(
        PrefillVariant::for_head_dim(128).map(|v| v.suffix),
        Some("d128")
    );
    assert_eq!(
        PrefillVariant::for_head_dim(256).map(|v| v.suffix),
        Some("d256")
    );
    assert_eq!(PrefillVariant::for_head_dim(258), None);
    assert_eq!(PrefillVariant::for_head_dim(66), None);
    assert_eq!(PrefillVariant::for_head_dim(0), None);
    // The byte counts documented in attention.cu; every one fits sm_75's 64 KB opt-in limit.
    let bytes: Vec<usize> = PrefillVariant::ALL
        .iter()
        .map(|v| v.shared_bytes(v.max_head_dim))
        .collect();
    assert_eq!(bytes, vec![20992, 37376, 51712]);
    assert!(bytes.iter().all(|&b| b <= 64 * 1024));
    let d256 = PrefillVariant::ALL[2];
    assert_eq!(d256.row_chunks(4), 8);
    assert_eq!(PrefillVariant::ALL[1].row_chunks(3), 3);
    assert_eq!(
        d256.kernel_name("bf16", "e5m2"),
        "attention_prefill_bf16_e5m2_d256"
    );
}

#[test]
fn decode_parts_cover_the_context_within_the_bounds() {
    for ctx in (1..3000).chain([8191, 8192, 8193, 32768, 100_000, 262_144]) {
        let len = decode_part_len(ctx, 0);
        let parts = decode_parts(ctx, 0);
        assert!(len >= DECODE_MIN_PART && len.is_multiple_of(DECODE_PART_ALIGN));
        assert!((1..=DECODE_MAX_PARTS).contains(&parts), "ctx {ctx}");
        // Every key in exactly one part: the last part is non-empty, none past it.
        assert!((parts - 1) * len < ctx && parts * len >= ctx, "ctx {ctx}");
        // Slots for a bound cover every row up to it (the part count itself is not monotonic).
        assert!(decode_slots(ctx) >= parts && decode_slots(ctx + 1) >= decode_slots(ctx));
        // The single-pass rule: one part up to the bound, the split rule above it.
        let single = DECODE_SINGLE_PART_KEYS;
        let parts1 = decode_parts(ctx, single);
        if ctx <= single {
            assert_eq!(
                (parts1, decode_part_len(ctx, single)),
                (1, ctx),
                "ctx {ctx}"
            );
        } else {
            assert_eq!(parts1, parts, "ctx {ctx}");
        }
        assert!(decode_slots(ctx) >= parts1);
    }
    assert_eq!(decode_parts(1, 0), 1);
    assert_eq!(decode_parts(128, 0), 1);
    assert_eq!(decode_parts(129, 0), 2);
    assert_eq!(decode_parts(150, 0), 2);
    assert_eq!(decode_parts(150, DECODE_SINGLE_PART_KEYS), 1);
    assert_eq!(decode_parts(257, DECODE_SINGLE_PART_KEYS), 3);
    assert_eq!(decode_part_len(8192, 0), 128);
    assert_eq!(decode_parts(8192, 0), 64);
    assert_eq!(decode_part_len(32768, 0), 256);
    assert_eq!(decode_parts(32768, 0), 128);
    assert_eq!(decode_parts(100_000, 0), 121);
    assert_eq!((decode_parts(16384, 0), decode_parts(16385, 0)), (128, 86));
    assert_eq!(decode_slots(16385), 128);
}

#[test]
fn decode_splits_cover_the_context_and_old_is_the_decode_rule() {
    let splits = [
        DecodeSplit::OLD,
        DecodeSplit::for_shape(4, 256, 2),
        DecodeSplit::for_shape(4, 256, 1),
        DecodeSplit::for_shape(8, 128, 1),
        DecodeSplit {
            min_part: 128,
            max_parts: 96,
        },
        DecodeSplit {
            min_part: 64,
            max_parts: 256,
        },
        DecodeSplit {
            min_part: 256,
            max_parts: 64,
        },
    ];
    for split in splits {
        assert!(split.is_valid());
        for single in [0, DECODE_SINGLE_PART_KEYS] {
            for ctx in (1..3000).chain([8191, 8192, 8193, 32768, 100_000, 262_144]) {
                let (len, parts) = (split.part_len(ctx, single), split.parts(ctx, single));
                assert!(
                    (1..=split.max_parts).contains(&parts),
                    "{split:?} ctx {ctx}"
                );
                assert!(
                    (parts - 1) * len < ctx && parts * len >= ctx,
                    "{split:?} ctx {ctx}"
                );
                if ctx <= single {
                    assert_eq!(parts, 1);
                } else {
                    assert!(len >= split.min_part && len.is_multiple_of(DECODE_PART_ALIGN));
                }
                // Slots for a bound cover every row up to it.
                assert!(split.slots(ctx, single) >= parts, "{split:?} ctx {ctx}");
                assert!(split.slots(ctx + 1, single) >= split.slots(ctx, single));
            }
        }
    }
    // OLD is attention_decode.cu's rule, part for part and slot for slot.
    for ctx in (1..5000).chain([8192, 16385, 32768, 131_072]) {
        for single in [0, DECODE_SINGLE_PART_KEYS] {
            let old = DecodeSplit::OLD;
            assert_eq!(old.part_len(ctx, single), decode_part_len(ctx, single));
            let slots = if ctx <= single { 1 } else { decode_slots(ctx) };
            assert_eq!(old.slots(ctx, single), slots);
        }
    }
    let p = |min_part, max_parts, ctx| {
        DecodeSplit {
            min_part,
            max_parts,
        }
        .parts(ctx, 0)
    };
    assert_eq!((p(128, 96, 8192), p(128, 96, 32768)), (64, 86));
    assert_eq!((p(64, 256, 8192), p(64, 256, 32768)), (128, 256));
    assert!(!DecodeSplit {
        min_part: 64,
        max_parts: 257
    }
    .is_valid());
    // The per-shape default: 27B (4 KV heads × 256) 64 parts (fp8: 128), Qwen3-like (8 ×
    // 128) 32, MQA 128.
    let f = |h, d, b| DecodeSplit::for_shape(h, d, b).max_parts;
    assert_eq!(
        (f(4, 256, 2), f(4, 256, 1), f(8, 128, 2), f(8, 128, 1)),
        (64, 128, 32, 32)
    );
    assert_eq!(
        (f(1, 128, 2), f(3, 128, 2), f(32, 128, 2), f(64, 256, 1)),
        (128, 64, 8, 8)
    );
    for h in 1..100 {
        for (d, b) in [(128, 2), (256, 2), (128, 1), (256, 1)] {
            let s = DecodeSplit::for_shape(h, d, b);
            assert!(s.is_valid() && s.min_part == DECODE_MIN_PART);
            // Never more partial slots than the memory planner's bound (the old rule's).
            for ctx in [1000, 8192, 32768, 131_072] {
                assert!(s.slots(ctx, 0) <= decode_slots(ctx));
            }
        }
    }
}

#[test]
fn decode_grid_fills_the_gpu_without_exceeding_the_parts() {
    // SmolLM2 (3 KV heads): one row at 8K keys → 64 parts, all in their own block.
    let s = DECODE_SINGLE_PART_KEYS;
    assert_eq!(decode_grid_z(1, 3, 8192, s), 64);
    // 64 rows: 192 (row, head) pairs, 6 blocks each take every 6th part.
    assert_eq!(decode_grid_z(64, 3, 8192, s), 6);
    // Short contexts: never more blocks than parts.
    assert_eq!(decode_grid_z(1, 3, 100, 0), 1);
    assert_eq!(decode_grid_z(1, 3, 150, 0), 2);
    assert_eq!(decode_grid_z(1, 3, 150, s), 1);
    assert_eq!(decode_grid_z(1, 3, 1000, s), 8);
    assert_eq!(decode_grid_z(1000, 8, 32768, s), 1);
}

#[test]
fn in_launch_merge_takes_small_groups_not_the_27b_shape_at_8k() {
    // SmolLM2 (3 × 64) at any pinned context up to 32K keys (128 slots), Qwen3-like 4 × 128
    // at 8K (64 slots); not the 27B's 6 × 256 at 8K.
    assert!(decode_merge_in_launch(3, 64, decode_slots(32768)));
    assert!(decode_merge_in_launch(4, 128, decode_slots(8192)));
    assert!(!decode_merge_in_launch(6, 256, decode_slots(8192)));
    assert!(decode_merge_in_launch(6, 256, decode_slots(2048)));
}

#[test]
fn decode_variants_take_head_dims_multiple_of_8_and_groups_up_to_8() {
    let v = |d, g| DecodeVariant::for_shape(d, g).map(|v| (v.max_head_dim, v.max_group));
    assert_eq!(v(64, 3), Some((64, 4)));
    assert_eq!(v(128, 4), Some((128, 4)));
    assert_eq!(v(256, 6), Some((256, 8)));
    assert_eq!(v(80, 1), Some((128, 4)));
    assert_eq!(v(32, 8), Some((64, 8)));
    assert_eq!(v(66, 2), None);
    assert_eq!(v(264, 2), None);
    assert_eq!(v(64, 9), None);
    assert_eq!(v(0, 1), None);
    let all: Vec<DecodeVariant> = DecodeVariant::all().collect();
    assert_eq!(all.len(), 6);
    for (i, x) in all.iter().enumerate() {
        assert_eq!(x.index(), i);
    }
    assert_eq!(
        DecodeVariant::for_shape(256, 6)
            .unwrap()
            .kernel_name("bf16", "e4m3"),
        "attention_decode_bf16_e4m3_d256_g8"
    );
}
