//! `kiln cancel ID… | --input FILE`: stop tasks. Waiting tasks (`queued`, `retry_wait`) become
//! `cancelled` at once; a running task is stopped by the daemon that runs it, within about a
//! second (its engine request is dropped); tasks that already ended are reported and left alone.
//! Works beside a running daemon without racing it (see `ledger::cancel`). Exits non-zero when a
//! named task does not exist. A cancelled task can be run again with `kiln retry ID`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use kiln::config::Config;
use kiln::ledger::{CancelResult, Ledger, TaskId};

use super::safe;

/// Arguments of `kiln cancel`.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["ids", "input"]))]
pub struct CancelArgs {
    /// Task ids (or unique prefixes) to cancel.
    #[arg(conflicts_with = "input")]
    pub ids: Vec<String>,
    /// Cancel every unfinished task of this input file (a path under inputs/, or relative to it).
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
}

/// The input file's path as the ledger records it: relative to `inputs/`, `/`-separated.
fn ledger_path_of(config: &Config, file: &Path) -> String {
    let inputs = &config.daemon.inputs;
    let abs = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
    let rel = match abs.strip_prefix(inputs) {
        Ok(p) => p.to_path_buf(),
        // `inputs` may be reached through a symlink; compare canonical forms too.
        Err(_) => match (inputs.canonicalize(), abs.canonicalize()) {
            (Ok(c_in), Ok(c_file)) => c_file
                .strip_prefix(&c_in)
                .map(Path::to_path_buf)
                .unwrap_or_else(|_| file.to_path_buf()),
            _ => file.to_path_buf(),
        },
    };
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// Run `kiln cancel`.
pub fn run(config_path: Option<&Path>, args: CancelArgs) -> anyhow::Result<()> {
    let config = super::load_config(config_path)?;
    let mut out = String::new();
    let mut refused = 0usize;
    super::runtime()?.block_on(async {
        let ledger = super::open_existing_ledger(&config).await?;
        let mut ids: Vec<TaskId> = Vec::new();
        if let Some(file) = &args.input {
            let path = ledger_path_of(&config, file);
            ids = ledger.task_ids_of_input(&path).await?;
            anyhow::ensure!(
                !ids.is_empty(),
                "no tasks of the input file `{}` in the ledger",
                safe(&path)
            );
        }
        for text in &args.ids {
            match ledger.resolve_task_id(text).await {
                Ok(id) => ids.push(id),
                Err(e) => {
                    refused += 1;
                    let _ = writeln!(out, "not cancelled: {}: {}", safe(text), safe(&e.to_string()));
                }
            }
        }
        let daemon = Ledger::is_locked(&config.daemon.ledger);
        let results = ledger
            .request_cancel(&ids)
            .await
            .context("cancelling in the ledger")?;
        let by_input = args.input.is_some();
        for (id, result) in results {
            match result {
                CancelResult::Cancelled => {
                    let _ = writeln!(out, "cancelled {id}");
                }
                CancelResult::Requested if daemon => {
                    let _ = writeln!(
                        out,
                        "cancelling {id}: it is running; the daemon stops it within a few seconds"
                    );
                }
                CancelResult::Requested => {
                    let _ = writeln!(
                        out,
                        "cancelling {id}: it was left running by a daemon that stopped; the next `kiln run` marks it cancelled"
                    );
                }
                CancelResult::NotFound => {
                    refused += 1;
                    let _ = writeln!(out, "not cancelled: {id}: no such task");
                }
                // With --input, finished tasks of the file are expected: say nothing about them.
                CancelResult::AlreadyFinished { .. } if by_input => {}
                CancelResult::AlreadyFinished { state } => {
                    let _ = writeln!(out, "not cancelled: {id}: it already ended ({state})");
                }
            }
        }
        anyhow::Ok(())
    })?;
    super::print(&out)?;
    anyhow::ensure!(refused == 0, "{refused} task(s) could not be cancelled");
    Ok(())
}
