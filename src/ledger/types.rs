//! The ledger's value types: ids, states, timestamps, rows and the inputs of its operations.
//!
//! Strings stored in the database mirror [`TaskState::as_str`], [`InputKind::as_str`] and
//! [`ErrorClass::as_str`]; the migrations' `CHECK` constraints list the same sets.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::engine::request::Completion;
use crate::error::ErrorClass;

/// A task id: a UUID v7 (time-ordered), stored as hyphenated lower-case text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(pub Uuid);

impl TaskId {
    /// A fresh UUID v7 id.
    pub fn new() -> Self {
        TaskId(Uuid::now_v7())
    }
}

impl Default for TaskId {
    fn default() -> Self {
        TaskId::new()
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl FromStr for TaskId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(TaskId)
    }
}

/// Row id of an input file.
pub type InputFileId = i64;

/// A point in time as integer milliseconds since the Unix epoch (UTC): what every ledger
/// timestamp column stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UnixMillis(pub i64);

impl UnixMillis {
    /// The current wall-clock time.
    pub fn now() -> Self {
        UnixMillis::from(SystemTime::now())
    }

    /// This time plus `d` (saturating).
    pub fn after(self, d: Duration) -> Self {
        UnixMillis(
            self.0
                .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// RFC 3339 in UTC with millisecond precision, e.g. `2026-05-01T12:00:00.123Z`.
    pub fn to_rfc3339(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        match time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(t) => {
                let f = time::macros::format_description!(
                    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
                );
                t.format(&f).unwrap_or_else(|_| self.0.to_string())
            }
            Err(_) => self.0.to_string(),
        }
    }
}

impl From<SystemTime> for UnixMillis {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => UnixMillis(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(e) => UnixMillis(-i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX)),
        }
    }
}

impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// Where a task is in its life.
///
/// ```text
/// queued ──claim──▶ running ──▶ succeeded
///   ▲                  │ ├───▶ retry_wait ──(next_attempt_at passes: claimable as is)──▶ running
///   │                  │ ├───▶ failed   (class not retryable)
///   │                  │ └───▶ dead     (attempts of the class used up)
///   ├──release/recover─┘
///   └──── kiln retry ◀── failed | dead | cancelled        queued | retry_wait ──cancel──▶ cancelled
/// ```
/// `succeeded`, `failed`, `dead` and `cancelled` are terminal until a person runs `kiln retry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for a slot in the engine.
    Queued,
    /// Claimed by the dispatcher; an attempt is in flight.
    Running,
    /// Done; `result_json` holds the response body.
    Succeeded,
    /// Failed with a retryable class; claimable again once `next_attempt_at` passes.
    RetryWait,
    /// Failed with a class that is never retried (`invalid_input`), or rejected at intake.
    Failed,
    /// Failed with a retryable class after its attempts were used up.
    Dead,
    /// Withdrawn before it ran to the end.
    Cancelled,
}

impl TaskState {
    /// All states, in lifecycle order.
    pub const ALL: [TaskState; 7] = [
        TaskState::Queued,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::RetryWait,
        TaskState::Failed,
        TaskState::Dead,
        TaskState::Cancelled,
    ];

    /// The stored label (mirrored by the `CHECK` constraint on `tasks.state`).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::RetryWait => "retry_wait",
            TaskState::Failed => "failed",
            TaskState::Dead => "dead",
            TaskState::Cancelled => "cancelled",
        }
    }

    /// Whether nothing more happens to the task without `kiln retry`.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Dead | TaskState::Cancelled
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskState::ALL.into_iter().find(|t| t.as_str() == s).ok_or_else(|| {
            format!(
                "unknown task state `{s}` (expected one of queued, running, succeeded, retry_wait, failed, dead, cancelled)"
            )
        })
    }
}

/// The format of an input file, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    /// `.txt`: the whole file is one user message.
    Txt,
    /// `.md`: the whole file is one user message.
    Md,
    /// `.json`: one chat-completions request body.
    Json,
    /// `.jsonl`: an OpenAI Batch input file, one task per line.
    Jsonl,
}

impl InputKind {
    /// All kinds.
    pub const ALL: [InputKind; 4] = [
        InputKind::Txt,
        InputKind::Md,
        InputKind::Json,
        InputKind::Jsonl,
    ];

    /// The stored label, which is also the file extension.
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::Txt => "txt",
            InputKind::Md => "md",
            InputKind::Json => "json",
            InputKind::Jsonl => "jsonl",
        }
    }

    /// The kind of a file name by its extension (case-insensitive), if kiln takes it.
    pub fn from_path(path: &std::path::Path) -> Option<InputKind> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        InputKind::ALL.into_iter().find(|k| k.as_str() == ext)
    }
}

impl fmt::Display for InputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InputKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        InputKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown input kind `{s}` (expected txt, md, json or jsonl)"))
    }
}

/// A file as intake found it, before it is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewInputFile {
    /// Path relative to `inputs/`, `/`-separated.
    pub path: String,
    /// Lower-case hex SHA-256 of the content (64 characters).
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// Format.
    pub kind: InputKind,
}

/// A recorded input file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InputFile {
    /// Row id.
    pub id: InputFileId,
    /// Path relative to `inputs/`.
    pub path: String,
    /// Lower-case hex SHA-256 of the content.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// Format.
    pub kind: InputKind,
    /// 0 for the first run of this content; +1 for each `kiln submit --force`.
    pub generation: u32,
    /// When intake recorded it.
    pub discovered_at: UnixMillis,
}

/// How intake hands over one task.
#[derive(Debug, Clone, PartialEq)]
pub enum NewTaskBody {
    /// A parsed request body (JSON text); the task starts `queued`.
    Request(String),
    /// The input could not become a request (bad line, empty file, unsupported parameter); the task
    /// starts `failed` with this class and message, and is never claimed or retried.
    Rejected {
        /// Why (normally `invalid_input`).
        class: ErrorClass,
        /// A message for the user, written into the error output.
        message: String,
    },
}

/// One task to insert for an input file.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    /// 1-based line of a `.jsonl` file; `None` for whole-file tasks.
    pub line: Option<u32>,
    /// The `.jsonl` `custom_id`, if any.
    pub custom_id: Option<String>,
    /// The request or the rejection.
    pub body: NewTaskBody,
}

/// A task row, joined with its input file's path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task {
    /// Id.
    pub task_id: TaskId,
    /// The input file row.
    pub input_file_id: InputFileId,
    /// The input file's path relative to `inputs/`.
    pub input_path: String,
    /// 1-based line of a `.jsonl`; `None` for whole-file tasks.
    pub line: Option<u32>,
    /// The `.jsonl` `custom_id`.
    pub custom_id: Option<String>,
    /// The parsed request body; `None` when rejected at intake.
    pub request_json: Option<String>,
    /// Current state.
    pub state: TaskState,
    /// Counted attempts since intake or the last `kiln retry` (interrupted ones excluded).
    pub attempts: u32,
    /// The ledger's number of the latest attempt (`attempts.n`: 1, 2, … over the task's whole
    /// life, never reset by `kiln retry`); what task logs call "Attempt N". 0 before the first claim.
    pub attempt_number: u32,
    /// `retry_wait` only: when it becomes claimable.
    pub next_attempt_at: Option<UnixMillis>,
    /// Class of the last failure (cleared by success and by `kiln retry`).
    pub error_class: Option<ErrorClass>,
    /// Message of the last failure.
    pub error: Option<String>,
    /// The response body on success.
    pub result_json: Option<String>,
    /// Where the writer put the task's result or error line.
    pub output_path: Option<String>,
    /// When intake inserted it.
    pub created_at: UnixMillis,
    /// Last change.
    pub updated_at: UnixMillis,
    /// Last claim.
    pub started_at: Option<UnixMillis>,
    /// Last transition to a terminal state or `retry_wait`.
    pub finished_at: Option<UnixMillis>,
}

/// Engine statistics of one attempt; all optional (a failed attempt may have none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AttemptStats {
    /// Tokens in the templated prompt.
    pub prompt_tokens: Option<u32>,
    /// Tokens generated.
    pub completion_tokens: Option<u32>,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: Option<u32>,
    /// Time to first token, in milliseconds.
    pub ttft_ms: Option<f64>,
    /// Decode speed, in tokens per second.
    pub decode_tps: Option<f64>,
}

impl AttemptStats {
    /// The statistics of a finished completion.
    pub fn from_completion(c: &Completion) -> Self {
        AttemptStats {
            prompt_tokens: Some(c.usage.prompt_tokens),
            completion_tokens: Some(c.usage.completion_tokens),
            cached_tokens: Some(c.usage.cached_prompt_tokens),
            ttft_ms: Some(c.timings.ttft.as_secs_f64() * 1e3),
            decode_tps: Some(c.timings.decode_tokens_per_s),
        }
    }
}

/// How an attempt ended (`attempts.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// The task succeeded.
    Succeeded,
    /// The attempt failed with this class.
    Failed(ErrorClass),
    /// Cut short by a shutdown or a crash of kiln.
    Interrupted,
}

impl AttemptOutcome {
    /// The stored label: `succeeded`, the class label, or `interrupted`.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed(c) => c.as_str(),
            AttemptOutcome::Interrupted => "interrupted",
        }
    }
}

impl FromStr for AttemptOutcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "succeeded" => Ok(AttemptOutcome::Succeeded),
            "interrupted" => Ok(AttemptOutcome::Interrupted),
            other => other.parse().map(AttemptOutcome::Failed),
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of `attempts`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    /// The task.
    pub task_id: TaskId,
    /// Claim number, 1-based, never reused.
    pub n: u32,
    /// When it was claimed.
    pub started_at: UnixMillis,
    /// When it ended; `None` while running.
    pub finished_at: Option<UnixMillis>,
    /// How it ended; `None` while running.
    pub outcome: Option<AttemptOutcome>,
    /// The error message, or the interruption reason.
    pub message: Option<String>,
    /// Engine statistics.
    pub stats: AttemptStats,
}

/// Which tasks `list` returns. All fields are conjunctive; `None` means any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this state.
    pub state: Option<TaskState>,
    /// Only this error class.
    pub error_class: Option<ErrorClass>,
    /// Only tasks of this input file.
    pub input_file_id: Option<InputFileId>,
    /// At most this many (the oldest first).
    pub limit: Option<u32>,
}

/// Task counts for `kiln status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Tasks per state (every state present, 0 included).
    pub by_state: Vec<(TaskState, u64)>,
    /// `failed` and `dead` tasks per error class (classes with 0 omitted).
    pub unfinished_by_class: Vec<(ErrorClass, u64)>,
    /// All tasks.
    pub total: u64,
    /// Recorded input files (generations counted separately).
    pub input_files: u64,
    /// The earliest `next_attempt_at` among `retry_wait` tasks.
    pub next_attempt_at: Option<UnixMillis>,
}

impl Counts {
    /// The count of one state.
    pub fn get(&self, state: TaskState) -> u64 {
        self.by_state
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }
}

/// What `retry` did with one requested id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum RetryResult {
    /// Back to `queued` (attempts reset to 0).
    Requeued,
    /// No task with this id.
    NotFound,
    /// The task is not `failed`, `dead` or `cancelled`.
    WrongState {
        /// Its state.
        state: TaskState,
    },
    /// The task was rejected at intake: it has no request to run.
    NoRequest,
}

/// What `recover_running` did at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Tasks put back to `queued`.
    pub requeued: Vec<TaskId>,
    /// Tasks given up (`dead`, class `internal`) after too many interrupted attempts.
    pub dead: Vec<TaskId>,
    /// Tasks whose `kiln cancel` came while they ran: now `cancelled`.
    pub cancelled: Vec<TaskId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        for s in TaskState::ALL {
            assert_eq!(s.as_str().parse::<TaskState>(), Ok(s));
        }
        for k in InputKind::ALL {
            assert_eq!(k.as_str().parse::<InputKind>(), Ok(k));
        }
        for o in [
            AttemptOutcome::Succeeded,
            AttemptOutcome::Interrupted,
            AttemptOutcome::Failed(ErrorClass::Oom),
        ] {
            assert_eq!(o.as_str().parse::<AttemptOutcome>(), Ok(o));
        }
        assert!("done".parse::<TaskState>().is_err());
    }

    #[test]
    fn kind_from_extension_is_case_insensitive() {
        assert_eq!(
            InputKind::from_path("a/b.JSONL".as_ref()),
            Some(InputKind::Jsonl)
        );
        assert_eq!(InputKind::from_path("x.md".as_ref()), Some(InputKind::Md));
        assert_eq!(InputKind::from_path("x.csv".as_ref()), None);
        assert_eq!(InputKind::from_path("noext".as_ref()), None);
    }

    #[test]
    fn millis_format_as_utc_rfc3339() {
        assert_eq!(UnixMillis(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            UnixMillis(1_700_000_000_123).to_rfc3339(),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(
            UnixMillis(1000).after(Duration::from_millis(1500)),
            UnixMillis(2500)
        );
    }

    #[test]
    fn task_ids_are_v7_and_round_trip() {
        let a = TaskId::new();
        let b = TaskId::new();
        assert_eq!(a.0.get_version_num(), 7);
        assert!(a < b, "v7 ids are time-ordered");
        assert_eq!(a.to_string().parse::<TaskId>().unwrap(), a);
    }
}
