//! `kiln retry ID… | --failed [--class C]`: put failed, dead (or cancelled, by id) tasks back to
//! `queued`, with a fresh attempt budget. Works beside a running daemon, which picks them up at its
//! next claim. Exits non-zero when a named task could not be re-queued.

use std::fmt::Write as _;
use std::path::Path;

use kiln::error::ErrorClass;
use kiln::ledger::{RetryResult, TaskId};

/// Arguments of `kiln retry`.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["ids", "failed"]))]
pub struct RetryArgs {
    /// Task ids (or unique prefixes) to re-queue.
    #[arg(conflicts_with = "failed")]
    pub ids: Vec<String>,
    /// Re-queue every failed and dead task (tasks rejected at intake have no request and are skipped).
    #[arg(long)]
    pub failed: bool,
    /// With --failed: only tasks whose last failure has this class.
    #[arg(long, requires = "failed", value_parser = clap::builder::ValueParser::new(|s: &str| s.parse::<ErrorClass>()))]
    pub class: Option<ErrorClass>,
}

/// Run `kiln retry`.
pub fn run(config_path: Option<&Path>, args: RetryArgs) -> anyhow::Result<()> {
    let config = super::load_config(config_path)?;
    let mut out = String::new();
    let mut refused = 0usize;
    super::runtime()?.block_on(async {
        let ledger = super::open_existing_ledger(&config).await?;
        if args.failed {
            let ids = ledger.retry_failed(args.class).await?;
            let which = args.class.map_or_else(String::new, |c| format!(" of class {c}"));
            let _ = writeln!(out, "requeued {} failed or dead task(s){which}", ids.len());
            for id in ids {
                let _ = writeln!(out, "  {id}");
            }
            return anyhow::Ok(());
        }
        let mut ids: Vec<TaskId> = Vec::new();
        for text in &args.ids {
            match ledger.resolve_task_id(text).await {
                Ok(id) => ids.push(id),
                Err(e) => {
                    refused += 1;
                    let _ = writeln!(out, "not requeued: {text}: {e}");
                }
            }
        }
        for (id, result) in ledger.retry(&ids).await? {
            match result {
                RetryResult::Requeued => {
                    let _ = writeln!(out, "requeued {id}");
                }
                RetryResult::NotFound => {
                    refused += 1;
                    let _ = writeln!(out, "not requeued: {id}: no such task");
                }
                RetryResult::WrongState { state } => {
                    refused += 1;
                    let _ = writeln!(
                        out,
                        "not requeued: {id}: it is {state} (only failed, dead or cancelled tasks can be retried)"
                    );
                }
                RetryResult::NoRequest => {
                    refused += 1;
                    let _ = writeln!(
                        out,
                        "not requeued: {id}: it was rejected at intake and has no request to run; fix the input file"
                    );
                }
            }
        }
        anyhow::Ok(())
    })?;
    super::print(&out)?;
    anyhow::ensure!(refused == 0, "{refused} task(s) could not be requeued");
    Ok(())
}
