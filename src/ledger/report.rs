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

impl Ledger {
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
