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
    /// Measure prefill and decode tokens/s (or, with --kernels, the matmul kernels alone).
    Bench(kiln::tools::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench(&args),
    }
}

/// `kiln bench`.
fn bench(args: &kiln::tools::bench::BenchArgs) -> anyhow::Result<()> {
    kiln::tools::bench::run(args)?;
    Ok(())
}
