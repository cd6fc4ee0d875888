//! Publishing: ledger rows of a finished input file → files under `outputs/` → `output_path`s.
//!
//! An input file's outputs are due when all its tasks are terminal and some task has no
//! `output_path` (first completion, a `kiln retry` that finished again, or a crash between the
//! last transition and the write). The group is rendered from the rows alone and placed
//! idempotently ([`OutputDir::place`]), then the paths are recorded. A write failure (disk full,
//! permissions) is logged and left due: the next sweep tries again; it never fails a task.

use crate::daemon::task_log::TaskLogs;
use crate::daemon::writer::{render, FinishedTask, OutputDir, StoredResult, TaskOutcome};
use crate::ledger::{InputFileId, Ledger, LedgerError, Task, TaskState};

/// Writes outputs of finished input files.
#[derive(Debug, Clone)]
pub struct Publisher {
    ledger: Ledger,
    outputs: OutputDir,
    logs: TaskLogs,
}

fn finished(t: &Task) -> FinishedTask {
    let failed = |message: String| TaskOutcome::Failed {
        state: t.state.as_str().to_string(),
        class: t.error_class,
        message,
        attempts: t.attempts,
    };
    let outcome = match (t.state, t.result_json.as_deref()) {
        (TaskState::Succeeded, Some(json)) => match serde_json::from_str::<StoredResult>(json) {
            Ok(r) => TaskOutcome::Succeeded(r),
            Err(e) => failed(format!("the stored result cannot be read: {e}")),
        },
        (TaskState::Succeeded, None) => failed("succeeded without a stored result".into()),
        (TaskState::Cancelled, _) if t.error.is_none() => failed("cancelled".into()),
        _ => failed(t.error.clone().unwrap_or_default()),
    };
    FinishedTask {
        task_id: t.task_id.to_string(),
        line: t.line,
        custom_id: t.custom_id.clone(),
        outcome,
    }
}

impl Publisher {
    /// A publisher writing under `outputs`.
    pub fn new(ledger: Ledger, outputs: OutputDir, logs: TaskLogs) -> Self {
        Publisher {
            ledger,
            outputs,
            logs,
        }
    }

    /// Publish one input file if its outputs are due; returns whether files were placed.
    pub async fn publish_file(&self, input_file_id: InputFileId) -> Result<bool, LedgerError> {
        let tasks = self.ledger.file_tasks(input_file_id).await?;
        let due = !tasks.is_empty()
            && tasks.iter().all(|t| t.state.is_terminal())
            && tasks.iter().any(|t| t.output_path.is_none());
        if !due {
            return Ok(false);
        }
        let Some(file) = self.ledger.input_file(input_file_id).await? else {
            return Ok(false);
        };
        // Before placing: the stale error file would otherwise keep the stem taken (`q-1.md`).
        let superseded = self.remove_superseded_errors(input_file_id).await?;
        let finished: Vec<FinishedTask> = tasks.iter().map(finished).collect();
        let files = render(file.kind, &file.path, &finished);
        let outputs = self.outputs.clone();
        let (path, kind) = (file.path.clone(), file.kind);
        let today = time::OffsetDateTime::now_utc().date();
        let placed =
            tokio::task::spawn_blocking(move || outputs.place(&path, kind, &files, today)).await;
        let placed = match placed {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::error!(input = %file.path, error = %e, "Cannot write outputs; will try again.");
                return Ok(false);
            }
            Err(e) => {
                tracing::error!(input = %file.path, error = %e, "Writing outputs panicked; will try again.");
                return Ok(false);
            }
        };
        let mut paths = Vec::with_capacity(placed.task_paths.len());
        for t in &tasks {
            let sid = t.task_id.to_string();
            if let Some((_, p)) = placed.task_paths.iter().find(|(id, _)| *id == sid) {
                paths.push((t.task_id, p.to_string_lossy().into_owned()));
            }
        }
        match self.ledger.set_output_paths(&paths).await {
            Ok(()) => {}
            Err(LedgerError::Conflict { task_id, found, .. }) => {
                // `kiln retry` re-queued a task of this file while its group was being written:
                // nothing is recorded; the file is published again once that task finished.
                tracing::info!(
                    input = %file.path, task_id = %task_id, state = ?found,
                    "A task changed while its outputs were written; publishing again once it finishes."
                );
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        self.ledger
            .clear_superseded(&superseded.iter().map(|(id, _)| *id).collect::<Vec<_>>())
            .await?;
        for (id, p) in &paths {
            let how = if placed.reused {
                "already present"
            } else {
                "written"
            };
            self.logs
                .info(&id.to_string(), &format!("Output {how}: {p}."));
        }
        tracing::info!(
            input = %file.path, files = placed.files.len(), reused = placed.reused,
            first = %placed.files.first().map(|p| p.display().to_string()).unwrap_or_default(),
            "Outputs published."
        );
        Ok(true)
    }

    /// After a `kiln retry`, the error file of the group before it is stale once the file is
    /// published again: remove it (only `.error.json` / `.errors.jsonl` files under `outputs/`),
    /// before the new group is placed. Results of the old group are left alone. Returns the
    /// superseded entries, forgotten once the new group is recorded.
    async fn remove_superseded_errors(
        &self,
        input_file_id: InputFileId,
    ) -> Result<Vec<(crate::ledger::TaskId, String)>, LedgerError> {
        let old = self.ledger.superseded_outputs(input_file_id).await?;
        let root = self.outputs.root();
        for (id, p) in &old {
            let path = std::path::Path::new(p);
            let is_error = p.ends_with(".error.json") || p.ends_with(".errors.jsonl");
            let inside = path.starts_with(root)
                && !path
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir));
            if !is_error || !inside {
                continue;
            }
            match std::fs::remove_file(path) {
                Ok(()) => {
                    self.logs.info(
                        &id.to_string(),
                        &format!("Removed the superseded error file {p}."),
                    );
                    tracing::info!(path = %p, "Removed a superseded error file.");
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %p, error = %e, "Cannot remove a superseded error file.")
                }
            }
        }
        Ok(old)
    }

    /// Publish every input file whose outputs are due (at start, and as a periodic sweep).
    pub async fn publish_ready(&self) -> Result<usize, LedgerError> {
        let mut n = 0;
        for f in self.ledger.files_ready_for_output().await? {
            if self.publish_file(f.id).await? {
                n += 1;
            }
        }
        Ok(n)
    }
}
