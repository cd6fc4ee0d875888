//! How a synthetic tensor's bytes are made: seeded, reproducible, and in parallel.
//!
//! A tensor's bytes are a function of (seed, tensor name) only, never of access order: the
//! stream of tensor `name` is split into chunks of [`CHUNK`] bytes, chunk `c` drawn from a
//! splitmix64 stream seeded by FNV-1a(seed, name) mixed with `c`, so the chunks are made on
//! all cores (the dense BF16 27B is 54 GB) and still bit-identical from run to run.
//!
//! Value ranges (chosen so activations stay O(1) through all 64 layers, see the parent's docs):
//! a dense linear `[n, k]` is uniform in ±√(3/k) (rms 1/√k); a W4A16 group scale is
//! uniform in [0.5, 1.5) / (6.52·√k) (6.52 is the rms of `q − z` for independent uniform
//! nibbles); an NVFP4 global scale is 3.9·√k (3.9 ≈ rms(e2m1) × rms(fp8 scale) of the fills
//! below).

use half::bf16;
use rayon::prelude::*;

use crate::tensor::WeightDType;

/// Bytes per independently seeded chunk (a multiple of 8, so BF16 and u64 draws never straddle).
pub(super) const CHUNK: usize = 1 << 20;

/// What a tensor is and how to fill it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fill {
    /// Uniform bytes (packed nibbles, zero points).
    Bytes,
    /// BF16 uniform in `[lo, hi)`.
    Uniform { lo: f32, hi: f32 },
    /// Finite positive fp8 E4M3 in [2⁻⁴, 4).
    Fp8Scale,
    /// This exact little-endian payload.
    Exact(Vec<u8>),
}

impl Fill {
    /// A dense linear weight of input width `k`: rms 1/√k.
    pub(super) fn linear(k: usize) -> Fill {
        let a = (3.0 / k as f32).sqrt();
        Fill::Uniform { lo: -a, hi: a }
    }

    /// The W4A16 group scales of a linear of input width `k`, so `(q − z)·s` has rms ≈ 1/√k.
    pub(super) fn w4_scale(k: usize) -> Fill {
        let s = 1.0 / (6.52 * (k as f32).sqrt());
        Fill::Uniform {
            lo: 0.5 * s,
            hi: 1.5 * s,
        }
    }

    /// The NVFP4 global scale of a linear of input width `k` (the weight is
    /// `e2m1 · fp8 / global`), so the weight has rms ≈ 1/√k.
    pub(super) fn nvfp4_global(k: usize) -> Fill {
        Fill::Exact((3.9 * (k as f32).sqrt()).to_le_bytes().to_vec())
    }
}

/// splitmix64.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of the name, mixed with the seed.
fn stream_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325 ^ seed, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The `bytes` bytes of tensor `name` (stored as `dtype`) under `seed`.
pub(super) fn generate(
    seed: u64,
    name: &str,
    dtype: WeightDType,
    bytes: usize,
    fill: &Fill,
) -> Vec<u8> {
    if let Fill::Exact(v) = fill {
        return v.clone();
    }
    debug_assert!(dtype != WeightDType::BF16 || bytes.is_multiple_of(2));
    let base = stream_seed(seed, name);
    let mut out = vec![0u8; bytes];
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut s = base ^ (c as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
            fill_chunk(&mut s, chunk, fill);
        });
    out
}

fn fill_chunk(s: &mut u64, out: &mut [u8], fill: &Fill) {
    match *fill {
        Fill::Exact(_) => unreachable!("handled by generate"),
        Fill::Bytes => {
            for word in out.chunks_mut(8) {
                let r = splitmix(s).to_le_bytes();
                word.copy_from_slice(&r[..word.len()]);
            }
        }
        Fill::Uniform { lo, hi } => {
            for pair in out.chunks_exact_mut(4) {
                // Two 24-bit uniforms per draw.
                let r = splitmix(s);
                for (h, half) in pair.chunks_exact_mut(2).enumerate() {
                    let u = ((r >> (8 + 32 * h)) & 0xFF_FFFF) as f32 / (1u32 << 24) as f32;
                    half.copy_from_slice(&bf16::from_f32(lo + u * (hi - lo)).to_le_bytes());
                }
            }
            let tail = out.len() / 4 * 4;
            if tail < out.len() {
                let u = (splitmix(s) >> 40) as f32 / (1u32 << 24) as f32;
                out[tail..].copy_from_slice(&bf16::from_f32(lo + u * (hi - lo)).to_le_bytes());
            }
        }
        Fill::Fp8Scale => {
            for b in out.iter_mut() {
                let r = splitmix(s) as u8;
                // Exponent field 3..=8 (2⁻⁴ .. 2¹ · 1.875), any mantissa: finite, positive.
                *b = ((3 + r % 6) << 3) | (r >> 5);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_reproducible_and_in_range() {
        let f = Fill::Uniform { lo: -0.5, hi: 0.25 };
        let n = 2 * CHUNK + 6;
        let a = generate(3, "x", WeightDType::BF16, n, &f);
        let b = generate(3, "x", WeightDType::BF16, n, &f);
        assert_eq!(a, b);
        assert_ne!(a, generate(3, "y", WeightDType::BF16, n, &f));
        let vals: Vec<f32> = a
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        assert!(vals.iter().all(|v| (-0.5..=0.25).contains(v)));
        let mean = vals.iter().map(|&v| f64::from(v)).sum::<f64>() / vals.len() as f64;
        assert!((mean - -0.125).abs() < 0.01, "{mean}");
        // Chunks differ from one another (each has its own stream).
        assert_ne!(a[..64], a[CHUNK..CHUNK + 64]);
    }

    #[test]
    fn fp8_scales_are_finite_and_positive() {
        let v = generate(1, "s", WeightDType::F8E4M3, 4096, &Fill::Fp8Scale);
        for b in v {
            let e = b >> 3;
            assert!((3..=8).contains(&e), "{b:#x}");
        }
    }
}
