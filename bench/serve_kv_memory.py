#!/usr/bin/env python3
"""Resident memory of an OpenAI-compatible server with many slots of a long context,
at rest and under a load of short conversations: what backing the KV caches as they
fill (rather than reserving `--parallel` x `--ctx-size` positions at start) saves.

For each --server-cmd in turn ({port} substituted; never two at once) it starts the
server, reads its resident memory (VmRSS of /proc/PID/status) once it answers, drives
--clients concurrent streaming clients (--requests-per-client each, greedy, --max-tokens
each; the prompt mix of bench/serve_load.py), then reads VmRSS again, the peak (VmHWM)
and, where the server exports it, `fusebox_kv_cache_bytes` from GET /metrics. Linux
only (/proc). Dependencies: the Python standard library (and bench/serve_load.py).

    cargo build --release -p fusebox-cli
    python3 bench/serve_kv_memory.py --server-cmd \
        "target/release/fusebox serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
         --parallel 8 --ctx-size 8192 --threads 2 --port {port}"
"""

import argparse
import asyncio
import os
import shlex
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_load  # noqa: E402  (the server driver and prompt mix)


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise SystemExit(f"/proc/{pid}/status has no {field}")


def kv_cache_bytes(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("fusebox_kv_cache_bytes "):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


async def measure(i, cmd, args):
    port = serve_load.free_port()
    words = shlex.split(cmd.replace("{port}", str(port)))
    server = await serve_load.start(f"server {i}", words, port, None, f"/tmp/serve_kv_memory.{i}.log", 300)
    try:
        pid = server.proc.pid
        idle = status_kib(pid, "VmRSS")
        idle_kv = kv_cache_bytes(port)
        load = await serve_load.run_load(server, args.clients, args.requests_per_client, args.max_tokens, 7)
        return {
            "cmd": cmd,
            "idle_mib": idle / 1024,
            "idle_kv_mib": None if idle_kv is None else idle_kv / 2**20,
            "after_mib": status_kib(pid, "VmRSS") / 1024,
            "peak_mib": status_kib(pid, "VmHWM") / 1024,
            "kv_mib": (lambda b: None if b is None else b / 2**20)(kv_cache_bytes(port)),
            "tok_s": load["tok_s"],
        }
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-cmd", action="append", required=True, help="a server command line ({port} substituted)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    rows = [asyncio.run(measure(i, cmd, args)) for i, cmd in enumerate(args.server_cmd)]
    f = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    print("| server | RSS at rest (MiB) | KV at rest (MiB) | RSS after load | peak RSS | KV after load (MiB) | tok/s |")
    print("|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        print(f"| {i} | {f(r['idle_mib'])} | {f(r['idle_kv_mib'])} | {f(r['after_mib'])} | {f(r['peak_mib'])} "
              f"| {f(r['kv_mib'])} | {f(r['tok_s'])} |")
    for i, r in enumerate(rows):
        print(f"{i}: {r['cmd']}")


if __name__ == "__main__":
    main()
