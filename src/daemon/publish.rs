//! Publishing: ledger rows of a finished input file → files under `outputs/` → `output_path`s.
//!
//! An input file's outputs are due when all its tasks are terminal and some task has no
//! `output_path` (first completion, a `kiln retry` that finished again, or a crash between the
//! last transition and the write). Whether a file is due is two indexed probes
//! ([`Ledger::file_output_due`]); only a due file's rows are read, once, so publishing costs
//! O(rows of the files that completed), not O(rows) per finished task.
//!
//! The group is rendered from the rows alone and published all or nothing (see
//! [`writer`](crate::daemon::writer)): staged to temporaries, the plan recorded in the ledger,
//! linked into place, then the output paths recorded and the plan forgotten in one transaction.
//! [`Publisher::recover`] completes (or rolls back) a plan a crash left behind. A write failure
//! (disk full, permissions) is logged and left due: the next sweep tries again; it never fails a
//! task.

use std::path::PathBuf;

use crate::daemon::task_log::TaskLogs;
use crate::daemon::writer::{
    group_base, render, FinishedTask, GroupPlan, OutputDir, Placed, Staged, StoredResult,
    TaskOutcome, WriteError,
};
use crate::ledger::{InputFileId, Ledger, LedgerError, Task, TaskId, TaskState};

/// How linking a plan ended, as the publisher sees it.
enum Linked {
    /// In place and recorded.
    Recorded(Placed),
    /// Not recorded (a task changed meanwhile, or a write failed): rolled back, due again later.
    RolledBack,
}

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

    /// Complete or roll back the output groups a crash left between staging and recording
    /// (`output_intents`). Run at start, with the ledger lock held, before the stale temporaries
    /// are removed (the plans need theirs). Returns how many groups were completed.
    pub async fn recover(&self) -> Result<usize, LedgerError> {
        let mut completed = 0;
        for (file_id, plan_json) in self.ledger.output_intents().await? {
            let plan: GroupPlan = match serde_json::from_str(&plan_json) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(input_file_id = file_id, error = %e, "An output plan in the ledger cannot be read; forgetting it (the file is published again).");
                    self.ledger.drop_output_intent(file_id).await?;
                    continue;
                }
            };
            if let Linked::Recorded(placed) = self.link_and_record(file_id, plan).await? {
                completed += 1;
                tracing::warn!(
                    input_file_id = file_id, files = placed.files.len(),
                    first = %placed.files.first().map(|p| p.display().to_string()).unwrap_or_default(),
                    "Completed an output group interrupted by a crash."
                );
            }
        }
        Ok(completed)
    }

    /// Link a recorded plan into place and record it; roll it back when that cannot be done.
    async fn link_and_record(
        &self,
        file_id: InputFileId,
        plan: GroupPlan,
    ) -> Result<Linked, LedgerError> {
        let outputs = self.outputs.clone();
        let p = plan.clone();
        let linked: Result<Placed, WriteError> =
            match tokio::task::spawn_blocking(move || outputs.link_plan(&p)).await {
                Ok(r) => r,
                Err(e) => Err(WriteError::Io {
                    path: self.outputs.root().to_path_buf(),
                    source: std::io::Error::other(format!("linking outputs panicked: {e}")),
                }),
            };
        let placed = match linked {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(input_file_id = file_id, error = %e, "Cannot put outputs in place; rolled back, will try again.");
                self.roll_back(file_id, &plan).await?;
                return Ok(Linked::RolledBack);
            }
        };
        let paths = task_paths(&placed)?;
        match self.ledger.complete_output_intent(file_id, &paths).await {
            Ok(()) => {
                self.outputs.discard_temporaries(&plan);
                Ok(Linked::Recorded(placed))
            }
            Err(LedgerError::Conflict { task_id, found, .. }) => {
                // `kiln retry` re-queued a task of this file while its group was being written:
                // nothing is recorded; the file is published again once that task finished.
                tracing::info!(
                    input_file_id = file_id, task_id = %task_id, state = ?found,
                    "A task changed while its outputs were written; rolled back, publishing again once it finishes."
                );
                self.roll_back(file_id, &plan).await?;
                Ok(Linked::RolledBack)
            }
            Err(e) => Err(e),
        }
    }

    async fn roll_back(&self, file_id: InputFileId, plan: &GroupPlan) -> Result<(), LedgerError> {
        let outputs = self.outputs.clone();
        let p = plan.clone();
        let _ = tokio::task::spawn_blocking(move || outputs.roll_back(&p)).await;
        self.ledger.drop_output_intent(file_id).await?;
        Ok(())
    }

    /// Publish one input file if its outputs are due; returns whether files were placed.
    pub async fn publish_file(&self, input_file_id: InputFileId) -> Result<bool, LedgerError> {
        if !self.ledger.file_output_due(input_file_id).await? {
            return Ok(false);
        }
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
        // Groups the ledger recorded for this input (any day folder): an identical one is reused.
        let mut candidates: Vec<PathBuf> = Vec::new();
        let recorded = tasks
            .iter()
            .filter_map(|t| t.output_path.as_deref())
            .chain(superseded.iter().map(|(_, p)| p.as_str()));
        for p in recorded {
            if let Some(b) = group_base(file.kind, std::path::Path::new(p)) {
                if !candidates.contains(&b) {
                    candidates.push(b);
                }
            }
        }
        let finished: Vec<FinishedTask> = tasks.iter().map(finished).collect();
        let files = render(file.kind, &file.path, &finished);
        let outputs = self.outputs.clone();
        let (path, kind) = (file.path.clone(), file.kind);
        let today = time::OffsetDateTime::now_utc().date();
        let staged = tokio::task::spawn_blocking(move || {
            outputs.stage(&path, kind, &files, today, &candidates)
        })
        .await;
        let staged = match staged {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::error!(input = %file.path, error = %e, "Cannot write outputs; will try again.");
                return Ok(false);
            }
            Err(e) => {
                tracing::error!(input = %file.path, error = %e, "Writing outputs panicked; will try again.");
                return Ok(false);
            }
        };
        let placed = match staged {
            Staged::Reused(placed) => {
                let paths = task_paths(&placed)?;
                match self.ledger.set_output_paths(&paths).await {
                    Ok(()) => placed,
                    Err(LedgerError::Conflict { task_id, found, .. }) => {
                        tracing::info!(
                            input = %file.path, task_id = %task_id, state = ?found,
                            "A task changed while its outputs were written; publishing again once it finishes."
                        );
                        return Ok(false);
                    }
                    Err(e) => return Err(e),
                }
            }
            Staged::New(plan) => {
                let json = serde_json::to_string(&plan)
                    .map_err(|e| LedgerError::Invalid(format!("output plan: {e}")))?;
                if let Err(e) = self.ledger.record_output_intent(input_file_id, &json).await {
                    self.outputs.discard_temporaries(&plan);
                    return Err(e);
                }
                match self.link_and_record(input_file_id, plan).await? {
                    Linked::Recorded(placed) => placed,
                    Linked::RolledBack => return Ok(false),
                }
            }
        };
        self.ledger
            .clear_superseded(&superseded.iter().map(|(id, _)| *id).collect::<Vec<_>>())
            .await?;
        let how = if placed.reused {
            "already present"
        } else {
            "written"
        };
        for (id, p) in &placed.task_paths {
            self.logs
                .info(id, &format!("Output {how}: {}.", p.display()));
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

/// The `(task, output path)` pairs of a placed group, for the ledger.
fn task_paths(placed: &Placed) -> Result<Vec<(TaskId, String)>, LedgerError> {
    placed
        .task_paths
        .iter()
        .map(|(id, p)| {
            let id = id
                .parse::<TaskId>()
                .map_err(|e| LedgerError::Invalid(format!("task id `{id}`: {e}")))?;
            Ok((id, p.to_string_lossy().into_owned()))
        })
        .collect()
}
