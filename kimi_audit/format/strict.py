"""The strict header path: json.loads and the per-entry rules, which name every violation.

header.py sends here every header the typed msgspec decoding (decode.py) does not carry: anything
malformed, escaped, duplicated, out of range or outside the schema. `strict_header` parses the JSON
text, mirrors what the reference reader (serde_json) refuses that Python accepts, checks the metadata
and each entry, and proves (or looks for) duplicate keys. Each violation becomes a named Finding.
"""

from __future__ import annotations

import json
import math
import sys
from itertools import chain
from typing import Any

from kimi_audit.constants import DTYPE_BITS
from kimi_audit.findings import Finding, error, warning
from kimi_audit.format.columns import (
    EMPTY_COLUMNS,
    FAST_MAX_DIMS,
    MAX_DIMS,
    U64_MAX,
    TensorColumns,
    TensorInfo,
    label,
    sound_columns,
)
from kimi_audit.format.jsondup import duplicate_keys

ENTRY_FIELDS = frozenset(("dtype", "shape", "data_offsets"))
CANONICAL_DTYPE = {d: d for d in DTYPE_BITS}
# What the reference reader (serde_json) refuses that Python's json module accepts, in values it
# otherwise ignores (extra entry fields): nesting of 128 containers or more, numbers outside f64.
MAX_JSON_DEPTH = 127
F64_MAX_INT = int(sys.float_info.max)

Parsed = tuple[dict[str, str] | None, TensorColumns]


def strict_header(body: str, shard: str, findings: list[Finding]) -> Parsed | None:
    """Metadata and usable columns of the header text `body` (trailing spaces stripped), each violation
    appended to `findings`; None when the header as a whole is unusable (its finding appended)."""

    def fail(code: str, message: str) -> Parsed | None:  # None: nothing of the header is usable
        findings.append(error(code, message, shard=shard))
        return None

    # serde_json reads `-0` as the float -0.0 (not an integer): mirror that, so `shape: [-0]` is refused.
    # (One-character scans first: they run at memchr speed, a two-character one costs 15x more.)
    ints: dict[str, Any] = {"parse_int": _int_literal} if "-" in body and "-0" in body else {}
    try:
        obj = json.loads(body, parse_constant=_reject_constant, **ints)
    except json.JSONDecodeError as e:
        return fail("HEADER_INVALID_JSON", f"header is not valid JSON: {e.msg} at character {e.pos}")
    except RecursionError:
        return fail("HEADER_INVALID_JSON", "header JSON is nested too deeply")
    except ValueError as e:  # NaN/Infinity literals, integers with too many digits
        return fail("HEADER_INVALID_JSON", f"header is not valid JSON: {e}")
    if type(obj) is not dict:
        return fail("HEADER_NOT_OBJECT", f"header JSON is a {type(obj).__name__}, not an object")
    escapes = "\\" in body and "\\u" in body
    if escapes:  # Python decodes a lone UTF-16 surrogate escape (\ud800); it is not Unicode, and serde refuses it
        problem = _json_problem(obj, 0, strings=True)
        if problem:
            return fail("HEADER_INVALID_JSON", f"header is not valid JSON: {problem}")

    metadata = obj.get("__metadata__")
    pairs = len(obj)
    # Colons inside the names and metadata strings, so that the colon count below proves no duplicates.
    string_colons = "".join(obj).count(":")
    if type(metadata) is dict:
        pairs += len(metadata)
        string_colons += "".join(metadata).count(":")
        string_colons += "".join(v for v in metadata.values() if type(v) is str).count(":")
        if not all(type(k) is str and type(v) is str for k, v in metadata.items()):
            findings.append(error("METADATA_INVALID", "__metadata__ must map strings to strings", shard=shard))
            metadata = None
    elif metadata is not None:
        findings.append(error("METADATA_INVALID",
                              f"__metadata__ is a {type(metadata).__name__}, not a string map", shard=shard))
        metadata = None

    columns, entry_pairs = _tensor_entries(obj, shard, findings)
    if escapes or body.count(":") != pairs + entry_pairs + string_colons:
        # Cheap proof of no duplicate keys failed (colons also occur in other strings, or escaped): look properly.
        findings.extend(_duplicate_key_findings(body, shard))
    return metadata, columns


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


def _int_literal(text: str) -> Any:
    return -0.0 if text == "-0" else int(text)


def _json_problem(value: Any, depth: int, *, strings: bool = False, limits: bool = False) -> str | None:
    """What the reference reader would refuse in a parsed JSON value (iterative: no recursion limit).

    `strings`: a lone surrogate in any key or string. `limits`: `depth` (containers around `value`)
    reaching 128, or a number beyond the f64 range.
    """
    stack = [(value, depth)]
    while stack:
        v, d = stack.pop()
        t = type(v)
        if t is dict or t is list:
            if limits and d + 1 > MAX_JSON_DEPTH:
                return f"nested more than {MAX_JSON_DEPTH} levels deep"
            if t is dict:
                if strings:
                    for k in v:
                        if not k.isascii() and _lone_surrogate(k):
                            return f"lone UTF-16 surrogate in key {k.encode('utf-8', 'backslashreplace')[:80]!r}"
                stack.extend((x, d + 1) for x in v.values())
            else:
                stack.extend((x, d + 1) for x in v)
        elif t is str:
            if strings and not v.isascii() and _lone_surrogate(v):
                return f"lone UTF-16 surrogate in string {v.encode('utf-8', 'backslashreplace')[:80]!r}"
        elif limits and t is float:
            # serde_json's decimal conversion overflows on some spellings of numbers that round to
            # f64::MAX (and accepts others); Python sees one float for all: refuse them all.
            if math.isinf(v) or abs(v) >= sys.float_info.max:
                return "a number is out of the 64-bit float range (or rounds to its largest value)"
        elif limits and t is int and abs(v) >= F64_MAX_INT:
            return "a number is out of the 64-bit float range"
    return None


def _lone_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _tensor_entries(obj: dict[str, Any], shard: str, findings: list[Finding]) -> tuple[TensorColumns, int]:
    """Check every tensor entry; returns the usable ones and the number of key/value pairs they hold."""
    names = [k for k in obj if k != "__metadata__"]
    entries = [obj[k] for k in names]
    fast = _fast_entries(names, entries)
    if fast is not None:
        return fast, 3 * len(names)
    infos = []
    pairs = 0
    for name, e in zip(names, entries):
        if type(e) is dict:
            pairs += len(e)
        entry = _check_entry(name, e, shard, findings)
        if entry is not None:
            infos.append(entry)
    return TensorColumns.of(infos), pairs


def _fast_entries(names: list[str], entries: list[Any]) -> TensorColumns | None:
    """Validate all entries at once, column by column; None as soon as any entry needs a closer look.

    Every step runs inside builtins, which is what makes a 140k-tensor checkpoint cost about as much
    to validate as to json.loads.
    """
    if not entries:
        return EMPTY_COLUMNS
    if set(map(type, entries)) != {dict} or set(map(len, entries)) != {3}:
        return None
    try:
        dts = [e["dtype"] for e in entries]
        shapes = [e["shape"] for e in entries]
        offs = [e["data_offsets"] for e in entries]
    except KeyError:
        return None
    if set(map(type, dts)) != {str} or not set(dts) <= DTYPE_BITS.keys():
        return None
    if set(map(type, shapes)) != {list} or set(map(type, offs)) != {list} or set(map(len, offs)) != {2}:
        return None
    if max(map(len, shapes)) > FAST_MAX_DIMS:  # bounds math.prod's work: a million-dim shape goes slow
        return None
    flat = list(chain.from_iterable(offs))
    if not set(map(type, flat)) <= {int} or not set(map(type, chain.from_iterable(shapes))) <= {int}:
        return None
    dts = list(map(CANONICAL_DTYPE.__getitem__, dts))  # one shared str per dtype, not one per tensor
    return sound_columns(names, dts, list(map(tuple, shapes)), flat[0::2], flat[1::2])


def _check_entry(name: str, e: Any, shard: str, findings: list[Finding]) -> TensorInfo | None:
    """The slow path: say exactly what is wrong with one entry. Returns it if usable for offsets."""

    def bad(code: str, message: str, **kw: Any) -> None:
        findings.append(error(code, f"{label(name)}: {message}", tensor=name, shard=shard, **kw))

    if type(e) is not dict:
        bad("TENSOR_ENTRY_INVALID", f"entry is a {type(e).__name__}, not an object")
        return None
    missing = sorted(ENTRY_FIELDS - e.keys())
    if missing:
        bad("TENSOR_ENTRY_INVALID", f"entry lacks {', '.join(missing)}")
        return None
    extra = sorted(e.keys() - ENTRY_FIELDS)
    if extra:
        findings.append(warning("TENSOR_EXTRA_FIELD", f"{label(name)}: entry has fields outside the schema: "
                                f"{label(', '.join(extra))}", tensor=name, shard=shard))
        # Ignored by readers, but still parsed: the reference reader refuses what it cannot represent.
        for k in extra:
            problem = _json_problem(e[k], 2, limits=True)
            if problem:
                bad("HEADER_INVALID_JSON", f"field {k[:80]!r}: {problem}")
                break
    dt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
    usable = True
    bits = DTYPE_BITS.get(dt) if type(dt) is str else None
    if bits is None:
        bad("DTYPE_UNKNOWN", f"unknown dtype {_short(dt)!r}", actual=_short(dt))
        usable = False
    if type(shape) is list and len(shape) > MAX_DIMS:
        bad("SHAPE_INVALID", f"shape has {len(shape):,} dims, more than {MAX_DIMS} (numpy's limit)",
            actual=len(shape))
        usable = False
    elif type(shape) is not list or not all(type(d) is int and 0 <= d <= U64_MAX for d in shape):
        bad("SHAPE_INVALID", f"shape {_short(shape)!r} is not a list of non-negative integers", actual=_short(shape))
        usable = False
    if not (type(offs) is list and len(offs) == 2 and all(type(o) is int for o in offs)):
        bad("OFFSETS_INVALID", f"data_offsets {_short(offs)!r} is not [begin, end]", actual=_short(offs))
        return None
    begin, end = offs
    if not 0 <= begin <= end <= U64_MAX:
        bad("OFFSETS_INVALID", f"data_offsets [{begin}, {end}] must satisfy 0 <= begin <= end < 2^64",
            actual=[begin, end])
        return None
    if usable:
        assert bits is not None and isinstance(shape, list)
        numel = 1
        for dim in shape:  # the running product must fit in 64 bits, as the reference reader checks it
            numel *= dim
            if numel > U64_MAX:
                break
        nbits = numel * bits
        if nbits > U64_MAX:  # the shape is not kept: no size computed from it downstream
            bad("SHAPE_INVALID", f"shape {_short(shape)} overflows a 64-bit size", actual=_short(shape))
            return TensorInfo(name, dt, (), begin, end)
        if nbits % 8:
            bad("SIZE_MISMATCH", f"{numel} x {bits} bits is not a whole number of bytes", actual=_short(shape))
        elif nbits // 8 != end - begin:
            bad("SIZE_MISMATCH", f"{dt} {_short(shape)} needs {nbits // 8:,} bytes, data_offsets span {end - begin:,}",
                expected=nbits // 8, actual=end - begin)
        return TensorInfo(name, dt, tuple(shape), begin, end)
    # Extent still validated, so one bad dtype doesn't also read as a gap in the buffer. (Its dtype cut
    # short: a 1 MB dtype string is not repeated in every table that groups tensors by dtype.)
    return TensorInfo(name, label(str(_short(dt)), 40), (), begin, end)


def _short(v: Any, limit: int = 80) -> Any:
    if type(v) in (list, dict, str) and len(v) > limit:  # never repr a huge value whole
        r = repr(v[:limit] if type(v) is not dict else dict(list(v.items())[:8]))
        return r[:limit] + "..."
    r = repr(v)
    return v if len(r) <= limit else r[:limit] + "..."


def _duplicate_key_findings(body: str, shard: str) -> list[Finding]:
    try:
        dups = duplicate_keys(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # parsed once already; only a deeper stack could make this fail
        return [error("HEADER_INVALID_JSON", "header JSON is nested too deeply to check for duplicate keys",
                      shard=shard)]
    return [
        error("HEADER_DUPLICATE_KEY", f"key {k[:200]!r} appears more than once (most readers keep the last silently)",
              tensor=k, shard=shard)
        for k in dups
    ]
