//! Task state transitions. Each is a guarded `UPDATE … WHERE task_id = ? AND state = ?` whose row count
//! is checked; 0 rows is [`LedgerError::Conflict`] naming the state the task was found in.
//!
//! Attempt accounting:
//! - A claim increments `tasks.attempts` and opens an `attempts` row (`n` = claims so far + 1).
//! - Success and failure close that row with the outcome and the engine statistics.
//! - [`Ledger::release_interrupted`] (graceful shutdown) closes it as `interrupted` and gives the
//!   attempt back: it does not count.
//! - [`Ledger::recover_running`] (start after a crash, kill -9 or power loss) closes it as
//!   `interrupted` but the attempt keeps counting, so a task that crashes kiln cannot loop forever: once
//!   its attempts reach the `internal` limit it is `dead` with class `internal`.
//! - [`Ledger::retry`] / [`Ledger::retry_failed`] reset `tasks.attempts` to 0 (a fresh budget for every
//!   class); the `attempts` rows stay as history.

use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Row, Sqlite, Transaction};

use super::{
    task_from_row, task_select, AttemptStats, Ledger, LedgerError, Recovered, RetryResult, Task,
    TaskId, TaskState, UnixMillis,
};
use crate::error::ErrorClass;

/// The columns `kiln retry` resets when a task goes back to `queued` (binds: now, now).
const REQUEUE_SET: &str = "state = 'queued', attempts = 0, queued_at = ?, next_attempt_at = NULL, \
     superseded_output = COALESCE(output_path, superseded_output), \
     error_class = NULL, error = NULL, result_json = NULL, output_path = NULL, finished_at = NULL, \
     cancel_requested_at = NULL, updated_at = ?";

impl Ledger {
    /// Claim up to `n` tasks: `queued` ones and `retry_wait` ones whose `next_attempt_at` ≤ `now`.
    /// Each becomes `running` with one more attempt and an open `attempts` row.
    ///
    /// Fair across input files (round robin): a file's k-th waiting task ranks `k + (its running
    /// tasks)`; ties go to the file claimed from least recently. Within a file, the oldest first
    /// (by the time it became claimable, then line).
    pub async fn claim_next(&self, n: usize, now: UnixMillis) -> Result<Vec<Task>, LedgerError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(n).unwrap_or(i64::MAX);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let picked = sqlx::query(
            "WITH due AS ( \
               SELECT task_id, input_file_id, state, line, \
                      CASE WHEN state = 'queued' THEN queued_at ELSE next_attempt_at END AS ready_at \
               FROM tasks \
               WHERE state = 'queued' OR (state = 'retry_wait' AND next_attempt_at <= ?1)), \
             files AS ( \
               SELECT input_file_id, SUM(state = 'running') AS running, MAX(started_at) AS last_started \
               FROM tasks WHERE input_file_id IN (SELECT input_file_id FROM due) \
               GROUP BY input_file_id), \
             ranked AS ( \
               SELECT task_id, input_file_id, state, \
                      ROW_NUMBER() OVER (PARTITION BY input_file_id ORDER BY ready_at, line, task_id) AS rn \
               FROM due) \
             SELECT r.task_id, r.state FROM ranked r JOIN files f ON f.input_file_id = r.input_file_id \
             ORDER BY r.rn + f.running, COALESCE(f.last_started, -1), r.input_file_id, r.rn \
             LIMIT ?2",
        )
        .bind(now.0)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;

        let mut claimed = Vec::with_capacity(picked.len());
        for row in &picked {
            let id: String = row.try_get("task_id")?;
            let from: String = row.try_get("state")?;
            let task_id = parse_id(&id)?;
            let expected = from.parse().map_err(LedgerError::Invalid)?;
            let update = sqlx::query(
                "UPDATE tasks SET state = 'running', attempts = attempts + 1, next_attempt_at = NULL, \
                        cancel_requested_at = NULL, started_at = ?, updated_at = ? \
                 WHERE task_id = ? AND state = ?",
            )
            .bind(now.0)
            .bind(now.0)
            .bind(&id)
            .bind(&from);
            apply_guarded(&mut tx, update, task_id, expected).await?;
            sqlx::query(
                "INSERT INTO attempts (task_id, n, started_at) \
                 VALUES (?1, (SELECT COALESCE(MAX(n), 0) + 1 FROM attempts WHERE task_id = ?1), ?2)",
            )
            .bind(&id)
            .bind(now.0)
            .execute(&mut *tx)
            .await?;
            let row = sqlx::query(concat!(task_select!(), "WHERE t.task_id = ?"))
                .bind(&id)
                .fetch_one(&mut *tx)
                .await?;
            claimed.push(task_from_row(&row)?);
        }
        tx.commit().await?;
        if !claimed.is_empty() {
            tracing::debug!(claimed = claimed.len(), "Claimed tasks.");
        }
        Ok(claimed)
    }

    /// `running → succeeded`, storing the response body and closing the attempt.
    pub async fn finish_success(
        &self,
        task_id: TaskId,
        result_json: &str,
        stats: AttemptStats,
    ) -> Result<(), LedgerError> {
        let now = UnixMillis::now();
        let id = task_id.to_string();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let update = sqlx::query(
            "UPDATE tasks SET state = 'succeeded', result_json = ?, error_class = NULL, error = NULL, \
                    finished_at = ?, updated_at = ? \
             WHERE task_id = ? AND state = 'running'",
        )
        .bind(result_json)
        .bind(now.0)
        .bind(now.0)
        .bind(&id);
        leave_running(&mut tx, update, task_id, now, "succeeded", None, stats).await?;
        tx.commit().await?;
        Ok(())
    }

    /// `running → retry_wait | failed | dead` after a failed attempt; returns the new state.
    ///
    /// - `class` not retryable (`invalid_input`) → `failed` (whatever `next_attempt_at` says);
    /// - `next_attempt_at = Some(t)` → `retry_wait`, claimable again from `t`;
    /// - `next_attempt_at = None` → `dead` (the caller found the class's attempts used up).
    pub async fn finish_failure(
        &self,
        task_id: TaskId,
        class: ErrorClass,
        message: &str,
        stats: AttemptStats,
        next_attempt_at: Option<UnixMillis>,
    ) -> Result<TaskState, LedgerError> {
        let (state, next) = match (class.is_retryable(), next_attempt_at) {
            (false, _) => (TaskState::Failed, None),
            (true, Some(t)) => (TaskState::RetryWait, Some(t.0)),
            (true, None) => (TaskState::Dead, None),
        };
        let now = UnixMillis::now();
        let id = task_id.to_string();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let update = sqlx::query(
            "UPDATE tasks SET state = ?, error_class = ?, error = ?, next_attempt_at = ?, \
                    finished_at = ?, updated_at = ? \
             WHERE task_id = ? AND state = 'running'",
        )
        .bind(state.as_str())
        .bind(class.as_str())
        .bind(message)
        .bind(next)
        .bind(now.0)
        .bind(now.0)
        .bind(&id);
        let outcome = class.as_str();
        leave_running(&mut tx, update, task_id, now, outcome, Some(message), stats).await?;
        tx.commit().await?;
        Ok(state)
    }

    /// `running → queued` for an attempt cut short by a shutdown: the attempt does not count.
    pub async fn release_interrupted(
        &self,
        task_id: TaskId,
        reason: &str,
    ) -> Result<(), LedgerError> {
        let now = UnixMillis::now();
        let id = task_id.to_string();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let update = sqlx::query(
            "UPDATE tasks SET state = 'queued', attempts = MAX(attempts - 1, 0), updated_at = ? \
             WHERE task_id = ? AND state = 'running'",
        )
        .bind(now.0)
        .bind(&id);
        let stats = AttemptStats::default();
        leave_running(
            &mut tx,
            update,
            task_id,
            now,
            "interrupted",
            Some(reason),
            stats,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// At start, with the daemon lock held: every `running` task was orphaned by a crash. Each goes
    /// back to `queued`, its attempt closed as `interrupted` but still counted; a task whose attempts
    /// reached `internal_limit` (`retry.max_attempts.internal`) becomes `dead` with class `internal`.
    pub async fn recover_running(&self, internal_limit: u32) -> Result<Recovered, LedgerError> {
        let now = UnixMillis::now();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let rows = sqlx::query(
            "SELECT task_id, attempts, cancel_requested_at IS NOT NULL AS cancel FROM tasks \
             WHERE state = 'running' ORDER BY task_id",
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut out = Recovered::default();
        for row in &rows {
            let id: String = row.try_get("task_id")?;
            let attempts: i64 = row.try_get("attempts")?;
            let task_id = parse_id(&id)?;
            if row.try_get::<bool, _>("cancel")? {
                let message =
                    "cancelled by `kiln cancel` (kiln stopped before it could stop the attempt)";
                let update = sqlx::query(
                    "UPDATE tasks SET state = 'cancelled', error = ?, cancel_requested_at = NULL, \
                            finished_at = ?, updated_at = ? \
                     WHERE task_id = ? AND state = 'running'",
                )
                .bind(message)
                .bind(now.0)
                .bind(now.0)
                .bind(&id);
                let (outcome, stats) = ("interrupted", AttemptStats::default());
                leave_running(&mut tx, update, task_id, now, outcome, Some(message), stats).await?;
                out.cancelled.push(task_id);
                continue;
            }
            let give_up = attempts >= i64::from(internal_limit);
            let message = if give_up {
                format!("kiln stopped during {attempts} attempts of this task (crash, kill or power loss); giving up")
            } else {
                "kiln stopped during this attempt (crash, kill or power loss)".to_owned()
            };
            let update = if give_up {
                sqlx::query(
                    "UPDATE tasks SET state = 'dead', error_class = 'internal', error = ?, finished_at = ?, \
                            updated_at = ? \
                     WHERE task_id = ? AND state = 'running'",
                )
                .bind(&message)
                .bind(now.0)
                .bind(now.0)
                .bind(&id)
            } else {
                sqlx::query("UPDATE tasks SET state = 'queued', updated_at = ? WHERE task_id = ? AND state = 'running'")
                    .bind(now.0)
                    .bind(&id)
            };
            let (outcome, stats) = ("interrupted", AttemptStats::default());
            leave_running(
                &mut tx,
                update,
                task_id,
                now,
                outcome,
                Some(&message),
                stats,
            )
            .await?;
            if give_up {
                out.dead.push(task_id);
            } else {
                out.requeued.push(task_id);
            }
        }
        tx.commit().await?;
        if !rows.is_empty() {
            tracing::info!(
                requeued = out.requeued.len(),
                dead = out.dead.len(),
                "Recovered tasks left running by a previous run."
            );
        }
        Ok(out)
    }

    /// `kiln retry ID…`: each `failed | dead | cancelled` task with a request goes back to `queued`
    /// with its attempts reset to 0 and its error, result and output path cleared.
    pub async fn retry(&self, ids: &[TaskId]) -> Result<Vec<(TaskId, RetryResult)>, LedgerError> {
        let now = UnixMillis::now();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(ids.len());
        for &task_id in ids {
            let id = task_id.to_string();
            let row = sqlx::query("SELECT state, request_json IS NOT NULL AS has_request FROM tasks WHERE task_id = ?")
                .bind(&id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = row else {
                out.push((task_id, RetryResult::NotFound));
                continue;
            };
            let state: TaskState = row
                .try_get::<String, _>("state")?
                .parse()
                .map_err(LedgerError::Invalid)?;
            let result = if !matches!(
                state,
                TaskState::Failed | TaskState::Dead | TaskState::Cancelled
            ) {
                RetryResult::WrongState { state }
            } else if !row.try_get::<bool, _>("has_request")? {
                RetryResult::NoRequest
            } else {
                let update = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET {REQUEUE_SET} WHERE task_id = ? AND state = ?"
                )))
                .bind(now.0)
                .bind(now.0)
                .bind(&id)
                .bind(state.as_str());
                apply_guarded(&mut tx, update, task_id, state).await?;
                RetryResult::Requeued
            };
            out.push((task_id, result));
        }
        tx.commit().await?;
        Ok(out)
    }

    /// `kiln retry --failed [--class C]`: every `failed | dead` task (of class `C`) that has a request
    /// goes back to `queued` as in [`Ledger::retry`]. Tasks rejected at intake are skipped.
    pub async fn retry_failed(
        &self,
        class: Option<ErrorClass>,
    ) -> Result<Vec<TaskId>, LedgerError> {
        let now = UnixMillis::now();
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE tasks SET {REQUEUE_SET} \
             WHERE state IN ('failed', 'dead') AND request_json IS NOT NULL \
               AND (?3 IS NULL OR error_class = ?3) \
             RETURNING task_id"
        )))
        .bind(now.0)
        .bind(now.0)
        .bind(class.map(ErrorClass::as_str))
        .fetch_all(&self.pool)
        .await?;
        let mut ids = rows
            .iter()
            .map(|r| parse_id(&r.try_get::<String, _>("task_id")?))
            .collect::<Result<Vec<_>, _>>()?;
        ids.sort();
        Ok(ids)
    }

    /// `queued | retry_wait → cancelled`.
    pub async fn cancel(&self, task_id: TaskId) -> Result<(), LedgerError> {
        let now = UnixMillis::now();
        let id = task_id.to_string();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let state = current_state(&mut tx, &id).await?;
        let Some(from @ (TaskState::Queued | TaskState::RetryWait)) = state else {
            return Err(LedgerError::Conflict {
                task_id,
                expected_state: TaskState::Queued,
                found: state,
            });
        };
        let update = sqlx::query(
            "UPDATE tasks SET state = 'cancelled', next_attempt_at = NULL, finished_at = ?, updated_at = ? \
             WHERE task_id = ? AND state = ?",
        )
        .bind(now.0)
        .bind(now.0)
        .bind(&id)
        .bind(from.as_str());
        apply_guarded(&mut tx, update, task_id, from).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Record where the writer put a task's result or error line. Not a state change, but guarded
    /// all the same: the task must still be terminal.
    pub async fn set_output_path(&self, task_id: TaskId, path: &str) -> Result<(), LedgerError> {
        self.set_output_paths(&[(task_id, path.to_owned())]).await
    }

    /// [`Ledger::set_output_path`] for a whole output group in one transaction, all or nothing:
    /// each UPDATE is guarded on the task being terminal, so a `kiln retry` that re-queued one of
    /// them while the group was being written makes the whole record fail with
    /// [`LedgerError::Conflict`] (the publisher writes the group again once the retry finished)
    /// instead of pinning a stale output on a queued task. An unknown task is
    /// [`LedgerError::NotFound`].
    pub async fn set_output_paths(&self, paths: &[(TaskId, String)]) -> Result<(), LedgerError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        set_output_paths_tx(&mut tx, paths).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// The guarded UPDATEs of [`Ledger::set_output_paths`], inside the caller's transaction.
pub(super) async fn set_output_paths_tx(
    tx: &mut Transaction<'static, Sqlite>,
    paths: &[(TaskId, String)],
) -> Result<(), LedgerError> {
    let now = UnixMillis::now();
    for (task_id, path) in paths {
        let id = task_id.to_string();
        let done = sqlx::query(
            "UPDATE tasks SET output_path = ?, updated_at = ? \
             WHERE task_id = ? AND state IN ('succeeded', 'failed', 'dead', 'cancelled')",
        )
        .bind(path)
        .bind(now.0)
        .bind(&id)
        .execute(&mut **tx)
        .await?;
        if done.rows_affected() != 1 {
            return Err(match current_state(tx, &id).await? {
                None => LedgerError::NotFound(id),
                found => LedgerError::Conflict {
                    task_id: *task_id,
                    expected_state: TaskState::Succeeded,
                    found,
                },
            });
        }
    }
    Ok(())
}

impl Ledger {
    /// The files that reported on tasks of an input file before a `kiln retry` (see
    /// `superseded_output` in the migrations), as `(task, path)`.
    pub async fn superseded_outputs(
        &self,
        input_file_id: super::InputFileId,
    ) -> Result<Vec<(TaskId, String)>, LedgerError> {
        let rows = sqlx::query(
            "SELECT task_id, superseded_output FROM tasks \
             WHERE input_file_id = ? AND superseded_output IS NOT NULL ORDER BY task_id",
        )
        .bind(input_file_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    parse_id(&r.try_get::<String, _>("task_id")?)?,
                    r.try_get("superseded_output")?,
                ))
            })
            .collect()
    }

    /// Forget the superseded outputs of these tasks, once dealt with. Guarded: only tasks whose
    /// current output is recorded (a task re-queued again meanwhile keeps its list).
    pub async fn clear_superseded(&self, ids: &[TaskId]) -> Result<(), LedgerError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for id in ids {
            sqlx::query(
                "UPDATE tasks SET superseded_output = NULL \
                 WHERE task_id = ? AND output_path IS NOT NULL",
            )
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Close the open attempt row of a task (the one with the highest `n`, still without `finished_at`).
pub(super) async fn close_attempt(
    tx: &mut Transaction<'static, Sqlite>,
    id: &str,
    now: UnixMillis,
    outcome: &str,
    message: Option<&str>,
    stats: AttemptStats,
) -> Result<(), LedgerError> {
    let done = sqlx::query(
        "UPDATE attempts SET finished_at = ?, outcome = ?, message = ?, prompt_tokens = ?, completion_tokens = ?, \
                cached_tokens = ?, ttft_ms = ?, decode_tps = ? \
         WHERE task_id = ? AND finished_at IS NULL \
           AND n = (SELECT MAX(n) FROM attempts WHERE task_id = ?)",
    )
    .bind(now.0)
    .bind(outcome)
    .bind(message)
    .bind(stats.prompt_tokens.map(i64::from))
    .bind(stats.completion_tokens.map(i64::from))
    .bind(stats.cached_tokens.map(i64::from))
    .bind(stats.ttft_ms)
    .bind(stats.decode_tps)
    .bind(id)
    .bind(id)
    .execute(&mut **tx)
    .await?;
    if done.rows_affected() != 1 {
        // Every running task has an open attempt (claim_next inserts it in the same transaction).
        return Err(LedgerError::Invalid(format!(
            "task {id} is running without an open attempt"
        )));
    }
    Ok(())
}

/// A guarded `UPDATE tasks … WHERE task_id = ? AND state = …` of one task, every `?` bound.
pub(super) type GuardedUpdate<'q> = Query<'q, Sqlite, SqliteArguments>;

/// Run `update` (guarded on the task being in state `expected`) in `tx` and check that it changed
/// `task_id`'s row ([`check_one`]).
pub(super) async fn apply_guarded(
    tx: &mut Transaction<'static, Sqlite>,
    update: GuardedUpdate<'_>,
    task_id: TaskId,
    expected: TaskState,
) -> Result<(), LedgerError> {
    let done = update.execute(&mut **tx).await?;
    check_one(tx, done.rows_affected(), task_id, expected).await
}

/// A `running → …` transition: `update` (guarded on `state = 'running'`) applied as
/// [`apply_guarded`], then the task's open attempt closed with `outcome`, `message` and `stats`
/// ([`close_attempt`]).
pub(super) async fn leave_running(
    tx: &mut Transaction<'static, Sqlite>,
    update: GuardedUpdate<'_>,
    task_id: TaskId,
    now: UnixMillis,
    outcome: &str,
    message: Option<&str>,
    stats: AttemptStats,
) -> Result<(), LedgerError> {
    apply_guarded(tx, update, task_id, TaskState::Running).await?;
    close_attempt(tx, &task_id.to_string(), now, outcome, message, stats).await
}

/// Turn a guarded update's row count into `Ok` or a [`LedgerError::Conflict`] naming the found state.
pub(super) async fn check_one(
    tx: &mut Transaction<'static, Sqlite>,
    rows: u64,
    task_id: TaskId,
    expected_state: TaskState,
) -> Result<(), LedgerError> {
    if rows == 1 {
        return Ok(());
    }
    let found = current_state(tx, &task_id.to_string()).await?;
    Err(LedgerError::Conflict {
        task_id,
        expected_state,
        found,
    })
}

async fn current_state(
    tx: &mut Transaction<'static, Sqlite>,
    id: &str,
) -> Result<Option<TaskState>, LedgerError> {
    let s: Option<String> = sqlx::query_scalar("SELECT state FROM tasks WHERE task_id = ?")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    s.map(|s| s.parse().map_err(LedgerError::Invalid))
        .transpose()
}

pub(super) fn parse_id(s: &str) -> Result<TaskId, LedgerError> {
    s.parse()
        .map_err(|e| LedgerError::Invalid(format!("task id `{s}`: {e}")))
}
