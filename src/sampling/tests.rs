//! Tests of the pure per-row sampling function.

use super::*;

fn row(desc: impl FnOnce(&mut SamplingRow)) -> SamplingRow {
    let mut r = SamplingRow::greedy();
    desc(&mut r);
    r
}

fn draw_row(u: f64, f: impl FnOnce(&mut SamplingRow)) -> SamplingRow {
    row(|r| {
        r.temperature = 1.0;
        r.draw = Some(u);
        f(r);
    })
}

fn token(logits: &[f32], desc: &SamplingRow) -> u32 {
    sample_row(logits, desc).expect("sampled").token_id
}

/// Every token a draw can give, over `n` evenly spread uniforms.
fn support(logits: &[f32], n: usize, f: impl Fn(&mut SamplingRow) + Copy) -> Vec<u32> {
    let mut seen: Vec<u32> = (0..n)
        .map(|i| token(logits, &draw_row((i as f64 + 0.5) / n as f64, f)))
        .collect();
    seen.sort_unstable();
    seen.dedup();
    seen
}

/// Logits whose probabilities are proportional to `w`.
fn ln(w: &[f32]) -> Vec<f32> {
    w.iter().map(|x| x.ln()).collect()
}

#[test]
fn exp_det_is_close_to_exp_and_exact_at_zero() {
    assert_eq!(exp_det(0.0), 1.0);
    assert_eq!(exp_det(-0.0), 1.0);
    assert_eq!(exp_det(-81.0), 0.0);
    assert_eq!(exp_det(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_det(f32::NAN), 0.0);
    let mut x = -80.0f32;
    while x <= 0.0 {
        let want = (x as f64).exp();
        let got = exp_det(x) as f64;
        assert!(
            ((got - want) / want).abs() < 1e-6,
            "exp({x}) = {got} vs {want}"
        );
        x += 0.0137;
    }
}

#[test]
fn order_and_rank_keys_are_total_and_put_lower_ids_first() {
    let vals = [
        f32::NEG_INFINITY,
        -3.5,
        -1e-30,
        0.0,
        1e-30,
        2.0,
        f32::INFINITY,
    ];
    for w in vals.windows(2) {
        assert!(order_key(w[0]) < order_key(w[1]), "{w:?}");
    }
    assert_eq!(canonical(-0.0).to_bits(), 0.0f32.to_bits());
    assert_eq!(canonical(f32::NAN), f32::NEG_INFINITY);
    assert!(rank_key(1.0, 3) > rank_key(1.0, 4));
    assert!(rank_key(1.5, 9) > rank_key(1.0, 0));
}

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties_and_ignores_the_draw_parameters() {
    let l = [0.1, 3.0, f32::NAN, 3.0];
    assert_eq!(token(&l, &SamplingRow::greedy()), 1);
    // Top-k etc. do not matter without a draw; nor does a draw with temperature 0.
    assert_eq!(token(&l, &row(|r| r.top_k = 3)), 1);
    assert_eq!(token(&l, &row(|r| r.draw = Some(0.99))), 1);
    assert_eq!(
        sample_row(&[f32::NAN, f32::NAN], &SamplingRow::greedy()),
        Err(SampleError::NoFiniteLogit)
    );
    assert_eq!(
        sample_row(&[1.0, f32::INFINITY], &draw_row(0.5, |_| {})),
        Err(SampleError::NoFiniteLogit)
    );
    assert_eq!(
        sample_row(&[], &SamplingRow::greedy()),
        Err(SampleError::NoFiniteLogit)
    );
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_non_positive_logits() {
    // 2.0 / 2 = 1.0 and -1.0 × 2 = -2.0: token 2 (1.5) wins.
    let l = [2.0, -1.0, 1.5];
    let rep = |tokens: &[u32]| {
        row(|r| {
            r.repetition_penalty = 2.0;
            r.penalties = tokens
                .iter()
                .map(|&token| Penalty {
                    token,
                    repeated: true,
                    count: 0,
                })
                .collect();
        })
    };
    assert_eq!(token(&l, &rep(&[0, 1])), 2);
    assert_eq!(token(&l, &rep(&[0, 1, 2])), 0); // 1.5 / 2 = 0.75 < 1.0
                                                // Ids outside the vocabulary are ignored.
    assert_eq!(token(&l, &rep(&[1, 2, 99])), 0);
}

#[test]
fn presence_and_frequency_penalties_apply_to_counted_tokens_after_repetition() {
    let l = [3.0, 2.0, 0.0];
    let pen = |entries: &[(u32, bool, u32)]| {
        row(|r| {
            r.repetition_penalty = 1.5;
            r.frequency_penalty = 0.6;
            r.presence_penalty = 0.5;
            r.penalties = entries
                .iter()
                .map(|&(token, repeated, count)| Penalty {
                    token,
                    repeated,
                    count,
                })
                .collect();
        })
    };
    // Count 0: only presence/frequency-free; not repeated: no division.
    assert_eq!(token(&l, &pen(&[(0, false, 0)])), 0);
    // 3.0 - 0.6 - 0.5 = 1.9 < 2.0.
    assert_eq!(token(&l, &pen(&[(0, false, 1)])), 1);
    // Repeated and counted: 3.0 / 1.5 - 1.1 = 0.9; token 1 also: 2.0 / 1.5 - 1.7 = -0.366.
    let out = sample_row(&l, &pen(&[(0, true, 1), (1, true, 2)])).unwrap();
    assert_eq!(out.token_id, 0);
    // 3.0 / 1.5 - 2.3 = -0.3 and -0.37 against 0.0: token 2.
    assert_eq!(token(&l, &pen(&[(0, true, 3), (1, true, 2)])), 2);
}

#[test]
fn logprobs_are_log_softmax_of_the_raw_row_with_top_n_in_rank_order() {
    let desc = row(|r| {
        r.logprobs = Some(3);
        r.repetition_penalty = 1.5;
        r.penalties = vec![Penalty {
            token: 1,
            repeated: true,
            count: 0,
        }];
    });
    let l = [1.0f32, 3.0, 2.0, 3.0, f32::NAN];
    let out = sample_row(&l, &desc).unwrap();
    let lse = (1f32.exp() + 2.0 * 3f32.exp() + 2f32.exp()).ln();
    // The penalty moves token 1 (3 / 1.5 = 2) below token 3; logprobs stay raw.
    assert_eq!(out.token_id, 3);
    assert!((out.logprob.unwrap() - (3.0 - lse)).abs() < 1e-6);
    assert_eq!(
        out.top.iter().map(|t| t.0).collect::<Vec<_>>(),
        vec![1, 3, 2]
    );
    assert!((out.top[2].1 - (2.0 - lse)).abs() < 1e-6);
    // N larger than the vocabulary: every token, NaN (as -inf) last.
    let all = sample_row(&l, &row(|r| r.logprobs = Some(9))).unwrap();
    assert_eq!(all.top.len(), 5);
    assert_eq!(all.top[4], (4, f32::NEG_INFINITY));
    assert_eq!(
        sample_row(&l, &row(|r| r.logprobs = Some(0))).unwrap().top,
        vec![]
    );
    assert!(sample_row(&l, &SamplingRow::greedy())
        .unwrap()
        .logprob
        .is_none());
}

#[test]
fn the_draw_is_the_inverse_cdf_in_token_id_order() {
    // p = [0.25, 0.75]: u < 0.25 → token 0, else token 1; token 2 (-inf) never.
    let l = ln(&[1.0, 3.0, 0.0]);
    assert_eq!(token(&l, &draw_row(0.0, |_| {})), 0);
    assert_eq!(token(&l, &draw_row(0.2499, |_| {})), 0);
    assert_eq!(token(&l, &draw_row(0.2501, |_| {})), 1);
    assert_eq!(token(&l, &draw_row(0.999_999_999, |_| {})), 1);
    // The same u always gives the same token.
    for i in 0..50 {
        let u = i as f64 / 50.0;
        assert_eq!(
            token(&l, &draw_row(u, |_| {})),
            token(&l, &draw_row(u, |_| {}))
        );
    }
    // Temperature flattens: at T = 100 both halves are almost even.
    let hot = |u| token(&l, &draw_row(u, |r| r.temperature = 100.0));
    assert_eq!(hot(0.49), 0);
    assert_eq!(hot(0.51), 1);
    // and sharpens: at T = 0.01 token 1 takes everything.
    assert_eq!(token(&l, &draw_row(0.0, |r| r.temperature = 0.01)), 1);
}

#[test]
fn top_k_top_p_and_min_p_restrict_the_support() {
    // probs ∝ [8, 4, 2, 1, 1] (sum 16); tokens 3 and 4 tie.
    let l = ln(&[8.0, 4.0, 2.0, 1.0, 1.0]);
    assert_eq!(support(&l, 1000, |_| {}), vec![0, 1, 2, 3, 4]);
    assert_eq!(support(&l, 1000, |r| r.top_k = 2), vec![0, 1]);
    // A tie at the top_k boundary goes to the lower id.
    assert_eq!(support(&l, 1000, |r| r.top_k = 4), vec![0, 1, 2, 3]);
    // top_p 0.7: 8/16 = 0.5 < 0.7, 12/16 = 0.75 ≥ 0.7 → {0, 1}.
    assert_eq!(support(&l, 1000, |r| r.top_p = 0.7), vec![0, 1]);
    assert_eq!(support(&l, 1000, |r| r.top_p = 0.76), vec![0, 1, 2]);
    // top_p over the top_k set: top_k 3 (mass 14), top_p 0.9 → 12.6 → {0, 1, 2}.
    assert_eq!(
        support(&l, 1000, |r| {
            r.top_k = 3;
            r.top_p = 0.9;
        }),
        vec![0, 1, 2]
    );
    // The nucleus ends inside the tie of tokens 3 and 4: 0.9 × 16 = 14.4 → token 3 (lower id).
    assert_eq!(support(&l, 1000, |r| r.top_p = 0.9), vec![0, 1, 2, 3]);
    // min_p 0.2 relative to the top probability: 0.2 × 8 = 1.6 → {0, 1, 2}.
    assert_eq!(support(&l, 1000, |r| r.min_p = 0.2), vec![0, 1, 2]);
    assert_eq!(support(&l, 1000, |r| r.min_p = 1.0), vec![0]);
    // min_p after top_p.
    assert_eq!(
        support(&l, 1000, |r| {
            r.top_p = 0.76;
            r.min_p = 0.4;
        }),
        vec![0, 1]
    );
}

#[test]
fn the_draw_follows_the_kept_distribution() {
    let l = ln(&[8.0, 4.0, 2.0, 1.0, 1.0]);
    let n = 16_000;
    let mut counts = [0usize; 5];
    for i in 0..n {
        let u = (i as f64 + 0.5) / n as f64;
        counts[token(&l, &draw_row(u, |r| r.top_k = 3)) as usize] += 1;
    }
    // Kept mass 14: 8/14, 4/14, 2/14 of evenly spread uniforms.
    assert_eq!(counts[3] + counts[4], 0);
    for (c, w) in counts.iter().zip([8.0, 4.0, 2.0]) {
        let want = n as f64 * w / 14.0;
        assert!((*c as f64 - want).abs() <= 2.0, "{counts:?}");
    }
}

#[test]
fn top_p_over_a_large_vocab_uses_the_full_sort_when_needed() {
    // 1000 equal logits: the nucleus of 0.5 is ids 0..500, more than the partial prefix.
    let l = vec![0.0f32; 1000];
    let s = support(&l, 4000, |r| r.top_p = 0.5);
    assert_eq!(s, (0..500).collect::<Vec<u32>>());
}

#[test]
fn thresholds_use_exact_integer_masses() {
    assert_eq!(mass(1.0), 1 << 40);
    assert_eq!(mass(0.0), 0);
    assert_eq!(top_p_need(0.5, 3), 2);
    assert_eq!(top_p_need(1.0, u64::MAX >> 6), u64::MAX >> 6);
    assert_eq!(top_p_need(1e-30, 7), 1);
    assert_eq!(draw_target(0.0, 10), 0);
    assert_eq!(draw_target(0.999_999_999_999_999_9, 10), 9);
    assert_eq!(draw_target(0.5, 0), 0);
}
