//! Per-task log files: `logs/tasks/<task_id>.log`, one plain-text line per event,
//! `<RFC 3339 UTC> <LEVEL> <message>` (read by `kiln logs ID [--follow]`).
//!
//! Everything about one task goes there: intake, each attempt (start, engine stats, outcome),
//! retries and the final error. Lines are appended with one `write` each on a file opened in
//! append mode, so concurrent writers of different tasks never interleave and a crash loses at
//! most the line being written. Failing to write a task log never fails the task: the error
//! goes to the daemon log instead.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Severity of a task-log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Lifecycle (intake, attempt start/finish).
    Info,
    /// Something recovered (a retry, an ignored parameter).
    Warn,
    /// The task failed for good.
    Error,
}

impl Level {
    /// The label written into the line.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

/// The folder of per-task logs (`<logs>/tasks`).
#[derive(Debug, Clone)]
pub struct TaskLogs {
    dir: PathBuf,
}

impl TaskLogs {
    /// Task logs under `<logs_dir>/tasks` (created on first write).
    pub fn new(logs_dir: &Path) -> Self {
        TaskLogs {
            dir: logs_dir.join("tasks"),
        }
    }

    /// The log file of a task.
    pub fn path(&self, task_id: &str) -> PathBuf {
        self.dir.join(format!("{task_id}.log"))
    }

    /// Append one line; a failure is reported in the daemon log, never returned.
    pub fn write(&self, task_id: &str, level: Level, message: &str) {
        if let Err(e) = self.try_write(task_id, level, message) {
            tracing::warn!(task_id, error = %e, "Could not write the task log.");
        }
    }

    /// Shorthand for an `INFO` line.
    pub fn info(&self, task_id: &str, message: &str) {
        self.write(task_id, Level::Info, message);
    }

    /// Shorthand for a `WARN` line.
    pub fn warn(&self, task_id: &str, message: &str) {
        self.write(task_id, Level::Warn, message);
    }

    /// Shorthand for an `ERROR` line.
    pub fn error(&self, task_id: &str, message: &str) {
        self.write(task_id, Level::Error, message);
    }

    fn try_write(&self, task_id: &str, level: Level, message: &str) -> std::io::Result<()> {
        // Task ids are UUIDs; anything else would be a bug, and must not become a path.
        if task_id.is_empty() || !task_id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "task id is not a UUID",
            ));
        }
        std::fs::create_dir_all(&self.dir)?;
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        // One line per event: newlines and terminal controls inside the message are escaped.
        let line = format!(
            "{now} {} {}\n",
            level.as_str(),
            crate::logging::escape_line(message)
        );
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(task_id))?;
        f.write_all(line.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_timestamped_levelled_and_appended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = TaskLogs::new(dir.path());
        let id = "01890a5d-ac96-774b-bcce-b302099a8057";
        logs.info(id, "Taken from inputs/a.txt.");
        logs.warn(id, "Attempt 1 failed:\nout of memory.");
        logs.error(id, "Dead: custom_id \x1b[2J\x1b]0;pwned\x07.");
        let text = std::fs::read_to_string(dir.path().join("tasks").join(format!("{id}.log")))
            .expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        for (line, level) in lines.iter().zip(["INFO", "WARN", "ERROR"]) {
            let mut parts = line.splitn(3, ' ');
            let ts = parts.next().unwrap();
            // e.g. 2026-03-04T05:06:07.123456789Z
            let b = ts.as_bytes();
            assert!(
                ts.len() >= 20 && b[4] == b'-' && b[10] == b'T' && ts.ends_with('Z'),
                "{ts}"
            );
            assert_eq!(parts.next(), Some(level));
        }
        assert!(lines[1].ends_with("Attempt 1 failed:\\nout of memory."));
        assert!(
            lines[2].ends_with("custom_id \\u001b[2J\\u001b]0;pwned\\u0007."),
            "{}",
            lines[2]
        );
        assert!(!text.contains('\x1b') && !text.contains('\x07'));
    }

    #[test]
    fn a_non_uuid_id_never_becomes_a_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = TaskLogs::new(dir.path());
        assert!(logs.try_write("../../evil", Level::Info, "x").is_err());
        assert!(!dir.path().join("tasks").exists());
    }
}
