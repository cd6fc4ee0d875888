//! The CPU backend's logits-side ops: the lm_head product into f32 logits rows (a matmul), raw
//! logits rows to the host, sampling each row on the backend's threads (exactly
//! [`crate::sampling::sample_row`]), and feeding sampled ids into the next step's tokens. The
//! [`Backend`] methods of the same names forward here.

// The CPU backend's buffers are `Vec<f32>` (`Backend::Buffer`): these take what the trait
// methods take and hand them on.
#![allow(clippy::ptr_arg)]

use super::{check_len, CpuBackend, CpuLogits, CpuWeight};
use crate::backend::{Backend, BackendError, StepInput};
use crate::sampling::{sample_row, SampleError, Sampled, SamplingRow};

pub(super) fn download_logits(
    logits: &CpuLogits,
    first_row: usize,
    dst: &mut [f32],
) -> Result<(), BackendError> {
    let start = first_row * logits.vocab;
    let src = logits.data.get(start..start + dst.len()).ok_or_else(|| {
        BackendError::InvalidArgument(format!(
            "logits rows {first_row}.. ({} values) of {} values",
            dst.len(),
            logits.data.len()
        ))
    })?;
    dst.copy_from_slice(src);
    Ok(())
}

pub(super) fn feed_tokens(
    step: &mut StepInput,
    from: &Vec<Result<Sampled, SampleError>>,
    feeds: &[(u32, u32)],
) -> Result<(), BackendError> {
    for &(t, r) in feeds {
        let id = match from.get(r as usize) {
            Some(Ok(s)) => s.token_id,
            Some(Err(_)) => 0,
            None => {
                return Err(BackendError::InvalidArgument(format!(
                    "feed from sampling row {r} of {}",
                    from.len()
                )))
            }
        };
        let len = step.token_ids.len();
        let slot = step.token_ids.get_mut(t as usize).ok_or_else(|| {
            BackendError::InvalidArgument(format!("fed token {t} of a step of {len} tokens"))
        })?;
        *slot = id;
    }
    Ok(())
}

pub(super) fn sample(
    be: &CpuBackend,
    logits: &CpuLogits,
    rows: &[(usize, &SamplingRow)],
) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
    use rayon::prelude::*;
    let vocab = logits.vocab;
    let n_rows = logits.data.len() / vocab.max(1);
    if let Some((r, _)) = rows.iter().find(|(r, _)| *r >= n_rows) {
        return Err(BackendError::InvalidArgument(format!(
            "sample row {r} of {n_rows} logits rows"
        )));
    }
    // Rows are independent; each is the pure function on its own row.
    Ok(be.pool.install(|| {
        rows.par_iter()
            .map(|&(r, desc)| sample_row(&logits.data[r * vocab..(r + 1) * vocab], desc))
            .collect()
    }))
}

pub(super) fn logits(
    be: &CpuBackend,
    x: &Vec<f32>,
    rows: usize,
    w: &CpuWeight,
) -> Result<CpuLogits, BackendError> {
    let mut data = be.alloc(rows * w.shape[0])?;
    be.matmul(x, rows, w, &mut data)?;
    Ok(CpuLogits {
        data,
        vocab: w.shape[0],
    })
}

pub(super) fn alloc_logits(
    be: &CpuBackend,
    rows: usize,
    vocab: usize,
) -> Result<CpuLogits, BackendError> {
    Ok(CpuLogits {
        data: be.alloc(rows * vocab)?,
        vocab,
    })
}

pub(super) fn logits_into(
    be: &CpuBackend,
    x: &Vec<f32>,
    rows: usize,
    w: &CpuWeight,
    out: &mut CpuLogits,
) -> Result<(), BackendError> {
    let n = rows * w.shape[0];
    check_len("logits output", out.data.capacity(), n)?;
    // Within the capacity: no allocation. The rows are exactly `rows` afterwards.
    out.data.resize(n, 0.0);
    out.vocab = w.shape[0];
    be.matmul(x, rows, w, &mut out.data)
}
