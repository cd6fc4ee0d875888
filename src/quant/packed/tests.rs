//! The dequantizers against values packed here the way each library's writer packs them
//! (compressed-tensors `pack_to_int32`, AutoAWQ `WQLinear_GEMM.from_linear`, GPTQ `pack`), as
//! in `shared/docs/quant_layout_check.py`. The fixtures written by the real libraries are
//! checked end to end in `tests/quant_golden.rs`.

use rand::{Rng, SeedableRng};

use super::*;
use crate::tensor::TensorView;

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(7)
}

fn i32_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect()
}

fn view<'a>(dtype: WeightDType, shape: &'a [usize], data: &'a [u8]) -> TensorView<'a> {
    TensorView { dtype, shape, data }
}

#[test]
fn fp8_e4m3_and_fp4_decode_exactly() {
    assert_eq!(fp8_e4m3_to_f32(0x38), 1.0);
    assert_eq!(fp8_e4m3_to_f32(0xB8), -1.0);
    assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
    assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(fp8_e4m3_to_f32(0x08), 2f32.powi(-6));
    assert_eq!(fp8_e4m3_to_f32(0x3C), 1.5);
    assert!(fp8_e4m3_to_f32(0x7F).is_nan() && fp8_e4m3_to_f32(0xFF).is_nan());
    // Every finite code round-trips through half's own fp8-free path: monotone in the code.
    let pos: Vec<f32> = (0u8..0x7F).map(fp8_e4m3_to_f32).collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(fp4_e2m1(0x7), 6.0);
    assert_eq!(fp4_e2m1(0xF), -6.0);
    assert_eq!(fp4_e2m1(0x3), 1.5);
    assert_eq!(fp4_e2m1(0x8), -0.0);
}

/// compressed-tensors int4, asymmetric, with and without a g_idx.
#[test]
fn ct_int4_matches_the_packing_it_reads() {
    let (n, k, g) = (16, 64, 32);
    let groups = k / g;
    let mut r = rng();
    let q: Vec<i32> = (0..n * k).map(|_| r.random_range(-8..8)).collect();
    let zp: Vec<i32> = (0..n * groups).map(|_| r.random_range(-8..8)).collect();
    let s: Vec<f32> = (0..n * groups)
        .map(|_| bf16::from_f32(r.random_range(0.001..0.1)).to_f32())
        .collect();
    // g_idx: a shuffled assignment of columns to groups (act-order).
    let g_idx: Vec<i32> = (0..k).map(|c| ((c * 7 + 3) % k / g) as i32).collect();
    let mut words = vec![0u32; n * k / 8];
    for row in 0..n {
        for c in 0..k {
            words[row * (k / 8) + c / 8] |= ((q[row * k + c] + 8) as u32) << (4 * (c % 8));
        }
    }
    let mut zwords = vec![0u32; n.div_ceil(8) * groups];
    for row in 0..n {
        for gr in 0..groups {
            zwords[(row / 8) * groups + gr] |=
                ((zp[row * groups + gr] + 8) as u32) << (4 * (row % 8));
        }
    }
    let (qb, zb, sb) = (i32_bytes(&words), i32_bytes(&zwords), bf16_bytes(&s));
    let gb: Vec<u8> = g_idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (qs, ss, zs, gs) = ([n, k / 8], [n, groups], [n / 8, groups], [k]);
    for with_g_idx in [false, true] {
        let p = PackedLinear {
            scheme: PackedScheme::CtInt4 {
                group_size: g,
                symmetric: false,
            },
            out_features: n,
            in_features: k,
            qweight: view(WeightDType::I32, &qs, &qb),
            scales: view(WeightDType::BF16, &ss, &sb),
            zeros: Some(view(WeightDType::I32, &zs, &zb)),
            g_idx: with_g_idx.then(|| view(WeightDType::I32, &gs, &gb)),
            global_scale: None,
        };
        p.validate().unwrap();
        let w = dequantize_packed(&p);
        for row in 0..n {
            for c in 0..k {
                let gr = if with_g_idx { g_idx[c] as usize } else { c / g };
                let want = (q[row * k + c] - zp[row * groups + gr]) as f32 * s[row * groups + gr];
                assert_eq!(w[row * k + c], want, "row {row} col {c} g_idx {with_g_idx}");
            }
        }
    }
}

#[test]
fn ct_int4_symmetric_subtracts_eight() {
    let (n, k) = (8, 16);
    let words: Vec<u32> = (0..n * k / 8)
        .map(|i| 0x0123_4567u32.wrapping_mul(i as u32 + 1))
        .collect();
    let qb = i32_bytes(&words);
    let sb = bf16_bytes(&vec![0.5; n]);
    let (qs, ss) = ([n, k / 8], [n, 1]);
    let p = PackedLinear {
        scheme: PackedScheme::CtInt4 {
            group_size: k,
            symmetric: true,
        },
        out_features: n,
        in_features: k,
        qweight: view(WeightDType::I32, &qs, &qb),
        scales: view(WeightDType::BF16, &ss, &sb),
        zeros: None,
        g_idx: None,
        global_scale: None,
    };
    p.validate().unwrap();
    let w = dequantize_packed(&p);
    for row in 0..n {
        for c in 0..k {
            let u = (words[row * 2 + c / 8] >> (4 * (c % 8))) & 0xF;
            assert_eq!(w[row * k + c], (u as i32 - 8) as f32 * 0.5);
        }
    }
}

#[test]
fn awq_gemm_reads_the_interleave() {
    let (n, k, g) = (16, 64, 32);
    let groups = k / g;
    let mut r = rng();
    let iw: Vec<u32> = (0..k * n).map(|_| r.random_range(0..16)).collect(); // [K, N]
    let iz: Vec<u32> = (0..groups * n).map(|_| r.random_range(0..16)).collect(); // [G, N]
    let s: Vec<f32> = (0..groups * n)
        .map(|_| f16::from_f32(r.random_range(0.001..0.1)).to_f32())
        .collect();
    let pack = |vals: &[u32], rows: usize| {
        let mut out = vec![0u32; rows * n / 8];
        for row in 0..rows {
            for c in 0..n / 8 {
                for (i, &o) in AWQ_ORDER.iter().enumerate() {
                    out[row * (n / 8) + c] |= vals[row * n + c * 8 + o] << (4 * i);
                }
            }
        }
        i32_bytes(&out)
    };
    let (qb, zb) = (pack(&iw, k), pack(&iz, groups));
    let sb: Vec<u8> = s
        .iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect();
    let (qs, ss, zs) = ([k, n / 8], [groups, n], [groups, n / 8]);
    let p = PackedLinear {
        scheme: PackedScheme::AwqGemm { group_size: g },
        out_features: n,
        in_features: k,
        qweight: view(WeightDType::I32, &qs, &qb),
        scales: view(WeightDType::F16, &ss, &sb),
        zeros: Some(view(WeightDType::I32, &zs, &zb)),
        g_idx: None,
        global_scale: None,
    };
    p.validate().unwrap();
    let w = dequantize_packed(&p);
    for row in 0..n {
        for c in 0..k {
            let gr = c / g;
            let want = (iw[c * n + row] as i32 - iz[gr * n + row] as i32) as f32 * s[gr * n + row];
            assert_eq!(w[row * k + c], want, "out {row} in {c}");
        }
    }
}

#[test]
fn gptq_v1_adds_one_to_the_zeros_and_follows_g_idx() {
    let (n, k, g) = (8, 32, 16);
    let groups = k / g;
    let mut r = rng();
    let iw: Vec<u32> = (0..k * n).map(|_| r.random_range(0..16)).collect(); // [K, N]
    let iz: Vec<u32> = (0..groups * n).map(|_| r.random_range(1..16)).collect(); // true zeros
    let s: Vec<f32> = (0..groups * n)
        .map(|_| f16::from_f32(r.random_range(0.001..0.1)).to_f32())
        .collect();
    let g_idx: Vec<i32> = (0..k).map(|c| ((c * 5) % k / g) as i32).collect();
    let mut qw = vec![0u32; k / 8 * n];
    for c in 0..k {
        for row in 0..n {
            qw[(c / 8) * n + row] |= iw[c * n + row] << (4 * (c % 8));
        }
    }
    let mut qz = vec![0u32; groups * n / 8];
    for gr in 0..groups {
        for row in 0..n {
            qz[gr * (n / 8) + row / 8] |= (iz[gr * n + row] - 1) << (4 * (row % 8));
        }
    }
    let (qb, zb) = (i32_bytes(&qw), i32_bytes(&qz));
    let sb: Vec<u8> = s
        .iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect();
    let gb: Vec<u8> = g_idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (qs, ss, zs, gs) = ([k / 8, n], [groups, n], [groups, n / 8], [k]);
    let p = PackedLinear {
        scheme: PackedScheme::Gptq {
            group_size: g,
            zero_minus_one: true,
        },
        out_features: n,
        in_features: k,
        qweight: view(WeightDType::I32, &qs, &qb),
        scales: view(WeightDType::F16, &ss, &sb),
        zeros: Some(view(WeightDType::I32, &zs, &zb)),
        g_idx: Some(view(WeightDType::I32, &gs, &gb)),
        global_scale: None,
    };
    p.validate().unwrap();
    let w = dequantize_packed(&p);
    for row in 0..n {
        for c in 0..k {
            let gr = g_idx[c] as usize;
            let want = (iw[c * n + row] as i32 - iz[gr * n + row] as i32) as f32 * s[gr * n + row];
            assert_eq!(w[row * k + c], want, "out {row} in {c}");
        }
    }
}

#[test]
fn nvfp4_uses_block_scales_over_the_global_scale() {
    let (n, k) = (2, 32);
    let bytes: Vec<u8> = (0..n * k / 2).map(|i| (i * 37 % 256) as u8).collect();
    let scales: Vec<u8> = vec![0x38, 0x40, 0x30, 0x48]; // 1, 2, 0.5, 4
    let gs = 4.0f32.to_le_bytes();
    let (qs, ss, gss) = ([n, k / 2], [n, k / 16], [1usize]);
    let p = PackedLinear {
        scheme: PackedScheme::CtNvfp4,
        out_features: n,
        in_features: k,
        qweight: view(WeightDType::U8, &qs, &bytes),
        scales: view(WeightDType::F8E4M3, &ss, &scales),
        zeros: None,
        g_idx: None,
        global_scale: Some(view(WeightDType::F32, &gss, &gs)),
    };
    p.validate().unwrap();
    let w = dequantize_packed(&p);
    let block = [1.0f32, 2.0, 0.5, 4.0];
    for row in 0..n {
        for c in 0..k {
            let b = bytes[row * k / 2 + c / 2];
            let nib = if c % 2 == 0 { b & 0xF } else { b >> 4 };
            let want = fp4_e2m1(nib) * (block[row * 2 + c / 16] / 4.0);
            assert_eq!(w[row * k + c], want);
        }
    }
}
