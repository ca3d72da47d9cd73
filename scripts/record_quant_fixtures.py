#!/usr/bin/env python3
"""Records the GGUF block-format fixtures of the conformance suite from llama.cpp itself.

For every block format fusebox reads (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) it writes
`crates/fusebox-conformance/fixtures/quant/<type>.txt` with two sections, each a few blocks:

* `x`, `q`, `y`: awkward f32 inputs (bell-shaped, a lone outlier, all zero, constant,
  all negative, a positive offset, values on the quantization grid, tiny and huge
  magnitudes; for MXFP4 also blocks at the edges of its exponent rule: largest
  magnitudes at and just below a power of two, ties halfway between levels, a largest
  magnitude below 2^-125 whose exponent wraps, an infinity and a NaN), llama.cpp's blocks
  for them (`ggml_quantize_chunk` without an importance matrix, which is what
  `llama-quantize` writes when no imatrix is given), and llama.cpp's dequantization of
  those blocks (the type's `to_float`);
* `rq`, `ry`: blocks of random bytes whose scale fields hold finite values (f16 scales
  drawn from a range; MXFP4's E8M0 exponents from a fixed list that includes the two
  subnormal ones), and llama.cpp's dequantization of them (every bit pattern of the quant
  fields occurs).

Every value is hex of little-endian bytes (f32 for x / y / ry, raw blocks for q / rq),
64 bytes a line. The script also checks gguf-py's numpy `dequantize` (and, where it has
one, its `quantize`) against llama.cpp and stops on a difference.

ggml comes from llama-cpp-python's bundled `libggml-base` (found next to the `llama_cpp`
package, or given with GGML_BASE_LIB); `gguf` is gguf-py from the same llama.cpp source.
Regenerate with (the formats named, or all):

    PYTHONPATH=/tmp/lcp-src/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py \
        /tmp/lvenv/bin/python scripts/record_quant_fixtures.py [FORMAT ...]
"""

import ctypes
import glob
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "fusebox-conformance", "fixtures", "quant")

class E8M0:
    """An E8M0 exponent byte at `at`: block b of the random blocks gets `values[b % len]`."""

    def __init__(self, at, values):
        self.at, self.values = at, values


# name → (ggml type, elements per block, scale fields: f16 as (offset, low, high), or E8M0)
FORMATS = {
    "q8_0": (T.Q8_0, 32, [(0, 0.002, 0.015)]),
    "q4_0": (T.Q4_0, 32, [(0, -0.25, 0.25)]),
    "q4_1": (T.Q4_1, 32, [(0, 0.0, 0.12), (2, -1.0, 0.2)]),
    "q5_0": (T.Q5_0, 32, [(0, -0.12, 0.12)]),
    "q5_1": (T.Q5_1, 32, [(0, 0.0, 0.06), (2, -1.0, 0.2)]),
    "iq4_nl": (T.IQ4_NL, 32, [(0, -0.02, 0.02)]),
    "mxfp4": (T.MXFP4, 32, [E8M0(0, [0, 1, 2, 64, 127, 128, 129, 250])]),
    "q2_k": (T.Q2_K, 256, [(80, 0.0, 0.05), (82, 0.0, 0.05)]),
    "q3_k": (T.Q3_K, 256, [(108, -0.002, 0.002)]),
    "q4_k": (T.Q4_K, 256, [(0, 0.0, 0.002), (2, 0.0, 0.01)]),
    "q5_k": (T.Q5_K, 256, [(0, 0.0, 0.001), (2, 0.0, 0.01)]),
    "q6_k": (T.Q6_K, 256, [(208, -0.0005, 0.0005)]),
    "iq4_xs": (T.IQ4_XS, 256, [(0, -0.0005, 0.0005)]),
}


def load_ggml():
    path = os.environ.get("GGML_BASE_LIB")
    if not path:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.origin is None:
            sys.exit("llama_cpp is not installed and GGML_BASE_LIB is not set")
        found = glob.glob(os.path.join(os.path.dirname(spec.origin), "**", "libggml-base.so"), recursive=True)
        if not found:
            sys.exit("no libggml-base.so next to llama_cpp; set GGML_BASE_LIB")
        path = found[0]
    lib = ctypes.CDLL(path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p
    ]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_get_type_traits.restype = ctypes.c_void_p
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    return lib


class Traits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)),
        ("from_float_ref", ctypes.c_void_p),
    ]


def ggml_quantize(lib, qtype, x, n_per_row):
    x = np.ascontiguousarray(x, dtype=np.float32)
    traits = Traits.from_address(lib.ggml_get_type_traits(int(qtype)))
    out = np.zeros(x.size // traits.blck_size * traits.type_size, dtype=np.uint8)
    lib.ggml_quantize_init(int(qtype))
    lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0, x.size // n_per_row, n_per_row, None)
    return out


def ggml_dequantize(lib, qtype, blocks):
    traits = Traits.from_address(lib.ggml_get_type_traits(int(qtype)))
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
    n = blocks.size // traits.type_size * traits.blck_size
    out = np.zeros(n, dtype=np.float32)
    traits.to_float(blocks.ctypes.data, out.ctypes.data, n)
    return out


def mxfp4_edges(rng):
    """Blocks at the edges of MXFP4's rule e = floor(log2(max|x|)) − 2 + 127 and its
    nearest-level choice: ties halfway between levels (the first level wins) with the
    largest magnitude exactly 8 (e = 128, d = 1), the same ties scaled just below 8, a
    largest magnitude of 2^-126 and a subnormal one (e wraps below 0), one near f32's
    largest, an infinity and a NaN beside ordinary values."""
    n = 32
    halves = np.array([0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0, 12.0])
    ties = np.concatenate([halves, -halves, halves / 2, -halves / 2])[:n] * 0.5
    ties[0] = 8.0
    below = ties * np.float32(0.99)
    wrap = rng.normal(0, 1, n) * 2.0**-128
    wrap[5] = 2.0**-126
    sub = rng.normal(0, 1, n) * 1e-40
    huge = rng.normal(0, 1, n) * 1e37
    huge[7] = 3e38
    inf = rng.normal(0, 1, n)
    inf[9] = np.inf
    nan = rng.normal(0, 1, n)
    nan[11] = np.nan
    return [ties, below, wrap, sub, huge, inf, nan]


def awkward_inputs(rng, block, qtype):
    """Groups of 32 of each kind of awkward input: ten blocks of 32 for the 32-element
    formats; for the super-block formats, one super-block mixing eight kinds, one with the
    other two kinds beside groups of growing scale, and one all zero."""
    n = 32
    grid = np.round(rng.uniform(-7, 7, n)) * 0.25
    grid[0] = -2.0  # the extreme value first, on the grid
    outlier = rng.normal(0, 0.05, n)
    outlier[n // 3] = 40.0
    kinds = [
        rng.normal(0, 1, n),
        outlier,
        np.zeros(n),
        np.full(n, 0.7),
        -rng.uniform(1, 2, n),
        rng.uniform(5, 6, n),
        grid,
        np.where(rng.uniform(0, 1, n) < 0.8, 0.0, rng.normal(0, 1, n)),
        rng.normal(0, 1, n) * 1e-12,
        rng.normal(0, 1, n) * 1e3,
    ]
    if qtype == T.MXFP4:
        kinds += mxfp4_edges(rng)
    if block == 32:
        return np.concatenate(kinds).astype(np.float32)
    scaled = [rng.normal(0, 1, n) * 10.0 ** (e - 3) for e in range(6)]
    return np.concatenate(kinds + scaled + [np.zeros(256)]).astype(np.float32)


def random_blocks(rng, qtype, nblocks, fields):
    traits_size = quants.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(nblocks, traits_size), dtype=np.uint8)
    for b in range(nblocks):
        for field in fields:
            if isinstance(field, E8M0):
                raw[b, field.at] = field.values[b % len(field.values)]
                continue
            at, lo, hi = field
            raw[b, at : at + 2] = np.frombuffer(np.float16(rng.uniform(lo, hi)).tobytes(), dtype=np.uint8)
    return raw.reshape(-1)


def hex_lines(tag, data):
    raw = np.ascontiguousarray(data).tobytes()
    return [f"{tag} {raw[i:i + 64].hex()}" for i in range(0, len(raw), 64)]


def check_mxfp4_random(lib, rng):
    """gguf-py's MXFP4 quantize against ggml's on many random blocks of every scale (the
    fixture keeps only a few); stops on a difference."""
    x = (rng.normal(0, 1, (4096, 32)) * 10.0 ** rng.uniform(-6, 6, (4096, 1))).astype(np.float32)
    q = ggml_quantize(lib, T.MXFP4, x.reshape(-1), 32)
    gq = quants.quantize(x, T.MXFP4).reshape(-1)
    if not np.array_equal(gq, q):
        sys.exit("mxfp4: gguf-py quantize differs from ggml on random blocks")
    print(f"mxfp4: gguf-py quantize matches ggml on {x.shape[0]} random blocks")


def main():
    lib = load_ggml()
    os.makedirs(OUT, exist_ok=True)
    wanted = sys.argv[1:] or list(FORMATS)
    unknown = [n for n in wanted if n not in FORMATS]
    if unknown:
        sys.exit(f"unknown formats {unknown}; known: {', '.join(FORMATS)}")
    for name in wanted:
        qtype, block, fields = FORMATS[name]
        rng = np.random.default_rng(1000 + int(qtype))
        x = awkward_inputs(rng, block, qtype)
        q = ggml_quantize(lib, qtype, x, block)
        y = ggml_dequantize(lib, qtype, q)
        rq = random_blocks(rng, qtype, 8 if block == 32 else 3, fields)
        ry = ggml_dequantize(lib, qtype, rq)
        # gguf-py's numpy reading of the same bytes must agree with llama.cpp's.
        for blocks, want in [(q, y), (rq, ry)]:
            with np.errstate(over="ignore"):
                got = quants.dequantize(blocks, qtype).reshape(-1).astype(np.float32)
            if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
                diff = np.max(np.abs(got[bad] - want[bad]) / np.maximum(np.abs(want[bad]), 1e-30))
                print(f"{name}: gguf-py dequantize differs from ggml in {bad.size} values (max rel {diff:.2e})")
                if diff > 1e-6:
                    sys.exit(f"{name}: gguf-py and ggml disagree beyond f32 rounding")
        try:
            with np.errstate(all="ignore"):
                gq = quants.quantize(x.reshape(-1, block), qtype)
            # A NaN input: gguf-py's max propagates it, ggml's loops skip it; compare the rest.
            kept = ~np.isnan(x.reshape(-1, block)).any(axis=1)
            same = np.array_equal(gq[kept].reshape(-1), q.reshape(gq.shape)[kept].reshape(-1))
            note = "" if kept.all() else f" (the {np.count_nonzero(~kept)} blocks with a NaN left out)"
            print(f"{name}: gguf-py quantize {'matches' if same else 'DIFFERS from'} ggml{note}")
        except NotImplementedError:
            pass
        if qtype == T.MXFP4:
            check_mxfp4_random(lib, rng)
        lines = [
            f"# {name}: {x.size // block} blocks of awkward inputs (x), ggml_quantize_chunk's blocks (q),",
            "# ggml's to_float of them (y); random blocks (rq) and their to_float (ry).",
            "# Recorded by scripts/record_quant_fixtures.py; do not edit.",
        ]
        for tag, data in [("x", x), ("q", q), ("y", y), ("rq", rq), ("ry", ry)]:
            lines += hex_lines(tag, data)
        with open(os.path.join(OUT, f"{name}.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: {x.size} values, {q.size} bytes of blocks, {rq.size} random bytes")


if __name__ == "__main__":
    main()
