//! The CUDA backend's logits and sampling: the lm_head GEMM writing f32 logits
//! ([`CudaLogits`]), raw-row downloads, and the host side of `kernels/sampling.cu`.
//!
//! A sampling call packs the rows' descriptors into four small arrays ([`pack_rows`]), uploads
//! them, runs one `sample_rows` block per row and copies back only the `(id, logprob)` pairs
//! (one D2H copy), which [`unpack`] turns into [`Sampled`] values. The kernel reproduces
//! [`crate::sampling::sample_row`] exactly; the packing here is what it reads.

use super::{check_len, dev_err, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::BackendError;
use crate::sampling::{SampleError, Sampled, SamplingRow};

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

/// Threads per block of `sample_rows`; must equal `SAMPLE_THREADS` in sampling.cu.
const SAMPLE_THREADS: u32 = 512;
/// i32 / f32 parameters per row (`iparams` / `fparams` strides in sampling.cu).
const PARAMS_PER_ROW: usize = 8;

/// f32 logits rows `[rows, vocab]` on the device.
#[derive(Debug)]
pub struct CudaLogits {
    data: CudaSlice<f32>,
    rows: usize,
    vocab: usize,
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

impl CudaBackend {
    /// `logits = x · wᵀ` with x and w in the compute dtype, accumulated and written in f32.
    pub(super) fn logits_f32(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
    ) -> Result<CudaLogits, BackendError> {
        check_len("logits input", x.len, rows * w.k)?;
        let mut data = self
            .stream
            .alloc_zeros::<f32>((rows * w.n).max(1))
            .map_err(dev_err)?;
        if rows > 0 {
            let (xp, _x_sync) = x.data.device_ptr(&self.stream);
            let (op, _o_sync) = data.device_ptr_mut(&self.stream);
            // SAFETY: x holds rows × k compute-dtype elements (checked above) and `data` rows × n
            // f32; the sync guards keep both in use on this stream for the call.
            unsafe { self.gemm_xwt(w, rows, xp, op, cublas_sys::cudaDataType::CUDA_R_32F) }?;
        }
        Ok(CudaLogits {
            data,
            rows,
            vocab: w.n,
        })
    }

    /// Rows `first_row ..` of `logits` into `dst` (whole rows).
    pub(super) fn download_logits_rows(
        &self,
        logits: &CudaLogits,
        first_row: usize,
        dst: &mut [f32],
    ) -> Result<(), BackendError> {
        let start = first_row * logits.vocab;
        if dst.is_empty() {
            return Ok(());
        }
        if !dst.len().is_multiple_of(logits.vocab) || start + dst.len() > logits.rows * logits.vocab
        {
            return Err(BackendError::InvalidArgument(format!(
                "logits rows {first_row}.. ({} values) of {} rows of {}",
                dst.len(),
                logits.rows,
                logits.vocab
            )));
        }
        let src = logits.data.slice(start..start + dst.len());
        self.stream.memcpy_dtoh(&src, dst).map_err(dev_err)?;
        self.stream.synchronize().map_err(dev_err)
    }

    /// Sample every `(row, descriptor)` on the device; see the module header.
    pub(super) fn sample_rows(
        &self,
        logits: &CudaLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let vocab = logits.vocab;
        let p = pack_rows(rows, logits.rows, vocab)?;
        let ip = self.stream.clone_htod(&p.iparams).map_err(dev_err)?;
        let fp = self.stream.clone_htod(&p.fparams).map_err(dev_err)?;
        let draws = self.stream.clone_htod(&p.draws).map_err(dev_err)?;
        let pens = if p.pens.is_empty() {
            self.stream.alloc_zeros::<i32>(3).map_err(dev_err)?
        } else {
            self.stream.clone_htod(&p.pens).map_err(dev_err)?
        };
        // SAFETY: uninitialized f32 scratch; the kernel writes each row's copy before reading it.
        let mut scratch =
            unsafe { self.stream.alloc::<f32>(rows.len() * vocab) }.map_err(dev_err)?;
        let mut out = self
            .stream
            .alloc_zeros::<i32>(2 * p.out_pairs)
            .map_err(dev_err)?;
        let f = self.func("sample_rows")?;
        let v = vocab as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(&logits.data)
            .arg(&v)
            .arg(&ip)
            .arg(&fp)
            .arg(&draws)
            .arg(&pens)
            .arg(&mut scratch)
            .arg(&mut out);
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: pack_rows checked every logits row index (< logits.rows) and laid out
        // 8 ints / 8 floats / 1 double per block, penalty ranges inside `pens`, and output
        // offsets whose pairs fit in `out` (2 × out_pairs ints); scratch holds rows × vocab f32.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        let mut host = vec![0i32; 2 * p.out_pairs];
        self.stream.memcpy_dtoh(&out, &mut host).map_err(dev_err)?;
        self.stream.synchronize().map_err(dev_err)?;
        Ok(unpack(&host, &p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Penalty;

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
