//! The host side of `kernels/sampling.cu`'s input and output: the rows' descriptors packed into
//! the arrays `sample_rows` reads ([`pack_rows`]: parameters, uniforms, penalty entries, output
//! offsets), the `(id, logprob)` pairs it writes turned back into [`Sampled`] values
//! ([`unpack`]), and which rows the greedy fast path answers ([`is_plain_greedy`]). Pure host
//! code (tested here without a GPU).

use crate::backend::BackendError;
use crate::sampling::{SampleError, Sampled, SamplingRow};

/// i32 / f32 parameters per row (`iparams` / `fparams` strides in sampling.cu).
const PARAMS_PER_ROW: usize = 8;

/// Whether `d` is answered by the argmax alone: greedy, no logprobs, and every penalty neutral
/// (repetition 1, presence 0, frequency 0 leave each logit bit for bit as it is).
pub(crate) fn is_plain_greedy(d: &SamplingRow) -> bool {
    d.inv_temperature().is_none()
        && d.logprobs.is_none()
        && (d.penalties.is_empty()
            || (d.repetition_penalty == 1.0
                && d.presence_penalty == 0.0
                && d.frequency_penalty == 0.0))
}

/// `v` rounded up to a multiple of 8.
pub(super) fn align8(v: usize) -> usize {
    v.div_ceil(8) * 8
}

/// Descriptors laid out as `sample_rows` reads them (see the header of sampling.cu).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PackedRows {
    /// `[rows, 8]`: logits row, top_k, greedy, penalty start, penalty end, logprobs N (-1 off),
    /// output offset in pairs, unused.
    pub(crate) iparams: Vec<i32>,
    /// `[rows, 8]`: 1/temperature, top_p, min_p, repetition, presence, frequency, unused ×2.
    pub(crate) fparams: Vec<f32>,
    /// `[rows]`: the uniforms (0 when greedy).
    pub(crate) draws: Vec<f64>,
    /// `[entries, 3]`: token, repeated, count.
    pub(crate) pens: Vec<i32>,
    /// Pairs of output per row start at `offsets[r]`; `logprobs[r]` is its N, when requested.
    pub(crate) offsets: Vec<usize>,
    pub(crate) logprobs: Vec<Option<usize>>,
    /// Total output pairs.
    pub(crate) out_pairs: usize,
}

/// Lay out `rows` (logits row, descriptor) for logits of `n_rows` rows of `vocab` tokens.
pub(crate) fn pack_rows(
    rows: &[(usize, &SamplingRow)],
    n_rows: usize,
    vocab: usize,
) -> Result<PackedRows, BackendError> {
    let bad = |m: String| Err(BackendError::InvalidArgument(m));
    if vocab == 0 || vocab > i32::MAX as usize {
        return bad(format!("sampling over a vocabulary of {vocab}"));
    }
    let mut p = PackedRows {
        iparams: Vec::with_capacity(rows.len() * PARAMS_PER_ROW),
        fparams: Vec::with_capacity(rows.len() * PARAMS_PER_ROW),
        draws: Vec::with_capacity(rows.len()),
        pens: Vec::new(),
        offsets: Vec::with_capacity(rows.len()),
        logprobs: Vec::with_capacity(rows.len()),
        out_pairs: 0,
    };
    for &(row, d) in rows {
        if row >= n_rows {
            return bad(format!("sample row {row} of {n_rows} logits rows"));
        }
        if d.penalties.windows(2).any(|w| w[0].token >= w[1].token) {
            return bad("penalty entries must be distinct and in ascending token order".into());
        }
        let pen_start = p.pens.len() / 3;
        for e in &d.penalties {
            // Ids past i32 are outside any vocabulary: the kernel skips negative ids too.
            p.pens.push(i32::try_from(e.token).unwrap_or(-1));
            p.pens.push(e.repeated as i32);
            p.pens.push(e.count.min(i32::MAX as u32) as i32);
        }
        let inv_t = d.inv_temperature();
        let top_k = if d.top_k > 0 && (d.top_k as usize) < vocab {
            d.top_k as i32
        } else {
            0
        };
        let n_logprobs = d.logprobs.map(|n| (n as usize).min(vocab));
        p.offsets.push(p.out_pairs);
        p.iparams.extend_from_slice(&[
            row as i32,
            top_k,
            inv_t.is_none() as i32,
            pen_start as i32,
            (p.pens.len() / 3) as i32,
            n_logprobs.map_or(-1, |n| n as i32),
            p.out_pairs as i32,
            0,
        ]);
        p.fparams.extend_from_slice(&[
            inv_t.unwrap_or(0.0),
            d.top_p,
            d.min_p,
            d.repetition_penalty,
            d.presence_penalty,
            d.frequency_penalty,
            0.0,
            0.0,
        ]);
        p.draws.push(if inv_t.is_some() {
            d.draw.unwrap_or(0.0)
        } else {
            0.0
        });
        p.out_pairs += 1 + n_logprobs.unwrap_or(0);
        p.logprobs.push(n_logprobs);
    }
    if p.out_pairs > i32::MAX as usize || p.pens.len() / 3 > i32::MAX as usize {
        return bad(format!("{} output pairs in one sampling call", p.out_pairs));
    }
    Ok(p)
}

/// The kernel's `(id, logprob bits)` pairs back to one result per row.
pub(crate) fn unpack(out: &[i32], p: &PackedRows) -> Vec<Result<Sampled, SampleError>> {
    let pair = |k: usize| (out[2 * k], f32::from_bits(out[2 * k + 1] as u32));
    p.offsets
        .iter()
        .zip(&p.logprobs)
        .map(|(&at, &n)| {
            let (id, lp) = pair(at);
            if id < 0 {
                return Err(SampleError::NoFiniteLogit);
            }
            Ok(Sampled {
                token_id: id as u32,
                logprob: n.map(|_| lp),
                top: (0..n.unwrap_or(0))
                    .map(|j| {
                        let (t, l) = pair(at + 1 + j);
                        (t as u32, l)
                    })
                    .collect(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Penalty;

    #[test]
    fn only_plain_greedy_rows_take_the_argmax_fast_path() {
        let pen = Penalty {
            token: 3,
            repeated: true,
            count: 1,
        };
        assert!(is_plain_greedy(&SamplingRow::greedy()));
        // Penalties that leave every logit as it is keep the fast path.
        let neutral = SamplingRow {
            penalties: vec![pen],
            ..SamplingRow::greedy()
        };
        assert!(is_plain_greedy(&neutral));
        for row in [
            SamplingRow {
                logprobs: Some(0),
                ..SamplingRow::greedy()
            },
            SamplingRow {
                temperature: 0.7,
                draw: Some(0.5),
                ..SamplingRow::greedy()
            },
            SamplingRow {
                repetition_penalty: 1.2,
                ..neutral.clone()
            },
            SamplingRow {
                presence_penalty: 0.5,
                ..neutral.clone()
            },
            SamplingRow {
                frequency_penalty: 0.5,
                ..neutral.clone()
            },
        ] {
            assert!(!is_plain_greedy(&row), "{row:?}");
        }
        // A temperature without a draw is greedy (sample_row's rule), so it takes the fast path.
        assert!(is_plain_greedy(&SamplingRow {
            temperature: 0.7,
            ..SamplingRow::greedy()
        }));
    }

    #[test]
    fn packing_lays_out_params_penalties_and_output_pairs() {
        let a = SamplingRow {
            temperature: 0.5,
            top_k: 100,
            top_p: 0.9,
            logprobs: Some(3),
            repetition_penalty: 1.2,
            penalties: vec![
                Penalty {
                    token: 4,
                    repeated: true,
                    count: 0,
                },
                Penalty {
                    token: 9,
                    repeated: false,
                    count: 2,
                },
            ],
            draw: Some(0.25),
            ..SamplingRow::greedy()
        };
        let g = SamplingRow {
            logprobs: Some(0),
            draw: Some(0.7), // temperature 0: greedy, the draw is dropped
            ..SamplingRow::greedy()
        };
        let p = pack_rows(&[(2, &a), (0, &g), (1, &SamplingRow::greedy())], 3, 50).unwrap();
        assert_eq!(&p.iparams[..8], &[2, 0, 0, 0, 2, 3, 0, 0]); // top_k 100 ≥ vocab: off
        assert_eq!(&p.iparams[8..16], &[0, 0, 1, 2, 2, 0, 4, 0]);
        assert_eq!(&p.iparams[16..], &[1, 0, 1, 2, 2, -1, 5, 0]);
        assert_eq!(p.fparams[0], 2.0);
        assert_eq!(p.fparams[1], 0.9);
        assert_eq!(p.fparams[3], 1.2);
        assert_eq!(p.draws, vec![0.25, 0.0, 0.0]);
        assert_eq!(p.pens, vec![4, 1, 0, 9, 0, 2]);
        assert_eq!(p.out_pairs, 6);
        // Kernel output: row 0 token 7 with 3 alternatives, row 1 token 1, row 2 failed.
        let lp = |x: f32| x.to_bits() as i32;
        let out = [
            7,
            lp(-0.5),
            7,
            lp(-0.5),
            3,
            lp(-1.0),
            8,
            lp(-2.0),
            1,
            lp(-0.1),
            -1,
            0,
        ];
        let r = unpack(&out, &p);
        assert_eq!(
            r[0],
            Ok(Sampled {
                token_id: 7,
                logprob: Some(-0.5),
                top: vec![(7, -0.5), (3, -1.0), (8, -2.0)],
            })
        );
        assert_eq!(
            r[1],
            Ok(Sampled {
                token_id: 1,
                logprob: Some(-0.1),
                top: vec![],
            })
        );
        assert_eq!(r[2], Err(SampleError::NoFiniteLogit));
        assert!(pack_rows(&[(3, &a)], 3, 50).is_err());
        let unsorted = SamplingRow {
            penalties: vec![a.penalties[1], a.penalties[0]],
            ..a.clone()
        };
        assert!(pack_rows(&[(0, &unsorted)], 3, 50).is_err());
    }
}
