//! Typed errors shared by the engine and the daemon.
//!
//! Every failure that reaches the ledger carries an [`ErrorClass`]; the class alone decides
//! whether a task is retried (`oom`, `timeout`, `parse`, `internal`) or failed at once
//! (`invalid_input`). `anyhow` is used only at the edges (`main.rs`, tests).

use std::fmt;

/// The closed set of failure classes the ledger stores (`attempts.error_class`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// Out of memory: the KV cache (or the GPU) cannot hold the request right now.
    Oom,
    /// The attempt ran past its deadline (`daemon.task_timeout`).
    Timeout,
    /// The input could not be parsed yet, or the output failed `response_format`.
    Parse,
    /// The request can never succeed as given (prompt over `max_model_len`, bad parameters).
    InvalidInput,
    /// A bug or an unexpected condition inside kiln.
    Internal,
}

impl ErrorClass {
    /// All classes, in a stable order.
    pub const ALL: [ErrorClass; 5] = [
        ErrorClass::Oom,
        ErrorClass::Timeout,
        ErrorClass::Parse,
        ErrorClass::InvalidInput,
        ErrorClass::Internal,
    ];

    /// Stable snake_case label, as stored in the ledger and printed in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Oom => "oom",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Parse => "parse",
            ErrorClass::InvalidInput => "invalid_input",
            ErrorClass::Internal => "internal",
        }
    }

    /// Whether a task failing with this class may be attempted again.
    pub fn is_retryable(self) -> bool {
        !matches!(self, ErrorClass::InvalidInput)
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ErrorClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ErrorClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown error class `{s}` (expected one of oom, timeout, parse, invalid_input, internal)"))
    }
}

/// Why the engine could not complete a request.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum EngineError {
    /// The KV cache or device memory cannot hold the request now; retrying later may work.
    #[error("out of memory: {0}")]
    Oom(String),
    /// The request's deadline passed before it finished.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The request can never succeed as given.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A bug or unexpected state; the engine keeps serving other requests.
    #[error("internal engine error: {0}")]
    Internal(String),
    /// The request was cancelled by its submitter (or the engine is shutting down).
    #[error("cancelled")]
    Cancelled,
    /// The device hit a sticky fault (an illegal address, a failed launch, an uncorrectable ECC
    /// error): every later call on it fails, so the engine stopped. Not the request's fault: the
    /// daemon puts the request back to `queued` without counting the attempt and exits non-zero,
    /// so systemd restarts the process with a fresh device context.
    #[error("the device failed and the engine stopped: {0}")]
    DeviceLost(String),
}

/// CUDA driver results after which the context is unusable until the process exits (CUDA
/// documents these as "sticky": the process must be terminated and relaunched).
const STICKY_CUDA_ERRORS: &[&str] = &[
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
];

impl EngineError {
    /// The ledger class of this error. `Cancelled` maps to `None`: it is not an attempt.
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            EngineError::Oom(_) => Some(ErrorClass::Oom),
            EngineError::Timeout(_) => Some(ErrorClass::Timeout),
            EngineError::InvalidInput(_) => Some(ErrorClass::InvalidInput),
            EngineError::Internal(_) => Some(ErrorClass::Internal),
            EngineError::Cancelled | EngineError::DeviceLost(_) => None,
        }
    }

    /// Whether this error leaves the device unusable (see [`EngineError::DeviceLost`]). The CUDA
    /// backend reports driver errors as `Internal` text naming the `CUresult`
    /// (`device error: CUDA driver: DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, …)`), so the sticky
    /// ones are recognised by that name.
    pub fn is_sticky_device_fault(&self) -> bool {
        match self {
            EngineError::DeviceLost(_) => true,
            EngineError::Internal(m) => STICKY_CUDA_ERRORS.iter().any(|name| m.contains(name)),
            _ => false,
        }
    }
}

/// Errors while loading a model (files, formats, unsupported features). Never retryable.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// An I/O error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not in the expected format.
    #[error("{path}: malformed {format}: {message}")]
    Format {
        /// The file involved.
        path: std::path::PathBuf,
        /// `gguf`, `safetensors`, `config.json`, …
        format: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A feature the model needs that kiln does not support (architecture, dtype, tensor, rope scaling).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A tensor the architecture needs is absent.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// A tensor has the wrong shape.
    #[error("tensor `{name}`: expected shape {expected:?}, found {found:?}")]
    Shape {
        /// Checkpoint key.
        name: String,
        /// Shape the architecture needs.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// Tokenizer construction or chat-template errors.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Backend failure during upload.
    #[error("backend: {0}")]
    Backend(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_invalid_input_is_final() {
        for c in ErrorClass::ALL {
            assert_eq!(c.is_retryable(), c != ErrorClass::InvalidInput, "{c}");
        }
    }

    #[test]
    fn class_labels_round_trip() {
        for c in ErrorClass::ALL {
            assert_eq!(c.as_str().parse::<ErrorClass>(), Ok(c));
        }
        assert!("bogus".parse::<ErrorClass>().is_err());
    }

    #[test]
    fn cancelled_is_not_an_attempt() {
        assert_eq!(EngineError::Cancelled.class(), None);
        assert_eq!(EngineError::Oom("x".into()).class(), Some(ErrorClass::Oom));
    }
}
