#!/usr/bin/env python3
"""Reference token ids for SmolLM2's tokenizer, written to
crates/fusebox-models/tests/fixtures/smollm2_tokens.json.

The reference is Hugging Face `tokenizers` (Rust, via its Python wheel) built
from the GGUF's own vocabulary and merges, with SmolLM2's pre-tokenizer:
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False,
use_regex=True)] and the GGUF's control tokens (token_type 3) as special added
tokens. The GGUF metadata is read with the `gguf` package (llama.cpp's reader).

Setup (both are prebuilt wheels):
    python3 -m venv /tmp/tokref && /tmp/tokref/bin/pip install gguf tokenizers
Run from the repository root:
    /tmp/tokref/bin/python scripts/smollm2_token_fixture.py models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import json
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

OUT = "crates/fusebox-models/tests/fixtures/smollm2_tokens.json"

CASES = [
    "",
    "Hello, world!",
    "12345",
    "The year 2024 had 366 days; pi is 3.14159 and 1,000,000 is big.",
    "  leading spaces\tand\ttabs\n\nnew lines   \n\n\n",
    "trailing spaces   ",
    "I'm sure they'll say it's what we've done, you're right, I'd go. DON'T 'quote' 'S",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧 ❤️",
    "CJK: 你好，世界。日本語のテキスト、한국어 텍스트",
    "Accents: café naïve résumé Ærøskøbing Ångström façade",
    "Combining: e\u0301 and Devanagari नमस्ते and Arabic مرحبا",
    "Numbers elsewhere: ٣٤٥ Ⅻ ½ ²³ ①",
    "Unicode spaces: a\u00a0b\u3000c\u2028d\u2009e\u200bf\u0085g\u180eh",
    "fn main() {\n    println!(\"{}\", x + 1); // done\n}\n",
    "Control chars: \x00\x01\x7f and \r\n windows",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|im_end|><|im_start|>",
    "<|im_start|> not <|im_sta",
    "a" * 5 + " " * 10 + "b" + "!" * 7 + "\n" * 3 + "?",
    "email@example.com https://example.org/path?q=1&r=2#frag",
    # U+40000 starts with byte 0xF1, which has no token: both references drop it.
    "plane 4: \U00040000 x\x04y",
]


def main(path: str) -> None:
    reader = GGUFReader(path)
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    pre = field("tokenizer.ggml.pre")
    if pre != "smollm":
        sys.exit(f"expected tokenizer.ggml.pre = smollm, got {pre!r}")
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    )

    cases = []
    for text in CASES:
        ids = tok.encode(text, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        case = {"text": text, "ids": ids}
        if back != text:
            # Text with bytes the vocabulary lacks cannot come back; say so.
            case["decoded"] = back
        cases.append(case)
    fixture = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pre_tokenizer": pre,
        "reference": "Hugging Face tokenizers "
        + __import__("tokenizers").__version__
        + ": BPE from the GGUF vocab/merges, Sequence[Digits(individual), ByteLevel]",
        "parse_special": True,
        "add_bos": False,
        "cases": cases,
    }
    # One case per line keeps the fixture readable and its diffs small.
    head = json.dumps({k: v for k, v in fixture.items() if k != "cases"}, ensure_ascii=False, indent=1)
    lines = ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in cases)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(head[:-2] + ',\n "cases": [\n  ' + lines + "\n ]\n}\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf")
