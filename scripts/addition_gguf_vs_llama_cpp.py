#!/usr/bin/env python3
"""A fine-tuned addition model, exported to GGUF, answered by llama.cpp and by fusebox.

For 12 random 3-digit additions (seed 7) asked as chat turns ("What is 123 + 456?"),
llama.cpp (llama-cpp-python's `create_chat_completion`, the GGUF's own chat template,
temperature 0) and `fusebox generate --chat --temperature 0` answer on the same file;
prints how many answers are equal and how many are right. Exits non-zero when any differ.

Usage, from the repository root, after a fine-tuning run (scripts/finetune_lora_demo.sh):
    target/release/fusebox export --model runs/addition-chat-lora --format gguf --dtype f16 --out lora-f16.gguf
    target/release/fusebox export --model runs/addition-chat-lora --format gguf --quant q8_0 --out lora-q8_0.gguf
    /tmp/venv-py/bin/python scripts/addition_gguf_vs_llama_cpp.py lora-f16.gguf lora-q8_0.gguf
`FUSEBOX` names the binary (default target/release/fusebox).
"""
import os
import random
import subprocess
import sys

from llama_cpp import Llama

FUSEBOX = os.environ.get("FUSEBOX", "target/release/fusebox")


def main():
    rng = random.Random(7)
    problems = [(rng.randint(100, 999), rng.randint(100, 999)) for _ in range(12)]
    differ = 0
    for path in sys.argv[1:]:
        llm = Llama(model_path=path, n_ctx=256, n_threads=2, verbose=False)
        same = right_fusebox = right_llama = 0
        for a, b in problems:
            q = f"What is {a} + {b}?"
            out = llm.create_chat_completion(messages=[{"role": "user", "content": q}], temperature=0, max_tokens=12)
            theirs = out["choices"][0]["message"]["content"].strip()
            ours = subprocess.run(
                [FUSEBOX, "generate", "--model", path, "--chat", "--prompt", q, "--temperature", "0",
                 "--max-tokens", "12", "--threads", "2"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()
            same += ours == theirs
            right_fusebox += ours == str(a + b)
            right_llama += theirs == str(a + b)
            if ours != theirs:
                print(f"  {q} fusebox {ours!r}, llama.cpp {theirs!r}")
        differ += len(problems) - same
        print(f"{path}: fusebox == llama.cpp on {same}/{len(problems)}; right: fusebox {right_fusebox}, "
              f"llama.cpp {right_llama}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
