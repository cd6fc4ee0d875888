//! `kiln run [--once]`: the daemon.
//!
//! Order of start-up (each step fails fast, before the slow model load where possible):
//! 1. load `config.toml` and install logging (stderr + `logs/kiln.log.<date>`);
//! 2. open the ledger and take its exclusive lock (a second daemon on the same ledger stops here);
//! 3. fetch the embedded default model when it is configured, missing and `model.fetch_default`;
//! 4. load the model and start the engine (`EXTEND_TIMEOUT_USEC` keeps systemd waiting);
//! 5. hand over to [`kiln::daemon::run`], which recovers interrupted tasks, starts the watcher and
//!    sends `READY=1`.
//!
//! SIGTERM or ctrl-c stops intake and lets in-flight tasks finish within
//! `daemon.shutdown_grace_secs` (a second signal is only logged: the grace period is bounded).
//! Exit status (documented in the README):
//! - 0: the daemon ran; with `--once`, every task succeeded (or was cancelled) and every output is
//!   written;
//! - 1: the daemon itself failed (configuration, ledger, model, engine, a sticky device fault);
//! - 2 (`--once`): some task ended `failed` or `dead` (its error file is written);
//! - 3 (`--once`): some output could not be written (outputs folder not writable, disk full), or a
//!   task is still unfinished; takes precedence over 2.
//!
//! With `--once`, one summary line per input file of the run goes to stderr.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use kiln::config::Config;
use kiln::daemon::systemd::Notifier;
use kiln::daemon::{RunOptions, RunSummary};
use kiln::ledger::{FileReport, Ledger};
use tokio_util::sync::CancellationToken;

/// How much start-up time to ask systemd for while the model loads.
const MODEL_LOAD_EXTENSION: Duration = Duration::from_secs(600);

/// Arguments of `kiln run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Take what is in inputs/, finish every task (waiting for retries) and exit.
    #[arg(long)]
    pub once: bool,
    /// Never draw the progress bar (it is only drawn when stderr is a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
}

/// `--once`: some task ended `failed` or `dead`.
pub const EXIT_TASKS_FAILED: i32 = 2;

/// `--once`: some output is not written, or some task did not finish.
pub const EXIT_OUTPUTS_MISSING: i32 = 3;

/// Run `kiln run`; returns the exit status (see the module docs).
pub fn run(config_path: Option<&Path>, args: RunArgs) -> anyhow::Result<i32> {
    let config = Config::load(config_path).context("loading the configuration")?;
    let _log_guard = kiln::logging::init(&config.logging, Some(&config.daemon.logs))
        .context("setting up logging")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kiln-daemon")
        .build()
        .context("starting the tokio runtime")?;
    let once = args.once;
    let (summary, files) = runtime.block_on(run_daemon(config, args))?;
    print_summary(&summary);
    if !once {
        return Ok(0);
    }
    Ok(print_file_reports(&files))
}

/// One line per input file; returns the `--once` exit status.
fn print_file_reports(files: &[FileReport]) -> i32 {
    let mut code = 0;
    for f in files {
        let mut line = format!(
            "  {}: {} task(s), {} succeeded, {} failed",
            kiln::logging::escape_line(&f.path),
            f.total,
            f.succeeded,
            f.failed
        );
        if f.cancelled > 0 {
            line.push_str(&format!(", {} cancelled", f.cancelled));
        }
        if f.open > 0 {
            line.push_str(&format!(", {} unfinished", f.open));
        }
        if f.unwritten > 0 {
            line.push_str(&format!(
                "; OUTPUTS NOT WRITTEN for {} task(s) (see the log: is daemon.outputs writable?)",
                f.unwritten
            ));
        } else if let Some(out) = &f.output {
            line.push_str(&format!(" -> {}", kiln::logging::escape_line(out)));
        }
        eprintln!("{line}");
        if f.unwritten > 0 || f.open > 0 {
            code = EXIT_OUTPUTS_MISSING;
        } else if f.failed > 0 && code == 0 {
            code = EXIT_TASKS_FAILED;
        }
    }
    match code {
        EXIT_OUTPUTS_MISSING => eprintln!(
            "kiln run --once: exit {code}: some outputs are not written or some tasks did not finish."
        ),
        EXIT_TASKS_FAILED => eprintln!(
            "kiln run --once: exit {code}: some tasks failed or are dead (their error files are written)."
        ),
        _ => {}
    }
    code
}

async fn run_daemon(
    config: Config,
    args: RunArgs,
) -> anyhow::Result<(RunSummary, Vec<FileReport>)> {
    let started = kiln::ledger::UnixMillis::now();
    let ledger_path = config.daemon.ledger.clone();
    let ledger = Ledger::open(&ledger_path)
        .await
        .with_context(|| format!("opening the ledger {}", ledger_path.display()))?;
    let _lock = ledger
        .lock_exclusive()
        .await
        .context("locking the ledger")?;
    let notifier = Notifier::from_env();

    ensure_model(&config)?;
    notifier.extend_timeout(MODEL_LOAD_EXTENSION);
    notifier.status(&format!("loading {}", config.model.path.display()));
    let model_path = config.model.path.clone();
    let engine_cfg = config.engine.clone();
    let t0 = Instant::now();
    tracing::info!(model = %model_path.display(), device = %engine_cfg.device, "Loading the model.");
    let engine =
        tokio::task::spawn_blocking(move || kiln::engine::spawn_from_path(&model_path, engine_cfg))
            .await
            .context("the model loader panicked")?
            .with_context(|| format!("loading the model {}", config.model.path.display()))?;
    tracing::info!(
        model = %engine.info().model, device = %engine.info().device, max_model_len = engine.info().max_model_len,
        secs = t0.elapsed().as_secs_f64(), "Model loaded."
    );

    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone(), notifier.clone())?;
    let opts = RunOptions {
        once: args.once,
        progress: !args.no_progress && std::io::stderr().is_terminal(),
        notifier,
        model_name: Some(config.model.display_name()),
    };
    let result = kiln::daemon::run(&config, ledger.clone(), engine.clone(), shutdown, opts).await;
    engine.shutdown();
    let files = match &result {
        Ok(_) if args.once => ledger
            .file_reports(started)
            .await
            .context("reading the per-file summary")?,
        _ => Vec::new(),
    };
    ledger.close().await;
    Ok((result.context("the daemon failed")?, files))
}

/// Make sure the configured model exists, fetching the embedded default when allowed.
fn ensure_model(config: &Config) -> anyhow::Result<()> {
    let path = &config.model.path;
    if path.exists() {
        return Ok(());
    }
    anyhow::ensure!(
        config.model.is_embedded_default() && config.model.fetch_default,
        "the model {} does not exist (set `model.path`, or run `kiln model fetch-default` for the embedded default)",
        path.display()
    );
    let dir = path.parent().unwrap_or(Path::new("."));
    tracing::info!(dir = %dir.display(), "The default model is missing; fetching it.");
    kiln::model::fetch::fetch_default(dir).context("fetching the default model")?;
    Ok(())
}

/// SIGTERM / SIGINT → cancel `shutdown` (once; later signals are logged).
fn spawn_signal_handler(shutdown: CancellationToken, notifier: Notifier) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                s = term.recv() => { if s.is_none() { break; } "SIGTERM" }
                s = int.recv() => { if s.is_none() { break; } "SIGINT" }
            };
            if shutdown.is_cancelled() {
                tracing::warn!(
                    signal = name,
                    "Already stopping; in-flight tasks have until the grace period ends."
                );
            } else {
                tracing::info!(signal = name, "Stop requested.");
                notifier.stopping("stopping: finishing in-flight tasks");
                shutdown.cancel();
            }
        }
    });
    Ok(())
}

fn print_summary(s: &RunSummary) {
    let d = &s.dispatch;
    let mut line = format!(
        "kiln run: {} input file(s), {} task(s) recorded; {} succeeded, {} failed, {} dead",
        s.files,
        s.tasks,
        d.succeeded,
        d.failed + s.rejected,
        d.dead
    );
    if d.retried > 0 {
        line.push_str(&format!(", {} attempt(s) retried", d.retried));
    }
    if d.interrupted > 0 {
        line.push_str(&format!(", {} interrupted (back to queued)", d.interrupted));
    }
    if s.unfinished > 0 {
        line.push_str(&format!("; {} task(s) still queued", s.unfinished));
    }
    eprintln!("{line}.");
    if s.failed_total > 0 {
        eprintln!("{} task(s) in the ledger are failed or dead: `kiln list --state failed`, `kiln list --state dead`.", s.failed_total);
    }
}
