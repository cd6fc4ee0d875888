//! Seeded random GGUF weights (Q4_0 / Q4_1 / Q8_0 blocks) for the gguf tile tests
//! (`cuda_gguf_layout`, `cuda_gguf_quant`): valid blocks with f16 scales of a realistic size,
//! random values, and (Q4_1) random mins.
#![allow(dead_code)] // each test binary uses a subset

use half::f16;
use kiln::tensor::{TensorView, WeightDType};

/// The formats kept quantized on the GPU, with labels.
pub const FORMATS: [(&str, WeightDType); 3] = [
    ("q4_0", WeightDType::Q4_0),
    ("q4_1", WeightDType::Q4_1),
    ("q8_0", WeightDType::Q8_0),
];

/// A small deterministic generator (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// An owned `[n, k]` GGUF weight of random blocks.
pub struct OwnedGguf {
    pub dtype: WeightDType,
    pub n: usize,
    pub k: usize,
    pub shape: [usize; 2],
    pub data: Vec<u8>,
}

impl OwnedGguf {
    /// Random blocks of `dtype` (seeded): scales |d| in [0.002, 0.03) with a random sign, Q4_1
    /// mins in [-0.15, 0.15), values uniform over their range.
    pub fn random(dtype: WeightDType, n: usize, k: usize, seed: u64) -> OwnedGguf {
        assert!(k.is_multiple_of(32), "K must be whole blocks");
        let mut rng = Rng(seed);
        let blocks = n * k / 32;
        let mut data = Vec::with_capacity(blocks * dtype.block_bytes());
        for _ in 0..blocks {
            let sign = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
            let d = f16::from_f32(sign * rng.uniform(0.002, 0.03)).to_le_bytes();
            data.extend_from_slice(&d);
            match dtype {
                WeightDType::Q4_0 => {}
                WeightDType::Q4_1 => {
                    data.extend_from_slice(&f16::from_f32(rng.uniform(-0.15, 0.15)).to_le_bytes())
                }
                WeightDType::Q8_0 => {
                    for _ in 0..32 {
                        data.push(rng.next() as u8);
                    }
                    continue;
                }
                other => panic!("no random blocks for {other:?}"),
            }
            for _ in 0..16 {
                data.push(rng.next() as u8);
            }
        }
        assert_eq!(data.len(), n * dtype.row_bytes(k).unwrap());
        OwnedGguf {
            dtype,
            n,
            k,
            shape: [n, k],
            data,
        }
    }

    pub fn view(&self) -> TensorView<'_> {
        TensorView {
            dtype: self.dtype,
            shape: &self.shape,
            data: &self.data,
        }
    }
}
