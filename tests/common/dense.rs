//! Helpers of the dense-matmul GPU tests (`cuda_dense`, `cuda_dense_gemm`, `cuda_dense_mid`,
//! `cuda_fused_invariance`): 16-bit weights uploaded without an f32 copy, f32 weights, an f32
//! residual stream, one SmolLM2-shaped llama layer, and a decode batch of one token per
//! sequence.

use kiln::backend::cuda::{CudaBackend, MmaKernel, MmaOut};
use kiln::backend::Backend;
use kiln::model::step::{ForwardBatch, LogitsFor, SeqSlice};
use kiln::tensor::{TensorView, WeightDType};

use super::data;

pub type Buf = <CudaBackend as Backend>::Buffer;
pub type Weight = <CudaBackend as Backend>::Weight;

/// The 16-bit bits (`dtype` bf16 or fp16) of an [n, k] matrix of pseudo-random values in
/// [-1, 1): a block of 1 000 003 values (prime, so no tile or row sees a repeating pattern)
/// repeated over the matrix.
pub fn host16(dtype: &str, n: usize, k: usize, seed: u64) -> Vec<u16> {
    let block = data(1_000_003, seed);
    let conv: Vec<u16> = block
        .iter()
        .map(|&v| {
            if dtype == "bf16" {
                half::bf16::from_f32(v).to_bits()
            } else {
                half::f16::from_f32(v).to_bits()
            }
        })
        .collect();
    let mut host = Vec::with_capacity(n * k);
    while host.len() < n * k {
        let take = (n * k - host.len()).min(conv.len());
        host.extend_from_slice(&conv[..take]);
    }
    host
}

/// Upload 16-bit bits `host` as an [n, k] weight (no f32 copy of a 2.5 GB matrix).
pub fn upload16(b: &CudaBackend, dtype: &str, host: &[u16], n: usize, k: usize) -> Weight {
    let shape = [n, k];
    let view = TensorView {
        dtype: if dtype == "bf16" {
            WeightDType::BF16
        } else {
            WeightDType::F16
        },
        shape: &shape,
        data: bytemuck::cast_slice(host),
    };
    b.upload_weight("w", &view).expect("upload")
}

/// [`host16`] uploaded.
pub fn weight16(b: &CudaBackend, dtype: &str, n: usize, k: usize, seed: u64) -> Weight {
    upload16(b, dtype, &host16(dtype, n, k, seed), n, k)
}

/// A view of f32 values as a weight of `shape`.
pub fn f32_view<'a>(w: &'a [f32], shape: &'a [usize]) -> TensorView<'a> {
    TensorView {
        dtype: WeightDType::F32,
        shape,
        data: bytemuck::cast_slice(w),
    }
}

/// An [n, k] weight from f32 values (converted to the compute dtype at upload).
pub fn weight_f32(b: &CudaBackend, w: &[f32], n: usize, k: usize) -> Weight {
    b.upload_weight("w", &f32_view(w, &[n, k])).expect("upload")
}

/// The `mma` path's kernel output of `x · wᵀ` for `rows` rows through `kernel`, with the
/// epilogue of `out`, as raw bits (`CudaBackend::mma_probe_run`).
pub fn probe_bits(
    b: &CudaBackend,
    x: &Buf,
    rows: usize,
    w: &Weight,
    kernel: MmaKernel,
    out: MmaOut,
) -> Vec<u32> {
    let mut o = b.mma_probe_alloc(rows, w, out).expect("alloc");
    b.mma_probe_run(x, rows, w, kernel, &mut o).expect("run");
    b.mma_probe_bits(&o).expect("download")
}

/// An f32 residual-stream buffer ([`Backend::alloc_f32`]) of `rows × dim` holding `host` rounded
/// to the compute dtype: zeros plus the uploaded values through `add_rms_norm`'s residual update.
pub fn residual_from(b: &CudaBackend, host: &[f32], rows: usize, dim: usize) -> Buf {
    let mut r = b.alloc_f32(rows * dim).expect("alloc residual");
    let delta = b.upload(host).expect("upload");
    let ones = b.upload(&vec![1.0; dim]).expect("upload");
    let mut scratch = b.alloc(rows * dim).expect("alloc");
    b.add_rms_norm(&mut r, &delta, &ones, &mut scratch, rows, dim, 1e-5)
        .expect("add_rms_norm");
    r
}

/// SmolLM2-135M's layer: hidden size, q|k|v outputs (9 + 3 + 3 heads of 64), intermediate.
pub const HIDDEN: usize = 576;
pub const QKV_N: usize = 960;
pub const INTER: usize = 1536;

/// The weights of one SmolLM2-shaped layer (pseudo-random, seeds 91–96).
pub struct SmolLayer {
    pub norm_w: Buf,
    pub qkv: Weight,
    pub o: Weight,
    /// gate|up from `upload_gate_up` (rows interleaved for the SwiGLU epilogue where it runs).
    pub gu: Weight,
    pub down: Weight,
}

pub fn smol_layer(b: &CudaBackend) -> SmolLayer {
    let w = |n: usize, k: usize, seed: u64| weight_f32(b, &data(n * k, seed), n, k);
    let (gh, uh) = (data(INTER * HIDDEN, 95), data(INTER * HIDDEN, 96));
    let shape = [INTER, HIDDEN];
    let (gv, uv) = (f32_view(&gh, &shape), f32_view(&uh, &shape));
    SmolLayer {
        norm_w: b.upload(&data(HIDDEN, 91)).expect("upload"),
        qkv: w(QKV_N, HIDDEN, 92),
        o: w(HIDDEN, HIDDEN, 93),
        gu: b.upload_gate_up("gu", &[gv, uv]).expect("upload"),
        down: w(HIDDEN, INTER, 94),
    }
}

/// A decode step of `rows` sequences, one token each, sequence r at position `pos(r)` with
/// blocks of its own (numbered from 0, `block_size` tokens each).
pub fn decode_batch(rows: usize, pos: impl Fn(usize) -> usize, block_size: usize) -> ForwardBatch {
    let mut next_block = 0;
    ForwardBatch {
        token_ids: vec![1; rows],
        seqs: (0..rows)
            .map(|r| {
                let nb = (pos(r) + 1).div_ceil(block_size);
                next_block += nb;
                SeqSlice {
                    start: r,
                    len: 1,
                    cached_len: pos(r),
                    block_table: (next_block - nb..next_block).map(|b| b as u32).collect(),
                    logits: LogitsFor::Last,
                    state_slot: None,
                }
            })
            .collect(),
    }
}
