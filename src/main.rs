//! The `kiln` command line: parses arguments and hands over to the library.

use clap::{Parser, Subcommand};

/// kiln: files in, LLM completions out.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check the CUDA setup: driver, GPUs, NVRTC, and compile every kernel.
    Doctor(kiln::tools::doctor::DoctorArgs),
    /// Print logits (and a greedy continuation) for given token ids, as one JSON object.
    Probe(kiln::tools::probe::ProbeArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Doctor(args) => kiln::tools::doctor::run(&args),
        Command::Probe(args) => Ok(kiln::tools::probe::run(&args)?),
    }
}
