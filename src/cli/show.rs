//! `kiln show ID [--json]`: everything the ledger knows about one task: its row, input file,
//! attempts (outcome, message, tokens, timings), request and result bodies, and its log file.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use kiln::ledger::{Attempt, AttemptStats};
use serde_json::json;

/// Arguments of `kiln show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// Task id (or a unique prefix of it).
    pub id: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `kiln show`.
pub fn run(config_path: Option<&Path>, args: ShowArgs) -> anyhow::Result<()> {
    let config = super::load_config(config_path)?;
    let (task, file, attempts) = super::runtime()?.block_on(async {
        let ledger = super::open_existing_ledger(&config).await?;
        let id = super::resolve(&ledger, &args.id).await?;
        let task = ledger
            .get(id)
            .await?
            .with_context(|| format!("no task {id}"))?;
        let file = ledger.input_file(task.input_file_id).await?;
        let attempts = ledger.attempts(id).await?;
        anyhow::Ok((task, file, attempts))
    })?;
    let log = config.daemon.task_log(task.task_id);

    if args.json {
        let mut v = super::list::task_json(&task);
        let obj = v.as_object_mut().context("task JSON is an object")?;
        obj.insert("input_file".into(), json!(file));
        obj.insert("attempts_history".into(), json!(attempts));
        obj.insert(
            "request".into(),
            parse_or_text(task.request_json.as_deref()),
        );
        obj.insert("result".into(), parse_or_text(task.result_json.as_deref()));
        obj.insert("log".into(), json!(log));
        return super::print(&format!("{}\n", serde_json::to_string_pretty(&v)?));
    }

    let mut out = String::new();
    let _ = writeln!(out, "task         {}", task.task_id);
    let _ = writeln!(out, "input        {}", super::list::input_label(&task));
    if let Some(f) = &file {
        let _ = writeln!(
            out,
            "input file   #{} {} ({} bytes, sha256 {}, generation {}, seen {})",
            f.id, f.kind, f.size, f.sha256, f.generation, f.discovered_at
        );
    }
    if let Some(c) = &task.custom_id {
        let _ = writeln!(out, "custom_id    {c}");
    }
    let _ = writeln!(
        out,
        "state        {} (attempts {})",
        task.state, task.attempts
    );
    if let Some(class) = task.error_class {
        let _ = writeln!(
            out,
            "error        {class}: {}",
            task.error.as_deref().unwrap_or("")
        );
    }
    if let Some(t) = task.next_attempt_at {
        let _ = writeln!(out, "next attempt {t}");
    }
    if let Some(o) = &task.output_path {
        let _ = writeln!(out, "output       {o}");
    }
    let _ = writeln!(
        out,
        "log          {}{}",
        log.display(),
        if log.exists() { "" } else { " (none yet)" }
    );
    let _ = writeln!(out, "created      {}", task.created_at);
    let _ = writeln!(out, "updated      {}", task.updated_at);
    if !attempts.is_empty() {
        let _ = writeln!(out, "attempts");
        for a in &attempts {
            let _ = writeln!(out, "  {}", attempt_line(a));
        }
    }
    if let Some(r) = &task.request_json {
        let _ = writeln!(out, "request\n{}", indent(&super::pretty_json(r)));
    }
    if let Some(r) = &task.result_json {
        let _ = writeln!(out, "result\n{}", indent(&super::pretty_json(r)));
    }
    super::print(&out)
}

fn parse_or_text(text: Option<&str>) -> serde_json::Value {
    match text {
        None => serde_json::Value::Null,
        Some(t) => serde_json::from_str(t).unwrap_or_else(|_| json!(t)),
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `#n <start> → <end> <outcome> [stats] [message]`.
fn attempt_line(a: &Attempt) -> String {
    let end = a
        .finished_at
        .map_or_else(|| "…".to_owned(), |t| t.to_string());
    let outcome = a.outcome.map_or("running", |o| o.as_str());
    let mut line = format!("#{} {} → {end} {outcome}", a.n, a.started_at);
    let stats = stats_text(&a.stats);
    if !stats.is_empty() {
        let _ = write!(line, " ({stats})");
    }
    if let Some(m) = &a.message {
        let _ = write!(line, ": {m}");
    }
    line
}

fn stats_text(s: &AttemptStats) -> String {
    let mut parts = Vec::new();
    if let Some(n) = s.prompt_tokens {
        parts.push(format!("prompt {n}"));
    }
    if let Some(n) = s.cached_tokens.filter(|&n| n > 0) {
        parts.push(format!("cached {n}"));
    }
    if let Some(n) = s.completion_tokens {
        parts.push(format!("completion {n}"));
    }
    if let Some(ms) = s.ttft_ms {
        parts.push(format!("ttft {ms:.1} ms"));
    }
    if let Some(tps) = s.decode_tps {
        parts.push(format!("{tps:.1} tok/s"));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use kiln::ledger::{AttemptOutcome, TaskId, UnixMillis};

    use super::*;

    #[test]
    fn attempt_lines_show_outcome_stats_and_message() {
        let a = Attempt {
            task_id: TaskId::new(),
            n: 2,
            started_at: UnixMillis(0),
            finished_at: Some(UnixMillis(1500)),
            outcome: Some(AttemptOutcome::Failed(kiln::error::ErrorClass::Oom)),
            message: Some("kv cache full".into()),
            stats: AttemptStats {
                prompt_tokens: Some(12),
                ttft_ms: Some(12.34),
                ..Default::default()
            },
        };
        assert_eq!(
            attempt_line(&a),
            "#2 1970-01-01T00:00:00.000Z → 1970-01-01T00:00:01.500Z oom (prompt 12, ttft 12.3 ms): kv cache full"
        );
    }
}
