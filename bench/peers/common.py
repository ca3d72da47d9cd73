"""Shared by the peer scripts: the same timing protocol and output as `fusebox bench`.

Median of repeated calls after one warm-up, repeated until 0.3 s and 3 calls; one JSON
object per case with --json, else a table. Names match `fusebox bench` so that
bench/compare.sh can join the two by name.
"""

import json
import os
import statistics
import sys
import time

MIN_TIME = 0.3
MIN_REPS = 3
MAX_REPS = 1000


def set_thread_env(threads):
    """Must run before numpy/torch are imported: BLAS pools read these at load.

    OpenMP workers sleep between parallel regions (OMP_WAIT_POLICY=PASSIVE, as our
    rayon pool does) unless the caller set a policy: with the default busy-waiting, a
    peer loses several-fold on a machine where anything else runs (its spinning workers
    take the CPUs from the ones still working), which would make every ratio meaningless. Set OMP_WAIT_POLICY=ACTIVE to measure the other way.
    """
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def threads_from_argv(default=None):
    """--threads N from argv before argparse runs (so it can set the env first)."""
    argv = sys.argv
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return default or os.cpu_count() or 1


def measure(fn, warmup=1):
    """Median and min seconds of one call of fn, and the number of timed calls."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < MAX_REPS and (len(times) < MIN_REPS or time.perf_counter() - start < MIN_TIME):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), len(times)


def rnd(v):
    if v is None or v == 0 or v != v:
        return v
    from math import floor, log10

    digits = 4 - int(floor(log10(abs(v)))) - 1
    return round(v, max(0, min(12, digits)))


def emit(rows, columns, as_json, header=None):
    if as_json:
        for r in rows:
            print(json.dumps(r), flush=True)
        return
    if header:
        print(header)

    def cell(r, k):
        v = r.get(k)
        if v is None:
            return "-"
        if isinstance(v, float):
            a = abs(v)
            return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 1 else f"{v:.3f}"
        return str(v)

    cells = [[cell(r, k) for _, k in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(columns)]
    fmt = lambda items: "  ".join(s.ljust(w) if i == 0 else s.rjust(w) for i, (s, w) in enumerate(zip(items, widths)))
    print(fmt([h for h, _ in columns]).rstrip())
    for c in cells:
        print(fmt(c).rstrip())


def skip(reason, as_json, names=()):
    """Print why a peer cannot run; exit 0 so a caller running several peers goes on."""
    if as_json:
        for n in names or ("peer",):
            print(json.dumps({"name": n, "skipped": reason}))
    else:
        print(f"skipped: {reason}")
    sys.exit(0)
