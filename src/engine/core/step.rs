//! The engine's step: schedule, build the [`ForwardBatch`], submit it to the runner, and
//! collect the step in flight (with `engine.overlap`, step N+1 is built and submitted before step
//! N is collected: [`crate::engine::pipeline`]); then append the sampled tokens and finish or
//! fail the sequences. Split out of `engine/core.rs`, whose [`EngineCore`] it extends.

use super::*;

impl EngineCore {
    /// One scheduler step: with a step in flight (overlap), the next one is scheduled, built
    /// and submitted before the one in flight is collected (see [`crate::engine::pipeline`]).
    pub(super) fn step(&mut self) {
        let now = Instant::now();
        self.reap(now);
        if self.in_flight.is_some() && !self.can_build_ahead() {
            self.collect_in_flight();
        }
        let prev = self.in_flight.take();
        let next = if self.scheduler.is_empty() || self.device_lost.is_some() {
            None
        } else {
            self.submit_next(now, prev.as_ref())
        };
        if let Some(prev) = prev {
            self.collect(prev);
        }
        self.in_flight = next;
        if !self.overlap {
            self.collect_in_flight();
        }
    }

    /// Whether the next step may be built while the one in flight runs: no sequence of it needs
    /// its token for the next sampling descriptor (penalties), and the free blocks rule out a
    /// preemption (which must free blocks at once).
    fn can_build_ahead(&self) -> bool {
        let Some(f) = &self.in_flight else {
            return true;
        };
        let history = f.out.scheduled.iter().any(|s| {
            s.sample
                && self
                    .scheduler
                    .get(s.id)
                    .is_some_and(|q| q.sampling_needs_history())
        });
        !history && self.scheduler.fits_without_preemption()
    }

    /// Collect the step in flight, if any.
    pub(super) fn collect_in_flight(&mut self) {
        if let Some(f) = self.in_flight.take() {
            self.collect(f);
        }
    }

    /// Schedule, build and submit the next step (`prev`: the step in flight, whose sampled
    /// tokens this one is fed on the device). `None` when nothing was scheduled or the
    /// submission failed (its requests are failed then).
    fn submit_next(&mut self, now: Instant, prev: Option<&InFlight>) -> Option<InFlight> {
        let out = self.scheduler.schedule(now);
        if !out.preempted.is_empty() && !self.warned_preemption {
            self.warned_preemption = true;
            tracing::warn!(
                kv_blocks = self.stats.kv_blocks_total,
                "The KV cache is full: preempting sequences to recompute later. A larger cache would avoid the recomputation."
            );
        }
        if out.scheduled.is_empty() {
            if prev.is_none() {
                // The scheduler invariants rule this out; do not spin if it happens anyway.
                tracing::warn!(
                    waiting = self.scheduler.num_waiting(),
                    running = self.scheduler.num_running(),
                    "Nothing could be scheduled."
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            return None;
        }
        let (mut batch, feeds) = self.build_batch(&out, prev);
        let rows = out.scheduled.iter().filter(|s| s.sample).count();
        let t0 = Instant::now();
        // Hybrid prefix hits: the state after the cached prefix comes from its checkpoint.
        let restores: Vec<(u32, u32)> = out
            .scheduled
            .iter()
            .filter_map(|s| Some((s.restore_state_from?, batch_slot(&batch, &out, s.id)?)))
            .collect();
        let runner = &mut self.runner;
        let done_prev = prev.and_then(|p| p.submitted.output());
        let result = catch_unwind(AssertUnwindSafe(|| {
            for &(src, dst) in &restores {
                runner.copy_state_slot(src, dst)?;
            }
            match done_prev {
                // The step before was computed at submission: its tokens are known here.
                Some(o) => {
                    resolve_feeds(&mut batch, &feeds, o);
                    runner.submit(&batch, &[])
                }
                None => runner.submit(&batch, &feeds),
            }
        }))
        .unwrap_or_else(|panic| {
            Err(EngineError::Internal(format!(
                "panic in the forward pass: {}",
                panic_message(&*panic)
            )))
        });
        let submitted = match result {
            Ok(s) => s,
            Err(e) => {
                self.step_failed(&out, e);
                return None;
            }
        };
        self.next_step += 1;
        let number = self.next_step;
        self.scheduler.step_submitted(number, &out.scheduled);
        for (src, dst) in self.scheduler.complete_step(&out.scheduled) {
            // Slot ids come from the scheduler's own pools: a failure is an engine bug.
            if let Err(e) = self.runner.copy_state_slot(src, dst) {
                panic!("checkpoint of state slot {src} into {dst} failed: {e}");
            }
        }
        self.count_prompt_tokens(&out);
        let mut sample_rows = HashMap::with_capacity(rows);
        for s in out.scheduled.iter().filter(|s| s.sample) {
            let row = sample_rows.len();
            sample_rows.insert(s.id, row);
            if let Some(seq) = self.scheduler.get_mut(s.id) {
                seq.pending += 1;
            }
        }
        Some(InFlight {
            number,
            out,
            submitted,
            sample_rows,
            rows,
            fed: feeds.len(),
            t0,
        })
    }

    /// Wait for a submitted step's tokens and apply them: append each sampling row's token to
    /// its sequence (rows of sequences that finished, failed or were cancelled since the step
    /// was built are discarded), answer the finished requests, free what the step held back.
    fn collect(&mut self, f: InFlight) {
        let rows = f.rows;
        let runner = &mut self.runner;
        let result = match catch_unwind(AssertUnwindSafe(|| runner.collect(f.submitted))) {
            Ok(Ok(fwd)) if fwd.samples.len() == rows => Ok(fwd.samples),
            Ok(Ok(fwd)) => Err(EngineError::Internal(format!(
                "the model returned {} sampled tokens for {rows} sampling rows",
                fwd.samples.len(),
            ))),
            Ok(Err(e)) => Err(e),
            Err(panic) => Err(EngineError::Internal(format!(
                "panic in the forward pass: {}",
                panic_message(&*panic)
            ))),
        };
        self.scheduler.step_collected(f.number);
        let samples = match result {
            Ok(s) => s,
            Err(e) => {
                self.step_failed(&f.out, e);
                return;
            }
        };
        let forward_time = f.t0.elapsed();
        self.append_all(&f.out, samples);
        self.stats.steps += 1;
        self.stats.step_micros = self
            .stats
            .step_micros
            .saturating_add(u64::try_from(forward_time.as_micros()).unwrap_or(u64::MAX));
        tracing::debug!(
            step = f.number,
            seqs = f.out.scheduled.len(),
            tokens = f.out.num_batched_tokens,
            preempted = f.out.preempted.len(),
            fed = f.fed,
            forward_ms = forward_time.as_secs_f64() * 1e3,
            "Step done."
        );
    }

    /// A step failed (at submission or collection): its requests fail with the error; a sticky
    /// device fault stops the engine.
    fn step_failed(&mut self, out: &SchedulerOutput, e: EngineError) {
        if e.is_sticky_device_fault() {
            tracing::error!(seqs = out.scheduled.len(), error = %e, "Sticky device fault: every later step would fail; stopping the engine.");
            self.device_lost = Some(e.to_string());
            for s in &out.scheduled {
                self.fail(s.id, EngineError::DeviceLost(e.to_string()));
            }
        } else {
            tracing::error!(seqs = out.scheduled.len(), error = %e, "Forward step failed; its requests fail.");
            for s in &out.scheduled {
                self.fail(s.id, e.clone());
            }
        }
    }

    /// The step's batch and its fed tokens; each sequence due for a token gets its sampler's
    /// descriptor (drawing its uniform for this step). A token the step in flight (`prev`) is
    /// sampling for the sequence is a [`Feed`] of that step's row, with a placeholder id.
    fn build_batch(
        &mut self,
        out: &SchedulerOutput,
        prev: Option<&InFlight>,
    ) -> (ForwardBatch, Vec<Feed>) {
        let mut batch = ForwardBatch::default();
        let mut feeds = Vec::new();
        for s in &out.scheduled {
            let seq = self
                .scheduler
                .get_mut(s.id)
                .expect("scheduled sequences exist");
            let start = batch.token_ids.len();
            let known = seq.token_ids.len();
            let end = s.cached_len + s.num_new_tokens;
            batch
                .token_ids
                .extend_from_slice(&seq.token_ids[s.cached_len.min(known)..end.min(known)]);
            for pos in known.max(s.cached_len)..end {
                // Only the one token the step in flight samples can be pending here.
                let row = prev
                    .filter(|_| pos == known)
                    .and_then(|p| p.sample_rows.get(&s.id))
                    .copied()
                    .expect("a pending token comes from the step in flight");
                feeds.push(Feed {
                    token: start + (pos - s.cached_len),
                    row,
                });
                batch.token_ids.push(0);
            }
            batch.seqs.push(SeqSlice {
                start,
                len: s.num_new_tokens,
                cached_len: s.cached_len,
                block_table: seq.blocks.table.clone(),
                logits: if s.sample {
                    LogitsFor::Sample(seq.next_sampling_row())
                } else {
                    LogitsFor::None
                },
                state_slot: seq.state_slot,
            });
        }
        (batch, feeds)
    }

    fn count_prompt_tokens(&mut self, out: &SchedulerOutput) {
        for s in &out.scheduled {
            if let Some(seq) = self.scheduler.get(s.id) {
                let end = (s.cached_len + s.num_new_tokens).min(seq.prompt_len);
                self.stats.prompt_tokens += end.saturating_sub(s.cached_len) as u64;
            }
        }
    }

    /// Append each sequence's sampled token (in the order of the step's sampling rows); answer
    /// the finished ones. A row that failed to sample, or a panic while appending, fails only
    /// its request.
    fn append_all(&mut self, out: &SchedulerOutput, samples: Vec<Result<Sampled, SampleError>>) {
        let now = Instant::now();
        for (s, sampled) in out.scheduled.iter().filter(|s| s.sample).zip(samples) {
            let Some(seq) = self.scheduler.get_mut(s.id) else {
                continue;
            };
            let tokenizer = &self.tokenizer;
            let block_size = self.block_size;
            let result = match sampled {
                Ok(sampled) => catch_unwind(AssertUnwindSafe(|| {
                    seq.append_sampled(&sampled, tokenizer, block_size, now)
                }))
                .unwrap_or_else(|panic| {
                    Err(EngineError::Internal(format!(
                        "panic while appending a token: {}",
                        panic_message(&*panic)
                    )))
                }),
                Err(e) => Err(e.into()),
            };
            match result {
                Ok(None) => self.stats.generated_tokens += 1,
                Ok(Some(reason)) => {
                    self.stats.generated_tokens += 1;
                    self.finish(s.id, reason, now);
                }
                Err(e) => self.fail(s.id, e),
            }
        }
    }
}

/// The state slot the batch gives sequence `id` of `out`.
fn batch_slot(batch: &ForwardBatch, out: &SchedulerOutput, id: RequestId) -> Option<u32> {
    let i = out.scheduled.iter().position(|s| s.id == id)?;
    batch.seqs.get(i)?.state_slot
}
