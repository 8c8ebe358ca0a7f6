"""ggml's quantized types decoded to float32, by llama.cpp's own numpy reference: gguf-py's `quants.dequantize`
(the `gguf` package, llama.cpp's gguf-py on PyPI: one class per type, each the numpy transcription of
ggml-quants.c's `dequantize_row_*`). One implementation of each block format, llama.cpp's, rather than a second
one here kept equal to it by tests.

A type the installed gguf-py cannot decode (one newer than it) is a NumericsError naming the type and gguf-py's
version: said, never decoded wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kimi_audit.format.gguf_types import GGML_BY_NAME
from kimi_audit.numerics.dtypes import NumericsError

PLAIN = frozenset(("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"))
"""The ggml types whose bytes are their values (numerics.dtypes decodes them)."""


def is_quantized(dtype: str) -> bool:
    """A ggml block type (Q8_0, Q4_K, IQ2_XXS, TQ1_0, MXFP4, ...): values only through dequantization."""
    return dtype in GGML_BY_NAME and dtype not in PLAIN


def dequantize(raw: bytes | bytearray | memoryview, dtype: str, shape: Sequence[int]) -> np.ndarray:
    """The float32 values of a ggml-quantized tensor's bytes, `shape` in numpy order (rows last)."""
    import gguf
    from gguf.constants import GGMLQuantizationType

    t = GGML_BY_NAME[dtype]
    shape = tuple(int(d) for d in shape)
    numel = math.prod(shape)
    if not shape or shape[-1] % t.block or len(raw) != t.nbytes(numel):
        raise NumericsError(f"{dtype}{list(shape)} needs {t.nbytes(numel):,} bytes in rows of whole {t.block}-value "
                            f"blocks, got {len(raw):,}")
    version = getattr(gguf, "__version__", None) or _version()
    try:
        qtype = GGMLQuantizationType[dtype]
    except KeyError:
        raise NumericsError(f"ggml type {dtype} is newer than the installed gguf-py ({version}): not decoded") \
            from None
    data = np.frombuffer(raw, dtype=np.uint8).reshape(*shape[:-1], shape[-1] // t.block * t.size)
    try:
        values = gguf.quants.dequantize(data, qtype)
    except NotImplementedError:
        raise NumericsError(f"gguf-py {version} cannot dequantize {dtype}: not decoded") from None
    return np.asarray(values, dtype=np.float32).reshape(shape)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:  # pragma: no cover - installed with kimi-audit
        return "?"
