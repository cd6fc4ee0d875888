#!/usr/bin/env python3
"""Reference ids for kiln's non-SmolLM pre-tokenizers, on the SmolLM2 vocabulary.

kiln maps `tokenizer.ggml.pre` names to the pre-tokenizer of the original `tokenizer.json` of
each family. The default model only exercises `smollm`; this script checks the others by
encoding the same strings with Python `tokenizers` pipelines built by transformers' own classes,
over the SmolLM2 vocabulary and merges read from the GGUF (so no other model is needed):

- `qwen2`: transformers' `Qwen2Tokenizer` (NFC normalizer, Qwen2 split regex, ByteLevel);
- `llama-bpe`: transformers' GGUF conversion with its `llama-bpe` split regex, plus
  `ignore_merges=True` as in Meta Llama 3's tokenizer.json;
- `gpt2`: transformers' GGUF conversion without a split regex (plain GPT-2 ByteLevel).

The 17 CONTROL tokens of the GGUF are added as special tokens in every pipeline, as kiln does.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers tokenizers gguf numpy
    /tmp/venv/bin/python tests/tokenizer/gen_pretokenizer_cases.py models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import json
import pathlib
import sys

import gguf
import tokenizers
import transformers
from tokenizers import AddedToken
from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

TEXTS = [
    "Hello, world!",
    "I'M SURE THEY'LL SAY IT'S FINE, DON'T YOU?",
    "I'm sure they'll say it's fine",
    "1234567 and 3.14159 and 1,000,000",
    "x² + y³ = ½ and Ⅻ ٣٤٥",
    "   leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\n\r\nand  \n  mixed",
    "def add(a, b):\n    return a + b\n",
    "Café naïve e\u0301 (decomposed) ﬁ ｆｕｌｌ",
    "你好，世界！ 日本語 한국어",
    "🙂👍🏽 emoji 👨\u200d👩\u200d👧",
    "<|im_start|>user\nHi<|im_end|>\n",
    "!!!??? ... --- ___ /// \\\\",
    "https://example.com/path?query=1&x=y#frag",
    "naïveté's façade",
]


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    tokens = meta["tokenizer.ggml.tokens"]
    control = [t for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"]) if kind == 3]

    def gguf_pipeline(pre):
        td = {name: meta[f"tokenizer.{key}"] for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
              if f"tokenizer.{key}" in meta}
        td["pre_tokenizer_type"] = pre
        tok, _ = convert_gguf_tokenizer("llama", td)
        return tok

    qwen2 = Qwen2Tokenizer(vocab={t: i for i, t in enumerate(tokens)},
                           merges=[tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]])._tokenizer
    llama3 = gguf_pipeline("llama-bpe")
    llama3.model.ignore_merges = True
    gpt2 = gguf_pipeline("gpt2")

    pipelines = {"qwen2": qwen2, "llama-bpe": llama3, "gpt2": gpt2}
    cases = []
    for name, tok in pipelines.items():
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
        for text in TEXTS:
            cases.append({"pre": name, "text": text, "ids": tok.encode(text, add_special_tokens=False).ids})

    out = pathlib.Path(__file__).with_name("pretokenizer_cases.json")
    doc = {
        "source": f"Generated with tests/tokenizer/gen_pretokenizer_cases.py (transformers {transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}, gguf vocabulary of {pathlib.Path(path).name})",
        "cases": cases,
    }
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {out} ({len(cases)} cases)")


main()
