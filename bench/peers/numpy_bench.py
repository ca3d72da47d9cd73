#!/usr/bin/env python3
"""numpy peer of `fusebox bench matmul`: float32 np.matmul through numpy's BLAS
(OpenBLAS in the wheels), with the BLAS pool set to --threads before numpy loads.

    $PYTHON bench/peers/numpy_bench.py matmul --m 1024 --n 1024 --k 1024 [--json]

Exits 0 with "skipped: ..." when numpy is not installed.
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
    import numpy as np
except Exception as e:  # noqa: BLE001
    skip(f"numpy not importable with {sys.executable}: {e}", AS_JSON)


def blas_name():
    try:
        cfg = np.show_config(mode="dicts")
        return cfg["Build Dependencies"]["blas"]["name"]
    except Exception:  # noqa: BLE001 - older numpy
        return "BLAS"


PEER = f"numpy {np.__version__} ({blas_name()})"


def gflops_of(m, n, k):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    out = np.empty((m, n), dtype=np.float32)
    med, mn, reps = measure(lambda: np.matmul(a, b, out=out))
    return 2 * m * n * k / med / 1e9, med, mn, reps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    mm = sub.add_parser("matmul")
    mm.add_argument("--m", type=int, default=1024)
    mm.add_argument("--n", type=int, default=1024)
    mm.add_argument("--k", type=int, default=1024)
    mm.add_argument("--threads", type=int, default=THREADS)
    mm.add_argument("--json", action="store_true")
    a = p.parse_args()
    gflops, med, mn, reps = gflops_of(a.m, a.n, a.k)
    best = 2 * a.m * a.n * a.k / mn / 1e9  # peaks use the fastest call, as ours
    if (a.m, a.n, a.k) == (1024, 1024, 1024):
        peak = best
    else:
        _, _, mn_ref, _ = gflops_of(1024, 1024, 1024)
        peak = max(best, 2 * 1024**3 / mn_ref / 1e9)
    row = {"name": f"matmul/{a.m}x{a.n}x{a.k}", "peer": PEER, "m": a.m, "n": a.n, "k": a.k, "threads": THREADS,
           "ms": rnd(med * 1e3), "min_ms": rnd(mn * 1e3), "reps": reps, "gflops": rnd(gflops),
           "peak_sgemm_gflops": rnd(peak), "pct_of_peak": rnd(100 * gflops / peak)}
    emit([row], [("case", "name"), ("ms", "ms"), ("GFLOP/s", "gflops"), ("% of peak", "pct_of_peak"), ("peer", "peer")],
         a.json, f"# {PEER}, {THREADS} thread(s)")


if __name__ == "__main__":
    main()
