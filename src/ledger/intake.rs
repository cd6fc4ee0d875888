//! Recording input files and their tasks.
//!
//! Dedupe rule: a file is identified by `(path, sha256, generation)`. The same content at the same path
//! is recorded once (generation 0) and never run again; changed content is a new row with new tasks.
//! `kiln submit --force` files a rerun request for `(path, sha256)`; the next intake of that content
//! consumes it and records generation `max + 1`. A file and all its tasks are inserted in one
//! transaction, so a crash never leaves a recorded file without its tasks.

use sqlx::{Row, Sqlite, Transaction};

use super::{
    InputFile, InputFileId, Ledger, LedgerError, NewInputFile, NewTask, NewTaskBody, TaskId,
    UnixMillis,
};
use crate::ledger::TaskState;

/// What [`Ledger::record_input_file`] recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedFile {
    /// The new input file row.
    pub input_file_id: InputFileId,
    /// Its generation (0, or more after `kiln submit --force`).
    pub generation: u32,
    /// The inserted tasks, in the order given.
    pub task_ids: Vec<TaskId>,
}

impl Ledger {
    /// Whether intake can skip this content: it is recorded and no rerun was requested for it.
    /// A cheap check before reading and parsing a whole file; [`Ledger::record_input_file`] decides
    /// atomically anyway.
    pub async fn input_file_known(&self, path: &str, sha256: &str) -> Result<bool, LedgerError> {
        let row = sqlx::query(
            "SELECT EXISTS (SELECT 1 FROM input_files WHERE path = ?1 AND sha256 = ?2) AS known, \
                    EXISTS (SELECT 1 FROM rerun_requests WHERE path = ?1 AND sha256 = ?2) AS rerun",
        )
        .bind(path)
        .bind(sha256.to_ascii_lowercase())
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<bool, _>("known")? && !row.try_get::<bool, _>("rerun")?)
    }

    /// Record `file` with its `tasks`, atomically. `None` when this content of this path is already
    /// recorded and no rerun was requested (nothing is inserted).
    pub async fn record_input_file(
        &self,
        file: &NewInputFile,
        tasks: &[NewTask],
    ) -> Result<Option<RecordedFile>, LedgerError> {
        let sha256 = file.sha256.to_ascii_lowercase();
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(LedgerError::Invalid(format!(
                "sha256 `{}` is not 64 hex digits",
                file.sha256
            )));
        }
        let size = i64::try_from(file.size)
            .map_err(|_| LedgerError::Invalid(format!("size {}", file.size)))?;
        let now = UnixMillis::now();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let max_gen: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(generation) FROM input_files WHERE path = ? AND sha256 = ?",
        )
        .bind(&file.path)
        .bind(&sha256)
        .fetch_one(&mut *tx)
        .await?;
        // A rerun request is consumed by this intake either way: for new content it is moot (the
        // content runs anyway) and must not linger to run it a second time later.
        let consumed = sqlx::query("DELETE FROM rerun_requests WHERE path = ? AND sha256 = ?")
            .bind(&file.path)
            .bind(&sha256)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let generation = match max_gen {
            None => 0,
            Some(_) if consumed == 0 => {
                tx.rollback().await?;
                return Ok(None);
            }
            Some(g) => g + 1,
        };
        let input_file_id: i64 = sqlx::query_scalar(
            "INSERT INTO input_files (path, sha256, size, kind, generation, discovered_at) \
             VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(&file.path)
        .bind(&sha256)
        .bind(size)
        .bind(file.kind.as_str())
        .bind(generation)
        .bind(now.0)
        .fetch_one(&mut *tx)
        .await?;
        let task_ids = insert_tasks_tx(&mut tx, input_file_id, tasks, now).await?;
        tx.commit().await?;
        tracing::debug!(
            path = %file.path, input_file_id, generation, tasks = task_ids.len(),
            "Recorded an input file."
        );
        Ok(Some(RecordedFile {
            input_file_id,
            generation: generation as u32,
            task_ids,
        }))
    }

    /// Add tasks to an already recorded input file (one transaction).
    pub async fn insert_tasks(
        &self,
        input_file_id: InputFileId,
        tasks: &[NewTask],
    ) -> Result<Vec<TaskId>, LedgerError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let ids = insert_tasks_tx(&mut tx, input_file_id, tasks, UnixMillis::now()).await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// Ask for this content of this path to run again at its next intake (`kiln submit --force`).
    pub async fn request_rerun(&self, path: &str, sha256: &str) -> Result<(), LedgerError> {
        sqlx::query(
            "INSERT OR REPLACE INTO rerun_requests (path, sha256, requested_at) VALUES (?, ?, ?)",
        )
        .bind(path)
        .bind(sha256.to_ascii_lowercase())
        .bind(UnixMillis::now().0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// One recorded input file.
    pub async fn input_file(&self, id: InputFileId) -> Result<Option<InputFile>, LedgerError> {
        let row = sqlx::query(
            "SELECT id, path, sha256, size, kind, generation, discovered_at FROM input_files WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| input_file_from_row(&r)).transpose()
    }

    /// The recorded generations of one path, newest first.
    pub async fn input_files_by_path(&self, path: &str) -> Result<Vec<InputFile>, LedgerError> {
        let rows = sqlx::query(
            "SELECT id, path, sha256, size, kind, generation, discovered_at FROM input_files \
             WHERE path = ? ORDER BY id DESC",
        )
        .bind(path)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(input_file_from_row).collect()
    }
}

pub(super) fn input_file_from_row(r: &sqlx::sqlite::SqliteRow) -> Result<InputFile, LedgerError> {
    let size: i64 = r.try_get("size")?;
    let generation: i64 = r.try_get("generation")?;
    let kind: String = r.try_get("kind")?;
    Ok(InputFile {
        id: r.try_get("id")?,
        path: r.try_get("path")?,
        sha256: r.try_get("sha256")?,
        size: u64::try_from(size)
            .map_err(|_| LedgerError::Invalid(format!("input_files.size {size}")))?,
        kind: kind.parse().map_err(LedgerError::Invalid)?,
        generation: u32::try_from(generation)
            .map_err(|_| LedgerError::Invalid(format!("input_files.generation {generation}")))?,
        discovered_at: UnixMillis(r.try_get("discovered_at")?),
    })
}

async fn insert_tasks_tx(
    tx: &mut Transaction<'static, Sqlite>,
    input_file_id: InputFileId,
    tasks: &[NewTask],
    now: UnixMillis,
) -> Result<Vec<TaskId>, LedgerError> {
    let mut ids = Vec::with_capacity(tasks.len());
    for task in tasks {
        let id = TaskId::new();
        let (state, request, class, error, finished) = match &task.body {
            NewTaskBody::Request(json) => {
                (TaskState::Queued, Some(json.as_str()), None, None, None)
            }
            NewTaskBody::Rejected { class, message } => (
                TaskState::Failed,
                None,
                Some(class.as_str()),
                Some(message.as_str()),
                Some(now.0),
            ),
        };
        sqlx::query(
            "INSERT INTO tasks (task_id, input_file_id, line, custom_id, request_json, state, attempts, \
                                queued_at, error_class, error, created_at, updated_at, finished_at) \
             VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id.to_string())
        .bind(input_file_id)
        .bind(task.line.map(i64::from))
        .bind(task.custom_id.as_deref())
        .bind(request)
        .bind(state.as_str())
        .bind(now.0)
        .bind(class)
        .bind(error)
        .bind(now.0)
        .bind(now.0)
        .bind(finished)
        .execute(&mut **tx)
        .await?;
        ids.push(id);
    }
    Ok(ids)
}
