//! The periodic progress line of daemon / journal mode (`daemon.progress_secs`): counts, tasks/s,
//! tokens/s and an ETA, from two samples of the ledger's terminal count and the engine's token
//! counter. Pure arithmetic, so it is tested without a clock.

use std::time::Duration;

/// One sample: terminal tasks and generated tokens so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Tasks in a terminal state.
    pub terminal: u64,
    /// Tokens the engine generated since it started.
    pub tokens: u64,
}

/// Rates between two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Tasks finished per second.
    pub tasks_per_s: f64,
    /// Tokens generated per second.
    pub tokens_per_s: f64,
    /// Seconds until `open` tasks are done at this rate; `None` when nothing finished.
    pub eta_s: Option<f64>,
}

/// Rates from `prev` to `now` over `dt`, and the ETA of `open` unfinished tasks.
pub fn rates(prev: Sample, now: Sample, dt: Duration, open: u64) -> Rates {
    let secs = dt.as_secs_f64().max(1e-3);
    let tasks_per_s = now.terminal.saturating_sub(prev.terminal) as f64 / secs;
    let tokens_per_s = now.tokens.saturating_sub(prev.tokens) as f64 / secs;
    let eta_s = if open == 0 {
        Some(0.0)
    } else if tasks_per_s > 0.0 {
        Some(open as f64 / tasks_per_s)
    } else {
        None
    };
    Rates {
        tasks_per_s,
        tokens_per_s,
        eta_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_eta_follow_the_samples() {
        let r = rates(
            Sample {
                terminal: 10,
                tokens: 1000,
            },
            Sample {
                terminal: 40,
                tokens: 7000,
            },
            Duration::from_secs(30),
            90,
        );
        assert_eq!(r.tasks_per_s, 1.0);
        assert_eq!(r.tokens_per_s, 200.0);
        assert_eq!(r.eta_s, Some(90.0));
        let stalled = rates(
            Sample::default(),
            Sample::default(),
            Duration::from_secs(5),
            3,
        );
        assert_eq!(stalled.eta_s, None, "no progress: no ETA");
        let done = rates(
            Sample::default(),
            Sample::default(),
            Duration::from_secs(5),
            0,
        );
        assert_eq!(done.eta_s, Some(0.0));
    }
}
