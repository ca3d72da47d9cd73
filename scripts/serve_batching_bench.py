#!/usr/bin/env python3
"""Continuous batching of `fusebox serve`, measured on one server in one run.

    cargo build --release -p fusebox-cli
    python3 scripts/serve_batching_bench.py --fusebox target/release/fusebox \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2

Starts `fusebox serve --parallel 8 --threads N` on a free port and reports:

1. aggregate generated tokens/s with 1 client and with 8 concurrent clients (each
   `max_tokens` tokens of /v1/completions, sampled with a fixed seed so answers run
   long), and their ratio (issue 25's target: ≥ 3×);
2. median time to first token of a 64-token prompt (streamed chat) on the idle server
   and while 7 other streams run, and their ratio (target: ≤ 4×).

Standard library only. Prints one JSON object last.
"""
import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time


def post(port, path, body, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return c, c.getresponse()


def completion(port, prompt, max_tokens, seed):
    c, r = post(port, "/v1/completions",
                {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "seed": seed})
    v = json.loads(r.read())
    c.close()
    return v["usage"]["completion_tokens"]


def aggregate(port, clients, max_tokens):
    """Generated tokens per second of wall time with `clients` concurrent requests."""
    prompts = [f"Once upon a time, in a land far away, there lived a {w}" for w in
               ["king", "dragon", "farmer", "wizard", "baker", "sailor", "knight", "painter"]]
    counts = [0] * clients
    def run(i):
        counts[i] = completion(port, prompts[i % len(prompts)], max_tokens, 1000 + i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    return sum(counts) / wall, sum(counts), wall


def ttft(port, prompt):
    """Seconds from sending a streamed chat request to its first content chunk."""
    t = time.perf_counter()
    c, r = post(port, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "temperature": 0,
                 "stream": True})
    first = None
    for line in r:
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0].get("delta", {}).get("content"):
                first = time.perf_counter() - t
                break
    c.close()
    return first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fusebox", default="target/release/fusebox")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ttft-runs", type=int, default=5)
    args = ap.parse_args()
    server = subprocess.Popen(
        [args.fusebox, "serve", "--model", args.model, "--port", "0", "--parallel", "8",
         "--threads", str(args.threads)], stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in server.stderr:
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            sys.exit("fusebox serve did not start")
        threading.Thread(target=lambda: server.stderr.read(), daemon=True).start()
        completion(port, "Warm up", 4, 0)
        one, n1, w1 = aggregate(port, 1, args.max_tokens)
        eight, n8, w8 = aggregate(port, 8, args.max_tokens)
        print(f"1 client : {one:7.1f} generated tok/s ({n1} tokens in {w1:.1f} s)")
        print(f"8 clients: {eight:7.1f} generated tok/s ({n8} tokens in {w8:.1f} s) -> {eight / one:.2f}x (target >= 3x)")

        # A 64-token prompt: the chat template adds its own turns around it.
        prompt = " ".join(["apple"] * 40) + " — how many words did I write?"
        idle = [ttft(port, prompt) for _ in range(args.ttft_runs)]
        stop = threading.Event()
        def background(i):
            while not stop.is_set():
                completion(port, f"Write a long story number {i}.", 48, i)
        others = [threading.Thread(target=background, args=(i,), daemon=True) for i in range(7)]
        for th in others:
            th.start()
        time.sleep(2.0)
        loaded = []
        for _ in range(args.ttft_runs):
            loaded.append(ttft(port, prompt))
            time.sleep(0.2)
        stop.set()
        ti, tl = statistics.median(idle), statistics.median(loaded)
        print(f"TTFT idle  : {ti * 1000:7.1f} ms (median of {len(idle)})")
        print(f"TTFT 7 busy: {tl * 1000:7.1f} ms (median of {len(loaded)}) -> {tl / ti:.2f}x (target <= 4x)")
        for th in others:
            th.join(timeout=120)
        print(json.dumps({"tok_s_1": one, "tok_s_8": eight, "ratio_8_over_1": eight / one,
                          "ttft_idle_s": ti, "ttft_loaded_s": tl, "ttft_ratio": tl / ti,
                          "threads": args.threads}))
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
