//! The `kiln` command line: parses arguments and hands over to the command modules in `cli/`.

mod cli;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// kiln: files in, LLM completions out.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about)]
struct Cli {
    /// The config file (default ./config.toml; a missing default file means all defaults).
    #[arg(long, global = true, env = "KILN_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Copy task files into inputs/ atomically.
    Submit(cli::submit::SubmitArgs),
    /// Task counts per state and whether a daemon is running.
    Status(cli::status::StatusArgs),
    /// List tasks, oldest first.
    List(cli::list::ListArgs),
    /// Everything about one task: state, attempts, request, result, log file.
    Show(cli::show::ShowArgs),
    /// Re-queue failed, dead or cancelled tasks.
    Retry(cli::retry::RetryArgs),
    /// Print a task's own log.
    Logs(cli::logs::LogsArgs),
    /// Check the CUDA setup: driver, GPUs, NVRTC, and compile every kernel.
    Doctor(kiln::tools::doctor::DoctorArgs),
    /// Print logits (and a greedy continuation) for given token ids, as one JSON object.
    Probe(kiln::tools::probe::ProbeArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = cli.config.as_deref();
    match cli.command {
        Command::Submit(args) => cli::submit::run(config, args),
        Command::Status(args) => cli::status::run(config, args),
        Command::List(args) => cli::list::run(config, args),
        Command::Show(args) => cli::show::run(config, args),
        Command::Retry(args) => cli::retry::run(config, args),
        Command::Logs(args) => cli::logs::run(config, args),
        Command::Doctor(args) => kiln::tools::doctor::run(&args),
        Command::Probe(args) => Ok(kiln::tools::probe::run(&args)?),
    }
}
