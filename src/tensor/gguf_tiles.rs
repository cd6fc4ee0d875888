//! The device layout of GGUF Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K weights kept quantized on the GPU
//! ("gguf tiles", `kernels/gguf_mm.cu`): the ggml blocks of a `[N, K]` weight repacked at load so
//! that a GPU kernel reads whole 128-bit words per lane and decodes them straight into
//! `mma.sync.m16n8k16` B fragments, with the block parameters apart from the values.
//!
//! Shapes: `Np` = N rounded up to [`PAD_N`], `Kp` = K rounded up to [`TILE_K`], `KB = Kp / 128`,
//! `V` = [`GgufFormat::words`] (1 for the 4-bit formats, 2 for the 8-bit ones):
//! - `qweight` u32 `[Np/8][KB][V][32 lanes][4 words]`: lane `l = 4g + t` of n8 tile `nt` holds
//!   output `n = 8nt + g`; its values of chunk `c` (16 columns, `0..8`) are, low first, columns
//!   `16c + 2t`, `16c + 2t + 1`, `16c + 8 + 2t`, `16c + 9 + 2t` of the block: 4-bit — the 16 bits
//!   at `16·(c % 2)` of word `c / 2` (the order of [`crate::tensor::packed_tiles`]); 8-bit — the
//!   4 bytes of word `c % 4` of the lane's uint4 `c / 4`.
//! - `scales` (bytes, little-endian), by format:
//!   - Q4_0 / Q4_1 / Q8_0: f16 bits `[Np/8][KB][8][4]`, the `d` of ggml block `4·kb + i` of
//!     output `8nt + g` at `[nt][kb][g][i]` (a lane reads its four in one 64-bit load);
//!   - Q4_K: u8 `[Np/8][KB][8][8]`: at `[nt][kb][g]` the four 6-bit sub-block scales `sc` of the
//!     32-column sub-blocks `4·(kb % 2) + i` of super-block `kb / 2` (bytes 0–3), then their four
//!     6-bit mins `mn` (bytes 4–7), unpacked from ggml's 12-byte `scales` (one 64-bit load);
//!   - Q6_K: i8 `[Np/8][KB][8][8]`: at `[nt][kb][g]` the eight signed scales of the 16-column
//!     sub-blocks `8·(kb % 2) + c` of super-block `kb / 2` (chunk `c` of the tile block).
//! - `aux` (bytes), by format: Q4_1 — its f16 `m`, laid out as `scales`; Q4_K — u32
//!   `[Np/8][KB/2][8]`, the super-block's f16 `d | dmin << 16`; Q6_K — u16 `[Np/8][KB/2][8]`, the
//!   super-block's f16 `d`; absent for Q4_0 / Q8_0.
//!
//! The values are the stored integers unchanged (Q4_0 / Q4_1 / Q4_K nibbles `u`, Q8_0 bytes `q`,
//! Q6_K's 6-bit `q` minus 32 as a signed byte), the parameters the stored bits: nothing is rounded.
//! The kernels form the K-quant sub-block factors in f32 as ggml does (`d·sc` and `dmin·mn`: f16
//! times a 6- or 8-bit integer, exact in f32), so [`GgufTiles::weight`] (the weight the kernels
//! decode, in f32, before their one rounding to the compute dtype) equals `quant::dequantize_row`
//! bit for bit (tests/cuda_gguf_layout.rs and the unit tests check it). Padding (rows ≥ N,
//! columns ≥ K) has value 0 (Q4_0 / Q4_1: 8) and zero parameters, so it decodes to 0.
//!
//! Device bits per weight without padding: Q4_0 4.5, Q4_1 5, Q8_0 8.5 (the ggml sizes), Q4_K
//! 4.625 (ggml 4.5: the scales are unpacked to bytes), Q6_K 8.5625 (ggml 6.5625: the 6-bit values
//! are widened to bytes so that the kernels decode them like Q8_0's).

use half::f16;
use rayon::prelude::*;

use crate::tensor::{TensorView, WeightDType};

mod kquants;

/// Elements per ggml block (`quant::QK`; `quant` is a higher layer).
const QK: usize = 32;
/// Elements per K-quant super-block (`quant::QK_K`).
const QK_K: usize = 256;
/// Columns per tile block (eight 16-column mma chunks, four ggml blocks).
pub const TILE_K: usize = 128;
/// Outputs per tile (one mma n8).
pub const TILE_N: usize = 8;
/// N is padded to this (the GEMM's 64-output block tile).
pub const PAD_N: usize = 64;
/// Most K slices (`kernels/gguf_mm.cu` `GG_MAX_KS`).
pub const MAX_K_SLICES: usize = 8;

/// The environment switch for GGUF Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K weights on the GPU:
/// `KILN_GGUF_GPU_WEIGHTS=quantized` keeps them in the gguf tile layout (about 0.3–0.55× the
/// device memory of 16 bits); unset or `dequantized` (the default) converts them to the compute
/// dtype at load and multiplies with cuBLAS, which is faster today (SmolLM2 on the H200: 436
/// against 288 decode tokens/s at one sequence, `docs/benchmarks.md`). Any other value is treated
/// as the default. Read at each upload and by the memory planner.
pub const WEIGHTS_ENV: &str = "KILN_GGUF_GPU_WEIGHTS";

/// Whether [`WEIGHTS_ENV`] asks for the weights to stay quantized on the device.
pub fn keep_quantized_requested() -> bool {
    std::env::var(WEIGHTS_ENV).is_ok_and(|v| v.trim() == "quantized")
}

/// Device bytes of an `[n, k]` weight of `format` in the tile layout (values, scales, aux), as
/// [`GgufTiles::bytes`] without building it: what the memory planner counts.
pub fn device_bytes(format: GgufFormat, n: usize, k: usize) -> usize {
    let (np, kb) = (n.div_ceil(PAD_N) * PAD_N, k.div_ceil(TILE_K));
    let values = np / TILE_N * kb * format.words() * 32 * 16;
    values + np * kb * format.scale_bytes_per_block() + np * kb.div_ceil(2) * format.aux_bytes()
}

/// The GGUF block formats kept quantized on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufFormat {
    /// `d · (u − 8)`, 4-bit `u`.
    Q4_0,
    /// `u · d + m`, 4-bit `u`.
    Q4_1,
    /// `q · d`, signed 8-bit `q`.
    Q8_0,
    /// `(d·sc) · u − (dmin·mn)` per 32-column sub-block, 4-bit `u`, 6-bit `sc`, `mn`.
    Q4K,
    /// `(d·sc) · (q − 32)` per 16-column sub-block, 6-bit `q`, signed 8-bit `sc`.
    Q6K,
}

impl GgufFormat {
    /// The format of a stored dtype, `None` for one not kept quantized on the GPU (floats and
    /// the parts of packed linears).
    pub fn of(dtype: WeightDType) -> Option<GgufFormat> {
        match dtype {
            WeightDType::Q4_0 => Some(GgufFormat::Q4_0),
            WeightDType::Q4_1 => Some(GgufFormat::Q4_1),
            WeightDType::Q8_0 => Some(GgufFormat::Q8_0),
            WeightDType::Q4K => Some(GgufFormat::Q4K),
            WeightDType::Q6K => Some(GgufFormat::Q6K),
            _ => None,
        }
    }

    /// The kernels' name part (`gguf_gemv_{suffix}_{dtype}`).
    pub fn suffix(self) -> &'static str {
        match self {
            GgufFormat::Q4_0 => "q4_0",
            GgufFormat::Q4_1 => "q4_1",
            GgufFormat::Q8_0 => "q8_0",
            GgufFormat::Q4K => "q4_k",
            GgufFormat::Q6K => "q6_k",
        }
    }

    /// uint4 words per lane per k block (`V`).
    pub fn words(self) -> usize {
        match self {
            GgufFormat::Q4_0 | GgufFormat::Q4_1 | GgufFormat::Q4K => 1,
            GgufFormat::Q8_0 | GgufFormat::Q6K => 2,
        }
    }

    /// Whether the format has an `aux` array (Q4_1 mins, K-quant super-block scales).
    pub fn has_aux(self) -> bool {
        matches!(self, GgufFormat::Q4_1 | GgufFormat::Q4K | GgufFormat::Q6K)
    }

    /// Whether the format is a 256-element K-quant (K a multiple of 256).
    pub fn is_k_quant(self) -> bool {
        matches!(self, GgufFormat::Q4K | GgufFormat::Q6K)
    }

    /// `scales` bytes per (output, k block).
    fn scale_bytes_per_block(self) -> usize {
        match self {
            GgufFormat::Q4_0 | GgufFormat::Q8_0 => 8,
            // Q4_1: scales and mins, both [..][4] f16.
            GgufFormat::Q4_1 => 16,
            GgufFormat::Q4K | GgufFormat::Q6K => 8,
        }
    }

    /// `aux` bytes per (output, super-block) for the K-quants (0 for the others, whose aux is
    /// counted in [`Self::scale_bytes_per_block`]).
    fn aux_bytes(self) -> usize {
        match self {
            GgufFormat::Q4K => 4,
            GgufFormat::Q6K => 2,
            _ => 0,
        }
    }

    /// Bits of one stored value in the tiles.
    fn value_bits(self) -> usize {
        32 * self.words() / 8
    }
}

/// Why a weight cannot be repacked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gguf tiles: {0}")]
pub struct GgufTileError(pub String);

/// A GGUF weight in the tile layout (host copy, before upload).
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTiles {
    /// The block format.
    pub format: GgufFormat,
    /// N (rows: out_features).
    pub n: usize,
    /// K (columns: in_features), a multiple of 32 (of 256 for the K-quants).
    pub k: usize,
    /// N padded to [`PAD_N`].
    pub n_pad: usize,
    /// K padded to [`TILE_K`].
    pub k_pad: usize,
    /// K slices the kernels cut K into (from K alone: the largest of 8, 4, 2, 1 dividing `KB`).
    pub k_slices: usize,
    /// The values, see the module docs.
    pub qweight: Vec<u32>,
    /// The per-block parameters as uploaded (module docs).
    pub scales: Vec<u8>,
    /// The second parameter array as uploaded (module docs); `None` for Q4_0 / Q8_0.
    pub aux: Option<Vec<u8>>,
}

/// The integer value (nibble or byte as stored), `d` and `m` bits of element `j` of one ggml
/// block of a 32-element format, read from the block's bytes.
fn element(format: GgufFormat, block: &[u8], j: usize) -> (u32, u16, u16) {
    let f16_at = |o: usize| u16::from_le_bytes([block[o], block[o + 1]]);
    let nib = |qs: &[u8]| -> u32 {
        let b = qs[j % (QK / 2)];
        u32::from(if j < QK / 2 { b & 0xF } else { b >> 4 })
    };
    match format {
        GgufFormat::Q4_0 => (nib(&block[2..]), f16_at(0), 0),
        GgufFormat::Q4_1 => (nib(&block[4..]), f16_at(0), f16_at(2)),
        GgufFormat::Q8_0 => (u32::from(block[2 + j]), f16_at(0), 0),
        GgufFormat::Q4K | GgufFormat::Q6K => (kquants::value(format, block, j), 0, 0),
    }
}

/// Column of value `q` (0..4) of chunk `c` for lane quad position `t` in a tile block.
fn column(c: usize, t: usize, q: usize) -> usize {
    16 * c + 2 * t + (q & 1) + if q >= 2 { 8 } else { 0 }
}

impl GgufTiles {
    /// Repack a 2-D Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K tensor. Another dtype, a shape that is not
    /// 2-D, a K that is not whole blocks or a byte count that does not match the shape is `Err`.
    pub fn from_view(view: &TensorView<'_>) -> Result<GgufTiles, GgufTileError> {
        let format = GgufFormat::of(view.dtype).ok_or_else(|| {
            GgufTileError(format!("{:?} is not kept quantized on the GPU", view.dtype))
        })?;
        let &[n, k] = view.shape else {
            return Err(GgufTileError(format!(
                "expected a 2-D weight, found shape {:?}",
                view.shape
            )));
        };
        let row_bytes = view.dtype.row_bytes(k).ok_or_else(|| {
            GgufTileError(format!("{k} columns are not whole {:?} blocks", view.dtype))
        })?;
        if view.data.len() != n * row_bytes {
            return Err(GgufTileError(format!(
                "{} bytes for a {n} x {k} {:?} weight ({} expected)",
                view.data.len(),
                view.dtype,
                n * row_bytes
            )));
        }
        let bb = view.dtype.block_bytes();
        let be = if format.is_k_quant() { QK_K } else { QK };
        let k_pad = k.div_ceil(TILE_K) * TILE_K;
        let n_pad = n.div_ceil(PAD_N) * PAD_N;
        let kb = k_pad / TILE_K;
        let k_slices = [8usize, 4, 2, 1]
            .into_iter()
            .find(|s| kb.is_multiple_of(*s))
            .unwrap_or(1);
        let tiles = n_pad / TILE_N;
        let v = format.words();
        let bits = format.value_bits();
        let pad_value: u32 = match format {
            GgufFormat::Q4_0 | GgufFormat::Q4_1 => 8,
            _ => 0,
        };
        let data = view.data;
        // (value, d, m) of (row, col); padding outside N × K.
        let at = |row: usize, col: usize| -> (u32, u16, u16) {
            if row >= n || col >= k {
                return (pad_value, 0, 0);
            }
            let off = row * row_bytes + (col / be) * bb;
            element(format, &data[off..off + bb], col % be)
        };
        // One n8 tile per task (a large model has billions of values to move at load).
        let words_per_tile = kb * v * 32 * 4;
        let mut qweight = vec![0u32; tiles * words_per_tile];
        qweight
            .par_chunks_mut(words_per_tile)
            .enumerate()
            .for_each(|(nt, tile)| {
                for b in 0..kb {
                    for lane in 0..32 {
                        let (gl, t) = (lane / 4, lane % 4);
                        let row = nt * 8 + gl;
                        for c in 0..8 {
                            for q in 0..4 {
                                let (u, _, _) = at(row, b * TILE_K + column(c, t, q));
                                // Word index within the lane's V uint4s, and bit offset.
                                let (word, shift) = if bits == 4 {
                                    (c / 2, 16 * (c % 2) + 4 * q)
                                } else {
                                    (c, 8 * q)
                                };
                                let (h, w) = (word / 4, word % 4);
                                tile[((b * v + h) * 32 + lane) * 4 + w] |= u << shift;
                            }
                        }
                    }
                }
            });
        let (scales, aux) = if format.is_k_quant() {
            kquants::params(format, data, n, k, n_pad, row_bytes)
        } else {
            let mut scales = vec![0u16; tiles * kb * 8 * 4];
            let mut mins = format.has_aux().then(|| vec![0u16; scales.len()]);
            for row in 0..n {
                for blk in 0..k / QK {
                    let (_, d, m) = at(row, blk * QK);
                    let i = (((row / 8) * kb + blk / 4) * 8 + row % 8) * 4 + blk % 4;
                    scales[i] = d;
                    if let Some(ms) = mins.as_mut() {
                        ms[i] = m;
                    }
                }
            }
            let bytes = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            (bytes(&scales), mins.as_deref().map(bytes))
        };
        Ok(GgufTiles {
            format,
            n,
            k,
            n_pad,
            k_pad,
            k_slices,
            qweight,
            scales,
            aux,
        })
    }

    /// k blocks (`KB`).
    pub fn k_blocks(&self) -> usize {
        self.k_pad / TILE_K
    }

    /// Device bytes of the layout (values, scales, aux).
    pub fn bytes(&self) -> usize {
        4 * self.qweight.len() + self.scales.len() + self.aux.as_ref().map_or(0, |m| m.len())
    }

    /// The weight at (row, col) of the padded `Np × Kp` matrix, as the kernels decode it (f32,
    /// before their rounding to the compute dtype): read back from the tiles alone.
    pub fn weight(&self, row: usize, col: usize) -> f32 {
        let (nt, g) = (row / TILE_N, row % TILE_N);
        let (b, jj) = (col / TILE_K, col % TILE_K);
        let (c, r) = (jj / 16, jj % 16);
        let (t, q) = ((r % 8) / 2, (r & 1) + 2 * (r / 8));
        let lane = 4 * g + t;
        let v = self.format.words();
        let (word, shift) = if self.format.value_bits() == 4 {
            (c / 2, 16 * (c % 2) + 4 * q)
        } else {
            (c, 8 * q)
        };
        let (h, w) = (word / 4, word % 4);
        let bits =
            self.qweight[((((nt * self.k_blocks()) + b) * v + h) * 32 + lane) * 4 + w] >> shift;
        if self.format.is_k_quant() {
            return kquants::decode(self, nt, b, g, c, bits);
        }
        let i = ((nt * self.k_blocks() + b) * 8 + g) * 4 + c / 2;
        let f16_at = |s: &[u8]| f16::from_bits(u16::from_le_bytes([s[2 * i], s[2 * i + 1]]));
        let d = f16_at(&self.scales).to_f32();
        match self.format {
            GgufFormat::Q4_0 => ((bits & 15) as i32 - 8) as f32 * d,
            GgufFormat::Q4_1 => {
                let m = self.aux.as_deref().map_or(0.0, |ms| f16_at(ms).to_f32());
                // The kernel's fmaf(u, d, m): u · d is exact, so this is u · d + m.
                (bits & 15) as f32 * d + m
            }
            GgufFormat::Q8_0 => f32::from((bits & 0xFF) as u8 as i8) * d,
            GgufFormat::Q4K | GgufFormat::Q6K => unreachable!("handled above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_slices_come_from_k_alone() {
        // 576 = 4.5 tile blocks → 5 blocks, one slice; 1536 = 12 blocks → 4 slices.
        for (k, ks) in [(576usize, 1usize), (1536, 4), (4096, 8), (64, 1)] {
            let n = 8;
            let data = vec![0u8; n * k / 32 * 34];
            let view = TensorView {
                dtype: WeightDType::Q8_0,
                shape: &[n, k],
                data: &data,
            };
            let t = GgufTiles::from_view(&view).unwrap();
            assert_eq!(t.k_slices, ks, "K = {k}");
            assert_eq!(t.n_pad, 64);
            assert_eq!(t.qweight.len(), 8 * t.k_blocks() * 2 * 32 * 4);
        }
    }

    #[test]
    fn device_bytes_match_the_built_layout() {
        for (dtype, bb) in [
            (WeightDType::Q4_0, 18usize),
            (WeightDType::Q4_1, 20),
            (WeightDType::Q8_0, 34),
        ] {
            for (n, k) in [(200usize, 576usize), (64, 1024), (9, 32)] {
                let data = vec![0u8; n * k / 32 * bb];
                let view = TensorView {
                    dtype,
                    shape: &[n, k],
                    data: &data,
                };
                let t = GgufTiles::from_view(&view).unwrap();
                let f = GgufFormat::of(dtype).unwrap();
                assert_eq!(device_bytes(f, n, k), t.bytes(), "{dtype:?} {n}x{k}");
            }
        }
    }

    #[test]
    fn refuses_what_it_cannot_hold() {
        let data = vec![0u8; 144];
        let float = TensorView {
            dtype: WeightDType::F32,
            shape: &[1, 36],
            data: &data,
        };
        assert!(GgufTiles::from_view(&float).is_err());
        // A K-quant K that is not whole super-blocks.
        let kq = TensorView {
            dtype: WeightDType::Q4K,
            shape: &[1, 128],
            data: &data[..72],
        };
        assert!(GgufTiles::from_view(&kq).is_err());
        let short = TensorView {
            dtype: WeightDType::Q4_0,
            shape: &[2, 32],
            data: &data[..18],
        };
        assert!(GgufTiles::from_view(&short).is_err());
    }
}
