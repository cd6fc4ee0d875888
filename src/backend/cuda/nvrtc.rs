//! Compiling kernels with NVRTC: finding the CUDA headers, choosing options, caching PTX on disk.
//!
//! NVRTC needs an include path for `cuda_fp16.h`. It is searched in this order: the
//! `KILN_CUDA_INCLUDE` environment variable (or the caller's override), `$CUDA_HOME/include`,
//! `$CUDA_PATH/include`, `/usr/local/cuda/include`, then the PyPI layout
//! `…/site-packages/nvidia/cuda_runtime/include` under the usual Python prefixes. Compiled modules (a
//! cubin for a real `sm_XY`, PTX for `compute_XY`) go through the on-disk cache of
//! `kernel_cache.rs` (`$KILN_KERNEL_CACHE`, else `$XDG_CACHE_HOME/kiln/kernels`), so a restart
//! neither recompiles nor JITs.

use std::path::{Path, PathBuf};

use super::device::CudaError;
use super::kernel_cache::{ImageKind, KernelCache, KernelImage, Lookup};
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

/// Compile one module to PTX for `arch` (no cache): what `kiln doctor` and the compile test check
/// entry points against.
pub fn compile_module(
    module: KernelModule,
    arch: Arch,
    include_dir: &Path,
) -> Result<String, CudaError> {
    let image = compile_image(module, arch, include_dir, ImageKind::Ptx, &[])?;
    Ok(String::from_utf8_lossy(&image.bytes).into_owned())
}

/// Where a module's image came from (for the log and the start-up measurement).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A valid cache entry.
    Cache,
    /// NVRTC, no entry before.
    Compiled,
    /// NVRTC, replacing an entry that failed its checks (or failed to load).
    Recompiled,
}

/// The image kind a target gets: a cubin for a real `sm_XY` (nothing to JIT at load), PTX for a
/// virtual `compute_XY`.
pub fn image_kind(arch: Arch) -> ImageKind {
    if arch.virtual_only {
        ImageKind::Ptx
    } else {
        ImageKind::Cubin
    }
}

/// The cache key and entry path of `module` for `arch`, compiled with the extra options
/// `defines`, in `cache`.
pub fn cache_entry(
    cache: &KernelCache,
    module: KernelModule,
    arch: Arch,
    defines: &[String],
) -> Result<(String, PathBuf), CudaError> {
    let arch_name = module
        .nvrtc_arch(arch)
        .ok_or_else(|| CudaError::UnsupportedArch(arch.to_string()))?;
    let mut options = base_options();
    options.extend_from_slice(defines);
    let key = KernelCache::key(
        &module.full_source(),
        &options,
        arch_name,
        nvrtc_version()?,
        image_kind(arch),
    );
    let path = cache.path(module.file_name(), arch_name, &key);
    Ok((key, path))
}

/// One module for `arch` (with the extra options `defines`, see [`KernelModule::defines`])
/// through the cache: a valid entry is returned as is; otherwise NVRTC compiles it and the entry
/// is (re)written (a failed write is logged, not fatal). With `force_compile` an existing entry is
/// ignored and replaced (the caller could not load it).
pub fn load_or_compile(
    module: KernelModule,
    arch: Arch,
    include_dir: &Path,
    cache: Option<&KernelCache>,
    force_compile: bool,
    defines: &[String],
) -> Result<(KernelImage, Source), CudaError> {
    let kind = image_kind(arch);
    let Some(cache) = cache else {
        let image = compile_image(module, arch, include_dir, kind, defines)?;
        return Ok((image, Source::Compiled));
    };
    let (key, path) = cache_entry(cache, module, arch, defines)?;
    let mut source = Source::Compiled;
    if force_compile {
        source = Source::Recompiled;
    } else {
        match cache.lookup(&path, &key) {
            Lookup::Hit(image) => return Ok((image, Source::Cache)),
            Lookup::Miss => {}
            Lookup::Corrupt(why) => {
                tracing::warn!(path = %path.display(), reason = %why,
                    "Kernel cache entry is corrupt; recompiling it.");
                source = Source::Recompiled;
            }
        }
    }
    let image = compile_image(module, arch, include_dir, kind, defines)?;
    if let Err(e) = cache.store(&path, &key, &image) {
        tracing::warn!(path = %path.display(), error = %e, "Could not write the kernel cache.");
    }
    Ok((image, source))
}

/// NVRTC: `module` for `arch` with the extra options `defines`, as `kind` (a cubin needs a real
/// architecture).
pub fn compile_image(
    module: KernelModule,
    arch: Arch,
    include_dir: &Path,
    kind: ImageKind,
    defines: &[String],
) -> Result<KernelImage, CudaError> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::{CStr, CString};

    let arch_name = module
        .nvrtc_arch(arch)
        .ok_or_else(|| CudaError::UnsupportedArch(arch.to_string()))?;
    if kind == ImageKind::Cubin && arch.virtual_only {
        return Err(CudaError::Nvrtc(format!(
            "a cubin needs a real architecture, not {arch_name}"
        )));
    }
    super::device::require_nvrtc()?;
    let file = module.file_name();
    let nv = |what: &str, e: result::NvrtcError| CudaError::Nvrtc(format!("{file}: {what}: {e:?}"));
    let src = CString::new(module.full_source())
        .map_err(|_| CudaError::Nvrtc(format!("{file}: source holds a NUL byte")))?;
    let name = CString::new(file).expect("file names have no NUL");
    let mut options = vec![
        format!("--include-path={}", include_dir.display()),
        format!("--gpu-architecture={arch_name}"),
    ];
    options.extend(base_options());
    options.extend_from_slice(defines);
    let prog = result::create_program(&src, Some(&name)).map_err(|e| nv("create", e))?;
    // The program is destroyed on every path below (`finish`).
    // SAFETY: `prog` was created above and is destroyed only at the end of this block; `src` and
    // `name` outlive it; the output buffers are sized by the matching *Size calls.
    let out = unsafe {
        let finish = |r: Result<KernelImage, CudaError>| {
            let _ = result::destroy_program(prog);
            r
        };
        if let Err(e) = result::compile_program(prog, &options) {
            let log = result::get_program_log(prog)
                .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                .unwrap_or_else(|_| format!("{e:?} (no log)"));
            return finish(Err(CudaError::Compile {
                file,
                arch: arch_name.to_string(),
                log,
            }));
        }
        let bytes = match kind {
            ImageKind::Ptx => result::get_ptx(prog).map(|p| {
                let mut b: Vec<u8> = p.into_iter().map(|c| c as u8).collect();
                while b.last() == Some(&0) {
                    b.pop();
                }
                b
            }),
            ImageKind::Cubin => {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .and_then(|()| {
                        let mut buf = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                            .result()
                            .map(|()| buf)
                    })
            }
        };
        finish(
            bytes
                .map(|bytes| KernelImage { kind, bytes })
                .map_err(|e| nv("get image", e)),
        )
    };
    out
}

/// What cudarc's loader takes.
pub fn to_cudarc(image: KernelImage) -> cudarc::nvrtc::Ptx {
    match image.kind {
        ImageKind::Ptx => cudarc::nvrtc::Ptx::from_src(String::from_utf8_lossy(&image.bytes)),
        ImageKind::Cubin => cudarc::nvrtc::Ptx::from_binary(image.bytes),
    }
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
