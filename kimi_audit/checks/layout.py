"""Actual tensors against the layout the config implies: presence, dtype, shape, FP8 scales, buffers."""

from __future__ import annotations

from itertools import compress, count, repeat
from operator import itemgetter, ne, or_

import numpy as np

from kimi_audit.format.table import TensorTable
from kimi_audit.findings import Finding, error, warning
from kimi_audit.model.layout import BUFFER, PARAMETER, SCALE, SCALE_SUFFIX, ExpectedTensor

MISMATCH_CODES = {
    PARAMETER: ("DTYPE_MISMATCH", "SHAPE_MISMATCH"),
    SCALE: ("SCALE_DTYPE", "SCALE_SHAPE"),
    BUFFER: ("BUFFER_DTYPE", "BUFFER_SHAPE"),
}


def weight_of_scale(scale_name: str) -> str:
    return scale_name[: -len(SCALE_SUFFIX)] + ".weight"


def scale_of_weight(weight_name: str) -> str:
    return weight_name[: -len(".weight")] + SCALE_SUFFIX


def align(actual: TensorTable, expected: dict[str, ExpectedTensor]) -> list[ExpectedTensor | None]:
    """The expected entry of each actual tensor, row by row (None: the layout lacks it)."""
    return list(map(expected.get, actual.names))


def layout_findings(
    actual: TensorTable, expected: dict[str, ExpectedTensor], aligned: list[ExpectedTensor | None] | None = None
) -> list[Finding]:
    out: list[Finding] = []
    if aligned is None:
        aligned = align(actual, expected)
    # Every actual name expected, and as many of them as expected: then none is missing.
    if len(actual) != len(expected) or None in aligned:
        out.extend(_missing(actual, expected))

    for row in _mismatched_rows(actual, aligned):
        name, shard, e = actual.names[row], actual.shards[row], aligned[row]
        if e is None:
            out.extend(_unexpected(name, actual.dtypes[row], shard, actual, expected))
        else:
            out.extend(mismatch_findings(name, actual.dtypes[row], actual.shapes[row], shard, e))

    out.extend(_scale_shard_findings(actual, expected))
    return out


def mismatch_findings(name: str, dtype: str, shape: tuple[int, ...], shard: str, e: ExpectedTensor) -> list[Finding]:
    """A stored tensor's dtype and shape against its expected entry."""
    out: list[Finding] = []
    dtype_code, shape_code = MISMATCH_CODES[e.kind]
    make = warning if e.kind == BUFFER else error
    what = {PARAMETER: "", SCALE: "scale ", BUFFER: "stored buffer (not a parameter) "}[e.kind]
    if dtype != e.dtype:
        out.append(make(dtype_code, f"{name}: {what}dtype {dtype}, expected {e.dtype}",
                        tensor=name, shard=shard, expected=e.dtype, actual=dtype))
    if shape != e.shape:
        out.append(make(shape_code, f"{name}: {what}shape {list(shape)}, expected {list(e.shape)}",
                        tensor=name, shard=shard, expected=list(e.shape), actual=list(shape)))
    return out


def scale_pair_finding(scale: str, weight: str, scale_shard: str, weight_shard: str | None) -> Finding:
    """A present scale whose weight is absent (None) or in another shard."""
    if weight_shard is None:
        return error("SCALE_ORPHAN", f"{scale}: scale without its weight {weight}", tensor=scale, shard=scale_shard)
    return warning("SCALE_SHARD_SPLIT", f"{scale} is in {scale_shard} but its weight is in "
                   f"{weight_shard}; tools that convert one shard at a time miss it",
                   tensor=scale, shard=scale_shard, expected=weight_shard, actual=scale_shard)


def _mismatched_rows(actual: TensorTable, aligned: list[ExpectedTensor | None]) -> list[int]:
    """Rows whose name, dtype or shape the layout does not expect (on Kimi-K2: the 61 stored buffers)."""
    if None in aligned:
        rows = zip(aligned, actual.dtypes, actual.shapes)
        return [i for i, (e, dtype, shape) in enumerate(rows) if e is None or dtype != e[1] or shape != e[2]]
    dtype_differs = map(ne, map(itemgetter(1), aligned), actual.dtypes)
    shape_differs = map(ne, map(itemgetter(2), aligned), actual.shapes)
    return list(compress(count(), map(or_, dtype_differs, shape_differs)))


def _scale_shard_findings(actual: TensorTable, expected: dict[str, ExpectedTensor]) -> list[Finding]:
    """Each present scale against its weight: the weight present, and in the same shard.

    The expected layout lists every scale right after its weight (layout.expected_layout), so the
    pairs are positions j - 1, j: one lookup per expected tensor and a vector comparison.
    """
    out: list[Finding] = []
    names = list(expected)
    scale_at = np.flatnonzero(np.array(list(map(SCALE.__eq__, map(itemgetter(3), expected.values()))), dtype=bool))
    if not len(scale_at):
        return out
    rows = np.array(list(map(actual.row_of.get, names, repeat(-1))), dtype=np.int64)
    shard_code = {s: i for i, s in enumerate(dict.fromkeys(actual.shards))}
    codes = np.array(list(map(shard_code.__getitem__, actual.shards)) or [0], dtype=np.int64)
    s_rows, w_rows = rows[scale_at], rows[scale_at - 1]
    bad = (s_rows >= 0) & ((w_rows < 0) | (codes[w_rows] != codes[s_rows]))
    for j, w_row, s_row in zip(scale_at[bad].tolist(), w_rows[bad].tolist(), s_rows[bad].tolist()):
        out.append(scale_pair_finding(names[j], names[j - 1], actual.shards[s_row],
                                      None if w_row < 0 else actual.shards[w_row]))
    return out


def _missing(actual: TensorTable, expected: dict[str, ExpectedTensor]) -> list[Finding]:
    out: list[Finding] = []
    located = actual.row_of
    for name, e in expected.items():
        if name in located or e.kind == BUFFER:
            continue
        want = [e.dtype, list(e.shape)]
        if e.kind == SCALE:
            out.append(error("SCALE_MISSING", f"{name}: FP8 weight {weight_of_scale(name)} has no "
                             f"weight_scale_inv (expected {e.dtype} {list(e.shape)})", tensor=name, expected=want))
        else:
            out.append(error("TENSOR_MISSING", f"{name}: expected {e.dtype} {list(e.shape)}, not in any shard",
                             tensor=name, expected=want))
    return out


def _unexpected(
    name: str, dtype: str, shard: str, actual: TensorTable, expected: dict[str, ExpectedTensor]
) -> list[Finding]:
    if name.endswith(SCALE_SUFFIX):
        weight = weight_of_scale(name)
        if weight not in actual:
            return [error("SCALE_ORPHAN", f"{name}: scale without its weight {weight}", tensor=name, shard=shard)]
        return [error("SCALE_UNEXPECTED", f"{name}: {weight} is not an FP8 weight in this layout, yet has a scale",
                      tensor=name, shard=shard)]
    out = [error("TENSOR_UNEXPECTED", f"{name}: {dtype} tensor the config does not account for",
                 tensor=name, shard=shard, actual=dtype)]
    if dtype.startswith("F8_") and name.endswith(".weight"):
        scale = scale_of_weight(name)
        if scale not in actual and scale not in expected:
            out.append(error("SCALE_MISSING", f"{name}: FP8 weight without {scale}", tensor=scale, shard=shard))
    return out
