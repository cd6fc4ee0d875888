//! `kiln submit FILE… [--force]`: copy task files into `inputs/` atomically (write a hidden `.tmp`
//! beside the target, fsync, rename), so the daemon never sees a half-written file.
//!
//! - Only `.txt`, `.md`, `.json` and `.jsonl` files are taken; the name in `inputs/` is the file name.
//! - Content the ledger already recorded under that name is not submitted again (exit status 1);
//!   `--force` asks the ledger for one more run of it (a rerun request consumed by the next intake).
//! - A different file already in `inputs/` under the same name is not replaced without `--force`.
//!
//! Works with or without a running daemon: a daemon takes the file in at once, otherwise the next
//! `kiln run` does.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use kiln::ledger::InputKind;
use sha2::Digest;

/// Arguments of `kiln submit`.
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// Task files to submit (.txt, .md, .json, .jsonl).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Run content again that already ran, and replace a different file of the same name in inputs/.
    #[arg(long)]
    pub force: bool,
}

/// Run `kiln submit`.
pub fn run(config_path: Option<&Path>, args: SubmitArgs) -> anyhow::Result<()> {
    let config = super::load_config(config_path)?;
    let inputs = &config.daemon.inputs;
    std::fs::create_dir_all(inputs).with_context(|| format!("creating {}", inputs.display()))?;
    let rt = super::runtime()?;
    let ledger = if config.daemon.ledger.exists() {
        Some(rt.block_on(super::open_existing_ledger(&config))?)
    } else {
        None
    };

    let mut skipped = 0usize;
    for src in &args.files {
        let name = src
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{}: not a file name kiln can use", src.display()))?
            .to_owned();
        anyhow::ensure!(
            InputKind::from_path(Path::new(&name)).is_some(),
            "{}: kiln takes .txt, .md, .json and .jsonl files",
            src.display()
        );
        anyhow::ensure!(
            !name.starts_with('.'),
            "{}: dot-files are ignored by the daemon",
            src.display()
        );
        let bytes = std::fs::read(src).with_context(|| format!("reading {}", src.display()))?;
        let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
        let dest = inputs.join(&name);

        let known = match &ledger {
            Some(l) => rt.block_on(l.input_file_known(&name, &sha256))?,
            None => false,
        };
        if known && !args.force {
            skipped += 1;
            eprintln!("skipped {}: this content already ran as inputs/{name} (use --force to run it again)", src.display());
            continue;
        }
        match std::fs::read(&dest) {
            Ok(existing) if existing != bytes && !args.force => {
                skipped += 1;
                eprintln!(
                    "skipped {}: {} exists with different content (use --force to replace it)",
                    src.display(),
                    dest.display()
                );
                continue;
            }
            _ => {}
        }
        if args.force {
            if let Some(l) = &ledger {
                // Before the rename, so the intake the rename triggers sees the request.
                rt.block_on(l.request_rerun(&name, &sha256))?;
            }
        }
        atomic_copy(&bytes, inputs, &name)?;
        println!(
            "submitted {} → {} (sha256 {sha256}, {} bytes)",
            src.display(),
            dest.display(),
            bytes.len()
        );
    }
    if let Some(l) = ledger {
        rt.block_on(l.close());
    }
    anyhow::ensure!(skipped == 0, "{skipped} file(s) not submitted");
    Ok(())
}

/// Write `bytes` to `dir/name` through `dir/.name.<pid>.tmp`: write, fsync, rename, fsync the folder.
fn atomic_copy(bytes: &[u8], dir: &Path, name: &str) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let dest = dir.join(name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &dest)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("writing {}", dest.display()))
}
