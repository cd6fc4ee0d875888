//! Every kernel compiles with NVRTC for every supported target, from the V100 (sm_70) to the
//! H200 (sm_90), plus `compute_70` PTX (how the sm_70 path is run on newer GPUs): every module of
//! the registry (the packed 4-bit kernels `kernels/w4a16.cu` included). No GPU needed.
//!
//! Run: `eval "$(scripts/nvrtc-setup)" && cargo test --features cuda --test cuda_kernels_compile`
//! Without NVRTC this test fails when `CI` is set (CI must check the kernels) and is skipped with
//! a message otherwise.
#![cfg(feature = "cuda")]

use kiln::backend::cuda::{device, nvrtc, Arch, KernelModule};

const TARGETS: &[&str] = &[
    "sm_70",
    "sm_75",
    "sm_80",
    "sm_86",
    "sm_89",
    "sm_90",
    "compute_70",
];

/// The CUDA include folder, or `None` (skip, with a message) when NVRTC or the headers are
/// missing outside CI; in CI (`CI` set) that is a failure, since CI must check the kernels.
fn nvrtc_include_or_skip() -> Option<std::path::PathBuf> {
    if device::require_nvrtc().is_err() || nvrtc::find_include_dir(None).is_err() {
        let msg = "NVRTC or CUDA headers missing: run `eval \"$(scripts/nvrtc-setup)\"` first";
        if std::env::var_os("CI").is_some() {
            panic!("{msg}");
        }
        eprintln!("SKIPPED (not in CI): {msg}");
        return None;
    }
    Some(nvrtc::find_include_dir(None).expect("headers"))
}

/// Every (target, module) pair, compiled on as many threads as the machine has cores (NVRTC
/// programs are independent; on CI's 2 cores this halves the test's ~15 minutes).
#[test]
fn every_kernel_compiles_for_every_target() {
    let Some(include) = nvrtc_include_or_skip() else {
        return;
    };
    let jobs: Vec<(&str, KernelModule)> = TARGETS
        .iter()
        .flat_map(|t| KernelModule::ALL.iter().map(move |m| (*t, *m)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    let mut failures: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut failures = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(t, m)) = jobs.get(i) else {
                            return failures;
                        };
                        failures.extend(compile_failures(t, m, &include));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a compile thread panicked"))
            .collect()
    });
    failures.sort();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What is wrong with module `m` compiled for target `t`: the NVRTC error, or each promised entry
/// point missing from the PTX; empty when it compiled with all of them.
fn compile_failures(t: &str, m: KernelModule, include: &std::path::Path) -> Vec<String> {
    let arch: Arch = t.parse().expect("known target");
    match nvrtc::compile_module(m, arch, include) {
        Ok(ptx) => m
            .entry_points()
            .iter()
            .filter(|f| !ptx.contains(&format!(".entry {f}(")))
            .map(|f| format!("{t} {}: entry point {f} missing", m.file_name()))
            .collect(),
        Err(e) => vec![format!("{t}: {e}")],
    }
}

/// A backend compiles `attention_decode.cu` for its own (compute dtype, KV storage) pair only
/// (`KernelModule::defines`): for every pair, and for sm_70 and sm_90, the PTX holds exactly the
/// entry points `entry_points_for` promises (the backend checks each after loading) and no other
/// pair's.
#[test]
fn the_decode_module_compiles_per_dtype_and_storage() {
    let Some(include) = nvrtc_include_or_skip() else {
        return;
    };
    let m = KernelModule::AttentionDecode;
    let mut failures = Vec::new();
    for t in ["sm_70", "sm_90"] {
        let arch: Arch = t.parse().expect("known target");
        for dtype in ["f32", "f16", "bf16"] {
            for kv in ["same", "e5m2", "e4m3"] {
                let want = m.entry_points_for(dtype, kv);
                if want.len() != 7 {
                    failures.push(format!("{dtype}/{kv}: {} entry points", want.len()));
                }
                let image = nvrtc::compile_image(
                    m,
                    arch,
                    &include,
                    kiln::backend::cuda::kernel_cache::ImageKind::Ptx,
                    &m.defines(dtype, kv),
                );
                let ptx = match image {
                    Ok(i) => String::from_utf8_lossy(&i.bytes).into_owned(),
                    Err(e) => {
                        failures.push(format!("{t} {dtype}/{kv}: {e}"));
                        continue;
                    }
                };
                let entries = ptx.matches(".entry ").count();
                if entries != want.len() {
                    failures.push(format!(
                        "{t} {dtype}/{kv}: {entries} entries, want {want:?}"
                    ));
                }
                for f in &want {
                    if !ptx.contains(&format!(".entry {f}(")) {
                        failures.push(format!("{t} {dtype}/{kv}: {f} missing"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
