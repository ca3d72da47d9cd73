#!/usr/bin/env python3
"""Drives `fusebox serve` with the official `openai` client, unchanged.

Run by crates/fusebox-serve/tests/api.rs (the_openai_python_client_works) against a
server it starts; by hand:

    fusebox serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf --port 8080 &
    python scripts/serve_openai_client.py --base-url http://127.0.0.1:8080/v1

Checks: models.list() names a model; chat.completions.create(stream=True) yields
chat.completion.chunk objects whose deltas concatenate to the non-streamed greedy
answer; the usage chunk (stream_options.include_usage) comes. Prints one JSON line.
"""
import argparse
import json

import openai


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    messages = [{"role": "system", "content": "You are concise."}, {"role": "user", "content": "Name three planets."}]
    whole = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=48)
    assert whole.object == "chat.completion", whole
    text = whole.choices[0].message.content
    stream = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=48, stream=True,
        stream_options={"include_usage": True},
    )
    parts, chunks, finish, usage = [], 0, None, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk", chunk
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            parts.append(delta.content)
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        raise AssertionError("an unknown model was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "no-such-model" in str(e), e
    print(json.dumps({
        "model": model, "whole": text, "streamed": "".join(parts), "chunks": chunks,
        "finish_reason": finish, "usage_total": usage.total_tokens if usage else 0,
    }))


if __name__ == "__main__":
    main()
