//! Unit tests of the kernel registry (src/backend/cuda/kernels.rs): the architecture each module
//! compiles for, the modules a backend builds, entry points present in their sources, and the
//! modules compiled after another module's helpers.

use super::*;

#[test]
fn only_the_wgmma_gemm_on_a_real_sm90_compiles_for_sm90a() {
    let a = |s: &str| s.parse::<super::super::nvrtc::Arch>().expect("arch");
    assert_eq!(
        KernelModule::W4a16Wgmma.nvrtc_arch(a("sm_90")),
        Some("sm_90a")
    );
    assert_eq!(
        KernelModule::W4a16Wgmma.nvrtc_arch(a("sm_100")),
        Some("sm_100")
    );
    assert_eq!(
        KernelModule::W4a16Wgmma.nvrtc_arch(a("compute_90")),
        Some("compute_90")
    );
    assert_eq!(KernelModule::W4a16.nvrtc_arch(a("sm_90")), Some("sm_90"));
    assert_eq!(
        KernelModule::W4a16Gemm.nvrtc_arch(a("sm_90")),
        Some("sm_90")
    );
    assert_eq!(
        KernelModule::W4a16Wgmma.nvrtc_arch(a("sm_80")),
        Some("sm_80")
    );
}

#[test]
fn a_backend_builds_one_decode_pair_and_every_other_module_whole() {
    let m = KernelModule::AttentionDecode;
    assert_eq!(m.entry_points().len(), 3 * 3 * 6 + 3);
    let one = m.entry_points_for("bf16", "e5m2");
    assert_eq!(one.len(), 7, "{one:?}");
    assert!(one.contains(&"attention_decode_bf16_e5m2_d256_g8".to_string()));
    assert!(one.contains(&"attention_decode_combine_bf16".to_string()));
    assert!(one.iter().all(|n| m.entry_points().contains(n)));
    assert_eq!(
        m.defines("bf16", "e5m2"),
        [
            "-DKILN_DECODE_ONLY",
            "-DKILN_DECODE_T_bf16",
            "-DKILN_DECODE_C_e5m2"
        ]
    );
    let mma = KernelModule::AttentionDecodeMma;
    assert_eq!(mma.entry_points().len(), 2 * (3 * 3 * 2 + 1));
    assert_eq!(
        mma.entry_points_for("bf16", "e4m3"),
        [
            "attention_decode_mma_bf16_e4m3_d64",
            "attention_decode_mma_bf16_e4m3_d128",
            "attention_decode_mma_bf16_e4m3_d256",
            "attention_decode_mma_bf16_e4m3_d64_p2",
            "attention_decode_mma_bf16_e4m3_d128_p2",
            "attention_decode_mma_bf16_e4m3_d256_p2",
            "attention_decode_mma_combine_bf16"
        ]
    );
    assert!(mma.entry_points_for("f32", "same").is_empty());
    // The 1–8-row GEMV module exports every build, compiled only for the one(s) that run.
    let gemv = KernelModule::W4a16Gemv;
    assert!(gemv.defines("f16", "same")[1].starts_with("-DW4V_MASK_bf16=0x0"));
    assert_eq!(gemv.entry_points_for("f16", "same"), gemv.entry_points());
    for other in KernelModule::ALL
        .into_iter()
        .filter(|&o| o != m && o != mma && o != gemv)
    {
        assert!(other.defines("f16", "same").is_empty());
        assert_eq!(other.entry_points_for("f16", "same"), other.entry_points());
    }
}

#[test]
fn every_entry_point_appears_in_its_source() {
    // The names are built by macros in the .cu files; check the macro stems exist so a rename
    // on one side is caught without a GPU or NVRTC.
    for m in KernelModule::ALL {
        let src = m.source();
        for name in m.entry_points() {
            let stem = name.split('_').next().unwrap_or_default();
            assert!(
                src.contains(stem),
                "{} lacks `{stem}` (for {name})",
                m.file_name()
            );
        }
        assert!(m.full_source().starts_with(COMMON_HEADER));
    }
}

#[test]
fn the_bulk_gemv_gets_w4a16_helpers_without_its_entry_points() {
    let w4 = KernelModule::W4a16.source();
    assert_eq!(w4.matches(W4A16_ENTRIES_MARK).count(), 1);
    let full = KernelModule::W4a16Bulk.full_source();
    for helper in [
        "struct W4Dec",
        "w4_decode_any",
        "w4_word",
        "w4_pdl_wait",
        "w4_store",
    ] {
        assert!(full.contains(helper), "{helper}");
    }
    assert!(!full.contains("W4_TC_ENTRIES(bf16"));
    assert!(full.ends_with(KernelModule::W4a16Bulk.source()));
    // Every form is loaded (the cluster one was missing once: the backend then found no
    // bulk kernel at all) and every macro-built name exists in the source.
    let names = KernelModule::W4a16Bulk.entry_points();
    for t in ["f16", "bf16"] {
        for n in w4_bulk_names(t) {
            assert!(names.contains(&n), "{n}");
        }
    }
    assert_eq!(names.len(), 6);
    let src = KernelModule::W4a16Bulk.source();
    let forms = ["w4b_gemv_##SUF", "w4b_gemvc_##SUF", "w4b_gemvp_##SUF"];
    assert!(forms.iter().all(|f| src.contains(f)));
}

#[test]
fn the_w4_gemms_get_w4a16_helpers_without_its_entry_points() {
    for m in [KernelModule::W4a16Gemm, KernelModule::W4a16Wgmma] {
        let full = m.full_source();
        for helper in [
            "struct W4Dec",
            "w4_decode2",
            "w4_a_unit",
            "w4_word",
            "#define W4_KB",
        ] {
            assert!(full.contains(helper), "{}: {helper}", m.file_name());
        }
        assert!(!full.contains("W4_TC_ENTRIES(bf16"), "{}", m.file_name());
        assert!(full.ends_with(m.source()), "{}", m.file_name());
        // One copy: the module itself defines none of them again.
        assert!(!m.source().contains("struct W4Dec"), "{}", m.file_name());
    }
}

#[test]
fn both_dense_tensor_core_modules_get_the_shared_helpers_once() {
    for m in [KernelModule::Dense, KernelModule::DenseGemm] {
        let full = m.full_source();
        assert_eq!(
            full.matches(DENSE_COMMON_HEADER).count(),
            1,
            "{}",
            m.file_name()
        );
        // The helpers live in the header only: one definition of each per program.
        assert_eq!(full.matches("void dmma_block(").count(), 1);
        assert_eq!(full.matches("void dmma_store(").count(), 1);
    }
    assert!(!KernelModule::W4a16
        .full_source()
        .contains(DENSE_COMMON_HEADER));
}

#[test]
fn the_17_to_64_row_gemv_gets_the_cluster_helpers_without_their_entry_points() {
    let full = KernelModule::W4a16Xr.full_source();
    // w4a16.cu's helpers, the hints, then w4a16_xs.cu's cluster helpers, each once.
    for helper in [
        "struct W4Dec",
        "w4v_ldw",
        "w4xc_cluster_sync()",
        "w4_xc_unit",
    ] {
        assert!(full.contains(helper), "{helper}");
    }
    assert_eq!(
        full.matches("__device__ __forceinline__ unsigned w4_xc_unit")
            .count(),
        1
    );
    assert_eq!(
        KernelModule::W4a16Xs
            .source()
            .matches(W4A16_XS_ENTRIES_MARK)
            .count(),
        1
    );
    // Neither module's entry points come along.
    assert!(!full.contains("W4XC_ENTRIES(bf16"));
    assert!(!full.contains("W4_TC_ENTRIES(bf16"));
    assert!(full.ends_with(KernelModule::W4a16Xr.source()));
    assert!(!KernelModule::W4a16Xr.source().contains("struct W4Dec"));
    // Every build's entry point, in both 16-bit dtypes, none for f32.
    assert_eq!(
        KernelModule::W4a16Xr.entry_points().len(),
        2 * W4_XR_VARIANTS.len()
    );
    assert!(KernelModule::W4a16Xr
        .entry_points()
        .contains(&"w4_gemvxr4w2t4r4s3bhp3_bf16".to_string()));
}
