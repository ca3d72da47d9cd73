#!/usr/bin/env python3
"""Structured outputs of `fusebox serve` through the official `openai` client.

Run by crates/fusebox-serve/tests/structured.rs (smollm2_answers_parse_and_validate)
against a server it starts; by hand:

    fusebox serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf --port 8080 &
    python scripts/serve_structured_client.py --base-url http://127.0.0.1:8080/v1

Checks: chat.completions.create with response_format json_schema (strict) answers
JSON that Python's `jsonschema` validates, streamed the same; a schema keyword the
server cannot enforce is an openai.BadRequestError (400) naming it. Prints one JSON line.
"""
import argparse
import json

import jsonschema
import openai

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    messages = [{"role": "user", "content": "Describe the capital of Japan as JSON."}]
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=200,
                                       response_format=fmt)
    answer = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", (r.choices[0].finish_reason, answer)
    jsonschema.validate(json.loads(answer), SCHEMA)
    stream = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=200,
                                            response_format=fmt, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == answer, (streamed, answer)
    status, message = None, ""
    try:
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}}
        client.chat.completions.create(model=model, messages=messages, max_tokens=5, response_format=bad)
    except openai.BadRequestError as e:
        status, message = e.status_code, str(e)
    assert "uniqueItems" in message, message
    print(json.dumps({"validated": True, "answer": answer, "bad_schema_status": status}))


if __name__ == "__main__":
    main()
