#!/usr/bin/env python3
"""Generate kiln's golden reference fixtures with Hugging Face transformers (float32, CPU).

The reference is transformers' own forward pass, run in float32 on the CPU with eager attention;
nothing in kiln is used to make these files. Tests in `tests/` compare kiln against them.

Setup (the venv lives outside the repository; plain `torch` from PyPI pulls the CUDA wheels, which
is fine, the script only uses the CPU):

    python3 -m venv /work/venv && /work/venv/bin/pip install torch==2.15.0 transformers==5.24.0 accelerate==1.15.0 gguf==0.19.0 tokenizers==0.23.3 numpy==2.4.6 sentencepiece==0.2.3

Run from the repository root (about 5 CPU-minutes; longer on a busy machine):

    /work/venv/bin/python scripts/gen-golden.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/golden

What it writes (see tests/golden/README.md for the formats):

- `<out>/smollm2_logits.json` + `<out>/smollm2_logits_<case>.f32`: logits rows of the real model.
- `<out>/smollm2_greedy.json`: 32-token greedy continuations with the top-2 logit gap per step.
- `<out>/tokenizer_smollm2.json`: token ids of >= 30 strings and chat-template renders.
- `<fixtures>/tiny-llama/`, `<fixtures>/tiny-llama-bf16/`, `<fixtures>/tiny-qwen3/`: seeded random HF
  models (safetensors), and `<fixtures>/tiny-llama-{f32,q8_0,q4_0,q4_1}.gguf`: tiny-llama written as
  GGUF the way llama.cpp's `convert_hf_to_gguf.py` writes a llama (Q/K rows permuted per head).
- `<out>/tiny_<name>.json`: inline reference logits and greedy continuations for each tiny model.

After generating, it re-checks every reference with an independent float64 numpy forward pass of
its own over the written model files (llama / qwen3 math, GGUF dequantized by gguf-py and the Q/K
interleave undone by hand) and the tokenizer fixture with a plain `tokenizers.Tokenizer`;
`--verify-only` runs just these checks on the committed files.

Every step is seeded; running it twice gives the same files (up to float rounding of the BLAS
library on a different machine, far below the 1e-3 test tolerance).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

SEED = 20240607
GENERATED_BY = "Generated with scripts/gen-golden.py"
GREEDY_STEPS_SMOLLM2 = 32
GREEDY_STEPS_TINY = 16

# ------------------------------------------------------------------------------------------------
# Helpers


def versions() -> str:
    import gguf  # noqa: F401  (version through importlib.metadata below)
    import tokenizers
    import transformers
    from importlib.metadata import version

    return (
        f"transformers {transformers.__version__}, torch {torch.__version__}, tokenizers "
        f"{tokenizers.__version__}, gguf {version('gguf')}, numpy {np.__version__}; float32 on CPU, "
        f"attn_implementation=eager"
    )


def source_line() -> str:
    return f"{GENERATED_BY} ({versions()})"


def f32(x: float) -> float:
    """The shortest decimal that reads back as the same float32 (keeps the JSON small)."""
    return float(str(np.float32(x)))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def to_json(obj: Any, indent: int = 0) -> str:
    """JSON with one key per line, but a list of numbers (ids, a logits row) on one line."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {to_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in obj
    ):
        items = [f"{inner}{to_json(v, indent + 1)}" for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = to_json(obj)
    assert json.loads(text) == obj
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


@torch.no_grad()
def forward_logits(model, token_ids: list[int]) -> torch.Tensor:
    """Logits `[len(token_ids), vocab]` (float32) of one full forward pass, no cache."""
    out = model(input_ids=torch.tensor([token_ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32)


@torch.no_grad()
def greedy(model, prompt_ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Argmax continuation of exactly `steps` tokens (no EOS stop), recomputing the whole sequence
    each step, and the gap between the top-2 logits at each step."""
    seq = list(prompt_ids)
    ids, gaps = [], []
    for _ in range(steps):
        last = forward_logits(model, seq)[-1]
        top = torch.topk(last, 2).values
        nxt = int(torch.argmax(last))
        ids.append(nxt)
        gaps.append(f32(float(top[0] - top[1])))
        seq.append(nxt)
    return ids, gaps


# ------------------------------------------------------------------------------------------------
# SmolLM2 (the real default model, Q4_1 GGUF, dequantized by transformers)

# The original HF `tokenizer.json` of SmolLM2 splits every digit on its own before the GPT-2
# byte-level split; llama.cpp names that `tokenizer.ggml.pre = "smollm"`. transformers' GGUF
# converter does not know that name and keeps GPT2Tokenizer's plain ByteLevel pre-tokenizer.
def original_smollm2_pre_tokenizer():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


TOKENIZER_STRINGS: list[str] = [
    "",
    "Hello, world!",
    " Hello",
    "   leading spaces and trailing   ",
    "Hello\tworld\n\nnew paragraph\r\n",
    "\n",
    "   ",
    "  \t  \n  ",
    "multiple     internal      spaces",
    "1234567",
    "3.14159",
    "The year 2024 had 366 days; 1,000,000 people.",
    "-42 +7 0x1F 1e-9 007",
    "$100.50 €20 £5 ¥1000 ₹",
    "x² + y³ = ½ and Ⅻ",
    "Café naïve résumé façade Ångström",
    "Ünïcödé ß œ ø",
    "你好，世界！这是一个测试。",
    "日本語のテキスト カタカナ",
    "한국어 텍스트입니다",
    "Привет, мир!",
    "مرحبا بالعالم ٣٤٥",
    "🙂👍🏽 emoji 🇫🇷 family 👨\u200d👩\u200d👧",
    "ﬁ ligature, ｆｕｌｌｗｉｄｔｈ, zero\u200bwidth, e\u0301 combining",
    "def add(a, b):\n    return a + b\n",
    'fn main() {\n\tprintln!("{}", 1 + 2);\n}',
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "https://example.com/path?query=1&x=y#frag",
    "I'm sure they'll say it's fine, don't you?",
    "UPPER lower MiXeD CamelCase snake_case kebab-case",
    "<|im_start|>user\nHi<|im_end|>",
    "<|endoftext|>",
    "text<|im_end|>more",
    "<repo_name>kiln<file_sep>src/main.rs",
    "<|im_start",
    "What is the capital of France?",
    "a\x04b\x06c\x7fd",
    "a" * 100,
]

CHAT_CASES: list[tuple[list[dict[str, str]], bool]] = [
    ([{"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "user", "content": "What is the capital of France?"}], False),
    (
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three prime numbers."},
        ],
        True,
    ),
    (
        [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello! How can I help you today?"},
            {"role": "user", "content": "Count from 1 to 5."},
        ],
        True,
    ),
    (
        [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Opposite of hot?"},
            {"role": "assistant", "content": "Cold."},
        ],
        False,
    ),
    ([{"role": "user", "content": "Résumé 你好 🙂 12345\n\tdone"}], True),
]

LOGITS_CASES = [
    # (name, chat messages or plain text, positions: "last3" or explicit list resolved later)
    (
        "chat_short",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hi."},
        ],
    ),
    (
        "prose_100",
        "The river town woke slowly. Fishermen pulled their boats onto the gravel while the baker "
        "opened her shutters and set out loaves still warm from the oven. Children ran between the "
        "stalls of the market, shouting the names of friends, and an old man with a gray dog sat on "
        "the bridge counting the swallows that dipped under its arches. By noon the sun had burned "
        "away the mist, and the whole valley smelled of bread, river water and cut grass.",
    ),
]

GREEDY_CASES = [
    ("france_chat", [{"role": "user", "content": "What is the capital of France?"}]),
    ("plain_text", "The three primary colors are"),
]


def load_smollm2(model_path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    converted_pre = str(tok.backend_tokenizer.pre_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path.parent),
        gguf_file=model_path.name,
        dtype=torch.float32,
        attn_implementation="eager",
    )
    model.eval()
    return tok, converted_pre, model


def chat_ids(tok, messages, add_generation_prompt: bool) -> list[int]:
    ids = tok.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    return [int(i) for i in ids]


def gen_tokenizer(tok, converted_pre: str, model_path: Path, out: Path) -> None:
    import copy

    converted = copy.deepcopy(tok.backend_tokenizer)  # as transformers built it from the GGUF
    tok.backend_tokenizer.pre_tokenizer = original_smollm2_pre_tokenizer()
    reference = tok.backend_tokenizer

    cases, differing = [], []
    for text in TOKENIZER_STRINGS:
        for add_special in (False, True):
            ids = reference.encode(text, add_special_tokens=add_special).ids
            # The same through the transformers API (must agree with the backend call above).
            api_ids = tok(text, add_special_tokens=add_special)["input_ids"]
            assert api_ids == ids, (text, api_ids, ids)
            case = {"text": text, "add_special_tokens": add_special, "ids": ids}
            conv_ids = converted.encode(text, add_special_tokens=add_special).ids
            if conv_ids != ids:
                case["ids_transformers_gguf_pretokenizer"] = conv_ids
                differing.append(text)
            cases.append(case)

    chats = []
    for messages, add_gen in CHAT_CASES:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_gen)
        ids = chat_ids(tok, messages, add_gen)
        assert ids == reference.encode(rendered, add_special_tokens=False).ids
        chats.append(
            {
                "messages": messages,
                "add_generation_prompt": add_gen,
                "rendered": rendered,
                "ids": ids,
            }
        )

    write_json(
        out / "tokenizer_smollm2.json",
        {
            "source": source_line(),
            "model": model_path.name,
            "model_sha256": sha256(model_path),
            "tokenizer": (
                "AutoTokenizer.from_pretrained(dir, gguf_file=...): the GGUF-converted tokenizer "
                "(transformers.integrations.gguf builds a byte-level BPE from tokenizer.ggml.tokens/"
                "merges, the 17 CONTROL tokens as special added tokens, add_bos_token false; "
                f"pre-tokenizer {converted_pre}). transformers does not know tokenizer.ggml.pre="
                "'smollm', so its pre-tokenizer was replaced by the original SmolLM2 tokenizer.json "
                "one, Sequence[Digits(individual_digits=true), ByteLevel(add_prefix_space=false, "
                "trim_offsets=true, use_regex=true)] (llama.cpp's 'smollm'). `ids` come from that "
                "(Python tokenizers); a case where the unmodified GGUF conversion differs also "
                "carries `ids_transformers_gguf_pretokenizer`. Chat `ids` = apply_chat_template("
                "tokenize=True), equal to encoding `rendered` without special tokens. The vocabulary "
                "lacks 21 byte symbols (bytes 4, 6, 19, 20, 22, 29, 192, 193, 241-255): BPE without "
                "unk drops them silently (see the case with \\u0004)."
            ),
            "differing_from_transformers_gguf_pretokenizer": sorted(set(differing)),
            "cases": cases,
            "chat": chats,
        },
    )


def gen_smollm2(model_path: Path, out: Path) -> None:
    tok, converted_pre, model = load_smollm2(model_path)
    gen_tokenizer(tok, converted_pre, model_path, out)  # also switches tok to the original split
    vocab = model.config.vocab_size

    # Sanity: the model answers the France question with Paris (checks the Q/K un-permutation).
    france = chat_ids(tok, GREEDY_CASES[0][1], True)
    ids, _ = greedy(model, france, 12)
    answer = tok.decode(ids)
    print(f"sanity: France -> {answer!r}")
    assert "Paris" in answer, answer

    cases = []
    for name, prompt in LOGITS_CASES:
        if isinstance(prompt, list):
            token_ids = chat_ids(tok, prompt, True)
            positions = [len(token_ids) - 3, len(token_ids) - 2, len(token_ids) - 1]
        else:
            token_ids = tok(prompt, add_special_tokens=False)["input_ids"]
            n = len(token_ids)
            positions = [0, n // 2, n - 1]
        logits = forward_logits(model, token_ids)[positions].contiguous().numpy()
        assert logits.shape == (len(positions), vocab)
        fname = f"smollm2_logits_{name}.f32"
        logits.astype("<f4").tofile(out / fname)
        print(f"wrote {out / fname} ({(out / fname).stat().st_size} bytes)")
        cases.append(
            {
                "name": name,
                "text": tok.decode(token_ids),
                "token_ids": token_ids,
                "positions": positions,
                "logits_file": fname,
            }
        )
    write_json(
        out / "smollm2_logits.json",
        {
            "source": source_line(),
            "model": model_path.name,
            "model_sha256": sha256(model_path),
            "loaded_with": (
                "AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32, "
                "attn_implementation='eager'): transformers dequantizes Q4_1/Q8_0 with gguf-py and "
                "reverses llama.cpp's Q/K permutation"
            ),
            "vocab_size": vocab,
            "logits_format": (
                "little-endian f32, row-major [len(positions), vocab_size]; row i = logits predicting "
                "the token after token_ids[positions[i]] (0-based), one forward pass over token_ids"
            ),
            "cases": cases,
        },
    )

    gcases = []
    for name, prompt in GREEDY_CASES:
        if isinstance(prompt, list):
            prompt_ids = chat_ids(tok, prompt, True)
        else:
            prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        ids, gaps = greedy(model, prompt_ids, GREEDY_STEPS_SMOLLM2)
        print(f"greedy {name}: {tok.decode(ids)!r}")
        gcases.append(
            {
                "name": name,
                "prompt_ids": prompt_ids,
                "greedy": ids,
                "top2_gap": gaps,
                "greedy_text": tok.decode(ids),
            }
        )
    write_json(
        out / "smollm2_greedy.json",
        {
            "source": source_line(),
            "model": model_path.name,
            "model_sha256": sha256(model_path),
            "steps": GREEDY_STEPS_SMOLLM2,
            "note": (
                "greedy = argmax continuation of exactly `steps` tokens, not stopping at EOS; "
                "top2_gap[i] = top-1 minus top-2 logit at step i (compare tokens until the first "
                "step whose gap < 0.01)"
            ),
            "cases": gcases,
        },
    )


def dump_tokenizer_json(model_path: Path, dest: Path) -> None:
    """Write the reference tokenizer (GGUF conversion + original pre-tokenizer) as tokenizer.json."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    tok.backend_tokenizer.pre_tokenizer = original_smollm2_pre_tokenizer()
    tok.backend_tokenizer.save(str(dest))
    print(f"wrote {dest}")


# ------------------------------------------------------------------------------------------------
# Tiny random models

TINY_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

WEIGHT_STD = 0.1  # large enough that the logits spread (std ~1) and top-2 gaps are mostly > 0.01
NORM_JITTER = 0.1  # norm weights 1 + N(0, 0.1): a backend that ignores them fails


def init_tiny(model, seed: int) -> None:
    """Deterministic weights, independent of transformers' own init code."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + NORM_JITTER * noise)
            else:
                p.copy_(WEIGHT_STD * noise)


def tiny_prompts(seed: int) -> tuple[list[dict], list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    short = torch.randint(0, 256, (8,), generator=gen).tolist()
    long = torch.randint(0, 256, (48,), generator=gen).tolist()
    cases = [
        {"token_ids": short, "positions": list(range(len(short)))},
        {"token_ids": long, "positions": [0, 15, 31, 47]},
    ]
    g1 = torch.randint(0, 256, (5,), generator=gen).tolist()
    g2 = torch.randint(0, 256, (24,), generator=gen).tolist()
    return cases, [g1, g2]


def tiny_reference(model, model_path: str, out_json: Path, note: str, seed: int) -> dict:
    cases, greedy_prompts = tiny_prompts(seed)
    out_cases = []
    for c in cases:
        logits = forward_logits(model, c["token_ids"])[c["positions"]]
        out_cases.append(
            {
                "token_ids": c["token_ids"],
                "positions": c["positions"],
                "logits": [[f32(v) for v in row] for row in logits.tolist()],
            }
        )
    out_greedy = []
    for p in greedy_prompts:
        ids, gaps = greedy(model, p, GREEDY_STEPS_TINY)
        out_greedy.append({"prompt_ids": p, "greedy": ids, "top2_gap": gaps})
    doc = {
        "source": source_line(),
        "model_path": model_path,
        "note": note,
        "logits_note": "logits[i] predicts the token after token_ids[positions[i]] (0-based)",
        "cases": out_cases,
        "greedy": out_greedy,
    }
    write_json(out_json, doc)
    return doc


def max_abs_diff(a: dict, b: dict) -> float:
    m = 0.0
    for ca, cb in zip(a["cases"], b["cases"]):
        m = max(m, float(np.max(np.abs(np.array(ca["logits"]) - np.array(cb["logits"])))))
    return m


def write_readme(dir_: Path, text: str) -> None:
    (dir_ / "README.md").write_text(f"{GENERATED_BY}.\n\n{text}\n", encoding="utf-8")


def save_hf(model, dir_: Path, readme: str) -> None:
    if dir_.exists():
        shutil.rmtree(dir_)
    model.save_pretrained(str(dir_), safe_serialization=True)
    write_readme(dir_, readme)
    for f in sorted(dir_.iterdir()):
        print(f"wrote {f} ({f.stat().st_size} bytes)")


def load_hf(dir_: Path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(
        str(dir_), dtype=torch.float32, attn_implementation="eager"
    )
    m.eval()
    return m


# --- GGUF writing (llama.cpp's convert_hf_to_gguf.py conventions for `llama`) -------------------


def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """`LlamaModel.permute` of convert_hf_to_gguf.py: per head, rows [0, d/2) and [d/2, d) of HF's
    rotate-half layout become interleaved pairs (row 2i <- i, row 2i+1 <- d/2 + i)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


# A minimal byte-level ("gpt2") vocabulary of exactly 256 tokens so that tokenizer loaders accept
# the file: 226 byte symbols (the C0 controls except \t \n \r, and DEL, are left out, as SmolLM2's
# vocabulary also lacks some bytes), 29 merges, and <|endoftext|> as the one CONTROL token (BOS=EOS).
TINY_MERGES = [
    "Ġ t", "h e", "Ġt he", "i n", "e r", "a n", "o n", "r e", "Ġ a", "Ġ s",
    "Ġ w", "Ġ o", "Ġ c", "e n", "a t", "o r", "e s", "i s", "i t", "Ġ b",
    "Ġ f", "Ġ p", "in g", "Ġ m", "e d", "a l", "Ġ i", "Ġ d", "o u",
]  # fmt: skip


def tiny_gpt2_vocab() -> tuple[list[str], list[int], list[str], int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spell = bytes_to_unicode()
    dropped = set(range(0x00, 0x20)) - {0x09, 0x0A, 0x0D}
    dropped.add(0x7F)
    tokens = [spell[b] for b in range(256) if b not in dropped]
    for m in TINY_MERGES:
        a, b = m.split(" ")
        assert a in tokens and b in tokens
        tokens.append(a + b)
    tokens.append("<|endoftext|>")
    assert len(tokens) == 256, len(tokens)
    types = [1] * 255 + [3]  # NORMAL ..., CONTROL
    return tokens, types, TINY_MERGES, 255


def write_tiny_llama_gguf(model, cfg, path: Path, qtype_name: str) -> None:
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, qtype_name)
    file_type = {
        "F32": gguf.LlamaFileType.ALL_F32,
        "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
        "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    }[qtype_name]

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_description(f"{GENERATED_BY}: seeded random tiny llama for kiln's tests")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(file_type)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    if qtype_name != "F32":
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tokens, types, merges, special = tiny_gpt2_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(special)
    w.add_eos_token_id(special)
    w.add_add_bos_token(False)

    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for hf_name, t in model.state_dict().items():
        data = t.detach().to(torch.float32).numpy().copy()
        if hf_name.endswith("q_proj.weight"):
            data = llama_cpp_permute(data, n_head, n_head)
        elif hf_name.endswith("k_proj.weight"):
            data = llama_cpp_permute(data, n_head, n_kv)
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        if data.ndim == 1 or qtype_name == "F32":
            w.add_tensor(name, data.astype(np.float32))
        else:
            q = gguf.quants.quantize(data, qtype)
            w.add_tensor(name, q, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def gen_tiny(fixtures: Path, out: Path) -> None:
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    # tiny-llama (float32 safetensors)
    torch.manual_seed(SEED)
    cfg = LlamaConfig(**TINY_COMMON, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    init_tiny(model, SEED + 1)
    llama_dir = fixtures / "tiny-llama"
    save_hf(
        model,
        llama_dir,
        "Tiny random `llama` (LlamaConfig: vocab 256, hidden 64, intermediate 128, 2 layers, 4 heads, "
        "2 KV heads, head_dim 16, rope_theta 10000, rms_norm_eps 1e-5, untied lm_head), float32 "
        "safetensors. Weights N(0, 0.1), norm weights 1 + N(0, 0.1), seeded. No tokenizer. "
        "Reference: tests/golden/tiny_llama.json.",
    )
    ref_llama = load_hf(llama_dir)
    llama_doc = tiny_reference(
        ref_llama, "tests/fixtures/tiny-llama", out / "tiny_llama.json",
        "tiny-llama float32 safetensors loaded with AutoModelForCausalLM (dtype float32)", SEED + 2,
    )  # fmt: skip

    # tiny-llama-bf16: the same weights rounded to bf16; reference = the bf16 file read as float32.
    bf16_dir = fixtures / "tiny-llama-bf16"
    save_hf(
        ref_llama.to(torch.bfloat16),
        bf16_dir,
        "tiny-llama with its weights rounded to bfloat16 (safetensors BF16). Reference: "
        "tests/golden/tiny_llama_bf16.json (transformers loads this file with dtype float32).",
    )
    ref_bf16 = load_hf(bf16_dir)
    assert all(p.dtype == torch.float32 for p in ref_bf16.parameters())
    bf16_doc = tiny_reference(
        ref_bf16, "tests/fixtures/tiny-llama-bf16", out / "tiny_llama_bf16.json",
        "tiny-llama-bf16 (BF16 safetensors) loaded with AutoModelForCausalLM(dtype=float32)", SEED + 2,
    )  # fmt: skip
    print(f"bf16 vs f32 tiny-llama max |dlogit| = {max_abs_diff(llama_doc, bf16_doc):.4g}")

    # tiny-llama as GGUF, F32 / Q8_0 / Q4_0 / Q4_1, read back by transformers (dequantized).
    ref_llama_f32 = load_hf(llama_dir)
    for qname in ("F32", "Q8_0", "Q4_0", "Q4_1"):
        fname = f"tiny-llama-{qname.lower()}.gguf"
        gpath = fixtures / fname
        write_tiny_llama_gguf(ref_llama_f32, ref_llama_f32.config, gpath, qname)
        gm = AutoModelForCausalLM.from_pretrained(
            str(fixtures), gguf_file=fname, dtype=torch.float32, attn_implementation="eager"
        )
        gm.eval()
        doc = tiny_reference(
            gm, f"tests/fixtures/{fname}", out / f"tiny_llama_gguf_{qname.lower()}.json",
            f"tiny-llama written as GGUF {qname} (all 2-D weights {qname}, 1-D norms F32, Q/K rows "
            "permuted as convert_hf_to_gguf.py does), loaded back with AutoModelForCausalLM("
            "gguf_file=..., dtype=float32): dequantized by gguf-py, Q/K un-permuted by transformers",
            SEED + 2,
        )  # fmt: skip
        d = max_abs_diff(llama_doc, doc)
        print(f"GGUF {qname} vs safetensors tiny-llama max |dlogit| = {d:.4g}")
        if qname == "F32":
            # The round trip through llama.cpp's permutation and back must be exact.
            assert d < 1e-5, d
        tok = AutoTokenizer.from_pretrained(str(fixtures), gguf_file=fname)
        assert tok("the cat")["input_ids"], "tiny GGUF tokenizer did not load"

    # tiny-qwen3 (q_norm / k_norm, tied embeddings)
    torch.manual_seed(SEED)
    qcfg = Qwen3Config(**TINY_COMMON, head_dim=16, tie_word_embeddings=True)
    qmodel = Qwen3ForCausalLM(qcfg)
    init_tiny(qmodel, SEED + 3)
    qwen_dir = fixtures / "tiny-qwen3"
    save_hf(
        qmodel,
        qwen_dir,
        "Tiny random `qwen3` (Qwen3Config: vocab 256, hidden 64, intermediate 128, 2 layers, 4 heads, "
        "2 KV heads, head_dim 16, q_norm/k_norm, rope_theta 10000, rms_norm_eps 1e-5, tied "
        "embeddings: no lm_head.weight in the file), float32 safetensors. Weights N(0, 0.1), norm "
        "weights 1 + N(0, 0.1), seeded. No tokenizer. Reference: tests/golden/tiny_qwen3.json.",
    )
    ref_qwen = load_hf(qwen_dir)
    tiny_reference(
        ref_qwen, "tests/fixtures/tiny-qwen3", out / "tiny_qwen3.json",
        "tiny-qwen3 float32 safetensors loaded with AutoModelForCausalLM (dtype float32)", SEED + 2,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Independent cross-check: a from-scratch float64 numpy forward pass over the committed files.
# Not the reference (transformers is); it catches a fixture whose model file, config reading or
# JSON disagree with each other, and spells out the math the Rust side implements.


def np_rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def np_forward(p: dict, hp: dict, token_ids: list[int]) -> np.ndarray:
    """Logits [T, vocab] of a llama / qwen3 decoder. `p` holds HF-named float64 weights in HF
    layout ([out, in]); `hp` the hyper-parameters."""
    n_h, n_kv, hd, eps = hp["n_head"], hp["n_kv"], hp["head_dim"], hp["eps"]
    t = len(token_ids)
    x = p["model.embed_tokens.weight"][token_ids]
    inv_freq = hp["theta"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, hd/2]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]  # [T, 1, hd]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]

    def rope(v: np.ndarray) -> np.ndarray:  # HF rotate-half: pairs (i, i + hd/2)
        rot = np.concatenate([-v[..., hd // 2 :], v[..., : hd // 2]], axis=-1)
        return v * cos + rot * sin

    mask = np.triu(np.full((t, t), -np.inf), k=1)
    for layer in range(hp["n_layer"]):
        pre = f"model.layers.{layer}."
        h = np_rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = (h @ p[pre + "self_attn.q_proj.weight"].T).reshape(t, n_h, hd)
        k = (h @ p[pre + "self_attn.k_proj.weight"].T).reshape(t, n_kv, hd)
        v = (h @ p[pre + "self_attn.v_proj.weight"].T).reshape(t, n_kv, hd)
        if pre + "self_attn.q_norm.weight" in p:
            q = np_rms_norm(q, p[pre + "self_attn.q_norm.weight"], eps)
            k = np_rms_norm(k, p[pre + "self_attn.k_norm.weight"], eps)
        q, k = rope(q), rope(k)
        out = np.empty((t, n_h, hd))
        for head in range(n_h):
            kv = head // (n_h // n_kv)
            scores = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            out[:, head, :] = probs @ v[:, kv, :]
        x = x + out.reshape(t, n_h * hd) @ p[pre + "self_attn.o_proj.weight"].T
        h = np_rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        gate = h @ p[pre + "mlp.gate_proj.weight"].T
        up = h @ p[pre + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ p[pre + "mlp.down_proj.weight"].T
    x = np_rms_norm(x, p["model.norm.weight"], eps)
    lm_head = p.get("lm_head.weight", p["model.embed_tokens.weight"])
    return x @ lm_head.T


def np_load_hf(dir_: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    cfg = json.loads((dir_ / "config.json").read_text())
    tensors = load_file(str(dir_ / "model.safetensors"))
    p = {k: v.to(torch.float64).numpy() for k, v in tensors.items()}
    theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta"))
    hp = {
        "n_head": cfg["num_attention_heads"],
        "n_kv": cfg["num_key_value_heads"],
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
        "eps": cfg["rms_norm_eps"],
        "theta": float(theta),
        "n_layer": cfg["num_hidden_layers"],
    }
    return p, hp


GGUF_TO_HF = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def np_load_llama_gguf(path: Path) -> tuple[dict, dict]:
    """Dequantize every tensor (gguf-py) and undo llama.cpp's Q/K interleave: within each head,
    GGUF row 2i is HF row i and GGUF row 2i+1 is HF row d/2 + i."""
    import gguf

    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    n_h, n_kv = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    p = {}
    for t in r.tensors:
        w = gguf.dequantize(t.data, t.tensor_type).astype(np.float64)
        w = w.reshape([int(d) for d in reversed(t.shape.tolist())])
        parts = t.name.split(".")
        if parts[0] == "blk":
            base, hf = parts[2], f"model.layers.{parts[1]}." + GGUF_TO_HF[parts[2]]
        else:
            base, hf = parts[0], GGUF_TO_HF[parts[0]]
        if base in ("attn_q", "attn_k"):
            heads = n_h if base == "attn_q" else n_kv
            d = w.shape[0] // heads
            w = w.reshape(heads, d // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)
        p[hf + ".weight"] = w
    hp = {
        "n_head": n_h,
        "n_kv": n_kv,
        "head_dim": meta["llama.embedding_length"] // n_h,
        "eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
        "theta": float(meta["llama.rope.freq_base"]),
        "n_layer": meta["llama.block_count"],
    }
    return p, hp


def verify(out: Path, fixtures: Path, model_path: Path | None) -> None:
    """Recompute every committed reference with `np_forward` and print the max |Δ|."""
    worst = 0.0
    for ref in sorted(out.glob("tiny_*.json")):
        doc = json.loads(ref.read_text())
        mp = Path(doc["model_path"])
        mp = fixtures / mp.relative_to("tests/fixtures")
        p, hp = np_load_llama_gguf(mp) if mp.suffix == ".gguf" else np_load_hf(mp)
        d = 0.0
        for c in doc["cases"]:
            logits = np_forward(p, hp, c["token_ids"])[c["positions"]]
            d = max(d, float(np.max(np.abs(logits - np.array(c["logits"])))))
        for g in doc["greedy"]:
            seq = list(g["prompt_ids"])
            for tok_id, gap in zip(g["greedy"], g["top2_gap"]):
                if gap < 0.01:
                    break
                nxt = int(np.argmax(np_forward(p, hp, seq)[-1]))
                assert nxt == tok_id, (ref.name, seq, nxt, tok_id)
                seq.append(nxt)
        print(f"verify {ref.name}: numpy float64 vs transformers max |dlogit| = {d:.3g}")
        worst = max(worst, d)
    if model_path is not None and (out / "smollm2_logits.json").exists():
        doc = json.loads((out / "smollm2_logits.json").read_text())
        p, hp = np_load_llama_gguf(model_path)
        for c in doc["cases"]:
            ref = np.fromfile(out / c["logits_file"], dtype="<f4").reshape(len(c["positions"]), -1)
            logits = np_forward(p, hp, c["token_ids"])[c["positions"]]
            d = float(np.max(np.abs(logits - ref)))
            print(f"verify smollm2 {c['name']}: numpy float64 vs transformers max |dlogit| = {d:.3g}")
            worst = max(worst, d)
    assert worst < 1e-3, worst
    if model_path is not None and (out / "tokenizer_smollm2.json").exists():
        verify_tokenizer(out / "tokenizer_smollm2.json", model_path)


def verify_tokenizer(fixture: Path, model_path: Path) -> None:
    """Every case again through a plain `tokenizers.Tokenizer` read back from the serialized
    reference tokenizer.json (what `--dump-tokenizer-json` writes), and a decode round trip."""
    import tempfile

    from tokenizers import Tokenizer

    doc = json.loads(fixture.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        dump_tokenizer_json(model_path, Path(tmp) / "tokenizer.json")
        tk = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
    dropped = {chr(b) for b in (4, 6, 19, 20, 22, 29)}
    for c in doc["cases"]:
        assert tk.encode(c["text"], add_special_tokens=c["add_special_tokens"]).ids == c["ids"], c
        expect = "".join(ch for ch in c["text"] if ch not in dropped)
        assert tk.decode(c["ids"], skip_special_tokens=False) == expect, c
    for c in doc["chat"]:
        assert tk.encode(c["rendered"], add_special_tokens=False).ids == c["ids"], c
    print(f"verify {fixture.name}: {len(doc['cases'])} cases and {len(doc['chat'])} chats agree")


# ------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", type=Path, default=Path("tests/golden"))
    ap.add_argument("--fixtures", type=Path, default=Path("tests/fixtures"))
    ap.add_argument("--only", choices=["smollm2", "tiny"], help="generate one group only")
    ap.add_argument(
        "--verify-only",
        action="store_true",
        help="only re-check the existing fixtures with the independent numpy forward pass",
    )
    ap.add_argument(
        "--dump-tokenizer-json",
        type=Path,
        metavar="PATH",
        help="write the reference SmolLM2 tokenizer as tokenizer.json to PATH and exit",
    )
    args = ap.parse_args()

    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.use_deterministic_algorithms(True)

    if args.dump_tokenizer_json:
        dump_tokenizer_json(args.model.resolve(), args.dump_tokenizer_json)
        return 0

    if not args.verify_only:
        args.out.mkdir(parents=True, exist_ok=True)
        args.fixtures.mkdir(parents=True, exist_ok=True)
        if args.only in (None, "tiny"):
            gen_tiny(args.fixtures, args.out)
        if args.only in (None, "smollm2"):
            gen_smollm2(args.model.resolve(), args.out)
    verify(args.out, args.fixtures, args.model.resolve() if args.model.exists() else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
