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
    // mma: the whole small-kernel range (batch-invariant across the fused / unfused boundary).
    assert_eq!(default_fused_rows(DenseMatmul::Mma), 64);
    assert_eq!(DEFAULT_FUSED_DECODE_ROWS_MMA, MMA_SMALL_MAX_ROWS);
    // cuBLAS: 8 (the measured bound); fma: off (the fused ops would be a second numeric path).
    assert_eq!(default_fused_rows(DenseMatmul::Cublas), 8);
    assert_eq!(DEFAULT_FUSED_DECODE_ROWS, 8);
    assert_eq!(default_fused_rows(DenseMatmul::Fma), 0);
    // The defaults fit the small kernel.
    for dense in [DenseMatmul::Cublas, DenseMatmul::Fma, DenseMatmul::Mma] {
        assert!(default_fused_rows(dense) <= MMA_SMALL_MAX_ROWS);
    }
}

#[test]
fn row_groups_cover_the_small_kernel_range() {
    let rg8 = MidRows::default();
    let rg4 = MidRows::parse("rg4").unwrap();
    for mid in [rg8, rg4] {
        assert_eq!(mid.row_groups(1, 576), 1);
        assert_eq!(mid.row_groups(8, 576), 1);
        assert_eq!(mid.row_groups(9, 576), 2);
        assert_eq!(mid.row_groups(16, 576), 2);
        assert_eq!(mid.row_groups(17, 576), 4);
        assert_eq!(mid.row_groups(32, 576), 4);
    }
    assert_eq!(rg8.row_groups(33, 576), 8);
    assert_eq!(rg8.row_groups(64, 576), 8);
    assert_eq!(rg4.row_groups(33, 576), 4);
    assert_eq!(rg4.row_groups(64, 576), 4);
    // Every row group the dispatch picks has its functions (index = trailing zeros).
    for rows in 1..=MMA_SMALL_MAX_ROWS {
        for mid in [rg8, rg4] {
            let rg = mid.row_groups(rows, 576);
            assert_eq!(MMA_ROW_GROUPS[rg.trailing_zeros() as usize], rg);
            // One tile of rows up to 64 on the 64-row tile; the partials fit the opt-in limit.
            assert!(small_shared_bytes(16, rg) <= MMA_SMALL_MAX_SHARED);
        }
        assert_eq!(
            rows.div_ceil(8 * rg8.row_groups(rows, 576)),
            1,
            "rows {rows}"
        );
    }
}

#[test]
fn the_mid_rows_switch_parses_its_values_and_refuses_others() {
    let d = MidRows::default();
    assert_eq!(d.rg8_min_n, 0);
    assert_eq!(d.gemm_n, usize::MAX);
    assert_eq!(MidRows::parse("").unwrap(), d);
    assert_eq!(MidRows::parse("rg4").unwrap().rg8_min_n, usize::MAX);
    let split = MidRows::parse("rg8n2048").unwrap();
    assert_eq!(split.row_groups(64, 3072), 8);
    assert_eq!(split.row_groups(64, 2048), 8);
    assert_eq!(split.row_groups(64, 960), 4);
    assert_eq!(split.row_groups(32, 3072), 4);
    assert_eq!(MidRows::parse(" RG8 ").unwrap(), d);
    let g = MidRows::parse("rg4,gemm16384").unwrap();
    assert_eq!((g.rg8_min_n, g.gemm_n), (usize::MAX, 16384));
    assert_eq!(MidRows::parse("gemm").unwrap().gemm_n, 0);
    assert!(MidRows::parse("rg16").is_err());
    assert!(MidRows::parse("gemm-1").is_err());
    assert!(MidRows::parse("fast").is_err());
    assert_eq!(d.norm_rows, MMA_SMALL_MAX_ROWS);
    assert_eq!(MidRows::parse("norm32").unwrap().norm_rows, 32);
    assert_eq!(
        MidRows::parse("norm999").unwrap().norm_rows,
        MMA_SMALL_MAX_ROWS
    );
    assert!(MidRows::parse("norm").is_err());
    assert_eq!(d.wide_min_n, usize::MAX);
    assert_eq!(MidRows::parse("wide2048").unwrap().wide_min_n, 2048);
    // The wide tile's partials fit the 64 KiB allowed at load up to 8 slices (K ≤ 1024).
    assert!(small_shared_bytes(8, 16) <= MMA_SMALL_MAX_SHARED);
    assert!(small_shared_bytes(9, 16) > MMA_SMALL_MAX_SHARED);
    assert_eq!(1024usize.div_ceil(32).div_ceil(slice_blocks(1024)), 8);
    // The GEMM takes 33..=64 rows only, of wide enough weights.
    assert!(!d.gemm_takes(64, 49152));
    assert!(g.gemm_takes(33, 49152) && g.gemm_takes(64, 16384));
    assert!(!g.gemm_takes(32, 49152) && !g.gemm_takes(64, 16383));
}
