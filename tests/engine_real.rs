//! The engine with the real default model (SmolLM2-135M-Instruct, Q4_1 GGUF) on the CPU.
//!
//! Needs `models/SmolLM2-135M-Instruct.Q4_1.gguf` (or the path in `KILN_TEST_MODEL`) and FAILS
//! when it is missing: CI fetches it first with `kiln model fetch-default`.
//! Run: `cargo test --test engine_real`.
//!
//! Batch invariance: a request's greedy tokens must not depend on what else is in the batch, nor
//! on where chunked prefill cuts its prompt. Prefix caching is off in these runs so every
//! request's prompt is really computed inside the batch under test.

use std::path::PathBuf;

use kiln::engine::{
    spawn_from_path, ChatMessage, Completion, Device, EngineConfig, EngineHandle, GenerateRequest,
    Prompt, SamplingParams,
};

/// New tokens per request: short, so CI on 2 cores stays fast.
const NEW_TOKENS: u32 = 8;

fn model_path() -> PathBuf {
    let path = std::env::var_os("KILN_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "test model {} is missing: run `kiln model fetch-default` or set KILN_TEST_MODEL",
        path.display()
    );
    path
}

fn engine(max_num_batched_tokens: usize) -> EngineHandle {
    let cfg = EngineConfig {
        device: Device::Cpu,
        max_num_seqs: 16,
        max_num_batched_tokens,
        enable_prefix_caching: false,
        kv_cache_mib: 64,
        ..EngineConfig::default()
    };
    spawn_from_path(&model_path(), cfg).expect("the model loads")
}

/// 16 prompts of mixed lengths (a few tokens to about 150).
fn prompts() -> Vec<String> {
    let base = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village by the sea,",
        "1, 2, 3, 4, 5,",
        "The three primary colors are",
        "Water boils at",
        "To make a cup of tea, first",
        "The quick brown fox",
    ];
    (0..16)
        .map(|i| {
            let b = base[i % base.len()];
            if i < base.len() {
                b.to_string()
            } else {
                // Longer variants: some context before the same opening.
                format!(
                    "{} {b}",
                    "Here is a short story about a lighthouse keeper and his cat. ".repeat(i - 7)
                )
            }
        })
        .collect()
}

fn greedy(prompt: &str) -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Text(prompt.to_string()),
        sampling: SamplingParams {
            max_tokens: Some(NEW_TOKENS),
            ignore_eos: true,
            ..Default::default()
        },
        deadline: None,
    }
}

async fn all_at_once(h: &EngineHandle, prompts: &[String]) -> Vec<Completion> {
    let pending: Vec<_> = prompts.iter().map(|p| h.submit(greedy(p))).collect();
    let mut out = Vec::new();
    for p in pending {
        out.push(p.await.expect("completion"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn sixteen_greedy_requests_batched_match_each_alone() {
    let prompts = prompts();
    let h = engine(2048);
    let mut alone = Vec::new();
    for p in &prompts {
        alone.push(h.submit(greedy(p)).await.expect("completion"));
    }
    let batched = all_at_once(&h, &prompts).await;
    // A small token budget: long prompts are prefilled in chunks, mixed with others' decodes.
    let chunked = all_at_once(&engine(48), &prompts).await;
    let lens: Vec<u32> = alone.iter().map(|c| c.usage.prompt_tokens).collect();
    assert!(
        lens.iter().any(|&n| n > 100) && lens.iter().any(|&n| n < 10),
        "mixed lengths: {lens:?}"
    );
    for (i, a) in alone.iter().enumerate() {
        assert_eq!(a.token_ids.len(), NEW_TOKENS as usize);
        assert_eq!(
            batched[i].token_ids, a.token_ids,
            "prompt {i} batched: {:?}",
            prompts[i]
        );
        assert_eq!(
            chunked[i].token_ids, a.token_ids,
            "prompt {i} chunked: {:?}",
            prompts[i]
        );
        assert_eq!(batched[i].text, a.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_chat_question_gets_a_sensible_answer_and_a_cache_hit() {
    let cfg = EngineConfig {
        device: Device::Cpu,
        kv_cache_mib: 64,
        ..EngineConfig::default()
    };
    let h = spawn_from_path(&model_path(), cfg).expect("the model loads");
    let ask = || GenerateRequest {
        prompt: Prompt::Chat {
            messages: vec![ChatMessage {
                role: "user".into(),
                content: "What is the capital of France?".into(),
            }],
            template_kwargs: Default::default(),
        },
        sampling: SamplingParams {
            max_tokens: Some(16),
            ..Default::default()
        },
        deadline: None,
    };
    let first = h.submit(ask()).await.expect("completion");
    assert!(first.text.contains("Paris"), "{:?}", first.text);
    assert!(!first.text.contains("<|im_end|>"));
    let second = h.submit(ask()).await.expect("completion");
    assert!(second.usage.cached_prompt_tokens > 0, "{:?}", second.usage);
    assert_eq!(second.token_ids, first.token_ids);
}

#[test]
fn kiln_generate_prints_the_completion_and_a_summary() {
    // Run outside the repository so no config.toml is picked up: engine defaults.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .current_dir(dir.path())
        .env_remove("KILN_CONFIG")
        .args([
            "generate",
            "--device",
            "cpu",
            "--max-tokens",
            "4",
            "--prompt",
            "The capital of France is",
            "--model",
        ])
        .arg(model_path())
        .output()
        .expect("kiln runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("completion 4 tokens, finish length"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
}
