//! The dispatcher: claims tasks from the ledger, keeps at most `daemon.concurrency` attempts in
//! flight inside the engine, and records how each attempt ended.
//!
//! Invariants:
//! - every claimed task is in `running` until [`Dispatcher::finish`] or
//!   [`Dispatcher::interrupt_all`] moves it on; nothing else touches it;
//! - claims are fair across input files (the ledger's `claim_next` round-robins by file);
//! - after a failed attempt the [`RetryPolicy`] decides: `retry_wait` with backoff, `failed`
//!   (`invalid_input`) or `dead` (the class's attempts used up);
//! - an interrupted attempt (shutdown) is released without counting;
//! - time comes from [`Clock`], which follows tokio's clock (so tests can pause it) anchored at
//!   the wall clock when the daemon started.

use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::task::JoinSet;

use crate::daemon::attempt::{run_attempt, AttemptContext, AttemptResult};
use crate::daemon::retry::{RetryDecision, RetryPolicy};
use crate::ledger::{
    AttemptStats, InputFileId, Ledger, LedgerError, Task, TaskId, TaskState, UnixMillis,
};

/// Wall-clock milliseconds that advance with tokio's clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_at_start: UnixMillis,
    start: tokio::time::Instant,
}

impl Clock {
    /// A clock reading the wall clock now.
    pub fn start() -> Self {
        Clock {
            wall_at_start: UnixMillis::now(),
            start: tokio::time::Instant::now(),
        }
    }

    /// Now, in unix milliseconds.
    pub fn now(&self) -> UnixMillis {
        UnixMillis(self.wall_at_start.0 + self.start.elapsed().as_millis() as i64)
    }

    /// How long until `at` (zero when it has passed).
    pub fn until(&self, at: UnixMillis) -> Duration {
        Duration::from_millis(at.0.saturating_sub(self.now().0).max(0) as u64)
    }
}

/// Counters of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchCounts {
    /// Attempts started.
    pub attempts: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks that failed for good (`invalid_input`).
    pub failed: u64,
    /// Tasks that used up their attempts.
    pub dead: u64,
    /// Failed attempts that will be retried.
    pub retried: u64,
    /// Attempts cut by shutdown (not counted against the tasks).
    pub interrupted: u64,
    /// Running tasks stopped by `kiln cancel`.
    pub cancelled: u64,
}

/// What finishing an attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    /// The task's input file (its outputs may now be due).
    pub input_file_id: InputFileId,
    /// The task's new state.
    pub state: TaskState,
}

/// Claims and runs tasks.
#[derive(Debug)]
pub struct Dispatcher {
    ledger: Ledger,
    ctx: AttemptContext,
    policy: RetryPolicy,
    concurrency: usize,
    clock: Clock,
    rng: StdRng,
    in_flight: JoinSet<(TaskId, AttemptResult)>,
    running: HashMap<TaskId, (tokio::task::AbortHandle, Task)>,
    counts: DispatchCounts,
}

impl Dispatcher {
    /// A dispatcher with nothing in flight.
    pub fn new(
        ledger: Ledger,
        ctx: AttemptContext,
        policy: RetryPolicy,
        concurrency: usize,
        clock: Clock,
    ) -> Self {
        Dispatcher {
            ledger,
            ctx,
            policy,
            concurrency: concurrency.max(1),
            clock,
            rng: StdRng::from_os_rng(),
            in_flight: JoinSet::new(),
            running: HashMap::new(),
            counts: DispatchCounts::default(),
        }
    }

    /// Attempts in flight.
    pub fn in_flight(&self) -> usize {
        self.running.len()
    }

    /// This run's counters.
    pub fn counts(&self) -> DispatchCounts {
        self.counts
    }

    /// Claim tasks for the free slots and start their attempts; returns how many started.
    pub async fn fill(&mut self) -> Result<usize, LedgerError> {
        let free = self.concurrency.saturating_sub(self.running.len());
        if free == 0 {
            return Ok(0);
        }
        let claimed = self.ledger.claim_next(free, self.clock.now()).await?;
        let n = claimed.len();
        for task in claimed {
            let id = task.task_id;
            let sid = id.to_string();
            let retry_of = task.error_class.filter(|_| task.attempts > 1);
            match retry_of {
                Some(class) => self.ctx.logs.info(
                    &sid,
                    &format!(
                        "Attempt {} started (retry after a {class} failure).",
                        task.attempt_number
                    ),
                ),
                None => self
                    .ctx
                    .logs
                    .info(&sid, &format!("Attempt {} started.", task.attempt_number)),
            }
            tracing::debug!(task_id = %id, attempt = task.attempts, input = %task.input_path, "Attempt started.");
            let ctx = self.ctx.clone();
            let t = task.clone();
            let handle = self.in_flight.spawn(async move {
                let r = run_attempt(&ctx, &t).await;
                (t.task_id, r)
            });
            self.running.insert(id, (handle, task));
            self.counts.attempts += 1;
        }
        Ok(n)
    }

    /// Wait for the next attempt to end (`None` when nothing is in flight).
    pub async fn next_done(&mut self) -> Option<(TaskId, AttemptResult)> {
        loop {
            let joined = self.in_flight.join_next_with_id().await?;
            match joined {
                Ok((_, done)) => return Some(done),
                Err(e) => {
                    // A panic inside an attempt: find its task by the tokio task id.
                    let tid = e.id();
                    let found = self
                        .running
                        .iter()
                        .find(|(_, (h, _))| h.id() == tid)
                        .map(|(id, _)| *id);
                    if let Some(id) = found {
                        let msg = if e.is_panic() {
                            "the attempt panicked (a bug in kiln)"
                        } else {
                            "the attempt was aborted"
                        };
                        return Some((
                            id,
                            AttemptResult::Failed {
                                class: crate::error::ErrorClass::Internal,
                                message: msg.into(),
                                stats: AttemptStats::default(),
                            },
                        ));
                    }
                }
            }
        }
    }

    /// Record how an attempt ended: success, retry with backoff, failed, dead, or released.
    pub async fn finish(
        &mut self,
        id: TaskId,
        result: AttemptResult,
    ) -> Result<Finished, LedgerError> {
        let Some((_, task)) = self.running.remove(&id) else {
            return Err(LedgerError::NotFound(id.to_string()));
        };
        let sid = id.to_string();
        let logs = &self.ctx.logs;
        let state = match result {
            AttemptResult::Succeeded { result, stats } => {
                let c = &result.completion;
                logs.info(
                    &sid,
                    &format!(
                        "Attempt {} succeeded: finish_reason {}, {} prompt tokens ({} cached), {} completion tokens, \
                         queue {:.0} ms, TTFT {:.0} ms, total {:.0} ms, {:.1} tokens/s.",
                        task.attempt_number,
                        c.finish_reason.as_str(),
                        c.usage.prompt_tokens,
                        c.usage.cached_prompt_tokens,
                        c.usage.completion_tokens,
                        c.timings.queue.as_secs_f64() * 1e3,
                        c.timings.ttft.as_secs_f64() * 1e3,
                        c.timings.total.as_secs_f64() * 1e3,
                        c.timings.decode_tokens_per_s,
                    ),
                );
                let json = serde_json::to_string(&result)
                    .map_err(|e| LedgerError::Invalid(e.to_string()))?;
                self.ledger.finish_success(id, &json, stats).await?;
                self.counts.succeeded += 1;
                tracing::debug!(task_id = %id, input = %task.input_path, "Task succeeded.");
                TaskState::Succeeded
            }
            AttemptResult::Failed {
                class,
                message,
                stats,
            } => {
                let decision = self.policy.decide(class, task.attempts, &mut self.rng);
                let next = match decision {
                    RetryDecision::Retry(delay) => Some(self.clock.now().after(delay)),
                    RetryDecision::Fail | RetryDecision::Dead => None,
                };
                let state = self
                    .ledger
                    .finish_failure(id, class, &message, stats, next)
                    .await?;
                match decision {
                    RetryDecision::Retry(delay) => {
                        self.counts.retried += 1;
                        logs.warn(
                            &sid,
                            &format!(
                                "Attempt {} failed ({class}): {message}. Retrying in {:.1}s (attempt {} of at most {}).",
                                task.attempt_number,
                                delay.as_secs_f64(),
                                task.attempts + 1,
                                self.policy.max_attempts(class),
                            ),
                        );
                        tracing::warn!(task_id = %id, class = %class, attempt = task.attempts, delay_s = delay.as_secs_f64(), error = %message, "Attempt failed; will retry.");
                    }
                    RetryDecision::Fail => {
                        self.counts.failed += 1;
                        logs.error(
                            &sid,
                            &format!(
                                "Attempt {} failed ({class}, not retried): {message}.",
                                task.attempt_number
                            ),
                        );
                        tracing::warn!(task_id = %id, class = %class, error = %message, "Task failed.");
                    }
                    RetryDecision::Dead => {
                        self.counts.dead += 1;
                        logs.error(
                            &sid,
                            &format!(
                                "Attempt {} failed ({class}): {message}. No attempts left: dead.",
                                task.attempt_number
                            ),
                        );
                        tracing::error!(task_id = %id, class = %class, attempts = task.attempts, error = %message, "Task is dead after its last attempt.");
                    }
                }
                state
            }
            AttemptResult::Interrupted(reason) | AttemptResult::DeviceLost(reason) => {
                self.ledger.release_interrupted(id, &reason).await?;
                self.counts.interrupted += 1;
                logs.warn(
                    &sid,
                    &format!(
                        "Attempt {} interrupted ({reason}); back to queued, not counted.",
                        task.attempt_number
                    ),
                );
                TaskState::Queued
            }
        };
        Ok(Finished {
            input_file_id: task.input_file_id,
            state,
        })
    }

    /// Stop the attempt of a running task that `kiln cancel` asked about: its engine request is
    /// dropped (which cancels it inside the engine) and the task becomes `cancelled`. `None` when
    /// the task is not in flight here (it ended meanwhile).
    pub async fn cancel(&mut self, id: TaskId) -> Result<Option<Finished>, LedgerError> {
        let Some((handle, task)) = self.running.remove(&id) else {
            return Ok(None);
        };
        handle.abort();
        let reason = "cancelled by `kiln cancel` while it ran";
        self.ledger.finish_cancelled(id, reason).await?;
        self.counts.cancelled += 1;
        self.ctx.logs.warn(
            &id.to_string(),
            &format!("Attempt {} stopped: {reason}.", task.attempt_number),
        );
        tracing::info!(task_id = %id, input = %task.input_path, "Task cancelled.");
        Ok(Some(Finished {
            input_file_id: task.input_file_id,
            state: TaskState::Cancelled,
        }))
    }

    /// Cut every attempt still in flight (shutdown grace over): the engine requests are cancelled
    /// and the tasks go back to `queued` without counting the attempt.
    pub async fn interrupt_all(&mut self, reason: &str) -> Result<usize, LedgerError> {
        self.interrupt_all_with(reason, false).await
    }

    /// [`Dispatcher::interrupt_all`] after the engine itself went away (a sticky device fault, its
    /// thread ended): attempts that ended with an `internal` failure or `DeviceLost` just now
    /// failed because of that, not because of their task, so they are released uncounted too.
    pub async fn abandon_all(&mut self, reason: &str) -> Result<usize, LedgerError> {
        self.interrupt_all_with(reason, true).await
    }

    async fn interrupt_all_with(
        &mut self,
        reason: &str,
        engine_lost: bool,
    ) -> Result<usize, LedgerError> {
        // Attempts that ended just now are recorded as they ended, not thrown away.
        while let Some(Ok((_, (id, result)))) = self.in_flight.try_join_next_with_id() {
            let result = match result {
                AttemptResult::Failed {
                    class: crate::error::ErrorClass::Internal,
                    ..
                }
                | AttemptResult::DeviceLost(_)
                    if engine_lost =>
                {
                    AttemptResult::Interrupted(reason.to_string())
                }
                other => other,
            };
            self.finish(id, result).await?;
        }
        self.in_flight.abort_all();
        let ids: Vec<TaskId> = self.running.keys().copied().collect();
        for id in &ids {
            self.finish(*id, AttemptResult::Interrupted(reason.to_string()))
                .await?;
        }
        // Reap the aborted tasks so nothing outlives the dispatcher.
        while self.in_flight.join_next().await.is_some() {}
        Ok(ids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorClass;

    /// The backoff schedule on tokio's paused clock: each retry becomes due exactly when its
    /// delay has elapsed on the clock the dispatcher claims with, up to the cap and the limit.
    #[tokio::test(start_paused = true)]
    async fn backoff_schedule_follows_the_paused_clock() {
        let policy = RetryPolicy {
            backoff_base_secs: 2.0,
            backoff_max_secs: 10.0,
            jitter: 0.0,
            max_attempts_oom: 5,
            ..RetryPolicy::default()
        };
        let clock = Clock::start();
        let mut rng = StdRng::seed_from_u64(7);
        let mut waited = Vec::new();
        for attempts in 1.. {
            let delay = match policy.decide(ErrorClass::Oom, attempts, &mut rng) {
                RetryDecision::Retry(d) => d,
                RetryDecision::Dead => break,
                RetryDecision::Fail => unreachable!("oom is retryable"),
            };
            let due = clock.now().after(delay);
            let t0 = tokio::time::Instant::now();
            // What the daemon loop does: sleep until the retry is due, then claim with `now`.
            tokio::time::sleep(clock.until(due)).await;
            assert!(clock.now() >= due);
            assert_eq!(clock.until(due), Duration::ZERO);
            waited.push(t0.elapsed().as_secs());
        }
        assert_eq!(
            waited,
            vec![2, 4, 8, 10],
            "2 s, 4 s, 8 s, then the 10 s cap; dead at attempt 5"
        );
    }
}
