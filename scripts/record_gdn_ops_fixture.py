#!/usr/bin/env python3
"""Records transformers' small Gated DeltaNet ops in float64, with autograd gradients, as
the fixtures of the conformance suite's `gdn_ops` cases
(`crates/fusebox-conformance/src/cases/gdn_fixture.rs`).

From `transformers.models.qwen3_5.modeling_qwen3_5` it runs:

* `causal_conv1d_fn` (activation "silu"): the prompt form, zeros before t = 0 →
  `depthwise_conv1d_silu` and its backward (dx, dw, dbias);
* `causal_conv1d_update` (activation "silu") with a carried conv state, for a prompt
  continuation (L = 3) and a decode step (L = 1) → `depthwise_conv1d_silu_ctx` and its
  backward (d_ctx, dx, dw, dbias), and the state it leaves (the last K−1 inputs);
* `l2norm` (eps 1e-6, one row small enough that eps dominates) → `l2_norm` and its backward;
* `Qwen3_5RMSNormGated` (eps 1e-6) → `rms_norm_gated` and its backward (dx, dz, dweight).
  transformers computes this norm in float32 whatever the input dtype, so its values carry
  f32 rounding;
* the gate lines of `Qwen3_5GatedDeltaNet.forward` (`beta = b.sigmoid()`,
  `g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)`; the script
  checks that the source still reads so) with `a + dt_bias` reaching past softplus'
  threshold of 20 and far below 0 → `gdn_gates` and its backward.

Every gradient is for a random upstream gradient that is recorded too. Each file holds
lines `NAME DIMS VALUES`: DIMS comma-separated, VALUES space-separated float64 reprs.

Regenerate with:

    /tmp/tvenv/bin/python scripts/record_gdn_ops_fixture.py
"""

import inspect
import os

import torch
import torch.nn.functional as F
from transformers.models.qwen3_5 import modeling_qwen3_5 as q35

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "fusebox-conformance", "fixtures", "gdn_ops")

torch.manual_seed(35)
torch.set_default_dtype(torch.float64)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def write(name, entries, header):
    lines = [f"# {line}" for line in header] + [
        f"{key} {','.join(str(d) for d in t.shape)} {' '.join(repr(float(v)) for v in t.detach().flatten())}"
        for key, t in entries
    ]
    with open(os.path.join(OUT, name), "w") as f:
        f.write("\n".join(lines) + "\n")


def grads(out, dy, inputs):
    return torch.autograd.grad(out, inputs, dy)


def conv():
    b, c, l, k = 2, 6, 9, 4
    x, w, bias = leaf(torch.randn(b, c, l)), leaf(torch.randn(c, k) * 0.5), leaf(torch.randn(c) * 0.3)
    y = q35.causal_conv1d_fn(x, w, bias, activation="silu")
    dy = torch.randn_like(y)
    dx, dw, dbias = grads(y, dy, [x, w, bias])
    entries = [("x", x), ("w", w), ("bias", bias), ("y", y), ("dy", dy), ("dx", dx), ("dw", dw), ("dbias", dbias)]
    for tag, length in [("prompt", 3), ("step", 1)]:
        ctx = leaf(torch.randn(b, c, k - 1))
        xs = leaf(torch.randn(b, c, length))
        state = ctx.clone()  # causal_conv1d_update writes the new state into it
        ys = q35.causal_conv1d_update(xs, state, w, bias, activation="silu")
        dys = torch.randn_like(ys)
        d_ctx, dxs, dws, dbs = grads(ys, dys, [ctx, xs, w, bias])
        entries += [
            (f"{tag}.ctx", ctx),
            (f"{tag}.x", xs),
            (f"{tag}.y", ys),
            (f"{tag}.state", state),
            (f"{tag}.dy", dys),
            (f"{tag}.d_ctx", d_ctx),
            (f"{tag}.dx", dxs),
            (f"{tag}.dw", dws),
            (f"{tag}.dbias", dbs),
        ]
    write("conv.txt", entries, [
        "transformers' causal_conv1d_fn and causal_conv1d_update (activation silu), float64;",
        "x [B, C, L], w [C, K], bias [C]; prompt./step. = causal_conv1d_update with state ctx [B, C, K-1]",
        "(state = the conv state it leaves). Written by scripts/record_gdn_ops_fixture.py.",
    ])


def l2():
    x = torch.randn(2, 2, 4, 16)
    x[1, 1, 3] *= 1e-4  # Σx² ≈ 1e-7, below eps
    x = leaf(x)
    y = q35.l2norm(x, dim=-1, eps=1e-6)
    dy = torch.randn_like(y)
    (dx,) = grads(y, dy, [x])
    write("l2norm.txt", [("x", x), ("y", y), ("dy", dy), ("dx", dx)], [
        "transformers' l2norm(x, dim=-1, eps=1e-6), float64; x [B, T, H, D].",
        "Written by scripts/record_gdn_ops_fixture.py.",
    ])


def gated_norm():
    d = 16
    norm = q35.Qwen3_5RMSNormGated(d, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.3 * torch.randn(d))
    x, z = leaf(torch.randn(2, 2, 3, d)), leaf(torch.randn(2, 2, 3, d) * 3.0)
    y = norm(x, z)
    dy = torch.randn_like(y)
    dx, dz, dweight = grads(y, dy, [x, z, norm.weight])
    write("rms_norm_gated.txt", [
        ("x", x), ("z", z), ("weight", norm.weight), ("y", y), ("dy", dy), ("dx", dx), ("dz", dz), ("dweight", dweight)
    ], [
        "transformers' Qwen3_5RMSNormGated(16, eps=1e-6)(x, z) with float64 tensors (it computes in float32);",
        "x, z [B, T, H, D]. Written by scripts/record_gdn_ops_fixture.py.",
    ])


def gates():
    source = inspect.getsource(q35.Qwen3_5GatedDeltaNet.forward)
    for line in ["beta = b.sigmoid()", "g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)"]:
        assert line in source, f"Qwen3_5GatedDeltaNet.forward no longer reads `{line}`: update this script"
    h = 4
    a = torch.randn(2, 5, h) * 4.0
    a[0, 0] = torch.tensor([25.0, 19.5, -30.0, 21.0])  # past softplus' threshold of 20, and far below 0
    a, b = leaf(a), leaf(torch.randn(2, 5, h) * 3.0)
    a_log = leaf(torch.empty(h).uniform_(0.01, 16).log())
    dt_bias = leaf(1.0 + 0.5 * torch.randn(h))
    beta = b.sigmoid()
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    dg, dbeta = torch.randn_like(g), torch.randn_like(beta)
    da, db, da_log, ddt_bias = torch.autograd.grad([g, beta], [a, b, a_log, dt_bias], [dg, dbeta])
    write("gates.txt", [
        ("a", a), ("b", b), ("a_log", a_log), ("dt_bias", dt_bias), ("g", g), ("beta", beta), ("dg", dg),
        ("dbeta", dbeta), ("da", da), ("db", db), ("da_log", da_log), ("ddt_bias", ddt_bias),
    ], [
        "The gates of transformers' Qwen3_5GatedDeltaNet.forward, float64: beta = b.sigmoid(),",
        "g = -A_log.exp() * F.softplus(a + dt_bias); a, b [B, T, H]. Written by scripts/record_gdn_ops_fixture.py.",
    ])


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    conv()
    l2()
    gated_norm()
    gates()
    print("wrote", os.path.normpath(OUT))
