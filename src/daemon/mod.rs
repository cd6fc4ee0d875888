//! The daemon: `inputs/` → ledger → engine → `outputs/<YYYY-MM-DD>/`.
//!
//! [`run`] wires the parts together and owns the main loop:
//! ```text
//! watcher ──Found──▶ ingest ──rows──▶ ledger ◀──claim/finish── dispatcher ──submit──▶ engine
//!                                        │
//!                                        └──finished files──▶ publish ──▶ outputs/
//! ```
//! - Start: recover tasks left `running` by a crash (back to `queued`, the attempt counted),
//!   complete (or roll back) output groups a crash left between staging and recording, remove
//!   stale temporaries, publish outputs that were due, open the metrics endpoint when
//!   `metrics.listen` is set, start the watcher and ingest (which skips unchanged inputs unread),
//!   then `READY=1` (the engine handed in is already loaded).
//! - Loop: keep `daemon.concurrency` attempts in flight; record each result; publish an input
//!   file's outputs once all its tasks are terminal (checked every second for files that changed);
//!   wake for due retries; report `STATUS=` / the progress bar.
//! - Shutdown (the token fires: SIGTERM, ctrl-c): stop intake and claims, let in-flight attempts
//!   finish for `daemon.shutdown_grace_secs`, then cancel the rest and put them back to `queued`
//!   without counting the attempt; publish what finished.
//! - `--once` ([`RunOptions::once`]): the same, but the loop ends by itself once everything that was
//!   in `inputs/` at start has been taken and no task is `queued`, `running` or `retry_wait`. It
//!   waits for retries: a task in backoff is waited for (at most `retry.backoff_max_secs` per
//!   attempt) until it succeeds or is `failed` / `dead`.
//! - Errors: a ledger failure or an engine that stopped ends the run with a [`DaemonError`]
//!   (non-zero exit); failed tasks never do.

pub mod attempt;
pub mod dispatcher;
pub mod ingest;
pub mod intake;
pub mod metrics;
pub mod openai;
pub mod progress;
pub mod publish;
pub mod retry;
pub mod systemd;
pub mod task_log;
pub mod throughput;
pub mod watcher;
pub mod writer;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::EngineHandle;
use crate::ledger::{Counts, InputFileId, Ledger, LedgerError, TaskState};

use self::attempt::{AttemptContext, AttemptResult};
use self::dispatcher::{Clock, DispatchCounts, Dispatcher};
use self::ingest::{IngestConfig, IngestEvent};
use self::progress::{Progress, Tally};
use self::publish::Publisher;
use self::retry::RetryPolicy;
use self::systemd::{Notifier, WatchdogGate};
use self::task_log::TaskLogs;
use self::watcher::{WatchConfig, WatchError};
use self::writer::OutputDir;

/// How often the loop looks at the clock when nothing happens (due retries, `kiln retry` from
/// another process, outputs of changed files, status).
const TICK: Duration = Duration::from_secs(1);

/// How often `STATUS=` is refreshed.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// How often every due output is looked for (a failed write is tried again then).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Options of one run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Stop once `inputs/` has been taken and every task is terminal.
    pub once: bool,
    /// Show a progress bar when stderr is a terminal.
    pub progress: bool,
    /// systemd notifications (disabled outside systemd).
    pub notifier: Notifier,
    /// The model name written into outputs (`model.name`, or the model file's stem); `None` =
    /// the name the engine reports.
    pub model_name: Option<String>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            once: false,
            progress: false,
            notifier: Notifier::disabled(),
            model_name: None,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Input files recorded by this run.
    pub files: u64,
    /// Tasks recorded by this run (queued or rejected at intake).
    pub tasks: u64,
    /// Tasks rejected at intake by this run.
    pub rejected: u64,
    /// Attempt outcomes of this run.
    pub dispatch: DispatchCounts,
    /// Tasks left running by a crashed previous run that went back to `queued`.
    pub recovered: u64,
    /// Whether the run ended because of a shutdown request.
    pub shut_down: bool,
    /// Tasks not yet terminal when the run ended (`queued`, `retry_wait`).
    pub unfinished: u64,
    /// Failed or dead tasks in the ledger when the run ended.
    pub failed_total: u64,
    /// Input files this run read and hashed.
    pub inputs_hashed: u64,
    /// Input files this run skipped without reading (unchanged since recorded).
    pub inputs_unchanged: u64,
}

/// Why the daemon itself failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The ledger failed (disk full, corruption, a conflicting transition).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The inputs folder cannot be watched.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// The metrics endpoint (`metrics.listen`) could not be opened.
    #[error(transparent)]
    Metrics(#[from] self::metrics::MetricsError),
    /// A folder could not be created.
    #[error("{path}: {source}")]
    Io {
        /// The folder.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The engine stopped answering (its thread ended).
    #[error("the engine stopped")]
    EngineStopped,
    /// The device hit a sticky fault and the engine stopped; the interrupted tasks are back in
    /// `queued` (their attempt not counted). Exit non-zero: systemd restarts kiln.
    #[error("the device failed (restart kiln to get a fresh device context): {0}")]
    DeviceLost(String),
}

impl From<&crate::config::RetrySettings> for RetryPolicy {
    fn from(r: &crate::config::RetrySettings) -> Self {
        RetryPolicy {
            backoff_base_secs: r.backoff_base_secs,
            backoff_max_secs: r.backoff_max_secs,
            jitter: r.jitter,
            max_attempts_oom: r.max_attempts.oom,
            max_attempts_timeout: r.max_attempts.timeout,
            max_attempts_parse: r.max_attempts.parse,
            max_attempts_internal: r.max_attempts.internal,
        }
    }
}

fn tally(c: &Counts) -> Tally {
    let terminal = [
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Dead,
        TaskState::Cancelled,
    ]
    .iter()
    .map(|s| c.get(*s))
    .sum();
    Tally {
        total: c.total,
        terminal,
        failed: c.get(TaskState::Failed) + c.get(TaskState::Dead),
    }
}

fn status_of(c: &Counts, running: usize) -> String {
    systemd::status_line(
        c.get(TaskState::Queued),
        running,
        c.get(TaskState::RetryWait),
        c.get(TaskState::Succeeded),
        c.get(TaskState::Failed) + c.get(TaskState::Dead),
    )
}

/// Run the daemon until `shutdown` fires (or, with `opts.once`, until the work is done).
///
/// The caller has loaded the configuration, opened the ledger and taken its exclusive lock, and
/// started the engine; it shuts the engine down after this returns.
pub async fn run(
    config: &Config,
    ledger: Ledger,
    engine: EngineHandle,
    shutdown: CancellationToken,
    opts: RunOptions,
) -> Result<RunSummary, DaemonError> {
    let d = &config.daemon;
    for dir in [&d.inputs, &d.outputs, &d.logs] {
        std::fs::create_dir_all(dir).map_err(|source| DaemonError::Io {
            path: dir.clone(),
            source,
        })?;
    }
    let logs = TaskLogs::new(&d.logs);
    let policy = RetryPolicy::from(&config.retry);
    let clock = Clock::start();
    let mut summary = RunSummary::default();

    let recovered = ledger
        .recover_running(config.retry.max_attempts.internal)
        .await?;
    for id in &recovered.requeued {
        logs.warn(
            &id.to_string(),
            "kiln stopped during the last attempt (crash, kill or power loss); back to queued.",
        );
    }
    for id in &recovered.dead {
        logs.error(
            &id.to_string(),
            "kiln stopped during every allowed attempt of this task; dead (internal).",
        );
    }
    for id in &recovered.cancelled {
        logs.warn(
            &id.to_string(),
            "cancelled by `kiln cancel`; kiln stopped before it could stop the attempt.",
        );
    }
    summary.recovered = recovered.requeued.len() as u64;

    let outputs = OutputDir::new(&d.outputs);
    let publisher = Publisher::new(ledger.clone(), outputs.clone(), logs.clone());
    // Before the stale temporaries go: an interrupted group is completed from its own.
    publisher.recover().await?;
    let stale = outputs.remove_stale_temporaries();
    if stale > 0 {
        tracing::info!(
            files = stale,
            "Removed temporaries of an interrupted output write."
        );
    }
    publisher.publish_ready().await?;

    let metrics = Arc::new(self::metrics::Metrics::new());
    // The endpoint stops when `run` returns (the guard), after the shutdown drain.
    let metrics_stop = CancellationToken::new();
    let _metrics_guard = metrics_stop.clone().drop_guard();
    if let Some(addr) = config.metrics.listen_addr() {
        self::metrics::serve(
            addr,
            metrics.clone(),
            ledger.clone(),
            engine.clone(),
            metrics_stop.clone(),
        )
        .await?;
    }

    let intake_token = shutdown.child_token();
    let watch_cfg = WatchConfig {
        inputs: d.inputs.clone(),
        stable: d.stable(),
        rescan: d.rescan(),
        poll: d.poll,
        poll_interval: d.poll_interval(),
        follow_symlinks: d.follow_symlinks,
    };
    let (watcher, found) = watcher::spawn(watch_cfg, intake_token.clone())?;
    let ingest_cfg = IngestConfig {
        max_input_bytes: d.max_input_bytes,
        policy: policy.clone(),
    };
    let (mut events, mut ingest_status) = ingest::spawn(
        ledger.clone(),
        logs.clone(),
        watcher,
        found,
        ingest_cfg,
        intake_token.clone(),
    );

    let model = opts
        .model_name
        .clone()
        .unwrap_or_else(|| engine.info().model.clone());
    let ctx = AttemptContext {
        engine: engine.clone(),
        model,
        task_timeout: d.task_timeout(),
        default_max_tokens: d.default_max_tokens,
        logs: logs.clone(),
    };
    let concurrency = config.daemon_concurrency();
    let mut disp = Dispatcher::new(ledger.clone(), ctx, policy, concurrency, clock);

    let in_flight = Arc::new(AtomicUsize::new(0));
    // The watchdog keeps pinging through the shutdown grace period; it stops when `run` returns.
    let watchdog_stop = CancellationToken::new();
    let _watchdog_guard = watchdog_stop.clone().drop_guard();
    if let Some(interval) = opts.notifier.watchdog_interval() {
        spawn_watchdog(
            opts.notifier.clone(),
            engine.clone(),
            in_flight.clone(),
            interval,
            watchdog_stop.clone(),
        );
    }
    let counts = ledger.counts().await?;
    let mut progress = Progress::new(opts.progress, tally(&counts));
    opts.notifier.ready(&status_of(&counts, 0));
    tracing::info!(
        model = %engine.info().model, device = %engine.info().device, concurrency,
        inputs = %d.inputs.display(), outputs = %d.outputs.display(), once = opts.once,
        "Daemon ready."
    );

    let mut dirty: HashSet<InputFileId> = HashSet::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_status = tokio::time::Instant::now();
    let mut last_sweep = tokio::time::Instant::now();
    let progress_every = Duration::from_secs(d.progress_secs);
    let mut last_line = (
        tokio::time::Instant::now(),
        throughput::Sample {
            terminal: tally(&counts).terminal,
            tokens: engine.stats().await.map_or(0, |s| s.generated_tokens),
        },
    );
    let mut ingest_open = true;

    loop {
        if shutdown.is_cancelled() {
            summary.shut_down = true;
            break;
        }
        let started = disp.fill().await?;
        in_flight.store(disp.in_flight(), Ordering::Relaxed);

        // When the engine has room but nothing is claimable: sleep until the next retry is due.
        let mut wake = TICK;
        if started == 0 && disp.in_flight() < concurrency {
            if let Some(at) = ledger.next_attempt_at().await? {
                wake = wake.min(clock.until(at));
            }
        }

        if opts.once && disp.in_flight() == 0 && events.is_empty() {
            let s = *ingest_status.borrow();
            if s.initial_scan_done && s.deferred == 0 {
                let c = ledger.counts().await?;
                let open = c.get(TaskState::Queued)
                    + c.get(TaskState::Running)
                    + c.get(TaskState::RetryWait);
                if open == 0 {
                    tracing::info!("Every task is finished (--once).");
                    break;
                }
            }
        }

        tokio::select! {
            _ = shutdown.cancelled() => {
                summary.shut_down = true;
                break;
            }
            done = disp.next_done(), if disp.in_flight() > 0 => {
                if let Some((id, result)) = done {
                    if let AttemptResult::DeviceLost(why) = &result {
                        let why = why.clone();
                        tracing::error!(error = %why, in_flight = disp.in_flight(), "The device failed; putting every task in flight back to queued and stopping.");
                        disp.finish(id, result).await?;
                        disp.abandon_all("the device failed").await?;
                        intake_token.cancel();
                        publish_all(&publisher, &mut dirty).await?;
                        return Err(DaemonError::DeviceLost(why));
                    }
                    let engine_gone = matches!(&result, AttemptResult::Failed { class: crate::error::ErrorClass::Internal, .. })
                        && engine.stats().await.is_none();
                    if engine_gone {
                        disp.finish(id, AttemptResult::Interrupted("the engine stopped".into())).await?;
                        disp.abandon_all("the engine stopped").await?;
                        intake_token.cancel();
                        return Err(DaemonError::EngineStopped);
                    }
                    let f = disp.finish(id, result.clone()).await?;
                    metrics.attempt_finished(&result, f.state);
                    if f.state.is_terminal() {
                        dirty.insert(f.input_file_id);
                    }
                }
            }
            ev = events.recv(), if ingest_open => match ev {
                Some(IngestEvent::Recorded { input_file_id, queued, rejected }) => {
                    summary.files += 1;
                    summary.tasks += (queued + rejected) as u64;
                    summary.rejected += rejected as u64;
                    if rejected > 0 {
                        dirty.insert(input_file_id);
                    }
                }
                Some(IngestEvent::Failed(e)) => {
                    disp.interrupt_all("the ledger failed").await.ok();
                    intake_token.cancel();
                    return Err(e.into());
                }
                None => ingest_open = false,
            },
            changed = ingest_status.changed(), if ingest_open => {
                // The sender is gone once ingest stopped; stop listening instead of spinning.
                if changed.is_err() {
                    ingest_open = false;
                }
            }
            _ = tokio::time::sleep(wake) => {}
            _ = tick.tick() => {
                for id in ledger.cancel_requested().await? {
                    if let Some(f) = disp.cancel(id).await? {
                        metrics.task_finished(f.state);
                        dirty.insert(f.input_file_id);
                    }
                }
                for id in std::mem::take(&mut dirty) {
                    publisher.publish_file(id).await?;
                }
                if last_sweep.elapsed() >= SWEEP_EVERY {
                    last_sweep = tokio::time::Instant::now();
                    publisher.publish_ready().await?;
                }
                if d.progress_secs > 0 && last_line.0.elapsed() >= progress_every {
                    let c = ledger.counts().await?;
                    let stats = engine.stats().await.unwrap_or_default();
                    let now = throughput::Sample { terminal: tally(&c).terminal, tokens: stats.generated_tokens };
                    let open = c.get(TaskState::Queued) + c.get(TaskState::Running) + c.get(TaskState::RetryWait);
                    let r = throughput::rates(last_line.1, now, last_line.0.elapsed(), open);
                    tracing::info!(
                        queued = c.get(TaskState::Queued), running = disp.in_flight(),
                        retry_wait = c.get(TaskState::RetryWait), succeeded = c.get(TaskState::Succeeded),
                        failed = c.get(TaskState::Failed) + c.get(TaskState::Dead),
                        tasks_per_s = format!("{:.2}", r.tasks_per_s), tokens_per_s = format!("{:.1}", r.tokens_per_s),
                        eta_s = r.eta_s.map_or_else(|| "unknown".to_owned(), |e| format!("{e:.0}")),
                        kv_blocks_used = stats.kv_blocks_used, kv_blocks_total = stats.kv_blocks_total,
                        "Progress."
                    );
                    last_line = (tokio::time::Instant::now(), now);
                }
                let show = progress.is_visible();
                let status_due = last_status.elapsed() >= STATUS_EVERY;
                if show || status_due {
                    let c = ledger.counts().await?;
                    if show {
                        let tokens = engine.stats().await.map(|s| s.generated_tokens);
                        progress.update(tally(&c), tokens);
                    }
                    if status_due {
                        last_status = tokio::time::Instant::now();
                        opts.notifier.status(&status_of(&c, disp.in_flight()));
                    }
                }
            }
        }
    }

    // Stop taking work; let what runs finish within the grace period.
    intake_token.cancel();
    if summary.shut_down {
        let grace = d.shutdown_grace();
        opts.notifier.stopping(&format!(
            "stopping: {} in flight, grace {}s",
            disp.in_flight(),
            grace.as_secs()
        ));
        tracing::info!(
            in_flight = disp.in_flight(),
            grace_s = grace.as_secs(),
            "Shutting down: intake stopped."
        );
        let deadline = tokio::time::Instant::now() + grace;
        while disp.in_flight() > 0 {
            tokio::select! {
                done = disp.next_done() => match done {
                    Some((id, result)) => {
                        let f = disp.finish(id, result.clone()).await?;
                        metrics.attempt_finished(&result, f.state);
                        if f.state.is_terminal() {
                            dirty.insert(f.input_file_id);
                        }
                    }
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let cut = disp
            .interrupt_all("shutdown: the grace period ended")
            .await?;
        if cut > 0 {
            tracing::warn!(
                interrupted = cut,
                "Shutdown grace ended; unfinished attempts back to queued."
            );
        }
    }
    for id in std::mem::take(&mut dirty) {
        publisher.publish_file(id).await?;
    }
    publisher.publish_ready().await?;
    progress.finish();
    {
        let s = *ingest_status.borrow();
        summary.inputs_hashed = s.hashed;
        summary.inputs_unchanged = s.unchanged;
    }

    let c = ledger.counts().await?;
    summary.dispatch = disp.counts();
    summary.unfinished =
        c.get(TaskState::Queued) + c.get(TaskState::RetryWait) + c.get(TaskState::Running);
    summary.failed_total = c.get(TaskState::Failed) + c.get(TaskState::Dead);
    tracing::info!(
        succeeded = summary.dispatch.succeeded,
        failed = summary.dispatch.failed,
        dead = summary.dispatch.dead,
        interrupted = summary.dispatch.interrupted,
        unfinished = summary.unfinished,
        "Daemon stopped."
    );
    Ok(summary)
}

/// Publish the files marked dirty.
async fn publish_all(
    publisher: &Publisher,
    dirty: &mut HashSet<InputFileId>,
) -> Result<(), LedgerError> {
    for id in std::mem::take(dirty) {
        publisher.publish_file(id).await?;
    }
    Ok(())
}

/// Ping the systemd watchdog every third of its interval while the engine makes progress, until
/// `stop` fires.
fn spawn_watchdog(
    notifier: Notifier,
    engine: EngineHandle,
    in_flight: Arc<AtomicUsize>,
    interval: Duration,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        let mut gate = WatchdogGate::default();
        let mut every = tokio::time::interval((interval / 3).max(Duration::from_millis(100)));
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = every.tick() => {
                    let stats = engine.stats().await;
                    if gate.should_ping(stats, in_flight.load(Ordering::Relaxed)) {
                        notifier.watchdog();
                    } else {
                        tracing::warn!("Engine made no progress with work in flight; watchdog not pinged.");
                    }
                }
            }
        }
    });
}
