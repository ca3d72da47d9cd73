#!/usr/bin/env python3
"""Drives `fusebox serve` with the official `openai` client, unchanged.

Run by crates/fusebox-serve/tests/api.rs (the_openai_python_client_works) against a
server it starts; by hand:

    fusebox serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf --port 8080 &
    python scripts/serve_openai_client.py --base-url http://127.0.0.1:8080/v1

Checks: models.list() names a model; chat.completions.create(stream=True) yields
chat.completion.chunk objects whose deltas concatenate to the non-streamed greedy
answer; the usage chunk (stream_options.include_usage) comes; logprobs (chat with
top_logprobs, streamed the same; completions' legacy shape) are parsed by the client's
types, the greedy token is the most likely one, and the tokens' bytes make up the
answer; n=3 returns 3 choices; a stop string ends the answer before it (whole and
streamed); embeddings (the client asks for base64) are unit vectors. Prints one JSON
line, with the greedy answer's token logprobs for the caller to check against the
model's logits.
"""
import argparse
import json
import math

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
    # Logprobs: present, shaped as the client's types, the greedy token the most likely.
    lp = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=48, logprobs=True, top_logprobs=3,
    )
    assert lp.choices[0].message.content == text, (lp.choices[0].message.content, text)
    content = lp.choices[0].logprobs.content
    assert content, lp
    for e in content:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0, e
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, e
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob, e
    assert bytes(b for e in content for b in e.bytes).decode() == text, content
    streamed_lp = []
    for chunk in client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=48, logprobs=True, top_logprobs=3, stream=True,
    ):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed_lp.extend(e.logprob for e in chunk.choices[0].logprobs.content)
    assert streamed_lp == [e.logprob for e in content], (streamed_lp, content)
    legacy = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                       temperature=0, logprobs=2)
    lg = legacy.choices[0].logprobs
    assert len(lg.tokens) == len(lg.token_logprobs) == len(lg.top_logprobs) == len(lg.text_offset) > 0, lg
    assert "".join(lg.tokens) == legacy.choices[0].text, lg
    # n = 3: three choices, indexed.
    three = client.chat.completions.create(model=model, messages=messages, temperature=0.8, seed=5, max_tokens=8, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2], three
    # A stop string (a word of the greedy answer): the answer ends before it.
    words = [w for w in text.split() if len(w) > 2]
    stop = words[len(words) // 2] if words else None
    if stop:
        cut = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=48, stop=[stop])
        assert cut.choices[0].message.content == text[: text.index(stop)], (cut, stop)
        assert cut.choices[0].finish_reason == "stop", cut
        parts_cut = []
        for chunk in client.chat.completions.create(
            model=model, messages=messages, temperature=0, max_tokens=48, stop=stop, stream=True,
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                parts_cut.append(chunk.choices[0].delta.content)
        assert "".join(parts_cut) == text[: text.index(stop)], (parts_cut, stop)
    # Embeddings: the client asks for base64 and decodes it.
    emb = client.embeddings.create(model=model, input=["Mars is red.", "Venus is hot."])
    assert len(emb.data) == 2, emb
    for d in emb.data:
        norm = math.sqrt(sum(x * x for x in d.embedding))
        assert abs(norm - 1) < 1e-3, norm
    try:
        client.chat.completions.create(model=model, messages=messages, n=9)
        raise AssertionError("n=9 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "'n'" in str(e), e
    try:
        client.chat.completions.create(model=model, messages=messages, logprobs=True, top_logprobs=21)
        raise AssertionError("top_logprobs=21 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "top_logprobs" in str(e), e
    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        raise AssertionError("an unknown model was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "no-such-model" in str(e), e
    print(json.dumps({
        "model": model, "whole": text, "streamed": "".join(parts), "chunks": chunks,
        "finish_reason": finish, "usage_total": usage.total_tokens if usage else 0,
        "logprobs": [e.logprob for e in content], "choices_n3": len(three.choices),
        "stop": stop, "embedding_width": len(emb.data[0].embedding),
    }))


if __name__ == "__main__":
    main()
