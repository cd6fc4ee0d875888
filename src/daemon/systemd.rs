//! systemd integration through `sd_notify`: `READY=1` once the model is loaded and the daemon
//! is taking work, `STATUS=` with the queue depth, `WATCHDOG=1` only while the engine makes
//! progress, `STOPPING=1` on shutdown.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) every call is a no-op. The watchdog rule
//! ([`WatchdogGate`]): a ping is sent when the engine's step counter grew since the last check
//! or nothing is in flight (idle is healthy); a wedged engine with work in flight stops the
//! pings and systemd restarts the service after `WatchdogSec`. The gate is checked every third
//! of the watchdog interval, so one slow step does not trigger a restart.

use std::time::Duration;

use sd_notify::NotifyState;

use crate::engine::EngineStats;

/// One notification, owned so it can cross to the sender thread.
#[derive(Debug, Clone, PartialEq)]
enum Message {
    Ready(String),
    Status(String),
    Watchdog,
    Stopping(String),
    ExtendTimeout(u32),
}

impl Message {
    fn send(&self) -> std::io::Result<()> {
        match self {
            Message::Ready(s) => sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(s)]),
            Message::Status(s) => sd_notify::notify(&[NotifyState::Status(s)]),
            Message::Watchdog => sd_notify::notify(&[NotifyState::Watchdog]),
            Message::Stopping(s) => {
                sd_notify::notify(&[NotifyState::Stopping, NotifyState::Status(s)])
            }
            Message::ExtendTimeout(usec) => {
                sd_notify::notify(&[NotifyState::ExtendTimeoutUsec(*usec)])
            }
        }
    }
}

/// Sends state changes to systemd (no-op outside systemd).
///
/// `sd_notify` writes to a datagram socket and blocks when the reader's queue is full; the
/// messages therefore go through a channel to one sender thread (in order), so neither the
/// async runtime nor its shutdown ever waits on the socket. The thread is detached: a send stuck
/// at exit does not keep the process alive.
#[derive(Debug, Clone)]
pub struct Notifier {
    tx: Option<std::sync::mpsc::Sender<Message>>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Read `NOTIFY_SOCKET` and `WATCHDOG_USEC` from the environment.
    pub fn from_env() -> Self {
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            return Notifier::disabled();
        }
        let (tx, rx) = std::sync::mpsc::channel::<Message>();
        let spawned = std::thread::Builder::new()
            .name("kiln-sd-notify".into())
            .spawn(move || {
                while let Ok(m) = rx.recv() {
                    if let Err(e) = m.send() {
                        tracing::debug!(error = %e, "Could not notify systemd.");
                    }
                }
            });
        match spawned {
            Ok(_) => Notifier {
                tx: Some(tx),
                watchdog: sd_notify::watchdog_enabled(),
            },
            Err(e) => {
                tracing::warn!(error = %e, "Cannot start the systemd notifier thread; not notifying systemd.");
                Notifier::disabled()
            }
        }
    }

    /// A notifier that never sends (tests, `--once` in a terminal).
    pub fn disabled() -> Self {
        Notifier {
            tx: None,
            watchdog: None,
        }
    }

    /// The watchdog interval systemd asked for (`WatchdogSec=`), if any.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.filter(|_| self.tx.is_some())
    }

    fn send(&self, m: Message) {
        if let Some(tx) = &self.tx {
            if tx.send(m).is_err() {
                tracing::debug!("The systemd notifier thread is gone.");
            }
        }
    }

    /// `READY=1` with a first status line.
    pub fn ready(&self, status: &str) {
        self.send(Message::Ready(status.to_string()));
    }

    /// `STATUS=…`.
    pub fn status(&self, status: &str) {
        self.send(Message::Status(status.to_string()));
    }

    /// `WATCHDOG=1`.
    pub fn watchdog(&self) {
        self.send(Message::Watchdog);
    }

    /// `STOPPING=1` with a status line.
    pub fn stopping(&self, status: &str) {
        self.send(Message::Stopping(status.to_string()));
    }

    /// `EXTEND_TIMEOUT_USEC=…`: more time for start-up (model loading) or shutdown.
    pub fn extend_timeout(&self, by: Duration) {
        self.send(Message::ExtendTimeout(
            u32::try_from(by.as_micros()).unwrap_or(u32::MAX),
        ));
    }
}

/// Decides whether the engine looks alive enough to ping the watchdog.
#[derive(Debug, Clone, Default)]
pub struct WatchdogGate {
    last_steps: Option<u64>,
}

impl WatchdogGate {
    /// Whether to ping now, given the engine's counters (`None`: the engine did not answer) and
    /// the number of tasks in flight.
    pub fn should_ping(&mut self, stats: Option<EngineStats>, in_flight: usize) -> bool {
        let Some(stats) = stats else { return false };
        let progressed = self.last_steps.is_none_or(|last| stats.steps > last);
        self.last_steps = Some(stats.steps);
        progressed || in_flight == 0
    }
}

/// The `STATUS=` line: queue depth and what runs.
pub fn status_line(
    queued: u64,
    running: usize,
    retry_wait: u64,
    succeeded: u64,
    failed: u64,
) -> String {
    format!("{queued} queued, {running} running, {retry_wait} waiting to retry; {succeeded} succeeded, {failed} failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(steps: u64) -> Option<EngineStats> {
        Some(EngineStats {
            steps,
            ..Default::default()
        })
    }

    #[test]
    fn watchdog_pings_only_on_progress_or_idle() {
        let mut g = WatchdogGate::default();
        assert!(g.should_ping(stats(0), 3), "first look");
        assert!(!g.should_ping(stats(0), 3), "stuck with work in flight");
        assert!(g.should_ping(stats(5), 3), "progress");
        assert!(g.should_ping(stats(5), 0), "idle is healthy");
        assert!(!g.should_ping(None, 0), "engine gone");
    }

    #[test]
    fn status_line_names_the_queue() {
        assert_eq!(
            status_line(3, 2, 1, 10, 4),
            "3 queued, 2 running, 1 waiting to retry; 10 succeeded, 4 failed"
        );
    }
}
