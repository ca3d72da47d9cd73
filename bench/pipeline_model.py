#!/usr/bin/env python3
"""Pipeline-parallel inference model for fusebox (docs/distributed.md).

    python3 bench/pipeline_model.py --compute-ms 3.05 --batch-ms 17.4 --d-model 576 --vocab 49152 --hop-us 40

A model of one process's decode compute — C ms for one token of one stream, C_S ms for a
batched step of S streams (both measured on one machine: `fusebox bench generate` and
bench/serve_load.py with S clients) — split into N stages of 1/N of it each, one per
machine. A token crosses N links: N-1 hops carry the hidden state (x and norm1(x):
2 * d_model values in the wire's dtype), the last returns the logits (vocab f32) to rank 0.
A hop of b bytes over a link of bandwidth B with per-message latency a costs a + b/B (on
one host, --hop-us: the measured per-hop time, size included).

    single stream:   t_token = C + (N-1) * hop(2*d*w) + hop(4*V)
    S streams as N micro-batches of m = ceil(S/N) rows, all in flight (fusebox serve),
    every stage busy:
                     tokens/s = m / (C_m/N + max(hop(m*2*d*w), hop(m*4*V)))

with C_m interpolated linearly between C (m = 1) and C_S (m = S): a batched step reads
each weight once for all its rows, so its cost grows slowly with the rows.
"""
import argparse
import math

LINKS = {  # name: (bytes/s, per-message latency s); None: the measured hop on one host
    "shared memory (measured, one host)": None,
    "10 GbE (TCP)": (10e9 / 8, 30e-6),
    "100 GbE (TCP)": (100e9 / 8, 20e-6),
    "InfiniBand HDR (RDMA)": (200e9 / 8, 2e-6),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compute-ms", type=float, required=True, help="one process's ms per decode token, one stream")
    p.add_argument("--batch-ms", type=float, required=True,
                   help="one process's ms per batched decode step of --streams streams")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--wire-bytes", type=int, default=4, help="4 (f32) or 2 (f16/bf16)")
    p.add_argument("--hop-us", type=float, default=None, help="measured per-hop time on one host (µs)")
    p.add_argument("--ranks", default="2,4,8")
    a = p.parse_args()
    c1, cs, s = a.compute_ms / 1e3, a.batch_ms / 1e3, a.streams
    hidden = 2 * a.d_model * a.wire_bytes
    logits = 4 * a.vocab
    print(f"one process: {a.compute_ms:g} ms per token of one stream, {a.batch_ms:g} ms per step of {s} streams "
          f"({s / cs:.0f} tokens/s); a hop carries {hidden} B of hidden state per row, {logits} B of logits\n")
    print(f"| link | ranks | single stream ms/token | vs one process | {s} streams tokens/s | vs one process |")
    print("|---|---|---|---|---|---|")
    for name, link in LINKS.items():
        if link is None:
            if a.hop_us is None:
                continue
            hop = lambda b: a.hop_us * 1e-6  # noqa: E731  measured, size included
        else:
            bw, lat = link
            hop = lambda b, bw=bw, lat=lat: lat + b / bw  # noqa: E731
        for n in [int(x) for x in a.ranks.split(",")]:
            t = c1 + (n - 1) * hop(hidden) + hop(logits)
            m = math.ceil(s / n)
            c_m = c1 + (cs - c1) * (m - 1) / max(s - 1, 1)
            tick = c_m / n + max(hop(m * hidden), hop(m * logits))
            print(f"| {name} | {n} | {t * 1e3:.2f} | {c1 / t:.2f}× | {m / tick:.0f} | {m / tick / (s / cs):.2f}× |")


if __name__ == "__main__":
    main()
