//! `kiln generate`: one prompt through the full engine (scheduler, sampler, detokenizer), for a
//! quick check of a model. The completion text goes to stdout; a one-line summary of usage and
//! timings goes to stderr.
//!
//! Engine settings come from `[engine]` in the config file (the global `--config`; defaults
//! when there is none); `--device` and `--threads` override them.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::{Config, LoggingSettings};
use crate::engine::{
    spawn_from_path, ChatMessage, Completion, Device, GenerateRequest, Prompt, SamplingParams,
};

/// Arguments of `kiln generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The model: a `.gguf` file or a Hugging Face model folder.
    #[arg(long)]
    pub model: PathBuf,
    /// A raw text prompt, tokenized as is (BOS added when the model asks for it).
    #[arg(long, required_unless_present = "chat", conflicts_with = "chat")]
    pub prompt: Option<String>,
    /// One user message, rendered with the model's chat template.
    #[arg(long)]
    pub chat: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed of the sampler (same seed, same output).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Backend: `auto`, `cpu`, `cuda` or `cuda:N` (default: `engine.device` from the config).
    #[arg(long)]
    pub device: Option<Device>,
    /// CPU threads, 0 = one per core (default: `engine.threads` from the config).
    #[arg(long)]
    pub threads: Option<usize>,
}

impl GenerateArgs {
    fn request(&self) -> GenerateRequest {
        let prompt = match (&self.prompt, &self.chat) {
            (Some(text), _) => Prompt::Text(text.clone()),
            (None, chat) => Prompt::Chat {
                messages: vec![ChatMessage {
                    role: "user".into(),
                    content: chat.clone().unwrap_or_default(),
                }],
                template_kwargs: serde_json::Map::new(),
            },
        };
        GenerateRequest {
            prompt,
            sampling: SamplingParams {
                temperature: self.temperature,
                seed: self.seed,
                max_tokens: Some(self.max_tokens),
                ..SamplingParams::default()
            },
            deadline: None,
        }
    }
}

/// Run `kiln generate` with the `[engine]` settings of the config file at `config` (the global
/// `--config`; `./config.toml` or defaults when `None`).
pub fn run(config: Option<&Path>, args: &GenerateArgs) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    // Quiet by default: stdout is the completion; RUST_LOG still turns logs on.
    let logging = LoggingSettings {
        level: "warn".into(),
        ..config.logging.clone()
    };
    crate::logging::init(&logging, None)?;
    let mut engine_cfg = config.engine.clone();
    if let Some(device) = args.device {
        engine_cfg.device = device;
    }
    if let Some(threads) = args.threads {
        engine_cfg.threads = threads;
    }
    let engine = spawn_from_path(&args.model, engine_cfg)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let completion = runtime.block_on(engine.submit(args.request()))?;
    engine.shutdown();
    println!("{}", completion.text);
    eprintln!("{}", summary(&completion));
    Ok(())
}

/// One line: tokens, finish reason and timings.
fn summary(c: &Completion) -> String {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    format!(
        "prompt {} tokens ({} cached), completion {} tokens, finish {}; queue {:.1} ms, ttft {:.1} ms, total {:.1} ms, decode {:.1} tok/s",
        c.usage.prompt_tokens,
        c.usage.cached_prompt_tokens,
        c.usage.completion_tokens,
        c.finish_reason.as_str(),
        ms(c.timings.queue),
        ms(c.timings.ttft),
        ms(c.timings.total),
        c.timings.decode_tokens_per_s,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: GenerateArgs,
    }

    #[test]
    fn prompt_and_chat_are_exclusive_and_one_is_required() {
        assert!(Cli::try_parse_from(["kiln", "--model", "m.gguf"]).is_err());
        assert!(
            Cli::try_parse_from(["kiln", "--model", "m", "--prompt", "a", "--chat", "b"]).is_err()
        );
        let cli = Cli::try_parse_from([
            "kiln", "--model", "m", "--chat", "hi", "--seed", "3", "--device", "cpu",
        ])
        .expect("valid");
        assert_eq!(cli.args.device, Some(Device::Cpu));
        let req = cli.args.request();
        assert_eq!(req.sampling.seed, Some(3));
        assert_eq!(req.sampling.max_tokens, Some(256));
        assert!(req.sampling.is_greedy());
        match req.prompt {
            Prompt::Chat { messages, .. } => assert_eq!(
                (messages[0].role.as_str(), messages[0].content.as_str()),
                ("user", "hi")
            ),
            other => panic!("expected a chat prompt, got {other:?}"),
        }
    }
}
