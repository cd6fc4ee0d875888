//! The pure per-row sampling function: a [`SamplingRow`] descriptor applied to one f32 logits
//! row gives a [`Sampled`] token. No state: the per-request state (seeded RNG, seen tokens,
//! output counts) lives in the engine's `Sampler` (`engine::sampler`, a layer above), which
//! builds the descriptor each step. Backends run this function (the CPU backend calls [`sample_row`]; the CUDA backend
//! reproduces it bit for bit in `kernels/sampling.cu`).
//!
//! Order of operations on a row `l` (`[vocab]` f32):
//! 1. NaN logits count as `-inf` everywhere, and `-0.0` as `+0.0` (so the order below is total);
//! 2. log-probabilities, when requested: log-softmax of the RAW row `l` (temperature 1, no
//!    penalty); the top-N alternatives in rank order (rank: larger logit first, lower id on ties);
//! 3. penalties on a copy `z` of the row, per [`Penalty`] entry: the Hugging Face repetition
//!    penalty (a positive logit is divided by it, a non-positive one multiplied), then the OpenAI
//!    presence / frequency penalties `z -= frequency × count + presence` when `count > 0`;
//! 4. the largest `z` must be finite, else the row fails ([`SampleError::NoFiniteLogit`]);
//! 5. greedy (no draw): the first token by rank of `z` (argmax, lowest id on ties);
//! 6. otherwise probabilities `p = exp_det((z − max z) / T)` (the top token has `p = 1`) and
//!    integer masses `m = ⌊p · 2^40⌋`; keep the `top_k` first tokens by rank of `z`; of those,
//!    keep the shortest rank prefix whose mass reaches `⌈top_p · Σm⌉`; drop tokens with
//!    `p < min_p` (`min_p` × the top probability, which is 1); then draw with the descriptor's
//!    uniform `u ∈ [0, 1)`: `r = min(⌊u · M⌋, M − 1)` with `M` the kept mass, and the token is the
//!    smallest kept id whose cumulative kept mass, in token-id order, exceeds `r`.
//!
//! Everything in step 6 is exactly reproducible on any IEEE device: `exp_det` uses only correctly
//! rounded f32 `+ − ×` (no fused multiply-add), masses are integers (their sums do not depend on
//! the summation order), and the thresholds are comparisons of those. So the CPU and the GPU draw
//! the same token from the same row and `u`, and batching cannot change a seeded result.

/// Fixed-point scale of the integer masses: `m = ⌊p · 2^40⌋` (at most 2^40 per token, so sums
/// over vocabularies up to 2^23 tokens fit in a `u64`).
pub const MASS_SCALE: f32 = 1_099_511_627_776.0;

/// One penalized token of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Penalty {
    /// The token id (ids outside the vocabulary are ignored).
    pub token: u32,
    /// In prompt or output: the repetition penalty applies.
    pub repeated: bool,
    /// Times generated so far: presence / frequency penalties apply when > 0.
    pub count: u32,
}

/// How to sample one row: plain data, built by the request's sampler for one step.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingRow {
    /// Temperature (> 0; ignored when greedy).
    pub temperature: f32,
    /// Keep the `top_k` first tokens by rank; 0 disables.
    pub top_k: u32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Minimum probability relative to the top one, in [0, 1]; 0 disables.
    pub min_p: f32,
    /// Hugging Face repetition penalty (> 0; 1 is none).
    pub repetition_penalty: f32,
    /// OpenAI presence penalty.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty.
    pub frequency_penalty: f32,
    /// The penalized tokens, distinct, in ascending id order.
    pub penalties: Vec<Penalty>,
    /// Return the sampled token's log-probability and this many top alternatives.
    pub logprobs: Option<u32>,
    /// The uniform draw in `[0, 1)`; `None` means greedy (so does a temperature whose inverse is
    /// not a positive finite f32, see [`SamplingRow::inv_temperature`]).
    pub draw: Option<f64>,
}

impl SamplingRow {
    /// `1 / temperature` when this row draws (a draw is given and `1 / temperature` is a
    /// positive finite f32); `None` means greedy.
    pub fn inv_temperature(&self) -> Option<f32> {
        let inv_t = 1.0 / self.temperature;
        (self.draw.is_some() && inv_t > 0.0 && inv_t.is_finite()).then_some(inv_t)
    }

    /// Greedy decoding without penalties or logprobs.
    pub fn greedy() -> SamplingRow {
        SamplingRow {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalties: Vec::new(),
            logprobs: None,
            draw: None,
        }
    }
}

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

/// Why a row could not be sampled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    /// The row (raw for logprobs, or penalized) has no finite maximum: NaN, ±inf or empty.
    #[error("the logits row has no finite maximum (NaN or infinite logits)")]
    NoFiniteLogit,
}

impl From<SampleError> for crate::error::EngineError {
    fn from(e: SampleError) -> Self {
        crate::error::EngineError::Internal(e.to_string())
    }
}

/// NaN → `-inf`, `-0.0` → `+0.0`; every other value unchanged.
#[inline]
pub fn canonical(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x + 0.0
    }
}

/// An order-preserving `u32` key of a canonical (non-NaN) f32: `a < b ⇔ key(a) < key(b)`.
#[inline]
pub fn order_key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The rank key of token `id` with canonical logit `x`: larger means ranked earlier (larger
/// logit first, lower id on ties). Distinct for distinct ids.
#[inline]
pub fn rank_key(x: f32, id: u32) -> u64 {
    ((order_key(x) as u64) << 32) | (u32::MAX - id) as u64
}

/// The constants of [`exp_det`] as f32 bit patterns, shared verbatim with sampling.cu:
/// log2(e), ln2 split high/low (Cody–Waite: `k · LN2_HI` is exact for |k| < 2^15), and the
/// Taylor coefficients 1/7! … 1/3! of e^r.
const EXP_LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
const EXP_LN2_HI: f32 = f32::from_bits(0x3f31_8000);
const EXP_LN2_LO: f32 = f32::from_bits(0xb95e_8083);
const EXP_C7: f32 = f32::from_bits(0x3950_0d01);
const EXP_C6: f32 = f32::from_bits(0x3ab6_0b61);
const EXP_C5: f32 = f32::from_bits(0x3c08_8889);
const EXP_C4: f32 = f32::from_bits(0x3d2a_aaab);
const EXP_C3: f32 = f32::from_bits(0x3e2a_aaab);

/// `e^x` for `x ≤ 0`, from correctly rounded f32 `+ − ×` only, so every IEEE device computes
/// the same bits (the CUDA kernel mirrors it with `__fmul_rn` / `__fadd_rn`). `x < -80` (and
/// NaN) gives 0. Accurate to a few ulp; `exp_det(0) = 1` exactly.
#[inline]
pub fn exp_det(x: f32) -> f32 {
    if x.is_nan() || x < -80.0 {
        return 0.0;
    }
    // x = k·ln2 + r, |r| ≲ ln2/2.
    let k = (x * EXP_LOG2E).round();
    let r = (x - k * EXP_LN2_HI) - k * EXP_LN2_LO;
    let mut p = EXP_C7;
    p = p * r + EXP_C6;
    p = p * r + EXP_C5;
    p = p * r + EXP_C4;
    p = p * r + EXP_C3;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // k ∈ [-116, 0]: 2^k is a normal f32.
    p * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// The integer mass of probability `p` (see [`MASS_SCALE`]).
#[inline]
pub fn mass(p: f32) -> u64 {
    (p * MASS_SCALE) as u64
}

/// Apply `row` to one logits row (`[vocab]` f32).
pub fn sample_row(logits: &[f32], row: &SamplingRow) -> Result<Sampled, SampleError> {
    let (lse, top) = match row.logprobs {
        Some(n) => {
            let lse = log_sum_exp(logits)?;
            (Some(lse), top_logprobs(logits, n as usize, lse))
        }
        None => (None, Vec::new()),
    };
    let mut z: Vec<f32> = logits.iter().map(|&l| canonical(l)).collect();
    apply_penalties(&mut z, row);
    let (best, zmax) = argmax(&z).ok_or(SampleError::NoFiniteLogit)?;
    if !zmax.is_finite() {
        return Err(SampleError::NoFiniteLogit);
    }
    let token_id = match (row.draw, row.inv_temperature()) {
        (Some(u), Some(inv_t)) => draw(&z, zmax, inv_t, row, u).unwrap_or(best),
        _ => best,
    };
    Ok(Sampled {
        token_id,
        logprob: lse.map(|lse| canonical(logits[token_id as usize]) - lse),
        top,
    })
}

/// Step 3 of the module order, in place on the canonical copy.
fn apply_penalties(z: &mut [f32], row: &SamplingRow) {
    let rep = row.repetition_penalty;
    for p in &row.penalties {
        let Some(l) = z.get_mut(p.token as usize) else {
            continue;
        };
        if p.repeated {
            *l = if *l > 0.0 { *l / rep } else { *l * rep };
        }
        if p.count > 0 {
            *l -= row.frequency_penalty * p.count as f32 + row.presence_penalty;
        }
        *l = canonical(*l);
    }
}

/// The first token by rank and its value; `None` for an empty row.
fn argmax(z: &[f32]) -> Option<(u32, f32)> {
    let best = z
        .iter()
        .enumerate()
        .map(|(i, &x)| rank_key(x, i as u32))
        .max()?;
    let id = u32::MAX - best as u32;
    Some((id, z[id as usize]))
}

/// Step 6 of the module order: temperature, top_k, top_p, min_p and the draw. `None` cannot
/// happen (the top token, `p = 1`, is always kept); the caller falls back to it anyway.
fn draw(z: &[f32], zmax: f32, inv_t: f32, row: &SamplingRow, u: f64) -> Option<u32> {
    let p: Vec<f32> = z.iter().map(|&x| exp_det((x - zmax) * inv_t)).collect();
    let key = |t: u32| rank_key(z[t as usize], t);
    let vocab = z.len();
    let mut cands: Vec<u32> = (0..vocab as u32).collect();
    // Descending rank key: a total order, so the kept sets are deterministic.
    let by_rank = |a: &u32, b: &u32| key(*b).cmp(&key(*a));
    if row.top_k > 0 && (row.top_k as usize) < vocab {
        let k = row.top_k as usize;
        cands.select_nth_unstable_by(k - 1, by_rank);
        cands.truncate(k);
    }
    if row.top_p < 1.0 {
        let total: u64 = cands.iter().map(|&t| mass(p[t as usize])).sum();
        let need = top_p_need(row.top_p, total);
        // Sort a short head first; sort everything only if the nucleus is larger than it.
        let head_len = TOP_P_PARTIAL.min(cands.len());
        select_top(&mut cands, head_len, by_rank);
        let head: u64 = cands[..head_len].iter().map(|&t| mass(p[t as usize])).sum();
        if head < need {
            let n = cands.len();
            select_top(&mut cands, n, by_rank);
        }
        let mut cum = 0u64;
        let mut keep = cands.len();
        for (i, &t) in cands.iter().enumerate() {
            cum += mass(p[t as usize]);
            if cum >= need {
                keep = i + 1;
                break;
            }
        }
        cands.truncate(keep);
    }
    if row.min_p > 0.0 {
        cands.retain(|&t| p[t as usize] >= row.min_p);
    }
    cands.sort_unstable();
    let total: u64 = cands.iter().map(|&t| mass(p[t as usize])).sum();
    let r = draw_target(u, total);
    let mut cum = 0u64;
    for &t in &cands {
        cum += mass(p[t as usize]);
        if cum > r {
            return Some(t);
        }
    }
    None
}

/// Candidates examined before falling back to a full sort when applying `top_p`.
const TOP_P_PARTIAL: usize = 128;

/// The mass the nucleus must reach: `⌈top_p · total⌉` in f64, clamped to `1..=total`.
pub fn top_p_need(top_p: f32, total: u64) -> u64 {
    ((top_p as f64 * total as f64).ceil() as u64).clamp(1, total.max(1))
}

/// The draw's target in `0..total`: `min(⌊u · total⌋, total − 1)` in f64.
pub fn draw_target(u: f64, total: u64) -> u64 {
    ((u * total as f64) as u64).min(total.saturating_sub(1))
}

/// Reorder `cands` so that its first `n` entries are the `n` smallest under `cmp`, sorted.
fn select_top(cands: &mut [u32], n: usize, cmp: impl Fn(&u32, &u32) -> std::cmp::Ordering + Copy) {
    if n == 0 {
        return;
    }
    if n < cands.len() {
        cands.select_nth_unstable_by(n - 1, cmp);
    }
    cands[..n].sort_unstable_by(cmp);
}

/// `log Σ exp(row)` of the canonical row, computed stably (f64 sum).
fn log_sum_exp(row: &[f32]) -> Result<f32, SampleError> {
    let max = row
        .iter()
        .map(|&l| canonical(l))
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return Err(SampleError::NoFiniteLogit);
    }
    let sum: f64 = row
        .iter()
        .map(|&l| ((canonical(l) - max) as f64).exp())
        .sum();
    Ok(max + sum.ln() as f32)
}

/// The `n` first tokens by rank of the raw row with their log-probabilities.
fn top_logprobs(row: &[f32], n: usize, lse: f32) -> Vec<(u32, f32)> {
    let n = n.min(row.len());
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let key = |t: u32| rank_key(canonical(row[t as usize]), t);
    select_top(&mut idx, n, |a, b| key(*b).cmp(&key(*a)));
    idx[..n]
        .iter()
        .map(|&t| (t, canonical(row[t as usize]) - lse))
        .collect()
}

#[cfg(test)]
mod tests;
