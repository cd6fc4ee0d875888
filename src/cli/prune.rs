//! `kiln prune --older-than 30d`: delete ledger rows and task logs of input files whose every task
//! finished (and was published) before then. Inputs and outputs are untouched; the input file's
//! own record stays, so its content is not run again. Safe beside a running daemon.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use kiln::ledger::UnixMillis;

/// Arguments of `kiln prune`.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Age of the work to forget: a number with a unit, `30d`, `12h`, `90m`, `3600s`.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    pub older_than: Duration,
}

/// `30d` → 30 days, etc.
pub fn parse_age(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{s}` has no unit: write e.g. 30d, 12h, 90m or 3600s"))?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}` does not start with a number"))?;
    let secs = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        other => return Err(format!("unknown unit `{other}` in `{s}`: use d, h, m or s")),
    };
    Ok(Duration::from_secs(n.saturating_mul(secs)))
}

/// Run `kiln prune`.
pub fn run(config_path: Option<&Path>, args: PruneArgs) -> anyhow::Result<()> {
    let config = super::load_config(config_path)?;
    let cutoff = UnixMillis(UnixMillis::now().0 - args.older_than.as_millis() as i64);
    let ids = super::runtime()?.block_on(async {
        let ledger = super::open_existing_ledger(&config).await?;
        ledger.prune(cutoff).await.context("pruning the ledger")
    })?;
    let mut logs = 0usize;
    for id in &ids {
        match std::fs::remove_file(config.daemon.task_log(id)) {
            Ok(()) => logs += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(task_id = %id, error = %e, "Cannot remove a task log."),
        }
    }
    super::print(&format!(
        "pruned {} task(s) finished before {} and {logs} task log(s); inputs and outputs untouched\n",
        ids.len(),
        cutoff.to_rfc3339()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_have_units() {
        assert_eq!(parse_age("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_age("90m"), Ok(Duration::from_secs(90 * 60)));
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        assert!(parse_age("30").is_err());
        assert!(parse_age("30w").is_err());
        assert!(parse_age("d").is_err());
    }
}
