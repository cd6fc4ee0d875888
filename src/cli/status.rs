//! `kiln status [--json]`: task counts per state, failures per class, whether a daemon holds the
//! ledger, throughput over the last five minutes (tasks/s, tokens/s) with an ETA of what is open,
//! and per-input counts of the files that are not finished.

use std::fmt::Write as _;
use std::path::Path;

use kiln::ledger::{Counts, FileReport, Ledger, TaskState, Throughput, UnixMillis};
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
    let (counts, rate, files) = if exists {
        super::runtime()?.block_on(async {
            let ledger = super::open_existing_ledger(&config).await?;
            let counts = ledger.counts().await?;
            let rate = ledger.throughput(UnixMillis::now(), WINDOW_MS).await?;
            let files: Vec<FileReport> = ledger
                .file_reports(UnixMillis(0))
                .await?
                .into_iter()
                .filter(|f| !f.is_complete())
                .collect();
            anyhow::Ok((counts, rate, files))
        })?
    } else {
        (
            Counts {
                by_state: TaskState::ALL.iter().map(|&s| (s, 0)).collect(),
                ..Default::default()
            },
            Throughput::default(),
            Vec::new(),
        )
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
            "throughput": rate,
            "unfinished_files": files,
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
    let eta = match rate.eta_secs {
        Some(s) if rate.open > 0 => format!(", ETA {}", human_secs(s)),
        None if rate.open > 0 => ", ETA unknown (nothing finished lately)".to_owned(),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "throughput   {:.2} tasks/s, {:.1} tokens/s over the last {:.0} min{eta}",
        rate.tasks_per_s,
        rate.tokens_per_s,
        rate.window_secs / 60.0
    );
    for f in files.iter().take(MAX_FILES) {
        let _ = writeln!(
            out,
            "  {}: {} task(s), {} succeeded, {} failed, {} unfinished{}",
            super::safe(&f.path),
            f.total,
            f.succeeded,
            f.failed,
            f.open,
            if f.open == 0 {
                ", outputs not written yet"
            } else {
                ""
            }
        );
    }
    if files.len() > MAX_FILES {
        let _ = writeln!(
            out,
            "  … and {} more unfinished file(s)",
            files.len() - MAX_FILES
        );
    }
    super::print(&out)
}

/// The throughput window of `kiln status`.
const WINDOW_MS: i64 = 5 * 60 * 1000;

/// Unfinished input files listed by `kiln status` (text).
const MAX_FILES: usize = 20;

/// `95 s`, `12 min`, `3.5 h`.
fn human_secs(s: f64) -> String {
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}
