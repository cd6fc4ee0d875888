//! The w4 tile layout (`kiln::tensor::packed_tiles`, what the CUDA kernels read) holds exactly
//! the CPU reference's weights for every int4 format: compressed-tensors sym / asym, groups 32 /
//! 64 / 128, act-order `g_idx`; AutoAWQ GEMM; GPTQ with and without desc_act; NVFP4 (e2m1 codes,
//! fp8 scales / global scale). No GPU needed: every
//! weight dequantized from the tiles (`W4Tiles::weight`, the kernels' index math) equals
//! `dequantize_packed_row` at the permuted input column, bit for bit, and padding is zero.
//!
//! Run: `cargo test --test cuda_w4a16_layout`

mod w4_support;

use kiln::quant::packed::dequantize_packed_row;
use kiln::tensor::packed_tiles::W4Tiles;
use w4_support::{all_formats, Fmt, Owned};

fn check(label: &str, o: &Owned) {
    let p = o.linear();
    let t = W4Tiles::from_packed(&p).unwrap_or_else(|e| panic!("{label}: {e}"));
    let mut row = vec![0f32; o.k];
    let mut seen = vec![false; o.k];
    for n in 0..o.n {
        dequantize_packed_row(&p, n, &mut row);
        seen.iter_mut().for_each(|s| *s = false);
        for j in 0..o.k {
            let c = t.input_column(j);
            assert!(
                !seen[c],
                "{label}: column {c} appears twice in the permutation"
            );
            seen[c] = true;
            let (got, want) = (t.weight(n, j), row[c]);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{label}: W[{n}, {c}] (tile column {j}): tiles {got}, reference {want}"
            );
        }
    }
    // Padded rows contribute nothing.
    for n in o.n..t.n_pad {
        for j in 0..t.k_pad {
            assert_eq!(t.weight(n, j), 0.0, "{label}: padded row {n}");
        }
    }
}

#[test]
fn every_int4_format_round_trips_through_the_tiles() {
    for (i, (label, fmt)) in all_formats().into_iter().enumerate() {
        // N = 48 like in_proj_a/b (padded to 64); K = 640 is 5 tile blocks (odd: 1 K slice).
        let o = Owned::random(fmt, 48, 640, 100 + i as u64);
        check(label, &o);
    }
}

#[test]
fn k_slices_and_padding_follow_k() {
    let o = Owned::random(
        Fmt::Ct {
            group: 32,
            symmetric: false,
            act_order: false,
        },
        24,
        96,
        7,
    );
    check("ct-asym-g32 24x96", &o);
    let t = W4Tiles::from_packed(&o.linear()).unwrap();
    assert_eq!((t.n_pad, t.k_pad, t.k_slices, t.groups), (64, 128, 1, 4));
    // The 27B shapes: K = 5120 (40 blocks), 6144 (48), 17408 (136) all cut into 8 slices.
    for (k, slices) in [(5120usize, 8usize), (6144, 8), (17408, 8), (1024 + 128, 1)] {
        let o = Owned::random(
            Fmt::Ct {
                group: 128,
                symmetric: true,
                act_order: false,
            },
            8,
            k,
            1,
        );
        let t = W4Tiles::from_packed(&o.linear()).unwrap();
        assert_eq!(t.k_slices, slices, "K = {k}");
    }
}

#[test]
fn a_g_idx_with_uneven_groups_is_refused() {
    let mut o = Owned::random(
        Fmt::Gptq {
            group: 64,
            desc_act: true,
        },
        16,
        256,
        3,
    );
    // Move column 0 into group 1: group 1 then has 65 columns.
    let g = o.g.as_mut().unwrap();
    let one = 1i32.to_le_bytes();
    let mut moved = false;
    for c in 0..256 {
        if i32::from_le_bytes(g.1[4 * c..4 * c + 4].try_into().unwrap()) == 0 {
            g.1[4 * c..4 * c + 4].copy_from_slice(&one);
            moved = true;
            break;
        }
    }
    assert!(moved);
    let e = W4Tiles::from_packed(&o.linear()).unwrap_err();
    assert!(e.message.contains("not 64 columns each"), "{e}");
}
