//! The process-wide `tracing` subscriber: stderr, plus the daily file `<logs>/kiln.log.<YYYY-MM-DD>`.
//!
//! - The filter is `RUST_LOG` when set, else `logging.level` from `config.toml`.
//! - stderr uses colours only on a terminal, never under systemd (`JOURNAL_STREAM` set: stderr goes to
//!   the journal, which also stamps the time itself, so the timestamp is left out there) and never when
//!   `NO_COLOR` is set.
//! - The daily file (only for commands that pass a logs folder, i.e. `kiln run`) is written by
//!   `tracing-appender` on a background thread, never lossy; the returned [`WorkerGuard`] flushes it
//!   on drop, so `main` must hold it until exit. At most `logging.max_log_files` files are kept.
//! - `logging.format = "json"` switches both outputs to one JSON object per line.
//!
//! - Text lines never carry a raw control character: every field value and the message go through
//!   [`escape_line`] (a file name with a newline cannot forge a log line; see [`escape`]). JSON lines
//!   are escaped by the JSON encoder, and their fields stay structured.
//!
//! Per-task logs (`<logs>/tasks/<task_id>.log`) are the daemon's (`daemon::task_log`), not a layer here.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use tracing_appender::non_blocking::WorkerGuard;
use tracing_appender::rolling::{RollingFileAppender, Rotation};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::{LogFormat, LoggingSettings};

pub mod escape;

pub use escape::{escape_line, escape_terminal};

/// The field formatter of text lines: `message` as is, other fields as `name=value`, each value
/// through [`escape_line`].
fn escaped_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static
{
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        if field.name() == "message" {
            write!(w, "{}", escape_line(&text))
        } else {
            write!(w, "{}={}", field.name(), escape_line(&text))
        }
    })
    .delimited(" ")
}

/// File name prefix of the daily log: files are `kiln.log.<YYYY-MM-DD>` (UTC date).
pub const DAILY_LOG_PREFIX: &str = "kiln.log";

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// `RUST_LOG` or `logging.level` is not a valid filter.
    #[error("invalid log filter `{directive}`: {message}")]
    Filter {
        /// The directive.
        directive: String,
        /// The parser's message.
        message: String,
    },
    /// The logs folder or the daily file could not be created.
    #[error("{path}: {message}")]
    File {
        /// The logs folder.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A global subscriber was already installed.
    #[error("logging is already initialised: {0}")]
    AlreadySet(String),
}

/// Install the global subscriber. With `daily_dir`, also write `<daily_dir>/kiln.log.<date>`; hold
/// the returned guard until the process exits (dropping it flushes the file).
pub fn init(
    settings: &LoggingSettings,
    daily_dir: Option<&Path>,
) -> Result<Option<WorkerGuard>, LoggingError> {
    let filter = filter(settings)?;
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let ansi =
        std::io::stderr().is_terminal() && !under_journal && std::env::var_os("NO_COLOR").is_none();

    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = Vec::new();
    layers.push(match (settings.format, under_journal) {
        (LogFormat::Json, _) => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
        (LogFormat::Text, true) => tracing_subscriber::fmt::layer()
            .fmt_fields(escaped_fields())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .without_time()
            .boxed(),
        (LogFormat::Text, false) => tracing_subscriber::fmt::layer()
            .fmt_fields(escaped_fields())
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .boxed(),
    });

    let mut guard = None;
    if let Some(dir) = daily_dir {
        let file_err = |message: String| LoggingError::File {
            path: dir.to_path_buf(),
            message,
        };
        std::fs::create_dir_all(dir).map_err(|e| file_err(e.to_string()))?;
        let appender =
            daily_appender(dir, settings.max_log_files).map_err(|e| file_err(e.to_string()))?;
        let (writer, g) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .lossy(false)
            .thread_name("kiln-log-writer")
            .finish(appender);
        guard = Some(g);
        layers.push(match settings.format {
            LogFormat::Json => tracing_subscriber::fmt::layer()
                .json()
                .with_writer(writer)
                .boxed(),
            LogFormat::Text => tracing_subscriber::fmt::layer()
                .fmt_fields(escaped_fields())
                .with_writer(writer)
                .with_ansi(false)
                .boxed(),
        });
    }

    tracing_subscriber::registry()
        .with(layers)
        .with(filter)
        .try_init()
        .map_err(|e| LoggingError::AlreadySet(e.to_string()))?;
    Ok(guard)
}

/// The daily appender: `<dir>/kiln.log.<YYYY-MM-DD>`, keeping `max_files` files (0 = all).
pub fn daily_appender(
    dir: &Path,
    max_files: usize,
) -> Result<RollingFileAppender, tracing_appender::rolling::InitError> {
    let mut builder = RollingFileAppender::builder()
        .rotation(Rotation::DAILY)
        .filename_prefix(DAILY_LOG_PREFIX);
    if max_files > 0 {
        builder = builder.max_log_files(max_files);
    }
    builder.build(dir)
}

/// `RUST_LOG` when set (and not empty), else `logging.level`.
fn filter(settings: &LoggingSettings) -> Result<EnvFilter, LoggingError> {
    filter_from(std::env::var("RUST_LOG").ok(), settings)
}

fn filter_from(
    rust_log: Option<String>,
    settings: &LoggingSettings,
) -> Result<EnvFilter, LoggingError> {
    let directive = match rust_log {
        Some(v) if !v.trim().is_empty() => v,
        _ => settings.level.clone(),
    };
    EnvFilter::builder()
        .parse(&directive)
        .map_err(|e| LoggingError::Filter {
            directive: directive.clone(),
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn daily_file_is_named_by_the_date() {
        let dir = tempfile::tempdir().unwrap();
        let mut appender = daily_appender(dir.path(), 3).unwrap();
        appender.write_all(b"hello\n").unwrap();
        appender.flush().unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let date = names[0].strip_prefix("kiln.log.").expect("kiln.log.<date>");
        let parts: Vec<&str> = date.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [4, 2, 2],
            "{date}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join(&names[0])).unwrap(),
            "hello\n"
        );
    }

    #[test]
    fn rust_log_wins_over_the_configured_level() {
        let bad = LoggingSettings {
            level: "kiln=[".into(),
            ..Default::default()
        };
        let err = filter_from(None, &bad).unwrap_err();
        assert!(err.to_string().contains("kiln=["), "{err}");
        assert!(
            filter_from(Some("debug".into()), &bad).is_ok(),
            "RUST_LOG replaces the bad level"
        );
        assert!(
            filter_from(Some(" ".into()), &bad).is_err(),
            "an empty RUST_LOG is ignored"
        );
        assert!(filter_from(None, &LoggingSettings::default()).is_ok());
    }
}
