"""What `verify` does with each tensor of a file (its `TensorPlan`: which check its values get) and where the
file's pieces end: on a tensor's row bands (the 128 rows of its FP8 blocks), whole ggml blocks (a GGUF tensor of
a quantized type: its scales lie inside each block) or elements, so no state crosses a piece but counters.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import NamedTuple

from kimi_audit.constants import DTYPE_BITS
from kimi_audit.format.gguf_types import GGML_BY_NAME
from kimi_audit.model.kinds import INPUT_SCALE, KV_SCALE, SCALE_ROLES
from kimi_audit.model.roles import role_of
from kimi_audit.numerics.scan import SCANNED_FLOATS

CHUNK = 16 << 20
"""Bytes read at a time (a piece may be shorter, to end on a tensor's row band)."""
MAX_UNIT = CHUNK
"""A tensor whose 128-row band is larger than this is scanned without the all-zero block check."""

FP8 = "fp8"
FLOAT = "float"
SCALE = "scale"
ACTIVATION_SCALE = "activation_scale"
"""An input (activation) or KV-cache scale (ModelOpt's and compressed-tensors' `input_scale`, `input_global_scale`,
`k_scale`, `v_scale`): finite and > 0 as a weight's scale, kept out of the weights' scale ranges."""
E8M0_SCALE = "e8m0_scale"
"""DeepSeek-V4's F8_E8M0 scales and compressed-tensors' MXFP4 U8 exponents: 0xFF is NaN."""
FP8_SCALE = "fp8_scale"
"""NVFP4's F8_E4M3 group scales: NaN codes, and scales that are not positive."""
GGML = "ggml"
"""A GGUF tensor of a quantized ggml type: its blocks' scale fields, as llama.cpp's `--check-tensors` reads them."""
SCAN_DTYPES = SCANNED_FLOATS - {"F8_E4M3"}  # (F8_E4M3 weights and scales have kinds of their own)
ACTIVATION_ROLES = frozenset((INPUT_SCALE, KV_SCALE))


class TensorPlan(NamedTuple):
    """What to do with one tensor: its bytes [begin, end) in the file, and which check its values get."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    kind: str | None
    """FP8, FLOAT, SCALE, ACTIVATION_SCALE, E8M0_SCALE, FP8_SCALE, GGML, or None (hashed only: integer and packed
    FP4 tensors, whose every code is a value, and NVFP4 GGUF blocks, whose every byte llama.cpp takes)."""
    block: tuple[int, int] | None = None
    """FP8 2-D weights: the quantization block, for the all-zero block check."""
    cell: tuple[str, int] | None = None
    """FP8 weights and float scales: (layer row, expert index or -1), the grid cell whose weight-health figures
    (CellHealth) the tensor adds to; None: not kept."""


def tensor_kind(name: str, dtype: str, shape: tuple[int, ...]) -> str | None:
    ggml = GGML_BY_NAME.get(dtype)
    if ggml is not None and ggml.quantized:
        return GGML if ggml.scales != () else None
    role = role_of(name)
    scale, activation = role in SCALE_ROLES, role in ACTIVATION_ROLES
    if dtype == "F8_E4M3":
        return FP8_SCALE if scale or activation else FP8
    if dtype == "F8_E8M0" or (dtype == "U8" and scale):
        return E8M0_SCALE
    if dtype not in SCAN_DTYPES:
        return None
    return SCALE if scale else ACTIVATION_SCALE if activation else FLOAT


def unit_of(t: TensorPlan) -> int:
    """The piece boundaries inside `t` fall on multiples of this (bytes from its start): an FP8 weight's
    band of block rows (when it is at most MAX_UNIT: the all-zero block check needs whole bands), a ggml block,
    else an element."""
    if t.kind == FP8 and t.block is not None and len(t.shape) == 2 and t.block[0] * t.shape[1] <= MAX_UNIT:
        return t.block[0] * t.shape[1]
    if t.kind == GGML:
        return GGML_BY_NAME[t.dtype].size
    return max(DTYPE_BITS.get(t.dtype, 8) // 8, 1)


def block_checked(t: TensorPlan) -> bool:
    return t.kind == FP8 and unit_of(t) > 1


def plan_pieces(size: int, tensors: tuple[TensorPlan, ...], chunk: int) -> Iterator[tuple[int, int]]:
    """[start, end) pieces covering the file, at most `chunk` long unless one tensor unit is longer."""
    begins = [t.begin for t in tensors]
    pos = 0
    while pos < size:
        end = min(pos + chunk, size)
        k = bisect.bisect_left(begins, end) - 1  # the last tensor starting before `end`
        if k >= 0 and tensors[k].begin < end < tensors[k].end:
            t = tensors[k]
            unit = unit_of(t)
            cut = t.begin + (end - t.begin) // unit * unit
            if cut > pos:
                end = cut
            elif t.begin > pos:
                end = t.begin
            else:  # a chunk shorter than one unit: one unit
                end = min(t.end, pos + unit)
        yield pos, end
        pos = end
