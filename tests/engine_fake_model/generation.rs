//! Generation against the fake model: exact greedy tokens, preemption, the prefix cache, limits, cancellation, deadlines, seeds, stop strings, EOS, logprobs.

use super::*;

#[tokio::test]
async fn greedy_tokens_follow_the_model_exactly() {
    // The reference: the fake model's argmax over a history computed without any cache.
    let (h, _) = Setup::default().start();
    let prompt = "hello kiln";
    let c = h
        .submit(text_request(prompt, greedy(12)))
        .await
        .expect("ok");
    let mut history: Vec<u32> = prompt.bytes().map(u32::from).collect();
    for &t in &c.token_ids {
        let row = fake_row(&reference_slots(&history));
        let best = (0..VOCAB)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .expect("vocab");
        assert_eq!(t as usize, best);
        history.push(t);
    }
    assert_eq!(c.token_ids.len(), 12);
    assert_eq!(c.finish_reason, FinishReason::Length);
    assert_eq!(c.text, visible_text(&c.token_ids));
}

#[tokio::test]
async fn preemption_under_a_tiny_kv_budget_gives_the_same_tokens() {
    let reqs = || {
        prompts(8)
            .iter()
            .map(|p| text_request(p, greedy(24)))
            .collect::<Vec<_>>()
    };
    let total_needed: usize = prompts(8).iter().map(|p| p.len() + 24 - 1).sum();

    // The reference: a cache with room for everything, no prefix sharing (exact token count).
    let (big, big_probe) = Setup {
        prefix_caching: false,
        ..Setup::default()
    }
    .start();
    let expected = tokens(&run_all(&big, reqs()).await);
    assert_eq!(
        big_probe.computed_tokens.load(Ordering::Relaxed),
        total_needed,
        "no recompute with room"
    );

    // 24 blocks of 4 = 96 tokens: one request (≤ 68 + 24 tokens) fits, eight do not.
    for prefix_caching in [false, true] {
        let (tiny, probe) = Setup {
            num_blocks: 24,
            max_num_batched_tokens: 16, // also forces chunked prefill
            prefix_caching,
            // Steps of ≥ 2 ms: all eight submissions land while the first request still runs,
            // even when this thread is descheduled on a loaded machine (else "requests shared
            // steps" below could fail by timing alone).
            step_delay: Duration::from_millis(2),
            ..Setup::default()
        }
        .start();
        let got = tokens(&run_all(&tiny, reqs()).await);
        assert_eq!(got, expected, "prefix_caching={prefix_caching}");
        if !prefix_caching {
            let computed = probe.computed_tokens.load(Ordering::Relaxed);
            assert!(
                computed > total_needed,
                "preemption recomputed tokens ({computed} vs {total_needed})"
            );
        }
        assert!(
            probe
                .batch_sizes
                .lock()
                .expect("lock")
                .iter()
                .any(|&n| n > 1),
            "requests shared steps"
        );
        let stats = tiny.stats().await.expect("alive");
        assert_eq!(
            (stats.running, stats.waiting, stats.kv_blocks_used),
            (0, 0, 0),
            "{stats:?}"
        );
    }
}

#[tokio::test]
async fn a_repeated_prompt_is_served_from_the_prefix_cache() {
    let (h, probe) = Setup::default().start();
    let prompt = "a shared system prompt that is long enough for several blocks";
    let first = h.submit(text_request(prompt, greedy(8))).await.expect("ok");
    let computed = probe.computed_tokens.load(Ordering::Relaxed);
    let second = h.submit(text_request(prompt, greedy(8))).await.expect("ok");
    assert_eq!(first.usage.cached_prompt_tokens, 0);
    // Blocks of 4: the full blocks before the last token are reused (it is always computed).
    assert_eq!(prompt.len(), 61);
    assert_eq!(second.usage.cached_prompt_tokens, 60);
    assert_eq!(second.usage.prompt_tokens, 61);
    assert_eq!(second.token_ids, first.token_ids);
    // 1 prompt token, then 7 decode steps (the 8th token is sampled, never computed).
    assert_eq!(
        probe.computed_tokens.load(Ordering::Relaxed) - computed,
        1 + 7
    );
    // A block-aligned prompt: 60 tokens = 15 full blocks, of which 14 are reused.
    let aligned = &prompt[..60];
    let first = h
        .submit(text_request(aligned, greedy(4)))
        .await
        .expect("ok");
    let second = h
        .submit(text_request(aligned, greedy(4)))
        .await
        .expect("ok");
    assert_eq!(second.usage.cached_prompt_tokens, 56);
    assert_eq!(second.token_ids, first.token_ids);
}

#[tokio::test]
async fn a_prompt_over_max_model_len_fails_alone() {
    let (h, _) = Setup {
        max_pos: 64,
        ..Setup::default()
    }
    .start();
    assert_eq!(h.info().max_model_len, 64);
    let long = "x".repeat(64); // 64 + 1 > 64
    let mut reqs: Vec<_> = prompts(3)
        .iter()
        .map(|p| text_request(p, greedy(5)))
        .collect();
    reqs.insert(1, text_request(&long, greedy(5)));
    let results = run_all(&h, reqs).await;
    assert!(
        matches!(&results[1], Err(EngineError::InvalidInput(m)) if m.contains("max_model_len")),
        "{:?}",
        results[1]
    );
    for i in [0, 2, 3] {
        assert_eq!(results[i].as_ref().expect("ok").token_ids.len(), 5);
    }
    // A prompt that fits max_model_len but not the whole cache is Oom.
    let (small, _) = Setup {
        num_blocks: 4,
        max_pos: 64,
        ..Setup::default()
    }
    .start();
    let r = small.submit(text_request(&"y".repeat(20), greedy(2))).await;
    assert!(matches!(r, Err(EngineError::Oom(_))), "{r:?}");
    // Generation stops at max_model_len (Length) even without max_tokens.
    let c = h
        .submit(text_request(
            "abc",
            SamplingParams {
                ignore_eos: true,
                ..Default::default()
            },
        ))
        .await;
    let c = c.expect("ok");
    assert_eq!(
        (
            c.usage.prompt_tokens + c.usage.completion_tokens,
            c.finish_reason
        ),
        (64, FinishReason::Length)
    );
}

#[tokio::test]
async fn cancelling_frees_the_blocks() {
    let (h, _) = Setup {
        step_delay: Duration::from_millis(2),
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
    // The engine still serves.
    assert_eq!(
        h.submit(text_request("next", greedy(3)))
            .await
            .expect("ok")
            .token_ids
            .len(),
        3
    );
}

#[tokio::test]
async fn a_deadline_fails_only_its_request() {
    let (h, _) = Setup {
        step_delay: Duration::from_millis(2),
        ..Setup::default()
    }
    .start();
    let late = GenerateRequest {
        deadline: Some(Instant::now() + Duration::from_millis(60)),
        ..text_request("slow", greedy(10_000))
    };
    let results = run_all(&h, vec![late, text_request("quick", greedy(4))]).await;
    assert!(
        matches!(&results[0], Err(EngineError::Timeout(_))),
        "{:?}",
        results[0]
    );
    assert_eq!(results[1].as_ref().expect("ok").token_ids.len(), 4);
    let stats = h.stats().await.expect("alive");
    assert_eq!(stats.kv_blocks_used, 0);
}

#[tokio::test]
async fn the_same_seed_gives_the_same_tokens_alone_or_batched() {
    let sampled = |seed| SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        seed: Some(seed),
        max_tokens: Some(20),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let (h, _) = Setup::default().start();
    let alone = h
        .submit(text_request("seeded", sampled(42)))
        .await
        .expect("ok")
        .token_ids;
    let mut batch: Vec<_> = prompts(6)
        .iter()
        .enumerate()
        .map(|(i, p)| text_request(p, sampled(i as u64)))
        .collect();
    batch.insert(3, text_request("seeded", sampled(42)));
    let results = run_all(&h, batch).await;
    assert_eq!(results[3].as_ref().expect("ok").token_ids, alone);
    let other = h
        .submit(text_request("seeded", sampled(43)))
        .await
        .expect("ok")
        .token_ids;
    assert_ne!(other, alone, "a different seed samples differently");
}

#[tokio::test]
async fn stop_strings_end_generation_and_are_not_returned() {
    let (h, _) = Setup::default().start();
    let full = h
        .submit(text_request("tell me", greedy(40)))
        .await
        .expect("ok");
    assert!(
        full.text.is_ascii() && full.text.len() >= 30,
        "{:?}",
        full.text
    );
    let stop = full.text[12..15].to_string();
    let cut = full.text.find(&stop).expect("present");
    let sampling = SamplingParams {
        stop: vec!["never there".into(), stop.clone()],
        ..greedy(40)
    };
    let c = h
        .submit(text_request("tell me", sampling))
        .await
        .expect("ok");
    assert_eq!(c.finish_reason, FinishReason::Stop);
    assert_eq!(c.text, full.text[..cut], "stop string {stop:?}");
    // The tokens up to the one completing the stop string are kept.
    let completing = (1..=full.token_ids.len())
        .find(|&n| visible_text(&full.token_ids[..n]).contains(&stop))
        .expect("the stop string is in the text");
    assert_eq!(c.token_ids, full.token_ids[..completing]);
}

#[tokio::test]
async fn eos_ends_generation_unless_ignored() {
    let (h, _) = Setup::default().start();
    let sampling = SamplingParams {
        max_tokens: Some(200),
        ..SamplingParams::default()
    };
    let results = run_all(
        &h,
        prompts(4)
            .iter()
            .map(|p| text_request(p, sampling.clone()))
            .collect(),
    )
    .await;
    let stopped: Vec<_> = results
        .iter()
        .map(|r| r.as_ref().expect("ok"))
        .filter(|c| c.finish_reason == FinishReason::Stop)
        .collect();
    assert!(
        !stopped.is_empty(),
        "EOS is likely within 200 tokens for these prompts"
    );
    for c in stopped {
        assert_eq!(c.token_ids.last(), Some(&EOS));
        assert!(!c.text.contains("<eos>"));
        assert_eq!(c.text.len(), c.token_ids.len() - 1);
        assert!(c.timings.queue <= c.timings.ttft && c.timings.ttft <= c.timings.total);
    }
}

#[tokio::test]
async fn logprobs_are_the_log_softmax_of_the_model_row() {
    let (h, _) = Setup::default().start();
    let prompt = "logprobs";
    let sampling = SamplingParams {
        logprobs: Some(3),
        ..greedy(6)
    };
    let c = h.submit(text_request(prompt, sampling)).await.expect("ok");
    let lps = c.logprobs.expect("requested");
    assert_eq!(lps.len(), 6);
    let mut history: Vec<u32> = prompt.bytes().map(u32::from).collect();
    for (lp, &t) in lps.iter().zip(&c.token_ids) {
        let row = fake_row(&reference_slots(&history));
        let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln() as f32;
        assert_eq!(lp.token_id, t);
        assert!((lp.logprob - (row[t as usize] - lse)).abs() < 1e-5);
        assert_eq!(lp.top.len(), 3);
        assert_eq!(lp.top[0].token_id, t, "greedy picks the most likely token");
        assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        assert_eq!(
            lp.token,
            if t == EOS {
                "<eos>".to_string()
            } else {
                visible_text(&[t])
            }
        );
        history.push(t);
    }
}
