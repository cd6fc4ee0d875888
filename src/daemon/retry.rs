//! The retry policy: which failures are retried, how long to wait, when a task is dead.
//!
//! - `invalid_input` is never retried (the task becomes `failed`).
//! - Every other class is retried while `attempts < max_attempts[class]`; after that the task is
//!   `dead`. `attempts` counts finished attempts including the one that just failed; an attempt
//!   cut by shutdown is not counted (the ledger releases it without touching `attempts`).
//! - The delay before attempt `n + 1` (after `n` finished attempts) is
//!   `min(max, base · 2^(n-1)) · (1 ± jitter)`, never negative.

use std::time::Duration;

use rand::Rng;

use crate::error::ErrorClass;

/// What happens to a task after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RetryDecision {
    /// Try again after this delay (`retry_wait`).
    Retry(Duration),
    /// Not retryable (`failed`).
    Fail,
    /// Retryable, but the class's attempts are used up (`dead`).
    Dead,
}

/// Backoff and per-class attempt limits (`[retry]` in `config.toml`).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Delay before the second attempt, in seconds.
    pub backoff_base_secs: f64,
    /// Cap on the delay (before jitter), in seconds.
    pub backoff_max_secs: f64,
    /// Relative jitter in `[0, 1)`: the delay is multiplied by a uniform factor in `1 ± jitter`.
    pub jitter: f64,
    /// Most attempts for `oom` failures.
    pub max_attempts_oom: u32,
    /// Most attempts for `timeout` failures.
    pub max_attempts_timeout: u32,
    /// Most attempts for `parse` failures.
    pub max_attempts_parse: u32,
    /// Most attempts for `internal` failures.
    pub max_attempts_internal: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            backoff_base_secs: 2.0,
            backoff_max_secs: 300.0,
            jitter: 0.2,
            max_attempts_oom: 4,
            max_attempts_timeout: 3,
            max_attempts_parse: 3,
            max_attempts_internal: 3,
        }
    }
}

impl RetryPolicy {
    /// Most attempts a task may make when it keeps failing with `class` (1 for `invalid_input`).
    pub fn max_attempts(&self, class: ErrorClass) -> u32 {
        match class {
            ErrorClass::Oom => self.max_attempts_oom,
            ErrorClass::Timeout => self.max_attempts_timeout,
            ErrorClass::Parse => self.max_attempts_parse,
            ErrorClass::Internal => self.max_attempts_internal,
            ErrorClass::InvalidInput => 1,
        }
    }

    /// The un-jittered delay after `attempts` finished attempts (`attempts ≥ 1`).
    pub fn base_delay(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(62) as i32;
        let secs = (self.backoff_base_secs * 2f64.powi(exp))
            .min(self.backoff_max_secs)
            .max(0.0);
        Duration::from_secs_f64(secs)
    }

    /// The delay after `attempts` finished attempts, with jitter drawn from `rng`.
    pub fn delay(&self, attempts: u32, rng: &mut impl Rng) -> Duration {
        let base = self.base_delay(attempts).as_secs_f64();
        let j = self.jitter.clamp(0.0, 0.999);
        let factor = if j > 0.0 {
            rng.random_range(1.0 - j..=1.0 + j)
        } else {
            1.0
        };
        Duration::from_secs_f64((base * factor).max(0.0))
    }

    /// What to do after attempt number `attempts` failed with `class`.
    pub fn decide(&self, class: ErrorClass, attempts: u32, rng: &mut impl Rng) -> RetryDecision {
        if !class.is_retryable() {
            RetryDecision::Fail
        } else if attempts >= self.max_attempts(class) {
            RetryDecision::Dead
        } else {
            RetryDecision::Retry(self.delay(attempts, rng))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicy {
            backoff_base_secs: 2.0,
            backoff_max_secs: 10.0,
            ..Default::default()
        };
        let secs: Vec<f64> = (1..=5).map(|n| p.base_delay(n).as_secs_f64()).collect();
        assert_eq!(secs, vec![2.0, 4.0, 8.0, 10.0, 10.0]);
        assert_eq!(p.base_delay(u32::MAX).as_secs_f64(), 10.0);
    }

    #[test]
    fn jitter_stays_in_bounds_and_varies() {
        let p = RetryPolicy {
            backoff_base_secs: 10.0,
            jitter: 0.2,
            ..Default::default()
        };
        let mut rng = StdRng::seed_from_u64(1);
        let draws: Vec<f64> = (0..200)
            .map(|_| p.delay(1, &mut rng).as_secs_f64())
            .collect();
        assert!(draws.iter().all(|d| (8.0..=12.0).contains(d)), "{draws:?}");
        let min = draws.iter().cloned().fold(f64::MAX, f64::min);
        let max = draws.iter().cloned().fold(0.0, f64::max);
        assert!(max - min > 1.0, "jitter should spread delays: {min}..{max}");
        let none = RetryPolicy { jitter: 0.0, ..p };
        assert_eq!(none.delay(2, &mut rng), Duration::from_secs(20));
    }

    #[test]
    fn classes_follow_their_limits() {
        let p = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(2);
        assert_eq!(
            p.decide(ErrorClass::InvalidInput, 1, &mut rng),
            RetryDecision::Fail
        );
        assert!(matches!(
            p.decide(ErrorClass::Oom, 3, &mut rng),
            RetryDecision::Retry(_)
        ));
        assert_eq!(p.decide(ErrorClass::Oom, 4, &mut rng), RetryDecision::Dead);
        for c in [ErrorClass::Timeout, ErrorClass::Parse, ErrorClass::Internal] {
            assert!(
                matches!(p.decide(c, 2, &mut rng), RetryDecision::Retry(_)),
                "{c}"
            );
            assert_eq!(p.decide(c, 3, &mut rng), RetryDecision::Dead, "{c}");
        }
    }
}
