#!/usr/bin/env python3
"""Time to first token of a request whose long prefix was sent before, against the first
request with that prefix: what `fusebox serve`'s prefix cache (`--cache-ram`) saves.

Each round builds a system prompt of about --prefix-tokens tokens (as the server counts
them, chat template included; a round number at its start keeps rounds from sharing
anything), then sends, one after another, greedy streamed chat requests:

- first:  the system prompt and question A (nothing cached: a full prefill);
- second: the same system prompt and question B (the prefix comes from the cache);

(with --between, a short unrelated request in between: under `--parallel 1` it takes
the only slot, so that the second request's prefix comes from the prefix store rather
than from the slot's previous sequence) and records each one's time to first token (request sent -> first content chunk) and its
`usage.prompt_tokens_details.cached_tokens`. It prints every round and the median ratio
first / second. With --server-cmd it starts the server itself ({port} substituted) and
stops it at the end.

Dependencies: the Python standard library only.

    cargo build --release -p fusebox-cli
    python3 bench/prefix_cache_ttft.py --server-cmd \
        "target/release/fusebox serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
         --ctx-size 2048 --threads 2 --port {port}"
    python3 bench/prefix_cache_ttft.py --url http://127.0.0.1:8080   # a server already running
"""

import argparse
import http.client
import json
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse

WORDS = (
    "the river carries silt from the mountains down to a wide delta where farmers plant rice "
    "in the spring and harvest it before the autumn floods arrive each year"
).split()


def post(url, path, body, stream):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"{path}: HTTP {resp.status}: {resp.read()[:300]!r}")
    if not stream:
        return json.loads(resp.read()), None
    first, usage = None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for ch in chunk.get("choices", []):
            if ch.get("delta", {}).get("content") and first is None:
                first = time.perf_counter() - start
        if chunk.get("usage"):
            usage = chunk["usage"]
    conn.close()
    return usage, first


def prompt_tokens(url, system):
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}], "max_tokens": 1}
    v, _ = post(url, "/v1/chat/completions", body, False)
    return v["usage"]["prompt_tokens"]


def system_prompt(url, round_no, target):
    """A system prompt of about `target` tokens, starting with the round number."""
    words = max(8, target * 3 // 4)
    for _ in range(6):
        text = f"Round {round_no}. " + " ".join(WORDS[i % len(WORDS)] for i in range(words))
        n = prompt_tokens(url, text)
        if abs(n - target) <= 16:
            break
        words = max(8, int(words * target / n))
    return text, n


def ttft(url, system, question, max_tokens):
    body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage, first = post(url, "/v1/chat/completions", body, True)
    return first, usage["prompt_tokens"], usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a server already running")
    ap.add_argument("--server-cmd", help="a server command line, {port} substituted")
    ap.add_argument("--prefix-tokens", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--between", action="store_true", help="a short unrelated request between the two")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    proc = None
    url = args.url
    if args.server_cmd:
        port = free_port()
        proc = subprocess.Popen(shlex.split(args.server_cmd.format(port=port)), stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/health")
                break
            except OSError:
                time.sleep(0.2)
    if not url:
        raise SystemExit("give --url or --server-cmd")
    try:
        rows = []
        for r in range(args.rounds):
            system, n = system_prompt(url, 1000 + r, args.prefix_tokens)
            # prompt_tokens' probe already sent this prefix: a fresh round number again.
            system = system.replace(f"Round {1000 + r}.", f"Round {2000 + r}.", 1)
            a = ttft(url, system, "Summarise this in one sentence.", args.max_tokens)
            if args.between:
                ttft(url, f"Unrelated {r}.", "Hello.", 1)
            b = ttft(url, system, "What do the farmers plant?", args.max_tokens)
            rows.append({"prompt_tokens": [a[1], b[1]], "cached_tokens": [a[2], b[2]], "ttft_s": [a[0], b[0]]})
            print(
                f"round {r}: prompt {a[1]}/{b[1]} tokens, cached {a[2]}/{b[2]}, "
                f"TTFT first {a[0] * 1e3:.1f} ms, second {b[0] * 1e3:.1f} ms, ratio {a[0] / b[0]:.1f}x",
                flush=True,
            )
        ratio = statistics.median(row["ttft_s"][0] / row["ttft_s"][1] for row in rows)
        first = statistics.median(row["ttft_s"][0] for row in rows)
        second = statistics.median(row["ttft_s"][1] for row in rows)
        print(f"median TTFT: first {first * 1e3:.1f} ms, second {second * 1e3:.1f} ms; median ratio {ratio:.1f}x")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rounds": rows, "median_ratio": ratio}, f, indent=1)
    finally:
        if proc:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
