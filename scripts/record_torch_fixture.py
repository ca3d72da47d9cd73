#!/usr/bin/env python3
"""Records the PyTorch reference that crates/fusebox-models/tests/torch_fixture.rs
checks fusebox's hand-written forward and backward against (as llm.c checks
train_gpt2.c against a state recorded from PyTorch).

For each style (GPT-2 and Llama) it builds, in plain PyTorch and independently of
fusebox, the same tiny decoder-only transformer as fusebox-models' `model.rs`:

  GPT-2 style: learned positions, pre-LayerNorm blocks with biases, tanh-GELU MLP,
               tied output head (logits = norm_f(x)·wteᵀ).
  Llama style: no positions, pre-RMSNorm blocks without biases, rope (HalfSplit:
               pairs (i, i + hd/2), angle p·θ^(−2i/hd)) on q and k, grouped-query
               attention (query head h reads kv head h // (Hq/Hkv)), SwiGLU MLP
               down(silu(gate(x))·up(x)), untied output head.
  Both:        causal softmax attention with scale 1/sqrt(head_dim), residual
               x + attn(norm1(x)), x + mlp(norm2(x)), a final norm, and the loss =
               mean cross-entropy over the positions whose target is not ignored.

Weights are seeded random values (larger than the training init, so every path
carries signal), stored as f32. The forward and backward (autograd) run in f64 on
those f32 values, so the recorded loss and gradients are the exact answer up to
f64 rounding, and the test's tolerance measures fusebox's f32 error alone. The
script also reruns everything in f32 and prints how far PyTorch's own f32 result
lies from the f64 one, as a yardstick for the test's tolerance, and checks that
the written-out maths agrees with PyTorch's own F.layer_norm, F.rms_norm,
F.gelu(approximate="tanh") and F.scaled_dot_product_attention(enable_gqa=True).

Each file crates/fusebox-models/tests/fixtures/torch_<style>.safetensors holds:
  <name>         every parameter, named and shaped as fusebox's `param_specs`, F32
  ids, targets   U32 [B, T]; one target equals `ignore_index`
  ignore_index   U32 [1]
  loss           F32 [1]
  grad.<name>    d loss / d <name>, F32
and the model config in the header's __metadata__ (the keys of ModelConfig::to_json).

Setup: any Python with torch and numpy (the safetensors file is written by hand
below, no extra package). Run from the repository root:
    python3 scripts/record_torch_fixture.py
"""

import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

OUT = "crates/fusebox-models/tests/fixtures/torch_{style}.safetensors"
BATCH, SEQ = 2, 12
IGNORE = 4_000_000_000  # any u32 outside the vocabulary


def config(style):
    llama = style == "llama"
    return {
        "style": style,
        "vocab_size": 32,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2 if llama else 4,
        "d_model": 32,
        "d_ff": 64,
        "max_seq": 16,
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tied_embeddings": not llama,
    }


def param_specs(cfg):
    """(name, shape, kind) in fusebox's order; kind picks the random values."""
    gpt2 = cfg["style"] == "gpt2"
    d, f, v = cfg["d_model"], cfg["d_ff"], cfg["vocab_size"]
    hd = d // cfg["n_heads"]
    q_out, kv_out = cfg["n_heads"] * hd, cfg["n_kv_heads"] * hd
    specs = [("wte", [v, d], "embed")]
    if gpt2:
        specs.append(("wpe", [cfg["max_seq"], d], "embed"))
    for layer in range(cfg["n_layers"]):
        p = f"h.{layer}."
        bias = lambda name, n: [(p + name, [n], "bias")] if gpt2 else []
        specs += [(p + "norm1.weight", [d], "norm")] + bias("norm1.bias", d)
        specs += [(p + "attn.q.weight", [q_out, d], "matrix")] + bias("attn.q.bias", q_out)
        specs += [(p + "attn.k.weight", [kv_out, d], "matrix")] + bias("attn.k.bias", kv_out)
        specs += [(p + "attn.v.weight", [kv_out, d], "matrix")] + bias("attn.v.bias", kv_out)
        specs += [(p + "attn.o.weight", [d, q_out], "matrix")] + bias("attn.o.bias", d)
        specs += [(p + "norm2.weight", [d], "norm")] + bias("norm2.bias", d)
        if gpt2:
            specs += [(p + "mlp.fc.weight", [f, d], "matrix")] + bias("mlp.fc.bias", f)
            specs += [(p + "mlp.proj.weight", [d, f], "matrix")] + bias("mlp.proj.bias", d)
        else:
            specs += [(p + "mlp.gate.weight", [f, d], "matrix"), (p + "mlp.up.weight", [f, d], "matrix")]
            specs += [(p + "mlp.down.weight", [d, f], "matrix")]
    specs += [("norm_f.weight", [d], "norm")]
    if gpt2:
        specs += [("norm_f.bias", [d], "bias")]
    if not cfg["tied_embeddings"]:
        specs += [("lm_head.weight", [v, d], "matrix")]
    return specs


def random_params(cfg, gen):
    """Seeded f32 values: matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 0.5),
    norm weights 1 + N(0, 0.1), biases N(0, 0.1)."""
    out = {}
    for name, shape, kind in param_specs(cfg):
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if kind == "matrix":
            value = noise / math.sqrt(shape[1])
        elif kind == "embed":
            value = noise * 0.5
        elif kind == "norm":
            value = 1.0 + 0.1 * noise
        else:
            value = 0.1 * noise
        out[name] = value.contiguous()
    return out


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def rope(x, theta):
    """HalfSplit rotary embedding of x [B, H, T, hd] at positions 0..T."""
    t, hd = x.shape[-2], x.shape[-1]
    half = hd // 2
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / hd)
    angle = torch.arange(t, dtype=torch.float64)[:, None] * freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def attention(q, k, v, n_heads, n_kv_heads):
    """Causal softmax(q·kᵀ/sqrt(hd))·v written out, with kv heads repeated per group."""
    group = n_heads // n_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    t, hd = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def forward_loss(cfg, p, ids, targets, library=False):
    """The loss, from the maths written out above, or (library=True) from PyTorch's
    own F.layer_norm / F.rms_norm / F.gelu / F.scaled_dot_product_attention."""
    gpt2 = cfg["style"] == "gpt2"
    eps, hq, hkv = cfg["norm_eps"], cfg["n_heads"], cfg["n_kv_heads"]
    bsz, t = ids.shape
    d = cfg["d_model"]
    hd = d // hq

    def norm(x, name):
        if gpt2 and library:
            return F.layer_norm(x, (d,), p[name + ".weight"], p[name + ".bias"], eps)
        if gpt2:
            return layer_norm(x, p[name + ".weight"], p[name + ".bias"], eps)
        if library:
            return F.rms_norm(x, (d,), p[name + ".weight"], eps)
        return rms_norm(x, p[name + ".weight"], eps)

    def attend(q, k, v):
        if library:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return attention(q, k, v, hq, hkv)

    def gelu(x):
        return F.gelu(x, approximate="tanh") if library else gelu_tanh(x)

    def linear(x, name):
        y = x @ p[name + ".weight"].T
        return y + p[name + ".bias"] if gpt2 else y

    def heads(x, n):
        return x.view(bsz, t, n, hd).transpose(1, 2)

    x = p["wte"][ids]
    if gpt2:
        x = x + p["wpe"][:t]
    for layer in range(cfg["n_layers"]):
        pre = f"h.{layer}."
        h = norm(x, pre + "norm1")
        q = heads(linear(h, pre + "attn.q"), hq)
        k = heads(linear(h, pre + "attn.k"), hkv)
        v = heads(linear(h, pre + "attn.v"), hkv)
        if not gpt2:
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        a = attend(q, k, v).transpose(1, 2).reshape(bsz, t, d)
        x = x + linear(a, pre + "attn.o")
        h = norm(x, pre + "norm2")
        if gpt2:
            m = linear(gelu(linear(h, pre + "mlp.fc")), pre + "mlp.proj")
        else:
            gate = h @ p[pre + "mlp.gate.weight"].T
            up = h @ p[pre + "mlp.up.weight"].T
            m = (F.silu(gate) * up) @ p[pre + "mlp.down.weight"].T
        x = x + m
    x = norm(x, "norm_f")
    head = p["wte"] if cfg["tied_embeddings"] else p["lm_head.weight"]
    logits = x @ head.T
    return F.cross_entropy(logits.reshape(bsz * t, -1), targets.reshape(-1), ignore_index=IGNORE)


def loss_and_grads(cfg, params, ids, targets, dtype, library=False):
    p = {k: v.detach().to(dtype).clone().requires_grad_(True) for k, v in params.items()}
    loss = forward_loss(cfg, p, ids, targets, library)
    loss.backward()
    return loss.detach(), {k: v.grad.detach() for k, v in p.items()}


def write_safetensors(path, tensors, metadata):
    """The safetensors layout: u64 header length, JSON header, raw little-endian data."""
    names = {np.float32: "F32", np.uint32: "U32"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr)
        data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[arr.dtype.type], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % 8)  # data section 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)


def record(style, seed):
    cfg = config(style)
    gen = torch.Generator().manual_seed(seed)
    params = random_params(cfg, gen)
    ids = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ), generator=gen)
    targets[0, 5] = IGNORE

    loss, grads = loss_and_grads(cfg, params, ids, targets, torch.float64)
    loss32, grads32 = loss_and_grads(cfg, params, ids, targets, torch.float32)
    # The written-out maths must agree with PyTorch's library ops (in f64, to rounding).
    loss_lib, grads_lib = loss_and_grads(cfg, params, ids, targets, torch.float64, library=True)
    assert abs(loss_lib.item() - loss.item()) < 1e-12, (loss_lib.item(), loss.item())
    for k, g in grads.items():
        assert torch.allclose(grads_lib[k], g, rtol=1e-9, atol=1e-12), k
    worst = max(
        ((grads32[k].double() - g).abs() / (1e-5 + 1e-3 * g.abs())).max().item() for k, g in grads.items()
    )
    print(
        f"{style}: loss {loss.item():.8f} (f32 torch {loss32.item():.8f}, rel {abs(loss32.item() / loss.item() - 1):.1e}); "
        f"f32 torch gradients use {worst:.3f} of the test tolerance (abs 1e-5 + rel 1e-3); "
        f"|grad| max {max(g.abs().max().item() for g in grads.values()):.3e}, "
        f"median {torch.cat([g.flatten() for g in grads.values()]).abs().median().item():.3e}"
    )

    tensors = [(name, params[name].numpy()) for name, _, _ in param_specs(cfg)]
    tensors += [
        ("ids", ids.numpy().astype(np.uint32)),
        ("targets", targets.numpy().astype(np.uint32)),
        ("ignore_index", np.array([IGNORE], dtype=np.uint32)),
        ("loss", np.array([loss.item()], dtype=np.float32)),
    ]
    tensors += [("grad." + name, grads[name].to(torch.float32).numpy()) for name, _, _ in param_specs(cfg)]
    metadata = {k: json.dumps(v) for k, v in cfg.items()}
    metadata["style"] = style
    metadata["seed"] = str(seed)
    metadata["source"] = f"scripts/record_torch_fixture.py, torch {torch.__version__}, autograd in f64"
    path = OUT.format(style=style)
    write_safetensors(path, tensors, metadata)
    print(f"wrote {path}")


def main():
    if len(sys.argv) > 1:
        sys.exit(__doc__)
    record("gpt2", seed=1234)
    record("llama", seed=5678)


if __name__ == "__main__":
    main()
