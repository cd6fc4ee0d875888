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
enum Command {}

#[allow(unreachable_code, unused_variables)] // until the first subcommand lands
fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {}
}
