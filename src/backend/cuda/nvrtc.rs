//! Compiling kernels with NVRTC: finding the CUDA headers, choosing options, caching PTX on disk.
//!
//! NVRTC needs an include path for `cuda_fp16.h`. It is searched in this order: the
//! `KILN_CUDA_INCLUDE` environment variable (or the caller's override), `$CUDA_HOME/include`,
//! `$CUDA_PATH/include`, `/usr/local/cuda/include`, then the PyPI layout
//! `…/site-packages/nvidia/cuda_runtime/include` under the usual Python prefixes. PTX is cached under
//! `$XDG_CACHE_HOME/kiln/ptx` (or `~/.cache/kiln/ptx`), keyed by a hash of (source, options,
//! arch, NVRTC version), so a restart does not recompile.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::device::CudaError;
use super::kernels::KernelModule;

/// A GPU target: `sm_XY` (real architecture) or `compute_XY` (PTX for the driver to JIT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arch {
    /// Compute capability major.
    pub major: u32,
    /// Compute capability minor.
    pub minor: u32,
    /// `compute_XY` instead of `sm_XY`.
    pub virtual_only: bool,
}

/// Architectures NVRTC 12.x accepts and kiln supports, as static strings (cudarc wants `&'static str`).
const ARCH_NAMES: &[(&str, u32, u32, bool)] = &[
    ("sm_70", 7, 0, false),
    ("sm_72", 7, 2, false),
    ("sm_75", 7, 5, false),
    ("sm_80", 8, 0, false),
    ("sm_86", 8, 6, false),
    ("sm_87", 8, 7, false),
    ("sm_89", 8, 9, false),
    ("sm_90", 9, 0, false),
    ("sm_100", 10, 0, false),
    ("sm_120", 12, 0, false),
    ("compute_70", 7, 0, true),
    ("compute_75", 7, 5, true),
    ("compute_80", 8, 0, true),
    ("compute_90", 9, 0, true),
];

impl Arch {
    /// The real architecture of a device with compute capability `major.minor`.
    pub fn from_compute_capability(major: u32, minor: u32) -> Self {
        Arch {
            major,
            minor,
            virtual_only: false,
        }
    }

    /// The NVRTC `--gpu-architecture` value, if kiln knows it.
    pub fn name(self) -> Option<&'static str> {
        ARCH_NAMES
            .iter()
            .find(|(_, ma, mi, v)| {
                *ma == self.major && *mi == self.minor && *v == self.virtual_only
            })
            .map(|(n, ..)| *n)
    }

    /// Whether bf16 is the natural compute dtype (sm_80 and newer).
    pub fn has_bf16(self) -> bool {
        self.major >= 8
    }
}

impl std::str::FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ARCH_NAMES
            .iter()
            .find(|(n, ..)| *n == s)
            .map(|(_, major, minor, v)| Arch {
                major: *major,
                minor: *minor,
                virtual_only: *v,
            })
            .ok_or_else(|| {
                let known: Vec<&str> = ARCH_NAMES.iter().map(|(n, ..)| *n).collect();
                format!(
                    "unknown GPU architecture `{s}` (known: {})",
                    known.join(", ")
                )
            })
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let prefix = if self.virtual_only { "compute" } else { "sm" };
        write!(f, "{prefix}_{}{}", self.major, self.minor)
    }
}

/// Candidate include folders, most specific first (existence not checked).
pub fn include_candidates(override_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(d) = override_dir {
        out.push(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("KILN_CUDA_INCLUDE") {
        out.push(PathBuf::from(d));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(d) = std::env::var_os(var) {
            out.push(PathBuf::from(d).join("include"));
        }
    }
    out.push(PathBuf::from("/usr/local/cuda/include"));
    // PyPI wheels (nvidia-cuda-runtime-cu12): site-packages/nvidia/cuda_runtime/include.
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(PathBuf::from(v));
    }
    if let Some(h) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(&h).join(".local"));
        prefixes.push(PathBuf::from(h).join(".cache/kiln/nvrtc"));
    }
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    for p in prefixes {
        out.push(p.join("nvidia/cuda_runtime/include"));
        if let Ok(rd) = std::fs::read_dir(p.join("lib")) {
            for e in rd.flatten() {
                let sp = e.path().join("site-packages/nvidia/cuda_runtime/include");
                out.push(sp);
            }
        }
    }
    out
}

/// The first candidate folder that holds `cuda_fp16.h`.
pub fn find_include_dir(override_dir: Option<&Path>) -> Result<PathBuf, CudaError> {
    let candidates = include_candidates(override_dir);
    candidates
        .iter()
        .find(|d| d.join("cuda_fp16.h").is_file())
        .cloned()
        .ok_or_else(|| CudaError::HeadersNotFound {
            searched: candidates.iter().map(|p| p.display().to_string()).collect(),
        })
}

/// NVRTC's version as (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    super::device::require_nvrtc()?;
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: NVRTC is loaded (checked above) and both pointers are valid for the call.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    status
        .result()
        .map_err(|e| CudaError::Nvrtc(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// Compiler options for every kernel (arch and include path are added per call).
fn base_options() -> Vec<String> {
    // Exact math (no --use_fast_math): the CPU backend is the reference.
    vec![
        "-std=c++17".into(),
        "--fmad=true".into(),
        "-default-device".into(),
    ]
}

/// Compile one module to PTX for `arch`, using the on-disk cache when `cache_dir` is given.
pub fn compile_module(
    module: KernelModule,
    arch: Arch,
    include_dir: &Path,
    cache_dir: Option<&Path>,
) -> Result<String, CudaError> {
    let arch_name = arch
        .name()
        .ok_or_else(|| CudaError::UnsupportedArch(arch.to_string()))?;
    let source = module.full_source();
    let options = base_options();
    let version = nvrtc_version()?;
    let key = {
        let mut h = Sha256::new();
        h.update(source.as_bytes());
        h.update(options.join(" ").as_bytes());
        h.update(arch_name.as_bytes());
        h.update(format!("nvrtc {}.{}", version.0, version.1).as_bytes());
        hex::encode(h.finalize())
    };
    let cached = cache_dir.map(|d| {
        d.join(format!(
            "{}-{arch_name}-{}.ptx",
            module.file_name(),
            &key[..16]
        ))
    });
    if let Some(path) = &cached {
        if let Ok(ptx) = std::fs::read_to_string(path) {
            return Ok(ptx);
        }
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch_name),
        include_paths: vec![include_dir.display().to_string()],
        options,
        name: Some(module.file_name().to_string()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(&source, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => CudaError::Compile {
            file: module.file_name(),
            arch: arch_name.to_string(),
            log: log.to_string_lossy().into_owned(),
        },
        other => CudaError::Nvrtc(format!("{}: {other:?}", module.file_name())),
    })?;
    let text = ptx.to_src();
    if let Some(path) = &cached {
        // The cache is an optimisation: failing to write it is logged, not fatal.
        if let Err(e) = write_atomically(path, text.as_bytes()) {
            tracing::debug!(path = %path.display(), error = %e, "Could not write the PTX cache.");
        }
    }
    Ok(text)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

/// Default PTX cache folder: `$XDG_CACHE_HOME/kiln/ptx` or `~/.cache/kiln/ptx`.
pub fn default_cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("kiln/ptx"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_round_trip() {
        for (name, ..) in ARCH_NAMES {
            let a: Arch = name.parse().expect("known arch");
            assert_eq!(a.name(), Some(*name));
            assert_eq!(a.to_string(), *name);
        }
        assert!("sm_61".parse::<Arch>().is_err());
        assert!(!Arch::from_compute_capability(7, 0).has_bf16());
        assert!(Arch::from_compute_capability(9, 0).has_bf16());
    }

    #[test]
    fn include_override_comes_first() {
        let c = include_candidates(Some(Path::new("/opt/x/include")));
        assert_eq!(c[0], PathBuf::from("/opt/x/include"));
        assert!(c.contains(&PathBuf::from("/usr/local/cuda/include")));
    }
}
