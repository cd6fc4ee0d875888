//! `kiln prune`: forget old finished work. Only whole input files go, and only when every task of
//! the file is terminal, published (`output_path` set) and finished before the cutoff, so a later
//! `kiln retry` can never re-assemble a group with lines missing. Their `attempts` and `tasks`
//! rows are deleted; the `input_files` row stays (it is what keeps the same content in `inputs/`
//! from running again). Inputs and outputs are never touched.

use sqlx::Row;

use super::transitions::parse_id;
use super::{Ledger, LedgerError, TaskId, UnixMillis};

impl Ledger {
    /// Delete the task and attempt rows of input files finished before `cutoff` (see the module
    /// docs); returns the deleted task ids (their task logs can go too). One transaction.
    pub async fn prune(&self, cutoff: UnixMillis) -> Result<Vec<TaskId>, LedgerError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let rows = sqlx::query(
            "SELECT t.task_id FROM tasks t WHERE t.input_file_id IN ( \
               SELECT input_file_id FROM tasks GROUP BY input_file_id \
               HAVING SUM(state NOT IN ('succeeded', 'failed', 'dead', 'cancelled') \
                          OR output_path IS NULL OR finished_at IS NULL OR finished_at >= ?) = 0) \
             ORDER BY t.task_id",
        )
        .bind(cutoff.0)
        .fetch_all(&mut *tx)
        .await?;
        let mut ids = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: String = r.try_get("task_id")?;
            sqlx::query("DELETE FROM attempts WHERE task_id = ?")
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            // Guarded like every transition: only a row still terminal, published and old.
            let done = sqlx::query(
                "DELETE FROM tasks WHERE task_id = ? \
                 AND state IN ('succeeded', 'failed', 'dead', 'cancelled') \
                 AND output_path IS NOT NULL AND finished_at < ?",
            )
            .bind(&id)
            .bind(cutoff.0)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(LedgerError::Invalid(format!(
                    "task {id} changed while pruning; nothing was pruned"
                )));
            }
            ids.push(parse_id(&id)?);
        }
        tx.commit().await?;
        Ok(ids)
    }
}
