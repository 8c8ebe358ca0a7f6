"""Actual tensors against the layout the config implies: presence, dtype, shape, FP8 scales, buffers."""

from __future__ import annotations

from kimi_audit.checks.tensors import TensorTable
from kimi_audit.findings import Finding, error, warning
from kimi_audit.layout import BUFFER, PARAMETER, SCALE, SCALE_SUFFIX, ExpectedTensor

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

    # One pass at builtin speed picks out what needs a closer look; on a sound checkpoint, nothing.
    rows = zip(aligned, actual.dtypes, actual.shapes)
    for row in [i for i, (e, dtype, shape) in enumerate(rows) if e is None or dtype != e[1] or shape != e[2]]:
        name, t, shard, e = actual.names[row], actual.info(row), actual.shards[row], aligned[row]
        if e is None:
            out.extend(_unexpected(name, t.dtype, shard, actual, expected))
            continue
        dtype_code, shape_code = MISMATCH_CODES[e.kind]
        make = warning if e.kind == BUFFER else error
        what = {PARAMETER: "", SCALE: "scale ", BUFFER: "stored buffer (not a parameter) "}[e.kind]
        if t.dtype != e.dtype:
            out.append(make(dtype_code, f"{name}: {what}dtype {t.dtype}, expected {e.dtype}",
                            tensor=name, shard=shard, expected=e.dtype, actual=t.dtype))
        if t.shape != e.shape:
            out.append(make(shape_code, f"{name}: {what}shape {list(t.shape)}, expected {list(e.shape)}",
                            tensor=name, shard=shard, expected=list(e.shape), actual=list(t.shape)))

    weights, scales = scale_pairs(expected)
    row_of, shards = actual.row_of.get, actual.shards
    found = zip(map(row_of, weights), map(row_of, scales))
    for i in [i for i, (w, s) in enumerate(found) if s is not None and (w is None or shards[w] != shards[s])]:
        weight, name = weights[i], scales[i]
        w_row, s = row_of(weight), shards[row_of(name)]
        w = None if w_row is None else shards[w_row]
        if w is None:
            out.append(error("SCALE_ORPHAN", f"{name}: scale without its weight {weight}", tensor=name, shard=s))
        else:
            out.append(warning("SCALE_SHARD_SPLIT", f"{name} is in {s} but its weight is in "
                               f"{w}; tools that convert one shard at a time miss it",
                               tensor=name, shard=s, expected=w, actual=s))
    return out


def scale_pairs(expected: dict[str, ExpectedTensor]) -> tuple[list[str], list[str]]:
    """(weights, scales): each expected scale and the weight it belongs to, in layout order."""
    scales = [n for n, e in expected.items() if e[3] == SCALE]
    cut = len(SCALE_SUFFIX)
    return [n[:-cut] + ".weight" for n in scales], scales


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
