#!/usr/bin/env python3
"""Generate kiln's 4-bit checkpoint fixtures and their transformers references (float32, CPU).

One tiny seeded llama (vocab 256, hidden 128, intermediate 256, 2 layers, 4 heads, 2 KV heads,
head_dim 32, bf16 weights) is written in every packed format kiln reads, each as a Hugging Face
folder under tests/fixtures/ with its `quantization_config`:

- `tiny-llama-ct-w4a16-asym-g128`: compressed-tensors `pack-quantized`, W4A16_ASYM preset, group
  128, `ignore: ["lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$"]` (those stay bf16).
- `tiny-llama-ct-w4a16-sym-g32`: compressed-tensors `pack-quantized`, symmetric, group 32.
- `tiny-llama-ct-nvfp4a16`: compressed-tensors `nvfp4-pack-quantized`, NVFP4A16 preset.
- `tiny-llama-awq-g64`: AutoAWQ GEMM, group 64, packed by AutoAWQ's own `WQLinear_GEMM.from_linear`.
- `tiny-llama-gptq-g64-desc-act`: GPTQ 4-bit, group 64, desc_act (a `g_idx` that permutes the
  groups), `checkpoint_format: gptq` (zeros stored minus one). No GPTQ writer installs without a
  GPU (auto-gptq and gptqmodel build CUDA extensions), so this one is packed here with numpy in the
  documented layout (`qweight [K/8, N]`, `qzeros [K/G, N/8]`, `scales [K/G, N]`, `g_idx [K]`).

compressed-tensors writes its files through its own compressors (`PackedQuantizationCompressor`,
`NVFP4PackedCompressor`) from scales computed by its own `calculate_qparams` / `generate_gparam`;
no calibration (the scales come from each group's min/max), which is all a loader test needs.

Reference: the stored parts dequantized to float32 (numpy, the formulas of
shared/docs/qwen3_5.md §4), checked against the library's own decompressor (compressed-tensors
`decompress`, AutoAWQ `dequantize_gemm`) where there is one, then loaded into
`LlamaForCausalLM` in float32 with eager attention: logits and greedy continuations in
tests/golden/tiny_llama_<fixture>.json, the format of scripts/gen-golden.py.

Setup: the venv of scripts/gen-golden.py plus

    /work/venv/bin/pip install compressed-tensors==0.20.0 && /work/venv/bin/pip install --no-deps autoawq==0.2.9

Run from the repository root (about a minute): /work/venv/bin/python scripts/gen-quant-fixtures.py
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261201

_spec = importlib.util.spec_from_file_location("gen_golden", ROOT / "scripts" / "gen-golden.py")
gg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gg)

CONFIG = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    tie_word_embeddings=False,
)
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]  # fmt: skip


def versions() -> str:
    from importlib.metadata import version

    return (
        f"compressed-tensors {version('compressed-tensors')}, autoawq {version('autoawq')}, "
        + gg.versions()
    )


def base_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    gg.init_tiny(model, SEED)
    return model.to(torch.bfloat16).eval()


def linear_modules(ignore) -> list[str]:
    names = [f"model.layers.{i}.{l}" for i in range(CONFIG["num_hidden_layers"]) for l in LINEARS]
    return [n for n in names if not ignore(n)]


# --- compressed-tensors ---------------------------------------------------------------------------


def ct_compress(w: torch.Tensor, scheme, nvfp4: bool):
    """The parts of one bf16 weight `[N, K]`, written by compressed-tensors' compressor."""
    from compressed_tensors.compressors import NVFP4PackedCompressor, PackedQuantizationCompressor
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    args = scheme.weights
    n, k = w.shape
    g = args.group_size
    groups = w.float().reshape(n, k // g, g)
    mins, maxs = groups.amin(-1), groups.amax(-1)
    sd = {"weight": w}
    if nvfp4:
        gs = generate_gparam(w.float().amin(), w.float().amax()).reshape(1)
        scale, _ = calculate_qparams(mins, maxs, args, global_scale=gs)
        sd.update(weight_scale=scale, weight_global_scale=gs)
        return NVFP4PackedCompressor.compress(sd, scheme)
    scale, zp = calculate_qparams(mins, maxs, args)
    sd["weight_scale"] = scale.to(torch.bfloat16)
    if not args.symmetric:
        sd["weight_zero_point"] = zp
    return PackedQuantizationCompressor.compress(sd, scheme)


def ct_decompress(parts: dict, scheme, nvfp4: bool) -> torch.Tensor:
    from compressed_tensors.compressors import NVFP4PackedCompressor, PackedQuantizationCompressor

    c = NVFP4PackedCompressor if nvfp4 else PackedQuantizationCompressor
    return c.decompress(dict(parts), scheme)["weight"].float()


def np_dequant_ct(parts: dict, scheme, nvfp4: bool) -> np.ndarray:
    """float32 dequantization from the stored parts, written from qwen3_5.md §4.1 / §4.3."""
    if nvfp4:
        packed = parts["weight_packed"].numpy()
        n, half = packed.shape
        lut = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
        nib = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(n, 2 * half)
        fp4 = lut[nib & 7] * np.where(nib & 8, -1.0, 1.0).astype(np.float32)
        s = parts["weight_scale"].float().numpy() / parts["weight_global_scale"].float().numpy()[0]
        return fp4 * np.repeat(s.astype(np.float32), 16, axis=1)
    words = parts["weight_packed"].numpy().view(np.uint32)
    n = words.shape[0]
    k = words.shape[1] * 8
    q = np.stack([(words >> (4 * j)) & 0xF for j in range(8)], axis=-1).reshape(n, k).astype(np.int32)
    g = scheme.weights.group_size
    if "weight_zero_point" in parts:
        zw = parts["weight_zero_point"].numpy().view(np.uint32)
        zp = np.stack([(zw[r // 8] >> (4 * (r % 8))) & 0xF for r in range(n)]).astype(np.int32)
    else:
        zp = np.full((n, k // g), 8, dtype=np.int32)
    s = parts["weight_scale"].float().numpy()
    return ((q - np.repeat(zp, g, axis=1)).astype(np.float32) * np.repeat(s, g, axis=1)).astype(np.float32)


def write_ct(name: str, preset: str, group: int | None, ignore_list: list[str], nvfp4: bool) -> dict:
    import re

    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    model = base_model()
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if group is not None:
        scheme.weights.group_size = group
    def ignore(m: str) -> bool:
        return any(m == e or (e.startswith("re:") and re.match(e[3:], m)) for e in ignore_list)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    ref = {k: v.float() for k, v in sd.items()}
    worst = 0.0
    for m in linear_modules(ignore):
        w = sd.pop(f"{m}.weight")
        parts = ct_compress(w, scheme, nvfp4)
        mine = np_dequant_ct(parts, scheme, nvfp4)
        lib = ct_decompress(parts, scheme, nvfp4).numpy()
        # The library dequantizes in the scale dtype (bf16): equal up to its rounding.
        rel = np.max(np.abs(mine - lib) / np.maximum(np.abs(mine), 1e-30))
        assert rel <= 2.0**-8, (name, m, rel)
        worst = max(worst, float(np.max(np.abs(mine - w.float().numpy()))))
        ref[f"{m}.weight"] = torch.from_numpy(mine)
        for leaf, t in parts.items():
            sd[f"{m}.{leaf}"] = t.contiguous()
    qc = QuantizationConfig(
        config_groups={"group_0": scheme},
        format="nvfp4-pack-quantized" if nvfp4 else "pack-quantized",
        ignore=ignore_list,
        quantization_status="compressed",
    ).model_dump(mode="json")
    print(f"{name}: max |W - dequant(W)| = {worst:.4g}")
    return save(name, sd, qc, ref, f"compressed-tensors {preset} (group {scheme.weights.group_size}), ignore {ignore_list}")


# --- AutoAWQ --------------------------------------------------------------------------------------


def awq_gemm_class():
    """AutoAWQ's WQLinear_GEMM without running awq/__init__ (which imports `datasets` and model
    code this script does not need)."""
    import importlib

    base = Path(importlib.util.find_spec("awq").submodule_search_locations[0])
    for pkg, sub in [("awq", ""), ("awq.modules", "modules"), ("awq.modules.linear", "modules/linear"),
                     ("awq.utils", "utils")]:  # fmt: skip
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(base / sub)]
        sys.modules[pkg] = mod
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.utils.packing_utils import dequantize_gemm

    return WQLinear_GEMM, dequantize_gemm


def write_awq(name: str, group: int) -> dict:
    WQLinear_GEMM, dequantize_gemm = awq_gemm_class()
    model = base_model()
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    ref = {k: v.float() for k, v in sd.items()}
    for m in linear_modules(lambda _: False):
        w = sd.pop(f"{m}.weight").to(torch.float16)
        n, k = w.shape
        g = w.float().reshape(n, k // group, group)
        mx, mn = g.amax(-1), g.amin(-1)
        scales = ((mx - mn).clamp(min=1e-5) / 15).to(torch.float16)  # AutoAWQ pseudo_quantize_tensor
        zeros = (-torch.round(mn / scales.float())).clamp(0, 15).to(torch.int32)
        lin = torch.nn.Linear(k, n, bias=False, dtype=torch.float16)
        lin.weight.data.copy_(w)
        q = WQLinear_GEMM.from_linear(lin, 4, group, init_only=False,
                                      scales=scales.t().contiguous(), zeros=zeros.t().contiguous())  # fmt: skip
        parts = {"qweight": q.qweight, "qzeros": q.qzeros, "scales": q.scales}
        lib = dequantize_gemm(q.qweight, q.qzeros, q.scales, 4, group).float().t().numpy()
        mine = np_dequant_awq(parts, group)
        rel = np.max(np.abs(mine - lib) / np.maximum(np.abs(mine), 1e-30))
        assert rel <= 2.0**-10, (name, m, rel)  # AutoAWQ rounds (q − z)·s to fp16
        ref[f"{m}.weight"] = torch.from_numpy(mine)
        for leaf, t in parts.items():
            sd[f"{m}.{leaf}"] = t.contiguous()
    qc = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
          "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    return save(name, sd, qc, ref, f"AutoAWQ GEMM int4 (group {group}), packed by WQLinear_GEMM.from_linear")


def np_dequant_awq(parts: dict, group: int) -> np.ndarray:
    rev = [0, 4, 1, 5, 2, 6, 3, 7]
    def unpack(t):
        w = t.numpy().view(np.uint32)
        cols = w.shape[1] * 8
        return np.stack([(w[:, c // 8] >> (4 * rev[c % 8])) & 0xF for c in range(cols)], axis=1).astype(np.int32)
    q, z = unpack(parts["qweight"]), unpack(parts["qzeros"])  # [K, N], [K/G, N]
    s = parts["scales"].float().numpy()
    w = (q - np.repeat(z, group, axis=0)).astype(np.float32) * np.repeat(s, group, axis=0)
    return np.ascontiguousarray(w.T)


# --- GPTQ (numpy, documented layout) --------------------------------------------------------------


def write_gptq(name: str, group: int) -> dict:
    model = base_model()
    rng = np.random.default_rng(SEED)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    ref = {k: v.float() for k, v in sd.items()}
    for m in linear_modules(lambda _: False):
        w = sd.pop(f"{m}.weight").float().numpy()
        n, k = w.shape
        # desc_act: columns are quantized in a permuted order, so column k's group is
        # g_idx[k] = position of k in that order // group.
        perm = rng.permutation(k)
        g_idx = np.empty(k, dtype=np.int32)
        g_idx[perm] = np.arange(k) // group
        ng = k // group
        scales = np.zeros((ng, n), dtype=np.float16)
        zeros = np.zeros((ng, n), dtype=np.int32)
        q = np.zeros((k, n), dtype=np.int32)
        for gr in range(ng):
            cols = np.nonzero(g_idx == gr)[0]
            mx, mn = w[:, cols].max(1), w[:, cols].min(1)
            s = np.maximum((mx - mn) / 15, 1e-5).astype(np.float16)
            z = np.clip(np.round(-mn / s.astype(np.float32)), 0, 15).astype(np.int32)
            scales[gr], zeros[gr] = s, z
            q[cols] = np.clip(np.round(w[:, cols] / s.astype(np.float32)[:, None]) + z[:, None], 0, 15).T
        qweight = np.zeros((k // 8, n), dtype=np.uint32)
        for j in range(8):
            qweight |= q[j::8].astype(np.uint32) << np.uint32(4 * j)
        qzeros = np.zeros((ng, n // 8), dtype=np.uint32)
        for j in range(8):
            qzeros |= (zeros[:, j::8] - 1).astype(np.uint32) << np.uint32(4 * j)  # v1: z − 1
        sd[f"{m}.qweight"] = torch.from_numpy(qweight.view(np.int32).copy())
        sd[f"{m}.qzeros"] = torch.from_numpy(qzeros.view(np.int32).copy())
        sd[f"{m}.scales"] = torch.from_numpy(scales)
        sd[f"{m}.g_idx"] = torch.from_numpy(g_idx)
        deq = (q - zeros[g_idx]).astype(np.float32) * scales[g_idx].astype(np.float32)  # [K, N]
        ref[f"{m}.weight"] = torch.from_numpy(np.ascontiguousarray(deq.T))
    qc = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": True, "sym": False,
          "checkpoint_format": "gptq", "lm_head": False}  # fmt: skip
    return save(name, sd, qc, ref, f"GPTQ int4 (group {group}, desc_act, v1 zeros), packed with numpy")


# --- writing and the reference --------------------------------------------------------------------


def save(name: str, sd: dict, qc: dict, ref: dict, what: str) -> dict:
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    d = ROOT / "tests" / "fixtures" / f"tiny-llama-{name}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = LlamaConfig(**CONFIG).to_dict()
    cfg.update(architectures=["LlamaForCausalLM"], dtype="bfloat16", quantization_config=qc)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    (d / "README.md").write_text(
        f"Generated with scripts/gen-quant-fixtures.py ({versions()}).\n\nTiny seeded llama, {what}. "
        f"Reference: tests/golden/tiny_llama_{name.replace('-', '_')}.json (the parts dequantized to "
        "float32, run by transformers LlamaForCausalLM in float32, eager attention).\n",
        encoding="utf-8",
    )
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).float().eval()
    missing, unexpected = model.load_state_dict(ref, strict=True), None
    del missing, unexpected
    model.config._attn_implementation = "eager"
    out = ROOT / "tests" / "golden" / f"tiny_llama_{name.replace('-', '_')}.json"
    doc = gg.tiny_reference(model, f"tests/fixtures/tiny-llama-{name}", out,
                            f"tiny-llama-{name}: {what}; reference = dequantized float32", SEED + 1)  # fmt: skip
    doc["source"] = f"Generated with scripts/gen-quant-fixtures.py ({versions()})"
    gg.write_json(out, doc)
    print(f"wrote {d} ({(d / 'model.safetensors').stat().st_size} bytes of tensors)")
    return doc


def main() -> int:
    write_ct("ct-w4a16-asym-g128", "W4A16_ASYM", 128, ["lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$"], False)
    write_ct("ct-w4a16-sym-g32", "W4A16", 32, ["lm_head"], False)
    write_ct("ct-nvfp4a16", "NVFP4A16", None, ["lm_head"], True)
    write_awq("awq-g64", 64)
    write_gptq("gptq-g64-desc-act", 64)
    return 0


if __name__ == "__main__":
    sys.exit(main())
