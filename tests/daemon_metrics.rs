//! The Prometheus endpoint of `kiln run` (issue 11, item 9): off by default, served at
//! `metrics.listen` when set, scraped while the daemon runs: queue depth by state, attempt and
//! task counters, the TTFT / per-token histograms, KV-cache and engine-step figures.
//!
//! Run: `cargo test --test daemon_metrics`.

mod daemon_support;

use std::time::Duration;

use daemon_support::*;
use kiln::daemon::{self, RunOptions};
use kiln::ledger::TaskState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

async fn get(addr: &str, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: kiln\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraping_metrics_while_the_daemon_runs() {
    let mut env = Env::new();
    // A free port: bind one, note it, let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    env.config.metrics.listen = addr.clone();
    env.config.validate().expect("a valid listen address");
    for i in 0..3 {
        env.drop_input(&format!("q{i}.txt"), format!("Question {i}."));
    }
    env.drop_input("bad.json", r#"{"messages": 7}"#);

    let ledger = env.ledger().await;
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (config, ledger, stop) = (env.config.clone(), ledger.clone(), stop.clone());
        async move { daemon::run(&config, ledger, echo_engine(), stop, RunOptions::default()).await }
    });
    let t0 = std::time::Instant::now();
    loop {
        let c = ledger.counts().await.unwrap();
        if c.get(TaskState::Succeeded) == 3 && c.get(TaskState::Failed) == 1 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "tasks did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let r = get(&addr, "/metrics").await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(
        r.contains("Content-Type: application/openmetrics-text"),
        "{r}"
    );
    for want in [
        "kiln_tasks{state=\"succeeded\"} 3",
        "kiln_tasks{state=\"failed\"} 1",
        "kiln_tasks{state=\"queued\"} 0",
        "kiln_attempts_total{result=\"succeeded\"} 3",
        "kiln_tasks_finished_total{state=\"succeeded\"} 3",
        // The test engine answers with a 5 ms TTFT and 9 ms in all for 3 tokens.
        "kiln_time_to_first_token_seconds_count 3",
        "kiln_time_per_output_token_seconds_count 3",
        "# TYPE kiln_generated_tokens counter",
        "# TYPE kiln_kv_cache_blocks_used gauge",
        "# TYPE kiln_engine_step_seconds counter",
        "# EOF",
    ] {
        assert!(r.contains(want), "missing `{want}` in:\n{r}");
    }
    let ttft_sum = r
        .lines()
        .find_map(|l| l.strip_prefix("kiln_time_to_first_token_seconds_sum "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("ttft sum");
    assert!((ttft_sum - 0.015).abs() < 1e-9, "3 × 5 ms, got {ttft_sum}");
    let missing = get(&addr, "/other").await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");

    stop.cancel();
    run.await.unwrap().expect("daemon run");
    ledger.close().await;
    // The endpoint closed with the daemon.
    assert!(tokio::net::TcpStream::connect(&addr).await.is_err());
}

#[test]
fn metrics_are_off_by_default_and_a_bad_address_is_refused() {
    let mut c = kiln::config::Config::default();
    assert!(c.metrics.listen.is_empty());
    assert!(c.metrics.listen_addr().is_none());
    c.metrics.listen = "localhost-ish".into();
    let e = c.validate().expect_err("not an address");
    assert!(e.to_string().contains("metrics.listen"), "{e}");
}
