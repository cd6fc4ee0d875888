//! The `inputs/` watcher: finds task files and hands each over once it has stopped changing.
//!
//! Sources of candidates, all feeding one set:
//! - `notify` events for the folder (inotify, or a `PollWatcher` with `daemon.poll = true` for
//!   network filesystems that emit no events);
//! - a full scan at start, every `daemon.rescan_secs`, and whenever the watcher reports an
//!   overflow (`need_rescan`) or an error.
//!
//! Policy (only direct children of `inputs/` are considered; subfolders are ignored):
//! - names starting with `.` and ending in `.tmp`, `.part`, `.partial`, `.crdownload`, `.swp` or
//!   `~` are ignored (producers write under such a name and rename into place);
//! - a file is handed over once its size and mtime have not changed for `daemon.stable_secs`;
//! - a symlink is followed when its target lies inside `inputs/`; a target outside is taken
//!   only with `daemon.follow_symlinks = true`, otherwise (and for a dangling link, a FIFO, a
//!   socket, an unknown extension) the entry is [`Found::Rejected`] with the reason;
//! - an entry is handed over again only when its size or mtime changes (the ledger dedupes
//!   identical content by sha256 anyway); [`WatcherHandle::retry_later`] asks for another look.
//!
//! The watcher is an actor: a tokio task owns the state; the daemon holds a [`WatcherHandle`]
//! and receives [`Found`] entries on a channel. It stops when the shutdown token fires.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::daemon::intake::InputKind;

/// Watcher settings (from `[daemon]`).
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// The folder to watch (absolute or relative to the working directory).
    pub inputs: PathBuf,
    /// How long size and mtime must stay unchanged before a file is taken.
    pub stable: Duration,
    /// Period of the full rescan.
    pub rescan: Duration,
    /// Use the polling backend.
    pub poll: bool,
    /// Poll period of the polling backend.
    pub poll_interval: Duration,
    /// Take symlinks whose target is outside `inputs/`.
    pub follow_symlinks: bool,
}

/// Something found in `inputs/`.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// A task file, stable for `stable`.
    File {
        /// Path to open (inside `inputs/`; may be a symlink).
        path: PathBuf,
        /// Its name relative to `inputs/`.
        rel: String,
        /// Its format.
        kind: InputKind,
    },
    /// An entry that will not be taken, and why.
    Rejected {
        /// Its path.
        path: PathBuf,
        /// Its name relative to `inputs/`.
        rel: String,
        /// Why, for the user.
        reason: String,
    },
    /// Everything present at start has been handed over (or rejected, or has vanished). Sent
    /// once; `kiln run --once` waits for it.
    InitialScanDone,
}

/// Errors starting the watcher.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// `inputs/` could not be created or resolved.
    #[error("{path}: {source}")]
    Io {
        /// The folder.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The notify backend could not be set up.
    #[error("cannot watch {path}: {source}")]
    Notify {
        /// The folder.
        path: PathBuf,
        /// The underlying error.
        source: notify::Error,
    },
}

enum WatcherCommand {
    RetryLater { path: PathBuf, after: Duration },
    Rescan,
}

/// Handle to the watcher task.
#[derive(Debug, Clone)]
pub struct WatcherHandle {
    tx: mpsc::UnboundedSender<WatcherCommand>,
}

impl std::fmt::Debug for WatcherCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatcherCommand::RetryLater { path, after } => {
                write!(f, "RetryLater({}, {after:?})", path.display())
            }
            WatcherCommand::Rescan => f.write_str("Rescan"),
        }
    }
}

impl WatcherHandle {
    /// Look at `path` again after `after` (it was incomplete or could not be read), even if it
    /// has not changed.
    pub fn retry_later(&self, path: PathBuf, after: Duration) {
        if self
            .tx
            .send(WatcherCommand::RetryLater { path, after })
            .is_err()
        {
            tracing::debug!("Watcher is gone; retry request dropped.");
        }
    }

    /// Ask for a full rescan now.
    pub fn rescan(&self) {
        if self.tx.send(WatcherCommand::Rescan).is_err() {
            tracing::debug!("Watcher is gone; rescan request dropped.");
        }
    }
}

/// Whether a file name is ignored outright (temporary or hidden).
pub fn is_ignored_name(name: &str) -> bool {
    const SUFFIXES: [&str; 6] = [".tmp", ".part", ".partial", ".crdownload", ".swp", "~"];
    let lower = name.to_ascii_lowercase();
    name.starts_with('.') || SUFFIXES.iter().any(|s| lower.ends_with(s))
}

/// What the watcher last saw of an entry: `(size, mtime)`.
type Stamp = (u64, Option<SystemTime>);

struct Pending {
    stamp: Stamp,
    since: Instant,
}

struct State {
    cfg: WatchConfig,
    /// `inputs/` resolved (symlinks and `..` removed), for "inside inputs/" checks.
    canonical_inputs: PathBuf,
    pending: HashMap<PathBuf, Pending>,
    /// Entries already handed over, with the stamp they had.
    handed: HashMap<PathBuf, Stamp>,
    /// Entries to look at again at a given time regardless of their stamp.
    delayed: Vec<(PathBuf, Instant)>,
    out: mpsc::UnboundedSender<Found>,
    /// Whether `InitialScanDone` is still to be sent.
    initial_pending: bool,
}

/// Start watching. Entries arrive on the returned receiver, starting with a full scan.
pub fn spawn(
    cfg: WatchConfig,
    shutdown: CancellationToken,
) -> Result<(WatcherHandle, mpsc::UnboundedReceiver<Found>), WatchError> {
    let io = |source| WatchError::Io {
        path: cfg.inputs.clone(),
        source,
    };
    std::fs::create_dir_all(&cfg.inputs).map_err(io)?;
    let canonical_inputs = std::fs::canonicalize(&cfg.inputs).map_err(io)?;

    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<notify::Result<notify::Event>>();
    let handler = move |res: notify::Result<notify::Event>| {
        // The receiver is gone only after shutdown; nothing to do then.
        let _ = ev_tx.send(res);
    };
    let notify_err = |source| WatchError::Notify {
        path: cfg.inputs.clone(),
        source,
    };
    let mut backend: Box<dyn notify::Watcher + Send> = if cfg.poll {
        let config = notify::Config::default().with_poll_interval(cfg.poll_interval);
        Box::new(notify::PollWatcher::new(handler, config).map_err(notify_err)?)
    } else {
        Box::new(
            notify::RecommendedWatcher::new(handler, notify::Config::default())
                .map_err(notify_err)?,
        )
    };
    backend
        .watch(&cfg.inputs, notify::RecursiveMode::NonRecursive)
        .map_err(notify_err)?;

    let (out, found_rx) = mpsc::unbounded_channel();
    let (cmd_tx, mut cmd_rx) = mpsc::unbounded_channel();
    let mut state = State {
        cfg,
        canonical_inputs,
        pending: HashMap::new(),
        handed: HashMap::new(),
        delayed: Vec::new(),
        out,
        initial_pending: true,
    };
    tokio::spawn(async move {
        // Keep the backend alive as long as the loop runs.
        let _backend = backend;
        let check_every =
            (state.cfg.stable / 4).clamp(Duration::from_millis(20), Duration::from_millis(500));
        let mut check = tokio::time::interval(check_every);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rescan = tokio::time::interval_at(
            Instant::now() + state.cfg.rescan,
            state.cfg.rescan.max(Duration::from_millis(10)),
        );
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(inputs = %state.cfg.inputs.display(), poll = state.cfg.poll, "Watching for task files.");
        state.scan();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                ev = ev_rx.recv() => match ev {
                    Some(Ok(event)) if event.need_rescan() => {
                        tracing::warn!("File events overflowed; rescanning inputs.");
                        state.scan();
                    }
                    Some(Ok(event)) => {
                        for p in event.paths {
                            state.consider(&p, false);
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "File watcher error; rescanning inputs.");
                        state.scan();
                    }
                    None => break,
                },
                cmd = cmd_rx.recv() => match cmd {
                    Some(WatcherCommand::RetryLater { path, after }) => state.delayed.push((path, Instant::now() + after)),
                    Some(WatcherCommand::Rescan) => state.scan(),
                    None => {}
                },
                _ = rescan.tick() => state.scan(),
                _ = check.tick() => {
                    if state.check().is_err() {
                        break;
                    }
                }
            }
        }
        tracing::debug!("Watcher stopped.");
    });
    Ok((WatcherHandle { tx: cmd_tx }, found_rx))
}

impl State {
    /// Consider every entry of `inputs/`.
    fn scan(&mut self) {
        let entries = match std::fs::read_dir(&self.cfg.inputs) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(inputs = %self.cfg.inputs.display(), error = %e, "Cannot list the inputs folder.");
                return;
            }
        };
        for entry in entries.flatten() {
            self.consider(&entry.path(), false);
        }
    }

    /// Look at one path: ignore it, reject it, or (re)start its stability clock.
    fn consider(&mut self, path: &Path, force: bool) {
        if path.parent() != Some(self.cfg.inputs.as_path()) {
            return;
        }
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            if let Some(name) = path.file_name() {
                self.reject_once(
                    path,
                    name.to_string_lossy().into_owned(),
                    "the file name is not valid UTF-8".into(),
                    (0, None),
                    force,
                );
            }
            return;
        };
        if is_ignored_name(&name) {
            return;
        }
        let link_meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(_) => {
                // Gone (deleted or renamed away): forget it, so a new file of that name is taken.
                self.pending.remove(path);
                self.handed.remove(path);
                return;
            }
        };
        let link_stamp = (link_meta.len(), link_meta.modified().ok());
        let meta = if link_meta.file_type().is_symlink() {
            let target = match std::fs::canonicalize(path) {
                Ok(t) => t,
                Err(e) => {
                    self.reject_once(
                        path,
                        name,
                        format!("broken symlink ({e})"),
                        link_stamp,
                        force,
                    );
                    return;
                }
            };
            if !target.starts_with(&self.canonical_inputs) && !self.cfg.follow_symlinks {
                let reason = format!(
                    "symlink to {} outside the inputs folder (set `daemon.follow_symlinks = true` to take it)",
                    target.display()
                );
                self.reject_once(path, name, reason, link_stamp, force);
                return;
            }
            match std::fs::metadata(path) {
                Ok(m) => m,
                Err(_) => return,
            }
        } else {
            link_meta
        };
        if meta.is_dir() {
            return;
        }
        let stamp = (meta.len(), meta.modified().ok());
        if !meta.is_file() {
            self.reject_once(
                path,
                name,
                "not a regular file (FIFO, socket or device)".into(),
                stamp,
                force,
            );
            return;
        }
        if InputKind::from_path(path).is_none() {
            let reason =
                "unsupported file type: task files end in .txt, .md, .json or .jsonl".to_string();
            self.reject_once(path, name, reason, stamp, force);
            return;
        }
        if !force && self.handed.get(path) == Some(&stamp) {
            return;
        }
        match self.pending.get_mut(path) {
            Some(p) if p.stamp == stamp => {}
            Some(p) => {
                p.stamp = stamp;
                p.since = Instant::now();
            }
            None => {
                self.pending.insert(
                    path.to_path_buf(),
                    Pending {
                        stamp,
                        since: Instant::now(),
                    },
                );
            }
        }
    }

    fn reject_once(&mut self, path: &Path, rel: String, reason: String, stamp: Stamp, force: bool) {
        if !force && self.handed.get(path) == Some(&stamp) {
            return;
        }
        self.handed.insert(path.to_path_buf(), stamp);
        self.pending.remove(path);
        tracing::warn!(path = %path.display(), reason = %reason, "Input not taken.");
        let _ = self.out.send(Found::Rejected {
            path: path.to_path_buf(),
            rel,
            reason,
        });
    }

    /// Hand over pending files that have been stable long enough. `Err` when the receiver is gone.
    fn check(&mut self) -> Result<(), ()> {
        let now = Instant::now();
        let due: Vec<PathBuf> = self
            .delayed
            .iter()
            .filter(|(_, at)| *at <= now)
            .map(|(p, _)| p.clone())
            .collect();
        self.delayed.retain(|(_, at)| *at > now);
        for p in due {
            self.handed.remove(&p);
            self.consider(&p, true);
        }

        let mut ready = Vec::new();
        let mut gone = Vec::new();
        for (path, p) in self.pending.iter_mut() {
            match std::fs::metadata(path) {
                Ok(m) => {
                    let stamp = (m.len(), m.modified().ok());
                    if stamp != p.stamp {
                        p.stamp = stamp;
                        p.since = now;
                    } else if now.duration_since(p.since) >= self.cfg.stable {
                        ready.push((path.clone(), stamp));
                    }
                }
                Err(_) => gone.push(path.clone()),
            }
        }
        for path in gone {
            self.pending.remove(&path);
        }
        for (path, stamp) in ready {
            self.pending.remove(&path);
            self.handed.insert(path.clone(), stamp);
            let rel = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let Some(kind) = InputKind::from_path(&path) else {
                continue;
            };
            tracing::debug!(path = %path.display(), "Input file is stable.");
            self.out
                .send(Found::File { path, rel, kind })
                .map_err(|_| ())?;
        }
        if self.initial_pending && self.pending.is_empty() {
            self.initial_pending = false;
            self.out.send(Found::InitialScanDone).map_err(|_| ())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
