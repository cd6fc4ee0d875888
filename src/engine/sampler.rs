//! Per-request sampling state: the seeded RNG and the tokens the penalties apply to. Each step
//! it describes the row's sampling as plain data ([`SamplingRow`]), a backend applies that to
//! the logits row ([`crate::sampling::sample_row`] on the CPU, kernels on a GPU), and
//! the chosen token comes back through [`Sampler::accept`].
//!
//! Each request owns a [`Sampler`]. Its RNG is seeded from `SamplingParams::seed` (or from a
//! random seed) and gives exactly one uniform `u ∈ [0, 1)` per non-greedy step, never shared, so
//! a request's tokens depend only on its own logits rows and seed: the same seed gives the same
//! tokens alone or in any batch (given batch-invariant logits), on any backend (the draw from
//! `u` is exact, see [`crate::sampling`]). Greedy sampling does not touch the RNG.
//! The order of operations on a row is documented in [`crate::sampling`].

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::engine::request::SamplingParams;
use crate::error::EngineError;
pub use crate::sampling::Sampled;
use crate::sampling::{sample_row, Penalty, SamplingRow};

/// Sampling state of one request.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Penalized tokens by id: distinct prompt + output tokens when the repetition penalty is
    /// on, output counts when presence / frequency penalties are on.
    penalties: BTreeMap<u32, Penalty>,
}

impl Sampler {
    /// A sampler for a request with prompt `prompt_ids`. Parameters must have passed
    /// [`validate`].
    pub fn new(params: &SamplingParams, prompt_ids: &[u32]) -> Sampler {
        let seed = params.seed.unwrap_or_else(rand::random);
        let mut penalties = BTreeMap::new();
        if params.repetition_penalty != 1.0 {
            for &token in prompt_ids {
                penalties.insert(
                    token,
                    Penalty {
                        token,
                        repeated: true,
                        count: 0,
                    },
                );
            }
        }
        Sampler {
            params: params.clone(),
            rng: StdRng::seed_from_u64(seed),
            penalties,
        }
    }

    /// The next step's descriptor. Draws the step's uniform from the RNG unless greedy.
    pub fn next_row(&mut self) -> SamplingRow {
        let p = &self.params;
        let greedy = p.is_greedy();
        SamplingRow {
            temperature: if greedy { 0.0 } else { p.temperature },
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            penalties: self.penalties.values().copied().collect(),
            logprobs: p.logprobs,
            draw: (!greedy).then(|| self.rng.random::<f64>()),
        }
    }

    /// Whether [`Sampler::next_row`] depends on the tokens accepted so far (a penalty is on).
    pub fn needs_history(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0
    }

    /// Record the token chosen for the row [`Sampler::next_row`] described.
    pub fn accept(&mut self, token: u32) {
        let rep = self.params.repetition_penalty != 1.0;
        let counts = self.params.presence_penalty != 0.0 || self.params.frequency_penalty != 0.0;
        if rep || counts {
            let e = self.penalties.entry(token).or_insert(Penalty {
                token,
                repeated: false,
                count: 0,
            });
            e.repeated |= rep;
            if counts {
                e.count += 1;
            }
        }
    }

    /// Describe, sample on the host and accept in one go: pick the next token from a logits
    /// row (`[vocab]`).
    pub fn sample(&mut self, logits: &[f32]) -> Result<Sampled, EngineError> {
        let row = self.next_row();
        let sampled = sample_row(logits, &row)?;
        self.accept(sampled.token_id);
        Ok(sampled)
    }
}

/// Check sampling parameters; the message names the field and the allowed range.
pub fn validate(p: &SamplingParams) -> Result<(), EngineError> {
    let bad = |m: String| Err(EngineError::InvalidInput(m));
    if !(p.temperature >= 0.0 && p.temperature.is_finite()) {
        return bad(format!("temperature must be ≥ 0 (got {})", p.temperature));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return bad(format!("top_p must be in (0, 1] (got {})", p.top_p));
    }
    if !(0.0..=1.0).contains(&p.min_p) {
        return bad(format!("min_p must be in [0, 1] (got {})", p.min_p));
    }
    if !(p.repetition_penalty > 0.0 && p.repetition_penalty.is_finite()) {
        return bad(format!(
            "repetition_penalty must be > 0 (got {})",
            p.repetition_penalty
        ));
    }
    for (name, v) in [
        ("presence_penalty", p.presence_penalty),
        ("frequency_penalty", p.frequency_penalty),
    ] {
        if !(-2.0..=2.0).contains(&v) {
            return bad(format!("{name} must be in [-2, 2] (got {v})"));
        }
    }
    if p.max_tokens == Some(0) {
        return bad("max_tokens must be at least 1 (got 0)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SamplingParams {
        SamplingParams::default()
    }

    fn sampler(p: SamplingParams) -> Sampler {
        Sampler::new(&p, &[])
    }

    #[test]
    fn greedy_is_argmax_with_lowest_id_on_ties() {
        let mut s = sampler(params());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]).expect("ok").token_id, 1);
        assert!(s.sample(&[f32::NAN, f32::NAN]).is_err());
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        // Prompt contains tokens 0 and 1. Logits 2.0 / -1.0 with penalty 2 → 1.0 / -2.0,
        // so token 2 (1.5) wins greedily.
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..params()
        };
        let mut s = Sampler::new(&p, &[0, 1]);
        assert_eq!(s.sample(&[2.0, -1.0, 1.5]).expect("ok").token_id, 2);
        // Token 2 is now in the output too: 1.5 / 2 = 0.75 < 1.0 → token 0.
        assert_eq!(s.sample(&[2.0, -1.0, 1.5]).expect("ok").token_id, 0);
    }

    #[test]
    fn presence_and_frequency_penalties_count_output_tokens_only() {
        let p = SamplingParams {
            frequency_penalty: 0.6,
            presence_penalty: 0.5,
            ..params()
        };
        let mut s = Sampler::new(&p, &[0]); // the prompt does not count
        let row = [3.0, 2.0, 0.0];
        assert_eq!(s.sample(&row).expect("ok").token_id, 0); // 3.0
                                                             // Token 0 seen once: 3.0 - 0.6 - 0.5 = 1.9 < 2.0 → token 1.
        assert_eq!(s.sample(&row).expect("ok").token_id, 1);
        // Both seen once: 1.9 vs 0.9 → token 0; then token 0 twice: 3.0 - 1.2 - 0.5 = 1.3 > 0.9.
        assert_eq!(s.sample(&row).expect("ok").token_id, 0);
        assert_eq!(s.sample(&row).expect("ok").token_id, 0);
    }

    #[test]
    fn same_seed_same_tokens_and_distribution_is_respected() {
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(7),
            ..params()
        };
        let row = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let draws = |p: &SamplingParams| {
            let mut s = sampler(p.clone());
            (0..2000)
                .map(|_| s.sample(&row).expect("ok").token_id)
                .collect::<Vec<_>>()
        };
        let a = draws(&p);
        assert_eq!(a, draws(&p), "same seed, same tokens");
        assert_ne!(
            a,
            draws(&SamplingParams {
                seed: Some(8),
                ..p.clone()
            })
        );
        // p = [0.25, 0.75, 0]: expect ~1500 ones out of 2000, never token 2.
        let ones = a.iter().filter(|&&t| t == 1).count();
        assert!((1400..1600).contains(&ones), "{ones} ones");
        assert!(!a.contains(&2));
    }

    #[test]
    fn top_k_top_p_and_min_p_restrict_the_support() {
        // probs ∝ [8, 4, 2, 1, 1] (sum 16).
        let row: Vec<f32> = [8.0f32, 4.0, 2.0, 1.0, 1.0]
            .iter()
            .map(|x| x.ln())
            .collect();
        let support = |p: SamplingParams| {
            let mut s = sampler(SamplingParams {
                temperature: 1.0,
                seed: Some(1),
                ..p
            });
            let mut seen: Vec<u32> = (0..3000)
                .map(|_| s.sample(&row).expect("ok").token_id)
                .collect();
            seen.sort_unstable();
            seen.dedup();
            seen
        };
        assert_eq!(
            support(SamplingParams {
                top_k: 2,
                ..params()
            }),
            vec![0, 1]
        );
        // top_p 0.7: 8/16 = 0.5 < 0.7, 12/16 = 0.75 ≥ 0.7 → {0, 1}.
        assert_eq!(
            support(SamplingParams {
                top_p: 0.7,
                ..params()
            }),
            vec![0, 1]
        );
        // min_p 0.2: threshold 0.2 × 8 = 1.6 → {0, 1, 2}.
        assert_eq!(
            support(SamplingParams {
                min_p: 0.2,
                ..params()
            }),
            vec![0, 1, 2]
        );
        assert_eq!(support(params_t1()), vec![0, 1, 2, 3, 4]);
    }

    fn params_t1() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            ..params()
        }
    }

    #[test]
    fn top_p_over_a_large_vocab_uses_the_full_sort_when_needed() {
        // 1000 equal logits: the nucleus of 0.5 is 500 tokens, more than the partial prefix.
        let row = vec![0.0f32; 1000];
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            seed: Some(3),
            ..params()
        });
        let max = (0..4000)
            .map(|_| s.sample(&row).expect("ok").token_id)
            .max()
            .expect("some");
        assert!(
            (300..500).contains(&max),
            "support ends at id 499 (ties → lower ids), max seen {max}"
        );
    }

    #[test]
    fn logprobs_are_log_softmax_of_the_raw_row() {
        let p = SamplingParams {
            logprobs: Some(2),
            temperature: 0.0,
            repetition_penalty: 1.5,
            ..params()
        };
        let mut s = Sampler::new(&p, &[]);
        let row = [1.0f32, 3.0, 2.0];
        let out = s.sample(&row).expect("ok");
        let lse = (1f32.exp() + 3f32.exp() + 2f32.exp()).ln();
        assert_eq!(out.token_id, 1);
        assert!((out.logprob.expect("requested") - (3.0 - lse)).abs() < 1e-6);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((out.top[1].1 - (2.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn validation_names_the_field() {
        let e = validate(&SamplingParams {
            top_p: 0.0,
            ..params()
        })
        .unwrap_err();
        assert!(
            matches!(&e, EngineError::InvalidInput(m) if m.contains("top_p")),
            "{e}"
        );
        assert!(validate(&SamplingParams {
            temperature: -1.0,
            ..params()
        })
        .is_err());
        assert!(validate(&SamplingParams {
            max_tokens: Some(0),
            ..params()
        })
        .is_err());
        assert!(validate(&params()).is_ok());
    }
}
