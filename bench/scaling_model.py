#!/usr/bin/env python3
"""Data-parallel scaling model for fusebox training (docs/distributed.md).

    python3 bench/scaling_model.py --compute-s 9.5 --tokens-per-rank 1024

A step on N ranks = compute (forward + backward + AdamW of one rank's micro-batch,
measured: `fusebox bench train --preset gpt2-124m --threads T`) + the gradient all-reduce
that the backward does not hide. Ring all-reduce of S bytes in k buckets over links of
bandwidth B with per-message latency a:

    T_ar(N) = 2(N-1)/N * S / B  +  k * 2(N-1) * a

Two cases: no overlap (T = compute + T_ar), and overlap as fusebox does it: the head's
gradient (for a tied head, the dense part of the token table) is final first and reduces
while the whole backward (about 2/3 of compute) runs, then each block's from the last
down; the first block's bucket is final only when the backward ends, and the embedding
lookups' rows (tokens_per_rank rows of width D per rank) are all-gathered after it:
T = compute + max(0, T_ar(rest) - 2/3 compute) + T_ar(first block) + T_gather(rows),
T_gather = (N-1) * tokens_per_rank * (D+1) * 4 / B + (N-1) * a; once the ranks hold as
many rows as the table has (N * tokens_per_rank >= V) the rows are summed into a table and
all-reduced instead: T_ar(V * D).
Efficiency = compute / T; tokens/s = N * tokens_per_rank / T.
"""
import argparse


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compute-s", type=float, required=True, help="measured seconds per step of one rank")
    p.add_argument("--tokens-per-rank", type=int, required=True, help="batch × seq of one rank")
    p.add_argument("--params", type=int, default=124_439_808, help="parameters (gpt2-124m, tied head)")
    p.add_argument("--last-params", type=int, default=7_087_872, help="parameters of the first block (the last bucket)")
    p.add_argument("--width", type=int, default=768, help="embedding width D (the rows exchanged)")
    p.add_argument("--vocab", type=int, default=50257, help="token table rows V")
    p.add_argument("--bucket-mib", type=float, default=4.0, help="gradient bucket size")
    p.add_argument("--latency-us", type=float, default=20.0, help="per-message latency (TCP ~20 µs, RDMA ~2 µs)")
    p.add_argument("--ranks", default="2,4,8,16,32,64")
    p.add_argument("--gbits", default="10,25,100")
    a = p.parse_args()
    size = a.params * 4
    buckets = max(1, round(size / (a.bucket_mib * 2**20)))
    bwd = 2.0 / 3.0 * a.compute_s
    print(f"gradients {size / 1e6:.1f} MB in {buckets} buckets; compute {a.compute_s:.3f} s/step/rank "
          f"({a.tokens_per_rank} tokens); latency {a.latency_us:g} µs per message\n")
    print("| link | ranks | all-reduce s | step s (no overlap) | efficiency | step s (overlap) | efficiency | tokens/s (overlap) |")
    print("|---|---|---|---|---|---|---|---|")
    for g in [float(x) for x in a.gbits.split(",")]:
        bw = g * 1e9 / 8
        for n in [int(x) for x in a.ranks.split(",")]:
            t_ar = 2 * (n - 1) / n * size / bw + buckets * 2 * (n - 1) * a.latency_us * 1e-6
            t_no = a.compute_s + t_ar
            last = a.last_params * 4
            rest_frac = (size - last) / size
            t_last = 2 * (n - 1) / n * last / bw + 2 * (n - 1) * a.latency_us * 1e-6
            if n * a.tokens_per_rank < a.vocab:
                t_rows = (n - 1) * a.tokens_per_rank * (a.width + 1) * 4 / bw + (n - 1) * a.latency_us * 1e-6
            else:
                t_rows = 2 * (n - 1) / n * a.vocab * a.width * 4 / bw + 2 * (n - 1) * a.latency_us * 1e-6
            t_ov = a.compute_s + max(0.0, t_ar * rest_frac - bwd) + t_last + t_rows
            print(f"| {g:g} Gb/s | {n} | {t_ar:.3f} | {t_no:.3f} | {a.compute_s / t_no:.0%} | {t_ov:.3f} | "
                  f"{a.compute_s / t_ov:.0%} | {n * a.tokens_per_rank / t_ov:.0f} |")


if __name__ == "__main__":
    main()
