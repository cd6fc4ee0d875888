//! The gguf tile layout (`kiln::tensor::gguf_tiles`, what `kernels/gguf_mm.cu` reads) holds
//! exactly the CPU reference's weights for GGUF Q4_0, Q4_1, Q8_0, Q4_K and Q6_K (K-quants also
//! on blocks with edge scales: ±0, f16 subnormals and maximum, sub-block scales 0 / 63 / ±128). No GPU needed: every weight
//! decoded from the tiles (`GgufTiles::weight`, the kernels' index math) equals
//! `quant::dequantize_row` bit for bit, and the padding decodes to zero.
//!
//! Run: `cargo test --test cuda_gguf_layout`

mod gguf_support;

use gguf_support::{OwnedGguf, FORMATS, K_FORMATS};
use kiln::quant::dequantize_row;
use kiln::tensor::gguf_tiles::GgufTiles;

fn check(label: &str, o: &OwnedGguf) {
    let t = GgufTiles::from_view(&o.view()).unwrap_or_else(|e| panic!("{label}: {e}"));
    let row_bytes = o.dtype.row_bytes(o.k).unwrap();
    let mut row = vec![0f32; o.k];
    for n in 0..o.n {
        dequantize_row(
            o.dtype,
            &o.data[n * row_bytes..(n + 1) * row_bytes],
            &mut row,
        );
        for (j, &want) in row.iter().enumerate() {
            let got = t.weight(n, j);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{label} {}x{}: W[{n}, {j}]: tiles {got}, reference {want}",
                o.n,
                o.k
            );
        }
        // Padded columns contribute nothing.
        for j in o.k..t.k_pad {
            assert_eq!(
                t.weight(n, j),
                0.0,
                "{label}: padding column {j} of row {n}"
            );
        }
    }
    for n in o.n..t.n_pad {
        for j in 0..t.k_pad {
            assert_eq!(t.weight(n, j), 0.0, "{label}: padding row {n}, column {j}");
        }
    }
    assert_eq!(t.n_pad % 64, 0);
    assert_eq!(t.k_pad % 128, 0);
    assert!(t.k_blocks().is_multiple_of(t.k_slices));
}

#[test]
fn tiles_hold_exactly_the_reference_weights() {
    // SmolLM2's K's (576: 4.5 tile blocks, padded; 1536: 12 blocks, 4 slices) and N's not a
    // multiple of 64 (padding rows), K = 32 (one block), K = 1024 (8 slices).
    for (i, (label, dtype)) in FORMATS.into_iter().enumerate() {
        for (n, k) in [(200usize, 576usize), (72, 1536), (9, 32), (64, 1024)] {
            let o = OwnedGguf::random(dtype, n, k, 7 + i as u64 * 100 + n as u64);
            check(label, &o);
        }
    }
}

#[test]
fn k_quant_tiles_hold_exactly_the_reference_weights() {
    // N not a multiple of 64 (padding rows), one super-block (2 tile blocks), 6 (12 blocks, 4
    // slices), 2,304 (18 blocks, 2 slices), edge scales.
    for (i, (label, dtype)) in K_FORMATS.into_iter().enumerate() {
        for (n, k) in [(200usize, 256usize), (72, 1536), (9, 2304), (64, 1024)] {
            for edges in [false, true] {
                let seed = 11 + i as u64 * 100 + n as u64 + u64::from(edges);
                let o = OwnedGguf::random_k(dtype, n, k, seed, edges);
                check(&format!("{label} edges={edges}"), &o);
            }
        }
    }
}

#[test]
fn k_quant_device_bytes() {
    // Q4_K: 4 bits + 8 scale / min bytes per 128 columns + 4 bytes per 256 = 4.625 bits per
    // weight; Q6_K: 8 bits + 8 scale bytes per 128 + 2 per 256 = 8.5625 (no padding at 128 x
    // 1024).
    for ((label, dtype), bits) in K_FORMATS.into_iter().zip([4.625f64, 8.5625]) {
        let o = OwnedGguf::random(dtype, 128, 1024, 5);
        let t = GgufTiles::from_view(&o.view()).unwrap();
        assert_eq!(t.bytes() as f64, 128.0 * 1024.0 * bits / 8.0, "{label}");
        let f = kiln::tensor::gguf_tiles::GgufFormat::of(dtype).unwrap();
        for (n, k) in [(128usize, 1024usize), (200, 256), (9, 2304)] {
            let o = OwnedGguf::random(dtype, n, k, 6);
            let t = GgufTiles::from_view(&o.view()).unwrap();
            assert_eq!(
                kiln::tensor::gguf_tiles::device_bytes(f, n, k),
                t.bytes(),
                "{label} {n}x{k}"
            );
        }
    }
}

#[test]
fn device_bytes_are_the_quantized_size() {
    // 4.5 bits per weight for Q4_0 (the ggml size), 5 for Q4_1, 8.5 for Q8_0, when N and K need
    // no padding.
    for (label, dtype) in FORMATS {
        let o = OwnedGguf::random(dtype, 128, 1024, 3);
        let t = GgufTiles::from_view(&o.view()).unwrap();
        assert_eq!(t.bytes(), o.data.len(), "{label}");
    }
}
