//! Loading a Qwen3.5 checkpoint: [`Qwen3_5::load`] (every layer's weights through the
//! [`Loader`], the KV cache of the full-attention layers, the state slots, the MTP head when
//! present) and the memory split of the CPU / GPU entry points ([`load_cpu`], [`load_gpu`]).

use tracing::info;

use super::{
    backend_err, hybrid, kv_spec, mtp, state_spec, AttnLayer, GdnLayer, Layer, Loader, Mixer,
    Qwen3_5, Weights,
};
use crate::backend::hybrid::HybridBackend;
use crate::backend::RopeSpec;
use crate::error::ModelError;
use crate::model::config::LayerType;
use crate::model::prefix::Prefix;
use crate::model::step::{CacheGeometry, ModelRunner};
use crate::model::ModelConfig;
use crate::tensor::WeightSource;

impl<B: HybridBackend> Qwen3_5<B> {
    /// Load `config`'s model from `weights` onto `backend`, with a KV cache of `num_blocks`
    /// blocks of `block_size` tokens and `num_state_slots` state slots.
    pub fn load(
        backend: B,
        config: &ModelConfig,
        weights: &dyn WeightSource,
        block_size: usize,
        num_blocks: usize,
        num_state_slots: usize,
    ) -> Result<Qwen3_5<B>, ModelError> {
        let c = config;
        let h = hybrid(c)?;
        if c.num_key_value_heads == 0
            || !c.num_attention_heads.is_multiple_of(c.num_key_value_heads)
        {
            return Err(ModelError::Unsupported(format!(
                "{} attention heads over {} KV heads",
                c.num_attention_heads, c.num_key_value_heads
            )));
        }
        if num_state_slots == 0 {
            return Err(ModelError::Unsupported(
                "a hybrid model needs at least one state slot".into(),
            ));
        }
        let (hidden, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_dim, kv_dim) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let (conv_dim, value_dim, nv) = (h.conv_dim(), h.value_dim(), h.linear_num_value_heads);
        let ld = Loader {
            backend: &backend,
            weights,
        };
        let model = Prefix::new(&h.weight_prefix);
        let embed_tokens = ld.matrix(&model.key("embed_tokens.weight"), c.vocab_size, hidden)?;
        let lm_head = if weights.contains("lm_head.weight") {
            Some(ld.linear("lm_head", c.vocab_size, hidden)?)
        } else if c.tie_word_embeddings {
            None
        } else {
            return Err(ModelError::MissingTensor("lm_head.weight".into()));
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let (mut n_state, mut n_kv) = (0, 0);
        for (i, kind) in h.layer_types.iter().enumerate() {
            let p = model.pp("layers").pp(i);
            let mixer = match kind {
                LayerType::LinearAttention => {
                    let la = p.pp("linear_attn");
                    n_state += 1;
                    Mixer::Linear(GdnLayer {
                        in_proj_qkv: ld.linear(&la.key("in_proj_qkv"), conv_dim, hidden)?,
                        in_proj_z: ld.linear(&la.key("in_proj_z"), value_dim, hidden)?,
                        in_proj_b: ld.linear(&la.key("in_proj_b"), nv, hidden)?,
                        in_proj_a: ld.linear(&la.key("in_proj_a"), nv, hidden)?,
                        conv1d: ld.conv(
                            &la.key("conv1d.weight"),
                            conv_dim,
                            h.linear_conv_kernel_dim,
                        )?,
                        dt_bias: ld.vector(&la.key("dt_bias"), nv)?,
                        a_log: ld.vector(&la.key("A_log"), nv)?,
                        norm: ld.vector(&la.key("norm.weight"), h.linear_value_head_dim)?,
                        out_proj: ld.linear(&la.key("out_proj"), hidden, value_dim)?,
                        state_layer: n_state - 1,
                    })
                }
                LayerType::FullAttention => {
                    let at = p.pp("self_attn");
                    n_kv += 1;
                    Mixer::Full(AttnLayer {
                        q_proj: ld.linear(&at.key("q_proj"), 2 * q_dim, hidden)?,
                        k_proj: ld.linear(&at.key("k_proj"), kv_dim, hidden)?,
                        v_proj: ld.linear(&at.key("v_proj"), kv_dim, hidden)?,
                        o_proj: ld.linear(&at.key("o_proj"), hidden, q_dim)?,
                        q_norm: ld.norm_1p(&at.key("q_norm.weight"), hd)?,
                        k_norm: ld.norm_1p(&at.key("k_norm.weight"), hd)?,
                        kv_layer: n_kv - 1,
                    })
                }
            };
            let mlp = p.pp("mlp");
            layers.push(Layer {
                input_layernorm: ld.norm_1p(&p.key("input_layernorm.weight"), hidden)?,
                mixer,
                post_attention_layernorm: ld
                    .norm_1p(&p.key("post_attention_layernorm.weight"), hidden)?,
                gate_proj: ld.linear(&mlp.key("gate_proj"), inter, hidden)?,
                up_proj: ld.linear(&mlp.key("up_proj"), inter, hidden)?,
                down_proj: ld.linear(&mlp.key("down_proj"), hidden, inter)?,
            });
        }
        let norm = ld.norm_1p(&model.key("norm.weight"), hidden)?;
        let mtp = mtp::MtpWeights::load(&ld, c)?;
        if h.has_vision {
            info!("The checkpoint has a vision tower (model.visual.*); kiln runs the text model only and skips it.");
        }
        let rope = backend
            .create_rope(&RopeSpec {
                rotary_dim: h.rotary_dim,
                theta: c.rope_theta,
                max_positions: c.max_position_embeddings,
            })
            .map_err(backend_err)?;
        let kv_cache = backend
            .create_kv_cache(&kv_spec(c, block_size, num_blocks))
            .map_err(backend_err)?;
        let sspec = state_spec(c, num_state_slots)?;
        let states = backend.create_state_cache(&sspec).map_err(backend_err)?;
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        info!(
            architecture = ?c.architecture,
            layers = c.num_hidden_layers,
            gdn_layers = n_state,
            attention_layers = n_kv,
            hidden,
            tied_embeddings = lm_head.is_none(),
            mtp_layers = mtp.as_ref().map_or(0, |m| m.num_layers()),
            kv_blocks = num_blocks,
            block_size,
            device = %backend.name(),
            "Model loaded: {num_state_slots} state slots, {:.3} GiB ({:.1} MiB each).",
            gib(sspec.bytes_per_slot() * num_state_slots),
            sspec.bytes_per_slot() as f64 / (1 << 20) as f64,
        );
        Ok(Qwen3_5 {
            backend,
            config: c.clone(),
            weights: Weights {
                embed_tokens,
                lm_head,
                layers,
                norm,
                rope,
            },
            mtp,
            kv_cache,
            states,
            geometry: CacheGeometry {
                block_size,
                num_blocks,
                num_state_slots,
            },
            steps: Default::default(),
        })
    }
}

/// Qwen3.5 on the CPU: `engine.kv_cache_mib` holds the state slots (one per sequence of
/// `engine.max_num_seqs`, twice that with prefix caching, fewer when the budget is short) and
/// the KV blocks of the full-attention layers ([`crate::model::memory::split_hybrid`]).
pub fn load_cpu(
    backend: crate::backend::CpuBackend,
    config: &ModelConfig,
    weights: &dyn WeightSource,
    opts: &crate::model::options::RunnerOptions,
) -> Result<Box<dyn ModelRunner>, ModelError> {
    let budget = opts.kv_cache_mib << 20;
    // The CPU workspace grows with the steps it sees (host memory is not planned).
    load_split(
        backend,
        config,
        weights,
        opts,
        budget,
        opts.block_size,
        (0, 0),
        None,
    )
}

/// Qwen3.5 on a GPU: `budget_bytes` (what the memory planner left after the weights and the
/// workspace) is shared between the state slots and the KV blocks by
/// [`crate::model::memory::split_hybrid`], keeping room for one sequence of `max_model_len`
/// KV tokens; the split is logged ("N state slots, X GiB; KV cache …"). With
/// `engine.cuda_graphs` the decode steps replay graphs ([`Qwen3_5::with_decode_graphs`]): one
/// KV block more than the split is made for their padding rows (the planner counted it with
/// the graphs, [`crate::model::memory::decode_graph_bytes`]).
pub fn load_gpu<B: HybridBackend>(
    backend: B,
    config: &ModelConfig,
    weights: &dyn WeightSource,
    opts: &crate::model::options::RunnerOptions,
    budget_bytes: usize,
    max_model_len: usize,
) -> Result<Box<dyn ModelRunner>, ModelError> {
    let reserve = (opts.max_num_batched_tokens, opts.max_num_seqs);
    let graphs = opts
        .cuda_graphs
        .then_some((opts.max_num_seqs, max_model_len));
    load_split(
        backend,
        config,
        weights,
        opts,
        budget_bytes,
        max_model_len,
        reserve,
        graphs,
    )
}

/// Share `budget_bytes` between state slots and KV blocks (at least `min_kv_tokens` KV tokens),
/// then load, the workspace reserved for `reserve` = (tokens, logits rows) per step, with
/// decode graphs for `graphs = Some((max_num_seqs, max_model_len))` (one more KV block, their
/// scratch block, than the split gives).
#[allow(clippy::too_many_arguments)]
fn load_split<B: HybridBackend>(
    backend: B,
    config: &ModelConfig,
    weights: &dyn WeightSource,
    opts: &crate::model::options::RunnerOptions,
    budget_bytes: usize,
    min_kv_tokens: usize,
    reserve: (usize, usize),
    graphs: Option<(usize, usize)>,
) -> Result<Box<dyn ModelRunner>, ModelError> {
    use crate::model::memory::{split_hybrid, HybridSplitInput};
    if opts.block_size == 0 {
        return Err(ModelError::Unsupported("`engine.block_size` = 0".into()));
    }
    let bytes_per_block = backend.kv_bytes_per_block(&kv_spec(config, opts.block_size, 1));
    let state = state_spec(config, 1)?;
    // With prefix caching, as many slots again hold prefix checkpoints (the engine gives
    // running sequences the first `max_num_seqs`, checkpoints the rest).
    let wanted = opts.max_num_seqs.max(1) * if opts.enable_prefix_caching { 2 } else { 1 };
    let split = split_hybrid(&HybridSplitInput {
        budget_bytes,
        state_bytes_per_slot: state.bytes_per_slot(),
        bytes_per_block: bytes_per_block.max(1),
        block_size: opts.block_size,
        max_num_seqs: wanted,
        // Without full-attention layers no KV token is needed.
        min_kv_tokens: if config.num_kv_layers() == 0 {
            opts.block_size
        } else {
            min_kv_tokens
        },
    })
    .map_err(ModelError::Unsupported)?;
    if split.num_state_slots < wanted {
        tracing::warn!(
            max_num_seqs = opts.max_num_seqs,
            state_slots = split.num_state_slots,
            "The cache budget holds only {} state slots: fewer sequences at once (or fewer prefix checkpoints).",
            split.num_state_slots
        );
    }
    info!(
        budget_mib = budget_bytes >> 20,
        plan = %split,
        "Hybrid cache sized."
    );
    // Without full-attention layers a block costs nothing: only as many as the positions need.
    let num_blocks = if config.num_kv_layers() == 0 {
        split.num_blocks.min(
            opts.max_num_seqs.max(1) * config.max_position_embeddings.div_ceil(opts.block_size),
        )
    } else {
        split.num_blocks
    };
    let num_blocks = num_blocks + usize::from(graphs.is_some());
    let model = Qwen3_5::load(
        backend,
        config,
        weights,
        opts.block_size,
        num_blocks,
        split.num_state_slots,
    )?
    .reserve_workspace(reserve.0, reserve.1)
    .reserve_prefill_workspace(reserve.0, reserve.1)?;
    Ok(Box::new(match graphs {
        Some((seqs, len)) => model.with_decode_graphs(seqs, len),
        None => model,
    }))
}
