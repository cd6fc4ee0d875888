//! `kiln logs ID [--follow]`: print a task's own log, `<logs>/tasks/<task_id>.log` (written by the
//! daemon: intake, every attempt, engine stats, the error).
//!
//! `--follow` keeps printing what is appended (like `tail -f`, from the start of the file; a file that
//! shrinks is read again from its start) and waits for the file to appear. It ends on its own once the
//! ledger says the task is terminal (succeeded, failed, dead, cancelled) and nothing was appended for
//! [`SETTLE`]; otherwise it runs until interrupted.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use kiln::ledger::{Ledger, TaskId};

/// How often `--follow` looks for new lines.
const POLL: Duration = Duration::from_millis(200);

/// After the task is terminal, `--follow` stops once the file was quiet this long.
const SETTLE: Duration = Duration::from_secs(1);

/// Arguments of `kiln logs`.
#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// Task id (or a unique prefix of it).
    pub id: String,
    /// Keep printing new lines until the task is finished (or Ctrl-C).
    #[arg(long, short = 'f')]
    pub follow: bool,
}

/// Run `kiln logs`.
pub fn run(config_path: Option<&Path>, args: LogsArgs) -> anyhow::Result<()> {
    let config = super::load_config(config_path)?;
    super::runtime()?.block_on(async {
        let ledger = if config.daemon.ledger.exists() { Some(super::open_existing_ledger(&config).await?) } else { None };
        let id = match (&ledger, args.id.parse::<TaskId>()) {
            (_, Ok(id)) => id,
            (Some(l), Err(_)) => super::resolve(l, &args.id).await?,
            (None, Err(_)) => anyhow::bail!("`{}` is not a full task id and there is no ledger to look it up", args.id),
        };
        let path = config.daemon.task_log(id);
        if !args.follow {
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    anyhow::bail!("no log for task {id} at {} (the daemon writes it once it takes the task in)", path.display())
                }
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            };
            return write_raw(&bytes);
        }
        follow(&path, id, ledger.as_ref()).await
    })
}

async fn follow(path: &Path, id: TaskId, ledger: Option<&Ledger>) -> anyhow::Result<()> {
    let mut offset = 0u64;
    let mut last_data = Instant::now();
    loop {
        let appended = read_from(path, &mut offset)?;
        if !appended.is_empty() {
            write_raw(&appended)?;
            last_data = Instant::now();
        }
        if let Some(l) = ledger {
            let terminal = l.get(id).await?.is_some_and(|t| t.state.is_terminal());
            if terminal && appended.is_empty() && last_data.elapsed() >= SETTLE {
                return Ok(());
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The bytes appended to `path` since `offset` (advanced past them); empty when the file is missing.
fn read_from(path: &Path, offset: &mut u64) -> anyhow::Result<Vec<u8>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    let len = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if len < *offset {
        // Truncated or replaced: start over.
        *offset = 0;
    }
    file.seek(SeekFrom::Start(*offset))
        .with_context(|| format!("reading {}", path.display()))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)
        .with_context(|| format!("reading {}", path.display()))?;
    *offset += buf.len() as u64;
    Ok(buf)
}

/// Print log bytes, escaping controls (older logs, or a line cut mid-write, may hold raw ones).
fn write_raw(bytes: &[u8]) -> anyhow::Result<()> {
    let text = String::from_utf8_lossy(bytes);
    let text = kiln::logging::escape_terminal(&text);
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_from_returns_only_appended_bytes_and_restarts_after_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.log");
        let mut offset = 0;
        assert!(
            read_from(&path, &mut offset).unwrap().is_empty(),
            "missing file: nothing yet"
        );
        std::fs::write(&path, "one\n").unwrap();
        assert_eq!(read_from(&path, &mut offset).unwrap(), b"one\n");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"two\n")
            .unwrap();
        assert_eq!(read_from(&path, &mut offset).unwrap(), b"two\n");
        assert!(read_from(&path, &mut offset).unwrap().is_empty());
        std::fs::write(&path, "new\n").unwrap();
        assert_eq!(read_from(&path, &mut offset).unwrap(), b"new\n");
    }
}
