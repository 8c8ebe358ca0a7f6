"""Strict safetensors header reader.

A shard is `u64 little-endian N` + `N bytes of UTF-8 JSON` + the data buffer. This module parses the
first two parts and validates them against the format's rules, reporting each violation as a Finding.
It never reads tensor data: `read_shard_header` issues at most two range reads, both within the header.

The parser is pure (`parse_shard_prefix`), so the same code serves local files, Hub range reads and
the fuzz tests. Headers in the canonical form safetensors writes are read by one regex pass
(`_canonical_header`); every other header goes through json.loads and the per-entry rules, which name
each violation. Both give the same result on any input the fast path accepts (tests/test_format_canonical.py).
"""

from __future__ import annotations

import json
import math
import re
import sys
from itertools import chain, repeat
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from kimi_audit.constants import DTYPE_BITS, HEADER_LENGTH_BYTES, MAX_HEADER_BYTES
from kimi_audit.format.jsondup import duplicate_keys
from kimi_audit.findings import Finding, Severity, error, warning
from kimi_audit.sources.base import Source

U64_MAX = 2**64 - 1
I64_MAX = 2**63 - 1
ENTRY_FIELDS = frozenset(("dtype", "shape", "data_offsets"))
CANONICAL_DTYPE = {d: d for d in DTYPE_BITS}
JSON_WHITESPACE = " \t\n\r"
# What the reference reader (serde_json) refuses that Python's json module accepts, in values it
# otherwise ignores (extra entry fields): nesting of 128 containers or more, numbers outside f64.
MAX_JSON_DEPTH = 127
F64_MAX_INT = int(sys.float_info.max)
FAST_MAX_DIMS = 8

# The canonical form safetensors writes: no whitespace, no escapes, `__metadata__` first, every entry
# `"name":{"dtype":"D","shape":[..],"data_offsets":[b,e]}` in that order. No backslash means every `"`
# delimits a string, so these patterns can only match structure. Digit runs are matched loosely (it
# is faster) and their JSON syntax checked afterwards by json.loads.
_STR = r'"([^"\\\x00-\x1f]*)"'
_CANONICAL_ENTRY = re.compile(  # groups: name, `DTYPE","shape":[DIMS` (a few hundred distinct), offsets
    _STR + r':\{"dtype":"([0-9A-Z_]+","shape":\[[0-9,]*)\],"data_offsets":\[([0-9]+,[0-9]+)\]\},'
)
_DTYPE_SHAPE_SEP = '","shape":['
_PAIR = r'"[^"\\\x00-\x1f]*":"[^"\\\x00-\x1f]*"'
_CANONICAL_METADATA = re.compile(r'\{"__metadata__":(\{(?:%s(?:,%s)*)?\})([,}])' % (_PAIR, _PAIR))
_ENTRY_PUNCTUATION = len('"":{"dtype":"],"data_offsets":[]},')


class TensorInfo(NamedTuple):
    """One tensor entry of a header. Offsets are relative to the data buffer (byte 8 + N)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class TensorColumns(NamedTuple):
    """A header's valid entries as parallel columns (how the parser validates them)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    """Equal shapes are one shared tuple where the reader could share them (the canonical path)."""
    begins: list[int]
    ends: list[int]

    @staticmethod
    def of(infos: list[TensorInfo]) -> "TensorColumns":
        return TensorColumns(*(list(col) for col in zip(*infos))) if infos else EMPTY_COLUMNS


EMPTY_COLUMNS = TensorColumns([], [], [], [], [])


@dataclass(frozen=True)
class ShardHeader:
    shard: str
    file_size: int
    header_len: int | None
    """N from the length prefix, or None when the file is too short to hold one."""
    metadata: dict[str, str] | None = None
    columns: TensorColumns = EMPTY_COLUMNS
    findings: tuple[Finding, ...] = ()

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        c = self.columns
        rows = zip(c.names, c.dtypes, c.shapes, c.begins, c.ends)
        return dict(zip(c.names, map(tuple.__new__, repeat(TensorInfo), rows)))

    @property
    def tensor_count(self) -> int:
        return len(self.columns.names)

    @property
    def data_start(self) -> int:
        return HEADER_LENGTH_BYTES + (self.header_len or 0)

    @property
    def ok(self) -> bool:
        return not any(f.severity is Severity.ERROR for f in self.findings)

    @property
    def payload_bytes(self) -> int:
        return sum(self.columns.ends) - sum(self.columns.begins)


def header_length(prefix: bytes) -> int | None:
    if len(prefix) < HEADER_LENGTH_BYTES:
        return None
    return int.from_bytes(prefix[:HEADER_LENGTH_BYTES], "little")


def read_shard_header(source: Source, shard: str, first_read: int = 1 << 16) -> ShardHeader:
    """Fetch and parse one shard's header: one read of `first_read` bytes, a second only if short."""
    first = source.read_range(shard, 0, max(first_read, HEADER_LENGTH_BYTES))
    data = first.data
    n = header_length(data)
    if n is not None and n <= MAX_HEADER_BYTES:
        need = HEADER_LENGTH_BYTES + n
        if len(data) < need <= first.file_size:
            rest = source.read_range(shard, len(data), need - len(data))
            data += rest.data
    return parse_shard_prefix(data, shard=shard, file_size=first.file_size)


def parse_shard_prefix(prefix: bytes, *, shard: str, file_size: int) -> ShardHeader:
    """Parse the leading bytes of a shard (at least 8 + N of them when the file has them)."""
    n = header_length(prefix)

    def fail(code: str, message: str, header_len: int | None = n, **kw: Any) -> ShardHeader:
        return ShardHeader(shard, file_size, header_len, findings=(error(code, message, shard=shard, **kw),))

    if n is None or file_size < HEADER_LENGTH_BYTES:
        return fail("HEADER_TOO_SHORT", f"file is {file_size} bytes, too short for the 8-byte header length", None)
    if n > MAX_HEADER_BYTES:
        return fail("HEADER_TOO_LARGE", f"header length {n:,} exceeds the {MAX_HEADER_BYTES:,}-byte limit",
                    expected=MAX_HEADER_BYTES, actual=n)
    if HEADER_LENGTH_BYTES + n > file_size:
        return fail("HEADER_PAST_EOF", f"header length {n:,} runs past the end of the {file_size:,}-byte file",
                    expected=file_size - HEADER_LENGTH_BYTES, actual=n)
    if len(prefix) < HEADER_LENGTH_BYTES + n:
        return fail("HEADER_SHORT_READ", f"only {len(prefix) - 8:,} of {n:,} header bytes could be read")
    return parse_header_json(prefix[HEADER_LENGTH_BYTES:HEADER_LENGTH_BYTES + n], shard=shard, file_size=file_size)


def parse_header_json(raw: bytes, *, shard: str, file_size: int) -> ShardHeader:
    """Validate the N header bytes. `file_size` is the whole shard's size, for the data extent rules."""
    n = len(raw)
    findings: list[Finding] = []

    def fail(code: str, message: str) -> ShardHeader:
        findings.append(error(code, message, shard=shard))
        return ShardHeader(shard, file_size, n, findings=tuple(findings))

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return fail("HEADER_NOT_UTF8", f"header is not valid UTF-8 at byte {e.start}")
    body = text.rstrip(" ")
    if body[:1] in tuple(JSON_WHITESPACE):
        findings.append(warning("HEADER_LEADING_WHITESPACE", "header JSON starts with whitespace", shard=shard))
    if body[-1:] in tuple(JSON_WHITESPACE):
        findings.append(warning("HEADER_TRAILING_WHITESPACE",
                                "header padding holds whitespace other than spaces", shard=shard))
    canonical = _canonical_header(body)
    if canonical is not None:
        metadata, columns = canonical
        findings.extend(_extent_findings(columns, shard, n, file_size))
        return ShardHeader(shard, file_size, n, metadata, columns, tuple(findings))
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
    findings.extend(_extent_findings(columns, shard, n, file_size))
    return ShardHeader(shard, file_size, n, metadata, columns, tuple(findings))


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

    Every step runs inside builtins or numpy, which is what makes a 140k-tensor checkpoint cost
    about as much to validate as to json.loads.
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
    dims = list(chain.from_iterable(shapes))
    flat = list(chain.from_iterable(offs))
    if not set(map(type, flat)) <= {int} or not set(map(type, dims)) <= {int}:
        return None
    return _sound_columns(names, dts, list(map(tuple, shapes)), dims, flat[0::2], flat[1::2])


def _sound_columns(names: list[str], dts: list[str], shapes: list[tuple[int, ...]], dims: list[int],
                   begins: list[int], ends: list[int], numels: list[int] | None = None) -> TensorColumns | None:
    """The numeric rules, for all entries at once (known: known dtypes, lists of ints, shapes of at
    most FAST_MAX_DIMS dims); None when any entry needs the slow path's closer look."""
    if dims and (min(dims) < 0 or max(dims) > I64_MAX):
        return None
    if min(min(begins), min(ends)) < 0 or max(max(begins), max(ends)) > I64_MAX >> 3:
        return None
    if numels is None:
        numels = list(map(math.prod, shapes))
    # int64 arithmetic below: numel x bits (<= 64) and (end - begin) x 8 must not wrap around.
    # A zero-element tensor goes slow too: the overflow rule applies to the running product.
    if max(numels) > I64_MAX >> 6 or min(numels) == 0:
        return None
    b = np.array(begins, dtype=np.int64)
    e = np.array(ends, dtype=np.int64)
    bits = np.array(list(map(DTYPE_BITS.__getitem__, dts)), dtype=np.int64)
    nbits = np.array(numels, dtype=np.int64) * bits
    if not ((e >= b).all() and ((e - b) * 8 == nbits).all()):
        return None
    dts = list(map(CANONICAL_DTYPE.__getitem__, dts))  # one shared str per dtype, not one per tensor
    return TensorColumns(names, dts, shapes, begins, ends)


def _canonical_header(body: str) -> tuple[dict[str, str] | None, TensorColumns] | None:
    """Metadata and columns of a header in the canonical form, read by one regex pass instead of
    building the JSON object tree; None when the header is in any other form or needs a closer look
    (the JSON path then decides, and names every violation)."""
    if "\\" in body or body[:1] != "{" or body[-1:] != "}":
        return None
    metadata = None
    start = 1
    m = _CANONICAL_METADATA.match(body)
    if m is not None:
        metadata = json.loads(m.group(1))
        if len(metadata) != m.group(1).count('":"'):  # a duplicate metadata key
            return None
        if m.group(2) == "}":
            return (metadata, EMPTY_COLUMNS) if m.end() == len(body) else None
        start = m.end()
    elif body == "{}":
        return None, EMPTY_COLUMNS
    # Every entry then ends in a comma (the last one's is added), so that one pattern matches them all.
    entries = body[start:-1] + ","
    rows = _CANONICAL_ENTRY.findall(entries)
    if not rows:
        return None
    names_t, dtype_shapes, offset_texts = zip(*rows)
    names = list(names_t)
    n = len(rows)
    # findall skips what it cannot match: the matches tile the entries only if their lengths add up.
    lengths = sum(len("".join(col)) for col in (names_t, dtype_shapes, offset_texts))
    if n * _ENTRY_PUNCTUATION + lengths != len(entries):
        return None
    unique = set(names)
    if len(unique) != n or "__metadata__" in unique:
        return None
    # A checkpoint repeats a few hundred (dtype, shape) pairs: read each once, share one tuple per shape.
    distinct = list(set(dtype_shapes))
    dtypes, shape_texts = zip(*(k.split(_DTYPE_SHAPE_SEP) for k in distinct))
    if not set(dtypes) <= DTYPE_BITS.keys():
        return None
    try:
        parsed = [tuple(dims) for dims in json.loads("[[" + "],[".join(shape_texts) + "]]")]
        offsets = json.loads("[" + ",".join(offset_texts) + "]")
    except ValueError:  # `1,,2`, a leading zero, thousands of digits: the JSON path names it
        return None
    if max(map(len, parsed)) > FAST_MAX_DIMS:
        return None
    dtype_of = dict(zip(distinct, map(CANONICAL_DTYPE.__getitem__, dtypes)))
    shape_of = dict(zip(distinct, parsed))
    numel_of = dict(zip(distinct, map(math.prod, parsed)))
    dts = list(map(dtype_of.__getitem__, dtype_shapes))
    shapes = list(map(shape_of.__getitem__, dtype_shapes))
    numels = list(map(numel_of.__getitem__, dtype_shapes))
    dims = list(chain.from_iterable(parsed))
    columns = _sound_columns(names, dts, shapes, dims, offsets[0::2], offsets[1::2], numels)
    return None if columns is None else (metadata, columns)


def _check_entry(name: str, e: Any, shard: str, findings: list[Finding]) -> TensorInfo | None:
    """The slow path: say exactly what is wrong with one entry. Returns it if usable for offsets."""

    def bad(code: str, message: str, **kw: Any) -> None:
        findings.append(error(code, f"{_label(name)}: {message}", tensor=name, shard=shard, **kw))

    if type(e) is not dict:
        bad("TENSOR_ENTRY_INVALID", f"entry is a {type(e).__name__}, not an object")
        return None
    missing = sorted(ENTRY_FIELDS - e.keys())
    if missing:
        bad("TENSOR_ENTRY_INVALID", f"entry lacks {', '.join(missing)}")
        return None
    extra = sorted(e.keys() - ENTRY_FIELDS)
    if extra:
        findings.append(warning("TENSOR_EXTRA_FIELD", f"{_label(name)}: entry has fields outside the schema: "
                                f"{_label(', '.join(extra))}", tensor=name, shard=shard))
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
        bad("DTYPE_UNKNOWN", f"unknown dtype {dt!r}", actual=dt)
        usable = False
    if type(shape) is not list or not all(type(d) is int and 0 <= d <= U64_MAX for d in shape):
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
        if nbits > U64_MAX:
            bad("SHAPE_INVALID", f"shape {_short(shape)} overflows a 64-bit size", actual=_short(shape))
        elif nbits % 8:
            bad("SIZE_MISMATCH", f"{numel} x {bits} bits is not a whole number of bytes", actual=_short(shape))
        elif nbits // 8 != end - begin:
            bad("SIZE_MISMATCH", f"{dt} {_short(shape)} needs {nbits // 8:,} bytes, data_offsets span {end - begin:,}",
                expected=nbits // 8, actual=end - begin)
        return TensorInfo(name, dt, tuple(shape), begin, end)
    # Extent still validated, so one bad dtype doesn't also read as a gap in the buffer.
    return TensorInfo(name, str(dt), (), begin, end)


def _label(name: str, limit: int = 200) -> str:
    """A tensor name fit for a one-line message: as is when printable and short, else escaped and cut."""
    if len(name) <= limit and name.isprintable():
        return name
    return repr(name[:limit])[1:-1] + ("..." if len(name) > limit else "")


def _short(v: Any, limit: int = 80) -> Any:
    if type(v) in (list, dict, str) and len(v) > limit:  # never repr a huge value whole
        r = repr(v[:limit] if type(v) is not dict else dict(list(v.items())[:8]))
        return r[:limit] + "..."
    r = repr(v)
    return v if len(r) <= limit else r[:limit] + "..."


def _extent_findings(columns: TensorColumns, shard: str, n: int, file_size: int) -> list[Finding]:
    """Offsets must tile the data buffer exactly: from 0, no gaps, no overlaps, to the end of the file."""
    out: list[Finding] = []
    begins, ends = columns.begins, columns.ends
    if begins and (begins[0] != 0 or begins[1:] != ends[:-1]):
        pos = 0
        for begin, end, name in sorted(zip(begins, ends, columns.names)):
            if begin < pos:
                out.append(error("OFFSETS_OVERLAP", f"{_label(name)}: data [{begin}, {end}) overlaps bytes before {pos}",
                                 tensor=name, shard=shard, expected=pos, actual=begin))
            elif begin > pos:
                out.append(error("OFFSETS_GAP", f"{_label(name)}: data starts at {begin}, leaving {begin - pos:,} unused "
                                 f"bytes after {pos}", tensor=name, shard=shard, expected=pos, actual=begin))
            pos = max(pos, end)
    else:
        pos = ends[-1] if ends else 0
    data_end = HEADER_LENGTH_BYTES + n + pos
    if data_end > file_size:
        out.append(error("DATA_PAST_EOF", f"tensor data ends at byte {data_end:,}, past the end of the "
                         f"{file_size:,}-byte file", shard=shard, expected=file_size, actual=data_end))
    elif data_end < file_size:
        out.append(error("TRAILING_BYTES", f"{file_size - data_end:,} bytes follow the last tensor",
                         shard=shard, expected=data_end, actual=file_size))
    return out


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
