//! `config.toml`: the daemon's settings, their defaults, environment overrides and validation.
//!
//! Loading, in order:
//! 1. The file named by `--config` (a missing file is an error), or `./config.toml` when no path is
//!    given (a missing default file means "all defaults").
//! 2. Environment overrides `KILN_<SECTION>_<KEY>` (upper case, e.g. `KILN_DAEMON_CONCURRENCY=8`,
//!    `KILN_ENGINE_DEVICE=cpu`, `KILN_RETRY_MAX_ATTEMPTS_OOM=6`). A variable whose section is known but
//!    whose key is not is an error (it is almost always a typo); other `KILN_*` variables are ignored.
//! 3. Relative paths (`model.path`, `daemon.inputs|outputs|logs|ledger`) resolve against the folder of
//!    the config file (the current directory when there is no file), so the daemon behaves the same
//!    whatever directory systemd starts it in.
//! 4. Validation: every error names the key (`daemon.concurrency must be at least 1 (got 0)`).
//!
//! Every table is `deny_unknown_fields`: an unknown key is an error naming it, never silently ignored.
//! `config.toml` at the repository root documents every key with its default and override.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::config::EngineConfig;

mod env;
mod retry;

use env::{apply_env_override, section_of};
pub use retry::{MaxAttempts, RetrySettings};

/// File name of the embedded default model (`kiln model fetch-default` puts it into `models/`).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The config file read when `--config` is not given.
pub const DEFAULT_CONFIG_FILE: &str = "config.toml";

/// Prefix of the environment overrides.
const ENV_PREFIX: &str = "KILN_";

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The config file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema (unknown key, wrong type).
    #[error("{path}: {message}")]
    Parse {
        /// The config file (or `<defaults>` when there is none).
        path: PathBuf,
        /// The TOML error, naming the key and the line.
        message: String,
    },
    /// An environment override is malformed or names an unknown key.
    #[error("environment variable {var}: {message}")]
    Env {
        /// The variable, e.g. `KILN_DAEMON_CONCURRENCY`.
        var: String,
        /// What is wrong.
        message: String,
    },
    /// A value is out of range; the message names the key.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The whole `config.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[model]`: which model to load.
    pub model: ModelSettings,
    /// `[engine]`: the inference engine (see [`EngineConfig`]).
    pub engine: EngineConfig,
    /// `[daemon]`: folders, concurrency, watcher.
    pub daemon: DaemonSettings,
    /// `[retry]`: backoff and per-class attempt limits.
    pub retry: RetrySettings,
    /// `[logging]`: level and format.
    pub logging: LoggingSettings,
    /// `[metrics]`: the optional Prometheus endpoint of `kiln run`.
    pub metrics: MetricsSettings,
    /// The file this configuration was read from (`None` = defaults only).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSettings {
    /// A `.gguf` file or a Hugging Face folder; absolute after loading.
    pub path: PathBuf,
    /// Model name written into outputs; empty = the file or folder stem.
    pub name: String,
    /// Fetch the embedded default (`kiln model fetch-default`) when `path` names it and it is missing.
    pub fetch_default: bool,
}

impl Default for ModelSettings {
    fn default() -> Self {
        ModelSettings {
            path: Path::new("models").join(DEFAULT_MODEL_FILE),
            name: String::new(),
            fetch_default: true,
        }
    }
}

impl ModelSettings {
    /// The name written into outputs: `name`, or the stem of `path` when `name` is empty.
    pub fn display_name(&self) -> String {
        if !self.name.is_empty() {
            return self.name.clone();
        }
        let stem = if self.path.is_dir() {
            self.path.file_name()
        } else {
            self.path.file_stem()
        };
        stem.map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_owned())
    }

    /// Whether `path` names the embedded default model file (so it may be fetched when missing).
    pub fn is_embedded_default(&self) -> bool {
        self.path
            .file_name()
            .is_some_and(|n| n == DEFAULT_MODEL_FILE)
    }
}

/// `[daemon]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonSettings {
    /// Watched folder of task files; absolute after loading.
    pub inputs: PathBuf,
    /// Root of the dated output folders; absolute after loading.
    pub outputs: PathBuf,
    /// Daily log files and `tasks/<task_id>.log`; absolute after loading.
    pub logs: PathBuf,
    /// The SQLite ledger file; absolute after loading.
    pub ledger: PathBuf,
    /// Most tasks in flight at once (running in the engine or waiting in its queue); 0 = auto:
    /// `2 × engine.max_num_seqs`, so the engine is always full and has a queue ahead of it
    /// (see [`Config::daemon_concurrency`]).
    pub concurrency: usize,
    /// Generation cap of every task whose request sets neither `max_tokens` nor
    /// `max_completion_tokens` (a `.txt` / `.md` task, unless its front matter sets one), in tokens.
    pub default_max_tokens: u32,
    /// Deadline of one attempt, in seconds.
    pub task_timeout_secs: u64,
    /// After SIGTERM, how long in-flight tasks may finish, in seconds.
    pub shutdown_grace_secs: u64,
    /// A file is taken once its size has been unchanged this long, in seconds.
    pub stable_secs: f64,
    /// Period of the full rescan of `inputs`, in seconds.
    pub rescan_secs: u64,
    /// Use the polling watcher (network filesystems) instead of inotify.
    pub poll: bool,
    /// Poll period of the polling watcher, in seconds.
    pub poll_interval_secs: f64,
    /// Take symlinks that point outside `inputs`.
    pub follow_symlinks: bool,
    /// Larger input files fail as `invalid_input`, in bytes.
    pub max_input_bytes: u64,
    /// Period of the progress log line (counts, tasks/s, tokens/s, ETA), in seconds; 0 = off.
    pub progress_secs: u64,
}

impl Default for DaemonSettings {
    fn default() -> Self {
        DaemonSettings {
            inputs: PathBuf::from("inputs"),
            outputs: PathBuf::from("outputs"),
            logs: PathBuf::from("logs"),
            ledger: PathBuf::from("kiln.db"),
            concurrency: 0,
            default_max_tokens: 1024,
            task_timeout_secs: 600,
            shutdown_grace_secs: 30,
            stable_secs: 1.0,
            rescan_secs: 30,
            poll: false,
            poll_interval_secs: 2.0,
            follow_symlinks: false,
            max_input_bytes: 16 * 1024 * 1024,
            progress_secs: 60,
        }
    }
}

impl DaemonSettings {
    /// `task_timeout_secs` as a duration.
    pub fn task_timeout(&self) -> Duration {
        Duration::from_secs(self.task_timeout_secs)
    }

    /// `shutdown_grace_secs` as a duration.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }

    /// `stable_secs` as a duration.
    pub fn stable(&self) -> Duration {
        Duration::from_secs_f64(self.stable_secs)
    }

    /// `rescan_secs` as a duration.
    pub fn rescan(&self) -> Duration {
        Duration::from_secs(self.rescan_secs)
    }

    /// `poll_interval_secs` as a duration.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_secs_f64(self.poll_interval_secs)
    }

    /// Folder of the per-task logs: `<logs>/tasks`.
    pub fn task_logs(&self) -> PathBuf {
        self.logs.join("tasks")
    }

    /// The per-task log file `<logs>/tasks/<task_id>.log`.
    pub fn task_log(&self, task_id: impl std::fmt::Display) -> PathBuf {
        self.task_logs().join(format!("{task_id}.log"))
    }
}

/// Log line format, for stderr and the daily file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[logging]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingSettings {
    /// A `tracing` `EnvFilter` directive (`info`, `kiln=debug,sqlx=warn`); `RUST_LOG` overrides it.
    pub level: String,
    /// `text` or `json`.
    pub format: LogFormat,
    /// Daily log files kept in `daemon.logs` (older ones are deleted); 0 keeps all.
    pub max_log_files: usize,
}

impl Default for LoggingSettings {
    fn default() -> Self {
        LoggingSettings {
            level: "info".into(),
            format: LogFormat::Text,
            max_log_files: 30,
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// `host:port` where `kiln run` serves Prometheus metrics at `/metrics` (e.g.
    /// `127.0.0.1:9464`); empty (the default) serves nothing.
    pub listen: String,
}

impl MetricsSettings {
    /// The address to serve on, if any (checked by [`Config::validate`]).
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.listen.trim().parse().ok()
    }
}

impl Config {
    /// Load from `path` (or `./config.toml` when `None`), apply the process's `KILN_*` environment
    /// overrides, resolve relative paths and validate.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::load_with_env(
            path,
            // `vars()` panics on a variable that is not Unicode; such a variable cannot be ours.
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// [`Config::load`] with the environment given explicitly (for tests).
    pub fn load_with_env(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let (file, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_FILE), false),
        };
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => None,
            Err(source) => return Err(ConfigError::Io { path: file, source }),
        };
        let (base_dir, source) = match &text {
            Some(_) => {
                let abs = absolute(&file)?;
                let dir = abs
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("/"));
                (dir, Some(abs))
            }
            None => (current_dir()?, None),
        };
        let mut config = Config::from_toml_str(text.as_deref().unwrap_or(""), &file, env)?;
        config.source = source;
        config.resolve_paths(&base_dir);
        config.validate()?;
        Ok(config)
    }

    /// Parse `text` (named `origin` in errors) and apply the overrides in `env`. Paths stay as written.
    pub fn from_toml_str(
        text: &str,
        origin: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        // First pass straight from the text: its errors carry the line and the key.
        let parse_err = |e: toml::de::Error| ConfigError::Parse {
            path: origin.to_path_buf(),
            message: e.to_string(),
        };
        let config: Config = toml::from_str(text).map_err(parse_err)?;

        let mut overrides: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX) && section_of(k).is_some())
            .collect();
        if overrides.is_empty() {
            return Ok(config);
        }
        overrides.sort();
        let mut table: toml::Table = toml::from_str(text).map_err(parse_err)?;
        let defaults = toml::Table::try_from(Config::default())
            .map_err(|e| ConfigError::Invalid(format!("cannot serialize the defaults: {e}")))?;
        for (var, value) in &overrides {
            apply_env_override(&mut table, &defaults, var, value)?;
        }
        table
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Env {
                var: overrides
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                message: e.to_string(),
            })
    }

    /// Make every relative path absolute against `base` (the config file's folder).
    pub fn resolve_paths(&mut self, base: &Path) {
        for p in [
            &mut self.model.path,
            &mut self.daemon.inputs,
            &mut self.daemon.outputs,
            &mut self.daemon.logs,
            &mut self.daemon.ledger,
        ] {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }

    /// The daemon's bound on tasks in flight: `daemon.concurrency`, or when it is 0 (the default)
    /// `2 × engine.max_num_seqs`: every engine slot busy, and as many requests queued ahead of
    /// them so a finished sequence is replaced at the next step.
    pub fn daemon_concurrency(&self) -> usize {
        match self.daemon.concurrency {
            0 => self.engine.max_num_seqs.max(1).saturating_mul(2),
            n => n,
        }
    }

    /// Check every range; the error names the key, the constraint and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |msg: String| Err(ConfigError::Invalid(msg));
        self.engine.validate().map_err(ConfigError::Invalid)?;
        if !self.metrics.listen.trim().is_empty() && self.metrics.listen_addr().is_none() {
            return bad(format!(
                "`metrics.listen` = {:?} is not an address `host:port` with an IP host (e.g. \"127.0.0.1:9464\"); \
                 leave it empty for no metrics endpoint",
                self.metrics.listen
            ));
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let max_threads = (4 * cores).max(MIN_THREAD_LIMIT);
        if self.engine.threads > max_threads {
            return bad(format!(
                "`engine.threads` = {} is more than {max_threads} (4 × the {cores} cores of this machine); \
                 use 0 for one thread per core",
                self.engine.threads
            ));
        }
        let d = &self.daemon;
        if d.concurrency > MAX_CONCURRENCY {
            return bad(format!(
                "`daemon.concurrency` must be at most {MAX_CONCURRENCY} (got {}); 0 = auto (2 × engine.max_num_seqs)",
                d.concurrency
            ));
        }
        if d.default_max_tokens == 0 {
            return bad("`daemon.default_max_tokens` must be at least 1 (got 0)".into());
        }
        if d.task_timeout_secs == 0 {
            return bad("`daemon.task_timeout_secs` must be at least 1 (got 0)".into());
        }
        if d.rescan_secs == 0 {
            return bad("`daemon.rescan_secs` must be at least 1 (got 0)".into());
        }
        if !(d.stable_secs.is_finite() && d.stable_secs >= 0.0) {
            return bad(format!(
                "`daemon.stable_secs` must be a finite number ≥ 0 (got {})",
                d.stable_secs
            ));
        }
        if !(d.poll_interval_secs.is_finite() && d.poll_interval_secs > 0.0) {
            return bad(format!(
                "`daemon.poll_interval_secs` must be a finite number > 0 (got {})",
                d.poll_interval_secs
            ));
        }
        if d.max_input_bytes == 0 {
            return bad("`daemon.max_input_bytes` must be at least 1 (got 0)".into());
        }
        for (key, p) in [
            ("daemon.outputs", &d.outputs),
            ("daemon.logs", &d.logs),
            ("daemon.ledger", &d.ledger),
        ] {
            if p.starts_with(&d.inputs) {
                return bad(format!(
                    "`{key}` ({}) must not be inside `daemon.inputs` ({}): kiln would take its own files as tasks",
                    p.display(),
                    d.inputs.display()
                ));
            }
        }
        if d.ledger.as_os_str().is_empty() || d.ledger.file_name().is_none() {
            return bad(format!(
                "`daemon.ledger` must name a file (got `{}`)",
                d.ledger.display()
            ));
        }
        let r = &self.retry;
        if !(r.backoff_base_secs.is_finite() && r.backoff_base_secs > 0.0) {
            return bad(format!(
                "`retry.backoff_base_secs` must be a finite number > 0 (got {})",
                r.backoff_base_secs
            ));
        }
        if !(r.backoff_max_secs.is_finite() && r.backoff_max_secs >= r.backoff_base_secs) {
            return bad(format!(
                "`retry.backoff_max_secs` ({}) must be finite and at least `retry.backoff_base_secs` ({})",
                r.backoff_max_secs, r.backoff_base_secs
            ));
        }
        if !(0.0..1.0).contains(&r.jitter) {
            return bad(format!(
                "`retry.jitter` must be in 0 ≤ jitter < 1 (got {})",
                r.jitter
            ));
        }
        let m = r.max_attempts;
        for (key, n) in [
            ("oom", m.oom),
            ("timeout", m.timeout),
            ("parse", m.parse),
            ("internal", m.internal),
        ] {
            if n == 0 {
                return bad(format!(
                    "`retry.max_attempts.{key}` must be at least 1 (got 0)"
                ));
            }
        }
        check_log_level(&self.logging.level).map_err(ConfigError::Invalid)?;
        Ok(())
    }
}

/// Fewest threads `engine.threads` may always ask for, whatever the core count.
const MIN_THREAD_LIMIT: usize = 16;

/// Most tasks `daemon.concurrency` may keep in flight (each holds an engine request and a task).
const MAX_CONCURRENCY: usize = 65_536;

/// The level names a `logging.level` directive may use.
const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off"];

/// Validate `logging.level`: comma-separated directives, each a level (`info`) or
/// `target=level` (`kiln=debug`, `sqlx=warn`). `EnvFilter` itself reads a bare unknown word such
/// as `warning` as a *target* and silently turns every other log line off, errors included; so a
/// bare word must be a level name, and a target needs its `=level`.
pub fn check_log_level(level: &str) -> Result<(), String> {
    let hint = "expected a level (trace, debug, info, warn, error, off) or target=level directives like `kiln=debug,sqlx=warn`";
    if level.trim().is_empty() {
        return Err(format!("`logging.level` is empty: {hint}"));
    }
    for directive in level.split(',').map(str::trim) {
        let lvl = match directive.rsplit_once('=') {
            Some((target, lvl)) if !target.is_empty() => lvl,
            _ => directive,
        };
        if !LEVELS.contains(&lvl.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "`logging.level` has an unknown level `{lvl}` in `{directive}` (got `{level}`): {hint}"
            ));
        }
    }
    if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(level) {
        return Err(format!(
            "`logging.level` is not a valid filter directive (`{level}`): {e}"
        ));
    }
    Ok(())
}

fn current_dir() -> Result<PathBuf, ConfigError> {
    std::env::current_dir().map_err(|source| ConfigError::Io {
        path: PathBuf::from("."),
        source,
    })
}

fn absolute(p: &Path) -> Result<PathBuf, ConfigError> {
    std::path::absolute(p).map_err(|source| ConfigError::Io {
        path: p.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests;
