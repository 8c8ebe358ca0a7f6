"""ggml's encodings of float values, as llama.cpp writes them: what a GGUF tensor's bytes must be when it was
converted from known values (`audit --against`).

- F32, F16, BF16: the values rounded to nearest-even (ggml's FP32_TO_FP16 and FP32_TO_BF16).
- I8, I16, I32, I64: the integers as they are (an exact cast, or no encoding).
- Q8_0: ggml-quants.c `quantize_row_q8_0_ref`: per block of 32, d = amax / 127 (float32), stored F16; each
  value's code roundf(x * (1 / d)), half away from zero (gguf-py quants.py `Q8_0.quantize_blocks` does the same
  in numpy; tests/test_ggml.py holds this to it).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

INTEGERS = {"I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}
"""ggml's integer types (DeepSeek-V4's I32 hash-routing table): their values as they are, little-endian."""
ENCODED = ("F32", "F16", "BF16", "Q8_0", *INTEGERS)
"""The ggml types whose bytes this module can compute from values."""
QK8_0 = 32


def roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf on float32: the nearest integer, halves away from zero (exact: x - trunc(x) is exact)."""
    t = np.trunc(x)
    frac = x - t
    away = np.where(np.abs(frac) >= np.float32(0.5), np.sign(x), np.float32(0))
    return np.asarray(t + away, dtype=np.float32)


def quantize_q8_0(values: np.ndarray) -> bytes:
    """Q8_0 blocks of float32 `values` (the last dimension a multiple of 32), as quantize_row_q8_0_ref."""
    x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, QK8_0)
    amax = np.abs(x).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = roundf((x * inv).astype(np.float32)).astype(np.int8)
    blocks = np.empty(x.shape[0], dtype=[("d", "<f2"), ("qs", "i1", QK8_0)])
    blocks["d"] = d[:, 0].astype(np.float16)
    blocks["qs"] = q
    return blocks.tobytes()


def encode(values: np.ndarray, ggml_type: str) -> bytes:
    """The bytes of `values` stored as `ggml_type` (one of ENCODED); ValueError where an integer type cannot hold
    them exactly (a fraction, a value out of its range)."""
    if ggml_type in INTEGERS:
        v = np.asarray(values)
        out = v.astype(INTEGERS[ggml_type])
        if not np.array_equal(out, v):
            raise ValueError(f"values that {ggml_type} does not hold exactly")
        return out.tobytes()
    x = np.asarray(values, dtype=np.float32)
    if ggml_type == "F32":
        return x.astype("<f4").tobytes()
    if ggml_type == "F16":
        return x.astype("<f2").tobytes()
    if ggml_type == "BF16":
        return x.astype(ml_dtypes.bfloat16).tobytes()
    if ggml_type == "Q8_0":
        return quantize_q8_0(x)
    raise ValueError(f"no encoding of ggml type {ggml_type}")
