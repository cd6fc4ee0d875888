//! `kiln status [--json]`: task counts per state, failures per class, whether a daemon holds the ledger.

use std::fmt::Write as _;
use std::path::Path;

use kiln::ledger::{Counts, Ledger, TaskState};
use serde_json::json;

/// Arguments of `kiln status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `kiln status`.
pub fn run(config_path: Option<&Path>, args: StatusArgs) -> anyhow::Result<()> {
    let config = super::load_config(config_path)?;
    let ledger_path = &config.daemon.ledger;
    let exists = ledger_path.exists();
    let counts = if exists {
        super::runtime()?.block_on(async {
            anyhow::Ok(super::open_existing_ledger(&config).await?.counts().await?)
        })?
    } else {
        Counts {
            by_state: TaskState::ALL.iter().map(|&s| (s, 0)).collect(),
            ..Default::default()
        }
    };
    let daemon_running = Ledger::is_locked(ledger_path);
    if args.json {
        let tasks: serde_json::Map<String, serde_json::Value> =
            std::iter::once(("total".to_owned(), json!(counts.total)))
                .chain(
                    counts
                        .by_state
                        .iter()
                        .map(|(s, n)| (s.as_str().to_owned(), json!(n))),
                )
                .collect();
        let by_class: serde_json::Map<String, serde_json::Value> = counts
            .unfinished_by_class
            .iter()
            .map(|(c, n)| (c.as_str().to_owned(), json!(n)))
            .collect();
        let v = json!({
            "ledger": ledger_path,
            "ledger_exists": exists,
            "daemon_running": daemon_running,
            "inputs": config.daemon.inputs,
            "outputs": config.daemon.outputs,
            "logs": config.daemon.logs,
            "input_files": counts.input_files,
            "tasks": tasks,
            "failed_by_class": by_class,
            "next_attempt_at": counts.next_attempt_at.map(|m| m.to_rfc3339()),
        });
        return super::print(&format!("{}\n", serde_json::to_string_pretty(&v)?));
    }
    let mut out = String::new();
    let note = if exists { "" } else { " (not created yet)" };
    let _ = writeln!(out, "ledger       {}{note}", ledger_path.display());
    let _ = writeln!(
        out,
        "daemon       {}",
        if daemon_running {
            "running (holds the ledger lock)"
        } else {
            "not running"
        }
    );
    let _ = writeln!(out, "inputs       {}", config.daemon.inputs.display());
    let _ = writeln!(out, "outputs      {}", config.daemon.outputs.display());
    let _ = writeln!(out, "input files  {}", counts.input_files);
    let per_state: Vec<String> = counts
        .by_state
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    let _ = writeln!(
        out,
        "tasks        {} total: {}",
        counts.total,
        per_state.join(", ")
    );
    if !counts.unfinished_by_class.is_empty() {
        let per_class: Vec<String> = counts
            .unfinished_by_class
            .iter()
            .map(|(c, n)| format!("{n} {c}"))
            .collect();
        let _ = writeln!(
            out,
            "failed/dead  {}  (kiln retry --failed [--class C])",
            per_class.join(", ")
        );
    }
    if let Some(t) = counts.next_attempt_at {
        let _ = writeln!(out, "next retry   {t}");
    }
    super::print(&out)
}
