//! `kiln list [--state S] [--class C] [--limit N] [--json]`: the tasks of the ledger, oldest first.
//!
//! `--json` prints one array; each object has at least `task_id`, `input` (path relative to
//! `inputs/`), `line`, `custom_id`, `state`, `attempts`, `error_class`, `error`, `output` (path).

use std::fmt::Write as _;
use std::path::Path;

use kiln::error::ErrorClass;
use kiln::ledger::{ListFilter, Task, TaskState};
use serde_json::json;

/// Arguments of `kiln list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Only tasks in this state (queued, running, succeeded, retry_wait, failed, dead, cancelled).
    #[arg(long, value_parser = clap::builder::ValueParser::new(|s: &str| s.parse::<TaskState>()))]
    pub state: Option<TaskState>,
    /// Only tasks whose last failure has this class (oom, timeout, parse, invalid_input, internal).
    #[arg(long, value_parser = clap::builder::ValueParser::new(|s: &str| s.parse::<ErrorClass>()))]
    pub class: Option<ErrorClass>,
    /// At most this many tasks (the oldest first).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Run `kiln list`.
pub fn run(config_path: Option<&Path>, args: ListArgs) -> anyhow::Result<()> {
    let config = super::load_config(config_path)?;
    let tasks = if config.daemon.ledger.exists() {
        super::runtime()?.block_on(async {
            let ledger = super::open_existing_ledger(&config).await?;
            let filter = ListFilter {
                state: args.state,
                error_class: args.class,
                input_file_id: None,
                limit: args.limit,
            };
            anyhow::Ok(ledger.list(&filter).await?)
        })?
    } else {
        Vec::new()
    };
    if args.json {
        let array: Vec<serde_json::Value> = tasks.iter().map(task_json).collect();
        return super::print(&format!("{}\n", serde_json::to_string_pretty(&array)?));
    }
    super::print(&table(&tasks))
}

/// The JSON object of one task (shared with `kiln show --json`).
pub fn task_json(t: &Task) -> serde_json::Value {
    json!({
        "task_id": t.task_id.to_string(),
        "input": t.input_path,
        "input_file_id": t.input_file_id,
        "line": t.line,
        "custom_id": t.custom_id,
        "state": t.state.as_str(),
        "attempts": t.attempts,
        "error_class": t.error_class.map(ErrorClass::as_str),
        "error": t.error,
        "output": t.output_path,
        "next_attempt_at": t.next_attempt_at.map(|m| m.to_rfc3339()),
        "created_at": t.created_at.to_rfc3339(),
        "updated_at": t.updated_at.to_rfc3339(),
        "started_at": t.started_at.map(|m| m.to_rfc3339()),
        "finished_at": t.finished_at.map(|m| m.to_rfc3339()),
    })
}

/// `input` or `input:line`.
pub fn input_label(t: &Task) -> String {
    match t.line {
        Some(line) => format!("{}:{line}", t.input_path),
        None => t.input_path.clone(),
    }
}

fn table(tasks: &[Task]) -> String {
    if tasks.is_empty() {
        return "no tasks\n".to_owned();
    }
    let inputs: Vec<String> = tasks
        .iter()
        .map(|t| super::safe(&input_label(t)).into_owned())
        .collect();
    let customs: Vec<String> = tasks
        .iter()
        .map(|t| super::safe(t.custom_id.as_deref().unwrap_or("-")).into_owned())
        .collect();
    let w_input = inputs
        .iter()
        .map(|s| s.chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    let w_custom = customs
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(0)
        .max(9);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<36}  {:<10}  {:>3}  {:<w_input$}  {:<w_custom$}  ERROR",
        "TASK", "STATE", "ATT", "INPUT", "CUSTOM_ID"
    );
    for ((t, input), custom) in tasks.iter().zip(&inputs).zip(&customs) {
        let error = match (&t.error_class, &t.error) {
            (Some(c), Some(e)) => format!("{c}: {}", super::safe(&one_line(e, 80))),
            (Some(c), None) => c.to_string(),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<36}  {:<10}  {:>3}  {:<w_input$}  {:<w_custom$}  {error}",
            t.task_id.to_string(),
            t.state.as_str(),
            t.attempts,
            input,
            custom,
        );
    }
    out
}

/// The first line of `s`, cut to `max` characters.
fn one_line(s: &str, max: usize) -> String {
    let first = s.lines().next().unwrap_or("");
    if first.chars().count() > max || first.len() < s.trim_end().len() {
        let cut: String = first.chars().take(max).collect();
        format!("{cut}…")
    } else {
        first.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_or_multiline_errors_are_cut() {
        assert_eq!(one_line("short", 10), "short");
        assert_eq!(one_line("first\nsecond", 10), "first…");
        assert_eq!(one_line("abcdefghijkl", 5), "abcde…");
    }
}
