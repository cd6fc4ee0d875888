//! Faults and control: a panicking or OOM step, bad requests, shutdown, stats, chat prompts.

use super::*;

#[tokio::test]
async fn a_panic_in_a_step_fails_its_requests_and_the_engine_keeps_serving() {
    let (h, _) = Setup {
        panic_on_token: Some(200),
        ..Setup::default()
    }
    .start();
    let bad = GenerateRequest::new(Prompt::TokenIds(vec![1, 2, 200]));
    let r = h.submit(bad).await;
    assert!(
        matches!(&r, Err(EngineError::Internal(m)) if m.contains("panic")),
        "{r:?}"
    );
    let ok = h
        .submit(text_request("still alive", greedy(3)))
        .await
        .expect("ok");
    assert_eq!(ok.token_ids.len(), 3);
    assert_eq!(h.stats().await.expect("alive").kv_blocks_used, 0);
}

/// A device out-of-memory in a step (the CUDA backend maps it to `Oom`) fails that step's
/// requests as `Oom` (which the daemon retries); the engine frees their blocks and goes on.
#[tokio::test]
async fn an_oom_in_a_step_fails_its_requests_with_oom_and_the_engine_keeps_serving() {
    let (h, _) = Setup {
        oom_on_token: Some(201),
        ..Setup::default()
    }
    .start();
    let r = h
        .submit(GenerateRequest::new(Prompt::TokenIds(vec![5, 6, 201])))
        .await;
    assert!(
        matches!(&r, Err(EngineError::Oom(m)) if m.contains("201")),
        "{r:?}"
    );
    let ok = h
        .submit(text_request("still alive", greedy(3)))
        .await
        .expect("ok");
    assert_eq!(ok.token_ids.len(), 3);
    assert_eq!(h.stats().await.expect("alive").kv_blocks_used, 0);
}

#[tokio::test]
async fn bad_requests_are_refused_with_invalid_input() {
    let (h, _) = Setup::default().start();
    let cases = [
        GenerateRequest::new(Prompt::TokenIds(vec![])),
        GenerateRequest::new(Prompt::TokenIds(vec![1, VOCAB as u32])),
        text_request(
            "x",
            SamplingParams {
                top_p: 1.5,
                ..SamplingParams::default()
            },
        ),
    ];
    for req in cases {
        let r = h.submit(req).await;
        assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    }
}

#[tokio::test]
async fn shutdown_cancels_pending_requests() {
    let (h, _) = Setup {
        step_delay: Duration::from_millis(2),
        ..Setup::default()
    }
    .start();
    let pending = h.submit(text_request("forever", greedy(100_000)));
    wait_for(&h, "the request to run", |s| s.running == 1).await;
    h.shutdown();
    assert_eq!(pending.await, Err(EngineError::Cancelled));
    assert!(h.stats().await.is_none(), "the engine thread is gone");
}

#[tokio::test]
async fn stats_follow_the_work() {
    let (h, _) = Setup::default().start();
    let before = h.stats().await.expect("alive");
    h.submit(text_request("count me", greedy(5)))
        .await
        .expect("ok");
    let after = h.stats().await.expect("alive");
    assert_eq!(after.generated_tokens - before.generated_tokens, 5);
    assert_eq!(after.prompt_tokens - before.prompt_tokens, 8);
    assert!(after.steps >= before.steps + 5);
    assert_eq!(after.kv_blocks_total, 512);
}

#[tokio::test]
async fn chat_prompts_are_rendered_with_the_template() {
    let (h, _) = Setup::default().start();
    let messages = vec![
        ChatMessage {
            role: "system".into(),
            content: "be brief".into(),
        },
        ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        },
    ];
    let chat = GenerateRequest {
        prompt: Prompt::Chat {
            messages,
            template_kwargs: Default::default(),
        },
        sampling: greedy(6),
        deadline: None,
    };
    let c = h.submit(chat).await.expect("ok");
    let rendered = "<system>be brief\n<user>hi\n<assistant>";
    assert_eq!(c.usage.prompt_tokens as usize, rendered.len());
    let plain = h
        .submit(text_request(rendered, greedy(6)))
        .await
        .expect("ok");
    assert_eq!(c.token_ids, plain.token_ids);
}
