//! The synthetic Qwen3.5-27B: inventory, packing, device bytes, and one generated linear of
//! each format through the CPU reference matmul.

use super::*;
use crate::backend::{Backend, CpuBackend};
use crate::model::memory::weights_device_bytes;
use crate::quant::packed::dequantize_packed_row;
use crate::tensor::LinearView;

const GIB: usize = 1 << 30;

#[test]
fn inventory_is_the_851_text_tensors_when_dense() {
    let w = SyntheticWeights::qwen3_5_27b(SyntheticQuant::Bf16, 1);
    // 3 + 64 × 5 + 48 × 9 + 16 × 6 (qwen3_5.md §2.2).
    assert_eq!(w.names().len(), 851);
    let params: usize = w
        .names()
        .iter()
        .map(|n| w.tensor_info(n).unwrap().numel())
        .sum();
    // About 26.9 B text parameters.
    assert!(
        (26_700_000_000..27_000_000_000).contains(&params),
        "{params}"
    );
    // Dense BF16 is ~50 GiB: it does not fit one 32 GB card.
    let bytes = weights_device_bytes(&w, 2);
    assert!(bytes > 49 * GIB, "{bytes}");
}

#[test]
fn w4a16_27b_text_model_fits_in_19_gib_with_16_bit_head_and_embeddings() {
    let w = qwen3_5_27b_weights(SyntheticQuant::W4A16, 1);
    let bytes = weights_device_bytes(w.as_ref(), 2);
    let gib = bytes as f64 / GIB as f64;
    println!("synthetic Qwen3.5-27B W4A16: {gib:.2} GiB on the device");
    assert!(bytes <= 19 * GIB, "{gib:.2} GiB");
    // The 16-bit parts alone: embedding + lm_head are 2 × 248320 × 5120 × 2 bytes.
    let head = 2 * qwen3_5_27b::VOCAB * qwen3_5_27b::HIDDEN * 2;
    // ~24.3 B packed weights at half a byte each, plus scales and zero points.
    assert!(
        bytes > head + 12_150_000_000,
        "{gib:.2} GiB is too little for 24.3 B 4-bit weights"
    );
    let nv = weights_device_bytes(qwen3_5_27b_weights(SyntheticQuant::Nvfp4, 1).as_ref(), 2);
    assert!(nv <= 19 * GIB, "NVFP4 {:.2} GiB", nv as f64 / GIB as f64);
}

#[test]
fn ignored_linears_are_dense_and_the_rest_packed_with_the_real_shapes() {
    use qwen3_5_27b::*;
    let w = qwen3_5_27b_weights(SyntheticQuant::W4A16, 1);
    let l = "model.language_model.layers";
    for (m, n, k) in [
        (format!("{l}.0.linear_attn.in_proj_qkv"), GDN_QKV, HIDDEN),
        (format!("{l}.0.linear_attn.in_proj_z"), GDN_V, HIDDEN),
        (format!("{l}.0.linear_attn.out_proj"), HIDDEN, GDN_V),
        (format!("{l}.3.self_attn.q_proj"), Q_PROJ, HIDDEN),
        (format!("{l}.3.self_attn.k_proj"), KV_PROJ, HIDDEN),
        (format!("{l}.3.self_attn.o_proj"), HIDDEN, ATTN_OUT),
        (format!("{l}.63.mlp.gate_proj"), INTERMEDIATE, HIDDEN),
        (format!("{l}.63.mlp.down_proj"), HIDDEN, INTERMEDIATE),
    ] {
        match w.linear(&m).unwrap() {
            LinearView::Packed(p) => {
                assert_eq!((p.out_features, p.in_features), (n, k), "{m}");
                p.validate().unwrap();
            }
            LinearView::Dense(_) => panic!("{m} should be packed"),
        }
    }
    for m in [
        "lm_head".to_string(),
        format!("{l}.0.linear_attn.in_proj_a"),
        format!("{l}.4.linear_attn.in_proj_b"),
    ] {
        let LinearView::Dense(v) = w.linear(&m).unwrap() else {
            panic!("{m} should be dense");
        };
        assert_eq!(v.dtype, WeightDType::BF16);
    }
}

#[test]
fn generated_linears_run_through_the_cpu_reference() {
    let b = CpuBackend::new(0).unwrap();
    let x: Vec<f32> = (0..2 * 5120)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    for quant in [SyntheticQuant::W4A16, SyntheticQuant::Nvfp4] {
        let w = qwen3_5_27b_weights(quant, 9);
        let m = "model.language_model.layers.3.self_attn.k_proj";
        let view = w.linear(m).unwrap();
        let LinearView::Packed(p) = view else {
            panic!("packed")
        };
        let cw = b.upload_linear(m, &view).unwrap();
        assert_eq!(b.weight_bytes(&cw), p.stored_bytes());
        let mut out = vec![0.0; 2 * 1024];
        b.matmul(&x, 2, &cw, &mut out).unwrap();
        let mut row = vec![0.0; 5120];
        for j in [0, 511, 1023] {
            dequantize_packed_row(&p, j, &mut row);
            assert!(row.iter().all(|v| v.is_finite()));
            for i in 0..2 {
                let want: f64 = (0..5120)
                    .map(|t| f64::from(x[i * 5120 + t]) * f64::from(row[t]))
                    .sum();
                let mag: f64 = (0..5120)
                    .map(|t| (f64::from(x[i * 5120 + t]) * f64::from(row[t])).abs())
                    .sum();
                let got = f64::from(out[i * 1024 + j]);
                assert!(
                    (got - want).abs() <= 1e-5 * mag,
                    "{quant:?} [{i},{j}] {got} vs {want}"
                );
            }
        }
        // Same seed, same bytes; another seed, other bytes.
        let again = qwen3_5_27b_weights(quant, 9);
        let other = qwen3_5_27b_weights(quant, 10);
        let q = |s: &dyn WeightSource| {
            s.tensor(&format!("{m}.weight_packed"))
                .unwrap()
                .data
                .to_vec()
        };
        assert_eq!(q(w.as_ref()), q(again.as_ref()));
        assert_ne!(q(w.as_ref()), q(other.as_ref()));
    }
}

/// The synthetic model of `d` on the CPU through the real runner path.
fn cpu_runner(
    d: &SyntheticDims,
    quant: SyntheticQuant,
    seed: u64,
) -> Box<dyn crate::model::step::ModelRunner> {
    use crate::model::options::{Device, RunnerOptions};
    let config = d.config().unwrap();
    let weights = qwen3_5_weights(d, quant, seed);
    let opts = RunnerOptions {
        device: Device::Cpu,
        threads: 2,
        kv_cache_mib: 16,
        max_num_seqs: 4,
        enable_prefix_caching: false,
        ..Default::default()
    };
    crate::model::runner::build_runner_for(&config, weights.as_ref(), &opts).unwrap()
}

/// Logits rows of a 2-sequence prefill of 20 tokens, then of 4 decode steps.
fn run_steps(r: &mut dyn crate::model::step::ModelRunner, vocab: usize) -> Vec<f32> {
    use crate::model::step::LogitsFor;
    let mut b = SyntheticBatch::new(2, 24, r.cache_geometry(), vocab, 5).unwrap();
    let mut all = r
        .forward(&b.step(20, LogitsFor::Last, None))
        .unwrap()
        .logits;
    for _ in 0..4 {
        all.extend(r.forward(&b.step(1, LogitsFor::Last, None)).unwrap().logits);
    }
    assert_eq!(all.len(), 5 * 2 * vocab);
    all
}

fn rms(v: &[f32]) -> f64 {
    (v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
}

#[test]
fn tiny_synthetic_model_runs_end_to_end_through_the_runner() {
    let d = SyntheticDims::TINY;
    let config = d.config().unwrap();
    assert_eq!(
        config.hybrid.as_ref().unwrap().weight_prefix,
        "model.language_model"
    );
    for quant in [
        SyntheticQuant::W4A16,
        SyntheticQuant::Nvfp4,
        SyntheticQuant::Bf16,
    ] {
        let mut r = cpu_runner(&d, quant, 1);
        assert!(r.cache_geometry().num_state_slots >= 2, "{quant:?}");
        let a = run_steps(r.as_mut(), d.vocab);
        assert!(
            a.iter().all(|v| v.is_finite()),
            "{quant:?}: non-finite logits"
        );
        let s = rms(&a);
        assert!((0.05..20.0).contains(&s), "{quant:?}: logits rms {s}");
        // The same seed in a fresh runner gives the same logits; another seed others.
        let b = run_steps(cpu_runner(&d, quant, 1).as_mut(), d.vocab);
        assert_eq!(a, b, "{quant:?}: not deterministic for a seed");
        let c = run_steps(cpu_runner(&d, quant, 2).as_mut(), d.vocab);
        assert_ne!(a, c, "{quant:?}: the seed does not change the weights");
    }
}

#[test]
fn activations_stay_finite_over_64_layers() {
    // The 27B's depth at tiny widths: the value scaling keeps the residual stream and the
    // logits O(1), whatever the packing.
    let d = SyntheticDims {
        layers: 64,
        ..SyntheticDims::TINY
    };
    for quant in [
        SyntheticQuant::W4A16,
        SyntheticQuant::Nvfp4,
        SyntheticQuant::Bf16,
    ] {
        let a = run_steps(cpu_runner(&d, quant, 3).as_mut(), d.vocab);
        assert!(a.iter().all(|v| v.is_finite()), "{quant:?}");
        let s = rms(&a);
        assert!((0.05..20.0).contains(&s), "{quant:?}: logits rms {s}");
    }
}

#[test]
fn greedy_samples_feed_back_as_the_bench_does() {
    use crate::model::step::LogitsFor;
    use crate::sampling::SamplingRow;
    let d = SyntheticDims::TINY;
    let mut r = cpu_runner(&d, SyntheticQuant::W4A16, 1);
    let mut b = SyntheticBatch::new(2, 16, r.cache_geometry(), d.vocab, 3).unwrap();
    let out = r.forward(&b.step(8, LogitsFor::Last, None)).unwrap();
    // The greedy token of each prefill row is its argmax.
    let argmax = |row: &[f32]| {
        (0..row.len())
            .max_by(|&i, &j| row[i].total_cmp(&row[j]))
            .unwrap() as u32
    };
    let want: Vec<u32> = out.logits.chunks(d.vocab).map(argmax).collect();
    let mut c = SyntheticBatch::new(2, 16, r.cache_geometry(), d.vocab, 3).unwrap();
    let greedy = LogitsFor::Sample(SamplingRow::greedy());
    let out = r.forward(&c.step(8, greedy.clone(), None)).unwrap();
    let got: Vec<u32> = out
        .samples
        .iter()
        .map(|s| s.as_ref().unwrap().token_id)
        .collect();
    assert_eq!(got, want);
    let next = r.forward(&c.step(1, greedy, Some(&got))).unwrap();
    assert_eq!(next.samples.len(), 2);
}
