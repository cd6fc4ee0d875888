//! Overlap (step N+1 built while step N runs) gives the same tokens, stops and logprobs as no overlap, and frees blocks only after the step in flight.

use super::*;

/// The same requests with and without overlap: every request's tokens, text and finish reason.
async fn overlap_agrees(setup: impl Fn(bool) -> Setup, reqs: impl Fn() -> Vec<GenerateRequest>) {
    let run = |overlap: bool| {
        let (h, probe) = setup(overlap).start();
        let reqs = reqs();
        async move { (run_all(&h, reqs).await, probe) }
    };
    let (plain, _) = run(false).await;
    let (overlapped, probe) = run(true).await;
    let key = |r: &Result<Completion, EngineError>| {
        let c = r.as_ref().expect("completion");
        (c.token_ids.clone(), c.text.clone(), c.finish_reason)
    };
    assert_eq!(
        plain.iter().map(key).collect::<Vec<_>>(),
        overlapped.iter().map(key).collect::<Vec<_>>()
    );
    // The overlapped run did build steps ahead, feeding them tokens still being computed.
    assert!(probe.fed_ahead.load(Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn overlap_gives_the_same_tokens_eos_and_max_tokens() {
    // EOS stops some requests early, max_tokens the others; greedy and seeded sampling mixed.
    overlap_agrees(
        |overlap| Setup {
            overlap,
            ..Setup::default()
        },
        || {
            prompts(10)
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let sampling = SamplingParams {
                        max_tokens: Some(5 + 7 * (i as u32 % 4)),
                        temperature: if i % 2 == 0 { 0.0 } else { 0.9 },
                        seed: Some(i as u64),
                        ..SamplingParams::default()
                    };
                    text_request(p, sampling)
                })
                .collect()
        },
    )
    .await;
}

#[tokio::test]
async fn overlap_gives_the_same_tokens_with_stop_strings_and_logprobs() {
    overlap_agrees(
        |overlap| Setup {
            overlap,
            ..Setup::default()
        },
        || {
            prompts(6)
                .iter()
                .map(|p| {
                    let sampling = SamplingParams {
                        stop: vec!["e".into(), "q u".into()],
                        logprobs: Some(2),
                        ..greedy(30)
                    };
                    text_request(p, sampling)
                })
                .collect()
        },
    )
    .await;
}

#[tokio::test]
async fn overlap_with_penalties_and_preemption_gives_the_same_tokens_and_never_reuses_a_busy_block()
{
    // A tiny cache (preemption), one-token prefill chunks, prefix caching off (so the queued
    // runner can check block ownership), and penalties on some requests (those steps are
    // collected before the next is built).
    overlap_agrees(
        |overlap| Setup {
            overlap,
            num_blocks: 24,
            max_num_seqs: 6,
            max_num_batched_tokens: 8,
            prefix_caching: false,
            ..Setup::default()
        },
        || {
            prompts(9)
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let sampling = SamplingParams {
                        repetition_penalty: if i % 3 == 0 { 1.3 } else { 1.0 },
                        ..greedy(6 + i as u32 * 3)
                    };
                    text_request(p, sampling)
                })
                .collect()
        },
    )
    .await;
}

#[tokio::test]
async fn overlap_cancelling_frees_the_blocks_after_the_step_in_flight() {
    let (h, _) = Setup {
        step_delay: Duration::from_millis(2),
        overlap: true,
        prefix_caching: false,
        ..Setup::default()
    }
    .start();
    let pending = h.submit(text_request("a long generation", greedy(10_000)));
    wait_for(&h, "the request to run", |s| {
        s.running == 1 && s.kv_blocks_used > 0
    })
    .await;
    drop(pending);
    wait_for(&h, "the blocks to be freed", |s| {
        s.running == 0 && s.waiting == 0 && s.kv_blocks_used == 0
    })
    .await;
    let results = run_all(
        &h,
        prompts(5)
            .iter()
            .map(|p| text_request(p, greedy(7)))
            .collect(),
    )
    .await;
    assert!(tokens(&results).iter().all(|t| t.len() == 7));
}
