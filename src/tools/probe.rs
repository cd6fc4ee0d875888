//! `kiln probe`: logits and greedy tokens for given token ids, for checking numerics against a
//! reference (transformers, llama.cpp, another backend).
//!
//! It drives a [`ModelRunner`] directly (no scheduler, no sampler): one prefill of the given
//! ids into a fresh block table, then `N − 1` single-token decodes of the argmax. It prints one
//! JSON object, `{"logits": {"<position>": [f32 × vocab]}, "greedy": [N ids]}`; positions are
//! indices into the given ids. Greedy decoding does not stop at EOS: exactly `N` ids come out.
//! The model path is the exact one: weights dequantized as stored, f32 activations.

use std::io::Write;
use std::path::PathBuf;

use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::engine::{Device, EngineConfig};
use crate::error::{EngineError, ModelError};
use crate::model::files::ModelFiles;
use crate::model::runner::build_runner;
use crate::model::step::{ForwardBatch, LogitsFor, ModelRunner, SeqSlice};
use crate::sampling::SamplingRow;

/// `kiln probe` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    /// A `.gguf` file or a Hugging Face model folder.
    #[arg(long)]
    pub model: PathBuf,
    /// Comma-separated prompt token ids, e.g. `1,2,3`.
    #[arg(long, value_delimiter = ',', required = true)]
    pub token_ids: Vec<u32>,
    /// Which positions' logits to print: `last`, `all`, or comma-separated indices `I,J,…`.
    #[arg(long, default_value = "last")]
    pub positions: Positions,
    /// Also emit the greedy (argmax) continuation of exactly this many tokens.
    #[arg(long, default_value_t = 0)]
    pub greedy: usize,
    /// Backend: `cpu`, `auto` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// CPU threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Compute dtype on GPUs (`engine.dtype`): `auto` (bf16 on sm_80+, fp16 before), `f32`,
    /// `fp16` or `bf16`; `f32` checks the GPU path against transformers' float32. The CPU
    /// always computes in f32.
    #[arg(long, default_value = "auto", value_parser = ["auto", "f32", "fp16", "bf16"])]
    pub dtype: String,
}

/// Which prompt positions to return logits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Positions {
    /// The last prompt token.
    Last,
    /// Every prompt token.
    All,
    /// These indices into the prompt.
    List(Vec<usize>),
}

impl std::str::FromStr for Positions {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "last" => Ok(Positions::Last),
            "all" => Ok(Positions::All),
            _ => s
                .split(',')
                .map(|p| p.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .map(Positions::List)
                .map_err(|_| format!("invalid positions `{s}` (expected last, all or I,J,…)")),
        }
    }
}

impl Positions {
    /// The concrete indices for a prompt of `n` tokens; errors name an index out of range.
    fn resolve(&self, n: usize) -> Result<Vec<usize>, EngineError> {
        match self {
            Positions::Last => Ok(vec![n - 1]),
            Positions::All => Ok((0..n).collect()),
            Positions::List(list) => match list.iter().find(|&&p| p >= n) {
                Some(p) => Err(EngineError::InvalidInput(format!(
                    "position {p} is past the {n} prompt tokens"
                ))),
                None => Ok(list.clone()),
            },
        }
    }
}

/// What `kiln probe` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOutput {
    /// `(position, logits row)` in the order asked for.
    pub logits: Vec<(usize, Vec<f32>)>,
    /// The greedy continuation.
    pub greedy: Vec<u32>,
}

/// Serializes as `{"<position>": [..], …}` in the order asked for.
struct LogitsMap<'a>(&'a [(usize, Vec<f32>)]);

impl Serialize for LogitsMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (pos, row) in self.0 {
            map.serialize_entry(&pos.to_string(), row)?;
        }
        map.end()
    }
}

impl Serialize for ProbeOutput {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("logits", &LogitsMap(&self.logits))?;
        map.serialize_entry("greedy", &self.greedy)?;
        map.end()
    }
}

/// Index of the largest logit (the first one on ties, as `torch.argmax`).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Run the prompt `token_ids` through `runner` from an empty cache (blocks `0..`), return the
/// logits at `positions` and a greedy continuation of `greedy` tokens.
pub fn probe(
    runner: &mut dyn ModelRunner,
    token_ids: &[u32],
    positions: &Positions,
    greedy: usize,
) -> Result<ProbeOutput, EngineError> {
    let n = token_ids.len();
    if n == 0 {
        return Err(EngineError::InvalidInput("no token ids given".into()));
    }
    let wanted = positions.resolve(n)?;
    let geometry = runner.cache_geometry();
    // The last greedy token is never fed back, so the cache holds n + greedy − 1 tokens.
    let context = n + greedy.saturating_sub(1);
    let blocks = context.div_ceil(geometry.block_size);
    if blocks > geometry.num_blocks {
        return Err(EngineError::InvalidInput(format!(
            "{context} tokens need {blocks} KV blocks; the cache has {} (raise engine.kv_cache_mib)",
            geometry.num_blocks
        )));
    }
    let block_table: Vec<u32> = (0..blocks as u32).collect();
    let seq = |len: usize, cached_len: usize, logits: LogitsFor| SeqSlice {
        start: 0,
        len,
        cached_len,
        block_table: block_table.clone(),
        logits,
        state_slot: (geometry.num_state_slots > 0).then_some(0),
    };
    let vocab = runner.vocab_size();
    let all = wanted != [n - 1];
    let prefill = ForwardBatch {
        token_ids: token_ids.to_vec(),
        seqs: vec![seq(
            n,
            0,
            if all { LogitsFor::All } else { LogitsFor::Last },
        )],
    };
    let rows = runner.forward(&prefill)?.logits;
    let row = |i: usize| rows[i * vocab..(i + 1) * vocab].to_vec();
    let logits = wanted
        .iter()
        .map(|&p| (p, row(if all { p } else { 0 })))
        .collect();
    let mut out = Vec::with_capacity(greedy);
    if greedy > 0 {
        let mut next = argmax(&row(if all { n - 1 } else { 0 }));
        out.push(next);
        // The decode steps sample greedily on the backend (argmax, lowest id on ties).
        for cached_len in n..n + greedy - 1 {
            let step = ForwardBatch {
                token_ids: vec![next],
                seqs: vec![seq(1, cached_len, LogitsFor::Sample(SamplingRow::greedy()))],
            };
            next = match runner.forward(&step)?.samples.pop() {
                Some(sampled) => sampled?.token_id,
                None => {
                    return Err(EngineError::Internal(
                        "the model returned no sampled token".into(),
                    ))
                }
            };
            out.push(next);
        }
    }
    Ok(ProbeOutput {
        logits,
        greedy: out,
    })
}

/// `kiln probe`: open the model, run the probe, print the JSON object on stdout.
pub fn run(args: &ProbeArgs) -> Result<(), ProbeError> {
    let files = ModelFiles::open(&args.model)?;
    let mut runner = build_runner(&files, &engine_config(args).runner_options())?;
    let out = probe(
        runner.as_mut(),
        &args.token_ids,
        &args.positions,
        args.greedy,
    )?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", to_json(&out)).map_err(ProbeError::Stdout)?;
    Ok(())
}

/// Why `kiln probe` failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The model could not be opened or loaded.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The forward pass rejected the request or failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Writing the result failed.
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
}

/// The engine settings `kiln probe` builds its runner with.
pub fn engine_config(args: &ProbeArgs) -> EngineConfig {
    EngineConfig {
        device: args.device,
        threads: args.threads,
        dtype: args.dtype.clone(),
        ..EngineConfig::default()
    }
}

/// The JSON line `kiln probe` prints.
pub fn to_json(out: &ProbeOutput) -> String {
    serde_json::to_string(out).expect("logits and ids always serialize")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::llama::tests::{tiny_config, tiny_weights};
    use crate::model::runner::build_runner_for;
    use crate::model::Architecture;
    use crate::tensor::WeightDType;

    fn runner() -> Box<dyn ModelRunner> {
        let c = tiny_config(Architecture::Qwen3);
        let w = tiny_weights(&c, 21, WeightDType::F32);
        let engine = EngineConfig {
            device: Device::Cpu,
            threads: 1,
            block_size: 4,
            kv_cache_mib: 1,
            ..Default::default()
        };
        build_runner_for(&c, &w, &engine.runner_options()).unwrap()
    }

    #[test]
    fn dtype_reaches_the_runner_options() {
        let args = ProbeArgs {
            model: PathBuf::from("m.gguf"),
            token_ids: vec![1],
            positions: Positions::Last,
            greedy: 0,
            device: Device::Cuda(0),
            threads: 0,
            dtype: "f32".into(),
        };
        assert_eq!(engine_config(&args).runner_options().dtype, "f32");
        let auto = ProbeArgs {
            dtype: "auto".into(),
            ..args
        };
        assert_eq!(engine_config(&auto).runner_options().dtype, "auto");
    }

    #[test]
    fn positions_parse() {
        assert_eq!("last".parse(), Ok(Positions::Last));
        assert_eq!("all".parse(), Ok(Positions::All));
        assert_eq!("0, 4,2".parse(), Ok(Positions::List(vec![0, 4, 2])));
        assert!("x".parse::<Positions>().is_err());
    }

    #[test]
    fn greedy_continues_from_the_argmax_and_matches_a_longer_prefill() {
        let prompt = [1u32, 5, 9, 30, 2, 7];
        let out = probe(runner().as_mut(), &prompt, &Positions::List(vec![5, 1]), 4).unwrap();
        assert_eq!(out.greedy.len(), 4);
        assert_eq!(out.logits[0].0, 5);
        assert_eq!(out.greedy[0], argmax(&out.logits[0].1));
        // Prefilling prompt + the first 3 greedy tokens reproduces the decode path's choices.
        let longer: Vec<u32> = prompt.iter().chain(&out.greedy[..3]).copied().collect();
        let all = probe(runner().as_mut(), &longer, &Positions::All, 0).unwrap();
        for i in 0..3 {
            assert_eq!(argmax(&all.logits[prompt.len() + i].1), out.greedy[i + 1]);
        }
        // Asking for all positions gives the same rows as asking for some.
        assert_eq!(all.logits[5].1, out.logits[0].1);
        assert_eq!(all.logits[1].1, out.logits[1].1);
    }

    #[test]
    fn json_has_position_keys_in_order_and_the_greedy_ids() {
        let out = ProbeOutput {
            logits: vec![(7, vec![0.5, -1.25]), (2, vec![3.0, 0.1])],
            greedy: vec![4, 1],
        };
        assert_eq!(
            to_json(&out),
            r#"{"logits":{"7":[0.5,-1.25],"2":[3.0,0.1]},"greedy":[4,1]}"#
        );
    }

    #[test]
    fn bad_requests_are_invalid_input() {
        let mut r = runner();
        assert!(matches!(
            probe(r.as_mut(), &[], &Positions::Last, 0),
            Err(EngineError::InvalidInput(_))
        ));
        let past = Positions::List(vec![3]);
        assert!(matches!(
            probe(r.as_mut(), &[1, 2], &past, 0),
            Err(EngineError::InvalidInput(_))
        ));
        assert!(matches!(
            probe(r.as_mut(), &[1, 2], &Positions::Last, 100),
            Err(EngineError::InvalidInput(_))
        ));
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    }
}
