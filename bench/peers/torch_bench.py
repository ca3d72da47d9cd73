#!/usr/bin/env python3
"""PyTorch peer of `fusebox bench`: the same cases, the same FLOP/byte counts, names and
timing protocol (see common.py), f32, torch.set_num_threads(--threads).

    $PYTHON bench/peers/torch_bench.py attention --batch 1 --heads 8 --seq 1024 --head-dim 64 --pass fwd
    $PYTHON bench/peers/torch_bench.py matmul --m 1024 --n 1024 --k 1024
    $PYTHON bench/peers/torch_bench.py ops [--only rms_norm,softmax]

Attention rows say which SDPA kernel ran (read from the profiler's op names, e.g.
aten::_scaled_dot_product_flash_attention_for_cpu). Exits 0 with "skipped: ..." when
torch is not installed.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, measure, rnd, set_thread_env, skip, threads_from_argv  # noqa: E402

THREADS = threads_from_argv()
set_thread_env(THREADS)
AS_JSON = "--json" in sys.argv

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means "no peer here"
    skip(f"torch not importable with {sys.executable}: {e}", AS_JSON)

torch.set_num_threads(THREADS)
torch.manual_seed(0)
PEER = f"torch {torch.__version__}"
if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
    PEER += f" (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')})"


def sgemm_peak(n=1024):
    a, b = torch.randn(n, n), torch.randn(n, n)
    with torch.inference_mode():
        _, best, _ = measure(lambda: torch.mm(a, b))
    return 2 * n**3 / best / 1e9  # the fastest call, as ours


def sdpa_kernels(fn):
    """Names of the SDPA ops that ran inside fn (forward and backward)."""
    from torch.profiler import ProfilerActivity, profile

    # The profiler logs start/stop lines (and a GPU probe) on fd 2: hide them.
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    names = []
    for e in prof.key_averages():
        n = e.key
        if "scaled_dot_product" in n and n not in names and n != "aten::scaled_dot_product_attention":
            names.append(n)
    return names


def attention(a):
    hkv = a.kv_heads or a.heads
    b, hq, t, d = a.batch, a.heads, a.seq, a.head_dim
    gqa = hkv != hq
    tq = a.q_len if a.pass_ == "decode" else t
    q = torch.randn(b, hq, tq, d)
    k = torch.randn(b, hkv, t, d)
    v = torch.randn(b, hkv, t, d)
    dout = torch.randn(b, hq, tq, d)
    kw = {"enable_gqa": True} if gqa else {}
    row = {"name": f"attention/{a.pass_}/b{b}_hq{hq}_hkv{hkv}_t{t}_d{d}", "peer": PEER, "pass": a.pass_,
           "batch": b, "heads": hq, "kv_heads": hkv, "seq": t, "head_dim": d, "threads": THREADS}
    if a.pass_ == "fwd":

        def fn():
            with torch.inference_mode():
                F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)

    elif a.pass_ == "fwdbwd":
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))

        def fn():
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, **kw)
            torch.autograd.grad(out, (qg, kg, vg), dout)

    else:  # decode: q_len new queries at the end of the cache, causal among themselves
        mask = None
        if tq > 1:
            i = torch.arange(tq)[:, None]
            j = torch.arange(t)[None, :]
            mask = j <= i + (t - tq)

        def fn():
            with torch.inference_mode():
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)

    row["sdpa_kernel"] = ",".join(sdpa_kernels(fn)) or "unknown"
    med, mn, reps = measure(fn)
    row.update(ms=rnd(med * 1e3), min_ms=rnd(mn * 1e3), reps=reps)
    if a.pass_ == "decode":
        kv_bytes = 2 * b * hkv * t * d * 4
        row.update(q_len=tq, kv_bytes=kv_bytes, gbps=rnd(kv_bytes / med / 1e9),
                   gflops=rnd(4 * b * hq * tq * t * d / med / 1e9))
        cols = [("case", "name"), ("ms", "ms"), ("GB/s (K+V)", "gbps"), ("GFLOP/s", "gflops"), ("kernel", "sdpa_kernel")]
    else:
        flops = 2 * b * hq * t * t * d * (3.5 if a.pass_ == "fwdbwd" else 1.0)
        gflops = flops / med / 1e9
        peak = sgemm_peak()
        row.update(gflops=rnd(gflops), peak_sgemm_gflops=rnd(peak), pct_of_peak=rnd(100 * gflops / peak))
        cols = [("case", "name"), ("ms", "ms"), ("GFLOP/s", "gflops"), ("sgemm peak", "peak_sgemm_gflops"),
                ("% of peak", "pct_of_peak"), ("kernel", "sdpa_kernel")]
    emit([row], cols, a.json, f"# {PEER}, {THREADS} thread(s)")


def matmul(a):
    x, y = torch.randn(a.m, a.k), torch.randn(a.k, a.n)
    with torch.inference_mode():
        med, mn, reps = measure(lambda: torch.mm(x, y))
    gflops = 2 * a.m * a.n * a.k / med / 1e9
    best = 2 * a.m * a.n * a.k / mn / 1e9
    peak = best if (a.m, a.n, a.k) == (1024, 1024, 1024) else max(best, sgemm_peak())
    blas = "MKL" if torch.backends.mkl.is_available() else "BLAS"
    row = {"name": f"matmul/{a.m}x{a.n}x{a.k}", "peer": f"{PEER} ({blas})", "m": a.m, "n": a.n, "k": a.k,
           "threads": THREADS, "ms": rnd(med * 1e3), "min_ms": rnd(mn * 1e3), "reps": reps, "gflops": rnd(gflops),
           "peak_sgemm_gflops": rnd(peak), "pct_of_peak": rnd(100 * gflops / peak)}
    emit([row], [("case", "name"), ("ms", "ms"), ("GFLOP/s", "gflops"), ("% of peak", "pct_of_peak"), ("peer", "peer")],
         a.json, f"# {PEER}, {THREADS} thread(s)")


# Same sizes and byte counts as crates/fusebox-cli/src/bench/ops.rs.
ROWS, DIM, CE_ROWS, VOCAB = 1024, 4096, 128, 32000
PARAMS = ROWS * DIM
EPS = 1e-5


def op_cases():
    n = ROWS * DIM
    nd = f"[{ROWS}, {DIM}]"
    ce = f"[{CE_ROWS}, {VOCAB}]"
    r = lambda scale=1.0: (torch.rand(ROWS, DIM) * 2 - 1) * scale

    def add():
        a, b = r(), r()
        return lambda: a + b

    def rms_norm():
        x, w = r(), torch.rand(DIM)
        return lambda: F.rms_norm(x, (DIM,), w, EPS)

    def rms_norm_backward():
        x, w, dy = r().requires_grad_(True), torch.rand(DIM).requires_grad_(True), r()
        y = F.rms_norm(x, (DIM,), w, EPS)
        return lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True)

    def add_rms_norm():
        a, b, w = r(), r(), torch.rand(DIM)

        def f():
            s = a + b
            return s, F.rms_norm(s, (DIM,), w, EPS)

        return f

    def silu_mul():
        g, u = r(4.0), r()
        return lambda: F.silu(g) * u

    def silu_mul_backward():
        g, u, dy = r(4.0).requires_grad_(True), r().requires_grad_(True), r()
        y = F.silu(g) * u
        return lambda: torch.autograd.grad(y, (g, u), dy, retain_graph=True)

    def softmax():
        x = r(8.0)
        return lambda: torch.softmax(x, -1)

    def softmax_backward():
        x, dy = r(8.0).requires_grad_(True), r()
        y = torch.softmax(x, -1)
        return lambda: torch.autograd.grad(y, x, dy, retain_graph=True)

    def logits():
        return (torch.rand(CE_ROWS, VOCAB) * 2 - 1) * 8.0, torch.randint(0, VOCAB, (CE_ROWS,))

    def cross_entropy():
        # Ours returns loss and d_logits from one fused pass; torch: forward + backward.
        z, t = logits()
        z.requires_grad_(True)
        return lambda: torch.autograd.grad(F.cross_entropy(z, t), z)

    def cross_entropy_backward():
        z, t = logits()
        z.requires_grad_(True)
        loss = F.cross_entropy(z, t)
        return lambda: torch.autograd.grad(loss, z, retain_graph=True)

    def adamw_update():
        p = torch.nn.Parameter((torch.rand(PARAMS) * 2 - 1))
        p.grad = (torch.rand(PARAMS) * 2 - 1) * 1e-2
        try:
            opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
            opt.step()
        except Exception:  # noqa: BLE001 - older torch: no fused CPU AdamW
            opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=True)
        return opt.step

    return [
        ("add", nd, 12 * n, add),
        ("rms_norm", nd, 8 * n, rms_norm),
        ("rms_norm_backward", nd, 12 * n, rms_norm_backward),
        ("add_rms_norm", nd, 16 * n, add_rms_norm),
        ("silu_mul", nd, 12 * n, silu_mul),
        ("silu_mul_backward", nd, 20 * n, silu_mul_backward),
        ("softmax", nd, 8 * n, softmax),
        ("softmax_backward", nd, 12 * n, softmax_backward),
        ("cross_entropy", ce, 8 * CE_ROWS * VOCAB + 4 * CE_ROWS, cross_entropy),
        ("cross_entropy_backward", ce, 8 * CE_ROWS * VOCAB + 4 * CE_ROWS, cross_entropy_backward),
        ("adamw_update", f"[{PARAMS}]", 28 * PARAMS, adamw_update),
    ]


def ops(a):
    only = set(filter(None, (a.only or "").split(",")))
    rows = []
    for name, shape, nbytes, make in op_cases():
        if only and name not in only:
            continue
        row = {"name": f"ops/{name}", "peer": PEER, "op": name, "shape": shape, "bytes": nbytes, "threads": THREADS}
        try:
            med, mn, reps = measure(make())
            row.update(ms=rnd(med * 1e3), min_ms=rnd(mn * 1e3), reps=reps, gbps=rnd(nbytes / med / 1e9))
        except Exception as e:  # noqa: BLE001 - report and go on
            row["error"] = f"{type(e).__name__}: {e}"
        if a.json:
            emit([row], [], True)
        rows.append(row)
    if not a.json:
        emit(rows, [("op", "op"), ("shape", "shape"), ("ms", "ms"), ("GB/s", "gbps"), ("error", "error")], False,
             f"# {PEER}, {THREADS} thread(s)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    at = sub.add_parser("attention")
    at.add_argument("--batch", type=int, default=1)
    at.add_argument("--heads", type=int, default=8)
    at.add_argument("--kv-heads", type=int, default=None)
    at.add_argument("--seq", type=int, default=1024)
    at.add_argument("--head-dim", type=int, default=64)
    at.add_argument("--pass", dest="pass_", choices=["fwd", "fwdbwd", "decode"], default="fwd")
    at.add_argument("--q-len", type=int, default=1)
    mm = sub.add_parser("matmul")
    mm.add_argument("--m", type=int, default=1024)
    mm.add_argument("--n", type=int, default=1024)
    mm.add_argument("--k", type=int, default=1024)
    op = sub.add_parser("ops")
    op.add_argument("--only", default="")
    for s in (at, mm, op):
        s.add_argument("--threads", type=int, default=THREADS)
        s.add_argument("--json", action="store_true")
    a = p.parse_args()
    {"attention": attention, "matmul": matmul, "ops": ops}[a.what](a)


if __name__ == "__main__":
    main()
