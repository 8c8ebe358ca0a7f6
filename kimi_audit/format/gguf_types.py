"""llama.cpp's tensor types as data: one row per ggml type (its id in a GGUF file, its name, the elements of
one block and the bytes a block takes), as gguf-py's `GGMLQuantizationType` and `GGML_QUANT_SIZES` hold them
(llama.cpp 0c1e5709, gguf-py/gguf/constants.py, vendored in llama-cpp-python 0.3.36). A duplicate id or name
is refused when the table is built, as gguf-py refuses a second class for a type.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

QK_K = 256


class GgmlType(NamedTuple):
    id: int
    name: str
    block: int
    """Elements per block: a row's length (the fastest dimension) must be a multiple of it."""
    size: int
    """Bytes per block."""
    weight: bool = True
    """A type llama.cpp stores a weight matrix in (the integer types and F64 are not)."""

    def nbytes(self, numel: int) -> int:
        return numel // self.block * self.size


_ROWS = (
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 2 + 16), (3, "Q4_1", 32, 2 + 2 + 16),
    (6, "Q5_0", 32, 2 + 4 + 16), (7, "Q5_1", 32, 2 + 2 + 4 + 16), (8, "Q8_0", 32, 2 + 32),
    (9, "Q8_1", 32, 2 + 2 + 32),
    (10, "Q2_K", QK_K, 2 + 2 + QK_K // 16 + QK_K // 4), (11, "Q3_K", QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    (12, "Q4_K", QK_K, 2 + 2 + QK_K // 2 + 12), (13, "Q5_K", QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    (14, "Q6_K", QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16), (15, "Q8_K", QK_K, 4 + QK_K + QK_K // 8),
    (16, "IQ2_XXS", QK_K, 2 + QK_K // 4), (17, "IQ2_XS", QK_K, 2 + QK_K // 4 + QK_K // 32),
    (18, "IQ3_XXS", QK_K, 2 + QK_K // 4 + QK_K // 8), (19, "IQ1_S", QK_K, 2 + QK_K // 8 + QK_K // 16),
    (20, "IQ4_NL", 32, 2 + 16), (21, "IQ3_S", QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    (22, "IQ2_S", QK_K, 2 + QK_K // 4 + QK_K // 16), (23, "IQ4_XS", QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    (29, "IQ1_M", QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32), (30, "BF16", 1, 2),
    (34, "TQ1_0", QK_K, 2 + 4 * 13), (35, "TQ2_0", QK_K, 2 + 64), (39, "MXFP4", 32, 1 + 16),
    (40, "NVFP4", 64, 4 + 32), (41, "Q1_0", 128, 2 + 16), (42, "Q2_0", 64, 2 + 16),
)
_INTEGER_ROWS = ((24, "I8", 1, 1), (25, "I16", 1, 2), (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8))


def _table() -> tuple[Mapping[int, GgmlType], Mapping[str, GgmlType]]:
    by_id: dict[int, GgmlType] = {}
    by_name: dict[str, GgmlType] = {}
    rows = [GgmlType(*r) for r in _ROWS] + [GgmlType(*r, weight=False) for r in _INTEGER_ROWS]
    for t in rows:
        if t.id in by_id or t.name in by_name:
            raise ValueError(f"ggml type {t.name} ({t.id}) listed twice")
        by_id[t.id] = by_name[t.name] = t
    return MappingProxyType(by_id), MappingProxyType(by_name)


GGML_TYPES, GGML_BY_NAME = _table()
"""id -> type, name -> type (read-only)."""
