//! `kernels/w4a16.cu` (the standalone W4A16 GEMV, not yet wired into the CUDA backend nor run
//! on a GPU) compiles with NVRTC for every supported target, sm_70 (V100) to sm_90 (H200), plus
//! `compute_70` PTX, with both entry points present. No GPU needed.
//!
//! Run: `eval "$(scripts/nvrtc-setup)" && cargo test --features cuda --test cuda_w4a16_compile`
//! Without NVRTC this test fails when `CI` is set and is skipped with a message otherwise.
#![cfg(feature = "cuda")]

use kiln::backend::cuda::{device, nvrtc, Arch};

const TARGETS: &[&str] = &[
    "sm_70",
    "sm_75",
    "sm_80",
    "sm_86",
    "sm_89",
    "sm_90",
    "compute_70",
];

#[test]
fn w4a16_gemv_compiles_for_every_target() {
    if device::require_nvrtc().is_err() || nvrtc::find_include_dir(None).is_err() {
        let msg = "NVRTC or CUDA headers missing: run `eval \"$(scripts/nvrtc-setup)\"` first";
        if std::env::var_os("CI").is_some() {
            panic!("{msg}");
        }
        eprintln!("SKIPPED (not in CI): {msg}");
        return;
    }
    let include = nvrtc::find_include_dir(None).expect("headers");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/w4a16.cu");
    let source = std::fs::read_to_string(&path).expect("kernels/w4a16.cu");
    let mut failures = Vec::new();
    for t in TARGETS {
        let arch: Arch = t.parse().expect("known target");
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some(arch.name().expect("named target")),
            include_paths: vec![include.display().to_string()],
            options: vec![
                "-std=c++17".into(),
                "--fmad=true".into(),
                "-default-device".into(),
            ],
            name: Some("w4a16.cu".into()),
            ..Default::default()
        };
        match cudarc::nvrtc::compile_ptx_with_opts(&source, opts) {
            Ok(ptx) => {
                let text = ptx.to_src();
                for f in ["w4a16_gemv_f16", "w4a16_gemv_bf16"] {
                    if !text.contains(&format!(".entry {f}(")) {
                        failures.push(format!("{t}: entry point {f} missing"));
                    }
                }
            }
            Err(e) => failures.push(format!("{t}: {e:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
