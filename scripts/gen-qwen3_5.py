#!/usr/bin/env python3
"""Generate kiln's Qwen3.5 (`qwen3_5`, hybrid Gated DeltaNet + gated attention) reference fixtures
with Hugging Face transformers (float32, CPU, eager attention).

Nothing in kiln is used to make these files; `tests/qwen3_5.rs` compares kiln against them.

Setup: the venv of scripts/gen-golden.py (transformers 5.24.0 has `qwen3_5`). Run from the
repository root (about a CPU-minute):

    /work/venv/bin/python scripts/gen-qwen3_5.py

What it writes:

- `tests/fixtures/tiny-qwen3_5/`: flat `Qwen3_5ForCausalLM` (`model_type: qwen3_5_text`,
  weights `model.*`), layers [linear, full, linear, full], attention head_dim 64 (partial rotary
  0.25 -> 16 rotary dims), 2 key heads x 2 value heads each (value heads per key head 2), MTP
  weights (`mtp.*`) inside `model.safetensors`.
- `tests/fixtures/tiny-qwen3_5-vl/`: nested `Qwen3_5ForConditionalGeneration` (`model_type:
  qwen3_5`, `text_config`, weights `model.language_model.*`, a tiny vision tower `model.visual.*`
  kiln skips), layers [linear x3, full], head_dim 128, value heads per key head 1, key head dim 16
  and value head dim 32 (a non-square state), MTP weights in a separate `model-mtp.safetensors`.
- `tests/fixtures/tiny-qwen3_5-hd256/`: flat, layers [linear, full], head_dim 256 (64 rotary dims,
  the 27B's), value heads per key head 3, tied embeddings.
- `tests/golden/tiny_qwen3_5*.json` + `.f32`: per model, the f32 logits `[200, vocab]` of one
  200-token prompt at every position (little-endian f32 rows), and greedy continuations of prompts
  of 1, 63, 64, 65 and 200 tokens (the GDN chunk is C = 64), each with its top-2 logit gaps.

The MTP weights are random and not used by transformers (it drops `mtp.*` at load); they are there
so kiln's loader can find and shape-check them. Checks the script makes on the reference itself:
the logits of every prefix (1, 63, 64, 65 tokens) equal the rows of the 200-token forward (the
reference is causal across chunk boundaries), and a cached `generate` (chunked prefill, then the
recurrent decode step from the saved conv + recurrent state) gives the same greedy tokens as
recomputing the whole sequence each step.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

SEED = 20261201
GENERATED_BY = "Generated with scripts/gen-qwen3_5.py"
PROMPT_LEN = 200
GREEDY_LENGTHS = [1, 63, 64, 65, 200]
GREEDY_STEPS = 8
WEIGHT_STD = 0.1
NORM_STD = 0.1  # (1 + w) norms: w ~ N(0, 0.1); a backend that uses w instead of 1 + w fails

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = ROOT / "tests" / "golden"

TEXT_COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    linear_conv_kernel_dim=4,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def versions() -> str:
    import transformers

    return (
        f"transformers {transformers.__version__}, torch {torch.__version__}, numpy {np.__version__}; "
        "float32 on CPU, attn_implementation=eager"
    )


def f32(x: float) -> float:
    return float(str(np.float32(x)))


def rope(theta: float, partial: float) -> dict:
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial}


def init_weights(model, seed: int) -> None:
    """Deterministic weights, independent of transformers' init code. (1 + w) norms get
    w ~ N(0, NORM_STD); the plain gated norm of the GDN (`linear_attn.norm`) 1 + N(0, NORM_STD);
    A_log ~ N(-1, 0.5) (decays exp(g) around 0.5..0.9), dt_bias ~ N(0, 0.5), conv N(0, 0.3)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + NORM_STD * noise)
            elif "norm" in name and name.endswith("weight") and p.dim() == 1:
                p.copy_(NORM_STD * noise)
            elif name.endswith("A_log"):
                p.copy_(-1.0 + 0.5 * noise)
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * noise)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(WEIGHT_STD * noise)


def mtp_tensors(text_cfg, seed: int) -> dict[str, torch.Tensor]:
    """Random MTP head weights in the checkpoint layout (one full-attention decoder layer + fc)."""
    gen = torch.Generator().manual_seed(seed)
    h, hd = text_cfg.hidden_size, text_cfg.head_dim
    nh, nkv, inter = text_cfg.num_attention_heads, text_cfg.num_key_value_heads, text_cfg.intermediate_size
    shapes = {
        "mtp.fc.weight": [h, 2 * h],
        "mtp.pre_fc_norm_embedding.weight": [h],
        "mtp.pre_fc_norm_hidden.weight": [h],
        "mtp.norm.weight": [h],
        "mtp.layers.0.input_layernorm.weight": [h],
        "mtp.layers.0.post_attention_layernorm.weight": [h],
        "mtp.layers.0.self_attn.q_proj.weight": [nh * hd * 2, h],
        "mtp.layers.0.self_attn.k_proj.weight": [nkv * hd, h],
        "mtp.layers.0.self_attn.v_proj.weight": [nkv * hd, h],
        "mtp.layers.0.self_attn.o_proj.weight": [h, nh * hd],
        "mtp.layers.0.self_attn.q_norm.weight": [hd],
        "mtp.layers.0.self_attn.k_norm.weight": [hd],
        "mtp.layers.0.mlp.gate_proj.weight": [inter, h],
        "mtp.layers.0.mlp.up_proj.weight": [inter, h],
        "mtp.layers.0.mlp.down_proj.weight": [h, inter],
    }
    return {k: WEIGHT_STD * torch.randn(s, generator=gen) for k, s in shapes.items()}


def save(model, dir_: Path, readme: str, mtp: dict[str, torch.Tensor], mtp_file: str | None) -> None:
    """save_pretrained, then add the MTP tensors: into model.safetensors (mtp_file None) or into
    their own file `mtp_file` beside it."""
    from safetensors.torch import load_file, save_file

    if dir_.exists():
        shutil.rmtree(dir_)
    model.save_pretrained(str(dir_), safe_serialization=True)
    main = dir_ / "model.safetensors"
    assert main.is_file() and not (dir_ / "model.safetensors.index.json").exists()
    if mtp_file is None:
        tensors = load_file(str(main))
        tensors.update({k: v.contiguous() for k, v in mtp.items()})
        save_file(tensors, str(main), metadata={"format": "pt"})
    else:
        save_file({k: v.contiguous() for k, v in mtp.items()}, str(dir_ / mtp_file), metadata={"format": "pt"})
    (dir_ / "README.md").write_text(f"{GENERATED_BY}.\n\n{readme}\n", encoding="utf-8")
    for f in sorted(dir_.iterdir()):
        print(f"wrote {f} ({f.stat().st_size} bytes)")


def load(dir_: Path, cls):
    m = cls.from_pretrained(str(dir_), dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


@torch.no_grad()
def forward_logits(model, ids: list[int]) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32)


@torch.no_grad()
def greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Argmax continuation (no EOS stop) recomputing the whole sequence each step (the chunked
    path over the whole sequence, no cache), with the top-2 logit gap at each step."""
    seq = list(prompt)
    ids, gaps = [], []
    for _ in range(steps):
        last = forward_logits(model, seq)[-1]
        top = torch.topk(last, 2).values
        nxt = int(torch.argmax(last))
        ids.append(nxt)
        gaps.append(f32(float(top[0] - top[1])))
        seq.append(nxt)
    return ids, gaps


@torch.no_grad()
def cached_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """The same continuation through the cache: chunked prefill, then one recurrent step per token."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([prompt]), use_cache=True, past_key_values=cache)
    ids = []
    for _ in range(steps):
        nxt = int(torch.argmax(out.logits[0, -1]))
        ids.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]]), use_cache=True, past_key_values=out.past_key_values)
    return ids


def reference(model, name: str, model_path: str, seed: int, vocab: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist()
    logits = forward_logits(model, prompt)
    assert logits.shape == (PROMPT_LEN, vocab)
    for n in [1, 63, 64, 65]:
        d = float((forward_logits(model, prompt[:n]) - logits[:n]).abs().max())
        assert d < 1e-4, f"{name}: prefix {n} differs from the full forward by {d}"
    bin_path = GOLDEN / f"{name}_logits.f32"
    bin_path.write_bytes(logits.numpy().astype("<f4").tobytes())
    print(f"wrote {bin_path} ({bin_path.stat().st_size} bytes)")
    cases = []
    for n in GREEDY_LENGTHS:
        p = torch.randint(0, vocab, (n,), generator=gen).tolist()
        ids, gaps = greedy(model, p, GREEDY_STEPS)
        cached = cached_greedy(model, p, GREEDY_STEPS)
        for step, (a, b) in enumerate(zip(ids, cached)):
            if a != b:
                assert gaps[step] < 1e-3, f"{name}: cached greedy differs at step {step} ({ids} vs {cached})"
                break
        cases.append({"name": f"prompt_{n}", "prompt_ids": p, "greedy": ids, "top2_gap": gaps})
    doc = {
        "source": f"{GENERATED_BY} ({versions()})",
        "model_path": model_path,
        "logits_file": f"tests/golden/{bin_path.name}",
        "logits_note": "row i (little-endian f32 [vocab]) predicts the token after prompt_ids[i]",
        "vocab_size": vocab,
        "prompt_ids": prompt,
        "greedy": cases,
    }
    out = GOLDEN / f"{name}.json"
    text = json.dumps(doc, indent=1)
    out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


def main() -> int:
    from transformers import (
        Qwen3_5Config,
        Qwen3_5ForCausalLM,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5TextConfig,
    )

    torch.manual_seed(SEED)

    # 1. Flat text-only model, 2 value heads per key head, head_dim 64, MTP in model.safetensors.
    cfg = Qwen3_5TextConfig(
        **TEXT_COMMON,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rope_parameters=rope(10000.0, 0.25),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        tie_word_embeddings=False,
    )
    model = Qwen3_5ForCausalLM(cfg)
    init_weights(model, SEED + 1)
    d = FIXTURES / "tiny-qwen3_5"
    save(
        model, d,
        "Tiny random `qwen3_5_text` (Qwen3_5ForCausalLM: vocab 128, hidden 64, intermediate 128, layers "
        "[linear, full, linear, full], 4 heads / 2 KV heads of 64 (partial rotary 0.25), GDN 2 key heads x "
        "4 value heads of 32, conv 4, untied lm_head), float32, seeded random weights; random `mtp.*` "
        "tensors inside model.safetensors. Reference: tests/golden/tiny_qwen3_5.json.",
        mtp_tensors(cfg, SEED + 2), None,
    )  # fmt: skip
    reference(load(d, Qwen3_5ForCausalLM), "tiny_qwen3_5", "tests/fixtures/tiny-qwen3_5", SEED + 3, 128)

    # 2. Nested VLM layout, 1 value head per key head, head_dim 128, dk != dv, MTP in its own file.
    text = dict(
        TEXT_COMMON,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        rope_parameters=rope(1e6, 0.25) | {"mrope_section": [11, 11, 10], "mrope_interleaved": True},
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=32,
        model_type="qwen3_5_text",
    )
    vision = dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
        patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
    )  # fmt: skip
    vcfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    vmodel = Qwen3_5ForConditionalGeneration(vcfg)
    init_weights(vmodel, SEED + 4)
    d = FIXTURES / "tiny-qwen3_5-vl"
    save(
        vmodel, d,
        "Tiny random `qwen3_5` (Qwen3_5ForConditionalGeneration: text_config vocab 128, hidden 64, layers "
        "[linear x3, full], 2 heads / 1 KV head of 128 (partial rotary 0.25, M-RoPE sections), GDN 2 key "
        "heads of 16 x 2 value heads of 32; a 1-block vision tower under model.visual.*), float32, seeded "
        "random weights; random `mtp.*` tensors in model-mtp.safetensors. Reference: "
        "tests/golden/tiny_qwen3_5_vl.json.",
        mtp_tensors(vcfg.text_config, SEED + 5), "model-mtp.safetensors",
    )  # fmt: skip
    reference(
        load(d, Qwen3_5ForConditionalGeneration), "tiny_qwen3_5_vl", "tests/fixtures/tiny-qwen3_5-vl", SEED + 6, 128
    )

    # 3. head_dim 256 (the 27B's attention head and rotary widths), 3 value heads per key head, tied.
    cfg3 = Qwen3_5TextConfig(
        **TEXT_COMMON,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,
        rope_parameters=rope(1e7, 0.25),
        linear_num_key_heads=1,
        linear_num_value_heads=3,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        tie_word_embeddings=True,
    )
    m3 = Qwen3_5ForCausalLM(cfg3)
    init_weights(m3, SEED + 7)
    d = FIXTURES / "tiny-qwen3_5-hd256"
    save(
        m3, d,
        "Tiny random `qwen3_5_text` (Qwen3_5ForCausalLM: vocab 128, hidden 64, layers [linear, full], 2 "
        "heads / 1 KV head of 256 (partial rotary 0.25 -> 64 dims, theta 1e7), GDN 1 key head x 3 value "
        "heads of 32, tied embeddings), float32, seeded random weights; random `mtp.*` tensors inside "
        "model.safetensors. Reference: tests/golden/tiny_qwen3_5_hd256.json.",
        mtp_tensors(cfg3, SEED + 8), None,
    )  # fmt: skip
    reference(load(d, Qwen3_5ForCausalLM), "tiny_qwen3_5_hd256", "tests/fixtures/tiny-qwen3_5-hd256", SEED + 9, 128)
    return 0


if __name__ == "__main__":
    sys.exit(main())
