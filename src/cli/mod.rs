//! The `kiln` subcommands (binary crate only). Each file is one command: its clap arguments and a
//! `run` function; `anyhow` is used here and nowhere in the library.
//!
//! Shared helpers: loading the config, a small tokio runtime, opening the ledger for queries, and
//! writing to stdout without panicking when the reader goes away (`kiln list | head`).

pub mod cancel;
pub mod list;
pub mod logs;
pub mod prune;
pub mod retry;
pub mod run;
pub mod show;
pub mod status;
pub mod submit;

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use kiln::config::Config;
use kiln::ledger::{Ledger, TaskId};

/// Load `config.toml` (or the defaults) and install stderr logging.
pub fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    let config = Config::load(path).context("loading the configuration")?;
    // A second initialisation (tests calling commands twice) is harmless: keep the first.
    let _ = kiln::logging::init(&config.logging, None);
    Ok(config)
}

/// A single-threaded runtime for the query commands.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// Open the configured ledger for a command that needs it to exist already.
pub async fn open_existing_ledger(config: &Config) -> anyhow::Result<Ledger> {
    let path = &config.daemon.ledger;
    anyhow::ensure!(
        path.exists(),
        "no ledger at {}: nothing was recorded yet (start `kiln run`)",
        path.display()
    );
    Ledger::open(path)
        .await
        .with_context(|| format!("opening the ledger {}", path.display()))
}

/// Resolve a full task id or a unique prefix of one.
pub async fn resolve(ledger: &Ledger, text: &str) -> anyhow::Result<TaskId> {
    ledger
        .resolve_task_id(text)
        .await
        .with_context(|| format!("task `{text}`"))
}

/// One untrusted value (file name, `custom_id`, error) for a single line or table cell: every
/// control character escaped, newlines included.
pub fn safe(text: &str) -> std::borrow::Cow<'_, str> {
    kiln::logging::escape_line(text)
}

/// Write `text` to stdout; a closed pipe is not an error. Every control character but newline and
/// tab is escaped on the way ([`kiln::logging::escape_terminal`]): nothing read from inputs, the
/// ledger or a model can drive the terminal. JSON output stays valid JSON with the same values.
pub fn print(text: &str) -> anyhow::Result<()> {
    let text = kiln::logging::escape_terminal(text);
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// Pretty-print a stored JSON text, or return it as is when it does not parse.
pub fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_owned())
}
