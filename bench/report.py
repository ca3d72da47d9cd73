#!/usr/bin/env python3
"""Turns the JSON lines that bench/compare.sh collected into a markdown table.

Each input line is a `fusebox bench --json` or peer row plus "side" ("ours" or the
peer script's name). Per case and side the best (lowest) of the rounds' medians is
kept; the ratio is ours/peer in throughput (peer ms / our ms: above 1 = ours faster).

    python3 bench/report.py results.jsonl [machine line]
"""

import json
import sys


def fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    a = abs(v)
    return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 1 else f"{v:.{digits}f}"


def rate(r):
    if r.get("gbps") is not None and (r["name"].startswith("ops/") or "/decode/" in r["name"]):
        return f"{fmt(r['gbps'])} GB/s"
    if r.get("gflops") is not None:
        return f"{fmt(r['gflops'])} GFLOP/s"
    return "-"


def pct(r):
    for key, what in (("pct_of_peak", "sgemm"), ("pct_of_copy", "copy"), ("pct_of_read", "read")):
        if r.get(key) is not None:
            return f"{fmt(r[key])}% {what}"
    return "-"


def main():
    path = sys.argv[1]
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    best = {}  # (name, side) -> row with the lowest ms
    order = []
    memory = []
    skipped = {}
    for r in rows:
        if r.get("skipped"):
            skipped[r.get("side", "peer")] = r["skipped"]
            continue
        if r["name"].startswith("attention/memory/"):
            memory.append(r)
            continue
        key = (r["name"], r["side"])
        if r["name"] not in order:
            order.append(r["name"])
        old = best.get(key)
        if old is None or (r.get("ms") is not None and (old.get("ms") is None or r["ms"] < old["ms"])):
            best[key] = r
    sides = []
    for _, side in best:
        if side != "ours" and side not in sides:
            sides.append(side)
    if len(sys.argv) > 2:
        print(sys.argv[2])
        print()
    print("| case | ours ms | ours | ours % of peak | 2T/1T | peer | peer ms | peer | ours/peer |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for name in order:
        ours = best.get((name, "ours"), {})
        peers = [best[(name, s)] for s in sides if (name, s) in best] or [{}]
        for p in peers:
            if ours.get("error"):
                ours_ms, ours_rate = "not implemented" if "not yet implemented" in ours["error"] else "error", "-"
            else:
                ours_ms, ours_rate = fmt(ours.get("ms")), rate(ours) if ours else "-"
            peer = p.get("peer") or p.get("side") or "-"
            if p.get("sdpa_kernel"):
                peer += " [" + p["sdpa_kernel"].split(",")[0].replace("aten::", "") + "]"
            peer_ms = fmt(p.get("ms")) if p.get("ms") is not None else (p.get("skipped") or p.get("error") or "-")
            ratio = "-"
            if ours.get("ms") and p.get("ms"):
                ratio = f"{p['ms'] / ours['ms']:.2f}"
            speedup = fmt(ours.get("speedup")) if ours.get("speedup") is not None else "-"
            if ours.get("copy_speedup") is not None:
                speedup += f" (copy {fmt(ours['copy_speedup'])})"
            print(f"| {name} | {ours_ms} | {ours_rate} | {pct(ours)} | {speedup} | {peer} | {peer_ms} | "
                  f"{rate(p) if p else '-'} | {ratio} |")
    for side, reason in skipped.items():
        print()
        print(f"{side} skipped: {reason}")
    if memory:
        print()
        print("Peak memory of attention fwd+bwd (ours; added = peak RSS during the call − RSS with inputs):")
        print()
        print("| case | T | ms | inputs MB | added peak MB | growth per doubling |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in memory:
            if r.get("error"):
                print(f"| {r['name']} | {r.get('seq')} | error | - | - | - |")
                continue
            print(f"| {r['name']} | {r['seq']} | {fmt(r.get('ms'))} | {fmt(r.get('inputs_mb'))} | "
                  f"{fmt(r.get('peak_added_mb'))} | {fmt(r.get('growth_per_doubling'))} |")


if __name__ == "__main__":
    main()
