"""llama.cpp's tensor types as data: one row per ggml type (its id in a GGUF file, its name, the elements of
one block and the bytes a block takes), as gguf-py's `GGMLQuantizationType` and `GGML_QUANT_SIZES` hold them
(llama.cpp 0c1e5709, gguf-py/gguf/constants.py, vendored in llama-cpp-python 0.3.36), and where in a block its
scales lie: the fields llama.cpp's `--check-tensors` reads in every block (ggml_validate_row_data,
ggml/src/ggml-quants.c; the block structs in ggml/src/ggml-common.h). A duplicate id or name is refused when
the table is built, as gguf-py refuses a second class for a type.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

QK_K = 256


F16 = "F16"
F32 = "F32"
E8M0 = "E8M0"
"""A byte exponent (MXFP4's `e`): 0xFF is no value (llama.cpp: "invalid e value"; NaN in the OCP MX spec)."""
IQ1_M_F16 = "IQ1_M"
"""IQ1_M's F16 scale, its four nibbles the top nibbles of the block's four uint16 `scales`."""

ScaleField = tuple[str, str, int]
"""(the field's name in ggml-common.h, its encoding, its byte offset in the block)."""


class GgmlType(NamedTuple):
    id: int
    name: str
    block: int
    """Elements per block: a row's length (the fastest dimension) must be a multiple of it."""
    size: int
    """Bytes per block."""
    scales: tuple[ScaleField, ...] | None = ()
    """The scale fields ggml_validate_row_data checks in every block (NaN and ±Inf refused; E8M0: 0xFF); () where
    it checks none (the integer types, NVFP4, whose UE4M3 bytes are all valid) or the values themselves (F32, F16,
    BF16, F64); None: a type it refuses whole ("invalid type": Q8_1, an intermediate of its dot products)."""
    weight: bool = True
    """A type llama.cpp stores a weight matrix in (the integer types and F64 are not)."""

    @property
    def quantized(self) -> bool:
        return self.block > 1

    def nbytes(self, numel: int) -> int:
        return numel // self.block * self.size


_D = (("d", F16, 0),)
_DM = (*_D, ("m", F16, 2))
_DMIN = (*_D, ("dmin", F16, 2))


def _at(size: int, *names: str) -> tuple[ScaleField, ...]:
    """F16 fields that close a block of `size` bytes (Q2_K's d, dmin after its scales and quants)."""
    return tuple((n, F16, size - 2 * (len(names) - i)) for i, n in enumerate(names))


_Q2K, _Q3K = 2 + 2 + QK_K // 16 + QK_K // 4, 2 + QK_K // 4 + QK_K // 8 + 12
_Q6K, _TQ1 = 2 + QK_K // 2 + QK_K // 4 + QK_K // 16, 2 + 4 * 13
_ROWS: tuple[tuple[int, str, int, int, tuple[ScaleField, ...] | None], ...] = (
    (0, "F32", 1, 4, ()), (1, "F16", 1, 2, ()), (2, "Q4_0", 32, 2 + 16, _D), (3, "Q4_1", 32, 2 + 2 + 16, _DM),
    (6, "Q5_0", 32, 2 + 4 + 16, _D), (7, "Q5_1", 32, 2 + 2 + 4 + 16, _DM), (8, "Q8_0", 32, 2 + 32, _D),
    (9, "Q8_1", 32, 2 + 2 + 32, None),
    (10, "Q2_K", QK_K, _Q2K, _at(_Q2K, "d", "dmin")), (11, "Q3_K", QK_K, _Q3K, _at(_Q3K, "d")),
    (12, "Q4_K", QK_K, 2 + 2 + QK_K // 2 + 12, _DMIN), (13, "Q5_K", QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12, _DMIN),
    (14, "Q6_K", QK_K, _Q6K, _at(_Q6K, "d")), (15, "Q8_K", QK_K, 4 + QK_K + QK_K // 8, (("d", F32, 0),)),
    (16, "IQ2_XXS", QK_K, 2 + QK_K // 4, _D), (17, "IQ2_XS", QK_K, 2 + QK_K // 4 + QK_K // 32, _D),
    (18, "IQ3_XXS", QK_K, 2 + QK_K // 4 + QK_K // 8, _D), (19, "IQ1_S", QK_K, 2 + QK_K // 8 + QK_K // 16, _D),
    (20, "IQ4_NL", 32, 2 + 16, _D), (21, "IQ3_S", QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4, _D),
    (22, "IQ2_S", QK_K, 2 + QK_K // 4 + QK_K // 16, _D), (23, "IQ4_XS", QK_K, 2 + 2 + QK_K // 2 + QK_K // 64, _D),
    (29, "IQ1_M", QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32, (("scales", IQ1_M_F16, QK_K // 8 + QK_K // 16),)),
    (30, "BF16", 1, 2, ()), (34, "TQ1_0", QK_K, _TQ1, _at(_TQ1, "d")), (35, "TQ2_0", QK_K, 2 + 64, _at(2 + 64, "d")),
    (39, "MXFP4", 32, 1 + 16, (("e", E8M0, 0),)), (40, "NVFP4", 64, 4 + 32, ()), (41, "Q1_0", 128, 2 + 16, _D),
    (42, "Q2_0", 64, 2 + 16, _D),
)
_INTEGER_ROWS = ((24, "I8", 1, 1), (25, "I16", 1, 2), (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8))


def _table() -> tuple[Mapping[int, GgmlType], Mapping[str, GgmlType]]:
    by_id: dict[int, GgmlType] = {}
    by_name: dict[str, GgmlType] = {}
    # a type ggml_validate_row_data refuses whole (scales None: Q8_1) is no type a weight loads in
    rows = [GgmlType(*r, weight=GgmlType(*r).scales is not None) for r in _ROWS]
    rows += [GgmlType(*r, weight=False) for r in _INTEGER_ROWS]
    for t in rows:
        if t.id in by_id or t.name in by_name:
            raise ValueError(f"ggml type {t.name} ({t.id}) listed twice")
        by_id[t.id] = by_name[t.name] = t
    return MappingProxyType(by_id), MappingProxyType(by_name)


GGML_TYPES, GGML_BY_NAME = _table()
"""id -> type, name -> type (read-only)."""


def ggml_dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape (numpy order) as gguf.cpp stores it from a ggml tensor: its trailing ne of 1 dropped (ggml_n_dims),
    its leading 1s here. llama.cpp's loader reads the dimensions a file leaves out as 1 (llama-model-loader.cpp
    check_tensor_dims): two shapes equal in this form are one to it."""
    shape = tuple(shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape
