//! One attempt of one task: the stored request → the engine → an [`AttemptResult`].
//!
//! - The request is re-parsed from the ledger's `request_json` (never from the input file).
//! - Each attempt has a deadline of `daemon.task_timeout`: the engine gets it as the request's
//!   deadline, and the daemon also stops waiting a little after it (a wedged engine cannot hold a
//!   slot forever; dropping the pending completion cancels the request inside the engine).
//! - An output that fails the request's `response_format` is a `parse` failure; the next attempt
//!   of a task whose last failure was `parse` gets a new seed (derived from the task id, or the
//!   request's own seed, and the attempt number), so a sampled retry can produce something else.
//! - A request that sets neither `max_tokens` nor `max_completion_tokens` gets
//!   `daemon.default_max_tokens`: no task runs to `max_model_len` by accident.
//! - `EngineError::Cancelled` (the engine is shutting down) is an interruption, not a failure.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::daemon::openai;
use crate::daemon::task_log::TaskLogs;
use crate::daemon::writer::StoredResult;
use crate::engine::EngineHandle;
use crate::error::{EngineError, ErrorClass};
use crate::ledger::{AttemptStats, Task};

/// How long past the deadline the daemon waits for the engine's own `Timeout` answer: a tenth
/// of the timeout, at most this.
const DEADLINE_SLACK: Duration = Duration::from_secs(5);

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptResult {
    /// A completion that satisfies the request.
    Succeeded {
        /// What goes into `result_json`.
        result: StoredResult,
        /// Engine statistics for the `attempts` row.
        stats: AttemptStats,
    },
    /// A failed attempt.
    Failed {
        /// Its class.
        class: ErrorClass,
        /// What happened.
        message: String,
        /// Engine statistics (tokens of an output that failed `response_format`).
        stats: AttemptStats,
    },
    /// Cut short by a shutdown (does not count as an attempt).
    Interrupted(String),
    /// The engine stopped on a sticky device fault: the attempt does not count, and the daemon
    /// must stop (non-zero exit) so the process restarts with a fresh device.
    DeviceLost(String),
}

/// Everything an attempt needs besides the task.
#[derive(Debug, Clone)]
pub struct AttemptContext {
    /// The engine.
    pub engine: EngineHandle,
    /// The model name written into results.
    pub model: String,
    /// Deadline per attempt.
    pub task_timeout: Duration,
    /// `daemon.default_max_tokens`: the cap of a request that sets none.
    pub default_max_tokens: u32,
    /// Per-task logs.
    pub logs: TaskLogs,
}

/// A seed for attempt `attempt` of a task after a `parse` failure: splitmix64 of the base
/// (the request's seed, or the task id's low 64 bits) and the attempt number.
pub fn retry_seed(base: u64, attempt: u32) -> u64 {
    let mut z = base.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(u64::from(attempt)));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Run one attempt of a claimed task (its `attempts` already counts this one).
pub async fn run_attempt(ctx: &AttemptContext, task: &Task) -> AttemptResult {
    let id = task.task_id.to_string();
    let fail = |class: ErrorClass, message: String| AttemptResult::Failed {
        class,
        message,
        stats: AttemptStats::default(),
    };
    let Some(body) = task.request_json.as_deref() else {
        return fail(
            ErrorClass::InvalidInput,
            "the task has no request (it was rejected at intake)".into(),
        );
    };
    let body: serde_json::Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => {
            return fail(
                ErrorClass::Internal,
                format!("the stored request is not valid JSON: {e}"),
            )
        }
    };
    let chat = match openai::parse_chat_request(&body) {
        Ok(c) => c,
        Err(e) => return fail(ErrorClass::InvalidInput, format!("invalid request: {e}")),
    };
    let mut request = chat.to_generate_request();
    if request.sampling.max_tokens.is_none() {
        request.sampling.max_tokens = Some(ctx.default_max_tokens);
    }
    if task.attempts > 1
        && task.error_class == Some(ErrorClass::Parse)
        && chat.response_format.is_constrained()
    {
        let base = request
            .sampling
            .seed
            .unwrap_or(task.task_id.0.as_u64_pair().1);
        let seed = retry_seed(base, task.attempts);
        request.sampling.seed = Some(seed);
        let greedy = if request.sampling.is_greedy() {
            " (greedy decoding: a new seed changes nothing unless the request samples)"
        } else {
            ""
        };
        ctx.logs.warn(
            &id,
            &format!(
                "Attempt {} uses seed {seed} after a response_format failure{greedy}.",
                task.attempt_number
            ),
        );
    }
    request.deadline = Some(std::time::Instant::now() + ctx.task_timeout);

    let pending = ctx.engine.submit(request);
    let answer = match tokio::time::timeout(
        ctx.task_timeout + (ctx.task_timeout / 10).min(DEADLINE_SLACK),
        pending,
    )
    .await
    {
        Ok(a) => a,
        Err(_) => {
            return fail(
                ErrorClass::Timeout,
                format!(
                    "no answer within the task timeout of {}s",
                    ctx.task_timeout.as_secs_f64()
                ),
            )
        }
    };
    match answer {
        Ok(completion) => {
            let stats = AttemptStats::from_completion(&completion);
            if let Err(why) = chat.response_format.check(&completion.text) {
                return AttemptResult::Failed {
                    class: ErrorClass::Parse,
                    message: why,
                    stats,
                };
            }
            let created = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let result = StoredResult {
                model: ctx.model.clone(),
                created,
                completion,
            };
            AttemptResult::Succeeded { result, stats }
        }
        Err(EngineError::DeviceLost(m)) => AttemptResult::DeviceLost(m),
        Err(EngineError::Cancelled) => {
            AttemptResult::Interrupted("the engine cancelled the request (shutting down)".into())
        }
        Err(e) => {
            let class = e.class().unwrap_or(ErrorClass::Internal);
            AttemptResult::Failed {
                class,
                message: e.to_string(),
                stats: AttemptStats::default(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_seeds_differ_per_attempt_and_are_stable() {
        let a: Vec<u64> = (2..6).map(|n| retry_seed(42, n)).collect();
        let b: Vec<u64> = (2..6).map(|n| retry_seed(42, n)).collect();
        assert_eq!(a, b);
        let mut uniq = a.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), a.len());
        assert_ne!(retry_seed(42, 2), retry_seed(43, 2));
    }
}
