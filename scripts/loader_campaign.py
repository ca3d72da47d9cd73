#!/usr/bin/env python3
"""Mutation campaign against fusebox's model loaders.

Builds a tiny valid Llama locally (2 layers, width 8, the 266-token byte-level BPE
vocabulary of the tests) as a GGUF file and as a Hugging Face directory, writes
hundreds of malformed variants of each, and runs

    fusebox generate --model X --prompt hi --max-tokens 2

on every one under a timeout. Each variant is labelled either `refuse` (the file is
corrupt in a way a loader can see: it must exit with an error) or `any` (e.g. a flipped
byte inside tensor data, which no loader can tell from a real weight: it may load).
Counted: refused, accepted, panics (exit 101 or "panicked"), signals, hangs, and
corrupt variants that were accepted. Exit status 1 when any of the last four is
non-zero.

Usage (from the repository root, after `cargo build --release -p fusebox-cli`):

    python3 scripts/loader_campaign.py [--fusebox target/release/fusebox]
        [--out /tmp/fusebox-campaign] [--timeout 30] [--seed 1]
    python3 scripts/loader_campaign.py --fuzz-seeds crates/fusebox-models/fuzz/seeds

Only the standard library is needed; nothing is downloaded.
"""

import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys

DIM, HEADS, KV_HEADS, FF, LAYERS, CTX = 8, 2, 1, 16, 2, 32
HD = DIM // HEADS
ALIGN = 32

# ---------------------------------------------------------------- vocabulary


def byte_char(b):
    """GPT-2's byte-level character for byte b."""
    printable = lambda x: (ord("!") <= x <= ord("~")) or (0xA1 <= x <= 0xAC) or (0xAE <= x <= 0xFF)
    if printable(b):
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if not printable(x)))


MERGES = [("Ġ", "t"), ("l", "l"), ("e", "ll"), ("h", "ell"), ("hell", "o"), ("h", "e"), ("Ġt", "he")]
ADDED = [("<|im_start|>", True), ("<|im_end|>", True), ("<user>", False)]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}")


def vocab():
    tokens = [byte_char(b) for b in range(256)] + [a + b for a, b in MERGES]
    return tokens


VOCAB = len(vocab()) + len(ADDED)

# ---------------------------------------------------------------- tensors


def layout():
    """(gguf name, hf name, row-major shape) of every tensor."""
    out = [("token_embd.weight", "model.embed_tokens.weight", [VOCAB, DIM])]
    for l in range(LAYERS):
        for g, h, shape in [
            ("attn_norm", "input_layernorm", [DIM]),
            ("attn_q", "self_attn.q_proj", [HEADS * HD, DIM]),
            ("attn_k", "self_attn.k_proj", [KV_HEADS * HD, DIM]),
            ("attn_v", "self_attn.v_proj", [KV_HEADS * HD, DIM]),
            ("attn_output", "self_attn.o_proj", [DIM, HEADS * HD]),
            ("ffn_norm", "post_attention_layernorm", [DIM]),
            ("ffn_gate", "mlp.gate_proj", [FF, DIM]),
            ("ffn_up", "mlp.up_proj", [FF, DIM]),
            ("ffn_down", "mlp.down_proj", [DIM, FF]),
        ]:
            out.append((f"blk.{l}.{g}.weight", f"model.layers.{l}.{h}.weight", shape))
    out.append(("output_norm.weight", "model.norm.weight", [DIM]))
    return out


def values(n, salt):
    return [(((i * 37 + salt * 11) % 17) - 8.0) / 32.0 for i in range(n)]


def f32_bytes(vals):
    return struct.pack(f"<{len(vals)}f", *vals)


def prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# ---------------------------------------------------------------- GGUF writer

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gvalue(t, v):
    if t == T_STR:
        return gstr(v)
    if t == T_ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(gvalue(et, x) for x in items)
    fmt = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i", T_F32: "<f",
           T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}[t]
    return struct.pack(fmt, v)


class Gguf:
    """A GGUF in parts, so any part can be damaged before it is serialised."""

    def __init__(self):
        toks = vocab() + [t for t, _ in ADDED]
        types = [1] * len(vocab()) + [3 if s else 4 for _, s in ADDED]
        n = len(toks)
        self.magic, self.version, self.alignment = b"GGUF", 3, ALIGN
        self.kvs = [
            ["general.architecture", T_STR, "llama"],
            ["llama.block_count", T_U32, LAYERS],
            ["llama.context_length", T_U32, CTX],
            ["llama.embedding_length", T_U32, DIM],
            ["llama.feed_forward_length", T_U32, FF],
            ["llama.attention.head_count", T_U32, HEADS],
            ["llama.attention.head_count_kv", T_U32, KV_HEADS],
            ["llama.attention.layer_norm_rms_epsilon", T_F32, 1e-5],
            ["tokenizer.ggml.model", T_STR, "gpt2"],
            ["tokenizer.ggml.pre", T_STR, "smollm"],
            ["tokenizer.ggml.tokens", T_ARR, (T_STR, toks)],
            ["tokenizer.ggml.token_type", T_ARR, (T_I32, types)],
            ["tokenizer.ggml.merges", T_ARR, (T_STR, [f"{a} {b}" for a, b in MERGES])],
            ["tokenizer.ggml.bos_token_id", T_U32, n - 3],
            ["tokenizer.ggml.eos_token_id", T_U32, n - 2],
            ["tokenizer.chat_template", T_STR, CHATML],
        ]
        # [name, ggml dims (fastest first), type, data, offset or None (= laid out)]
        self.tensors = []
        for i, (name, _, shape) in enumerate(layout()):
            self.tensors.append([name, list(reversed(shape)), GGML_F32, f32_bytes(values(prod(shape), i)), None])
        self.tensor_count = None
        self.kv_count = None
        self.trailing = b""

    def set_kv(self, key, t, v):
        for kv in self.kvs:
            if kv[0] == key:
                kv[1], kv[2] = t, v
                return self
        self.kvs.append([key, t, v])
        return self

    def del_kv(self, key):
        self.kvs = [kv for kv in self.kvs if kv[0] != key]
        return self

    def to_bytes(self):
        out = bytearray(self.magic + struct.pack("<I", self.version))
        out += struct.pack("<QQ", len(self.tensors) if self.tensor_count is None else self.tensor_count,
                           len(self.kvs) if self.kv_count is None else self.kv_count)
        for key, t, v in self.kvs:
            out += gstr(key) + struct.pack("<I", t) + gvalue(t, v)
        offsets, at = [], 0
        for name, dims, ty, data, off in self.tensors:
            offsets.append(at if off is None else off)
            at = (at + len(data) + ALIGN - 1) // ALIGN * ALIGN
        for (name, dims, ty, data, _), off in zip(self.tensors, offsets):
            out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            out += struct.pack("<IQ", ty, off)
        start = (len(out) + self.alignment - 1) // self.alignment * self.alignment
        out += b"\0" * (start - len(out))
        at = 0
        for name, dims, ty, data, _ in self.tensors:
            out += b"\0" * (start + at - len(out))
            out += data
            at = (at + len(data) + ALIGN - 1) // ALIGN * ALIGN
        return bytes(out) + self.trailing


# ---------------------------------------------------------------- HF directory


def tokenizer_json():
    toks = vocab()
    return {
        "added_tokens": [{"id": len(toks) + i, "content": t, "special": s} for i, (t, s) in enumerate(ADDED)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(toks)},
                  "merges": [f"{a} {b}" for a, b in MERGES]},
    }


def hf_config():
    return {"model_type": "llama", "hidden_size": DIM, "intermediate_size": FF, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
            "max_position_embeddings": CTX, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
            "hidden_act": "silu", "rope_theta": 10000.0}


def hf_tensors():
    """name -> [dtype, shape, bytes]"""
    return {hf: ["F32", shape, f32_bytes(values(prod(shape), i))] for i, (_, hf, shape) in enumerate(layout())}


def safetensors_bytes(tensors, offsets=None, header_edit=None, trailing=b"", header_len=None):
    header, data, at = {}, bytearray(), 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        data += raw
        at += len(raw)
    if offsets:
        for name, off in offsets.items():
            header[name]["data_offsets"] = off
    if header_edit:
        header_edit(header)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    n = len(h) if header_len is None else header_len
    return struct.pack("<Q", n) + h + bytes(data) + trailing


class HfDir:
    def __init__(self):
        self.config = hf_config()
        self.tokenizer = tokenizer_json()
        self.tokenizer_config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHATML}
        self.shards = {"model.safetensors": safetensors_bytes(hf_tensors())}
        self.raw = {}  # file name -> bytes written as is (overrides the above)
        self.special = {}  # file name -> "fifo" | "zero" | "dir"
        self.index = None

    def write(self, d):
        os.makedirs(d)
        files = {"config.json": json.dumps(self.config).encode(),
                 "tokenizer.json": json.dumps(self.tokenizer).encode(),
                 "tokenizer_config.json": json.dumps(self.tokenizer_config).encode()}
        files.update(self.shards)
        if self.index is not None:
            files["model.safetensors.index.json"] = json.dumps(self.index).encode()
        files.update(self.raw)
        for name, data in files.items():
            if name in self.special:
                continue
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        for name, kind in self.special.items():
            p = os.path.join(d, name)
            if kind == "fifo":
                os.mkfifo(p)
            elif kind == "zero":
                os.symlink("/dev/zero", p)
            else:
                os.makedirs(p)


# ---------------------------------------------------------------- mutations


def gguf_mutations(rng):
    """(label, expectation, Gguf-or-bytes, extra args)"""
    out = []
    base = Gguf()
    good = base.to_bytes()

    def m(label, f, expect="refuse", args=()):
        g = Gguf()
        r = f(g)
        out.append((label, expect, r if isinstance(r, (bytes, bytearray)) else g, list(args)))

    # Truncations: every cut of the header region, then spread over the data.
    head_end = len(good) - sum(len(t[3]) for t in base.tensors) - 200
    cuts = sorted(set(list(range(0, min(head_end, 4000), 23)) + [rng.randrange(head_end, len(good)) for _ in range(40)]))
    for c in cuts[:150]:
        out.append((f"truncate@{c}", "refuse", good[:c], []))
    # Per tensor: type, offset, dims, removal.
    names = [t[0] for t in base.tensors]
    for i, name in enumerate(names):
        for ty in (GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, 99):
            m(f"type {name}={ty}", lambda g, i=i, ty=ty: g.tensors[i].__setitem__(2, ty))
        for delta in (ALIGN, -ALIGN, 1 << 40):
            def off(g, i=i, delta=delta):
                at = 0
                for t in g.tensors[:i]:
                    at = (at + len(t[3]) + ALIGN - 1) // ALIGN * ALIGN
                g.tensors[i][4] = max(0, at + delta) if delta != 1 << 40 else delta
                if g.tensors[i][4] == at:
                    g.tensors[i][4] = at + ALIGN
            m(f"offset {name}{delta:+}", off)
        m(f"dims {name} ne0*2", lambda g, i=i: g.tensors[i][1].__setitem__(0, g.tensors[i][1][0] * 2))
        m(f"dims {name} extra", lambda g, i=i: g.tensors[i][1].append(2))
        m(f"remove {name}", lambda g, i=i: g.tensors.pop(i))
    # Tensors nobody asked for.
    for extra in ("blk.2.attn_q.weight", "blk.0.attn_q.bias", "blk.00.attn_q.weight", "mystery"):
        m(f"extra tensor {extra}", lambda g, extra=extra: g.tensors.append([extra, [DIM], GGML_F32, f32_bytes([0.0] * DIM), None]))
    m("duplicate tensor name", lambda g: g.tensors.append(list(g.tensors[3])))
    # Metadata values.
    sizes = {
        "llama.block_count": [0, 1, 3, 1 << 31],
        "llama.context_length": [0],
        "llama.embedding_length": [0, 7, 16, 4],
        "llama.feed_forward_length": [0, 8, 32],
        "llama.attention.head_count": [0, 3, 7, 4],
        "llama.attention.head_count_kv": [0, 3, 2],
        "llama.attention.key_length": [0, 3, 8],
        "llama.attention.value_length": [2],
        "llama.rope.dimension_count": [64, 2],
        "llama.vocab_size": [VOCAB - 1, VOCAB + 1, 0],
    }
    for key, vals in sizes.items():
        for v in vals:
            m(f"{key}={v}", lambda g, key=key, v=v: g.set_kv(key, T_U32, v))
        m(f"{key} as string", lambda g, key=key: g.set_kv(key, T_STR, "8"))
        if key != "llama.attention.key_length" and key in [kv[0] for kv in base.kvs] and key != "llama.attention.head_count_kv":
            m(f"{key} removed", lambda g, key=key: g.del_kv(key))
    m("rms eps = 0", lambda g: g.set_kv("llama.attention.layer_norm_rms_epsilon", T_F32, 0.0))
    m("rms eps = nan", lambda g: g.set_kv("llama.attention.layer_norm_rms_epsilon", T_F32, float("nan")))
    m("rope base = -1", lambda g: g.set_kv("llama.rope.freq_base", T_F32, -1.0))
    m("architecture qwen2", lambda g: g.set_kv("general.architecture", T_STR, "qwen2"))
    m("architecture as int", lambda g: g.set_kv("general.architecture", T_U32, 1))
    m("rope scaling yarn", lambda g: g.set_kv("llama.rope.scaling.type", T_STR, "yarn"))
    m("tokenizer model llama", lambda g: g.set_kv("tokenizer.ggml.model", T_STR, "llama"))
    m("tokenizer pre unknown", lambda g: g.set_kv("tokenizer.ggml.pre", T_STR, "nope"))
    m("tokens one short", lambda g: g.set_kv("tokenizer.ggml.tokens", T_ARR, (T_STR, (vocab() + [t for t, _ in ADDED])[:-1])))
    m("tokens one more", lambda g: g.set_kv("tokenizer.ggml.tokens", T_ARR, (T_STR, vocab() + [t for t, _ in ADDED] + ["x"])))
    m("token types short", lambda g: g.set_kv("tokenizer.ggml.token_type", T_ARR, (T_I32, [1] * 10)))
    m("merge unknown token", lambda g: g.set_kv("tokenizer.ggml.merges", T_ARR, (T_STR, ["q zz"])))
    m("merge without space", lambda g: g.set_kv("tokenizer.ggml.merges", T_ARR, (T_STR, ["qzz"])))
    m("bos past vocab", lambda g: g.set_kv("tokenizer.ggml.bos_token_id", T_U32, VOCAB))
    m("eos past vocab", lambda g: g.set_kv("tokenizer.ggml.eos_token_id", T_U32, 1 << 31))
    m("duplicate key", lambda g: g.kvs.append(list(g.kvs[1])))
    for a in (3, 0, 48):
        m(f"alignment {a}", lambda g, a=a: g.set_kv("general.alignment", T_U32, a))
    for a in (64, 128, 256, 16, 8):
        # Claimed without the layout following it: refused unless it happens to agree.
        m(f"alignment {a} claimed", lambda g, a=a: g.set_kv("general.alignment", T_U32, a), expect="any")
    m("alignment as u64", lambda g: g.set_kv("general.alignment", T_U64, 32))
    m("version 1", lambda g: setattr(g, "version", 1))
    m("version 4", lambda g: setattr(g, "version", 4))
    m("big-endian version", lambda g: setattr(g, "version", 3 << 24))
    m("magic", lambda g: setattr(g, "magic", b"GGUG"))
    m("tensor count +1", lambda g: setattr(g, "tensor_count", len(g.tensors) + 1))
    m("tensor count -1", lambda g: setattr(g, "tensor_count", len(g.tensors) - 1))
    m("tensor count huge", lambda g: setattr(g, "tensor_count", 1 << 60))
    m("kv count +1", lambda g: setattr(g, "kv_count", len(g.kvs) + 1))
    m("kv count -1", lambda g: setattr(g, "kv_count", len(g.kvs) - 1))
    for n in (1, 31, 33, 100, 4096):
        m(f"trailing {n} bytes", lambda g, n=n: setattr(g, "trailing", b"\x07" * n), expect="refuse" if n > 31 else "any")
    m("chat template not chatml", lambda g: g.set_kv("tokenizer.chat_template", T_STR, "{{ bos_token }}"), expect="any")
    # A context far larger than memory holds.
    # (1e6 positions of this tiny model's cache are 64 MB: legitimate.)
    m("context 2^32-1, ctx 1e6", lambda g: g.set_kv("llama.context_length", T_U32, 0xFFFFFFFF), expect="any",
      args=["--ctx-size", "1000000"])
    m("context 2^32-1, ctx max", lambda g: g.set_kv("llama.context_length", T_U32, 0xFFFFFFFF), args=["--ctx-size", "4294967295"])
    # Seeded byte damage anywhere: header damage is usually refused, data damage cannot be seen.
    for k in range(200):
        b = bytearray(good)
        for _ in range(1 + rng.randrange(4)):
            at = rng.randrange(len(b))
            b[at] = rng.choice([b[at] ^ (1 << rng.randrange(8)), 0, 0xFF, rng.randrange(256)])
        out.append((f"flip#{k}", "any", bytes(b), []))
    return out


def hf_mutations(rng):
    out = []

    def m(label, f, expect="refuse", args=()):
        h = HfDir()
        f(h)
        out.append((label, expect, h, list(args)))

    required = ["model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "vocab_size", "max_position_embeddings"]
    for key in required:
        m(f"config -{key}", lambda h, key=key: h.config.pop(key))
        for v in (0, -1, "8", 1.5, None, [], 1 << 62):
            if key == "model_type" and v in ("8",):
                pass
            m(f"config {key}={v!r}", lambda h, key=key, v=v: h.config.__setitem__(key, v),
              expect="refuse" if not (key == "max_position_embeddings" and v == 1 << 62) else "any")
    for key, vals in {"num_hidden_layers": [1, 3], "hidden_size": [16, 4, 7], "intermediate_size": [8, 32],
                      "num_attention_heads": [3, 4, 7], "num_key_value_heads": [0, 2, 3], "head_dim": [0, 3, 8],
                      "vocab_size": [VOCAB - 1, VOCAB + 1]}.items():
        for v in vals:
            m(f"config {key}={v}", lambda h, key=key, v=v: h.config.__setitem__(key, v))
    for v in ("gelu", ["silu"], 1, {"x": 1}):
        m(f"hidden_act={v!r}", lambda h, v=v: h.config.__setitem__("hidden_act", v))
    for v in ("qwen2", 7, ["llama"]):
        m(f"model_type={v!r}", lambda h, v=v: h.config.__setitem__("model_type", v))
    for v in ({"rope_type": "longrope", "factor": 2.0}, {"factor": 2.0}, {"rope_type": "linear"}, {"rope_type": "linear", "factor": -1},
              {"rope_type": 3}, "linear"):
        m(f"rope_scaling={v!r}", lambda h, v=v: h.config.__setitem__("rope_scaling", v))
    for v in ("x", 0.0, -1.0):
        m(f"rms_norm_eps={v!r}", lambda h, v=v: h.config.__setitem__("rms_norm_eps", v))
    m("tie false without lm_head", lambda h: h.config.__setitem__("tie_word_embeddings", False))
    m("tie as string", lambda h: h.config.__setitem__("tie_word_embeddings", "yes"))
    m("attention_bias true", lambda h: h.config.__setitem__("attention_bias", True))
    # Files that are not files, or not parseable.
    for name in ("config.json", "tokenizer.json", "model.safetensors", "tokenizer_config.json"):
        for kind in ("fifo", "zero", "dir"):
            m(f"{name} as {kind}", lambda h, name=name, kind=kind: h.special.__setitem__(name, kind))
        for raw in (b"", b"{", b"\xff\xfe", b"[]", b"null"):
            m(f"{name} = {raw!r}", lambda h, name=name, raw=raw: h.raw.__setitem__(name, raw),
              expect="any" if name == "tokenizer_config.json" and raw == b"null" else "refuse")
    # tokenizer.json
    big = 18446744073709551615

    def tok(f):
        return lambda h: f(h.tokenizer)
    m("vocab id u64::MAX", tok(lambda t: t["model"]["vocab"].__setitem__("zzz", big)))
    m("vocab id -1", tok(lambda t: t["model"]["vocab"].__setitem__("zzz", -1)))
    m("vocab id gap", tok(lambda t: t["model"]["vocab"].__setitem__("zzz", 100000)))
    m("vocab duplicate id", tok(lambda t: t["model"]["vocab"].__setitem__("zzz", 5)))
    m("vocab entry removed", tok(lambda t: t["model"]["vocab"].pop("a")))
    m("vocab not object", tok(lambda t: t["model"].__setitem__("vocab", [])))
    m("added id u64::MAX", tok(lambda t: t["added_tokens"][0].__setitem__("id", big)))
    m("added duplicate id", tok(lambda t: t["added_tokens"][1].__setitem__("id", t["added_tokens"][0]["id"])))
    m("added id string", tok(lambda t: t["added_tokens"][1].__setitem__("id", "3")))
    m("added tokens object", tok(lambda t: t.__setitem__("added_tokens", {})))
    m("merge unknown", tok(lambda t: t["model"].__setitem__("merges", ["q zz"])))
    m("merge number", tok(lambda t: t["model"].__setitem__("merges", [3])))
    m("model type WordPiece", tok(lambda t: t["model"].__setitem__("type", "WordPiece")))
    m("normalizer", tok(lambda t: t.__setitem__("normalizer", {"type": "NFC"})))
    m("pre_tokenizer Metaspace", tok(lambda t: t.__setitem__("pre_tokenizer", {"type": "Metaspace"})))
    m("byte_fallback", tok(lambda t: t["model"].__setitem__("byte_fallback", True)))
    m("bos not in vocab", lambda h: h.tokenizer_config.__setitem__("bos_token", "<nope>"))
    m("chat_template list", lambda h: h.tokenizer_config.__setitem__("chat_template", [{"name": "x"}]), expect="any")
    # safetensors
    full = safetensors_bytes(hf_tensors())
    for c in sorted(set([0, 4, 8, 9, 20, 100] + [rng.randrange(8, len(full)) for _ in range(30)])):
        m(f"safetensors truncate@{c}", lambda h, c=c: h.shards.__setitem__("model.safetensors", full[:c]))
    for n in (0, 7, 1 << 40, 100_000_001, len(full)):
        m(f"header length {n}", lambda h, n=n: h.shards.__setitem__("model.safetensors", safetensors_bytes(hf_tensors(), header_len=n)))
    names = list(hf_tensors())

    def st(**kw):
        return lambda h: h.shards.__setitem__("model.safetensors", safetensors_bytes(hf_tensors(), **kw))
    for name in names[:12]:
        def overlap(hd, name=name):
            b, e = hd[name]["data_offsets"]
            shift = 4 if b == 0 else -b  # onto the first tensor, or 4 bytes into its own neighbour
            hd[name]["data_offsets"] = [b + shift, e + shift]
        m(f"overlap {name}", st(header_edit=overlap))
        m(f"dtype F16 {name}", st(header_edit=lambda hd, name=name: hd[name].__setitem__("dtype", "F16")))
        m(f"dtype I64 {name}", st(header_edit=lambda hd, name=name: hd[name].__setitem__("dtype", "I64")))
        m(f"shape {name}", st(header_edit=lambda hd, name=name: hd[name].__setitem__("shape", list(reversed(hd[name]["shape"])) + [1])))
        m(f"offsets past end {name}", st(header_edit=lambda hd, name=name: hd[name].__setitem__("data_offsets", [1 << 40, (1 << 40) + 4])))

        def drop(h, name=name):
            t = hf_tensors()
            t.pop(name)
            h.shards["model.safetensors"] = safetensors_bytes(t)
        m(f"remove {name}", drop)

        def rename(h, name=name):
            t = hf_tensors()
            t[name + "x"] = t.pop(name)
            h.shards["model.safetensors"] = safetensors_bytes(t)
        m(f"rename {name}", rename)
    for n in (1, 8, 1000):
        m(f"trailing {n} bytes", st(trailing=b"\0" * n))
    m("header not JSON", lambda h: h.shards.__setitem__("model.safetensors", struct.pack("<Q", 4) + b"nope"))
    m("header array", lambda h: h.shards.__setitem__("model.safetensors", struct.pack("<Q", 8) + b"[1,2,3] "))
    m("metadata not strings", st(header_edit=lambda hd: hd.__setitem__("__metadata__", {"a": 1})))

    def extra_layer(h):
        t = hf_tensors()
        t["model.layers.2.mlp.up_proj.weight"] = ["F32", [FF, DIM], f32_bytes([0.0] * FF * DIM)]
        h.shards["model.safetensors"] = safetensors_bytes(t)
    m("extra layer 2", extra_layer)

    def bias(h):
        t = hf_tensors()
        t["model.layers.0.self_attn.q_proj.bias"] = ["F32", [DIM], f32_bytes([0.0] * DIM)]
        h.shards["model.safetensors"] = safetensors_bytes(t)
    m("unexpected bias", bias)

    def two_shards(h, same_in_both=True, index=None):
        t = hf_tensors()
        first = dict(list(t.items())[:5])
        second = dict(list(t.items())[5 if not same_in_both else 4:])
        h.shards = {"a.safetensors": safetensors_bytes(first), "b.safetensors": safetensors_bytes(second)}
        if index == "wrong":
            h.index = {"weight_map": {n: ("b.safetensors" if i == 0 else ("a.safetensors" if n in first else "b.safetensors")) for i, n in enumerate(t)}}
        elif index == "missing":
            h.index = {"weight_map": {n: ("a.safetensors" if n in first else "b.safetensors") for n in list(t)[1:]}}
        elif index == "escape":
            h.index = {"weight_map": {n: "../a.safetensors" for n in t}}
    m("tensor in two shards", lambda h: two_shards(h))
    m("index places tensor in wrong shard", lambda h: two_shards(h, same_in_both=False, index="wrong"))
    m("index misses a tensor", lambda h: two_shards(h, same_in_both=False, index="missing"))
    m("index shard escapes the dir", lambda h: two_shards(h, same_in_both=False, index="escape"))
    m("index not JSON", lambda h: h.raw.__setitem__("model.safetensors.index.json", b"{"))
    m("index without weight_map", lambda h: setattr(h, "index", {}))
    # Seeded byte damage in the safetensors file.
    for k in range(40):
        b = bytearray(full)
        for _ in range(1 + rng.randrange(3)):
            at = rng.randrange(len(b))
            b[at] = rng.randrange(256)
        m(f"safetensors flip#{k}", lambda h, b=bytes(b): h.shards.__setitem__("model.safetensors", b), expect="any")
    return out


# ---------------------------------------------------------------- running


def run(fusebox, path, args, timeout):
    cmd = [fusebox, "generate", "--model", path, "--prompt", "hi", "--max-tokens", "2", "--threads", "1"] + args
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hang", ""
    err = p.stderr.decode(errors="replace")
    if p.returncode == 101 or "panicked" in err:
        return "panic", err
    if p.returncode < 0:
        return "signal", f"signal {-p.returncode}"
    return ("accepted" if p.returncode == 0 else "refused"), err


def write_fuzz_seeds(root):
    hf = os.path.join(root, "hf_dir")
    tk = os.path.join(root, "tokenizers")
    os.makedirs(hf, exist_ok=True)
    os.makedirs(tk, exist_ok=True)
    parts = [json.dumps(hf_config()).encode(), json.dumps(tokenizer_json()).encode(), safetensors_bytes(hf_tensors())]
    with open(os.path.join(hf, "tiny_llama"), "wb") as f:
        f.write(b"".join(struct.pack("<I", len(p)) for p in parts) + b"".join(parts))
    g = Gguf()
    g.tensors = []
    with open(os.path.join(tk, "gguf_vocab"), "wb") as f:
        f.write(b"\x00" + g.to_bytes())
    cfg = json.dumps({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": True})
    with open(os.path.join(tk, "tokenizer_json"), "wb") as f:
        f.write(b"\x01" + json.dumps(tokenizer_json()).encode() + b"\x00" + cfg.encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fusebox", default="target/release/fusebox")
    ap.add_argument("--out", default="/tmp/fusebox-campaign")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fuzz-seeds", metavar="DIR", help="write the fuzz seeds under DIR and exit")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    if a.fuzz_seeds:
        write_fuzz_seeds(a.fuzz_seeds)
        return 0
    rng = random.Random(a.seed)
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)

    # The unmutated models must load and run, or every refusal below means nothing.
    base_gguf = os.path.join(a.out, "base.gguf")
    with open(base_gguf, "wb") as f:
        f.write(Gguf().to_bytes())
    base_hf = os.path.join(a.out, "base-hf")
    HfDir().write(base_hf)
    for p in (base_gguf, base_hf):
        outcome, err = run(a.fusebox, p, [], a.timeout)
        if outcome != "accepted":
            print(f"the valid model {p} did not run ({outcome}):\n{err}", file=sys.stderr)
            return 2

    cases = []
    for i, (label, expect, g, args) in enumerate(gguf_mutations(rng)):
        path = os.path.join(a.out, f"g{i:04d}.gguf")
        with open(path, "wb") as f:
            f.write(g if isinstance(g, (bytes, bytearray)) else g.to_bytes())
        cases.append(("gguf", label, expect, path, args))
    for i, (label, expect, h, args) in enumerate(hf_mutations(rng)):
        path = os.path.join(a.out, f"h{i:04d}")
        h.write(path)
        cases.append(("hf", label, expect, path, args))

    counts = {}
    bad = []
    for kind, label, expect, path, args in cases:
        outcome, err = run(a.fusebox, path, args, a.timeout)
        c = counts.setdefault(kind, {"cases": 0, "refused": 0, "accepted": 0, "panic": 0, "signal": 0, "hang": 0,
                                     "corrupt accepted": 0})
        c["cases"] += 1
        c[outcome] += 1
        if outcome == "accepted" and expect == "refuse":
            c["corrupt accepted"] += 1
        if outcome in ("panic", "signal", "hang") or (outcome == "accepted" and expect == "refuse"):
            bad.append((kind, label, outcome, path, err.strip().splitlines()[-3:] if err else []))
        if a.verbose:
            print(f"{kind:4} {outcome:8} {expect:6} {label}: {err.strip().splitlines()[-1] if err.strip() else ''}")
    for kind, c in counts.items():
        print(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    for kind, label, outcome, path, tail in bad:
        print(f"BAD {kind} {outcome}: {label} ({path}) {' | '.join(tail)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
