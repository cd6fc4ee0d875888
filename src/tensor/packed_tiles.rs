//! The one device layout of 4-bit integer linears ("w4 tiles"): every int4 format
//! (compressed-tensors `pack-quantized` sym / asym with any group and `g_idx`, AutoAWQ GEMM,
//! GPTQ incl. `desc_act`) repacked at load so that a GPU kernel reads whole 128-bit words per
//! lane and decodes them straight into `mma.sync.m16n8k16` B fragments (`kernels/w4a16.cu`).
//!
//! Logical weight `W [N, K]`, `W[n, j] = (u − z) · s`, with `u` the 4-bit value (0..15), `z` the
//! zero point (0..16; 8 when symmetric) and `s` the scale of `(n, group of j)`. Shapes:
//! - `Np` = N rounded up to [`PAD_N`], `Kp` = K rounded up to [`TILE_K`], `KB = Kp / 128`;
//! - `qweight` u32 `[Np/8][KB][32 lanes][4 words]`: lane `l = 4g + t` of n8 tile `nt` holds output
//!   `n = 8nt + g` at the 32 contiguous columns `32t .. 32t + 32` of the block; word `q` holds
//!   columns `32t + 8q + o` (`o = 0..8`) at bit `16·(o % 2) + 4·(o / 2)` (even columns in the low
//!   half, odd ones in the high half: two masks and a shift give the mma B fragments; the kernels
//!   give mma chunk `c`'s k indices `2t, 2t+1, 8+2t, 9+2t` the columns `32t + 4c + 0..4`);
//! - `scales` f32 `[Np/8][GS][8]` and `zeros` u8 `[Np/8][GS][8]` (absent: z = 8), `GS` stored
//!   groups; the group of column `j` is `(j / 16) >> group_shift` (groups of 16 · 2^s columns);
//! - `perm` i32 `[K]` (act-order only): tile column `j` holds input column `perm[j]`; the columns
//!   are stably sorted by `g_idx`, so each group is contiguous. Every group must then hold exactly
//!   `G` columns (the last one the rest), as GPTQ and compressed-tensors write them; other
//!   `g_idx` are refused.
//!
//! Padding (rows ≥ N, columns ≥ K, stored groups ≥ ⌈K/G⌉) has `u = 8`, `z = 8`, `s = 0`.
//! Dequantizing from the tiles ([`W4Tiles::weight`]) is exact and equals the CPU reference
//! (`quant::packed::dequantize_packed_row`) at input column `perm[j]` (tests/cuda_w4a16_layout.rs).
//!
//! NVFP4 (compressed-tensors `nvfp4-pack-quantized`) uses the same layout with [`W4Values::E2m1`]:
//! each nibble is an e2m1 code (sign bit 3), groups of 16 columns (`group_shift` 0), no zeros,
//! and the stored scale is `fp8(scale) / global_scale` in f32 (the CPU reference's one rounding),
//! so `W[n, j] = e2m1(code) · s`.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::tensor::packed::PackedLayoutError;
use crate::tensor::{PackedLinear, PackedScheme, TensorView, WeightDType};

/// Columns per tile block (eight 16-column mma chunks).
pub const TILE_K: usize = 128;
/// Outputs per tile (one mma n8).
pub const TILE_N: usize = 8;
/// N is padded to this (the GEMM's 64-output block tile).
pub const PAD_N: usize = 64;
/// Most K slices (`kernels/w4a16.cu` `W4_MAX_KS`).
pub const MAX_K_SLICES: usize = 8;

/// AutoAWQ: output column `n` sits in nibble `AWQ_REVERSE_ORDER[n % 8]` of its word.
const AWQ_REVERSE_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// What a tile nibble means (closed set; the kernels' `fp4` flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum W4Values {
    /// An unsigned 4-bit integer `u`: `W = (u − z) · s`.
    Int4,
    /// An FP4 e2m1 code (NVFP4): `W = e2m1(code) · s`.
    E2m1,
}

/// The e2m1 magnitudes of codes 0..8 (bit 3 is the sign).
const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The value of an e2m1 code (as `quant::packed::fp4_e2m1`, which the layout test compares to).
fn e2m1(code: u32) -> f32 {
    let v = E2M1[(code & 7) as usize];
    if code & 8 != 0 {
        -v
    } else {
        v
    }
}

/// OCP fp8 E4M3 (`float8_e4m3fn`: bias 7, no infinities, `0x7F` / `0xFF` NaN) as f32, exactly
/// (as `quant::packed::fp8_e4m3_to_f32`; the layout test compares the results).
fn fp8_e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let (e, m) = (i32::from((b >> 3) & 0xF), f32::from(b & 7));
    if e == 15 && m == 7.0 {
        f32::NAN
    } else if e == 0 {
        sign * m * (-9f32).exp2()
    } else {
        sign * (1.0 + m / 8.0) * ((e - 7) as f32).exp2()
    }
}

/// A 4-bit linear in the tile layout (host copy, before upload).
#[derive(Debug, Clone, PartialEq)]
pub struct W4Tiles {
    /// Integer or e2m1 nibbles.
    pub values: W4Values,
    /// N (out_features).
    pub n: usize,
    /// K (in_features).
    pub k: usize,
    /// N padded to [`PAD_N`].
    pub n_pad: usize,
    /// K padded to [`TILE_K`].
    pub k_pad: usize,
    /// Stored groups per output (`GS`).
    pub groups: usize,
    /// 16-column chunks per group (a power of two).
    pub group_chunks: usize,
    /// K slices the kernels cut K into (from K alone: the largest of 8, 4, 2, 1 dividing `KB`).
    pub k_slices: usize,
    /// The 4-bit words, see the module docs.
    pub qweight: Vec<u32>,
    /// Scales `[Np/8][GS][8]`.
    pub scales: Vec<f32>,
    /// Zero points `[Np/8][GS][8]`, `None` when symmetric (8).
    pub zeros: Option<Vec<u8>>,
    /// Tile column → input column, `None` without act-order.
    pub perm: Option<Vec<i32>>,
}

/// Bit of column `8q + o` (`o < 8`) in a lane's word `q`: even columns in the low 16 bits, odd
/// ones in the high 16, each half in column order.
const fn nibble_bit(o: usize) -> usize {
    16 * (o % 2) + 4 * (o / 2)
}

fn i32_at(v: &TensorView<'_>, i: usize) -> i32 {
    let b = &v.data[4 * i..4 * i + 4];
    i32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn nib(v: &TensorView<'_>, i: usize, j: usize) -> u8 {
    ((i32_at(v, i) as u32 >> (4 * j)) & 0xF) as u8
}

fn float_at(v: &TensorView<'_>, i: usize) -> f32 {
    let d = v.data;
    match v.dtype {
        WeightDType::F32 => {
            f32::from_le_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]])
        }
        WeightDType::F16 => f16::from_le_bytes([d[2 * i], d[2 * i + 1]]).to_f32(),
        WeightDType::BF16 => bf16::from_le_bytes([d[2 * i], d[2 * i + 1]]).to_f32(),
        WeightDType::F8E4M3 => fp8_e4m3(d[i]),
        // validate() admits only float scales for the int4 schemes, fp8 for NVFP4.
        _ => f32::NAN,
    }
}

impl W4Tiles {
    /// Repack a validated-or-not 4-bit linear (it is validated here). A group size that is not
    /// a multiple of 16 (with more than one group) and a `g_idx` whose groups are not `G`
    /// columns each are `Err` naming the reason.
    pub fn from_packed(p: &PackedLinear<'_>) -> Result<W4Tiles, PackedLayoutError> {
        p.validate()?;
        let (n, k) = (p.out_features, p.in_features);
        let err = |message: String| PackedLayoutError {
            scheme: p.scheme,
            n,
            k,
            message,
        };
        let fp4 = p.scheme == PackedScheme::CtNvfp4;
        let global = match (&p.global_scale, fp4) {
            (Some(gs), true) => float_at(gs, 0),
            _ => 1.0,
        };
        let g = p.scheme.group_size();
        let groups = p.num_groups();
        let k_pad = k.div_ceil(TILE_K) * TILE_K;
        let n_pad = n.div_ceil(PAD_N) * PAD_N;
        let kb = k_pad / TILE_K;
        let chunks = k_pad / 16;
        // The kernels find a chunk's group by a shift: a power-of-two number of chunks.
        let group_chunks = if groups == 1 {
            chunks.next_power_of_two()
        } else if g.is_multiple_of(16) && (g / 16).is_power_of_two() {
            g / 16
        } else {
            return Err(err(format!(
                "group size {g} is not 16 × a power of two (the kernels' chunk is 16 columns)"
            )));
        };
        let stored_groups = chunks.div_ceil(group_chunks);
        let k_slices = [8usize, 4, 2, 1]
            .into_iter()
            .find(|s| kb.is_multiple_of(*s))
            .unwrap_or(1);

        // Act-order: sort columns by group; identity g_idx (k / G) needs no permutation.
        let perm: Option<Vec<i32>> = match &p.g_idx {
            Some(gi) if (0..k).any(|c| i32_at(gi, c) as usize != c / g) => {
                let mut cols: Vec<usize> = (0..k).collect();
                cols.sort_by_key(|&c| i32_at(gi, c));
                for (j, &c) in cols.iter().enumerate() {
                    if i32_at(gi, c) as usize != j / g {
                        return Err(err(format!(
                            "g_idx groups are not {g} columns each (column {c} in group {})",
                            i32_at(gi, c)
                        )));
                    }
                }
                Some(cols.into_iter().map(|c| c as i32).collect())
            }
            _ => None,
        };
        let col_of = |j: usize| perm.as_ref().map_or(j, |pm| pm[j] as usize);

        // (u, z, s) accessors per scheme, in input-column space.
        let symmetric = fp4
            || matches!(
                p.scheme,
                PackedScheme::CtInt4 {
                    symmetric: true,
                    ..
                }
            );
        let q_of = |row: usize, col: usize| -> u8 {
            match p.scheme {
                PackedScheme::CtInt4 { .. } => nib(&p.qweight, row * (k / 8) + col / 8, col % 8),
                PackedScheme::AwqGemm { .. } => nib(
                    &p.qweight,
                    col * (n / 8) + row / 8,
                    AWQ_REVERSE_ORDER[row % 8],
                ),
                PackedScheme::Gptq { .. } => nib(&p.qweight, (col / 8) * n + row, col % 8),
                PackedScheme::CtNvfp4 => {
                    (p.qweight.data[row * (k / 2) + col / 2] >> (4 * (col % 2))) & 0xF
                }
            }
        };
        let z_of = |row: usize, gr: usize| -> u8 {
            let Some(z) = &p.zeros else { return 8 };
            match p.scheme {
                PackedScheme::CtInt4 { .. } => nib(z, (row / 8) * groups + gr, row % 8),
                PackedScheme::AwqGemm { .. } => {
                    nib(z, gr * (n / 8) + row / 8, AWQ_REVERSE_ORDER[row % 8])
                }
                PackedScheme::Gptq { zero_minus_one, .. } => {
                    nib(z, gr * (n / 8) + row / 8, row % 8) + u8::from(zero_minus_one)
                }
                PackedScheme::CtNvfp4 => 8,
            }
        };
        let s_of = |row: usize, gr: usize| -> f32 {
            match p.scheme {
                PackedScheme::CtInt4 { .. } => float_at(&p.scales, row * groups + gr),
                PackedScheme::CtNvfp4 => float_at(&p.scales, row * groups + gr) / global,
                _ => float_at(&p.scales, gr * n + row),
            }
        };

        let tiles = n_pad / TILE_N;
        let mut scales = vec![0f32; tiles * stored_groups * 8];
        let mut zeros = (!symmetric).then(|| vec![8u8; tiles * stored_groups * 8]);
        for row in 0..n {
            for gr in 0..groups {
                let i = ((row / 8) * stored_groups + gr) * 8 + row % 8;
                scales[i] = s_of(row, gr);
                if let Some(z) = zeros.as_mut() {
                    z[i] = z_of(row, gr);
                }
            }
        }
        // One n8 tile per task (a 27B model has ~27G nibbles to move at load).
        let mut qweight = vec![0u32; tiles * kb * 32 * 4];
        qweight
            .par_chunks_mut(kb * 32 * 4)
            .enumerate()
            .for_each(|(nt, tile)| {
                for b in 0..kb {
                    for lane in 0..32 {
                        let (gl, t) = (lane / 4, lane % 4);
                        let row = nt * 8 + gl;
                        for q in 0..4 {
                            for o in 0..8 {
                                let j = b * TILE_K + 32 * t + 8 * q + o;
                                let u = if row < n && j < k {
                                    q_of(row, col_of(j))
                                } else {
                                    8
                                };
                                tile[(b * 32 + lane) * 4 + q] |= u32::from(u) << nibble_bit(o);
                            }
                        }
                    }
                }
            });
        Ok(W4Tiles {
            values: if fp4 { W4Values::E2m1 } else { W4Values::Int4 },
            n,
            k,
            n_pad,
            k_pad,
            groups: stored_groups,
            group_chunks,
            k_slices,
            qweight,
            scales,
            zeros,
            perm,
        })
    }

    /// log2 of [`Self::group_chunks`] (the kernels' `gshift`).
    pub fn group_shift(&self) -> u32 {
        self.group_chunks.trailing_zeros()
    }

    /// K blocks (`Kp / 128`).
    pub fn k_blocks(&self) -> usize {
        self.k_pad / TILE_K
    }

    /// The weight at output `n`, tile column `j`, dequantized from the tiles the way the kernels
    /// do it before rounding (exact: `(u − z) · s` in f32).
    pub fn weight(&self, n: usize, j: usize) -> f32 {
        let kb = self.k_blocks();
        let (b, r) = (j / TILE_K, j % TILE_K);
        let (t, q, o) = (r / 32, (r % 32) / 8, r % 8);
        let (nt, gl) = (n / 8, n % 8);
        let lane = 4 * gl + t;
        let word = self.qweight[((nt * kb + b) * 32 + lane) * 4 + q];
        let u = (word >> nibble_bit(o)) & 0xF;
        let gi = (j / 16) >> self.group_shift();
        let i = (nt * self.groups + gi) * 8 + gl;
        match self.values {
            W4Values::E2m1 => e2m1(u) * self.scales[i],
            W4Values::Int4 => {
                let z = self.zeros.as_ref().map_or(8, |z| z[i]);
                (u as i32 - i32::from(z)) as f32 * self.scales[i]
            }
        }
    }

    /// The input column of tile column `j`.
    pub fn input_column(&self, j: usize) -> usize {
        self.perm.as_ref().map_or(j, |p| p[j] as usize)
    }

    /// Device bytes with scales stored in `scale_bytes`-byte floats (the compute dtype).
    pub fn device_bytes(&self, scale_bytes: usize) -> usize {
        self.qweight.len() * 4
            + self.scales.len() * scale_bytes
            + self.zeros.as_ref().map_or(0, Vec::len)
            + self.perm.as_ref().map_or(0, |p| p.len() * 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(dtype: WeightDType, shape: &'a [usize], data: &'a [u8]) -> TensorView<'a> {
        TensorView { dtype, shape, data }
    }

    #[test]
    fn symmetric_ct_round_trips_through_the_tiles() {
        // N = 16, K = 160 (padded to 256), group 32: every nibble value appears.
        let (n, k, g) = (16usize, 160usize, 32usize);
        let words: Vec<u32> = (0..n * k / 8)
            .map(|i| (i as u32).wrapping_mul(0x9E37_79B9))
            .collect();
        let q: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let s: Vec<u8> = (0..n * k / g)
            .flat_map(|i| bf16::from_f32(0.5 + i as f32 / 64.0).to_le_bytes())
            .collect();
        let (qs, ss) = ([n, k / 8], [n, k / g]);
        let p = PackedLinear {
            scheme: PackedScheme::CtInt4 {
                group_size: g,
                symmetric: true,
            },
            out_features: n,
            in_features: k,
            qweight: view(WeightDType::I32, &qs, &q),
            scales: view(WeightDType::BF16, &ss, &s),
            zeros: None,
            g_idx: None,
            global_scale: None,
        };
        let t = W4Tiles::from_packed(&p).unwrap();
        assert_eq!(
            (t.n_pad, t.k_pad, t.group_chunks, t.k_slices),
            (64, 256, 2, 2)
        );
        for row in 0..n {
            for col in 0..k {
                let u = (words[row * (k / 8) + col / 8] >> (4 * (col % 8))) & 15;
                let sc = bf16::from_f32(0.5 + (row * (k / g) + col / g) as f32 / 64.0).to_f32();
                assert_eq!(t.weight(row, col), (u as f32 - 8.0) * sc, "({row}, {col})");
            }
            for col in k..t.k_pad {
                assert_eq!(t.weight(row, col), 0.0);
            }
        }
    }
}
