//! Seeded random GGUF weights (Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K blocks) for the gguf tile tests
//! (`cuda_gguf_layout`, `cuda_gguf_quant`): valid blocks with f16 scales of a realistic size,
//! random values, (Q4_1) random mins, (K-quants) random 6- / 8-bit sub-block scales; and
//! K-quant blocks with edge scales (zero, ±0, f16 subnormals, the f16 maximum, the extreme
//! sub-block scales) for the bit-for-bit layout test.
#![allow(dead_code)] // each test binary uses a subset

use half::f16;
use kiln::tensor::{TensorView, WeightDType};

/// The formats kept quantized on the GPU, with labels.
pub const FORMATS: [(&str, WeightDType); 3] = [
    ("q4_0", WeightDType::Q4_0),
    ("q4_1", WeightDType::Q4_1),
    ("q8_0", WeightDType::Q8_0),
];

/// The K-quants kept quantized on the GPU, with labels (K a multiple of 256).
pub const K_FORMATS: [(&str, WeightDType); 2] =
    [("q4_k", WeightDType::Q4K), ("q6_k", WeightDType::Q6K)];

/// f16 super-block scales at the edges: zeros of both signs, the smallest and largest
/// subnormals, the largest normal, and ordinary values of both signs.
const EDGE_D: [u16; 8] = [
    0x0000, 0x8000, 0x0001, 0x03ff, 0x7bff, 0xfbff, 0x2e66, 0xa1f0,
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
        if matches!(dtype, WeightDType::Q4K | WeightDType::Q6K) {
            return OwnedGguf::random_k(dtype, n, k, seed, false);
        }
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

    /// Random K-quant super-blocks (seeded). Ordinary: `d` (and Q4_K's `dmin`) |·| in
    /// [0.0002, 0.003) (Q6_K: [0.00002, 0.0003)) with a random sign, sub-block scales uniform
    /// over their range (Q4_K 6-bit `sc`, `mn`; Q6_K signed bytes), values uniform. `edges`:
    /// `d` / `dmin` cycle through [`EDGE_D`] and every fourth sub-block scale is 0 or the
    /// extreme (63; Q6_K −128 / 127).
    pub fn random_k(dtype: WeightDType, n: usize, k: usize, seed: u64, edges: bool) -> OwnedGguf {
        assert!(k.is_multiple_of(256), "K must be whole super-blocks");
        let mut rng = Rng(seed);
        let supers = n * k / 256;
        let mut data = Vec::with_capacity(supers * dtype.block_bytes());
        let f16_of = |rng: &mut Rng, i: usize, lo: f32, hi: f32| -> [u8; 2] {
            if edges && i % 3 != 2 {
                EDGE_D[rng.below(EDGE_D.len())].to_le_bytes()
            } else {
                let sign = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
                f16::from_f32(sign * rng.uniform(lo, hi)).to_le_bytes()
            }
        };
        for i in 0..supers {
            match dtype {
                WeightDType::Q4K => {
                    let d = f16_of(&mut rng, i, 0.0002, 0.003);
                    let dmin = f16_of(&mut rng, i, 0.0002, 0.003);
                    data.extend_from_slice(&d);
                    data.extend_from_slice(&dmin);
                    for j in 0..12 {
                        let b = rng.next() as u8;
                        // Every fourth packed byte all-zero or all-ones: scales / mins of 0 and 63.
                        let b = match (edges, j % 4) {
                            (true, 0) => 0,
                            (true, 1) => 0xff,
                            _ => b,
                        };
                        data.push(b);
                    }
                    for _ in 0..128 {
                        data.push(rng.next() as u8);
                    }
                }
                WeightDType::Q6K => {
                    for _ in 0..192 {
                        data.push(rng.next() as u8);
                    }
                    for j in 0..16 {
                        let s = match (edges, j % 4) {
                            (true, 0) => -128i8,
                            (true, 1) => 127,
                            (true, 2) => 0,
                            _ => rng.next() as i8,
                        };
                        data.push(s as u8);
                    }
                    data.extend_from_slice(&f16_of(&mut rng, i, 0.00002, 0.0003));
                }
                other => panic!("no random K-quant blocks for {other:?}"),
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
