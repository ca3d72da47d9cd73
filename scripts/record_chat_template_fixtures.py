#!/usr/bin/env python3
"""Records what Hugging Face `transformers`' `apply_chat_template` renders for seven
chat templates, the fixtures crates/fusebox-models/tests/chat_templates.rs checks
fusebox's minijinja rendering against, byte for byte.

Regenerate (the venv has transformers, tokenizers and gguf):

    /tmp/tvenv/bin/python scripts/record_chat_template_fixtures.py

Templates, in crates/fusebox-models/tests/fixtures/chat_templates/:
  smollm2.jinja       `tokenizer.chat_template` of models/SmolLM2-135M-Instruct.Q4_1.gguf
                      (rewritten from the GGUF metadata when the file is there;
                      scripts/fetch-smollm2.sh fetches it)
  gemma3.jinja        google/gemma-3-270m-it's chat template (gemma-3-270m-q4_k_m.gguf
                      carries none; fusebox falls back to this one for a vocabulary
                      with <start_of_turn>/<end_of_turn>, see src/chat/templates/)
  llama3.1.jinja      meta-llama/Llama-3.1-8B-Instruct's tokenizer_config.json
  qwen2.5.jinja       Qwen/Qwen2.5-7B-Instruct's tokenizer_config.json
  qwen3.jinja         Qwen/Qwen3-0.6B's, as llama.cpp ships it in
                      models/templates/Qwen-Qwen3-0.6B.jinja
  mistral-v0.3.jinja  mistralai/Mistral-7B-Instruct-v0.3's tokenizer_config.json (the
                      tool-calling revision, as mlx-community's conversion carries it)
  gpt-oss.jinja       openai/gpt-oss-20b's (and -120b's) harmony template, as llama.cpp
                      ships it in models/templates/openai-gpt-oss-120b.jinja; fusebox
                      falls back to it for a vocabulary with <|start|>/<|channel|>/
                      <|message|> (src/chat/templates/). Besides the common cases it has
                      its own (GPT_OSS_CASES): a developer message, earlier assistant
                      turns with `thinking`, the `reasoning_effort`, `model_identity`
                      and `builtin_tools` kwargs, `tools` with a tool call and its result,
                      and the refusal of channel tags in `content`.

The templates that take `tools` (qwen2.5, qwen3, llama3.1, mistral-v0.3) also render
TOOL_CASES: the functions offered, an assistant turn with a call and the tool's result,
a whole round trip ending in an answer, and two calls with their results. Calls carry
their `arguments` as an object (what fusebox hands templates after parsing OpenAI's
JSON string) and 9-character ids (Mistral's template refuses others).

`strftime_now` answers a fixed time (NOW, recorded as "strftime_now") instead of the
clock, so renders that write today's date (gpt-oss's) stay reproducible; the Rust
test fixes its clock likewise (`ChatTemplate::with_fixed_now`). Objects in the cases
list their keys in sorted order, the order fusebox's `serde_json` gives them.

Each is rendered through `PreTrainedTokenizerFast.apply_chat_template` (tokenize=False)
of a tokenizer built here from a word-level vocabulary holding the model's BOS/EOS
strings, so the special-token variables (`bos_token`, `eos_token`) are exactly the ones
transformers passes. A conversation the template refuses (`raise_exception`) is
recorded with its error message instead of a rendering.

Output: expected.json beside the templates:
  {"strftime_now", "templates": [{"name", "file", "bos_token", "eos_token",
                  "cases": [{"name", "messages", "add_generation_prompt", "extra",
                             "expected" | "error"}]}]}
where "extra" holds the keyword arguments passed to apply_chat_template (the
template variables besides messages and add_generation_prompt).
"""

import datetime
import json
import os
import sys
from pathlib import Path

import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates/fusebox-models/tests/fixtures/chat_templates"
MODELS = ROOT / "models"

# name, template file, GGUF to read it from (or None), bos, eos
TEMPLATES = [
    ("smollm2", "smollm2.jinja", "SmolLM2-135M-Instruct.Q4_1.gguf", "<|im_start|>", "<|im_end|>"),
    ("gemma3", "gemma3.jinja", None, "<bos>", "<eos>"),
    ("llama3.1", "llama3.1.jinja", None, "<|begin_of_text|>", "<|eot_id|>"),
    ("qwen2.5", "qwen2.5.jinja", None, None, "<|im_end|>"),
    ("qwen3", "qwen3.jinja", None, None, "<|im_end|>"),
    ("mistral-v0.3", "mistral-v0.3.jinja", None, "<s>", "</s>"),
    ("gpt-oss", "gpt-oss.jinja", None, "<|startoftext|>", "<|return|>"),
]

# The time strftime_now answers.
NOW = datetime.datetime(2025, 8, 5, 14, 30, 0)

JINJA_LOOKING = "Is {{ 1 + 1 }} two? {% if x %}yes{% endif %} {# no #} raw_exception('x')"
UNICODE = "Ünïcödé: 日本語, русский, العربية, emoji 🦀👩‍💻, tab\tand\nnewline"

CASES = [
    ("user", [{"role": "user", "content": "Hi!"}], True),
    ("user_no_prompt", [{"role": "user", "content": "Hi!"}], False),
    ("system_user", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}], True),
    (
        "multi_turn",
        [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
        ],
        True,
    ),
    (
        "system_multi_turn_ends_with_assistant",
        [
            {"role": "system", "content": "You answer in French."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "Thanks"},
            {"role": "assistant", "content": "De rien."},
        ],
        False,
    ),
    (
        "jinja_looking_and_unicode",
        [
            {"role": "user", "content": JINJA_LOOKING},
            {"role": "assistant", "content": "  padded answer with 'quotes' and \"double\"  \n"},
            {"role": "user", "content": UNICODE},
        ],
        True,
    ),
    ("empty_content", [{"role": "user", "content": ""}], True),
    (
        "roles_not_alternating",
        [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
        True,
    ),
]


WEATHER_TOOL = {
    "function": {
        "description": "Gets the current weather in a city.",
        "name": "get_weather",
        "parameters": {
            "properties": {
                "city": {"description": "The city's name.", "type": "string"},
                "days": {"default": 1, "type": "integer"},
                "unit": {"default": "celsius", "enum": ["celsius", "fahrenheit"], "type": "string"},
            },
            "required": ["city"],
            "type": "object",
        },
    },
    "type": "function",
}
CLOCK_TOOL = {
    "function": {"description": "Tells the time.", "name": "now", "parameters": {"properties": {}, "type": "object"}},
    "type": "function",
}


def weather_call(call_id, city):
    return {"function": {"arguments": {"city": city}, "name": "get_weather"}, "id": call_id, "type": "function"}


# The cases of the templates that take tools: (name, messages, add_generation_prompt, kwargs).
TOOL_CASES = [
    (
        "tools_offered",
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
        True,
        {"tools": [WEATHER_TOOL, CLOCK_TOOL]},
    ),
    (
        "tool_call_and_result",
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"content": "", "role": "assistant", "tool_calls": [weather_call("abc123XYZ", "Paris")]},
            {"content": "{\"temperature\": 21}", "role": "tool", "tool_call_id": "abc123XYZ"},
        ],
        True,
        {"tools": [WEATHER_TOOL]},
    ),
    (
        "tool_round_trip_answered",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"content": "", "role": "assistant", "tool_calls": [weather_call("abc123XYZ", "Paris")]},
            {"content": "21 degrees", "role": "tool", "tool_call_id": "abc123XYZ"},
            {"content": "It is 21 degrees.", "role": "assistant"},
            {"role": "user", "content": "Thanks"},
        ],
        True,
        {"tools": [WEATHER_TOOL, CLOCK_TOOL]},
    ),
    (
        "two_calls_two_results",
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "content": "",
                "role": "assistant",
                "tool_calls": [weather_call("call00001", "Paris"), weather_call("call00002", "Rome")],
            },
            {"content": "21", "role": "tool", "tool_call_id": "call00001"},
            {"content": "25", "role": "tool", "tool_call_id": "call00002"},
        ],
        True,
        {"tools": [WEATHER_TOOL]},
    ),
]
TOOL_TEMPLATES = ("qwen2.5", "qwen3", "llama3.1", "mistral-v0.3")

# gpt-oss's own cases: (name, messages, add_generation_prompt, kwargs).
GPT_OSS_CASES = [
    (
        "developer_and_reasoning_effort",
        [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi!"}],
        True,
        {"reasoning_effort": "high"},
    ),
    (
        "earlier_turns_with_thinking",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"content": "4.", "role": "assistant", "thinking": "Simple arithmetic: 2+2=4."},
            {"role": "user", "content": "And 3+3?"},
        ],
        True,
        {"reasoning_effort": "low"},
    ),
    (
        "last_assistant_with_thinking_for_training",
        [
            {"role": "user", "content": "What is 2+2?"},
            {"content": "4.", "role": "assistant", "thinking": "Simple arithmetic."},
        ],
        False,
        {},
    ),
    (
        "model_identity_and_builtin_tools",
        [{"role": "user", "content": "Look it up."}],
        True,
        {"builtin_tools": ["browser", "python"], "model_identity": "You are a test model."},
    ),
    (
        "tools_with_a_call_and_its_result",
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "content": "",
                "role": "assistant",
                "thinking": "I should call get_weather.",
                "tool_calls": [{"function": {"arguments": {"city": "Paris"}, "name": "get_weather"}, "type": "function"}],
            },
            {"role": "tool", "content": "{\"temperature\": 21}"},
        ],
        True,
        {"tools": [WEATHER_TOOL, CLOCK_TOOL]},
    ),
    (
        "tools_call_then_final_answer",
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "content": "",
                "role": "assistant",
                "thinking": "I should call get_weather.",
                "tool_calls": [{"function": {"arguments": {"city": "Paris"}, "name": "get_weather"}, "type": "function"}],
            },
            {"role": "tool", "content": "21 degrees"},
            {"content": "It is 21 degrees.", "role": "assistant"},
            {"role": "user", "content": "Thanks"},
        ],
        True,
        {"tools": [WEATHER_TOOL]},
    ),
    (
        "channel_tags_in_content_are_refused",
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<|channel|>final<|message|>Hello"},
            {"role": "user", "content": "Again"},
        ],
        True,
        {},
    ),
]


def gguf_template(path: Path) -> str:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def tokenizer_for(bos, eos) -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0}
    for t in (bos, eos):
        if t is not None:
            vocab.setdefault(t, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    kw = {"tokenizer_object": tok, "eos_token": eos}
    if bos is not None:
        kw["bos_token"] = bos
    return PreTrainedTokenizerFast(**kw)


class FixedClock(datetime.datetime):
    """datetime whose now() is NOW: what transformers' strftime_now reads."""

    @classmethod
    def now(cls, tz=None):
        return NOW


def main() -> int:
    import transformers.utils.chat_template_utils as chat_template_utils

    chat_template_utils.datetime = FixedClock
    out = {"transformers": transformers.__version__, "strftime_now": NOW.isoformat(), "templates": []}
    for name, file, gguf, bos, eos in TEMPLATES:
        path = FIXTURES / file
        if gguf is not None and (MODELS / gguf).exists():
            path.write_text(gguf_template(MODELS / gguf), encoding="utf-8")
        source = path.read_text(encoding="utf-8")
        tok = tokenizer_for(bos, eos)
        cases = []
        own = GPT_OSS_CASES if name == "gpt-oss" else []
        own = own + (TOOL_CASES if name in TOOL_TEMPLATES else [])
        for case_name, messages, gen, kwargs in [c + ({},) for c in CASES] + own:
            case = {"name": case_name, "messages": messages, "add_generation_prompt": gen, "extra": kwargs}
            try:
                case["expected"] = tok.apply_chat_template(
                    messages, chat_template=source, tokenize=False, add_generation_prompt=gen, **kwargs
                )
            except Exception as e:  # raise_exception, or a template error
                case["error"] = str(e)
            cases.append(case)
        rendered = sum("expected" in c for c in cases)
        print(f"{name}: {rendered} rendered, {len(cases) - rendered} refused", file=sys.stderr)
        out["templates"].append({"name": name, "file": file, "bos_token": bos, "eos_token": eos, "cases": cases})
    target = FIXTURES / "expected.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    print(f"wrote {target.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
