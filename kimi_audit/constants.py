"""Constants of the tool, the safetensors format, the pinned checkpoint and the tool's limits."""

from __future__ import annotations

VERSION = "0.1.0"
"""kimi-audit's version (`kimi_audit.__version__`), here so that the modules that print it do not import
the package root, whose API imports them."""

PINNED_REPO_ID = "moonshotai/Kimi-K2-Instruct"
PINNED_REVISION = "fd1984e2b7a3350dbf7305fe73a4ede25c14de50"

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SAFETENSORS_SUFFIX = ".safetensors"
GGUF_SUFFIX = ".gguf"

# Format limits (see the safetensors reference implementation).
HEADER_LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100_000_000
# Files read whole.
MAX_CONFIG_BYTES = 1_000_000
MAX_INDEX_BYTES = 64_000_000

WIDE_FLOATS = ("F32", "BF16", "F16")
"""The float dtypes unquantized weights, gains and biases are written in (config.json's `dtype` and F32)."""

# Bits per element of every dtype the safetensors format defines.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

TORCH_DTYPE_TO_SAFETENSORS = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
"""A config's torch dtype name (`dtype`, `torch_dtype`, a `scale_dtype`) -> the safetensors dtype."""
