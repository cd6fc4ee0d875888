//! The engine thread: consumes [`EngineCommand`]s and runs scheduler steps on the model.
//!
//! One OS thread ("engine") owns the runner, the tokenizer and the scheduler; nothing else
//! touches them. When no request is pending it blocks on the command channel; otherwise it
//! drains the channel without blocking between steps. A step:
//! 1. drops requests whose submitter went away and fails those past their deadline (`Timeout`);
//! 2. asks the scheduler for the step's sequences and builds the [`ForwardBatch`];
//! 3. runs the model inside `catch_unwind`: an error or a panic fails exactly the requests of
//!    this step (the runner's error, or `Internal` for a panic) and the engine keeps serving;
//! 4. appends the token the backend sampled for each sequence that reached its end (from the
//!    descriptor its sampler built for the batch), and answers the requests that finished (a
//!    row that could not be sampled, or a panic while appending, fails only that request).
//!
//! A panic anywhere else in a step is a bug in the engine itself: every pending request fails
//! with `Internal`, the scheduler and cache bookkeeping start over empty, and the thread lives on.
//!
//! Start-up (model loading included) happens on the thread too; its result comes back to the
//! caller of `spawn` before any request is accepted.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::engine::config::EngineConfig;
use crate::engine::handle::{EngineCommand, EngineHandle, EngineInfo, EngineStats, RequestId};
use crate::engine::kv_cache::BlockManager;
use crate::engine::pipeline::InFlight;
use crate::engine::request::{Completion, FinishReason, GenerateRequest, Prompt};
use crate::engine::sampler;
use crate::engine::scheduler::{Scheduler, SchedulerConfig, SchedulerOutput};
use crate::engine::sequence::Sequence;
use crate::error::{EngineError, ModelError};
use crate::model::step::{resolve_feeds, Feed, ForwardBatch, LogitsFor, ModelRunner, SeqSlice};
use crate::sampling::{SampleError, Sampled};
use crate::tokenizer::Tokenizer;

mod step;

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The `[engine]` settings are invalid or do not match the runner.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// The model (or its tokenizer) could not be loaded.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The OS refused to start the engine thread.
    #[error("could not start the engine thread: {0}")]
    Thread(#[source] std::io::Error),
    /// Start-up panicked or the thread vanished.
    #[error("engine failed to start: {0}")]
    Internal(String),
}

/// What the engine thread serves: a model on a backend, its tokenizer, and its name.
pub(crate) struct Loaded {
    pub(crate) runner: Box<dyn ModelRunner>,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) model_name: String,
}

/// Loads the model on the engine thread before serving.
pub(crate) type Loader = Box<dyn FnOnce() -> Result<Loaded, StartError> + Send>;

/// Start the engine thread: run `load` on it, build the scheduler, and return a handle once
/// that succeeded (or the start-up error). Blocks the caller until then.
pub(crate) fn start(load: Loader, cfg: EngineConfig) -> Result<EngineHandle, StartError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (init_tx, init_rx) = std::sync::mpsc::sync_channel::<Result<EngineInfo, StartError>>(1);
    std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            let init = catch_unwind(AssertUnwindSafe(|| {
                let loaded = load()?;
                EngineCore::new(loaded.runner, loaded.tokenizer, &cfg, loaded.model_name)
            }));
            let core = match init {
                Ok(Ok(core)) => core,
                Ok(Err(e)) => {
                    // The caller is waiting on the other end; it cannot be gone yet.
                    let _ = init_tx.send(Err(e));
                    return;
                }
                Err(panic) => {
                    let _ = init_tx.send(Err(StartError::Internal(panic_message(&*panic))));
                    return;
                }
            };
            if init_tx.send(Ok(core.info.clone())).is_ok() {
                core.run(rx);
            }
        })
        .map_err(StartError::Thread)?;
    let info = init_rx
        .recv()
        .map_err(|_| StartError::Internal("the engine thread exited during start-up".into()))??;
    Ok(EngineHandle::from_channel(tx, info))
}

type Reply = oneshot::Sender<Result<Completion, EngineError>>;

/// Everything the engine thread owns.
struct EngineCore {
    runner: Box<dyn ModelRunner>,
    tokenizer: Tokenizer,
    scheduler: Scheduler,
    replies: HashMap<RequestId, Reply>,
    info: EngineInfo,
    vocab_size: usize,
    block_size: usize,
    stats: EngineStats,
    warned_preemption: bool,
    /// Set by a sticky device fault: the serve loop stops and fails what is pending with it.
    device_lost: Option<String>,
    /// Build the next step while the device runs the current one (`engine.overlap`, on a
    /// runner that queues steps).
    overlap: bool,
    /// The submitted step not yet collected.
    in_flight: Option<InFlight>,
    /// Steps submitted so far (the last one's number).
    next_step: u64,
}

impl EngineCore {
    fn new(
        runner: Box<dyn ModelRunner>,
        tokenizer: Tokenizer,
        cfg: &EngineConfig,
        model_name: String,
    ) -> Result<EngineCore, StartError> {
        cfg.validate().map_err(StartError::Config)?;
        let geometry = runner.cache_geometry();
        // Hybrid models: one state slot per running sequence (the first `max_num_seqs`); with
        // prefix caching the runner keeps more, which hold prefix checkpoints of the recurrent
        // state (without any, a cached prefix's state is unknown and prefix caching is off).
        let hybrid = geometry.num_state_slots > 0;
        let running_slots = geometry.num_state_slots.min(cfg.max_num_seqs);
        let checkpoint_slots = if cfg.enable_prefix_caching {
            geometry.num_state_slots - running_slots
        } else {
            0
        };
        let prefix_caching = cfg.enable_prefix_caching && (!hybrid || checkpoint_slots > 0);
        if hybrid && cfg.enable_prefix_caching && checkpoint_slots == 0 {
            tracing::warn!(
                "Prefix caching is off for this hybrid model: no state slot is left for prefix checkpoints."
            );
        }
        if geometry.num_blocks == 0 || geometry.block_size == 0 {
            return Err(StartError::Config(format!(
                "the KV cache is empty ({} blocks of {} tokens); raise `engine.kv_cache_mib`",
                geometry.num_blocks, geometry.block_size
            )));
        }
        let model_len = runner.max_position_embeddings();
        let max_model_len = match cfg.max_model_len {
            0 => model_len,
            n if n > model_len => {
                tracing::warn!(
                    configured = n,
                    model = model_len,
                    "Configured max_model_len exceeds the model's context; using the model's."
                );
                model_len
            }
            n => n,
        };
        let kv_tokens = geometry.num_blocks * geometry.block_size;
        if kv_tokens < max_model_len {
            tracing::warn!(
                kv_tokens,
                max_model_len,
                "The KV cache holds fewer tokens than max_model_len; longer sequences stop at the cache size."
            );
        }
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: cfg.max_num_seqs,
                max_num_batched_tokens: cfg.max_num_batched_tokens,
                max_model_len,
            },
            BlockManager::new(geometry.num_blocks, geometry.block_size, prefix_caching),
        )
        .with_state_slots(running_slots)
        .with_state_checkpoints(checkpoint_slots);
        let info = EngineInfo {
            model: model_name,
            max_model_len: max_model_len as u32,
            device: runner.device_name(),
            weight_bytes: runner.weight_bytes(),
        };
        tracing::info!(
            model = %info.model,
            device = %info.device,
            max_model_len,
            kv_blocks = geometry.num_blocks,
            block_size = geometry.block_size,
            kv_tokens,
            max_num_seqs = cfg.max_num_seqs,
            max_num_batched_tokens = cfg.max_num_batched_tokens,
            prefix_caching,
            state_slots = running_slots,
            state_checkpoints = checkpoint_slots,
            "Engine started."
        );
        let overlap = cfg.overlap && runner.queues_steps();
        tracing::info!(
            overlap,
            configured = cfg.overlap,
            "Step overlap {}.",
            if overlap {
                "on: the next step is built while the device runs the current one"
            } else {
                "off: each step is collected before the next is built"
            }
        );
        Ok(EngineCore {
            vocab_size: runner.vocab_size(),
            block_size: geometry.block_size,
            stats: EngineStats {
                kv_blocks_total: geometry.num_blocks,
                ..EngineStats::default()
            },
            runner,
            tokenizer,
            scheduler,
            replies: HashMap::new(),
            info,
            warned_preemption: false,
            device_lost: None,
            overlap,
            in_flight: None,
            next_step: 0,
        })
    }

    /// Serve commands until `Shutdown` or until every sender is gone.
    fn run(mut self, mut rx: mpsc::UnboundedReceiver<EngineCommand>) {
        'serve: loop {
            if self.scheduler.is_empty() && self.in_flight.is_none() {
                match rx.blocking_recv() {
                    Some(cmd) => {
                        if self.handle(cmd) {
                            break 'serve;
                        }
                    }
                    None => break 'serve,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => {
                        if self.handle(cmd) {
                            break 'serve;
                        }
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    // No handle and no pending completion is left: nobody can receive a reply.
                    Err(mpsc::error::TryRecvError::Disconnected) => break 'serve,
                }
            }
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.step())) {
                self.recover(&panic_message(&*panic));
            }
            if self.device_lost.is_some() {
                break 'serve;
            }
        }
        // A step still on the device is waited for (its blocks are then free to drop).
        self.collect_in_flight();
        let pending = self.scheduler.ids();
        let why = match &self.device_lost {
            Some(m) => EngineError::DeviceLost(m.clone()),
            None => EngineError::Cancelled,
        };
        for id in &pending {
            self.fail(*id, why.clone());
        }
        tracing::info!(
            cancelled = pending.len(),
            steps = self.stats.steps,
            "Engine stopped."
        );
    }

    /// After a panic outside the forward pass and the sampler (a bug in the engine itself), the
    /// scheduler's state cannot be trusted: fail every pending request with `Internal` and start
    /// over with an empty scheduler and cache, so the engine keeps serving new requests.
    fn recover(&mut self, message: &str) {
        tracing::error!(
            pending = self.replies.len(),
            panic = message,
            "Engine step panicked; failing every pending request and resetting the scheduler."
        );
        for (_, reply) in self.replies.drain() {
            // Receivers may be gone already.
            let _ = reply.send(Err(EngineError::Internal(format!(
                "engine step panicked: {message}"
            ))));
        }
        // The step in flight (if any) is waited for and dropped: its sequences are gone.
        if let Some(f) = self.in_flight.take() {
            let runner = &mut self.runner;
            let _ = catch_unwind(AssertUnwindSafe(|| runner.collect(f.submitted)));
        }
        let kv = self.scheduler.kv();
        let fresh = BlockManager::new(kv.num_blocks(), kv.block_size(), kv.prefix_caching());
        let slots = self.scheduler.state_slots().total();
        let checkpoints = self.scheduler.state_checkpoints().slots();
        self.scheduler = Scheduler::new(self.scheduler.config(), fresh)
            .with_state_slots(slots)
            .with_state_checkpoints(checkpoints);
    }

    /// Apply one command; true means stop.
    fn handle(&mut self, cmd: EngineCommand) -> bool {
        match cmd {
            EngineCommand::Submit { id, request, reply } => self.submit(id, *request, reply),
            EngineCommand::Cancel { id } => {
                if self.scheduler.remove(id).is_some() {
                    self.replies.remove(&id);
                    tracing::debug!(request_id = id, "Request cancelled.");
                }
            }
            EngineCommand::Stats { reply } => {
                // The asker may have given up waiting; nothing to do then.
                let _ = reply.send(self.current_stats());
            }
            EngineCommand::Shutdown => return true,
        }
        false
    }

    fn submit(&mut self, id: RequestId, request: GenerateRequest, reply: Reply) {
        let arrival = Instant::now();
        if reply.is_closed() {
            return;
        }
        // Tokenizer and template code run here; a panic in them fails this request only.
        let admitted = catch_unwind(AssertUnwindSafe(|| self.admit(id, &request, arrival)))
            .unwrap_or_else(|panic| {
                Err(EngineError::Internal(format!(
                    "panic while preparing the prompt: {}",
                    panic_message(&*panic)
                )))
            });
        match admitted {
            Ok(seq) => {
                tracing::debug!(
                    request_id = id,
                    prompt_tokens = seq.prompt_len,
                    max_len = seq.max_len,
                    "Request queued."
                );
                self.scheduler.add(seq);
                self.replies.insert(id, reply);
            }
            Err(e) => {
                tracing::debug!(request_id = id, error = %e, "Request refused.");
                // A closed receiver means the submitter no longer cares.
                let _ = reply.send(Err(e));
            }
        }
    }

    /// Tokenize and check a request; the sequence is ready to queue.
    fn admit(
        &self,
        id: RequestId,
        request: &GenerateRequest,
        arrival: Instant,
    ) -> Result<Sequence, EngineError> {
        sampler::validate(&request.sampling)?;
        if request.deadline.is_some_and(|d| d <= arrival) {
            return Err(EngineError::Timeout(
                "the deadline passed before the request was queued".into(),
            ));
        }
        let prompt_ids = self.prompt_ids(&request.prompt)?;
        let max_len = self
            .scheduler
            .admission_limit(prompt_ids.len(), request.sampling.max_tokens)?;
        Ok(Sequence::new(
            id,
            prompt_ids,
            &request.sampling,
            &self.tokenizer.eos_token_ids,
            max_len,
            self.block_size,
            request.deadline,
            arrival,
        ))
    }

    fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        let ids = match prompt {
            Prompt::TokenIds(ids) => ids.clone(),
            Prompt::Text(text) => self.tokenizer.encode(text, true).map_err(invalid_prompt)?,
            Prompt::Chat {
                messages,
                template_kwargs,
            } => self
                .tokenizer
                .encode_chat(messages, true, template_kwargs)
                .map_err(invalid_prompt)?,
        };
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(EngineError::InvalidInput(format!(
                "token id {bad} is outside the vocabulary (size {})",
                self.vocab_size
            )));
        }
        Ok(ids)
    }

    /// Drop requests nobody waits for; fail those past their deadline.
    fn reap(&mut self, now: Instant) {
        for id in self.scheduler.ids() {
            if self.replies.get(&id).is_none_or(|r| r.is_closed()) {
                self.scheduler.remove(id);
                self.replies.remove(&id);
                tracing::debug!(request_id = id, "Request dropped by its submitter.");
            } else if let Some(seq) = self.scheduler.get(id) {
                if seq.deadline.is_some_and(|d| d <= now) {
                    let generated = seq.num_generated();
                    self.fail(
                        id,
                        EngineError::Timeout(format!(
                            "the deadline passed after {generated} generated tokens"
                        )),
                    );
                }
            }
        }
    }

    fn finish(&mut self, id: RequestId, reason: FinishReason, now: Instant) {
        let Some(seq) = self.scheduler.remove(id) else {
            return;
        };
        let completion = seq.into_completion(reason, now);
        tracing::debug!(
            request_id = id,
            finish_reason = reason.as_str(),
            prompt_tokens = completion.usage.prompt_tokens,
            completion_tokens = completion.usage.completion_tokens,
            cached_prompt_tokens = completion.usage.cached_prompt_tokens,
            "Request finished."
        );
        if let Some(reply) = self.replies.remove(&id) {
            // The submitter may have gone away since the last reap.
            let _ = reply.send(Ok(completion));
        }
    }

    fn fail(&mut self, id: RequestId, error: EngineError) {
        self.scheduler.remove(id);
        if let Some(reply) = self.replies.remove(&id) {
            tracing::debug!(request_id = id, error = %error, "Request failed.");
            let _ = reply.send(Err(error));
        }
    }

    fn current_stats(&self) -> EngineStats {
        EngineStats {
            waiting: self.scheduler.num_waiting(),
            running: self.scheduler.num_running(),
            kv_blocks_used: self.scheduler.kv().num_used(),
            ..self.stats
        }
    }
}

/// Tokenizer and chat-template failures are the request's fault (a template that raises, a
/// model without a chat template).
fn invalid_prompt(e: ModelError) -> EngineError {
    EngineError::InvalidInput(format!("the prompt could not be prepared: {e}"))
}

/// The message of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}
