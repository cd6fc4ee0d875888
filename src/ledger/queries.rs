//! Read-only queries: one task, lists, counts, attempts, and the files whose outputs are due.

use sqlx::Row;

use super::intake::input_file_from_row;
use super::transitions::parse_id;
use super::{
    task_from_row, task_select, Attempt, AttemptStats, Counts, InputFile, InputFileId, Ledger,
    LedgerError, ListFilter, Task, TaskId, TaskState, UnixMillis,
};
use crate::error::ErrorClass;

impl Ledger {
    /// One task.
    pub async fn get(&self, task_id: TaskId) -> Result<Option<Task>, LedgerError> {
        let row = sqlx::query(concat!(task_select!(), "WHERE t.task_id = ?"))
            .bind(task_id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| task_from_row(&r)).transpose()
    }

    /// The task named by a full id or by a unique prefix of it (at least 4 characters).
    /// [`LedgerError::NotFound`] or [`LedgerError::Ambiguous`] otherwise. UUID v7 ids begin with a
    /// millisecond timestamp, so tasks recorded together share their first 12 hex digits.
    pub async fn resolve_task_id(&self, text: &str) -> Result<TaskId, LedgerError> {
        let text = text.trim().to_ascii_lowercase();
        if let Ok(id) = text.parse::<TaskId>() {
            return Ok(id);
        }
        if text.len() < 4 || !text.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Err(LedgerError::NotFound(text));
        }
        // `substr` rather than LIKE: no wildcard escaping needed.
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT task_id FROM tasks WHERE substr(task_id, 1, length(?1)) = ?1 LIMIT 2",
        )
        .bind(&text)
        .fetch_all(&self.pool)
        .await?;
        match rows.as_slice() {
            [one] => parse_id(one),
            [] => Err(LedgerError::NotFound(text)),
            _ => Err(LedgerError::Ambiguous(text)),
        }
    }

    /// Tasks matching `filter`, oldest first (by creation, then id).
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Task>, LedgerError> {
        let rows = sqlx::query(concat!(
            task_select!(),
            "WHERE (?1 IS NULL OR t.state = ?1) AND (?2 IS NULL OR t.error_class = ?2) \
               AND (?3 IS NULL OR t.input_file_id = ?3) \
             ORDER BY t.created_at, t.task_id LIMIT ?4"
        ))
        .bind(filter.state.map(TaskState::as_str))
        .bind(filter.error_class.map(ErrorClass::as_str))
        .bind(filter.input_file_id)
        .bind(filter.limit.map_or(-1, i64::from))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(task_from_row).collect()
    }

    /// All tasks of one input file, in line order (the writer assembles outputs from them).
    pub async fn file_tasks(&self, input_file_id: InputFileId) -> Result<Vec<Task>, LedgerError> {
        let rows = sqlx::query(concat!(
            task_select!(),
            "WHERE t.input_file_id = ? ORDER BY t.line, t.task_id"
        ))
        .bind(input_file_id)
        .fetch_all(&self.pool)
        .await?;
        self.task_rows_read
            .fetch_add(rows.len() as u64, std::sync::atomic::Ordering::Relaxed);
        rows.iter().map(task_from_row).collect()
    }

    /// Input files whose tasks are all terminal while some task has no `output_path` yet: their
    /// outputs are due (after a crash between the last transition and the write, or after a
    /// `kiln retry` of one of their tasks finished).
    pub async fn files_ready_for_output(&self) -> Result<Vec<InputFile>, LedgerError> {
        let rows = sqlx::query(
            "SELECT f.id, f.path, f.sha256, f.size, f.kind, f.generation, f.discovered_at \
             FROM input_files f \
             WHERE EXISTS (SELECT 1 FROM tasks t WHERE t.input_file_id = f.id AND t.output_path IS NULL) \
               AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.input_file_id = f.id \
                               AND t.state IN ('queued', 'running', 'retry_wait')) \
             ORDER BY f.id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(input_file_from_row).collect()
    }

    /// The attempts of one task, in claim order.
    pub async fn attempts(&self, task_id: TaskId) -> Result<Vec<Attempt>, LedgerError> {
        let rows = sqlx::query(
            "SELECT n, started_at, finished_at, outcome, message, prompt_tokens, completion_tokens, \
                    cached_tokens, ttft_ms, decode_tps \
             FROM attempts WHERE task_id = ? ORDER BY n",
        )
        .bind(task_id.to_string())
        .fetch_all(&self.pool)
        .await?;
        let u32_opt = |v: Option<i64>| v.and_then(|v| u32::try_from(v).ok());
        rows.iter()
            .map(|r| {
                let outcome: Option<String> = r.try_get("outcome")?;
                Ok(Attempt {
                    task_id,
                    n: u32::try_from(r.try_get::<i64, _>("n")?).unwrap_or(0),
                    started_at: UnixMillis(r.try_get("started_at")?),
                    finished_at: r.try_get::<Option<i64>, _>("finished_at")?.map(UnixMillis),
                    outcome: outcome
                        .map(|o| o.parse().map_err(LedgerError::Invalid))
                        .transpose()?,
                    message: r.try_get("message")?,
                    stats: AttemptStats {
                        prompt_tokens: u32_opt(r.try_get("prompt_tokens")?),
                        completion_tokens: u32_opt(r.try_get("completion_tokens")?),
                        cached_tokens: u32_opt(r.try_get("cached_tokens")?),
                        ttft_ms: r.try_get("ttft_ms")?,
                        decode_tps: r.try_get("decode_tps")?,
                    },
                })
            })
            .collect()
    }

    /// Task counts per state and per failure class, for `kiln status`.
    pub async fn counts(&self) -> Result<Counts, LedgerError> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM tasks GROUP BY state")
            .fetch_all(&self.pool)
            .await?;
        let mut by_state: Vec<(TaskState, u64)> = TaskState::ALL.iter().map(|&s| (s, 0)).collect();
        for r in &rows {
            let state: TaskState = r
                .try_get::<String, _>("state")?
                .parse()
                .map_err(LedgerError::Invalid)?;
            let n: i64 = r.try_get("n")?;
            if let Some(slot) = by_state.iter_mut().find(|(s, _)| *s == state) {
                slot.1 = n as u64;
            }
        }
        let rows = sqlx::query(
            "SELECT error_class, COUNT(*) AS n FROM tasks \
             WHERE state IN ('failed', 'dead') AND error_class IS NOT NULL GROUP BY error_class",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut unfinished_by_class = Vec::new();
        for class in ErrorClass::ALL {
            for r in &rows {
                if r.try_get::<String, _>("error_class")? == class.as_str() {
                    unfinished_by_class.push((class, r.try_get::<i64, _>("n")? as u64));
                }
            }
        }
        let input_files: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM input_files")
            .fetch_one(&self.pool)
            .await?;
        Ok(Counts {
            total: by_state.iter().map(|(_, n)| n).sum(),
            by_state,
            unfinished_by_class,
            input_files: input_files as u64,
            next_attempt_at: self.next_attempt_at().await?,
        })
    }

    /// The earliest `next_attempt_at` among `retry_wait` tasks: when the dispatcher should look again.
    pub async fn next_attempt_at(&self) -> Result<Option<UnixMillis>, LedgerError> {
        let t: Option<i64> =
            sqlx::query_scalar("SELECT MIN(next_attempt_at) FROM tasks WHERE state = 'retry_wait'")
                .fetch_one(&self.pool)
                .await?;
        Ok(t.map(UnixMillis))
    }
}
