//! Unit tests of `dense.rs` and `dense/options.rs`: the K slices, the environment switches and
//! their defaults, the row groups (`KILN_DENSE_MID`).

use super::options::{default_fused_rows, parse_fused_rows, DEFAULT_FUSED_DECODE_ROWS_MMA};
use super::*;
use crate::backend::cuda::backend::ComputeDType;

#[test]
fn the_k_slices_depend_on_k_alone_and_stay_within_the_kernel_limits() {
    assert_eq!(slice_blocks(576), 4);
    assert_eq!(slice_blocks(1536), 4);
    assert_eq!(slice_blocks(8192), 16);
    for k in (8..20_000).step_by(8) {
        let sb = slice_blocks(k);
        let slices = k.div_ceil(32).div_ceil(sb);
        assert!(sb >= 4, "k {k}");
        assert!(slices <= 16, "k {k}: {slices} slices");
        assert!(slices * sb * 32 >= k, "k {k}: slices do not cover K");
    }
}

#[test]
fn the_switch_parses_its_documented_values_and_refuses_others() {
    use DenseMatmul::{Cublas, Fma, Mma};
    for default in [Cublas, Fma, Mma] {
        assert_eq!(DenseMatmul::parse("mma", default).unwrap(), Mma);
        assert_eq!(DenseMatmul::parse("MMA", default).unwrap(), Mma);
        assert_eq!(DenseMatmul::parse("1", default).unwrap(), Fma);
        assert_eq!(DenseMatmul::parse("fma", default).unwrap(), Fma);
        assert_eq!(DenseMatmul::parse("cublas", default).unwrap(), Cublas);
        assert_eq!(DenseMatmul::parse(" Off ", default).unwrap(), Cublas);
        assert_eq!(DenseMatmul::parse("0", default).unwrap(), Cublas);
        assert_eq!(DenseMatmul::parse("", default).unwrap(), default);
        assert_eq!(DenseMatmul::parse("  ", default).unwrap(), default);
        assert!(DenseMatmul::parse("tensor", default).is_err());
    }
}

#[test]
fn the_default_dense_matmul_is_batch_invariant_for_16_bit_compute_mma_on_sm80_fma_below() {
    use crate::backend::cuda::Arch;
    let arch = |major, minor| Arch::from_compute_capability(major, minor);
    for (major, minor) in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)] {
        for dtype in [ComputeDType::F16, ComputeDType::BF16] {
            assert_eq!(
                DenseMatmul::default_for(arch(major, minor), dtype),
                DenseMatmul::Mma,
                "sm_{major}{minor} {dtype:?}"
            );
        }
        assert_eq!(
            DenseMatmul::default_for(arch(major, minor), ComputeDType::F32),
            DenseMatmul::Cublas,
            "sm_{major}{minor} f32"
        );
    }
    for (major, minor) in [(7, 0), (7, 5)] {
        for dtype in [ComputeDType::F16, ComputeDType::BF16] {
            assert_eq!(
                DenseMatmul::default_for(arch(major, minor), dtype),
                DenseMatmul::Fma,
                "sm_{major}{minor} {dtype:?}"
            );
        }
        assert_eq!(
            DenseMatmul::default_for(arch(major, minor), ComputeDType::F32),
            DenseMatmul::Cublas,
            "sm_{major}{minor} f32"
        );
    }
}

#[test]
fn the_fused_rows_switch_parses_counts_clamps_them_and_refuses_words() {
    for dense in [DenseMatmul::Cublas, DenseMatmul::Fma, DenseMatmul::Mma] {
        assert_eq!(
            parse_fused_rows("", dense).unwrap(),
            default_fused_rows(dense)
        );
        assert_eq!(parse_fused_rows("0", dense).unwrap(), 0);
        assert_eq!(parse_fused_rows(" 8 ", dense).unwrap(), 8);
        assert_eq!(parse_fused_rows("16", dense).unwrap(), 16);
        assert_eq!(parse_fused_rows("1000", dense).unwrap(), MMA_SMALL_MAX_ROWS);
        assert!(parse_fused_rows("on", dense).is_err());
        assert!(parse_fused_rows("-1", dense).is_err());
    }
}

#[test]
fn the_fused_rows_default_follows_the_dense_kind() {
    // mma: the 16-row tile (fusing more rows lost on the H200: the norm prologue's re-reads).
    assert_eq!(default_fused_rows(DenseMatmul::Mma), 16);
    assert_eq!(DEFAULT_FUSED_DECODE_ROWS_MMA, 16);
    // cuBLAS: 8 (the measured bound); fma: off (the fused ops would be a second numeric path).
    assert_eq!(default_fused_rows(DenseMatmul::Cublas), 8);
    assert_eq!(DEFAULT_FUSED_DECODE_ROWS, 8);
    assert_eq!(default_fused_rows(DenseMatmul::Fma), 0);
    // The defaults fit the small kernel.
    for dense in [DenseMatmul::Cublas, DenseMatmul::Fma, DenseMatmul::Mma] {
        assert!(default_fused_rows(dense) <= MMA_SMALL_MAX_ROWS);
    }
}

/// The H200's SM count (the figures the warp budget was fitted to).
const H200_SMS: usize = 132;

#[test]
fn the_rows_rule_covers_the_rows_in_one_block() {
    let rg8 = MidRows::parse("rg8", H200_SMS).unwrap();
    let rg4 = MidRows::parse("rg4", H200_SMS).unwrap();
    for mid in [rg8, rg4, MidRows::new(H200_SMS)] {
        assert_eq!(mid.rows_rule(1), 1);
        assert_eq!(mid.rows_rule(8), 1);
        assert_eq!(mid.rows_rule(9), 2);
        assert_eq!(mid.rows_rule(16), 2);
        assert_eq!(mid.rows_rule(17), 4);
        assert_eq!(mid.rows_rule(32), 4);
    }
    assert_eq!(rg8.rows_rule(33), 8);
    assert_eq!(rg8.rows_rule(64), 8);
    assert_eq!(rg4.rows_rule(33), 4);
    assert_eq!(rg4.rows_rule(64), 4);
    for rows in 1..=MMA_SMALL_MAX_ROWS {
        // The norm prologue and the rows switches take the rows rule whatever the shape.
        assert_eq!(rg8.row_groups(rows, 3072, 5, false), rg8.rows_rule(rows));
        assert_eq!(
            MidRows::new(H200_SMS).row_groups(rows, 576, 5, true),
            rg8.rows_rule(rows)
        );
        assert_eq!(rows.div_ceil(8 * rg8.rows_rule(rows)), 1, "rows {rows}");
        for mid in [rg8, rg4, MidRows::new(H200_SMS)] {
            let rg = mid.row_groups(rows, 49152, 16, false);
            assert_eq!(MMA_ROW_GROUPS[rg.trailing_zeros() as usize], rg);
            assert!(small_shared_bytes(16, rg) <= MMA_SMALL_MAX_SHARED);
        }
    }
}

#[test]
fn the_warp_budget_picks_run_1s_fastest_tiles_on_the_smollm2_shapes() {
    // (n, slices, rows, the tile it picks): run 1's fastest or within 5% of it
    // (docs/benchmarks.md, `mma64`), except gate|up at 16 and 32 rows (rg1 fastest, 7% / 11%
    // ahead of the pick: its grid passes the budget).
    let mid = MidRows::new(H200_SMS);
    let cases = [
        (576, 5, 64, 1),  // o_proj: 3.36 µs (rg4 5.03, main's tile)
        (960, 5, 64, 2),  // q|k|v: 4.32 (rg1 4.43, rg4 5.37)
        (3072, 5, 64, 8), // gate|up: 6.24 (rg4 6.35, rg1 7.89)
        (576, 12, 64, 2), // down_proj (K 1536): 5.23 (rg4 5.41, rg1 6.58)
        (576, 5, 32, 1),
        (960, 5, 32, 1),
        (3072, 5, 32, 4),
        (576, 12, 32, 1),
        (576, 5, 16, 1), // o_proj at 16 rows: 2.72 (rg2, main's, 3.59)
        (576, 12, 16, 1),
        (3072, 5, 16, 2),
        (49152, 5, 16, 2), // lm_head: past the budget, one block of rows (main's)
        (49152, 5, 1, 1),
    ];
    for (n, slices, rows, want) in cases {
        assert_eq!(
            mid.row_groups(rows, n, slices, false),
            want,
            "n {n} slices {slices} rows {rows}"
        );
    }
    // Past 16 rows the lm_head takes the GEMM; the layers do not.
    assert!(mid.gemm_takes(17, 49152) && mid.gemm_takes(64, 49152));
    assert!(!mid.gemm_takes(16, 49152) && !mid.gemm_takes(64, 3072));
}

#[test]
fn the_mid_rows_switch_parses_its_values_and_refuses_others() {
    let d = MidRows::new(H200_SMS);
    assert_eq!(d.warps_per_sm, Some(14));
    assert_eq!((d.rg_mid, d.gemm_n), (8, 16_384));
    assert_eq!(MidRows::parse("", H200_SMS).unwrap(), d);
    assert_eq!(MidRows::parse(" AUTO ", H200_SMS).unwrap(), d);
    let main = MidRows::parse("rg4,nogemm", H200_SMS).unwrap();
    assert_eq!(
        (main.warps_per_sm, main.rg_mid, main.gemm_n),
        (None, 4, usize::MAX)
    );
    assert_eq!(
        MidRows::parse("warps8", H200_SMS).unwrap().warps_per_sm,
        Some(8)
    );
    assert_eq!(MidRows::parse("gemm1000", H200_SMS).unwrap().gemm_n, 1000);
    assert_eq!(MidRows::parse("norm32", H200_SMS).unwrap().norm_rows, 32);
    assert_eq!(
        MidRows::parse("norm999", H200_SMS).unwrap().norm_rows,
        MMA_SMALL_MAX_ROWS
    );
    assert_eq!(d.wide_min_n, usize::MAX);
    assert_eq!(
        MidRows::parse("wide2048", H200_SMS).unwrap().wide_min_n,
        2048
    );
    for bad in ["rg16", "warps0", "gemm-1", "norm", "fast", "wide"] {
        assert!(MidRows::parse(bad, H200_SMS).is_err(), "{bad}");
    }
    // The wide tile's partials fit the 64 KiB allowed at load up to 8 slices (K ≤ 1024).
    assert!(small_shared_bytes(8, 16) <= MMA_SMALL_MAX_SHARED);
    assert!(small_shared_bytes(9, 16) > MMA_SMALL_MAX_SHARED);
    assert_eq!(1024usize.div_ceil(32).div_ceil(slice_blocks(1024)), 8);
}
