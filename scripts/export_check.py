#!/usr/bin/env python3
"""The reference side of fusebox's export tests: load an export with the reference
library and print what it computes, for the Rust tests in
crates/fusebox-models/tests/export_reference.rs to compare with fusebox's own.

  hf DIR --ids 1,2,3 [--ids …] --out LOGITS.f32
      transformers.AutoModelForCausalLM (f64, eager attention: the exact side) loads DIR; the logits of
      every position of each id list are written to LOGITS.f32 (little-endian f32, the
      lists one after another, [T, vocab] each). Prints {"vocab": V}. Also checks that
      AutoTokenizer loads DIR.
  tok DIR --texts FILE.json
      AutoTokenizer(DIR) ids of each text of the JSON list in FILE (no special tokens
      added): {"ids": [[…], …]}.
  gguf FILE --ids 1,2,3 [--ids …] --steps N
      llama-cpp-python loads FILE (CPU, n_ctx 512); for each id list, N greedy steps:
      {"runs": [{"tokens": [...], "gaps": [...]}, …]}, gap = top-1 minus top-2 logit at
      each step; and {"tokenized": [...]} of the texts given with --text (parse_special,
      no BOS).

Run with the venv that has torch, transformers and llama_cpp, e.g.
  /tmp/venv-py/bin/python scripts/export_check.py hf /tmp/smol-hf --ids 1,2,3 --out /tmp/l.f32
"""

import argparse
import json
import sys


def ids_list(s):
    return [int(x) for x in s.split(",") if x]


def run_hf(args):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    # Eager experts too: the grouped expert kernels take f32/bf16 only.
    model = AutoModelForCausalLM.from_pretrained(
        args.path, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager"
    )
    model.eval()
    AutoTokenizer.from_pretrained(args.path)
    out = []
    with torch.no_grad():
        for ids in args.ids:
            logits = model(torch.tensor([ids], dtype=torch.long)).logits[0].float().numpy()
            out.append(logits.astype("<f4"))
    np.concatenate([o.reshape(-1) for o in out]).tofile(args.out)
    print(json.dumps({"vocab": int(out[0].shape[-1])}))


def run_tok(args):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.path)
    with open(args.texts, encoding="utf-8") as f:
        texts = json.load(f)
    print(json.dumps({"ids": [tok.encode(t, add_special_tokens=False) for t in texts]}))


def run_gguf(args):
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=args.path, n_ctx=512, n_threads=2, logits_all=True, verbose=False, seed=0)
    runs = []
    for ids in args.ids:
        llm.reset()
        llm.eval(ids)
        tokens, gaps = [], []
        for _ in range(args.steps):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top = np.argsort(-logits)[:2]
            tokens.append(int(top[0]))
            gaps.append(float(logits[top[0]] - logits[top[1]]))
            llm.eval([int(top[0])])
        runs.append({"tokens": tokens, "gaps": gaps})
    tokenized = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in (args.text or [])]
    print(json.dumps({"runs": runs, "tokenized": tokenized}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["hf", "tok", "gguf"])
    p.add_argument("path")
    p.add_argument("--ids", type=ids_list, action="append", default=[])
    p.add_argument("--text", action="append")
    p.add_argument("--texts")
    p.add_argument("--out")
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    {"hf": run_hf, "tok": run_tok, "gguf": run_gguf}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
