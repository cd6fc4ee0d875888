//! Unit tests of `dense.rs`: the K slices, the two environment switches, the row groups.

use super::*;

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
    assert_eq!(DenseMatmul::parse("mma").unwrap(), DenseMatmul::Mma);
    assert_eq!(DenseMatmul::parse("MMA").unwrap(), DenseMatmul::Mma);
    assert_eq!(DenseMatmul::parse("1").unwrap(), DenseMatmul::Fma);
    assert_eq!(DenseMatmul::parse("fma").unwrap(), DenseMatmul::Fma);
    assert_eq!(DenseMatmul::parse("cublas").unwrap(), DenseMatmul::Cublas);
    assert_eq!(DenseMatmul::parse("0").unwrap(), DenseMatmul::Cublas);
    assert_eq!(DenseMatmul::parse("").unwrap(), DenseMatmul::DEFAULT);
    assert!(DenseMatmul::parse("tensor").is_err());
}

#[test]
fn the_fused_rows_switch_parses_counts_clamps_them_and_refuses_words() {
    assert_eq!(parse_fused_rows("").unwrap(), DEFAULT_FUSED_DECODE_ROWS);
    assert_eq!(parse_fused_rows("0").unwrap(), 0);
    assert_eq!(parse_fused_rows(" 8 ").unwrap(), 8);
    assert_eq!(parse_fused_rows("1000").unwrap(), MMA_SMALL_MAX_ROWS);
    assert!(parse_fused_rows("on").is_err());
    assert!(parse_fused_rows("-1").is_err());
}

#[test]
fn row_groups_cover_the_small_kernel_range() {
    assert_eq!(row_groups(1), 1);
    assert_eq!(row_groups(8), 1);
    assert_eq!(row_groups(9), 2);
    assert_eq!(row_groups(16), 2);
    assert_eq!(row_groups(17), 4);
    assert_eq!(row_groups(64), 4);
}
