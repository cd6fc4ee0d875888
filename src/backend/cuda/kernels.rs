//! The kernel registry: every `.cu` file in `kernels/`, embedded in the binary, and its entry points.
//!
//! Entry points are `extern "C"` functions named `{op}_{dtype}` (e.g. `rms_norm_bf16`); the
//! `KernelModule` enum is the only list of kernel files, so a new file is added here and nowhere
//! else. `kernels/common.cuh` is prepended to every source before NVRTC compiles it.

/// Shared device helpers, prepended to every kernel source.
pub const COMMON_HEADER: &str = include_str!("../../../kernels/common.cuh");

/// The helpers of the dense tensor-core kernels, prepended (after [`COMMON_HEADER`]) to
/// `dense.cu` and `dense_gemm.cu`.
pub const DENSE_COMMON_HEADER: &str = include_str!("../../../kernels/dense_common.cuh");

/// The entry points of `kernels/w4a16_bulk.cu` for dtype suffix `t` (16-bit only): block, cluster
/// and persistent forms `w4b_gemv{,c,p}_{t}`; the backend resolves exactly these
/// (`w4a16_bulk.rs`), so the loaded list and the resolved one cannot drift apart.
pub(crate) fn w4_bulk_names(t: &str) -> [String; 3] {
    ["w4b_gemv", "w4b_gemvc", "w4b_gemvp"].map(|f| format!("{f}_{t}"))
}

/// The builds of `kernels/w4a16_xs.cu` (`W4XC_ENTRIES`, in its order: m16 tiles per CTA, weight
/// ring depth, CTAs per SM of the register cap, whether the slice sums are pushed (`p` builds)
/// instead of read through cluster barriers (`d`), the L2 prefetch distance of the hinted builds
/// (0: no hints; else `w4a16_hints.cuh`'s evict-first loads and a prefetch that far ahead: the
/// `hp{pf}` name tail)) and their entry points for compute dtype suffix `t`, which the backend
/// resolves (`w4a16_xc.rs`, which also orders them).
pub(crate) const W4_XC_VARIANTS: [(usize, usize, usize, bool, usize); 8] = [
    (8, 2, 4, true, 0),
    (4, 2, 8, true, 0),
    (8, 2, 4, false, 0),
    (4, 2, 8, false, 0),
    (16, 2, 2, false, 0),
    (4, 2, 8, false, 3),
    (8, 2, 4, false, 3),
    (8, 2, 4, true, 3),
];

/// The name tail of a build's L2 hints: `hp{pf}`, none for pf 0 (`W4XC_ENTRIES`' TAIL).
pub(crate) fn w4_xc_tail(pf: usize) -> String {
    if pf > 0 {
        format!("hp{pf}")
    } else {
        String::new()
    }
}

pub(crate) fn w4_xc_names(t: &str) -> Vec<String> {
    let name = |&(tpc, d, b, push, pf): &(usize, usize, usize, bool, usize)| {
        let r = if push { 'p' } else { 'd' };
        format!("w4_gemvxc{tpc}{r}{d}b{b}{}_{t}", w4_xc_tail(pf))
    };
    W4_XC_VARIANTS.iter().map(name).collect()
}

/// The builds of `kernels/w4a16_xr.cu` (`W4XR_ENTRIES`, in its order: warps per CTA, m16 tiles
/// per warp, row groups of 8 x rows per CTA, x ring stages, CTAs per SM of the register cap, the
/// L2 prefetch distance of the hinted builds (0: none; else the `hp{pf}` name tail)); the backend
/// resolves exactly their entry points ([`w4_xr_names`], `w4a16_xr.rs`).
pub const W4_XR_VARIANTS: [(usize, usize, usize, usize, usize, usize); 6] = [
    (4, 2, 4, 4, 3, 3),
    (4, 2, 4, 4, 3, 0),
    (2, 2, 4, 4, 6, 0),
    (4, 1, 4, 4, 4, 0),
    (8, 1, 4, 4, 2, 0),
    (4, 1, 8, 3, 3, 0),
];

/// The entry points of [`W4_XR_VARIANTS`] for compute dtype suffix `t`.
pub(crate) fn w4_xr_names(t: &str) -> Vec<String> {
    W4_XR_VARIANTS
        .iter()
        .map(|&(nw, mt, rg, xs, b, pf)| {
            format!("w4_gemvxr{nw}w{mt}t{rg}r{xs}s{b}b{}_{t}", w4_xc_tail(pf))
        })
        .collect()
}

/// Where `kernels/w4a16_xs.cu`'s entry points begin: the part before it (the cluster helpers) is
/// compiled into `w4a16_xr.cu` too ([`KernelModule::full_source`]).
const W4A16_XS_ENTRIES_MARK: &str = "#define W4XC_ARGS(T)";

/// Where `kernels/w4a16.cu`'s entry points begin: the part before it is compiled into
/// `w4a16_bulk.cu` too ([`KernelModule::full_source`]).
const W4A16_ENTRIES_MARK: &str = "#define W4_ARGS(T)";

/// One `.cu` file of `kernels/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelModule {
    /// Embedding gather, SiLU-gated product, residual add, dtype casts.
    Elementwise,
    /// RMSNorm with fused residual add.
    RmsNorm,
    /// Rotary position embedding (rotate-half).
    Rope,
    /// Paged KV-cache writes and block copies.
    KvCache,
    /// Paged causal GQA attention: split-K (decode) and tiled flash-style prefill.
    Attention,
    /// Decode attention at memory speed: one pass over each KV tile for a whole GQA group.
    AttentionDecode,
    /// ggml block formats to the compute dtype.
    Dequant,
    /// f32 logits rows to sampled token ids and logprobs.
    Sampling,
    /// Matmuls on 4-bit weights kept packed (the w4 tile layout, issue 10).
    W4a16,
    /// Gated DeltaNet (conv, fused delta-rule scan, gated norm) and gated-attention helpers.
    Gdn,
    /// Batch-invariant dense 16-bit matmuls, CUDA-core and tensor-core (`KILN_DENSE_MATMUL`).
    Dense,
    /// The chunked (C = 64, tensor-core) gated delta rule for prefills.
    GdnChunk,
    /// Qwen3.5's gated attention before the attention: split, (1 + w) norms, RoPE, KV write.
    GatedAttention,
    /// Matmuls and the embedding gather on GGUF Q4_0 / Q4_1 / Q8_0 kept quantized (gguf tiles).
    GgufMm,
    /// The sm_70 / sm_75 tensor-core (mma m8n8k4, fp16) matmuls on 4-bit weights (w4 tiles).
    W4a16Sm70,
    /// The wide sm_90+ tensor-core GEMM on 4-bit weights (w4 tiles, the common layouts);
    /// compiled after `w4a16.cu`'s helpers ([`KernelModule::full_source`]).
    W4a16Gemm,
    /// The sm_90a warpgroup-MMA GEMM on 4-bit weights (w4 tiles, the common layouts); compiled
    /// after `w4a16.cu`'s helpers ([`KernelModule::full_source`]).
    W4a16Wgmma,
    /// The sm_90+ 1–8-row GEMV on 4-bit weights fed by bulk copies (w4 tiles, the common
    /// layouts); compiled after `w4a16.cu`'s helpers ([`KernelModule::full_source`]).
    W4a16Bulk,

    /// Decode attention on tensor cores (mma m16n8k16, sm_80+, 16-bit compute) for long contexts.
    AttentionDecodeMma,
    /// The sm_90+ 9–16-row cluster GEMV on 4-bit weights; after `w4a16.cu`'s helpers.
    W4a16Xs,
    W4a16Gemv, // the 1–8-row GEMV on 4-bit weights and its builds; after w4a16.cu's helpers
    /// The batch-invariant pipelined (cp.async) tensor-core GEMM for dense 16-bit weights at
    /// prefill sizes (sm_80+, `KILN_DENSE_MATMUL=mma` above 64 rows): the same bits as
    /// `dense.cu`'s `mma` kernels; compiled after `dense_common.cuh`.
    DenseGemm,
    /// The sm_90+ 17–64-row cluster GEMV on 4-bit weights (32 or 64 x rows per CTA); after
    /// `w4a16.cu`'s helpers, the hints and `w4a16_xs.cu`'s cluster helpers.
    W4a16Xr,
}

impl KernelModule {
    /// Every module, in load order.
    pub const ALL: [KernelModule; 23] = [
        KernelModule::Elementwise,
        KernelModule::RmsNorm,
        KernelModule::Rope,
        KernelModule::KvCache,
        KernelModule::Attention,
        KernelModule::AttentionDecode,
        KernelModule::Dequant,
        KernelModule::Sampling,
        KernelModule::W4a16,
        KernelModule::Gdn,
        KernelModule::Dense,
        KernelModule::GdnChunk,
        KernelModule::GatedAttention,
        KernelModule::GgufMm,
        KernelModule::W4a16Sm70,
        KernelModule::W4a16Gemm,
        KernelModule::W4a16Wgmma,
        KernelModule::W4a16Bulk,
        KernelModule::AttentionDecodeMma,
        KernelModule::W4a16Xs,
        KernelModule::W4a16Gemv,
        KernelModule::DenseGemm,
        KernelModule::W4a16Xr,
    ];

    /// File name under `kernels/`.
    pub fn file_name(self) -> &'static str {
        match self {
            KernelModule::Elementwise => "elementwise.cu",
            KernelModule::RmsNorm => "rms_norm.cu",
            KernelModule::Rope => "rope.cu",
            KernelModule::KvCache => "kv_cache.cu",
            KernelModule::Attention => "attention.cu",
            KernelModule::AttentionDecode => "attention_decode.cu",
            KernelModule::Dequant => "dequant.cu",
            KernelModule::Sampling => "sampling.cu",
            KernelModule::W4a16 => "w4a16.cu",
            KernelModule::Gdn => "gdn.cu",
            KernelModule::Dense => "dense.cu",
            KernelModule::GdnChunk => "gdn_chunk.cu",
            KernelModule::GatedAttention => "gated_attention.cu",
            KernelModule::GgufMm => "gguf_mm.cu",
            KernelModule::W4a16Sm70 => "w4a16_sm70.cu",
            KernelModule::W4a16Gemm => "w4a16_gemm.cu",
            KernelModule::W4a16Wgmma => "w4a16_wgmma.cu",
            KernelModule::W4a16Bulk => "w4a16_bulk.cu",

            KernelModule::AttentionDecodeMma => "attention_decode_mma.cu",
            KernelModule::W4a16Xs => "w4a16_xs.cu",
            KernelModule::W4a16Gemv => "w4a16_gemv.cu",
            KernelModule::DenseGemm => "dense_gemm.cu",
            KernelModule::W4a16Xr => "w4a16_xr.cu",
        }
    }

    /// The file's source as embedded at build time.
    pub fn source(self) -> &'static str {
        match self {
            KernelModule::Elementwise => include_str!("../../../kernels/elementwise.cu"),
            KernelModule::RmsNorm => include_str!("../../../kernels/rms_norm.cu"),
            KernelModule::Rope => include_str!("../../../kernels/rope.cu"),
            KernelModule::KvCache => include_str!("../../../kernels/kv_cache.cu"),
            KernelModule::Attention => include_str!("../../../kernels/attention.cu"),
            KernelModule::AttentionDecode => {
                include_str!("../../../kernels/attention_decode.cu")
            }
            KernelModule::Dequant => include_str!("../../../kernels/dequant.cu"),
            KernelModule::Sampling => include_str!("../../../kernels/sampling.cu"),
            KernelModule::W4a16 => include_str!("../../../kernels/w4a16.cu"),
            KernelModule::Gdn => include_str!("../../../kernels/gdn.cu"),
            KernelModule::Dense => include_str!("../../../kernels/dense.cu"),
            KernelModule::GdnChunk => include_str!("../../../kernels/gdn_chunk.cu"),
            KernelModule::GatedAttention => include_str!("../../../kernels/gated_attention.cu"),
            KernelModule::GgufMm => include_str!("../../../kernels/gguf_mm.cu"),
            KernelModule::W4a16Sm70 => include_str!("../../../kernels/w4a16_sm70.cu"),
            KernelModule::W4a16Gemm => include_str!("../../../kernels/w4a16_gemm.cu"),
            KernelModule::W4a16Wgmma => include_str!("../../../kernels/w4a16_wgmma.cu"),
            KernelModule::W4a16Bulk => include_str!("../../../kernels/w4a16_bulk.cu"),

            KernelModule::AttentionDecodeMma => {
                include_str!("../../../kernels/attention_decode_mma.cu")
            }
            KernelModule::W4a16Xs => include_str!("../../../kernels/w4a16_xs.cu"),
            KernelModule::W4a16Gemv => include_str!("../../../kernels/w4a16_gemv.cu"),
            KernelModule::DenseGemm => include_str!("../../../kernels/dense_gemm.cu"),
            KernelModule::W4a16Xr => include_str!("../../../kernels/w4a16_xr.cu"),
        }
    }

    /// `common.cuh` followed by the module's source: what NVRTC compiles. `w4a16_bulk.cu` gets
    /// `w4a16.cu` up to its entry points ([`W4A16_ENTRIES_MARK`]) in between: its layout,
    /// decode and PDL helpers, the same code as the other GEMVs (templates only: nothing of it
    /// is instantiated twice).
    pub fn full_source(self) -> String {
        // So do the 9–16-row cluster GEMV (`w4a16_xs.cu`) and the sm_90 GEMMs (`w4a16_gemm.cu`,
        // `w4a16_wgmma.cu`): their decode, mma, swizzle and cp.async helpers are w4a16.cu's, one
        // copy for every w4 kernel.
        if matches!(
            self,
            KernelModule::W4a16Bulk
                | KernelModule::W4a16Xs
                | KernelModule::W4a16Xr
                | KernelModule::W4a16Gemv
                | KernelModule::W4a16Gemm
                | KernelModule::W4a16Wgmma
        ) {
            let w4 = KernelModule::W4a16.source();
            let helpers = w4.split(W4A16_ENTRIES_MARK).next().unwrap_or(w4);
            // The two GEMVs' weight-stream L2 hints (`w4a16_hints.cuh`), one copy for both.
            let hints = matches!(
                self,
                KernelModule::W4a16Xs | KernelModule::W4a16Xr | KernelModule::W4a16Gemv
            )
            .then_some(concat!(
                "\n#line 1 \"w4a16_hints.cuh\"\n",
                include_str!("../../../kernels/w4a16_hints.cuh")
            ));
            // The 17–64-row cluster GEMV: the 9–16-row one's cluster helpers, without its
            // entry points (templates only: nothing of it is instantiated twice).
            let xs = (self == KernelModule::W4a16Xr).then(|| {
                let src = KernelModule::W4a16Xs.source();
                let helpers = src.split(W4A16_XS_ENTRIES_MARK).next().unwrap_or(src);
                format!("\n#line 1 \"w4a16_xs.cu\"\n{helpers}")
            });
            return format!(
                "{COMMON_HEADER}\n#line 1 \"w4a16.cu\"\n{helpers}{}{}\n#line 1 \"{}\"\n{}",
                hints.unwrap_or_default(),
                xs.unwrap_or_default(),
                self.file_name(),
                self.source()
            );
        }
        // The dense tensor-core kernels share dense_common.cuh (the PDL wait, the fragment <->
        // k-column mmas, the D-fragment store): one copy for both modules.
        if matches!(self, KernelModule::Dense | KernelModule::DenseGemm) {
            return format!(
                "{COMMON_HEADER}\n#line 1 \"dense_common.cuh\"\n{DENSE_COMMON_HEADER}\n#line 1 \"{}\"\n{}",
                self.file_name(),
                self.source()
            );
        }
        // `#pragma once` in common.cuh is harmless here; the #line resets error locations so
        // NVRTC logs point into the .cu file itself (the tensor-core decode's combine follows it).
        let merge = (self == KernelModule::AttentionDecodeMma).then_some(concat!(
            "\n#line 1 \"attention_decode_mma_merge.cuh\"\n",
            include_str!("../../../kernels/attention_decode_mma_merge.cuh")
        ));
        format!(
            "{COMMON_HEADER}\n#line 1 \"{}\"\n{}{}",
            self.file_name(),
            self.source(),
            merge.unwrap_or_default()
        )
    }

    /// Whether a backend for `arch` builds and loads this module: the sm_70 / sm_75 tensor-core
    /// kernels only there (newer GPUs have faster instructions), the kernels that need newer
    /// hardware only on it (`cuda_kernels_compile` still compiles every module for every
    /// target); every other module everywhere.
    pub fn builds_for(self, arch: super::nvrtc::Arch) -> bool {
        match self {
            KernelModule::W4a16Sm70 => arch.major == 7,
            // mma.sync m16n8k16 with bf16, movmatrix, cp.async: sm_80 and newer.
            KernelModule::AttentionDecodeMma => arch.major >= 8,
            // 224 KB of shared memory a block, thread-block clusters: sm_90 and newer
            // (w4g_gemm_ok picks the GPUs).
            KernelModule::W4a16Gemm | KernelModule::W4a16Wgmma => arch.major >= 9,
            // cp.async.bulk and mbarrier transaction counts: sm_90 and newer.
            KernelModule::W4a16Bulk => arch.major >= 9,
            KernelModule::W4a16Xs | KernelModule::W4a16Xr => arch.major >= 9, // clusters, DSMEM
            // mma.sync m16n8k16 with bf16 and cp.async: sm_80 and newer.
            KernelModule::DenseGemm => arch.major >= 8,
            _ => true,
        }
    }

    /// The NVRTC `--gpu-architecture` this module is compiled with for `arch`: `sm_90a` for the
    /// warpgroup-MMA GEMM of `w4a16_wgmma.cu` on a real sm_90 (wgmma needs the arch-specific
    /// target; such a cubin loads on compute capability 9.0 only), otherwise the arch's own name.
    pub fn nvrtc_arch(self, arch: super::nvrtc::Arch) -> Option<&'static str> {
        if self == KernelModule::W4a16Wgmma
            && arch.major == 9
            && arch.minor == 0
            && !arch.virtual_only
        {
            Some("sm_90a")
        } else {
            arch.name()
        }
    }

    /// Extra NVRTC options a backend of compute dtype suffix `t` and KV storage suffix `c` compiles
    /// this module with: `attention_decode.cu` is then built for that one pair only (its 54
    /// kernels were most of a cold start), `w4a16_gemv.cu` for the build(s) that run; every
    /// other module is built whole.
    pub fn defines(self, t: &str, c: &str) -> Vec<String> {
        match self {
            KernelModule::AttentionDecode => vec![
                "-DKILN_DECODE_ONLY".into(),
                format!("-DKILN_DECODE_T_{t}"),
                format!("-DKILN_DECODE_C_{c}"),
            ],
            // The same for the tensor-core decode kernels (none for f32 compute), with the stage
            // budget of `KILN_DMMA_STAGE_BUDGET` when set (see `decode_mma_stage_budget`).
            KernelModule::AttentionDecodeMma => {
                let mut d = vec![
                    "-DKILN_DMMA_ONLY".into(),
                    format!("-DKILN_DMMA_T_{t}"),
                    format!("-DKILN_DMMA_C_{c}"),
                ];
                if let Some(b) = super::backend::decode_mma_stage_budget() {
                    d.push(format!("-DDMMA_STAGE_BUDGET={b}"));
                }
                // e4m3 widened by the sm_89+ conversion instruction (no effect below sm_89);
                // `KILN_DMMA_FP8_CVT=0` (read at each backend's creation, so one process can
                // compare both) keeps the byte tricks. Same bits either way.
                if c == "e4m3" && !std::env::var("KILN_DMMA_FP8_CVT").is_ok_and(|v| v == "0") {
                    d.push("-DDMMA_FP8_CVT".into());
                }
                // `KILN_DMMA_XPART=0` (read at each backend's creation): the ring drained at each
                // part's end, as before the next part's chunks were issued ahead of the merge.
                // Same bits either way.
                if std::env::var("KILN_DMMA_XPART").is_ok_and(|v| v == "0") {
                    d.push("-DDMMA_NO_XPART".into());
                }
                // `KILN_DMMA_ISSUE=generic`: every chunk's copies by the per-row table walk.
                if std::env::var("KILN_DMMA_ISSUE").is_ok_and(|v| v == "generic") {
                    d.push("-DDMMA_GENERIC_ISSUE".into());
                }
                // `KILN_DMMA_VEC_MERGE=0`: the end-of-part merge one dim per step (same bits).
                if std::env::var("KILN_DMMA_VEC_MERGE").is_ok_and(|v| v == "0") {
                    d.push("-DDMMA_SCALAR_MERGE".into());
                }
                d
            }
            // `KILN_W4W_DEFINES=W4W_SWZ=0,W4S_RING=2`: build the warpgroup-MMA GEMMs with
            // these layout / schedule options of `w4g_wgmma` / `w4g_ws` (a measurement knob:
            // every option gives the same bits; see kernels/w4a16_wgmma.cu).
            KernelModule::W4a16Wgmma => std::env::var("KILN_W4W_DEFINES")
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|d| {
                            (d.starts_with("W4W_") || d.starts_with("W4S_"))
                                && !d.contains(char::is_whitespace)
                        })
                        .map(|d| format!("-D{d}"))
                        .collect()
                })
                .unwrap_or_default(),
            // The 1–8-row GEMV: only the build(s) that run, for this dtype (cold start).
            KernelModule::W4a16Gemv => super::backend::w4_gemv_defines(t),
            // `KILN_GDN_CHUNK_TILES=fma`: below sm_80 the chunked GDN prefill runs its tiles in
            // f32 FMAs instead of m8n8k4 tensor cores (to compare the two; no effect on sm_80+).
            KernelModule::GdnChunk
                if std::env::var("KILN_GDN_CHUNK_TILES").is_ok_and(|v| v == "fma") =>
            {
                vec!["-DGC_FMA_TILES".into()]
            }
            // `KILN_DENSE_PREFETCH=0`: the small dense kernels load the norm weight and the
            // residual after the wait, as before that prefetch; `KILN_DENSE_NORM=shared`: their
            // NORM prologue takes one warp per row through shared memory, as before every warp
            // took its own (both to measure; same bits).
            KernelModule::Dense => {
                let mut d = Vec::new();
                if std::env::var("KILN_DENSE_PREFETCH").is_ok_and(|v| v == "0") {
                    d.push("-DKILN_DENSE_NO_PREFETCH".into());
                }
                if std::env::var("KILN_DENSE_NORM").is_ok_and(|v| v == "shared") {
                    d.push("-DKILN_DENSE_NORM_SHARED".into());
                }
                // `KILN_DENSE_BPRE=0`: the small kernels load each k block's x words just before
                // its mmas, as before `mma64` (to measure; same bits).
                if std::env::var("KILN_DENSE_BPRE").is_ok_and(|v| v == "0") {
                    d.push("-DKILN_DENSE_NO_BPRE".into());
                }
                d
            }
            // `KILN_DENSE_GEMM_PREFETCH=1` (read at each backend's creation): the dense GEMM with
            // two fragment register sets (the next k block's words read before this one's
            // mmas; the 64 × 32 and smaller warp tiles). Same bits either way.
            KernelModule::DenseGemm
                if std::env::var("KILN_DENSE_GEMM_PREFETCH").is_ok_and(|v| v == "1") =>
            {
                vec!["-DDG_PREFETCH".into()]
            }
            _ => Vec::new(),
        }
    }

    /// The entry points of the module as compiled with [`KernelModule::defines`]`(t, c)`: a subset
    /// of [`KernelModule::entry_points`].
    pub fn entry_points_for(self, t: &str, c: &str) -> Vec<String> {
        let all = self.entry_points();
        match self {
            KernelModule::AttentionDecode => {
                let pair = format!("attention_decode_{t}_{c}_");
                let combine = format!("attention_decode_combine_{t}");
                all.into_iter()
                    .filter(|n| n.starts_with(&pair) || *n == combine)
                    .collect()
            }
            KernelModule::AttentionDecodeMma => {
                let pair = format!("attention_decode_mma_{t}_{c}_");
                let combine = super::backend::decode_mma_combine_name(t);
                all.into_iter()
                    .filter(|n| n.starts_with(&pair) || *n == combine)
                    .collect()
            }
            _ => all,
        }
    }

    /// Entry points this module must export (checked after loading, and by `kiln doctor`).
    pub fn entry_points(self) -> Vec<String> {
        let floats = ["f32", "f16", "bf16"];
        let mut names = Vec::new();
        for t in floats {
            match self {
                KernelModule::Elementwise => {
                    for op in ["embedding", "silu_mul", "swiglu", "add"] {
                        names.push(format!("{op}_{t}"));
                    }
                    names.push(format!("swiglu_il_{t}"));
                    if t != "f32" {
                        names.push(format!("cast_f32_to_{t}"));
                        names.push(format!("cast_{t}_to_f32"));
                        names.push(format!("embedding_{t}_to_f32"));
                    }
                }
                KernelModule::RmsNorm => {
                    names.push(format!("rms_norm_{t}"));
                    if t != "f32" {
                        names.push(format!("rms_norm_{t}_rf32"));
                        names.push(format!("rms_norm_{t}_xf32"));
                    }
                }
                KernelModule::Rope => names.push(format!("rope_{t}")),
                KernelModule::KvCache => {
                    for c in ["same", "e5m2", "e4m3"] {
                        names.push(format!("kv_write_{t}_{c}"));
                        names.push(format!("qkv_rope_write_{t}_{c}"));
                    }
                }
                KernelModule::Attention => {
                    for c in ["same", "e5m2", "e4m3"] {
                        names.push(format!("attention_{t}_{c}"));
                        names.push(format!("attention_serial_{t}_{c}"));
                        for d in ["d64", "d128", "d256"] {
                            names.push(format!("attention_prefill_{t}_{c}_{d}"));
                        }
                    }
                    names.push(format!("attention_combine_{t}"));
                }
                KernelModule::AttentionDecode => {
                    for c in ["same", "e5m2", "e4m3"] {
                        names.extend(
                            super::attention_plan::DecodeVariant::all()
                                .map(|v| v.kernel_name(t, c)),
                        );
                    }
                    names.push(format!("attention_decode_combine_{t}"));
                }
                // 16-bit compute only (f32 keeps attention_decode.cu).
                KernelModule::AttentionDecodeMma => {
                    if t != "f32" {
                        for c in ["same", "e5m2", "e4m3"] {
                            let dims = super::backend::DECODE_MMA_DIMS;
                            let one = |d| super::backend::decode_mma_name(t, c, d);
                            names.extend(dims.map(one)); // then the paired twins (attention_mma.rs)
                            names.extend(dims.map(|d| format!("{}_p2", one(d))));
                        }
                        names.push(super::backend::decode_mma_combine_name(t));
                    }
                }
                KernelModule::Dequant => {
                    for q in ["q8_0", "q4_0", "q4_1"] {
                        names.push(format!("dequant_{q}_{t}"));
                    }
                }
                // Logits are f32 whatever the compute dtype: one variant, added below.
                KernelModule::Sampling => {}
                // Tensor-core kernels for the 16-bit dtypes, the FMA path for all three.
                KernelModule::W4a16 => {
                    if t != "f32" {
                        let f = ["w4_gemv32", "w4_gemvx1", "w4_gemvx2", "w4_gemm"];
                        names.extend(f.map(|f| format!("{f}_{t}")));
                    }
                    names.push(format!("w4_fma_{t}"));
                }
                KernelModule::Gdn => {
                    names.extend(super::backend::GDN_OPS.iter().map(|op| format!("{op}_{t}")));
                    if t != "f32" {
                        names.push(format!("rms_norm_1p_{t}_rf32"));
                        names.push(format!("rms_norm_1p_{t}_xf32"));
                    }
                }
                KernelModule::GatedAttention => {
                    for c in ["same", "e5m2", "e4m3"] {
                        names.push(format!("gated_qkv_rope_write_{t}_{c}"));
                    }
                }
                // The 16-bit dtypes only (f32 compute keeps the scan).
                KernelModule::GdnChunk => {
                    if t != "f32" {
                        names.extend(
                            super::backend::GDN_CHUNK_OPS
                                .iter()
                                .map(|op| format!("{op}_{t}")),
                        )
                    }
                }
                KernelModule::Dense => {
                    if t != "f32" {
                        names.push(format!("dense_xwt_{t}"));
                        names.push(format!("dense_xwt_{t}_f32"));
                        names.extend(super::backend::MmaKernels::names(t));
                        for c in ["same", "e5m2", "e4m3"] {
                            for rg in [1, 2, 4, 8] {
                                names.push(super::backend::MmaKernels::rope_name(rg, t, c));
                            }
                        }
                    }
                }
                // fp16 only: the compute dtype of sm_70 / sm_75 (f32 keeps the FMA path).
                KernelModule::W4a16Sm70 => {
                    if t == "f16" {
                        names.push(format!("w4s70_gemv_{t}"));
                        names.push(format!("w4s70_gemm_{t}"));
                    }
                }
                // The 16-bit dtypes (the host launches it on sm_90 / sm_100 only).
                KernelModule::W4a16Gemm => {
                    if t != "f32" {
                        for v in ["gemm", "tile", "split"] {
                            names.push(format!("w4g_{v}_{t}"));
                        }
                    }
                }
                // The 16-bit dtypes (the host launches it on sm_90 only).
                KernelModule::W4a16Wgmma => {
                    if t != "f32" {
                        names.push(format!("w4g_wgmma_{t}"));
                        names.push(format!("w4g_ws_{t}"));
                    }
                }
                // The 16-bit dtypes (the host launches them on sm_90+ only).
                KernelModule::W4a16Bulk => {
                    if t != "f32" {
                        names.extend(w4_bulk_names(t));
                    }
                }
                KernelModule::W4a16Xs if t != "f32" => names.extend(w4_xc_names(t)),
                KernelModule::W4a16Xs => {}
                KernelModule::W4a16Xr if t != "f32" => names.extend(w4_xr_names(t)),
                KernelModule::W4a16Xr => {}
                KernelModule::W4a16Gemv => names.extend(super::backend::w4_gemv_names(t)),
                KernelModule::DenseGemm if t != "f32" => {
                    names.extend(super::backend::GemmKernels::names(t))
                }
                KernelModule::DenseGemm => {}
                KernelModule::GgufMm => {
                    for q in ["q4_0", "q4_1", "q8_0", "q4_k", "q6_k"] {
                        if t != "f32" {
                            names.push(format!("gguf_gemv_{q}_{t}"));
                            names.push(format!("gguf_gemm_{q}_{t}"));
                            names.push(format!("gguf_gather_{q}_{t}_to_f32"));
                        }
                        names.push(format!("gguf_fma_{q}_{t}"));
                        names.push(format!("gguf_gather_{q}_{t}"));
                    }
                }
            }
        }
        if self == KernelModule::KvCache {
            for b in ["b1", "b2", "b4"] {
                names.push(format!("kv_copy_block_{b}"));
            }
        }
        if self == KernelModule::Elementwise {
            names.push("gpu_sleep".into());
            names.push("feed_tokens".into());
        }
        if self == KernelModule::Sampling {
            names.push("sample_rows".into());
            names.push("argmax_rows".into());
        }
        names
    }
}

#[cfg(test)]
mod tests;
