#!/usr/bin/env python3
"""fusebox's chunked gated delta rule against transformers' own, in the same run, on 2
threads: B 1, 16 heads, Dk = Dv = 128, T 4096 (issue 39's shape), forward and
forward + backward.

transformers: `torch_chunk_gated_delta_rule` of models.qwen3_5 (what Qwen3.5 runs
without the fla kernels), float32, torch.set_num_threads(2), forward then autograd
backward of Σ out·dy. fusebox: the criterion bench crates/fusebox/benches/delta_rule.rs
(2-thread CpuBackend; same shape; inputs alike: unit q and k rows, g < 0, β in (0, 1)),
run by this script through `cargo bench`, its median times read from criterion's
output. The decode-step rows of that bench are printed as they come (GB/s of state).

Run from the repository root (the venv needs torch and transformers ≥ 5):
    /tmp/tvenv/bin/python scripts/bench_delta_rule_vs_torch.py [--repeats 3]
"""

import argparse
import re
import subprocess
import time

import torch
import transformers.models.qwen3_5.modeling_qwen3_5 as qwen3_5

B, T, H, D = 1, 4096, 16, 128


def torch_inputs():
    gen = torch.Generator().manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=gen)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)
    q, k = unit(rand(B, T, H, D)), unit(rand(B, T, H, D))
    v = rand(B, T, H, D)
    g = -0.15 + 0.1 * (torch.rand(B, T, H, generator=gen) * 2 - 1)
    beta = 0.5 + 0.4 * (torch.rand(B, T, H, generator=gen) * 2 - 1)
    dy = rand(B, T, H, D)
    return q, k, v, g, beta, dy


def time_torch(repeats):
    torch.set_num_threads(2)
    q, k, v, g, beta, dy = torch_inputs()
    fwd, fwdbwd = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.no_grad():
            qwen3_5.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, output_final_state=True)
        fwd.append(time.perf_counter() - start)
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        start = time.perf_counter()
        out, _ = qwen3_5.torch_chunk_gated_delta_rule(*leaves[:3], g=leaves[3], beta=leaves[4], output_final_state=True)
        (out * dy).sum().backward()
        fwdbwd.append(time.perf_counter() - start)
    return min(fwd), min(fwdbwd)


def time_fusebox():
    """Median seconds per bench name, from criterion's `time: [lo median hi]` lines."""
    cmd = ["cargo", "bench", "-p", "fusebox", "--bench", "delta_rule"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    units = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}
    times, name = {}, None
    for line in text.splitlines():
        if line.startswith("delta_rule/"):
            name = line.split()[0]
        # The first `time:`/`thrpt:` after a name; a `change:` block against an earlier
        # run repeats both labels with percentages.
        if "change:" in line:
            name = None
        m = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) ", line)
        if m and name and name not in times:
            times[name] = float(m.group(1)) * units[m.group(2)]
        if "thrpt" in line and name and "step" in name:
            print(f"fusebox {name}: {times[name] * 1e6:.1f} µs, {line.split('[')[1].split()[2]} GiB/s of state")
            name = None
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    fb = time_fusebox()
    t_fwd, t_fwdbwd = time_torch(args.repeats)
    f_fwd = fb[f"delta_rule/chunked_fwd/b{B}_h{H}_t{T}_d{D}_2threads"]
    f_fwdbwd = fb[f"delta_rule/chunked_fwdbwd/b{B}_h{H}_t{T}_d{D}_2threads"]
    print(f"B {B}, {H} heads, Dk = Dv = {D}, T {T}, 2 threads")
    print(f"forward:            transformers {t_fwd * 1e3:8.1f} ms   fusebox {f_fwd * 1e3:8.1f} ms   {t_fwd / f_fwd:5.2f}x")
    print(f"forward + backward: transformers {t_fwdbwd * 1e3:8.1f} ms   fusebox {f_fwdbwd * 1e3:8.1f} ms   "
          f"{t_fwdbwd / f_fwdbwd:5.2f}x")


if __name__ == "__main__":
    main()
