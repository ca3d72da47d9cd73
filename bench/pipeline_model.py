#!/usr/bin/env python3
"""Pipeline-parallel inference model for fusebox (docs/distributed.md).

    python3 bench/pipeline_model.py --compute-ms 7.3 --d-model 576 --vocab 49152

A model of C ms of compute per decode token (one process, measured: `fusebox bench
generate`) split into N stages of C/N each. A token crosses N links: N-1 hops carry the
hidden state (x and norm1(x): 2 * d_model values in the wire's dtype), the last returns the
logits (vocab f32) to rank 0. A hop of b bytes over a link of bandwidth B with per-message
latency a costs a + b/B.

    single stream:   t_token = C + (N-1) * (a + 2*d*w/B) + (a + 4*V/B)
    many streams, micro-batches of M rows in flight, every stage busy:
                     tokens/s = M / max(C_M/N + hop(M))      (the slowest stage and its send)

with C_M the compute of an M-row batched step: --batch-ms, measured (8 / the tokens/s of
one process serving 8 clients, bench/serve_load.py), or else M^0.3 * C (batched decode
reads each weight once for all rows; an assumption).
"""
import argparse

LINKS = {  # name: (bytes/s, per-message latency s)
    "shared memory (measured, one host)": None,
    "10 GbE (TCP)": (10e9 / 8, 30e-6),
    "100 GbE (TCP)": (100e9 / 8, 20e-6),
    "InfiniBand HDR (RDMA)": (200e9 / 8, 2e-6),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compute-ms", type=float, required=True, help="one process's ms per decode token")
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--wire-bytes", type=int, default=4, help="4 (f32) or 2 (f16/bf16)")
    p.add_argument("--hop-us", type=float, default=None, help="measured per-hop latency on one host (µs)")
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--batch-ms", type=float, default=None,
                   help="measured ms of one M-row batched decode step on one process (replaces M^0.3 * C)")
    a = p.parse_args()
    c = a.compute_ms / 1e3
    hidden = 2 * a.d_model * a.wire_bytes
    logits = 4 * a.vocab
    print(f"compute {a.compute_ms:g} ms/token on one process; hop {hidden} B hidden, {logits} B logits\n")
    print("| link | ranks | single stream ms/token | vs one process | 8 streams tokens/s (pipelined) |")
    print("|---|---|---|---|---|")
    for name, link in LINKS.items():
        if link is None:
            if a.hop_us is None:
                continue
            hop = lambda b: a.hop_us * 1e-6  # noqa: E731  measured, size included
        else:
            bw, lat = link
            hop = lambda b, bw=bw, lat=lat: lat + b / bw  # noqa: E731
        for n in [int(x) for x in a.ranks.split(",")]:
            t = c + (n - 1) * hop(hidden) + hop(logits)
            m = a.micro_batch
            c_m = a.batch_ms / 1e3 if a.batch_ms is not None else m**0.3 * c
            stage = c_m / n + max(hop(m * hidden), hop(m * logits) if n > 1 else 0)
            print(f"| {name} | {n} | {t * 1e3:.2f} | {c / t:.2f}× | {m / stage:.0f} |")


if __name__ == "__main__":
    main()
