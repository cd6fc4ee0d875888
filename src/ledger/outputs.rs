//! Output groups in flight: the intent a publisher records between writing a group's temporaries
//! and recording its tasks' output paths (see `output_intents` in the migrations), and the cheap
//! check of whether an input file's outputs are due.
//!
//! Invariant: at most one intent per input file; a recorded intent names temporaries that were
//! written and fsynced before it was committed, so recovery can always complete the group from them.

use sqlx::Row;

use super::transitions::set_output_paths_tx;
use super::{InputFileId, Ledger, LedgerError, TaskId, UnixMillis};

impl Ledger {
    /// Whether an input file's outputs are due: it has tasks, none of them is waiting or running,
    /// and some task has no `output_path`. Two indexed probes (`tasks_by_file`,
    /// `tasks_unpublished`), so the publisher can ask after every finished task without reading
    /// the file's rows.
    pub async fn file_output_due(&self, input_file_id: InputFileId) -> Result<bool, LedgerError> {
        let due: bool = sqlx::query_scalar(
            "SELECT NOT EXISTS (SELECT 1 FROM tasks WHERE input_file_id = ?1 \
                                AND state IN ('queued', 'running', 'retry_wait')) \
                    AND EXISTS (SELECT 1 FROM tasks WHERE input_file_id = ?1 AND output_path IS NULL)",
        )
        .bind(input_file_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(due)
    }

    /// Record the plan of an output group about to be linked into place. At most one per input
    /// file: a second one is [`LedgerError::Invalid`] (recovery must have dealt with the first).
    pub async fn record_output_intent(
        &self,
        input_file_id: InputFileId,
        plan_json: &str,
    ) -> Result<(), LedgerError> {
        let done = sqlx::query(
            "INSERT INTO output_intents (input_file_id, plan_json, created_at) VALUES (?, ?, ?) \
             ON CONFLICT (input_file_id) DO NOTHING",
        )
        .bind(input_file_id)
        .bind(plan_json)
        .bind(UnixMillis::now().0)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() != 1 {
            return Err(LedgerError::Invalid(format!(
                "input file {input_file_id} already has an output group in flight"
            )));
        }
        Ok(())
    }

    /// Every recorded intent, as `(input file, plan_json)`, oldest file first.
    pub async fn output_intents(&self) -> Result<Vec<(InputFileId, String)>, LedgerError> {
        let rows = sqlx::query(
            "SELECT input_file_id, plan_json FROM output_intents ORDER BY input_file_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("input_file_id")?, r.try_get("plan_json")?)))
            .collect()
    }

    /// The group of an intent is in place: record its tasks' output paths and forget the intent,
    /// in one transaction. The output-path UPDATEs are guarded like [`Ledger::set_output_paths`]
    /// (a task re-queued meanwhile is [`LedgerError::Conflict`], and nothing is recorded or
    /// forgotten); the DELETE is guarded on the intent still being there.
    pub async fn complete_output_intent(
        &self,
        input_file_id: InputFileId,
        paths: &[(TaskId, String)],
    ) -> Result<(), LedgerError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        set_output_paths_tx(&mut tx, paths).await?;
        let gone = sqlx::query("DELETE FROM output_intents WHERE input_file_id = ?")
            .bind(input_file_id)
            .execute(&mut *tx)
            .await?;
        if gone.rows_affected() != 1 {
            return Err(LedgerError::Invalid(format!(
                "input file {input_file_id} has no output group in flight"
            )));
        }
        tx.commit().await?;
        Ok(())
    }

    /// Forget an intent whose group was rolled back (its files removed). Returns whether it was there.
    pub async fn drop_output_intent(
        &self,
        input_file_id: InputFileId,
    ) -> Result<bool, LedgerError> {
        let gone = sqlx::query("DELETE FROM output_intents WHERE input_file_id = ?")
            .bind(input_file_id)
            .execute(&self.pool)
            .await?;
        Ok(gone.rows_affected() == 1)
    }
}
