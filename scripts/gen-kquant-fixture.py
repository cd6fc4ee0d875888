#!/usr/bin/env python3
"""Write `tests/fixtures/tiny-llama-q4_k_m.gguf`: a seeded random one-layer llama whose linears are
GGUF Q4_K and Q6_K (the mix of llama.cpp's Q4_K_M: Q6_K for `attn_v`, `ffn_down` and `output`,
Q4_K for the rest, the embedding included), for the whole-model parity test of the K-quants kept
quantized on the GPU (tests/cuda_gguf_quant.rs: CUDA against kiln's CPU backend on this file).

gguf-py (0.19) reads K-quants but cannot write them (`gguf.quants.quantize` raises
NotImplementedError for Q4_K / Q6_K), so the quantizer is here: a plain min/max fit per sub-block
(not llama.cpp's searched one — any valid blocks do for a parity test), packed exactly as ggml's
`block_q4_K` / `block_q6_K`. Every tensor is checked after packing: gguf-py's own
`gguf.quants.dequantize` of the bytes must equal this script's decode of its integers (up to f32
rounding order), and the quantization error must be that of a 4- / 6-bit fit.

Run from the repository root (seconds):

    /work/venv/bin/python scripts/gen-kquant-fixture.py

Dims: hidden 256 (K-quant rows are whole 256-element super-blocks), 4 heads of 64, 2 KV heads,
FFN 256, vocab 256 (the byte-level tiny vocabulary of scripts/gen-golden.py), 1 layer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np

SEED = 20261201
OUT = Path("tests/fixtures/tiny-llama-q4_k_m.gguf")
HIDDEN, FFN, HEADS, KV_HEADS, VOCAB, LAYERS = 256, 256, 4, 2, 256, 1
QK_K = 256


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def quantize_q4_k(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, k] f32 → ([n, k/256 * 144] u8 blocks, this script's f32 decode)."""
    n, k = w.shape
    x = w.reshape(-1, 8, 32).astype(np.float32)  # super-blocks × sub-blocks × values
    mn_f = np.maximum(0.0, -x.min(axis=2))
    sc_f = (x.max(axis=2) + mn_f) / 15.0
    d = f16(sc_f.max(axis=1) / 63.0)
    dmin = f16(mn_f.max(axis=1) / 63.0)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(sc_f / d32)), 0, 63).astype(np.uint8)
        mn = np.clip(np.nan_to_num(np.rint(mn_f / dmin32)), 0, 63).astype(np.uint8)
    ds = d32 * sc.astype(np.float32)  # [S, 8]
    dm = dmin32 * mn.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.nan_to_num(np.rint((x + dm[:, :, None]) / ds[:, :, None]))
    q = np.clip(q, 0, 15).astype(np.uint8)  # [S, 8, 32]
    decoded = ds[:, :, None] * q.astype(np.float32) - dm[:, :, None]
    # Packed 6-bit scales / mins (inverse of ggml's get_scale_min_k4).
    s = np.zeros((x.shape[0], 12), dtype=np.uint8)
    for j in range(4):
        s[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        s[:, j + 4] = (mn[:, j] & 63) | ((mn[:, j + 4] >> 4) << 6)
        s[:, j + 8] = (sc[:, j + 4] & 0xF) | ((mn[:, j + 4] & 0xF) << 4)
    # qs: chunk c (0..4), l (0..32): low nibble = sub-block 2c, high = sub-block 2c + 1.
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    blocks = np.concatenate(
        [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), s, qs], axis=1
    )
    assert blocks.shape[1] == 144
    return blocks.reshape(n, -1), decoded.reshape(n, k)


def quantize_q6_k(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, k] f32 → ([n, k/256 * 210] u8 blocks, this script's f32 decode)."""
    n, k = w.shape
    x = w.reshape(-1, 16, 16).astype(np.float32)
    amax = np.abs(x).max(axis=2)
    s_f = amax / 31.0
    d = f16(s_f.max(axis=1) / 127.0)
    d32 = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(s_f / d32)), -128, 127).astype(np.int8)
    ds = d32 * sc.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        qv = np.nan_to_num(np.rint(x / ds[:, :, None]))
    qv = np.clip(qv, -32, 31).astype(np.int32)
    decoded = ds[:, :, None] * qv.astype(np.float32)
    q = (qv + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # half, quarter, l
    ql = np.zeros((q.shape[0], 2, 64), dtype=np.uint8)
    ql[:, :, :32] = (q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4)
    ql[:, :, 32:] = (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    blocks = np.concatenate(
        [ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)],
        axis=1,
    )
    assert blocks.shape[1] == 210
    return blocks.reshape(n, -1), decoded.reshape(n, k)


def checked(name: str, w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    quant = quantize_q4_k if qtype == gguf.GGMLQuantizationType.Q4_K else quantize_q6_k
    blocks, mine = quant(w)
    theirs = gguf.quants.dequantize(blocks, qtype).reshape(w.shape)
    scale = float(np.abs(mine).max())
    diff = float(np.abs(theirs - mine).max())
    assert diff <= 1e-6 * scale, f"{name}: gguf-py decodes differently ({diff} vs {scale})"
    err = float(np.sqrt(np.mean((mine - w) ** 2)) / np.sqrt(np.mean(w**2)))
    limit = 0.12 if qtype == gguf.GGMLQuantizationType.Q4_K else 0.03
    assert err < limit, f"{name}: relative RMS quantization error {err:.3f}"
    print(f"{name:28s} {qtype.name:5s} {w.shape} rel_rms_err={err:.4f} gguf-py_decode_diff={diff:.1e}")
    return blocks


def main() -> None:
    spec = importlib.util.spec_from_file_location("gen_golden", "scripts/gen-golden.py")
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)  # for the tiny byte-level vocabulary
    rng = np.random.default_rng(SEED)
    head_dim = HIDDEN // HEADS
    q4k, q6k = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K

    w = gguf.GGUFWriter(str(OUT), "llama")
    w.add_name("tiny-llama-q4_k_m")
    w.add_description("Generated with scripts/gen-kquant-fixture.py: seeded random tiny llama, Q4_K / Q6_K")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_vocab_size(VOCAB)
    w.add_rope_dimension_count(head_dim)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, types, merges, special = golden.tiny_gpt2_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(special)
    w.add_eos_token_id(special)
    w.add_add_bos_token(False)

    def lin(name: str, n: int, k: int, qtype) -> None:
        data = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        w.add_tensor(name, checked(name, data, qtype), raw_dtype=qtype)

    def norm(name: str) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))

    emb = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    w.add_tensor("token_embd.weight", checked("token_embd.weight", emb, q4k), raw_dtype=q4k)
    for i in range(LAYERS):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        lin(p + "attn_q.weight", HIDDEN, HIDDEN, q4k)
        lin(p + "attn_k.weight", KV_HEADS * head_dim, HIDDEN, q4k)
        lin(p + "attn_v.weight", KV_HEADS * head_dim, HIDDEN, q6k)
        lin(p + "attn_output.weight", HIDDEN, HIDDEN, q4k)
        norm(p + "ffn_norm.weight")
        lin(p + "ffn_gate.weight", FFN, HIDDEN, q4k)
        lin(p + "ffn_up.weight", FFN, HIDDEN, q4k)
        lin(p + "ffn_down.weight", HIDDEN, FFN, q6k)
    norm("output_norm.weight")
    lin("output.weight", VOCAB, HIDDEN, q6k)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
