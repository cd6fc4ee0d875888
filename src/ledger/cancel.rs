//! `kiln cancel`: stopping tasks, including ones a running daemon has in the engine.
//!
//! The CLI never touches a `running` task's state itself (the daemon owns running rows): it sets
//! `cancel_requested_at`, and the daemon that runs the task (which looks every second, see
//! [`Ledger::cancel_requested`]) stops the attempt in the engine and moves it with the guarded
//! [`Ledger::finish_cancelled`]. Waiting tasks (`queued`, `retry_wait`) are cancelled at once by a
//! guarded UPDATE in the same `BEGIN IMMEDIATE` transaction as the state read, so a claim by the
//! daemon in between either happens before (the task is then `running`: a request) or after (the
//! task is `cancelled`: not claimable). A request on a running task that no daemon runs (it crashed)
//! is honoured by the next daemon's start-up sweep ([`Ledger::recover_running`]).

use serde::Serialize;
use sqlx::Row;

use super::transitions::parse_id;
use super::{Ledger, LedgerError, TaskId, TaskState, UnixMillis};

/// What `kiln cancel` did with one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum CancelResult {
    /// It was waiting (`queued` / `retry_wait`) and is now `cancelled`.
    Cancelled,
    /// It is `running`: the daemon running it was asked to stop it.
    Requested,
    /// No task with this id.
    NotFound,
    /// It already ended (`succeeded`, `failed`, `dead`, `cancelled`).
    AlreadyFinished {
        /// Its state.
        state: TaskState,
    },
}

impl Ledger {
    /// Cancel each task (see the module docs); one transaction for all of them.
    pub async fn request_cancel(
        &self,
        ids: &[TaskId],
    ) -> Result<Vec<(TaskId, CancelResult)>, LedgerError> {
        let now = UnixMillis::now();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(ids.len());
        for &task_id in ids {
            let id = task_id.to_string();
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM tasks WHERE task_id = ?")
                    .bind(&id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some(state) = state else {
                out.push((task_id, CancelResult::NotFound));
                continue;
            };
            let state: TaskState = state.parse().map_err(LedgerError::Invalid)?;
            let (sql, result) = match state {
                TaskState::Queued | TaskState::RetryWait => (
                    "UPDATE tasks SET state = 'cancelled', next_attempt_at = NULL, \
                            error = 'cancelled by `kiln cancel` before it ran', \
                            finished_at = ?1, updated_at = ?1 \
                     WHERE task_id = ?2 AND state = ?3",
                    CancelResult::Cancelled,
                ),
                TaskState::Running => (
                    "UPDATE tasks SET cancel_requested_at = ?1, updated_at = ?1 \
                     WHERE task_id = ?2 AND state = ?3",
                    CancelResult::Requested,
                ),
                other => {
                    out.push((task_id, CancelResult::AlreadyFinished { state: other }));
                    continue;
                }
            };
            let done = sqlx::query(sql)
                .bind(now.0)
                .bind(&id)
                .bind(state.as_str())
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() != 1 {
                // Impossible inside one IMMEDIATE transaction; say so rather than guess.
                return Err(LedgerError::Conflict {
                    task_id,
                    expected_state: state,
                    found: None,
                });
            }
            out.push((task_id, result));
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Running tasks whose cancellation was requested, oldest request first.
    pub async fn cancel_requested(&self) -> Result<Vec<TaskId>, LedgerError> {
        let rows = sqlx::query(
            "SELECT task_id FROM tasks WHERE state = 'running' AND cancel_requested_at IS NOT NULL \
             ORDER BY cancel_requested_at, task_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| parse_id(&r.try_get::<String, _>("task_id")?))
            .collect()
    }

    /// `running → cancelled` after the daemon stopped the attempt; the attempt row closes as
    /// `interrupted` with `reason`.
    pub async fn finish_cancelled(&self, task_id: TaskId, reason: &str) -> Result<(), LedgerError> {
        let now = UnixMillis::now();
        let id = task_id.to_string();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let update = sqlx::query(
            "UPDATE tasks SET state = 'cancelled', error = ?, error_class = NULL, next_attempt_at = NULL, \
                    cancel_requested_at = NULL, finished_at = ?, updated_at = ? \
             WHERE task_id = ? AND state = 'running'",
        )
        .bind(reason)
        .bind(now.0)
        .bind(now.0)
        .bind(&id);
        let (outcome, stats) = ("interrupted", super::AttemptStats::default());
        super::transitions::leave_running(
            &mut tx,
            update,
            task_id,
            now,
            outcome,
            Some(reason),
            stats,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Every task of every generation of the input file at `path` (relative to `inputs/`), for
    /// `kiln cancel --input`.
    pub async fn task_ids_of_input(&self, path: &str) -> Result<Vec<TaskId>, LedgerError> {
        let rows = sqlx::query(
            "SELECT t.task_id FROM tasks t JOIN input_files f ON f.id = t.input_file_id \
             WHERE f.path = ? ORDER BY t.line, t.task_id",
        )
        .bind(path)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| parse_id(&r.try_get::<String, _>("task_id")?))
            .collect()
    }
}
