//! The whole synthetic Qwen3.5-27B through the real runner (`kiln bench --synthetic
//! qwen3.5-27b --quant …`, the default mode): the seeded random text model
//! ([`crate::model::synthetic`]) loaded by `model::runner::build_runner_for` onto a GPU (memory
//! planner, KV cache of the 16 attention layers, GDN state slots, workspace), then
//! - decode: `n` sequences (each `n` of `--synthetic-batches`, default 1 / 8 / 32) prefilled with
//!   `--prompt-tokens` (128) random tokens in one step, then `--gen-tokens` (64) decode steps
//!   of one token each, greedy-sampled on the device and fed back; tokens/s = n × steps / time
//!   of the decode steps;
//! - prefill: one sequence of `p` tokens (each of `--synthetic-prefill`, default 1,024 / 8,192)
//!   in one step; tokens/s = p / step time (best of two up to 2,048 tokens, else one run);
//! - memory: device bytes used after the load and after the first step (free-memory deltas),
//!   beside what the runner holds: weights (`ModelRunner::weight_bytes` = linears + lm_head;
//!   the embedding table apart), KV blocks and state slots (from the cache geometry);
//! - the batch-1 decode against its roofline: bytes one step must read (every linear and the
//!   lm_head once, one state slot read and written, the KV of the average context) over the
//!   device-to-device copy bandwidth measured in the same run.
//!
//! NaN guard: the prefill's and a final decode step's logits rows are downloaded and checked
//! finite, and every greedy sample must succeed (a row without a finite maximum fails); any
//! non-finite value is an error, not a figure.

use std::time::Instant;

use super::super::bench::BenchError;
use super::SyntheticArgs;
use crate::model::step::{LogitsFor, ModelRunner};
use crate::model::synthetic::{qwen3_5_weights, SyntheticBatch, SyntheticDims, SyntheticQuant};
use crate::sampling::SamplingRow;

const GIB: f64 = (1u64 << 30) as f64;

fn fail(what: &str, e: &dyn std::fmt::Display) -> BenchError {
    BenchError::InvalidArgument(format!("--synthetic: {what}: {e}"))
}

/// What one model run measured (also returned to the GPU test).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FullReport {
    /// `w4a16`, `nvfp4` or `bf16`.
    pub quant: String,
    /// The device's name.
    pub device: String,
    /// Whether decode steps were replayed from CUDA graphs.
    pub cuda_graphs: bool,
    /// Seconds from the first weight made to the runner ready (generation included).
    pub load_s: f64,
    /// Bytes of every tensor as the planner counts them (linears, embeddings, norms).
    pub planned_weight_bytes: usize,
    /// `ModelRunner::weight_bytes` (linears + lm_head on the device).
    pub runner_weight_bytes: u64,
    /// KV-cache bytes (blocks × block bytes) and blocks.
    pub kv_bytes: usize,
    pub kv_blocks: usize,
    /// State-slot bytes and slots.
    pub state_bytes: usize,
    pub state_slots: usize,
    /// Device bytes used after the load, and after the first step (workspace made).
    pub used_after_load: usize,
    pub used_after_step: usize,
    /// Device copy bandwidth, bytes/s.
    pub copy_bytes_per_s: f64,
    /// (sequences, decode tokens/s, median ms per decode step).
    pub decode: Vec<(usize, f64, f64)>,
    /// (prompt tokens, prefill tokens/s).
    pub prefill: Vec<(usize, f64)>,
    /// Bytes one batch-1 decode step reads, and the measured step over the roofline step.
    pub batch1_bytes: f64,
    pub batch1_roofline_fraction: Option<f64>,
    /// Largest |logit| seen in the checked rows (all finite).
    pub max_abs_logit: f32,
}

/// Load the synthetic 27B packed as `q` on CUDA device `ordinal` and measure it.
pub fn measure(
    ordinal: usize,
    q: SyntheticQuant,
    quant: &str,
    args: &SyntheticArgs,
) -> Result<FullReport, BenchError> {
    use crate::model::options::{Device, RunnerOptions};
    let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| fail("CUDA context", &e))?;
    let free = || -> Result<usize, BenchError> {
        ctx.mem_get_info()
            .map(|(f, _)| f)
            .map_err(|e| fail("memory info", &e))
    };
    let free0 = free()?;
    let d = SyntheticDims::QWEN3_5_27B;
    let config = d.config().map_err(|e| fail("config", &e))?;
    let max_batch = args.batches.iter().copied().max().unwrap_or(1);
    let max_prefill = args.prefill.iter().copied().max().unwrap_or(0);
    let seq_len = args.prompt_tokens + args.gen_tokens + 1;
    let opts = RunnerOptions {
        device: Device::Cuda(ordinal),
        max_num_seqs: max_batch,
        max_num_batched_tokens: max_prefill.max(max_batch * args.prompt_tokens),
        max_model_len: max_prefill.max(seq_len),
        dtype: args.dtype.clone(),
        enable_prefix_caching: false,
        cuda_graphs: args.cuda_graphs,
        ..Default::default()
    };
    let elem = if args.dtype == "f32" { 4 } else { 2 };
    let t0 = Instant::now();
    let weights = qwen3_5_weights(&d, q, 1);
    let planned_weight_bytes = crate::model::memory::weights_device_bytes(weights.as_ref(), elem);
    let mut runner = crate::model::runner::build_runner_for(&config, weights.as_ref(), &opts)
        .map_err(|e| fail("load", &e))?;
    let load_s = t0.elapsed().as_secs_f64();
    drop(weights);
    let used_after_load = free0.saturating_sub(free()?);
    let g = runner.cache_geometry();
    let kv_per_token =
        config.num_kv_layers() * 2 * config.num_key_value_heads * config.head_dim * elem;
    let slot_bytes = crate::model::qwen3_5::state_spec(&config, 1)
        .map_err(|e| fail("state", &e))?
        .bytes_per_slot();
    let mut report = FullReport {
        quant: quant.to_owned(),
        device: runner.device_name(),
        cuda_graphs: args.cuda_graphs,
        load_s,
        planned_weight_bytes,
        runner_weight_bytes: runner.weight_bytes(),
        kv_bytes: g.num_blocks * g.block_size * kv_per_token,
        kv_blocks: g.num_blocks,
        state_bytes: g.num_state_slots * slot_bytes,
        state_slots: g.num_state_slots,
        used_after_load,
        used_after_step: 0,
        copy_bytes_per_s: 0.0,
        decode: vec![],
        prefill: vec![],
        batch1_bytes: 0.0,
        batch1_roofline_fraction: None,
        max_abs_logit: 0.0,
    };
    print_memory(&report, args.json);
    for &n in &args.batches {
        let (tps, step_ms) = decode(runner.as_mut(), n, args, &mut report)?;
        if report.used_after_step == 0 {
            report.used_after_step = free0.saturating_sub(free()?);
        }
        report.decode.push((n, tps, step_ms));
        if args.json {
            println!(
                "{}",
                serde_json::json!({"bench": "synthetic-decode", "quant": quant, "seqs": n,
                    "prompt": args.prompt_tokens, "generated": args.gen_tokens,
                    "tokens_per_s": tps, "step_ms": step_ms})
            );
        } else {
            println!(
                "  decode {n:>3} seqs (prompt {}, {} generated): {tps:>8.1} tok/s, {step_ms:.2} ms/step",
                args.prompt_tokens, args.gen_tokens
            );
        }
    }
    for &p in &args.prefill {
        let tps = prefill(runner.as_mut(), p, &mut report)?;
        report.prefill.push((p, tps));
        if args.json {
            println!(
                "{}",
                serde_json::json!({"bench": "synthetic-prefill", "quant": quant, "tokens": p,
                    "tokens_per_s": tps})
            );
        } else {
            println!(
                "  prefill {p:>5} tokens: {tps:>9.1} tok/s ({:.1} ms)",
                p as f64 / tps * 1e3
            );
        }
    }
    // Measured last, so its buffers never show in the memory figures.
    report.copy_bytes_per_s = copy_bandwidth(&ctx)?;
    if let Some(&(_, _, step_ms)) = report.decode.iter().find(|d| d.0 == 1) {
        // Every weight once, one slot read + written, the KV of the average context.
        let ctx_tokens = args.prompt_tokens as f64 + args.gen_tokens as f64 / 2.0;
        report.batch1_bytes = report.runner_weight_bytes as f64
            + 2.0 * slot_bytes as f64
            + ctx_tokens * kv_per_token as f64;
        let roofline_ms = report.batch1_bytes / report.copy_bytes_per_s * 1e3;
        report.batch1_roofline_fraction = Some(roofline_ms / step_ms);
        if !args.json {
            println!(
                "  batch-1 decode roofline: {:.2} GB per step at {:.0} GB/s copy bandwidth = {roofline_ms:.2} ms; measured {step_ms:.2} ms = {:.3} of the roofline",
                report.batch1_bytes / 1e9,
                report.copy_bytes_per_s / 1e9,
                roofline_ms / step_ms
            );
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&report).expect("plain data"));
    } else {
        println!(
            "  device memory after the first step {:.2} GiB (workspace and step buffers {:.2} GiB); max |logit| {:.3}, all finite",
            report.used_after_step as f64 / GIB,
            report.used_after_step.saturating_sub(report.used_after_load) as f64 / GIB,
            report.max_abs_logit
        );
    }
    Ok(report)
}

fn print_memory(r: &FullReport, json: bool) {
    let gib = |b: f64| b / GIB;
    if json {
        println!(
            "{}",
            serde_json::json!({"bench": "synthetic-load", "quant": r.quant, "device": r.device,
                "load_s": r.load_s, "device_used_gib": gib(r.used_after_load as f64),
                "planned_weights_gib": gib(r.planned_weight_bytes as f64),
                "runner_weights_gib": gib(r.runner_weight_bytes as f64),
                "kv_gib": gib(r.kv_bytes as f64), "kv_blocks": r.kv_blocks,
                "state_gib": gib(r.state_bytes as f64), "state_slots": r.state_slots})
        );
    } else {
        println!("device: {}, decode CUDA graphs {}", r.device, r.cuda_graphs);
        println!(
            "qwen3.5-27b {} (whole model through the Qwen3.5 runner): loaded in {:.1} s; device memory {:.2} GiB = weights {:.2} GiB (linears + lm_head {:.2}, embeddings/norms/conv the rest) + KV {:.2} GiB ({} blocks) + {} state slots {:.2} GiB + context/other",
            r.quant,
            r.load_s,
            gib(r.used_after_load as f64),
            gib(r.planned_weight_bytes as f64),
            gib(r.runner_weight_bytes as f64),
            gib(r.kv_bytes as f64),
            r.kv_blocks,
            r.state_slots,
            gib(r.state_bytes as f64)
        );
    }
}

/// Check a step's logits rows: all finite; track the largest magnitude.
fn check_logits(logits: &[f32], what: &str, report: &mut FullReport) -> Result<(), BenchError> {
    if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
        return Err(fail(
            what,
            &format!("non-finite logit {} at {i}", logits[i]),
        ));
    }
    let m = logits.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    report.max_abs_logit = report.max_abs_logit.max(m);
    Ok(())
}

/// `n` sequences: prefill, then timed greedy decode steps. (tokens/s, median ms per step).
fn decode(
    r: &mut dyn ModelRunner,
    n: usize,
    args: &SyntheticArgs,
    report: &mut FullReport,
) -> Result<(f64, f64), BenchError> {
    let what = format!("decode at {n} sequences");
    let len = args.prompt_tokens + args.gen_tokens + 1;
    let mut b = SyntheticBatch::new(n, len, r.cache_geometry(), r.vocab_size(), 7)
        .map_err(|e| fail(&what, &e))?;
    let out = r
        .forward(&b.step(args.prompt_tokens, LogitsFor::Last, None))
        .map_err(|e| fail(&what, &e))?;
    check_logits(&out.logits, &what, report)?;
    let mut tokens: Vec<u32> = (0..n as u32).collect();
    let mut times = Vec::with_capacity(args.gen_tokens);
    let t0 = Instant::now();
    for _ in 0..args.gen_tokens {
        let t = Instant::now();
        let out = r
            .forward(&b.step(1, LogitsFor::Sample(SamplingRow::greedy()), Some(&tokens)))
            .map_err(|e| fail(&what, &e))?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        for (slot, s) in tokens.iter_mut().zip(&out.samples) {
            *slot = s.as_ref().map_err(|e| fail(&what, e))?.token_id;
        }
    }
    let total = t0.elapsed().as_secs_f64();
    let out = r
        .forward(&b.step(1, LogitsFor::Last, Some(&tokens)))
        .map_err(|e| fail(&what, &e))?;
    check_logits(&out.logits, &what, report)?;
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    Ok(((n * args.gen_tokens) as f64 / total, median))
}

/// One sequence of `p` tokens in one step: tokens/s (best of two up to 2,048 tokens; one run
/// above, after the shorter prefills and the decode batches have warmed every kernel).
fn prefill(r: &mut dyn ModelRunner, p: usize, report: &mut FullReport) -> Result<f64, BenchError> {
    let what = format!("prefill of {p} tokens");
    let mut best = f64::INFINITY;
    for rep in 0..if p <= 2048 { 2 } else { 1 } {
        let mut b = SyntheticBatch::new(1, p, r.cache_geometry(), r.vocab_size(), 11 + rep)
            .map_err(|e| fail(&what, &e))?;
        let t = Instant::now();
        let out = r
            .forward(&b.step(p, LogitsFor::Last, None))
            .map_err(|e| fail(&what, &e))?;
        best = best.min(t.elapsed().as_secs_f64());
        check_logits(&out.logits, &what, report)?;
    }
    Ok(p as f64 / best)
}

/// Device-to-device copy bandwidth (read + write bytes / s) of a 1 GiB buffer, median of 5.
fn copy_bandwidth(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> Result<f64, BenchError> {
    let s = ctx.default_stream();
    let bytes = 1usize << 30;
    let err = |e: cudarc::driver::DriverError| fail("copy bandwidth", &e);
    let src = s.alloc_zeros::<u8>(bytes).map_err(err)?;
    let mut dst = s.alloc_zeros::<u8>(bytes).map_err(err)?;
    s.memcpy_dtod(&src, &mut dst).map_err(err)?;
    s.synchronize().map_err(err)?;
    let mut t: Vec<f64> = Vec::with_capacity(5);
    for _ in 0..5 {
        let st = Instant::now();
        for _ in 0..5 {
            s.memcpy_dtod(&src, &mut dst).map_err(err)?;
        }
        s.synchronize().map_err(err)?;
        t.push(st.elapsed().as_secs_f64() / 5.0);
    }
    t.sort_by(f64::total_cmp);
    Ok(2.0 * bytes as f64 / t[2])
}
