//! [`EngineHandle`]: the only way into the engine.
//!
//! The engine runs on its own OS thread and owns the model, the KV cache and the scheduler.
//! Callers talk to it through a cloneable handle that sends [`EngineCommand`]s over a channel;
//! each submission gets a oneshot reply. Dropping a [`PendingCompletion`] before it resolves
//! cancels the request inside the engine (its KV blocks are freed at the next step).
//!
//! Anything that consumes `EngineCommand`s can stand behind a handle: the real engine loop
//! (`engine::spawn`) or a test double (`EngineHandle::from_fn`) used for fault injection.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot};

use crate::engine::request::{Completion, GenerateRequest};
use crate::error::EngineError;

/// Engine-assigned request id, unique per handle family.
pub type RequestId = u64;

/// What the engine is serving, for outputs and logs.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EngineInfo {
    /// Model name as written into outputs (`model` field).
    pub model: String,
    /// Longest sequence (prompt + completion) in tokens.
    pub max_model_len: u32,
    /// Backend description, e.g. `cpu (2 threads)` or `cuda:0 (sm_90)`.
    pub device: String,
    /// Bytes of the weight matrices on the device (0 when the model does not say).
    pub weight_bytes: u64,
}

/// Counters the engine publishes for watchdogs, progress bars and `STATUS=` lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct EngineStats {
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Requests being prefilled or decoded.
    pub running: usize,
    /// Scheduler steps executed since start (grows while the engine makes progress).
    pub steps: u64,
    /// Tokens generated since start.
    pub generated_tokens: u64,
    /// Prompt tokens computed since start (excluding prefix-cache hits).
    pub prompt_tokens: u64,
    /// KV blocks in use / total.
    pub kv_blocks_used: usize,
    /// Total KV blocks.
    pub kv_blocks_total: usize,
    /// Time spent in forward steps since start, microseconds (with `steps`: the mean step time;
    /// read by the daemon's metrics).
    pub step_micros: u64,
}

/// Messages the engine thread consumes.
#[derive(Debug)]
pub enum EngineCommand {
    /// Run a request; the result goes to `reply`.
    Submit {
        /// Handle-assigned id (used by `Cancel`).
        id: RequestId,
        /// The request.
        request: Box<GenerateRequest>,
        /// Where the completion (or error) goes. A closed receiver means cancelled.
        reply: oneshot::Sender<Result<Completion, EngineError>>,
    },
    /// Drop a request (no reply is sent for it).
    Cancel {
        /// The id given at `Submit`.
        id: RequestId,
    },
    /// Report current counters.
    Stats {
        /// Where the counters go.
        reply: oneshot::Sender<EngineStats>,
    },
    /// Fail everything pending with `Cancelled` and stop the thread.
    Shutdown,
}

struct Shared {
    tx: mpsc::UnboundedSender<EngineCommand>,
    next_id: AtomicU64,
    info: EngineInfo,
}

/// Cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("info", &self.shared.info)
            .finish()
    }
}

impl EngineHandle {
    /// Wrap a command channel whose receiver is served by an engine loop (or a test double).
    pub fn from_channel(tx: mpsc::UnboundedSender<EngineCommand>, info: EngineInfo) -> Self {
        EngineHandle {
            shared: Arc::new(Shared {
                tx,
                next_id: AtomicU64::new(1),
                info,
            }),
        }
    }

    /// A test double: every request is answered by `f` on a tokio task (cancel and stats are
    /// honoured trivially). Used by the daemon's fault-injection tests.
    pub fn from_fn<F, Fut>(info: EngineInfo, f: F) -> Self
    where
        F: Fn(GenerateRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Completion, EngineError>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<EngineCommand>();
        let f = Arc::new(f);
        tokio::spawn(async move {
            let mut stats = EngineStats::default();
            while let Some(cmd) = rx.recv().await {
                match cmd {
                    EngineCommand::Submit { request, reply, .. } => {
                        stats.steps += 1;
                        let fut = f(*request);
                        tokio::spawn(async move {
                            // The receiver may be gone (cancelled); nothing to do then.
                            let _ = reply.send(fut.await);
                        });
                    }
                    EngineCommand::Cancel { .. } => {}
                    EngineCommand::Stats { reply } => {
                        let _ = reply.send(stats);
                    }
                    EngineCommand::Shutdown => break,
                }
            }
        });
        Self::from_channel(tx, info)
    }

    /// What the engine serves.
    pub fn info(&self) -> &EngineInfo {
        &self.shared.info
    }

    /// Submit a request. The returned future resolves to the completion; dropping it cancels.
    pub fn submit(&self, request: GenerateRequest) -> PendingCompletion {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        let sent = self
            .shared
            .tx
            .send(EngineCommand::Submit {
                id,
                request: Box::new(request),
                reply,
            })
            .is_ok();
        PendingCompletion {
            id,
            rx,
            tx: self.shared.tx.clone(),
            done: !sent,
        }
    }

    /// Current engine counters; `None` when the engine has stopped.
    pub async fn stats(&self) -> Option<EngineStats> {
        let (reply, rx) = oneshot::channel();
        self.shared.tx.send(EngineCommand::Stats { reply }).ok()?;
        rx.await.ok()
    }

    /// Ask the engine thread to stop; pending requests fail with `Cancelled`.
    pub fn shutdown(&self) {
        // The engine may already be gone; that is the goal anyway.
        let _ = self.shared.tx.send(EngineCommand::Shutdown);
    }
}

/// A submitted request; resolves to its completion. Dropping it cancels the request.
#[derive(Debug)]
pub struct PendingCompletion {
    id: RequestId,
    rx: oneshot::Receiver<Result<Completion, EngineError>>,
    tx: mpsc::UnboundedSender<EngineCommand>,
    done: bool,
}

impl PendingCompletion {
    /// The engine-side id of this request.
    pub fn id(&self) -> RequestId {
        self.id
    }
}

impl Future for PendingCompletion {
    type Output = Result<Completion, EngineError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.done && self.rx.is_terminated() {
            return Poll::Ready(Err(EngineError::Internal("engine is not running".into())));
        }
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(r) => {
                self.done = true;
                Poll::Ready(r.unwrap_or_else(|_| {
                    Err(EngineError::Internal(
                        "engine stopped before answering".into(),
                    ))
                }))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for PendingCompletion {
    fn drop(&mut self) {
        if !self.done {
            // The engine may have stopped; a failed send means nothing is left to cancel.
            let _ = self.tx.send(EngineCommand::Cancel { id: self.id });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::{FinishReason, Prompt, Timings, Usage};

    fn info() -> EngineInfo {
        EngineInfo {
            model: "fake".into(),
            max_model_len: 64,
            device: "none".into(),
            weight_bytes: 0,
        }
    }

    fn echo(req: GenerateRequest) -> Completion {
        let text = match req.prompt {
            Prompt::Text(t) => t,
            _ => String::new(),
        };
        Completion {
            text,
            token_ids: vec![],
            finish_reason: FinishReason::Stop,
            usage: Usage::default(),
            timings: Timings::default(),
            logprobs: None,
        }
    }

    #[tokio::test]
    async fn test_double_answers_and_counts() {
        let h = EngineHandle::from_fn(info(), |req| async move { Ok(echo(req)) });
        let c = h
            .submit(GenerateRequest::new(Prompt::Text("hi".into())))
            .await
            .expect("ok");
        assert_eq!(c.text, "hi");
        assert_eq!(h.stats().await.map(|s| s.steps), Some(1));
    }

    #[tokio::test]
    async fn stopped_engine_is_an_error_not_a_hang() {
        let h = EngineHandle::from_fn(info(), |req| async move { Ok(echo(req)) });
        h.shutdown();
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let r = h
            .submit(GenerateRequest::new(Prompt::Text("x".into())))
            .await;
        assert!(matches!(r, Err(EngineError::Internal(_))), "{r:?}");
    }
}
