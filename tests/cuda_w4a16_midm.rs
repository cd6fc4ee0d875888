//! Where the packed 4-bit matmul should leave the GEMV for the GEMM (issue 10): the GEMV
//! (`w4_gemv32` blocks of 32 rows, `grid.y = ⌈m / 32⌉`) and the GEMMs (`w4_gemm`, the wide sm_90
//! `w4g_gemm`, the sm_90 warpgroup-MMA `w4g_wgmma` and its warp-specialised `w4g_ws`) timed at 32 … 4 096 rows on every packed linear shape of Qwen3.5-27B, and the sum
//! over one decode step's linears (48 Gated DeltaNet layers, 16 gated-attention layers, 64 MLPs)
//! for each choice. The kernels agree bit for bit (the one numeric path of `kernels/w4a16.cu`), so
//! the switch point is a speed question only; this test checks that equality at every row count it
//! times and prints the figures (`RESULT` lines) that set `GEMV_MID_ROWS` in
//! `src/backend/cuda/backend/w4a16.rs` (the rule where the sm_90 mid-M GEMMs `w4g_split` /
//! `w4g_tile` do not run; their own sweep is `cuda_w4a16_bench`'s `w4a16_wide_gemm_speed`;
//! docs/benchmarks.md).
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run`):
//! `LD_LIBRARY_PATH=/usr/local/cuda/lib64 cuda_w4a16_midm-<hash> --ignored --test-threads=1 --nocapture`
//! (`KILN_MIDM_ROWS=1024,4096` times only those row counts; `KILN_MIDM_KERNELS=wgmma,ws` only
//! those kernels besides the GEMV, the reference of the bit check).
//!
//! Timing as in `cuda_w4a16_bench`: host wall clock around back-to-back launches on the backend's
//! stream, median of several repetitions; random CT W4A16 weights (symmetric, group 128), bf16.
#![cfg(feature = "cuda")]

mod common;
mod w4_support;

use common::*;
use kiln::backend::cuda::W4Kernel;
use kiln::backend::Backend;
use kiln::tensor::LinearView;
use w4_support::{Fmt, Owned};

/// The packed linears of one Qwen3.5-27B decode step: (N, K, how many per step).
const STEP_LINEARS: [(usize, usize, usize); 7] = [
    (10240, 5120, 48),  // GDN in_proj_qkv
    (6144, 5120, 48),   // GDN in_proj_z
    (5120, 6144, 64),   // GDN out_proj (48) and attention o_proj (16)
    (12288, 5120, 16),  // attention q_proj (with the output gate)
    (1024, 5120, 32),   // attention k_proj and v_proj
    (17408, 5120, 128), // MLP gate_proj and up_proj
    (5120, 17408, 64),  // MLP down_proj
];

/// Row counts timed.
const ROWS: [usize; 12] = [32, 33, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 4096];

#[test]
#[ignore = "needs a GPU: see the header"]
fn w4a16_gemv_or_gemm_by_rows() {
    let mut b = gpu("bf16", "auto");
    println!("device: {}", b.name());
    // The GEMV column is the x-staged / 32-row GEMV: the 17–64-row rule (`w4a16_xr.rs`, its own
    // sweep `cuda_w4a16_xr`) off, where it exists.
    b.set_w4_xr(false, None, (17, 64));
    let all = [
        ("gemv", W4Kernel::Gemv),
        ("gemm", W4Kernel::GemmBase),
        ("wide", W4Kernel::GemmWide),
        ("wgmma", W4Kernel::GemmWgmma),
        ("ws", W4Kernel::GemmWs),
    ];
    // `KILN_MIDM_KERNELS=wgmma,ws`: only these besides the GEMV (a shorter GPU run; the skipped
    // kernels' columns read 0).
    let only: Option<Vec<String>> = std::env::var("KILN_MIDM_KERNELS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let kernels: Vec<(usize, &str, W4Kernel)> = all
        .iter()
        .enumerate()
        .filter(|(i, (name, _))| {
            *i == 0 || only.as_ref().is_none_or(|o| o.iter().any(|s| s == name))
        })
        .map(|(i, &(name, kern))| (i, name, kern))
        .collect();
    // `KILN_MIDM_ROWS=1024,4096`: only these row counts (a shorter GPU run).
    let rows: Vec<usize> = match std::env::var("KILN_MIDM_ROWS") {
        Ok(v) => v.split(',').filter_map(|m| m.trim().parse().ok()).collect(),
        Err(_) => ROWS.to_vec(),
    };
    // Per-step totals (µs) per row count: [gemv, gemm, wide, wgmma, ws].
    let mut step = vec![[0.0f64; 5]; rows.len()];
    let max_m = *rows.iter().max().unwrap_or(&1);
    for (i, &(n, k, count)) in STEP_LINEARS.iter().enumerate() {
        let o = Owned::random(
            Fmt::Ct {
                group: 128,
                symmetric: true,
                act_order: false,
            },
            n,
            k,
            31 + i as u64,
        );
        let w = b
            .upload_linear("midm", &LinearView::Packed(o.linear()))
            .expect("upload");
        let x = b.upload(&data(max_m * k, 5 + i as u64)).expect("x");
        for (ri, &m) in rows.iter().enumerate() {
            let mut line = format!("RESULT midm N={n} K={k} M={m}");
            let mut first: Option<Vec<f32>> = None;
            for &(ki, name, kern) in &kernels {
                // A fresh NaN-poisoned output per kernel, so a kernel that wrote nothing fails.
                let mut out = b.upload(&vec![f32::NAN; m * n]).expect("out");
                let t = time(&b, || {
                    b.matmul_w4_with(&x, m, &w, &mut out, kern).expect("matmul")
                });
                step[ri][ki] += t * 1e6 * count as f64;
                let flops = 2.0 * (m * n * k) as f64;
                line += &format!(
                    " {name}_us={:.2} {name}_TFLOPs={:.1}",
                    t * 1e6,
                    flops / t / 1e12
                );
                // One numeric path: every kernel gives the same bits at every row count.
                let got = down(&b, &out, m * n);
                match &first {
                    None => {
                        assert!(
                            got.iter().all(|v| v.is_finite()) && got.iter().any(|&v| v != 0.0),
                            "gemv output at N={n} K={k} M={m} is not finite or all zero"
                        );
                        first = Some(got)
                    }
                    Some(want) => assert!(
                        bits_equal(want, &got),
                        "{name} differs from the gemv at N={n} K={k} M={m}"
                    ),
                }
            }
            println!("{line}");
        }
    }
    for (ri, &m) in rows.iter().enumerate() {
        let [v, g, wd, wm, ws] = step[ri];
        // The best of the kernels that ran (a skipped kernel's total is 0).
        let best = ["gemv", "gemm", "wide", "wgmma", "ws"][kernels
            .iter()
            .map(|&(ki, _, _)| ki)
            .min_by(|&a, &b| step[ri][a].total_cmp(&step[ri][b]))
            .unwrap_or(0)];
        println!(
            "RESULT midm step M={m} linears_ms gemv={:.2} gemm={:.2} wide={:.2} wgmma={:.2} ws={:.2} best={best}",
            v / 1e3,
            g / 1e3,
            wd / 1e3,
            wm / 1e3,
            ws / 1e3,
        );
    }
}
