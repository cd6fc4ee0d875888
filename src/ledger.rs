//! The ledger: the SQLite database that is kiln's source of truth for input files, tasks and attempts.
//!
//! Design (style rule 7; the schema and its conventions are in `migrations/0001_ledger.sql`):
//! - sqlx + bundled SQLite, WAL, `synchronous = FULL`, foreign keys on, `busy_timeout`; the schema comes
//!   from `migrations/` through `sqlx::migrate!` (no compile-time database, only `query`/`query_as`).
//!   `FULL` rather than `NORMAL`: with `NORMAL` a power loss can roll back the last commits, so a task
//!   whose output was already written could run again and write a second, suffixed output. One fsync per
//!   transition is nothing next to an LLM completion, and intake inserts a whole file in one transaction.
//! - Every state change is a guarded `UPDATE … WHERE task_id = ? AND state = ?` with `rows_affected()`
//!   checked: 0 rows is [`LedgerError::Conflict`]. Multi-statement changes run in `BEGIN IMMEDIATE`
//!   transactions, so concurrent writers (the daemon, `kiln retry`, `kiln submit`) queue on SQLite's
//!   write lock (with `busy_timeout`) instead of failing with `SQLITE_BUSY` on a lock upgrade.
//! - One daemon per ledger: [`Ledger::lock_exclusive`] holds an advisory lock on `<ledger>.lock`
//!   (beside the canonical file) and records it in the ledger's `daemon_owner` row, so a second
//!   path to the same file (symlink, hard link) cannot start a second daemon.
//!   Because of it, the startup sweep [`Ledger::recover_running`] may treat every `running` row as
//!   orphaned. Read-only commands, `kiln retry` and `kiln submit` work beside a running daemon.
//! - Timestamps are integer unix milliseconds ([`UnixMillis`]) everywhere.
//!
//! All SQL of kiln lives in this module and its children:
//! - [`intake`](self::intake): input files and task insertion (dedupe by path + sha256 + generation).
//! - [`transitions`](self::transitions): claim, finish, release, recover, retry.
//! - [`cancel`](self::cancel): `kiln cancel`, of waiting tasks and (through the daemon) running ones.
//! - [`queries`](self::queries): get, list, counts, attempts, files ready for output.

mod cancel;
mod intake;
mod outputs;
mod prune;
mod queries;
mod report;
mod stamps;
mod transitions;
mod types;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};

pub use cancel::CancelResult;
pub use intake::RecordedFile;
pub use report::{FileReport, Throughput};
pub use stamps::FileStamp;
pub use types::{
    Attempt, AttemptOutcome, AttemptStats, Counts, InputFile, InputFileId, InputKind, ListFilter,
    NewInputFile, NewTask, NewTaskBody, Recovered, RetryResult, Task, TaskId, TaskState,
    UnixMillis,
};

use crate::error::ErrorClass;

/// How long a statement waits for another writer's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections per pool: SQLite has one writer anyway; a few readers help `kiln list` beside the daemon.
const MAX_CONNECTIONS: u32 = 4;

/// Errors of ledger operations.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The database could not be opened or created.
    #[error("cannot open the ledger {path}: {source}")]
    Open {
        /// The ledger file.
        path: PathBuf,
        /// The underlying error.
        source: sqlx::Error,
    },
    /// Applying `migrations/` failed (e.g. an applied migration was edited, or the ledger is newer).
    #[error("cannot migrate the ledger {path}: {source}")]
    Migrate {
        /// The ledger file.
        path: PathBuf,
        /// The underlying error.
        source: sqlx::migrate::MigrateError,
    },
    /// A query failed.
    #[error("ledger query failed: {0}")]
    Sqlx(#[from] sqlx::Error),
    /// A guarded transition found the task in another state (or gone).
    #[error("task {task_id} is not {expected_state} (found {})", found.map_or("no such task", |s| s.as_str()))]
    Conflict {
        /// The task.
        task_id: TaskId,
        /// The state the transition requires.
        expected_state: TaskState,
        /// The state it was found in; `None` when the task does not exist.
        found: Option<TaskState>,
    },
    /// No task with this id.
    #[error("no task {0}")]
    NotFound(String),
    /// A task id prefix matches several tasks.
    #[error("task id prefix `{0}` is ambiguous")]
    Ambiguous(String),
    /// Another kiln process holds the ledger's lock file.
    #[error("the ledger {path} is locked by another kiln process (lock file {lock})")]
    Locked {
        /// The ledger file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The lock file could not be opened or locked.
    #[error("{path}: {source}")]
    LockIo {
        /// The lock file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A stored value is outside its closed set, or an argument is out of range.
    #[error("invalid ledger data: {0}")]
    Invalid(String),
}

/// A handle on the ledger: a pool of SQLite connections. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: SqlitePool,
    path: PathBuf,
    /// Task rows read by [`Ledger::file_tasks`] through this handle and its clones (a cost
    /// counter: publishing must read a file's rows once per publication, not once per tick).
    task_rows_read: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// The exclusive lock of one ledger, held by `kiln run` while it runs; released on drop.
#[derive(Debug)]
pub struct LedgerLock {
    _file: File,
    path: PathBuf,
}

impl LedgerLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Ledger {
    /// Open (creating if missing) the ledger at `path` and bring its schema up to date.
    pub async fn open(path: impl AsRef<Path>) -> Result<Ledger, LedgerError> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| LedgerError::Open {
                path: path.clone(),
                source: e.into(),
            })?;
        }
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        // Two processes (or tasks) opening a fresh ledger at once race twice. First on the switch
        // to WAL: both connections hold a read lock and try to upgrade it, and SQLite answers one
        // of them `SQLITE_BUSY` at once, without the busy handler (waiting could deadlock). Then on
        // the first migration: the loser's `CREATE TABLE` fails once the winner commits. Both are
        // transient and idempotent (the WAL switch is persistent, each migration is one
        // transaction that rolled back), so the loser starts over, for at most `BUSY_TIMEOUT`.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        let mut backoff = Duration::from_millis(5);
        let pool = loop {
            let attempt = SqlitePoolOptions::new()
                .max_connections(MAX_CONNECTIONS)
                .connect_with(options.clone())
                .await;
            match attempt {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "The ledger is busy while opening; retrying.");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Err(source) => {
                    return Err(LedgerError::Open {
                        path: path.clone(),
                        source,
                    })
                }
            }
        };
        let migrator = sqlx::migrate!("./migrations");
        loop {
            match migrator.run(&pool).await {
                Ok(()) => break,
                Err(e) if std::time::Instant::now() < deadline && migration_may_be_racing(&e) => {
                    tracing::debug!(error = %e, "Retrying the ledger migration.");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Err(source) => {
                    return Err(LedgerError::Migrate {
                        path: path.clone(),
                        source,
                    })
                }
            }
        }
        tracing::debug!(path = %path.display(), "Opened the ledger.");
        Ok(Ledger {
            pool,
            path,
            task_rows_read: Default::default(),
        })
    }

    /// Task rows [`Ledger::file_tasks`] has read through this handle and its clones so far.
    pub fn task_rows_read(&self) -> u64 {
        self.task_rows_read
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lock file of a ledger: `<ledger>.lock` next to the ledger's canonical path (symlinks
    /// and `..` resolved), so every path that reaches the same file names the same lock file.
    /// When the ledger does not exist yet, the path as given.
    pub fn lock_path(ledger: &Path) -> PathBuf {
        let canonical = std::fs::canonicalize(ledger).unwrap_or_else(|_| ledger.to_path_buf());
        let mut name = canonical.into_os_string();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Take the exclusive daemon lock without waiting: [`LedgerError::Locked`] when another
    /// process (or another handle in this one) holds it.
    ///
    /// Two guards, so that no second path to the same ledger gets a second daemon:
    /// 1. an advisory `flock` on [`Ledger::lock_path`] (the canonical path: symlinks included);
    /// 2. inside SQLite, the `daemon_owner` row naming the lock file of the daemon that owns the
    ///    ledger: a different lock file that is still locked means another daemon reached this
    ///    file by another path (a hard link, a bind mount), and this one refuses.
    pub async fn lock_exclusive(&self) -> Result<LedgerLock, LedgerError> {
        let lock = Ledger::lock_path(&self.path);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|source| LedgerError::LockIo {
                path: lock.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LedgerError::Locked {
                    path: self.path.clone(),
                    lock,
                })
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(LedgerError::LockIo { path: lock, source })
            }
        }
        let held = LedgerLock {
            _file: file,
            path: lock.clone(),
        };
        let me = lock.to_string_lossy().into_owned();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let owner: Option<String> =
            sqlx::query_scalar("SELECT lock_path FROM daemon_owner WHERE id = 1")
                .fetch_optional(&mut *tx)
                .await?;
        if let Some(other) = owner.filter(|o| *o != me) {
            if lock_file_is_held(Path::new(&other)) {
                return Err(LedgerError::Locked {
                    path: self.path.clone(),
                    lock: PathBuf::from(other),
                });
            }
        }
        sqlx::query(
            "INSERT INTO daemon_owner (id, lock_path, pid, acquired_at) VALUES (1, ?, ?, ?) \
             ON CONFLICT (id) DO UPDATE SET lock_path = excluded.lock_path, pid = excluded.pid, \
             acquired_at = excluded.acquired_at",
        )
        .bind(&me)
        .bind(i64::from(std::process::id()))
        .bind(UnixMillis::now().0)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(held)
    }

    /// Whether some process holds the daemon lock of the ledger at `ledger` (for `kiln status`).
    pub fn is_locked(ledger: &Path) -> bool {
        lock_file_is_held(&Ledger::lock_path(ledger))
    }

    /// Close the pool, waiting for connections to finish (checkpoints the WAL).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Whether some process holds an exclusive `flock` on the lock file `lock`.
fn lock_file_is_held(lock: &Path) -> bool {
    let Ok(file) = File::options().read(true).open(lock) else {
        return false;
    };
    matches!(
        file.try_lock_shared(),
        Err(std::fs::TryLockError::WouldBlock)
    )
}

/// Whether `e` is SQLite's `SQLITE_BUSY` / `SQLITE_LOCKED` (any extended code): another connection
/// holds a lock this one needs; trying again later can succeed.
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 5 | 6)),
        _ => false,
    }
}

/// Whether a failed migration may have lost a race with another process migrating the same fresh
/// file (busy, or "table already exists" / "duplicate column name" because the other one committed
/// the same migration first: the retry finds it applied). An edited or newer migration is not retried.
fn migration_may_be_racing(e: &sqlx::migrate::MigrateError) -> bool {
    match e {
        sqlx::migrate::MigrateError::Execute(e)
        | sqlx::migrate::MigrateError::ExecuteMigration(e, _) => {
            is_busy(e)
                || matches!(e, sqlx::Error::Database(db)
                    if db.message().contains("already exists")
                        || db.message().contains("duplicate column name"))
        }
        _ => false,
    }
}

/// `SELECT` of every [`Task`] column, joined with the input file's path; append `WHERE …`.
macro_rules! task_select {
    () => {
        "SELECT t.task_id, t.input_file_id, f.path AS input_path, t.line, t.custom_id, t.request_json, \
         t.state, t.attempts, t.next_attempt_at, t.error_class, t.error, t.result_json, t.output_path, \
         t.created_at, t.updated_at, t.started_at, t.finished_at, \
         (SELECT COALESCE(MAX(a.n), 0) FROM attempts a WHERE a.task_id = t.task_id) AS attempt_number \
         FROM tasks t JOIN input_files f ON f.id = t.input_file_id "
    };
}
pub(crate) use task_select;

/// Decode a row of [`task_select!`].
fn task_from_row(row: &SqliteRow) -> Result<Task, LedgerError> {
    Ok(Task {
        task_id: parse_col(row, "task_id")?,
        input_file_id: row.try_get("input_file_id")?,
        input_path: row.try_get("input_path")?,
        line: opt_u32(row, "line")?,
        custom_id: row.try_get("custom_id")?,
        request_json: row.try_get("request_json")?,
        state: parse_col(row, "state")?,
        attempts: u32_col(row, "attempts")?,
        attempt_number: u32_col(row, "attempt_number")?,
        next_attempt_at: opt_millis(row, "next_attempt_at")?,
        error_class: opt_parse_col::<ErrorClass>(row, "error_class")?,
        error: row.try_get("error")?,
        result_json: row.try_get("result_json")?,
        output_path: row.try_get("output_path")?,
        created_at: UnixMillis(row.try_get("created_at")?),
        updated_at: UnixMillis(row.try_get("updated_at")?),
        started_at: opt_millis(row, "started_at")?,
        finished_at: opt_millis(row, "finished_at")?,
    })
}

fn parse_col<T: FromStr>(row: &SqliteRow, col: &str) -> Result<T, LedgerError>
where
    T::Err: std::fmt::Display,
{
    let s: String = row.try_get(col)?;
    s.parse()
        .map_err(|e: T::Err| LedgerError::Invalid(format!("column {col}: {e}")))
}

fn opt_parse_col<T: FromStr>(row: &SqliteRow, col: &str) -> Result<Option<T>, LedgerError>
where
    T::Err: std::fmt::Display,
{
    let s: Option<String> = row.try_get(col)?;
    s.map(|s| {
        s.parse()
            .map_err(|e: T::Err| LedgerError::Invalid(format!("column {col}: {e}")))
    })
    .transpose()
}

fn u32_col(row: &SqliteRow, col: &str) -> Result<u32, LedgerError> {
    let v: i64 = row.try_get(col)?;
    u32::try_from(v).map_err(|_| LedgerError::Invalid(format!("column {col}: {v} is out of range")))
}

fn opt_u32(row: &SqliteRow, col: &str) -> Result<Option<u32>, LedgerError> {
    let v: Option<i64> = row.try_get(col)?;
    v.map(|v| {
        u32::try_from(v)
            .map_err(|_| LedgerError::Invalid(format!("column {col}: {v} is out of range")))
    })
    .transpose()
}

fn opt_millis(row: &SqliteRow, col: &str) -> Result<Option<UnixMillis>, LedgerError> {
    Ok(row.try_get::<Option<i64>, _>(col)?.map(UnixMillis))
}

#[cfg(test)]
mod tests;
