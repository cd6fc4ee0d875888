//! The terminal progress bar of `kiln run`: tasks done / total and generated tokens per second.
//!
//! Shown only when stderr is a terminal (never under systemd or in CI logs). "Total" counts the
//! tasks this run has to finish: those not terminal when it started plus every task recorded
//! since; "done" those of them that are terminal now. Tokens per second come from the engine's
//! `generated_tokens` counter over the last refresh interval.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What the bar shows, computed from ledger counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Tasks in the ledger.
    pub total: u64,
    /// Terminal tasks (succeeded, failed, dead, cancelled).
    pub terminal: u64,
    /// Failed or dead tasks.
    pub failed: u64,
}

/// The bar (hidden when not on a terminal).
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    baseline_terminal: u64,
    last_tokens: Option<(u64, Instant)>,
    tokens_per_s: f64,
}

impl Progress {
    /// A bar on stderr if `enabled` and stderr is a terminal; otherwise a hidden one.
    /// `start` is the ledger's tally when the run began (its terminal tasks are not this run's).
    pub fn new(enabled: bool, start: Tally) -> Self {
        let bar = if enabled && std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(4));
            let style = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} tasks  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        } else {
            ProgressBar::hidden()
        };
        Progress {
            bar,
            baseline_terminal: start.terminal,
            last_tokens: None,
            tokens_per_s: 0.0,
        }
    }

    /// Whether the bar is drawn.
    pub fn is_visible(&self) -> bool {
        !self.bar.is_hidden()
    }

    /// `(done, total)` of this run for a tally.
    pub fn position(&self, t: Tally) -> (u64, u64) {
        let total = t.total.saturating_sub(self.baseline_terminal);
        let done = t.terminal.saturating_sub(self.baseline_terminal).min(total);
        (done, total)
    }

    /// Refresh from a tally and the engine's generated-token counter.
    pub fn update(&mut self, t: Tally, generated_tokens: Option<u64>) {
        let now = Instant::now();
        if let Some(tokens) = generated_tokens {
            if let Some((prev, at)) = self.last_tokens {
                let dt = now.duration_since(at).as_secs_f64();
                if dt > 0.0 {
                    self.tokens_per_s = tokens.saturating_sub(prev) as f64 / dt;
                }
            }
            self.last_tokens = Some((tokens, now));
        }
        let (done, total) = self.position(t);
        self.bar.set_length(total);
        self.bar.set_position(done);
        self.bar.set_message(format!(
            "{:.1} tok/s  {} failed",
            self.tokens_per_s, t.failed
        ));
    }

    /// Print a line above the bar (or to stderr when hidden).
    pub fn println(&self, line: &str) {
        if self.is_visible() {
            self.bar.println(line);
        } else {
            eprintln!("{line}");
        }
    }

    /// Remove the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_this_runs_tasks() {
        let mut p = Progress::new(
            false,
            Tally {
                total: 10,
                terminal: 8,
                failed: 1,
            },
        );
        assert!(!p.is_visible());
        assert_eq!(
            p.position(Tally {
                total: 15,
                terminal: 10,
                failed: 1
            }),
            (2, 7)
        );
        // `kiln retry` can make terminal tasks unfinished again: never negative.
        assert_eq!(
            p.position(Tally {
                total: 10,
                terminal: 5,
                failed: 0
            }),
            (0, 2)
        );
        p.update(
            Tally {
                total: 15,
                terminal: 10,
                failed: 1,
            },
            Some(100),
        );
        std::thread::sleep(Duration::from_millis(20));
        p.update(
            Tally {
                total: 15,
                terminal: 11,
                failed: 1,
            },
            Some(150),
        );
        assert!(
            p.tokens_per_s > 0.0 && p.tokens_per_s <= 50.0 / 0.02,
            "{}",
            p.tokens_per_s
        );
    }
}
