//! Ingest: what the watcher found → rows in the ledger (an input file and its tasks).
//!
//! Runs as its own tokio task so reading and hashing a large file never delays the dispatcher.
//! For each stable file: skip it without reading when its size, mtime and inode are those the
//! ledger recorded with a known content of this path ([`Ledger::unchanged_known_input`]); else
//! read and hash it (blocking pool), skip it when the ledger already knows this content of this
//! path, split it into tasks ([`intake`](crate::daemon::intake)), record the
//! file and all its tasks in one transaction, and write each task's first log lines.
//!
//! - A file that looks cut short is looked at again after the `parse` backoff, up to
//!   `retry.max_attempts.parse` looks; the last look takes it as is (the cut part fails `parse`).
//! - An entry the watcher refused (a symlink out of `inputs/`, a FIFO) is recorded as one task that
//!   is `failed` at once, so the refusal shows in `kiln list` and in an error file; entries without
//!   a task-file extension only reach the daemon log.
//! - A file that cannot be read (permissions, vanished) is looked at again after a few seconds.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::daemon::intake::{IntakeOutcome, RawInput};
use crate::daemon::retry::RetryPolicy;
use crate::daemon::task_log::TaskLogs;
use crate::daemon::watcher::{Found, WatcherHandle};
use crate::error::ErrorClass;
use crate::ledger::{
    FileStamp, InputFileId, InputKind, Ledger, LedgerError, NewInputFile, NewTask, NewTaskBody,
};

/// How long to wait before looking again at a file that could not be read.
const UNREADABLE_RETRY: Duration = Duration::from_secs(5);

/// What ingest tells the daemon.
#[derive(Debug)]
pub enum IngestEvent {
    /// A file and its tasks were recorded.
    Recorded {
        /// The new input file row.
        input_file_id: InputFileId,
        /// Tasks queued.
        queued: usize,
        /// Tasks failed at intake.
        rejected: usize,
    },
    /// The ledger failed: the daemon cannot go on.
    Failed(LedgerError),
}

/// Whether ingest has caught up (for `kiln run --once`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestStatus {
    /// Everything present at start has been recorded or skipped.
    pub initial_scan_done: bool,
    /// Files waiting for another look (cut short or unreadable).
    pub deferred: usize,
    /// Files read and hashed so far.
    pub hashed: u64,
    /// Files skipped without reading: unchanged since the ledger recorded them.
    pub unchanged: u64,
}

/// Settings of the ingest task.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Larger files fail as `invalid_input` (`daemon.max_input_bytes`).
    pub max_input_bytes: u64,
    /// Backoff and the number of looks at a file cut short (`retry.max_attempts.parse`).
    pub policy: RetryPolicy,
}

struct Ingest {
    ledger: Ledger,
    logs: TaskLogs,
    watcher: WatcherHandle,
    cfg: IngestConfig,
    /// Looks so far at files that were cut short or unreadable.
    looks: HashMap<PathBuf, u32>,
    events: mpsc::UnboundedSender<IngestEvent>,
    status: watch::Sender<IngestStatus>,
    rng: StdRng,
}

/// Start ingesting what the watcher finds; stops at shutdown or when the watcher stops.
pub fn spawn(
    ledger: Ledger,
    logs: TaskLogs,
    watcher: WatcherHandle,
    mut found: mpsc::UnboundedReceiver<Found>,
    cfg: IngestConfig,
    shutdown: CancellationToken,
) -> (
    mpsc::UnboundedReceiver<IngestEvent>,
    watch::Receiver<IngestStatus>,
) {
    let (events, events_rx) = mpsc::unbounded_channel();
    let (status, status_rx) = watch::channel(IngestStatus::default());
    let mut ingest = Ingest {
        ledger,
        logs,
        watcher,
        cfg,
        looks: HashMap::new(),
        events,
        status,
        rng: StdRng::from_os_rng(),
    };
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                _ = shutdown.cancelled() => break,
                item = found.recv() => item,
            };
            let Some(item) = item else { break };
            let result = match item {
                Found::InitialScanDone => {
                    ingest.status.send_modify(|s| s.initial_scan_done = true);
                    Ok(())
                }
                Found::File { path, rel, kind } => ingest.file(path, rel, kind).await,
                Found::Rejected { path, rel, reason } => ingest.rejected(path, rel, reason).await,
            };
            if let Err(e) = result {
                tracing::error!(error = %e, "Ingest stopped: the ledger failed.");
                let _ = ingest.events.send(IngestEvent::Failed(e));
                break;
            }
        }
        tracing::debug!("Ingest stopped.");
    });
    (events_rx, status_rx)
}

impl Ingest {
    fn set_deferred(&self) {
        let n = self.looks.len();
        self.status.send_modify(|s| s.deferred = n);
    }

    fn look_again(&mut self, path: PathBuf, after: Duration) {
        self.watcher.retry_later(path, after);
    }

    async fn file(
        &mut self,
        path: PathBuf,
        rel: String,
        kind: InputKind,
    ) -> Result<(), LedgerError> {
        let stamp = std::fs::metadata(&path).ok().map(|m| FileStamp::of(&m));
        if let Some(st) = stamp {
            if let Some(sha) = self.ledger.unchanged_known_input(&rel, st).await? {
                tracing::debug!(path = %path.display(), sha256 = %sha, "Input unchanged since recorded; skipped without reading.");
                self.looks.remove(&path);
                self.status.send_modify(|s| s.unchanged += 1);
                self.set_deferred();
                return Ok(());
            }
        }
        let max = self.cfg.max_input_bytes;
        let p = path.clone();
        let raw =
            tokio::task::spawn_blocking(move || crate::daemon::intake::read_raw(&p, max)).await;
        if matches!(raw, Ok(Ok(_))) {
            self.status.send_modify(|s| s.hashed += 1);
        }
        // The stamp is kept only when the file did not change while it was read.
        let stamp =
            stamp.filter(|st| std::fs::metadata(&path).is_ok_and(|m| FileStamp::of(&m) == *st));
        let raw: RawInput = match raw {
            Ok(Ok(raw)) => raw,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                self.looks.remove(&path);
                self.set_deferred();
                return Ok(());
            }
            Ok(Err(e)) => {
                let looks = self.looks.get(&path).copied().unwrap_or(0) + 1;
                if looks >= self.cfg.policy.max_attempts(ErrorClass::Parse) {
                    tracing::error!(path = %path.display(), error = %e, looks, "Cannot read an input file; giving up until it changes.");
                    self.looks.remove(&path);
                } else {
                    tracing::warn!(path = %path.display(), error = %e, "Cannot read an input file; will look again.");
                    self.looks.insert(path.clone(), looks);
                    self.look_again(path, UNREADABLE_RETRY);
                }
                self.set_deferred();
                return Ok(());
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "Reading an input file panicked.");
                return Ok(());
            }
        };
        if self.ledger.input_file_known(&rel, &raw.sha256).await? {
            tracing::debug!(path = %path.display(), sha256 = %raw.sha256, "Input already recorded; skipped.");
            if let Some(st) = stamp {
                self.ledger
                    .record_input_stamp(&rel, st, &raw.sha256)
                    .await?;
            }
            self.looks.remove(&path);
            self.set_deferred();
            return Ok(());
        }
        let looks = self.looks.get(&path).copied().unwrap_or(0) + 1;
        let allow_incomplete = looks < self.cfg.policy.max_attempts(ErrorClass::Parse);
        let (raw, outcome) = match tokio::task::spawn_blocking(move || {
            let o = raw.parse(kind, allow_incomplete);
            (raw, o)
        })
        .await
        {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "Parsing an input file panicked.");
                return Ok(());
            }
        };
        let specs = match outcome {
            IntakeOutcome::Incomplete(why) => {
                let delay = self.cfg.policy.delay(looks, &mut self.rng);
                tracing::info!(path = %path.display(), look = looks, delay_s = delay.as_secs_f64(), reason = %why, "Input looks incomplete; will look again.");
                self.looks.insert(path.clone(), looks);
                self.set_deferred();
                self.look_again(path, delay);
                return Ok(());
            }
            IntakeOutcome::Tasks(specs) => specs,
        };
        self.looks.remove(&path);
        self.set_deferred();

        let tasks: Vec<NewTask> = specs
            .iter()
            .map(|s| NewTask {
                line: s.line,
                custom_id: s.custom_id.clone(),
                body: match &s.body {
                    Ok(v) => NewTaskBody::Request(v.to_string()),
                    Err(e) => NewTaskBody::Rejected {
                        class: e.class,
                        message: e.message.clone(),
                    },
                },
            })
            .collect();
        let file = NewInputFile {
            path: rel.clone(),
            sha256: raw.sha256.clone(),
            size: raw.size,
            kind,
        };
        let recorded = self.ledger.record_input_file(&file, &tasks).await?;
        if let Some(st) = stamp {
            // Recorded now, or by a concurrent intake of the same content: known either way.
            self.ledger
                .record_input_stamp(&rel, st, &raw.sha256)
                .await?;
        }
        let Some(rec) = recorded else {
            return Ok(());
        };
        let mut rejected = 0;
        for (spec, id) in specs.iter().zip(&rec.task_ids) {
            let id = id.to_string();
            let at = match (spec.line, &spec.custom_id) {
                (Some(l), Some(c)) => format!(" line {l} (custom_id `{c}`)"),
                (Some(l), None) => format!(" line {l}"),
                _ => String::new(),
            };
            self.logs.info(
                &id,
                &format!(
                    "Taken from inputs/{rel}{at} (sha256 {}, {} bytes, generation {}).",
                    raw.sha256, raw.size, rec.generation
                ),
            );
            for w in &spec.warnings {
                self.logs.warn(&id, w);
            }
            if let Err(e) = &spec.body {
                rejected += 1;
                self.logs.error(
                    &id,
                    &format!("Rejected at intake ({}): {}", e.class, e.message),
                );
            }
        }
        tracing::info!(
            input = %rel, tasks = rec.task_ids.len(), rejected, generation = rec.generation,
            "Input file recorded."
        );
        let queued = rec.task_ids.len() - rejected;
        let _ = self.events.send(IngestEvent::Recorded {
            input_file_id: rec.input_file_id,
            queued,
            rejected,
        });
        Ok(())
    }

    async fn rejected(
        &mut self,
        path: PathBuf,
        rel: String,
        reason: String,
    ) -> Result<(), LedgerError> {
        let Some(kind) = InputKind::from_path(&path) else {
            // Not a task file at all: the watcher already logged why it is not taken.
            return Ok(());
        };
        // The refusal itself is the "content": the same refusal is recorded once.
        let sha256 = hex::encode(Sha256::digest(
            format!("kiln-rejected\0{reason}").as_bytes(),
        ));
        if self.ledger.input_file_known(&rel, &sha256).await? {
            return Ok(());
        }
        let task = NewTask {
            line: None,
            custom_id: None,
            body: NewTaskBody::Rejected {
                class: ErrorClass::InvalidInput,
                message: reason.clone(),
            },
        };
        let file = NewInputFile {
            path: rel.clone(),
            sha256,
            size: 0,
            kind,
        };
        let Some(rec) = self.ledger.record_input_file(&file, &[task]).await? else {
            return Ok(());
        };
        for id in &rec.task_ids {
            self.logs.error(
                &id.to_string(),
                &format!("Rejected at intake (invalid_input): inputs/{rel}: {reason}"),
            );
        }
        let _ = self.events.send(IngestEvent::Recorded {
            input_file_id: rec.input_file_id,
            queued: 0,
            rejected: 1,
        });
        Ok(())
    }
}
