//! Per-request token sampling: penalties, temperature, top-k / top-p / min-p, a seeded RNG,
//! and log-probabilities.
//!
//! Each request owns a [`Sampler`]. Its RNG is seeded from `SamplingParams::seed` (or from a
//! random seed) and is drawn exactly once per sampled token, never shared, so a request's tokens
//! depend only on its own logits rows and seed: the same seed gives the same tokens alone or in
//! any batch (given batch-invariant logits). Greedy sampling does not touch the RNG.
//!
//! Order of operations on one logits row (`[vocab]` f32):
//! 1. log-probabilities, when requested: log-softmax of the RAW row (temperature 1, no penalty);
//! 2. repetition penalty (Hugging Face): for each distinct token of prompt + output, a positive
//!    logit is divided by the penalty, a negative one multiplied;
//! 3. presence / frequency penalties (OpenAI): `logit -= frequency × count + presence × (count > 0)`
//!    over output tokens;
//! 4. greedy → argmax (lowest id on ties); otherwise divide by temperature, keep the `top_k`
//!    largest, softmax, keep the smallest most-likely set reaching `top_p`, drop tokens below
//!    `min_p × max probability` (the order of Hugging Face's logits warpers), and draw.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::engine::request::SamplingParams;
use crate::error::EngineError;

/// Candidates examined before falling back to a full sort when applying `top_p`.
const TOP_P_PARTIAL: usize = 128;

/// One sampled token with its log-probability information.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The chosen token.
    pub token_id: u32,
    /// Its log-probability under the raw distribution, when logprobs were requested.
    pub logprob: Option<f32>,
    /// The most likely alternatives `(token, logprob)`, most likely first (`logprobs` of them).
    pub top: Vec<(u32, f32)>,
}

/// Sampling state of one request.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Distinct prompt + output tokens (only kept when the repetition penalty is on).
    seen: HashSet<u32>,
    /// Output token counts (only kept when presence / frequency penalties are on).
    output_counts: HashMap<u32, u32>,
    /// Scratch row, reused across steps.
    scratch: Vec<f32>,
    /// Scratch candidate ids, reused across steps.
    candidates: Vec<u32>,
}

impl Sampler {
    /// A sampler for a request with prompt `prompt_ids`. Parameters must have passed
    /// [`validate`].
    pub fn new(params: &SamplingParams, prompt_ids: &[u32]) -> Sampler {
        let seed = params.seed.unwrap_or_else(rand::random);
        let seen = if params.repetition_penalty != 1.0 {
            prompt_ids.iter().copied().collect()
        } else {
            HashSet::new()
        };
        Sampler {
            params: params.clone(),
            rng: StdRng::seed_from_u64(seed),
            seen,
            output_counts: HashMap::new(),
            scratch: Vec::new(),
            candidates: Vec::new(),
        }
    }

    /// Pick the next token from a logits row (`[vocab]`).
    pub fn sample(&mut self, logits: &[f32]) -> Result<Sampled, EngineError> {
        let (logprob_of, top) = match self.params.logprobs {
            Some(n) => {
                let lse = log_sum_exp(logits)?;
                (Some(lse), top_logprobs(logits, n as usize, lse))
            }
            None => (None, Vec::new()),
        };
        self.scratch.clear();
        self.scratch.extend_from_slice(logits);
        self.apply_penalties();
        let token_id = if self.params.is_greedy() {
            argmax(&self.scratch)?
        } else {
            self.draw()?
        };
        self.accept(token_id);
        Ok(Sampled {
            token_id,
            logprob: logprob_of.map(|lse| logits[token_id as usize] - lse),
            top,
        })
    }

    /// Record a generated token for the penalties.
    fn accept(&mut self, token: u32) {
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token);
        }
        if self.params.presence_penalty != 0.0 || self.params.frequency_penalty != 0.0 {
            *self.output_counts.entry(token).or_insert(0) += 1;
        }
    }

    fn apply_penalties(&mut self) {
        let row = &mut self.scratch;
        let rep = self.params.repetition_penalty;
        if rep != 1.0 {
            for &t in &self.seen {
                if let Some(l) = row.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / rep } else { *l * rep };
                }
            }
        }
        let (presence, frequency) = (self.params.presence_penalty, self.params.frequency_penalty);
        if presence != 0.0 || frequency != 0.0 {
            for (&t, &c) in &self.output_counts {
                if let Some(l) = row.get_mut(t as usize) {
                    *l -= frequency * c as f32 + presence;
                }
            }
        }
    }

    /// Temperature, top-k, top-p, min-p, then one RNG draw.
    fn draw(&mut self) -> Result<u32, EngineError> {
        let p = &self.params;
        let row = &mut self.scratch;
        let inv_t = 1.0 / p.temperature;
        let max = row
            .iter()
            .copied()
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return Err(EngineError::Internal(
                "logits row has no finite value".into(),
            ));
        }
        // Unnormalized probabilities exp((l - max) / T) in place; the max maps to 1.
        for l in row.iter_mut() {
            *l = if l.is_nan() {
                0.0
            } else {
                ((*l - max) * inv_t).exp()
            };
        }
        let vocab = row.len();
        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(0..vocab as u32);
        // Descending probability, ties → lower id: a total order, so the result is deterministic.
        let by_prob = |a: &u32, b: &u32| {
            row[*b as usize]
                .total_cmp(&row[*a as usize])
                .then_with(|| a.cmp(b))
        };
        if p.top_k > 0 && (p.top_k as usize) < vocab {
            let k = p.top_k as usize;
            cands.select_nth_unstable_by(k - 1, by_prob);
            cands.truncate(k);
        }
        if p.top_p < 1.0 {
            let total: f64 = cands.iter().map(|&t| row[t as usize] as f64).sum();
            let target = p.top_p as f64 * total;
            // Sort a short head first; sort everything only if the nucleus is larger than it.
            let head_len = TOP_P_PARTIAL.min(cands.len());
            select_top(cands, head_len, by_prob);
            let head: f64 = cands[..head_len]
                .iter()
                .map(|&t| row[t as usize] as f64)
                .sum();
            if head < target {
                let n = cands.len();
                select_top(cands, n, by_prob);
            }
            let mut cum = 0.0;
            let mut keep = cands.len();
            for (i, &t) in cands.iter().enumerate() {
                cum += row[t as usize] as f64;
                if cum >= target {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep);
        }
        if p.min_p > 0.0 {
            // The max probability of the candidates is 1 (unnormalized); ratio is scale-free.
            let best = cands
                .iter()
                .map(|&t| row[t as usize])
                .fold(0.0f32, f32::max);
            let threshold = p.min_p * best;
            cands.retain(|&t| row[t as usize] >= threshold);
        }
        let total: f64 = cands.iter().map(|&t| row[t as usize] as f64).sum();
        if total.is_nan() || total <= 0.0 {
            return Err(EngineError::Internal(
                "sampling distribution is empty".into(),
            ));
        }
        let r: f64 = self.rng.random::<f64>() * total;
        let mut cum = 0.0;
        for &t in cands.iter() {
            cum += row[t as usize] as f64;
            if r < cum {
                return Ok(t);
            }
        }
        // Rounding left r at the very top: the last candidate with any mass.
        Ok(*cands
            .iter()
            .rev()
            .find(|&&t| row[t as usize] > 0.0)
            .unwrap_or(&cands[0]))
    }
}

/// Reorder `cands` so that its first `n` entries are the `n` smallest under `cmp`, sorted.
fn select_top(cands: &mut [u32], n: usize, cmp: impl Fn(&u32, &u32) -> Ordering + Copy) {
    if n == 0 {
        return;
    }
    if n < cands.len() {
        cands.select_nth_unstable_by(n - 1, cmp);
    }
    cands[..n].sort_unstable_by(cmp);
}

/// Index of the largest logit (lowest index on ties; NaN ignored).
pub fn argmax(row: &[f32]) -> Result<u32, EngineError> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in row.iter().enumerate() {
        if !l.is_nan() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
        .ok_or_else(|| EngineError::Internal("logits row is empty or all NaN".into()))
}

/// `log Σ exp(row)` computed stably.
fn log_sum_exp(row: &[f32]) -> Result<f32, EngineError> {
    let max = row
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return Err(EngineError::Internal(
            "logits row has no finite value".into(),
        ));
    }
    let sum: f64 = row
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| ((l - max) as f64).exp())
        .sum();
    Ok(max + sum.ln() as f32)
}

/// The `n` most likely tokens with their log-probabilities, most likely first (ties: lower id).
fn top_logprobs(row: &[f32], n: usize, lse: f32) -> Vec<(u32, f32)> {
    let n = n.min(row.len());
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    select_top(&mut idx, n, |a, b| {
        row[*b as usize]
            .total_cmp(&row[*a as usize])
            .then_with(|| a.cmp(b))
    });
    idx[..n]
        .iter()
        .map(|&t| (t, row[t as usize] - lse))
        .collect()
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
        assert!(argmax(&[f32::NAN, f32::NAN]).is_err());
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
