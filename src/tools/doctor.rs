//! `kiln doctor`: is this machine ready for the CUDA backend?
//!
//! Reports the driver, every GPU, NVRTC's version and header folder, then compiles every kernel
//! for the device (or for each `--arch` given, which needs no GPU) and exits non-zero on any
//! failure, printing NVRTC's log.

/// Arguments of `kiln doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Compile for these targets instead of the present GPU, e.g. `sm_70,sm_90,compute_70`.
    #[arg(long, value_delimiter = ',')]
    pub arch: Vec<String>,
    /// Folder holding cuda_fp16.h (default: search; see `KILN_CUDA_INCLUDE`).
    #[arg(long)]
    pub cuda_include: Option<std::path::PathBuf>,
}

/// Run the checks; `Err` (non-zero exit) when anything fails.
#[cfg(feature = "cuda")]
pub fn run(args: &DoctorArgs) -> anyhow::Result<()> {
    use crate::backend::cuda::{device, nvrtc, Arch, KernelModule};

    let mut failures = 0usize;
    let mut targets: Vec<Arch> = Vec::new();
    for a in &args.arch {
        targets.push(a.parse().map_err(anyhow::Error::msg)?);
    }
    match device::list_gpus() {
        Ok((version, gpus)) => {
            println!("driver: CUDA {}.{}", version / 1000, (version % 1000) / 10);
            if gpus.is_empty() {
                println!("gpus: none visible");
            }
            for g in &gpus {
                println!(
                    "gpu {}: {} (sm_{}{}, {:.1} GiB)",
                    g.ordinal,
                    g.name,
                    g.compute_capability.0,
                    g.compute_capability.1,
                    g.total_memory as f64 / (1u64 << 30) as f64
                );
                if args.arch.is_empty() {
                    targets.push(Arch::from_compute_capability(
                        g.compute_capability.0,
                        g.compute_capability.1,
                    ));
                }
            }
        }
        Err(e) => {
            println!("driver: {e}");
            if args.arch.is_empty() {
                failures += 1;
            }
        }
    }
    let (major, minor) = nvrtc::nvrtc_version()?;
    println!("nvrtc: {major}.{minor}");
    let include = nvrtc::find_include_dir(args.cuda_include.as_deref())?;
    println!("cuda headers: {}", include.display());
    if targets.is_empty() {
        anyhow::bail!("no target to compile for: no GPU visible and no --arch given");
    }
    targets.dedup();
    for arch in &targets {
        for m in KernelModule::ALL {
            let t0 = std::time::Instant::now();
            match nvrtc::compile_module(m, *arch, &include) {
                Ok(ptx) => {
                    let missing: Vec<String> = m
                        .entry_points()
                        .into_iter()
                        .filter(|f| !ptx.contains(&format!(".entry {f}(")))
                        .collect();
                    if missing.is_empty() {
                        println!(
                            "ok   {arch} {} ({:.2} s)",
                            m.file_name(),
                            t0.elapsed().as_secs_f64()
                        );
                    } else {
                        failures += 1;
                        println!(
                            "FAIL {arch} {}: entry points missing from PTX: {missing:?}",
                            m.file_name()
                        );
                    }
                }
                Err(e) => {
                    failures += 1;
                    println!("FAIL {arch} {}: {e}", m.file_name());
                }
            }
        }
    }
    if failures > 0 {
        anyhow::bail!("{failures} check(s) failed");
    }
    println!("all kernels compiled");
    Ok(())
}

/// Without the `cuda` feature there is nothing to check: say so and fail.
#[cfg(not(feature = "cuda"))]
pub fn run(_args: &DoctorArgs) -> anyhow::Result<()> {
    anyhow::bail!("this kiln was built without CUDA support; rebuild with `cargo build --release --features cuda`")
}
