//! Tests of [`Llama`] on tiny synthetic models: against a dense, unpaged reference forward
//! written out below, and for the invariances the engine relies on (chunking, batching and
//! block placement do not change a row's logits).

pub(crate) use super::tiny::{tiny_config, tiny_weights, MapSource};
use super::*;
use crate::backend::CpuBackend;
use crate::model::step::{ForwardOutput, LogitsFor, SeqSlice};
use crate::tensor::WeightDType;

/// The forward pass written densely (no paging, no backend), f64 throughout: logits
/// `[tokens.len(), vocab]` for every position of one sequence.
fn dense_reference(c: &ModelConfig, w: &MapSource, tokens: &[u32]) -> Vec<f32> {
    let (h, hd, nh, nkv) = (
        c.hidden_size,
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
    );
    let t = tokens.len();
    let f = |name: &str| w.f32(name).into_iter().map(f64::from).collect::<Vec<f64>>();
    let matvec = |m: &[f64], x: &[f64]| -> Vec<f64> {
        m.chunks(x.len())
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    };
    let norm = |x: &[f64], wt: &[f64]| -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + c.rms_norm_eps as f64).sqrt();
        x.iter().zip(wt).map(|(v, w)| v * inv * w).collect()
    };
    let rope = |x: &mut [f64], pos: usize| {
        let half = hd / 2;
        for head in x.chunks_mut(hd) {
            for i in 0..half {
                let freq = 1.0 / (c.rope_theta as f64).powf(2.0 * i as f64 / hd as f64);
                let (cs, sn) = ((pos as f64 * freq).cos(), (pos as f64 * freq).sin());
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cs - b * sn;
                head[i + half] = b * cs + a * sn;
            }
        }
    };
    let embed = f("model.embed_tokens.weight");
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&id| embed[id as usize * h..(id as usize + 1) * h].to_vec())
        .collect();
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let g = |n: &str| f(&format!("{p}.{n}.weight"));
        let (wq, wk, wv, wo) = (
            g("self_attn.q_proj"),
            g("self_attn.k_proj"),
            g("self_attn.v_proj"),
            g("self_attn.o_proj"),
        );
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let hn = norm(x, &g("input_layernorm"));
            let (mut q, mut k) = (matvec(&wq, &hn), matvec(&wk, &hn));
            if c.architecture == Architecture::Qwen3 {
                q = q
                    .chunks(hd)
                    .flat_map(|hq| norm(hq, &g("self_attn.q_norm")))
                    .collect();
                k = k
                    .chunks(hd)
                    .flat_map(|hk| norm(hk, &g("self_attn.k_norm")))
                    .collect();
            }
            rope(&mut q, pos);
            rope(&mut k, pos);
            qs.push(q);
            ks.push(k);
            vs.push(matvec(&wv, &hn));
        }
        for pos in 0..t {
            let mut attn = vec![0.0; nh * hd];
            for head in 0..nh {
                let kvh = head / (nh / nkv);
                let q = &qs[pos][head * hd..(head + 1) * hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        let k = &ks[j][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, wgt) in e.iter().enumerate() {
                    for d in 0..hd {
                        attn[head * hd + d] += wgt / sum * vs[j][kvh * hd + d];
                    }
                }
            }
            let o = matvec(&wo, &attn);
            for (x, o) in xs[pos].iter_mut().zip(o) {
                *x += o;
            }
            let hn = norm(&xs[pos], &g("post_attention_layernorm"));
            let (gate, up) = (
                matvec(&g("mlp.gate_proj"), &hn),
                matvec(&g("mlp.up_proj"), &hn),
            );
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = matvec(&g("mlp.down_proj"), &act);
            for (x, d) in xs[pos].iter_mut().zip(d) {
                *x += d;
            }
        }
    }
    let head = if c.tie_word_embeddings {
        embed
    } else {
        f("lm_head.weight")
    };
    let fnorm = f("model.norm.weight");
    xs.iter()
        .flat_map(|x| matvec(&head, &norm(x, &fnorm)))
        .map(|v| v as f32)
        .collect()
}

fn load(c: &ModelConfig, w: &MapSource, num_blocks: usize) -> Llama<CpuBackend> {
    Llama::load(CpuBackend::new(2).unwrap(), c, w, 4, num_blocks).unwrap()
}

fn slice(
    start: usize,
    len: usize,
    cached_len: usize,
    table: &[u32],
    logits: LogitsFor,
) -> SeqSlice {
    SeqSlice {
        start,
        len,
        cached_len,
        block_table: table.to_vec(),
        logits,
        state_slot: None,
    }
}

fn one_seq(tokens: &[u32], cached_len: usize, table: &[u32], logits: LogitsFor) -> ForwardBatch {
    ForwardBatch {
        token_ids: tokens.to_vec(),
        seqs: vec![slice(0, tokens.len(), cached_len, table, logits)],
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const PROMPT: [u32; 11] = [3, 17, 0, 39, 22, 22, 8, 31, 5, 12, 26];

/// Tolerance of the f32 model against the f64 dense reference on these tiny models.
const DENSE_TOL: f32 = 1e-4;

/// The model's logits of every position of [`PROMPT`] (one prefill in blocks `table` of an
/// 8-block cache) against [`dense_reference`], within [`DENSE_TOL`].
fn assert_matches_dense_reference(c: &ModelConfig, w: &MapSource, table: &[u32]) {
    let mut m = load(c, w, 8);
    let got = m
        .forward(&one_seq(&PROMPT, 0, table, LogitsFor::All))
        .unwrap()
        .logits;
    let want = dense_reference(c, w, &PROMPT);
    let d = max_abs_diff(&got, &want);
    assert!(d < DENSE_TOL, "max |Δ| {d}");
}

#[test]
fn llama_prefill_matches_the_dense_reference() {
    let c = tiny_config(Architecture::Llama);
    let w = tiny_weights(&c, 7, WeightDType::F32);
    assert_matches_dense_reference(&c, &w, &[5, 2, 7]);
}

#[test]
fn qwen3_with_qk_norm_and_tied_embeddings_matches_the_dense_reference() {
    let c = tiny_config(Architecture::Qwen3);
    let w = tiny_weights(&c, 11, WeightDType::F32);
    assert!(!w.contains("lm_head.weight"));
    assert_matches_dense_reference(&c, &w, &[0, 1, 2]);
}

#[test]
fn q8_0_weights_are_used_exactly_as_stored() {
    let c = tiny_config(Architecture::Llama);
    let w = tiny_weights(&c, 3, WeightDType::Q8_0);
    // The reference reads the dequantized Q8_0 values.
    assert_matches_dense_reference(&c, &w, &[1, 0, 3]);
}

#[test]
fn chunked_prefill_and_decode_give_the_same_rows_as_one_prefill() {
    let c = tiny_config(Architecture::Qwen3);
    let w = tiny_weights(&c, 5, WeightDType::F32);
    let table = [6, 1, 4];
    let full = load(&c, &w, 8)
        .forward(&one_seq(&PROMPT, 0, &table, LogitsFor::All))
        .unwrap()
        .logits;
    let v = c.vocab_size;
    let mut m = load(&c, &w, 8);
    // Chunks of 5, 3 (crossing a block boundary), then 3 single-token decodes.
    assert!(m
        .forward(&one_seq(&PROMPT[..5], 0, &table, LogitsFor::None))
        .unwrap()
        .logits
        .is_empty());
    let chunk = m
        .forward(&one_seq(&PROMPT[5..8], 5, &table, LogitsFor::Last))
        .unwrap()
        .logits;
    assert_eq!(chunk, full[7 * v..8 * v]);
    for pos in 8..11 {
        let row = m
            .forward(&one_seq(
                &PROMPT[pos..pos + 1],
                pos,
                &table,
                LogitsFor::Last,
            ))
            .unwrap()
            .logits;
        assert_eq!(row, full[pos * v..(pos + 1) * v], "position {pos}");
    }
}

#[test]
fn a_batched_sequence_gets_the_same_logits_as_alone() {
    let c = tiny_config(Architecture::Llama);
    let w = tiny_weights(&c, 9, WeightDType::F32);
    let v = c.vocab_size;
    let a_alone = load(&c, &w, 8)
        .forward(&one_seq(&PROMPT[..7], 0, &[0, 1], LogitsFor::Last))
        .unwrap()
        .logits;
    let b_alone = load(&c, &w, 8)
        .forward(&one_seq(&PROMPT[2..5], 0, &[2], LogitsFor::All))
        .unwrap()
        .logits;
    // Both in one step, b first in the token array, a second; different blocks.
    let batch = ForwardBatch {
        token_ids: [&PROMPT[2..5], &PROMPT[..7]].concat(),
        seqs: vec![
            slice(3, 7, 0, &[5, 3], LogitsFor::Last),
            slice(0, 3, 0, &[7], LogitsFor::All),
        ],
    };
    let both = load(&c, &w, 8).forward(&batch).unwrap().logits;
    assert_eq!(both.len(), 4 * v);
    assert_eq!(both[..v], a_alone[..]);
    assert_eq!(both[v..], b_alone[..]);
}

#[test]
fn copy_block_carries_the_cached_prefix() {
    let c = tiny_config(Architecture::Llama);
    let w = tiny_weights(&c, 13, WeightDType::F32);
    let mut m = load(&c, &w, 8);
    m.forward(&one_seq(&PROMPT[..6], 0, &[2, 3], LogitsFor::None))
        .unwrap();
    let want = m
        .forward(&one_seq(&PROMPT[6..7], 6, &[2, 3], LogitsFor::Last))
        .unwrap()
        .logits;
    // Copy-on-write of the partial block 3 into 5, then the same decode through the copy.
    m.copy_block(3, 5).unwrap();
    let got = m
        .forward(&one_seq(&PROMPT[6..7], 6, &[2, 5], LogitsFor::Last))
        .unwrap()
        .logits;
    assert_eq!(got, want);
    assert!(m.copy_block(3, 8).is_err());
}

#[test]
fn load_names_missing_and_misshapen_tensors() {
    let c = tiny_config(Architecture::Llama);
    let mut w = tiny_weights(&c, 1, WeightDType::F32);
    w.tensors.remove("model.layers.1.mlp.up_proj.weight");
    let err = Llama::load(CpuBackend::new(1).unwrap(), &c, &w, 4, 4)
        .err()
        .unwrap();
    assert!(
        matches!(&err, ModelError::MissingTensor(n) if n == "model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );
    let mut w = tiny_weights(&c, 1, WeightDType::F32);
    w.insert(
        "model.norm.weight",
        WeightDType::F32,
        vec![31],
        vec![0; 124],
    );
    let err = Llama::load(CpuBackend::new(1).unwrap(), &c, &w, 4, 4)
        .err()
        .unwrap();
    assert!(
        matches!(&err, ModelError::Shape { name, .. } if name == "model.norm.weight"),
        "{err}"
    );
    let biased = ModelConfig {
        attention_bias: true,
        ..c
    };
    assert!(matches!(
        Llama::load(CpuBackend::new(1).unwrap(), &biased, &w, 4, 4),
        Err(ModelError::Unsupported(_))
    ));
}

#[test]
fn out_of_vocabulary_tokens_are_invalid_input() {
    let c = tiny_config(Architecture::Llama);
    let mut m = load(&c, &tiny_weights(&c, 1, WeightDType::F32), 4);
    let err = m
        .forward(&one_seq(&[40], 0, &[0], LogitsFor::Last))
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidInput(_)), "{err}");
}

#[test]
fn sampling_rows_are_sampled_from_the_same_logits_as_raw_rows() {
    use crate::sampling::{sample_row, Penalty, SamplingRow};
    let c = tiny_config(Architecture::Llama);
    let w = tiny_weights(&c, 9, WeightDType::F32);
    let raw = load(&c, &w, 8)
        .forward(&one_seq(&PROMPT[..7], 0, &[0, 1], LogitsFor::Last))
        .unwrap()
        .logits;
    let desc = SamplingRow {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        logprobs: Some(3),
        repetition_penalty: 1.3,
        penalties: vec![Penalty {
            token: 3,
            repeated: true,
            count: 0,
        }],
        draw: Some(0.37),
        ..SamplingRow::greedy()
    };
    // The sampled sequence second, after a raw one, in one step.
    let batch = ForwardBatch {
        token_ids: [&PROMPT[2..5], &PROMPT[..7]].concat(),
        seqs: vec![
            slice(0, 3, 0, &[7], LogitsFor::Last),
            slice(3, 7, 0, &[5, 3], LogitsFor::Sample(desc.clone())),
        ],
    };
    let out = load(&c, &w, 8).forward(&batch).unwrap();
    assert_eq!(out.logits.len(), c.vocab_size);
    assert_eq!(out.samples.len(), 1);
    let want = sample_row(&raw, &desc).unwrap();
    assert_eq!(out.samples[0].as_ref().unwrap(), &want);
}

/// `n` sequences of the tiny model decoded `steps` tokens on `r`, every token sampled (greedy,
/// or seeded with fixed draws); `pipelined`: each step is submitted before the previous one is
/// collected, its tokens fed from that step's samples (what the engine does with overlap).
fn decode_all(r: &mut dyn ModelRunner, n: usize, steps: usize, pipelined: bool) -> Vec<Vec<u32>> {
    use crate::model::step::Feed;
    use crate::sampling::SamplingRow;
    let row = |i: usize, k: usize| {
        if i.is_multiple_of(2) {
            SamplingRow::greedy()
        } else {
            SamplingRow {
                temperature: 0.9,
                draw: Some(((i * 37 + k * 11) % 100) as f64 / 100.0),
                ..SamplingRow::greedy()
            }
        }
    };
    let table = |i: usize| ((i * 8) as u32..(i * 8 + 8) as u32).collect::<Vec<_>>();
    let mut batch = ForwardBatch::default();
    let mut lens = Vec::new();
    for i in 0..n {
        let p: Vec<u32> = (0..3 + i as u32).map(|t| (t * 7 + i as u32) % 40).collect();
        batch.seqs.push(slice(
            batch.token_ids.len(),
            p.len(),
            0,
            &table(i),
            LogitsFor::Sample(row(i, 0)),
        ));
        lens.push(p.len());
        batch.token_ids.extend(p);
    }
    let decode = |lens: &[usize], k: usize, ids: &[u32]| ForwardBatch {
        token_ids: ids.to_vec(),
        seqs: (0..n)
            .map(|i| slice(i, 1, lens[i], &table(i), LogitsFor::Sample(row(i, k))))
            .collect(),
    };
    let ids = |o: &ForwardOutput| -> Vec<u32> {
        o.samples
            .iter()
            .map(|s| s.as_ref().expect("sampled").token_id)
            .collect()
    };
    let mut out = vec![Vec::new(); n];
    let feeds: Vec<Feed> = (0..n).map(|i| Feed { token: i, row: i }).collect();
    let mut in_flight = if pipelined {
        Some(r.submit(&batch, &[]).expect("submit"))
    } else {
        None
    };
    for k in 0..=steps {
        let got = match in_flight.take() {
            None => {
                let got = ids(&r.forward(&batch).expect("forward"));
                batch = decode(&lens, k + 1, &got);
                got
            }
            Some(s) => {
                if k < steps {
                    let next = r
                        .submit(&decode(&lens, k + 1, &vec![0; n]), &feeds)
                        .expect("ahead");
                    in_flight = Some(next);
                }
                ids(&r.collect(s).expect("collect"))
            }
        };
        for l in &mut lens {
            *l += 1;
        }
        for (i, &t) in got.iter().enumerate() {
            out[i].push(t);
        }
    }
    out
}

#[test]
fn the_queued_path_with_fed_tokens_gives_the_forward_tokens() {
    // The CPU backend in queued mode takes the runner's submit / collect path (the one the GPU
    // takes), with fed tokens patched from the previous step's samples.
    let c = tiny_config(Architecture::Llama);
    let w = tiny_weights(&c, 2, WeightDType::F32);
    let queued = || {
        Llama::load(
            CpuBackend::new(2).unwrap().with_queued_steps(true),
            &c,
            &w,
            4,
            64,
        )
        .unwrap()
    };
    let mut q = queued();
    assert!(q.queues_steps());
    let plain = decode_all(&mut load(&c, &w, 64), 5, 9, false);
    assert_eq!(decode_all(&mut q, 5, 9, false), plain);
    // The same runner again, pipelined (runs share a runner: each prefills from position 0).
    assert_eq!(decode_all(&mut q, 5, 9, true), plain);
    assert_eq!(decode_all(&mut queued(), 5, 9, true), plain);
    assert!(plain.iter().all(|t| t.len() == 10));
}
