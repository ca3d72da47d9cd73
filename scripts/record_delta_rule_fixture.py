#!/usr/bin/env python3
"""Records transformers' own gated delta rule for fusebox's `gated_delta_rule` and its
backward to be checked against (crates/fusebox-conformance/tests/delta_rule_fixture.rs).

It imports `torch_chunk_gated_delta_rule` and `torch_recurrent_gated_delta_rule` from
transformers.models.qwen3_5.modeling_qwen3_5 (the functions Qwen3.5 runs without the
fla kernels) and runs them in float64 on small seeded inputs: B 1, T 70 (a full chunk
of 64 and a partial one), 1 key head shared by 2 value heads (GQA), Dk 8, Dv 6, an
initial state, use_qk_l2norm_in_kernel=False (q and k are given unit rows, as the
model's separate l2 norm makes them). Those functions cast their inputs to float32
internally; the module's `torch` is swapped for a view of torch whose `float32` is
float64 while they run, so the whole computation is float64. transformers multiplies q
by Dk^-0.5 inside; fusebox is called with scale = Dk^-0.5.

Recorded (all f32; inputs rounded to f32 first and the f64 run made on the rounded
values, so the reference is exact up to f64 rounding):
  q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv]; initial_state [B, Hv, Dk, Dv]
  r_out [B, T, Hv, Dv], r_state [B, Hv, Dk, Dv]: the loss is Σ out·r_out + Σ state·r_state
  out, state: the chunked form's outputs (the recurrent form is checked to agree)
  dq, dk, dv, dg, dbeta, d_initial_state: autograd gradients of the loss

File format (crates/fusebox-conformance/fixtures/delta_rule/qwen3_5.txt): `#` comments,
then one line per tensor: `name d0xd1x... hex`, the hex the little-endian f32 bytes.

Run from the repository root with the venv that has torch and transformers:
    /tmp/tvenv/bin/python scripts/record_delta_rule_fixture.py
"""

import struct
import types

import torch
import transformers
import transformers.models.qwen3_5.modeling_qwen3_5 as qwen3_5

OUT = "crates/fusebox-conformance/fixtures/delta_rule/qwen3_5.txt"
B, T, HK, HV, DK, DV = 1, 70, 1, 2, 8, 6


class _Float64Torch(types.ModuleType):
    """torch, except that `float32` names float64 (see the module docs)."""

    def __getattr__(self, name):
        return torch.float64 if name == "float32" else getattr(torch, name)


def f32_rounded(x):
    return x.to(torch.float32).to(torch.float64)


def inputs():
    gen = torch.Generator().manual_seed(35)
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)
    q, k = unit(rand(B, T, HK, DK)), unit(rand(B, T, HK, DK))
    v = rand(B, T, HV, DV)
    # g = −e^{A_log}·softplus(a + dt_bias), β = σ(b), as the model makes them.
    g = -torch.exp(rand(HV) * 0.5 - 1.0) * torch.nn.functional.softplus(rand(B, T, HV) + 0.5)
    beta = torch.sigmoid(rand(B, T, HV))
    state = rand(B, HV, DK, DV) * 0.5
    r_out, r_state = rand(B, T, HV, DV), rand(B, HV, DK, DV)
    return {n: f32_rounded(x) for n, x in dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=state,
                                               r_out=r_out, r_state=r_state).items()}


def run(fn, x, **kw):
    """(out, state, gradients) of `fn` in float64 with autograd."""
    leaves = {n: x[n].clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta", "initial_state")}
    real = qwen3_5.torch
    qwen3_5.torch = _Float64Torch("torch")
    try:
        out, state = fn(leaves["q"], leaves["k"], leaves["v"], g=leaves["g"], beta=leaves["beta"],
                        initial_state=leaves["initial_state"], output_final_state=True,
                        use_qk_l2norm_in_kernel=False, **kw)
    finally:
        qwen3_5.torch = real
    assert out.dtype == torch.float64 and state.dtype == torch.float64, (out.dtype, state.dtype)
    loss = (out * x["r_out"]).sum() + (state * x["r_state"]).sum()
    loss.backward()
    return out.detach(), state.detach(), {n: t.grad for n, t in leaves.items()}


def main():
    x = inputs()
    out, state, grads = run(qwen3_5.torch_chunk_gated_delta_rule, x, chunk_size=64)
    r_out, r_state, r_grads = run(qwen3_5.torch_recurrent_gated_delta_rule, x)
    worst = max((a - b).abs().max().item() for a, b in [(out, r_out), (state, r_state)]
                + [(grads[n], r_grads[n]) for n in grads])
    print(f"transformers {transformers.__version__}: chunked vs recurrent, worst |diff| {worst:.2e}")
    assert worst < 1e-10, "the chunked and recurrent forms disagree in float64"
    record = dict(x)
    record.update(out=out, state=state, dq=grads["q"], dk=grads["k"], dv=grads["v"], dg=grads["g"],
                  dbeta=grads["beta"], d_initial_state=grads["initial_state"])
    with open(OUT, "w") as f:
        f.write(f"# transformers {transformers.__version__} torch_chunk_gated_delta_rule in float64, "
                f"B {B} T {T} Hk {HK} Hv {HV} Dk {DK} Dv {DV}, scale Dk^-0.5.\n")
        f.write("# Recorded by scripts/record_delta_rule_fixture.py; do not edit.\n")
        for name, t in record.items():
            values = t.to(torch.float32).flatten().tolist()
            hexes = struct.pack(f"<{len(values)}f", *values).hex()
            f.write(f"{name} {'x'.join(str(d) for d in t.shape)} {hexes}\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
