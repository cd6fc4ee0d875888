//! Prometheus metrics of `kiln run`, served at `http://<metrics.listen>/metrics` (off by default).
//!
//! Figures (OpenMetrics text, `prometheus-client`):
//! - `kiln_tasks{state}` (gauge): tasks in the ledger by state (the queue depth), read from the
//!   ledger at each scrape;
//! - `kiln_attempts_total{result}` (counter): attempts this process finished, by the state the task
//!   went to (`succeeded`, `retry_wait`, `failed`, `dead`, `cancelled`, `queued` = interrupted);
//! - `kiln_tasks_finished_total{state}` (counter): tasks this process moved to a terminal state;
//! - `kiln_prompt_tokens_total`, `kiln_generated_tokens_total` (counters): tokens the engine
//!   computed / generated since this process started (every attempt, failed ones included);
//! - `kiln_time_to_first_token_seconds`, `kiln_time_per_output_token_seconds` (histograms): of
//!   succeeded attempts; per output token = (total − TTFT) / (completion tokens − 1);
//! - `kiln_kv_cache_blocks_used`, `kiln_kv_cache_blocks_total`, `kiln_kv_cache_usage_ratio`
//!   (gauges), `kiln_engine_steps_total`, `kiln_engine_step_seconds_total` (counters: their rates'
//!   ratio is the mean step time), read from the engine's stats at each scrape.
//!
//! The listener is a plain tokio `TcpListener`: one `GET /metrics` per connection, answered and
//! closed (no keep-alive, no web framework). Requests are bounded (8 KiB head, 5 s to send it).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::daemon::attempt::AttemptResult;
use crate::engine::{EngineHandle, EngineStats};
use crate::ledger::{Ledger, TaskState};

/// Largest request head read before answering 400.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// The engine counters last folded into the Prometheus counters (they only grow by deltas).
#[derive(Debug, Default)]
struct EngineSeen {
    prompt_tokens: u64,
    generated_tokens: u64,
    steps: u64,
    step_micros: u64,
}

/// The metrics of one daemon process. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    tasks: Family<StateLabel, Gauge>,
    attempts: Family<ResultLabel, Counter>,
    finished: Family<StateLabel, Counter>,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    ttft: Histogram,
    per_token: Histogram,
    kv_used: Gauge,
    kv_total: Gauge,
    kv_ratio: Gauge<f64, std::sync::atomic::AtomicU64>,
    steps: Counter,
    step_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    seen: Mutex<EngineSeen>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Fresh metrics, registered under `kiln_`.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kiln");
        let tasks = Family::<StateLabel, Gauge>::default();
        let attempts = Family::<ResultLabel, Counter>::default();
        let finished = Family::<StateLabel, Counter>::default();
        let prompt_tokens = Counter::default();
        let generated_tokens = Counter::default();
        // 1 ms .. ~65 s, and 0.5 ms .. ~4 s.
        let ttft = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        let per_token = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        let kv_used = Gauge::default();
        let kv_total = Gauge::default();
        let kv_ratio = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        let steps = Counter::default();
        let step_seconds = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "tasks",
            "Tasks in the ledger by state (queue depth)",
            tasks.clone(),
        );
        registry.register(
            "attempts",
            "Attempts finished by this process, by the state the task went to",
            attempts.clone(),
        );
        registry.register(
            "tasks_finished",
            "Tasks this process moved to a terminal state",
            finished.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens the engine computed (prefix-cache hits excluded)",
            prompt_tokens.clone(),
        );
        registry.register(
            "generated_tokens",
            "Tokens the engine generated",
            generated_tokens.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time to first token of succeeded attempts",
            ttft.clone(),
        );
        registry.register(
            "time_per_output_token_seconds",
            "Decode time per output token after the first, of succeeded attempts",
            per_token.clone(),
        );
        registry.register(
            "kv_cache_blocks_used",
            "KV-cache blocks in use",
            kv_used.clone(),
        );
        registry.register(
            "kv_cache_blocks_total",
            "KV-cache blocks in all",
            kv_total.clone(),
        );
        registry.register(
            "kv_cache_usage_ratio",
            "Share of KV-cache blocks in use (0..1)",
            kv_ratio.clone(),
        );
        registry.register("engine_steps", "Engine forward steps", steps.clone());
        registry.register(
            "engine_step_seconds",
            "Time spent in engine forward steps",
            step_seconds.clone(),
        );
        Metrics {
            registry,
            tasks,
            attempts,
            finished,
            prompt_tokens,
            generated_tokens,
            ttft,
            per_token,
            kv_used,
            kv_total,
            kv_ratio,
            steps,
            step_seconds,
            seen: Mutex::new(EngineSeen::default()),
        }
    }

    /// An attempt finished and its task went to `state`: count it; time a success.
    pub fn attempt_finished(&self, result: &AttemptResult, state: TaskState) {
        self.attempts
            .get_or_create(&ResultLabel {
                result: state.as_str().to_owned(),
            })
            .inc();
        if state.is_terminal() {
            self.task_finished(state);
        }
        if let AttemptResult::Succeeded { result, .. } = result {
            let c = &result.completion;
            let ttft = c.timings.ttft.as_secs_f64();
            self.ttft.observe(ttft);
            let n = c.usage.completion_tokens;
            if n > 1 {
                let decode = (c.timings.total.as_secs_f64() - ttft).max(0.0);
                self.per_token.observe(decode / f64::from(n - 1));
            }
        }
    }

    /// A task went to a terminal state without an attempt finishing (`kiln cancel`).
    pub fn task_finished(&self, state: TaskState) {
        self.finished
            .get_or_create(&StateLabel {
                state: state.as_str().to_owned(),
            })
            .inc();
    }

    /// Fold the engine's figures in (counters by their growth since the last look).
    pub fn engine(&self, s: &EngineStats) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let grow = |now: u64, before: &mut u64| {
            let d = now.saturating_sub(*before);
            *before = now.max(*before);
            d
        };
        self.prompt_tokens
            .inc_by(grow(s.prompt_tokens, &mut seen.prompt_tokens));
        self.generated_tokens
            .inc_by(grow(s.generated_tokens, &mut seen.generated_tokens));
        self.steps.inc_by(grow(s.steps, &mut seen.steps));
        self.step_seconds
            .inc_by(grow(s.step_micros, &mut seen.step_micros) as f64 / 1e6);
        self.kv_used
            .set(i64::try_from(s.kv_blocks_used).unwrap_or(i64::MAX));
        self.kv_total
            .set(i64::try_from(s.kv_blocks_total).unwrap_or(i64::MAX));
        let ratio = if s.kv_blocks_total == 0 {
            0.0
        } else {
            s.kv_blocks_used as f64 / s.kv_blocks_total as f64
        };
        self.kv_ratio.set(ratio);
    }

    /// Set the queue-depth gauges from the ledger's counts.
    pub fn ledger_counts(&self, c: &crate::ledger::Counts) {
        for state in TaskState::ALL {
            self.tasks
                .get_or_create(&StateLabel {
                    state: state.as_str().to_owned(),
                })
                .set(i64::try_from(c.get(state)).unwrap_or(i64::MAX));
        }
    }

    /// The OpenMetrics text of every figure.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr}: {source} (is another process using the port? `metrics.listen`)")]
pub struct MetricsError {
    /// The configured address.
    pub addr: SocketAddr,
    /// The bind error (not retried: the daemon does not start).
    pub source: std::io::Error,
}

/// Bind `addr` and serve `/metrics` until `stop` fires; returns the bound address (port 0 picks
/// a free one). Each scrape refreshes the ledger and engine figures first.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ledger: Ledger,
    engine: EngineHandle,
    stop: CancellationToken,
) -> Result<SocketAddr, MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| MetricsError { addr, source })?;
    tracing::info!(address = %bound, "Serving Prometheus metrics at /metrics.");
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                _ = stop.cancelled() => break,
                c = listener.accept() => c,
            };
            match conn {
                Ok((stream, peer)) => {
                    let (m, l, e) = (metrics.clone(), ledger.clone(), engine.clone());
                    tokio::spawn(async move {
                        if let Err(err) = answer(stream, &m, &l, &e).await {
                            tracing::debug!(peer = %peer, error = %err, "A metrics request failed.");
                        }
                    });
                }
                Err(err) => {
                    tracing::warn!(error = %err, "Cannot accept a metrics connection.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        tracing::debug!("Metrics endpoint stopped.");
    });
    Ok(bound)
}

/// Read one request head and answer it.
async fn answer(
    mut stream: TcpStream,
    metrics: &Metrics,
    ledger: &Ledger,
    engine: &EngineHandle,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let complete = tokio::time::timeout(READ_TIMEOUT, async {
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return Ok(true);
            }
            if head.len() > MAX_HEAD {
                return Ok(false);
            }
        }
    })
    .await
    .unwrap_or(Ok(false))?;
    let line = String::from_utf8_lossy(&head);
    let mut words = line.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = if !complete {
        ("400 Bad Request", "text/plain", "bad request\n".to_owned())
    } else if path != "/metrics" {
        (
            "404 Not Found",
            "text/plain",
            "only /metrics is served\n".to_owned(),
        )
    } else if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_owned(),
        )
    } else {
        match ledger.counts().await {
            Ok(c) => metrics.ledger_counts(&c),
            Err(e) => tracing::warn!(error = %e, "Metrics: cannot read the ledger's counts."),
        }
        if let Some(s) = engine.stats().await {
            metrics.engine(&s);
        }
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        )
    };
    let body = if method == "HEAD" {
        String::new()
    } else {
        body
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::writer::StoredResult;
    use crate::engine::request::{Completion, FinishReason, Timings, Usage};
    use crate::ledger::AttemptStats;

    fn success(ttft_ms: u64, total_ms: u64, tokens: u32) -> AttemptResult {
        AttemptResult::Succeeded {
            result: StoredResult {
                model: "m".into(),
                created: 0,
                completion: Completion {
                    text: "x".into(),
                    token_ids: vec![],
                    finish_reason: FinishReason::Length,
                    usage: Usage {
                        prompt_tokens: 3,
                        completion_tokens: tokens,
                        cached_prompt_tokens: 0,
                    },
                    timings: Timings {
                        queue: Duration::ZERO,
                        ttft: Duration::from_millis(ttft_ms),
                        total: Duration::from_millis(total_ms),
                        decode_tokens_per_s: 0.0,
                    },
                    logprobs: None,
                },
            },
            stats: AttemptStats::default(),
        }
    }

    #[test]
    fn counters_histograms_and_engine_deltas_encode() {
        let m = Metrics::new();
        m.attempt_finished(&success(20, 120, 11), TaskState::Succeeded);
        m.attempt_finished(&AttemptResult::Interrupted("x".into()), TaskState::Queued);
        m.engine(&EngineStats {
            prompt_tokens: 30,
            generated_tokens: 11,
            steps: 12,
            step_micros: 1_500_000,
            kv_blocks_used: 4,
            kv_blocks_total: 16,
            ..Default::default()
        });
        // The engine's counters are cumulative: a second look adds only the growth.
        m.engine(&EngineStats {
            prompt_tokens: 30,
            generated_tokens: 15,
            steps: 16,
            step_micros: 2_000_000,
            kv_blocks_used: 0,
            kv_blocks_total: 16,
            ..Default::default()
        });
        let text = m.encode();
        for want in [
            "kiln_attempts_total{result=\"succeeded\"} 1",
            "kiln_attempts_total{result=\"queued\"} 1",
            "kiln_tasks_finished_total{state=\"succeeded\"} 1",
            "kiln_generated_tokens_total 15",
            "kiln_prompt_tokens_total 30",
            "kiln_engine_steps_total 16",
            "kiln_engine_step_seconds_total 2.0",
            "kiln_kv_cache_blocks_total 16",
            "kiln_kv_cache_blocks_used 0",
            "kiln_time_to_first_token_seconds_count 1",
            "kiln_time_to_first_token_seconds_sum 0.02",
        ] {
            assert!(text.contains(want), "missing `{want}` in:\n{text}");
        }
        // (120 − 20) ms over the 10 tokens after the first: 10 ms each.
        let per_token: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("kiln_time_per_output_token_seconds_sum "))
            .and_then(|v| v.trim().parse().ok())
            .expect("per-token sum");
        assert!((per_token - 0.01).abs() < 1e-12, "{per_token}");
        assert!(!text.contains("tasks_finished_total{state=\"queued\"}"));
    }
}
