//! Per-input-file summaries: how the tasks of each input file stand and whether its outputs are
//! written (`kiln run --once`'s closing lines and exit status, `kiln status`).

use serde::Serialize;
use sqlx::Row;

use super::{Ledger, LedgerError, UnixMillis};

/// How the tasks of one input file (one generation of it) stand.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FileReport {
    /// Path relative to `inputs/`.
    pub path: String,
    /// Tasks of the file.
    pub total: u64,
    /// `succeeded`.
    pub succeeded: u64,
    /// `failed` + `dead`.
    pub failed: u64,
    /// `cancelled`.
    pub cancelled: u64,
    /// `queued` + `running` + `retry_wait`.
    pub open: u64,
    /// Terminal tasks without an `output_path`: their outputs are not written yet.
    pub unwritten: u64,
    /// One output path of the file (the first recorded), when any.
    pub output: Option<String>,
}

impl FileReport {
    /// Every task is terminal and its outputs are written.
    pub fn is_complete(&self) -> bool {
        self.open == 0 && self.unwritten == 0
    }
}

/// What finished in a recent window, for `kiln status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Throughput {
    /// The window, in seconds.
    pub window_secs: f64,
    /// Tasks that reached a terminal state in the window.
    pub tasks: u64,
    /// Completion tokens of the attempts that ended in the window.
    pub tokens: u64,
    /// `tasks / window`.
    pub tasks_per_s: f64,
    /// `tokens / window`.
    pub tokens_per_s: f64,
    /// Unfinished tasks (`queued`, `running`, `retry_wait`).
    pub open: u64,
    /// Seconds until the open tasks are done at `tasks_per_s`; `None` when nothing finished.
    pub eta_secs: Option<f64>,
}

impl Ledger {
    /// Throughput over the `window_ms` before `now`, and the ETA of what is still open.
    pub async fn throughput(
        &self,
        now: UnixMillis,
        window_ms: i64,
    ) -> Result<Throughput, LedgerError> {
        let since = now.0 - window_ms.max(1);
        let tasks: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM tasks WHERE state IN ('succeeded', 'failed', 'dead', 'cancelled') \
             AND finished_at >= ?",
        )
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        let tokens: Option<i64> = sqlx::query_scalar(
            "SELECT SUM(completion_tokens) FROM attempts WHERE finished_at >= ?",
        )
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        let open: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM tasks WHERE state IN ('queued', 'running', 'retry_wait')",
        )
        .fetch_one(&self.pool)
        .await?;
        let window_secs = window_ms.max(1) as f64 / 1e3;
        let tasks = tasks.max(0) as u64;
        let tokens = tokens.unwrap_or(0).max(0) as u64;
        let open = open.max(0) as u64;
        let tasks_per_s = tasks as f64 / window_secs;
        let eta_secs = match (open, tasks_per_s > 0.0) {
            (0, _) => Some(0.0),
            (_, true) => Some(open as f64 / tasks_per_s),
            _ => None,
        };
        Ok(Throughput {
            window_secs,
            tasks,
            tokens,
            tasks_per_s,
            tokens_per_s: tokens as f64 / window_secs,
            open,
            eta_secs,
        })
    }

    /// A [`FileReport`] for each input file with a task updated at or after `since`, by path.
    pub async fn file_reports(&self, since: UnixMillis) -> Result<Vec<FileReport>, LedgerError> {
        let rows = sqlx::query(
            "SELECT f.path, COUNT(*) AS total, \
                    SUM(t.state = 'succeeded') AS succeeded, \
                    SUM(t.state IN ('failed', 'dead')) AS failed, \
                    SUM(t.state = 'cancelled') AS cancelled, \
                    SUM(t.state IN ('queued', 'running', 'retry_wait')) AS open, \
                    SUM(t.state IN ('succeeded', 'failed', 'dead', 'cancelled') AND t.output_path IS NULL) AS unwritten, \
                    MIN(t.output_path) AS output \
             FROM input_files f JOIN tasks t ON t.input_file_id = f.id \
             WHERE f.id IN (SELECT input_file_id FROM tasks WHERE updated_at >= ?) \
             GROUP BY f.id ORDER BY f.path, f.id",
        )
        .bind(since.0)
        .fetch_all(&self.pool)
        .await?;
        let n = |r: &sqlx::sqlite::SqliteRow, c: &str| -> Result<u64, LedgerError> {
            Ok(r.try_get::<Option<i64>, _>(c)?.unwrap_or(0).max(0) as u64)
        };
        rows.iter()
            .map(|r| {
                Ok(FileReport {
                    path: r.try_get("path")?,
                    total: n(r, "total")?,
                    succeeded: n(r, "succeeded")?,
                    failed: n(r, "failed")?,
                    cancelled: n(r, "cancelled")?,
                    open: n(r, "open")?,
                    unwritten: n(r, "unwritten")?,
                    output: r.try_get("output")?,
                })
            })
            .collect()
    }
}
