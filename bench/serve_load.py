#!/usr/bin/env python3
"""Load benchmark of an OpenAI-compatible chat server: `fusebox serve` and, in the same
run, llama-cpp-python's server on the same GGUF as the peer.

For each server in turn (never both at once: they would share the cores) it drives N
concurrent streaming clients (N = 1, 4, 8, 16), each sending --requests-per-client
requests one after another from a fixed, seeded mix of prompts, all with temperature 0
and the same max_tokens, and reports:

- aggregate generated tokens/s: every client's tokens / wall time of the whole load;
- time to first token (TTFT), median and p99: request sent -> first content chunk;
- inter-token latency (ITL), median and p99: gaps between consecutive content chunks;

then the two acceptance figures of issue 25:

- scaling: aggregate tokens/s at 8 clients / at 1 client (target >= 3 for fusebox);
- TTFT under load: median TTFT of a 64-token prompt while 7 other streams run / its
  median on the idle server (target <= 4 for fusebox).

A "token" is one streamed chunk with non-empty `delta.content` (both servers send one
per generated token); the 64-token prompt is 64 prompt tokens as the server counts them
in `usage.prompt_tokens` (chat template included), found by a few non-streamed
max_tokens=1 calls. Each probe starts with its own number so that no server can answer
it from a prompt cache.

Dependencies: the Python standard library only (HTTP/1.1 and server-sent events over
asyncio streams). The peer needs llama-cpp-python with its server extra
(`pip install 'llama-cpp-python[server]'`) in --peer-python.

Usage (the lead's figures; a few minutes on 2 cores):

    cargo build --release -p fusebox-cli
    python3 bench/serve_load.py --peer llama-cpp --peer-python /tmp/venv-py/bin/python \
        --json bench/results/serve_load.json

    # against a server already running (no peer):
    python3 bench/serve_load.py --url http://127.0.0.1:8080
    # any server command ({port} is substituted), e.g. the peer on both sides:
    python3 bench/serve_load.py --server-cmd "python -m llama_cpp.server --model M --port {port}"

fusebox runs as `fusebox serve --model M --port P --threads T --parallel P` with P the
largest of --clients and 8 (the TTFT figure runs 8 streams);
the peer as `python -m llama_cpp.server --model M --n_threads T --n_threads_batch T
--interrupt_requests False` (it has no parallel slots: requests take turns on one
context; interrupt_requests=False stops it from ending a running stream whenever
another request arrives, its default).
"""

import argparse
import asyncio
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import time
from urllib.parse import urlsplit

TOPICS = [
    "the sea", "a lighthouse keeper", "volcanoes", "the history of bread", "honey bees",
    "a city at night", "the moon landing", "how bridges carry weight", "winter in the mountains",
    "a robot learning to paint", "the water cycle", "an old library", "trains", "coral reefs",
    "the first computers", "a desert caravan",
]
TEMPLATES = [
    "Write a short paragraph about {}.",
    "Tell me a story about {}.",
    "Explain {} to a ten-year-old.",
    "List five facts about {}, one sentence each.",
]
FILLER = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
          "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def prompt_mix(seed, n):
    rng = random.Random(seed)
    return [rng.choice(TEMPLATES).format(rng.choice(TOPICS)) for _ in range(n)]


def percentile(values, q):
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


class HttpError(Exception):
    pass


class Server:
    """An OpenAI-compatible server at host:port (started by us or already running)."""

    def __init__(self, name, host, port, api_key=None, proc=None, log=None):
        self.name, self.host, self.port, self.api_key = name, host, port, api_key
        self.proc, self.log = proc, log

    async def _request(self, method, path, body=None):
        reader, writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", "Connection: close",
                "Accept: text/event-stream, application/json"]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split()
        if len(parts) < 2 or not parts[1].isdigit():
            writer.close()
            raise HttpError(f"{method} {path}: not an HTTP response: {status_line!r}")
        status = int(parts[1])
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers, reader, writer

    @staticmethod
    async def _body(headers, reader):
        """Yields the body's bytes as they arrive (chunked or not)."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await reader.readline()
                if not size_line:
                    return
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                chunk = await reader.readexactly(size)
                await reader.readexactly(2)
                yield chunk
        elif "content-length" in headers:
            left = int(headers["content-length"])
            while left > 0:
                chunk = await reader.read(min(left, 65536))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk
        else:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                yield chunk

    async def get_json(self, path):
        status, headers, reader, writer = await self._request("GET", path)
        body = b"".join([c async for c in self._body(headers, reader)])
        writer.close()
        if status != 200:
            raise HttpError(f"GET {path}: HTTP {status}: {body[:300]!r}")
        return json.loads(body)

    async def chat(self, messages, max_tokens, stream, on_first=None):
        """A chat completion at temperature 0. Streamed: returns (t_sent, [arrival times
        of the content chunks], text), calling on_first() at the first content chunk;
        not streamed: the response's JSON."""
        body = {"messages": messages, "temperature": 0, "max_tokens": max_tokens, "stream": stream}
        if getattr(self, "model_id", None):
            body["model"] = self.model_id
        t0 = time.perf_counter()
        status, headers, reader, writer = await self._request("POST", "/v1/chat/completions", body)
        try:
            if status != 200:
                err = b"".join([c async for c in self._body(headers, reader)])
                raise HttpError(f"POST /v1/chat/completions: HTTP {status}: {err[:300]!r}")
            if not stream:
                return json.loads(b"".join([c async for c in self._body(headers, reader)]))
            times, text, buf, done = [], [], b"", False
            async for chunk in self._body(headers, reader):
                now = time.perf_counter()
                buf += chunk
                lines = buf.split(b"\n")
                buf = lines.pop()
                for line in lines:
                    line = line.rstrip(b"\r")
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        raise HttpError(f"stream error: {event['error']}")
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            if not times and on_first is not None:
                                on_first()
                            times.append(now)
                            text.append(piece)
                if done:
                    break
            if not done:
                raise HttpError("the stream ended without data: [DONE]")
            return t0, times, "".join(text)
        finally:
            writer.close()

    def stop(self):
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.log:
            self.log.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start(name, cmd_words, port, api_key, log_path, ready_timeout):
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    log = open(log_path, "w")
    print(f"[{name}] starting: {' '.join(shlex.quote(w) for w in cmd_words)}", file=sys.stderr)
    proc = subprocess.Popen(cmd_words, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = Server(name, "127.0.0.1", port, api_key, proc, log)
    deadline = time.monotonic() + ready_timeout
    while True:
        if proc.poll() is not None:
            log.close()
            tail = open(log_path).read()[-3000:]
            raise SystemExit(f"[{name}] exited with {proc.returncode} before it was ready; log {log_path}:\n{tail}")
        try:
            await server.get_json("/v1/models")
            return server
        except (OSError, HttpError, ValueError):
            if time.monotonic() > deadline:
                server.stop()
                raise SystemExit(f"[{name}] not ready after {ready_timeout} s; log {log_path}")
            await asyncio.sleep(0.3)


async def run_load(server, clients, per_client, max_tokens, seed):
    prompts = prompt_mix(seed, clients * per_client)
    ttfts, itls, tokens = [], [], 0

    async def client(c):
        nonlocal tokens
        for r in range(per_client):
            msg = [{"role": "user", "content": prompts[c * per_client + r]}]
            t0, times, _ = await server.chat(msg, max_tokens, True)
            if times:
                ttfts.append(times[0] - t0)
                itls.extend(b - a for a, b in zip(times, times[1:]))
            tokens += len(times)

    start_t = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - start_t
    return {
        "clients": clients, "requests": clients * per_client, "tokens": tokens, "wall_s": wall,
        "tok_s": tokens / wall if wall > 0 else None,
        "ttft_p50_ms": ms(percentile(ttfts, 50)), "ttft_p99_ms": ms(percentile(ttfts, 99)),
        "itl_p50_ms": ms(percentile(itls, 50)), "itl_p99_ms": ms(percentile(itls, 99)),
    }


def ms(x):
    return None if x is None else x * 1000.0


def probe_text(n_words, rep):
    words = [FILLER[(i * 7 + rep) % len(FILLER)] for i in range(n_words)]
    return f"Request {rep}: repeat these words back: " + " ".join(words)


async def calibrate_64(server, target=64):
    """The number of filler words that makes the chat prompt `target` tokens long."""
    async def count(n):
        r = await server.chat([{"role": "user", "content": probe_text(n, 0)}], 1, False)
        return int(r["usage"]["prompt_tokens"])

    lo, hi = 0, 8
    while await count(hi) < target:
        lo, hi = hi, hi * 2
        if hi > 4096:
            raise SystemExit("could not build a 64-token prompt")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await count(mid) < target:
            lo = mid
        else:
            hi = mid
    n = hi if abs(await count(hi) - target) <= abs(await count(lo) - target) else lo
    return n, await count(n)


async def run_ttft(server, reps, others, bg_max_tokens, seed, concurrent):
    n_words, n_tokens = await calibrate_64(server)

    async def probe(rep):
        t0, times, _ = await server.chat([{"role": "user", "content": probe_text(n_words, rep)}], 8, True)
        if not times:
            raise HttpError("the probe got no token")
        return times[0] - t0

    idle = [await probe(1000 + i) for i in range(reps)]

    stop = asyncio.Event()
    first_token = [asyncio.Event() for _ in range(others)]
    bg_prompts = prompt_mix(seed + 1, others)

    async def background(i):
        while not stop.is_set():
            msg = [{"role": "user", "content": bg_prompts[i] + " Make it long and detailed."}]
            # Each stream counts as running from its first token; it runs to its end
            # and starts again, so that `others` streams generate throughout.
            await server.chat(msg, bg_max_tokens, True, on_first=first_token[i].set)

    bg = [asyncio.ensure_future(background(i)) for i in range(others)]
    try:
        if concurrent:
            # Every stream past its prefill before the first probe.
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first_token)), 600)
        else:
            # A server that runs one request at a time: the probes queue behind them.
            await asyncio.wait_for(first_token[0].wait(), 600)
        loaded = []
        for i in range(reps):
            loaded.append(await probe(2000 + i))
    finally:
        stop.set()
        for t in bg:
            t.cancel()
        await asyncio.gather(*bg, return_exceptions=True)
    return {
        "prompt_tokens": n_tokens, "others": others, "reps": reps,
        "idle_ttft_ms": [x * 1000 for x in idle], "loaded_ttft_ms": [x * 1000 for x in loaded],
        "idle_p50_ms": ms(statistics.median(idle)), "loaded_p50_ms": ms(statistics.median(loaded)),
        "ratio": statistics.median(loaded) / statistics.median(idle),
    }


async def bench_side(name, args, cmd_words, is_peer):
    if cmd_words is None:
        u = urlsplit(args.url)
        server = Server(name, u.hostname or "127.0.0.1", u.port or 80, args.api_key)
        await server.get_json("/v1/models")
    else:
        port = int(cmd_words[1])
        server = await start(name, cmd_words[0], port, args.api_key,
                             os.path.join(args.log_dir, f"serve_load_{name}.log"), args.ready_timeout)
    try:
        models = await server.get_json("/v1/models")
        data = models.get("data") or []
        server.model_id = data[0]["id"] if data else None
        # Warm-up: the first request pays for lazy initialisation on some servers.
        await server.chat([{"role": "user", "content": "Hello."}], 8, True)
        out = {"model": server.model_id, "load": []}
        for n in args.clients:
            r = await run_load(server, n, args.requests_per_client, args.max_tokens, args.seed)
            print(f"[{name}] {n:2d} clients: {r['tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms, "
                  f"ITL p50 {fmt(r['itl_p50_ms'])} ms", file=sys.stderr)
            out["load"].append(r)
        reps = args.ttft_reps if not is_peer else args.peer_ttft_reps
        if reps > 0:
            out["ttft"] = await run_ttft(server, reps, 7, args.bg_max_tokens, args.seed, not is_peer)
            t = out["ttft"]
            print(f"[{name}] TTFT of a {t['prompt_tokens']}-token prompt: idle {t['idle_p50_ms']:.0f} ms, "
                  f"with 7 streams {t['loaded_p50_ms']:.0f} ms (x{t['ratio']:.2f})", file=sys.stderr)
        return out
    finally:
        server.stop()


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def scaling(side):
    by = {r["clients"]: r["tok_s"] for r in side["load"]}
    return by[8] / by[1] if 1 in by and 8 in by and by[1] else None


def report(results, names):
    ours, peer = names[0], (names[1] if len(names) > 1 else None)
    cols = [ours] + ([peer, f"{ours}/{peer}"] if peer else [])
    lines = ["| clients | metric | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    metrics = [("tok_s", "aggregate tok/s", True), ("ttft_p50_ms", "TTFT p50 ms", False),
               ("ttft_p99_ms", "TTFT p99 ms", False), ("itl_p50_ms", "ITL p50 ms", False),
               ("itl_p99_ms", "ITL p99 ms", False)]
    for i, row in enumerate(results[ours]["load"]):
        n = row["clients"]
        for key, label, _ in metrics:
            a = row[key]
            cells = [fmt(a)]
            if peer:
                b = results[peer]["load"][i][key]
                cells += [fmt(b), fmt(a / b if a is not None and b else None, 2)]
            lines.append(f"| {n} | {label} | " + " | ".join(cells) + " |")
    lines.append("")
    if peer:
        lines.append(f"ratios {ours}/{peer}: above 1 is more tokens/s, or slower for the latencies.")
        lines.append("")
    for name in names:
        s = scaling(results[name])
        lines.append(f"{name}: aggregate tok/s at 8 clients / 1 client = {fmt(s, 2)}")
        t = results[name].get("ttft")
        if t:
            lines.append(f"{name}: median TTFT of a {t['prompt_tokens']}-token prompt with 7 streams running / "
                         f"idle = {t['loaded_p50_ms']:.0f} ms / {t['idle_p50_ms']:.0f} ms = {t['ratio']:.2f}")
    if peer:
        a = {r["clients"]: r["tok_s"] for r in results[ours]["load"]}
        b = {r["clients"]: r["tok_s"] for r in results[peer]["load"]}
        if 8 in a and 8 in b and b[8]:
            lines.append(f"{ours}/{peer} aggregate tok/s at 8 clients = {a[8] / b[8]:.2f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--fusebox-bin", default="target/release/fusebox")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--server-cmd", help="command that starts the measured server; {port} is substituted")
    ap.add_argument("--url", help="measure a server already running at this URL instead of starting one")
    ap.add_argument("--name", default="fusebox", help="the measured server's name in the table")
    ap.add_argument("--api-key")
    ap.add_argument("--peer", choices=["llama-cpp"], help="also measure this peer in the same run")
    ap.add_argument("--peer-python", default=sys.executable, help="python with llama-cpp-python[server]")
    ap.add_argument("--peer-cmd", help="command that starts the peer; {port} is substituted")
    ap.add_argument("--clients", default="1,4,8,16", help="comma-separated client counts")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ttft-reps", type=int, default=5,
                    help="probes of the TTFT-under-load figure, idle and loaded (0: skip it)")
    ap.add_argument("--peer-ttft-reps", type=int, default=3,
                    help="the same for the peer, which serves one request at a time (0: skip)")
    ap.add_argument("--bg-max-tokens", type=int, default=128,
                    help="max_tokens of the 7 background streams of the TTFT-under-load figure")
    ap.add_argument("--ready-timeout", type=float, default=300)
    ap.add_argument("--log-dir", default="bench/results")
    ap.add_argument("--json", help="also write every figure to this JSON file")
    args = ap.parse_args()
    args.clients = [int(x) for x in args.clients.split(",") if x.strip()]
    if args.url and args.server_cmd:
        ap.error("--url and --server-cmd exclude each other")

    sides = []
    if args.url:
        sides.append((args.name, None))
    else:
        port = free_port()
        if args.server_cmd:
            words = [w.replace("{port}", str(port)) for w in shlex.split(args.server_cmd)]
        else:
            if not os.path.isfile(args.fusebox_bin):
                ap.error(f"{args.fusebox_bin} not found: cargo build --release -p fusebox-cli, or --fusebox-bin")
            words = [args.fusebox_bin, "serve", "--model", args.model, "--port", str(port),
                     "--threads", str(args.threads), "--parallel", str(max(args.clients + [8]))]
        sides.append((args.name, (words, port)))
    if args.peer:
        port = free_port()
        if args.peer_cmd:
            words = [w.replace("{port}", str(port)) for w in shlex.split(args.peer_cmd)]
        else:
            words = [args.peer_python, "-m", "llama_cpp.server", "--model", args.model, "--host", "127.0.0.1",
                     "--port", str(port), "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
                     "--n_ctx", "2048", "--interrupt_requests", "False"]
        sides.append((args.peer, (words, port)))
    if not os.path.isfile(args.model) and not args.url:
        ap.error(f"{args.model} not found (scripts/fetch-smollm2.sh)")

    results = {}
    for name, cmd in sides:
        results[name] = asyncio.run(bench_side(name, args, cmd, name == args.peer))
    names = [n for n, _ in sides]
    text = report(results, names)
    print(f"load average at the end: {open('/proc/loadavg').read().split()[:3] if os.path.exists('/proc/loadavg') else '?'}")
    print(text)
    if args.json:
        payload = {"config": {k: v for k, v in vars(args).items() if k != "api_key"}, "results": results,
                   "scaling_8_over_1": {n: scaling(results[n]) for n in names},
                   "ttft_loaded_over_idle": {n: results[n].get("ttft", {}).get("ratio") for n in names}}
        if args.peer:
            a = {r["clients"]: r["tok_s"] for r in results[names[0]]["load"]}
            b = {r["clients"]: r["tok_s"] for r in results[names[1]]["load"]}
            payload["ours_over_peer_tok_s_8"] = a[8] / b[8] if 8 in a and 8 in b and b[8] else None
        tmp = args.json + ".tmp"
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(payload, f, indent=2)
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
