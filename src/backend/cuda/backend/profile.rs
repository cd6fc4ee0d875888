//! Per-op timing of the steps a CUDA backend runs, with CUDA events: on with `KILN_PROFILE_OPS=1`
//! (off by default: then every hook is one branch), printed as tables when the backend is dropped
//! (at engine shutdown, e.g. the end of `kiln bench`).
//!
//! Steps come in two kinds, so one run gives both figures:
//! - **gated** steps (one in [`GATE_EVERY`]): the backend first queues a kernel that holds the GPU
//!   for [`GATE_NS`], so the host has queued the whole step before the GPU starts it; the step's
//!   ops then run back to back and each op's event pair times its kernels alone (no launch gap
//!   inside). Their sum, the span from the step's first op to its last event, is the GPU's
//!   **busy** time per step.
//! - **open** steps (the others): a start and an end event on the stream and nothing else, never
//!   waited for, so the engine's overlap (step N+1 queued while the GPU runs step N) is kept.
//!   For two consecutive open steps of the same kind, the GPU timeline gives the step **period**
//!   (start to next start) and the GPU's **idle** time between them (end to next start: the
//!   stream had nothing queued). The pairs are read once their events have completed.
//!
//! GPU idle share of a decode step = idle / period over those pairs. Also reported: the host's
//! time between one step's end and the next one's start (the engine's own work, which overlap
//! hides when it is shorter than a step). Steps are keyed by their number of decode rows (every
//! sequence one token; a graph step's padded bucket) and by whether they replayed a graph (whose
//! ops are not timed one by one: only its span); other steps (prefill, mixed) are summed as one
//! line. Steps that record a graph are left out.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream, LaunchConfig, PushKernelArg};

/// How long a gated step holds the GPU before its first op (ns): longer than the host takes to
/// queue a whole eager step (~300 launches and ~600 event records).
pub const GATE_NS: u64 = 40_000_000;

/// One step in this many is gated; the others are open (see the module header).
pub const GATE_EVERY: u64 = 8;

/// Step key: decode rows (0 = not decode-only) and whether a graph was replayed.
type Key = (usize, bool);

#[derive(Debug, Default)]
struct Agg {
    gated_steps: u64,
    busy_ms: f64,
    ops: BTreeMap<&'static str, (u64, f64)>,
    /// Consecutive open steps of this key and their GPU period and idle time, summed.
    pairs: u64,
    period_ms: f64,
    idle_ms: f64,
    gaps: u64,
    gap_ms: f64,
}

#[derive(Debug, Default)]
struct State {
    free: Vec<CudaEvent>,
    ops: Vec<(&'static str, CudaEvent, CudaEvent)>,
    start: Option<CudaEvent>,
    started: Option<Instant>,
    last_end: Option<Instant>,
    gated: bool,
    capturing: bool,
    /// A graph was recorded in this step: its times are not a decode step's (not counted).
    recorded: bool,
    decode_rows: usize,
    steps: u64,
    agg: BTreeMap<Key, Agg>,
    /// Open steps not yet paired with the next one: key, counted (not a recording step), start
    /// and end events.
    pending: VecDeque<(Key, bool, CudaEvent, CudaEvent)>,
}

impl State {
    /// Pair the two oldest pending open steps (the oldest is consumed); both have completed.
    fn pair_front(&mut self) {
        let Some((ka, va, sa, ea)) = self.pending.pop_front() else {
            return;
        };
        if let Some((kb, vb, sb, _)) = self.pending.front() {
            if va && *vb && ka == *kb {
                let period = sa.elapsed_ms(sb).unwrap_or(0.0) as f64;
                let idle = ea.elapsed_ms(sb).unwrap_or(0.0) as f64;
                let agg = self.agg.entry(ka).or_default();
                agg.pairs += 1;
                agg.period_ms += period;
                agg.idle_ms += idle.max(0.0);
            }
        }
        self.free.push(sa);
        self.free.push(ea);
    }

    /// Pair every pending step whose successor has started on the GPU (`all`: wait for them
    /// all first, and drop the last, which has no successor).
    fn drain(&mut self, all: bool) {
        if all {
            if let Some((_, _, _, end)) = self.pending.back() {
                let _ = end.synchronize();
            }
        }
        while self.pending.len() >= 2 && (all || self.pending[1].2.is_complete()) {
            self.pair_front();
        }
        if all {
            if let Some((_, _, s, e)) = self.pending.pop_front() {
                self.free.push(s);
                self.free.push(e);
            }
        }
    }
}

/// The profiler of one backend (see the module header).
#[derive(Debug)]
pub(crate) struct Profiler {
    on: bool,
    replayed: AtomicBool,
    st: Mutex<State>,
}

/// Records the end event of one op when dropped.
pub(crate) struct OpTimer<'a> {
    p: &'a Profiler,
    stream: &'a Arc<CudaStream>,
    name: &'static str,
    start: Option<CudaEvent>,
}

impl Drop for OpTimer<'_> {
    fn drop(&mut self) {
        let mut st = self.p.lock();
        if let (Some(start), Ok(end)) = (self.start.take(), take_event(&mut st, self.stream)) {
            if end.record(self.stream).is_ok() {
                st.ops.push((self.name, start, end));
            }
        }
    }
}

fn take_event(st: &mut State, stream: &Arc<CudaStream>) -> Result<CudaEvent, ()> {
    match st.free.pop() {
        Some(e) => Ok(e),
        None => stream
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|_| ()),
    }
}

impl Profiler {
    /// On when `KILN_PROFILE_OPS` is set to anything but `0` or empty.
    pub fn from_env() -> Arc<Profiler> {
        let on = std::env::var("KILN_PROFILE_OPS").is_ok_and(|v| !v.is_empty() && v != "0");
        Arc::new(Profiler {
            on,
            replayed: AtomicBool::new(false),
            st: Mutex::new(State::default()),
        })
    }

    pub fn on(&self) -> bool {
        self.on
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Time one op (when on, in a gated step, and not recording a graph).
    pub fn op<'a>(
        &'a self,
        stream: &'a Arc<CudaStream>,
        name: &'static str,
    ) -> Option<OpTimer<'a>> {
        if !self.on {
            return None;
        }
        let mut st = self.lock();
        if !st.gated || st.capturing || st.start.is_none() {
            return None;
        }
        let start = take_event(&mut st, stream).ok()?;
        start.record(stream).ok()?;
        Some(OpTimer {
            p: self,
            stream,
            name,
            start: Some(start),
        })
    }

    /// A step's metadata was written: `decode_rows` sequences of one token each (0: not decode).
    pub fn note_step(&self, decode_rows: usize) {
        if self.on {
            self.lock().decode_rows = decode_rows;
        }
    }

    /// A graph was replayed in this step.
    pub fn note_replay(&self) {
        if self.on {
            self.replayed.store(true, Ordering::Relaxed);
        }
    }

    /// Graph recording starts / ends (ops are not timed while recording).
    pub fn set_capturing(&self, on: bool) {
        if self.on {
            let mut st = self.lock();
            st.capturing = on;
            st.recorded = true;
        }
    }

    /// Start a step: one in [`GATE_EVERY`] is gated by `gate` (a kernel holding the GPU for
    /// [`GATE_NS`]), then the start event is recorded.
    pub fn begin_step(&self, stream: &Arc<CudaStream>, gate: &cudarc::driver::CudaFunction) {
        if !self.on {
            return;
        }
        let mut st = self.lock();
        st.steps += 1;
        st.gated = st.steps.is_multiple_of(GATE_EVERY);
        let gated = st.gated;
        st.drain(gated);
        st.decode_rows = 0;
        st.recorded = false;
        self.replayed.store(false, Ordering::Relaxed);
        let now = Instant::now();
        if let Some(end) = st.last_end.take() {
            // Host time between the previous step's end and this one's start: the engine.
            st.start = None;
            let gap = now.duration_since(end).as_secs_f64() * 1e3;
            st.agg.entry((usize::MAX, false)).or_default().gap_ms += gap;
            st.agg.entry((usize::MAX, false)).or_default().gaps += 1;
        }
        if st.gated {
            let ns = GATE_NS;
            let mut b = stream.launch_builder(gate);
            b.arg(&ns);
            // SAFETY: `gpu_sleep` reads only its by-value argument and writes nothing.
            let _ = unsafe { b.launch(LaunchConfig::for_num_elems(1)) };
        }
        st.start = take_event(&mut st, stream).ok();
        if let Some(e) = &st.start {
            let _ = e.record(stream);
        }
        st.started = Some(Instant::now());
    }

    /// End a step: record its end; a gated step is waited for and its times added to its key, an
    /// open one is queued for pairing with the next (see the module header).
    pub fn end_step(&self, stream: &Arc<CudaStream>) {
        if !self.on {
            return;
        }
        let mut st = self.lock();
        let Some(start) = st.start.take() else {
            return;
        };
        let Ok(end) = take_event(&mut st, stream) else {
            return;
        };
        let _ = end.record(stream);
        if !st.gated {
            let key = (st.decode_rows, self.replayed.load(Ordering::Relaxed));
            let counted = !st.recorded;
            st.ops.clear();
            st.pending.push_back((key, counted, start, end));
            st.last_end = Some(Instant::now());
            return;
        }
        let _ = end.synchronize();
        let key = (st.decode_rows, self.replayed.load(Ordering::Relaxed));
        let ops = std::mem::take(&mut st.ops);
        let mut timed = Vec::with_capacity(ops.len());
        for (name, a, b) in ops {
            timed.push((name, a.elapsed_ms(&b).unwrap_or(0.0) as f64));
            st.free.push(a);
            st.free.push(b);
        }
        let span = start.elapsed_ms(&end).unwrap_or(0.0) as f64;
        st.free.push(start);
        st.free.push(end);
        if st.recorded {
            // A graph recording step (eager run + capture + instantiation): not a decode step.
            st.last_end = Some(Instant::now());
            return;
        }
        let agg = st.agg.entry(key).or_default();
        agg.gated_steps += 1;
        agg.busy_ms += span;
        for (name, ms) in timed {
            let e = agg.ops.entry(name).or_default();
            e.0 += 1;
            e.1 += ms;
        }
        st.last_end = Some(Instant::now());
    }

    /// The tables (markdown), or `None` when off or nothing was timed.
    pub fn report(&self) -> Option<String> {
        if !self.on {
            return None;
        }
        let st = self.lock();
        let between = st.agg.get(&(usize::MAX, false));
        let gap = between.map_or(0.0, |a| a.gap_ms / a.gaps.max(1) as f64);
        let mut out = String::new();
        out.push_str(&format!(
            "\n## KILN_PROFILE_OPS: GPU time of the steps ({} steps; engine time between steps {:.1} µs on average)\n\n",
            st.steps,
            gap * 1e3
        ));
        out.push_str("| decode rows | graph | gated steps / open pairs | GPU busy µs/step (gated) | GPU step period µs (open) | GPU idle µs between steps | GPU idle share |\n|---:|:---|---:|---:|---:|---:|---:|\n");
        for (&(rows, graph), a) in &st.agg {
            if rows == usize::MAX || a.gated_steps == 0 || a.pairs == 0 {
                continue;
            }
            let busy = a.busy_ms / a.gated_steps as f64;
            let period = a.period_ms / a.pairs as f64;
            let idle = a.idle_ms / a.pairs as f64;
            out.push_str(&format!(
                "| {} | {} | {} / {} | {:.1} | {:.1} | {:.1} | {:.1}% |\n",
                if rows == 0 {
                    "mixed".to_string()
                } else {
                    rows.to_string()
                },
                if graph { "replay" } else { "eager" },
                a.gated_steps,
                a.pairs,
                busy * 1e3,
                period * 1e3,
                idle * 1e3,
                100.0 * idle / period.max(1e-12)
            ));
        }
        for (&(rows, graph), a) in &st.agg {
            if rows == 0 || rows == usize::MAX || graph || a.ops.is_empty() {
                continue;
            }
            let steps = a.gated_steps.max(1) as f64;
            let busy = a.busy_ms / steps;
            out.push_str(&format!(
                "\n### Eager decode step of {rows} rows, per op (gated steps: kernels back to back)\n\n| op | calls/step | µs/step | share of busy |\n|:---|---:|---:|---:|\n"
            ));
            let mut ops: Vec<_> = a.ops.iter().collect();
            ops.sort_by(|x, y| y.1 .1.total_cmp(&x.1 .1));
            let mut sum = 0.0;
            for (name, &(calls, ms)) in ops {
                sum += ms / steps;
                out.push_str(&format!(
                    "| {name} | {:.0} | {:.1} | {:.1}% |\n",
                    calls as f64 / steps,
                    ms / steps * 1e3,
                    100.0 * ms / steps / busy.max(1e-9)
                ));
            }
            out.push_str(&format!(
                "| (sum of ops / step span) | | {:.1} / {:.1} | |\n",
                sum * 1e3,
                busy * 1e3
            ));
        }
        Some(out)
    }
}
