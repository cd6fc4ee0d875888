//! The K-quant parts of the gguf tile layout (Q4_K, Q6_K; layout in the parent module's docs):
//! reading values and sub-block parameters out of ggml's 256-element super-blocks, building the
//! `scales` / `aux` arrays, and decoding a weight back from the tiles as `kernels/gguf_mm.cu`
//! does.
//!
//! ggml's blocks (`quant::BlockQ4K` / `quant::BlockQ6K`, a higher layer, so the byte offsets are
//! repeated here): `block_q4_K` = `d` f16 @0, `dmin` f16 @2, 12 packed 6-bit scales / mins @4,
//! 128 nibble bytes @16 (144 bytes); `block_q6_K` = 128 low-nibble bytes `ql` @0, 64 high-bit
//! bytes `qh` @128, 16 signed scales @192, `d` f16 @208 (210 bytes).

use half::f16;

use super::{GgufFormat, GgufTiles, QK_K, TILE_K, TILE_N};

/// ggml's `get_scale_min_k4`: (scale, min), each 0..64, of sub-block `j` (0..8) from the 12
/// packed bytes.
fn scale_min(q: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The tile value of element `j` (0..256) of one super-block: Q4_K its nibble, Q6_K its 6-bit
/// `q` minus 32 as a signed byte (in the low 8 bits).
pub(super) fn value(format: GgufFormat, block: &[u8], j: usize) -> u32 {
    match format {
        GgufFormat::Q4K => {
            let b = block[16 + 32 * (j / 64) + j % 32];
            u32::from(if j % 64 < 32 { b & 0xF } else { b >> 4 })
        }
        GgufFormat::Q6K => {
            let (h, quarter, l) = (j / 128, (j % 128) / 32, j % 32);
            let ql = block[64 * h + l + if quarter % 2 == 1 { 32 } else { 0 }];
            let lo = if quarter < 2 { ql & 0xF } else { ql >> 4 };
            let hi = (block[128 + 32 * h + l] >> (2 * quarter)) & 3;
            let q = i32::from(lo | (hi << 4)) - 32;
            u32::from(q as i8 as u8)
        }
        _ => unreachable!("kquants::value is called for the K-quants only"),
    }
}

/// `scales` and `aux` (bytes as uploaded) of an `[n, k]` K-quant weight stored in `data`
/// (`row_bytes` per row); rows `n..n_pad` stay zero.
pub(super) fn params(
    format: GgufFormat,
    data: &[u8],
    n: usize,
    k: usize,
    n_pad: usize,
    row_bytes: usize,
) -> (Vec<u8>, Option<Vec<u8>>) {
    let kb = k.div_ceil(TILE_K);
    let supers = k / QK_K;
    let bb = row_bytes / supers.max(1);
    let mut scales = vec![0u8; n_pad * kb * 8];
    let aux_each = if format == GgufFormat::Q4K { 4 } else { 2 };
    let mut aux = vec![0u8; n_pad * kb.div_ceil(2) * aux_each];
    for row in 0..n {
        let (nt, g) = (row / TILE_N, row % TILE_N);
        for s in 0..supers {
            let off = row * row_bytes + s * bb;
            let block = &data[off..off + bb];
            let sup = ((nt * kb.div_ceil(2) + s) * 8 + g) * aux_each;
            for p in 0..2 {
                let base = ((nt * kb + 2 * s + p) * 8 + g) * 8;
                for i in 0..8 {
                    scales[base + i] = match format {
                        GgufFormat::Q4K if i < 4 => scale_min(&block[4..16], 4 * p + i).0,
                        GgufFormat::Q4K => scale_min(&block[4..16], 4 * p + i - 4).1,
                        _ => block[192 + 8 * p + i],
                    };
                }
            }
            let d = match format {
                GgufFormat::Q4K => &block[0..4],
                _ => &block[208..210],
            };
            aux[sup..sup + aux_each].copy_from_slice(d);
        }
    }
    (scales, Some(aux))
}

/// The weight the kernels decode from tile value `bits` (low bits) of chunk `c` of k block `b`
/// of output `8nt + g`: Q4_K `fmaf(u, d·sc, −(dmin·mn))` (`d·sc · u` is exact, so this is
/// ggml's `d·sc · u − dmin·mn`), Q6_K `q · (d·sc)`, each factor one exact f32 product.
pub(super) fn decode(t: &GgufTiles, nt: usize, b: usize, g: usize, c: usize, bits: u32) -> f32 {
    let kb = t.k_blocks();
    let base = ((nt * kb + b) * 8 + g) * 8;
    let sup = (nt * kb.div_ceil(2) + b / 2) * 8 + g;
    let aux = t.aux.as_deref().unwrap_or(&[]);
    let f16_at = |o: usize| f16::from_le_bytes([aux[o], aux[o + 1]]).to_f32();
    match t.format {
        GgufFormat::Q4K => {
            let (sc, mn) = (t.scales[base + c / 2], t.scales[base + 4 + c / 2]);
            let d = f16_at(4 * sup) * f32::from(sc);
            let m = -(f16_at(4 * sup + 2) * f32::from(mn));
            ((bits & 15) as f32).mul_add(d, m)
        }
        GgufFormat::Q6K => {
            let d = f16_at(2 * sup) * f32::from(t.scales[base + c] as i8);
            f32::from((bits & 0xFF) as u8 as i8) * d
        }
        _ => unreachable!("kquants::decode is called for the K-quants only"),
    }
}
