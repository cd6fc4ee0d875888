//! `[retry]` of `config.toml`: the backoff between attempts and the attempt limits per error
//! class ([`MaxAttempts`]), with their defaults.

use serde::{Deserialize, Serialize};

use crate::error::ErrorClass;

/// `[retry]`: the delay before attempt n+1 is `min(max, base · 2^(n-1)) · (1 ± jitter)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrySettings {
    /// Delay after the first failed attempt, in seconds.
    pub backoff_base_secs: f64,
    /// Upper bound of the delay, in seconds.
    pub backoff_max_secs: f64,
    /// Relative jitter in `0..1`: the delay is scaled by a uniform factor in `1 ± jitter`.
    pub jitter: f64,
    /// Attempts per retryable class before a task is `dead`.
    pub max_attempts: MaxAttempts,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            backoff_base_secs: 2.0,
            backoff_max_secs: 300.0,
            jitter: 0.2,
            max_attempts: MaxAttempts::default(),
        }
    }
}

/// `retry.max_attempts`: attempts (the first included) per retryable class. `invalid_input` is never retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MaxAttempts {
    /// Out of memory.
    pub oom: u32,
    /// Past the attempt deadline.
    pub timeout: u32,
    /// Input not parseable yet, or output failing `response_format`.
    pub parse: u32,
    /// Unexpected errors inside kiln; also bounds restarts after a crash mid-attempt.
    pub internal: u32,
}

impl Default for MaxAttempts {
    fn default() -> Self {
        MaxAttempts {
            oom: 4,
            timeout: 3,
            parse: 3,
            internal: 3,
        }
    }
}

impl MaxAttempts {
    /// The attempt limit of `class` (1 for `invalid_input`: never retried).
    pub fn for_class(&self, class: ErrorClass) -> u32 {
        match class {
            ErrorClass::Oom => self.oom,
            ErrorClass::Timeout => self.timeout,
            ErrorClass::Parse => self.parse,
            ErrorClass::Internal => self.internal,
            ErrorClass::InvalidInput => 1,
        }
    }
}
