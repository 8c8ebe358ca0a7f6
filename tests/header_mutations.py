"""Generators of valid safetensors files and of hostile mutations of them, by class.

Shared by the fuzz tests (tests/test_fuzz_format.py), the differential test against the safetensors
library (tests/test_differential.py) and bench/fuzz_report.py. Everything is driven by a
`random.Random`, so an input is reproducible from (class, seed): `generate(cls, seed)`.

A header is built as JSON *text* (`dumps`), not through `json.dumps` of a dict, so that a mutation can
repeat keys (`Obj` keeps pairs), splice literal JSON (`Raw`: NaN, 1e400, -0, deep nesting) and, at
the byte level, break the UTF-8 of a name.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kimi_audit.constants import DTYPE_BITS

DTYPES = sorted(DTYPE_BITS)
NAMES = [
    "model.embed_tokens.weight", "model.layers.0.self_attn.q_a_layernorm.weight", "lm_head.weight",
    "a", "b", "x:y", "colon:in:name", "ü-name", "名字", "", " ", "__meta", "t.0", "t.1", "t.2", "e\u0000nul",
    "quote\"d", "back\\slash", "emoji\U0001F600", "weight_scale_inv",
]


class Obj:
    """A JSON object as ordered pairs: keys may repeat."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = list(pairs)


class Raw:
    """Literal JSON text, spliced as is."""

    def __init__(self, text: str) -> None:
        self.text = text


class RawKey(str):
    """A key written as is (escapes, surrogates), without json.dumps quoting."""


def dumps(v: Any) -> str:
    if isinstance(v, Obj):
        return "{" + ",".join(_key(k) + ":" + dumps(x) for k, x in v.pairs) + "}"
    if isinstance(v, Raw):
        return v.text
    if isinstance(v, list):
        return "[" + ",".join(dumps(x) for x in v) + "]"
    if isinstance(v, dict):
        return dumps(Obj(list(v.items())))
    return json.dumps(v, ensure_ascii=False)


def _key(k: str) -> str:
    return k if isinstance(k, RawKey) else json.dumps(k, ensure_ascii=False)


@dataclass
class Spec:
    """A safetensors file before serialization: edit freely, then `to_bytes`."""

    entries: list[list[Any]] = field(default_factory=list)  # [name, Obj-or-value]
    metadata: Any = None  # None: no __metadata__ key at all
    has_metadata: bool = False
    data_len: int = 0
    pad: str = ""  # appended to the JSON text (valid padding is spaces)
    lead: str = ""  # prepended to the JSON text

    def header_text(self) -> str:
        pairs: list[tuple[str, Any]] = []
        if self.has_metadata:
            pairs.append(("__metadata__", self.metadata))
        pairs.extend((n, v) for n, v in self.entries)
        return self.lead + dumps(Obj(pairs)) + self.pad

    def to_bytes(self, header: bytes | None = None) -> bytes:
        raw = self.header_text().encode("utf-8", "surrogatepass") if header is None else header
        return struct.pack("<Q", len(raw)) + raw + b"\0" * self.data_len


def entry(dtype: Any, shape: Any, begin: Any, end: Any) -> Obj:
    return Obj([("dtype", dtype), ("shape", shape), ("data_offsets", [begin, end])])


def _random_shape(rng: random.Random, bits: int) -> list[int]:
    for _ in range(20):
        ndim = rng.choice([0, 1, 1, 2, 2, 3])
        shape = [rng.choice([1, 2, 3, 4, 5, 8, 16]) if rng.random() > 0.05 else 0 for _ in range(ndim)]
        numel = 1
        for d in shape:
            numel *= d
        if numel * bits % 8 == 0:
            return shape
    return [8]


def valid_spec(rng: random.Random, max_tensors: int = 6) -> Spec:
    """A well-formed file: contiguous offsets (in a random order in the JSON), right sizes, no trailing bytes."""
    n = rng.randint(0, max_tensors)
    names = rng.sample(NAMES, n)
    sized = []
    for name in names:
        dtype = rng.choice(DTYPES)
        shape = _random_shape(rng, DTYPE_BITS[dtype])
        numel = 1
        for d in shape:
            numel *= d
        sized.append((name, dtype, shape, numel * DTYPE_BITS[dtype] // 8))
    pos = 0
    entries = []
    for name, dtype, shape, nbytes in sized:
        entries.append([name, entry(dtype, shape, pos, pos + nbytes)])
        pos += nbytes
    rng.shuffle(entries)
    spec = Spec(entries=entries, data_len=pos)
    if rng.random() < 0.5:
        spec.has_metadata = True
        spec.metadata = rng.choice([{"format": "pt"}, {}, None, {"k:v": "a:b", "ü": "名"}])
    if rng.random() < 0.5:  # the writer's convention: pad with spaces to a multiple of 8
        text_len = len(spec.header_text().encode("utf-8", "surrogatepass"))
        spec.pad = " " * (-text_len % 8)
    return spec


def _pick_entry(rng: random.Random, spec: Spec) -> Obj:
    if not spec.entries:
        spec.entries.append(["t", entry("U8", [4], 0, 4)])
        spec.data_len += 4
    e = rng.choice(spec.entries)
    if not isinstance(e[1], Obj):
        e[1] = entry("U8", [0], 0, 0)
    return e[1]


def _set_field(obj: Obj, key: str, value: Any) -> None:
    for i, (k, _) in enumerate(obj.pairs):
        if k == key:
            obj.pairs[i] = (k, value)
            return
    obj.pairs.append((key, value))


def _field(obj: Obj, key: str) -> Any:
    for k, v in obj.pairs:
        if k == key:
            return v
    return None


# --- mutation classes: (rng) -> file bytes ---------------------------------------------------------

def m_valid(rng: random.Random) -> bytes:
    return valid_spec(rng).to_bytes()


def m_arbitrary_bytes(rng: random.Random) -> bytes:
    n = rng.choice([0, 1, 7, 8, 9, 16, 64, 300])
    data = bytes(rng.getrandbits(8) for _ in range(n))
    if rng.random() < 0.5 and n >= 8:  # a plausible length prefix over random content
        data = struct.pack("<Q", rng.randint(0, n - 8)) + data[8:]
    return data


def m_length_flip(rng: random.Random) -> bytes:
    b = bytearray(valid_spec(rng).to_bytes())
    for _ in range(rng.choice([1, 1, 2, 3])):
        bit = rng.randrange(64)
        b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


def m_truncate(rng: random.Random) -> bytes:
    b = valid_spec(rng).to_bytes()
    return b[: rng.randrange(len(b) + 1)]


def m_offset_shift(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    e = _pick_entry(rng, spec)
    begin, end = _field(e, "data_offsets")
    delta = rng.choice([-8, -4, -2, -1, 1, 2, 4, 8, 2**32, 2**63, 2**64, -(2**63)])
    how = rng.choice(["begin", "end", "both", "swap"])
    if how == "begin":
        begin += delta
    elif how == "end":
        end += delta
    elif how == "both":
        begin, end = begin + delta, end + delta
    else:
        begin, end = end, begin
    _set_field(e, "data_offsets", [begin, end])
    if rng.random() < 0.3:
        spec.data_len = max(0, spec.data_len + delta) if abs(delta) < 64 else spec.data_len
    return spec.to_bytes()


def m_dtype_swap(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    e = _pick_entry(rng, spec)
    _set_field(e, "dtype", rng.choice([*DTYPES, "f32", "F8_E4M3FN", "FP8", "", "BF16 ", "bf16", 5, None, ["F32"]]))
    return spec.to_bytes()


def m_shape_overflow(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    e = _pick_entry(rng, spec)
    shape = rng.choice([
        [2**32, 2**32], [2**64], [2**64 - 1], [2**63], [2**58], [2**61, 8], [2**40, 2**40, 0],
        [0, 2**40, 2**40], [2**31] * 3, [1] * 300, [2] * 70, [2**62, 4], [3, 2**62],
    ])
    _set_field(e, "shape", shape)
    if rng.random() < 0.5:  # the byte count int64 arithmetic would wrap to
        _set_field(e, "dtype", rng.choice(["F64", "U8", "I64", "F4"]))
        _set_field(e, "data_offsets", [0, 0])
        spec.entries = [x for x in spec.entries if x[1] is e]
        spec.data_len = 0
    return spec.to_bytes()


def nested(depth: int, kind: str = "[") -> str:
    if kind == "[":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def m_deep_nesting(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    depth = rng.choice([1, 50, 120, 124, 125, 126, 127, 128, 300, 990, 1000, 5000, 100_000])
    kind = rng.choice(["[", "{"])
    where = rng.choice(["extra", "metadata", "top", "shape", "whole"])
    if where == "whole":
        return spec.to_bytes(nested(depth, kind).encode())
    if where == "extra":
        _pick_entry(rng, spec).pairs.append(("extra", Raw(nested(depth, kind))))
    elif where == "metadata":
        spec.has_metadata = True
        spec.metadata = Obj([("k", Raw(nested(depth, kind)))])
    elif where == "top":
        spec.entries.append(["deep", Raw(nested(depth, kind))])
    else:
        _set_field(_pick_entry(rng, spec), "shape", Raw(nested(depth, kind)))
    return spec.to_bytes()


HUGE_NUMBERS = [
    "1e400", "-1e400", "1" + "0" * 400, "9" * 5000, str(2**64), str(2**64 - 1), str(2**63), "-1", "-0", "1.0",
    "1e2", "0.0", "-0.0", "1.7976931348623157e308", "1e308", "1e-400", str(2**70), "0" + "1", "1" + "0" * 308,
]


def m_huge_number(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    e = _pick_entry(rng, spec)
    lit = Raw(rng.choice(HUGE_NUMBERS))
    where = rng.choice(["dim", "begin", "end", "extra", "metadata"])
    if where == "dim":
        shape = list(_field(e, "shape") or [])
        if shape:
            shape[rng.randrange(len(shape))] = lit
        else:
            shape = [lit]
        _set_field(e, "shape", shape)
    elif where in ("begin", "end"):
        begin, end = _field(e, "data_offsets")
        _set_field(e, "data_offsets", [lit, end] if where == "begin" else [begin, lit])
    elif where == "extra":
        e.pairs.append(("n", lit))
    else:
        spec.has_metadata = True
        spec.metadata = Obj([("n", lit)])
    return spec.to_bytes()


def m_nan_literal(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    e = _pick_entry(rng, spec)
    lit = Raw(rng.choice(["NaN", "Infinity", "-Infinity", "nan", "inf"]))
    where = rng.choice(["dim", "offset", "extra", "metadata", "top"])
    if where == "dim":
        _set_field(e, "shape", [lit])
    elif where == "offset":
        _set_field(e, "data_offsets", [0, lit])
    elif where == "extra":
        e.pairs.append(("x", lit))
    elif where == "metadata":
        spec.has_metadata = True
        spec.metadata = Obj([("x", lit)])
    else:
        spec.entries.append(["x", lit])
    return spec.to_bytes()


def m_duplicate_key(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    e = _pick_entry(rng, spec)
    how = rng.choice(["entry_same", "entry_other", "field", "extra", "metadata_key", "metadata", "escaped"])
    if how in ("entry_same", "entry_other"):
        name = next(n for n, v in spec.entries if v is e)
        dup = e if how == "entry_same" else entry("U8", [0], 0, 0)
        spec.entries.insert(rng.randrange(len(spec.entries) + 1), [name, dup])
    elif how == "field":
        k, v = rng.choice(e.pairs)
        e.pairs.insert(rng.randrange(len(e.pairs) + 1), (k, v))
    elif how == "extra":
        e.pairs.extend([("x", 1), ("x", 2)])
    elif how == "metadata_key":
        spec.has_metadata = True
        spec.metadata = Obj([("k", "a"), ("k", "b")])
    elif how == "metadata":
        spec.has_metadata = True
        spec.metadata = {"a": "b"}
        spec.entries.append(["__metadata__", {"c": "d"}])
    else:  # the same key spelled two ways
        name = next(n for n, v in spec.entries if v is e)
        if name:
            spelled = RawKey('"' + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c for c in name) + '"')
            spec.entries.append([spelled, entry("U8", [0], 0, 0)])
        else:
            spec.entries.append(["", entry("U8", [0], 0, 0)])
    return spec.to_bytes()


BAD_UTF8 = [
    b"\xff", b"\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x82", b"\x80", b"\xf8\x88\x80\x80\x80", b"\xf4\x90\x80\x80",
]


def m_non_utf8_name(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    spec.entries.append(["PLACEHOLDER_NAME", entry("U8", [0], 0, 0)])
    if rng.random() < 0.3:
        spec.has_metadata = True
        spec.metadata = {"k": "PLACEHOLDER_VALUE"}
    text = spec.header_text().encode("utf-8")
    bad = rng.choice(BAD_UTF8)
    target = rng.choice([b"PLACEHOLDER_NAME", b"PLACEHOLDER_VALUE"]) if spec.has_metadata else b"PLACEHOLDER_NAME"
    text = text.replace(target, b"na" + bad + b"me")
    return spec.to_bytes(text)


def m_surrogate_escape(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    lit = rng.choice(
        ["\\ud800", "\\udc00", "\\udbff\\udfff", "\\ud83d\\ude00", "a\\ud800b", "\\ud800\\ud800", "\\u0041"]
    )
    where = rng.choice(["name", "metadata", "extra", "dtype"])
    if where == "name":
        spec.entries.append([RawKey(f'"{lit}"'), entry("U8", [0], 0, 0)])
    elif where == "metadata":
        spec.has_metadata = True
        spec.metadata = Obj([("k", Raw(f'"{lit}"'))])
    elif where == "extra":
        _pick_entry(rng, spec).pairs.append(("s", Raw(f'"{lit}"')))
    else:
        _set_field(_pick_entry(rng, spec), "dtype", Raw(f'"{lit}"'))
    return spec.to_bytes()


def m_byte_flip(rng: random.Random) -> bytes:
    b = bytearray(valid_spec(rng).to_bytes())
    n = struct.unpack("<Q", bytes(b[:8]))[0]
    if n == 0:
        return bytes(b)
    for _ in range(rng.choice([1, 1, 2, 4])):
        i = 8 + rng.randrange(n)
        b[i] = rng.choice([rng.getrandbits(8), ord(rng.choice('{}[]:,"0123456789-eE. \\'))])
    return bytes(b)


def m_wrong_type(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    e = _pick_entry(rng, spec)
    how = rng.choice(["entry", "shape", "offsets", "metadata", "top", "missing", "extra", "dim"])
    if how == "entry":
        i = rng.randrange(len(spec.entries))
        spec.entries[i][1] = rng.choice([[], "x", None, 0, True, [1, 2], {"dtype": "U8"}])
    elif how == "shape":
        _set_field(e, "shape", rng.choice(["2", {}, None, [True], [[2]], [2.0], 3, [-1], [None]]))
    elif how == "offsets":
        bad_offsets = [[0], [0, 1, 2], "0,1", {"b": 0}, [0.0, 4], [None, 0], [-1, 0], [], [True, 1]]
        _set_field(e, "data_offsets", rng.choice(bad_offsets))
    elif how == "metadata":
        spec.has_metadata = True
        spec.metadata = rng.choice([[], "x", 5, {"a": 1}, {"a": None}, {"a": ["b"]}, {"a": {"b": "c"}}, True])
    elif how == "top":
        return spec.to_bytes(rng.choice([b"[]", b'"x"', b"5", b"null", b"true", b"[{}]"]))
    elif how == "missing":
        e.pairs = [p for p in e.pairs if p[0] != rng.choice(["dtype", "shape", "data_offsets"])]
    elif how == "extra":
        e.pairs.append((rng.choice(["x", "DTYPE", "offsets", ""]), rng.choice([1, "s", None, [], {}])))
    else:
        shape = _field(e, "shape")
        _set_field(e, "shape", (shape or []) + [rng.choice([True, False, None, "1", 1.5])])
    return spec.to_bytes()


def m_padding(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    spec.pad = rng.choice(["", " ", "        ", "\t", "\n", "\r\n", " \n ", "\x00", "\x00" * 7, "\x0c", "\u00a0", " x"])
    spec.lead = rng.choice(["", "", " ", "\n", "\t", "\ufeff", "\x00", "\r"])
    return spec.to_bytes()


def m_trailing_data(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    spec.data_len = max(0, spec.data_len + rng.choice([-8, -1, 1, 7, 100]))
    return spec.to_bytes()


def m_metadata(rng: random.Random) -> bytes:
    spec = valid_spec(rng)
    spec.has_metadata = True
    spec.metadata = rng.choice([
        None, {}, {"format": "pt"}, {"": ""}, {"a": "b" * 1000}, {"__metadata__": "x"}, Obj([("a", Raw('"\\u0000"'))]),
        {"total_size": 5}, {"nested": {}}, "pt", [["a", "b"]],
    ])
    if rng.random() < 0.3:  # __metadata__ after the tensors
        spec.entries.append(["__metadata__", spec.metadata])
        spec.has_metadata = False
    return spec.to_bytes()


CLASSES: dict[str, Callable[[random.Random], bytes]] = {
    "valid": m_valid,
    "arbitrary_bytes": m_arbitrary_bytes,
    "length_flip": m_length_flip,
    "truncate": m_truncate,
    "offset_shift": m_offset_shift,
    "dtype_swap": m_dtype_swap,
    "shape_overflow": m_shape_overflow,
    "deep_nesting": m_deep_nesting,
    "huge_number": m_huge_number,
    "nan_literal": m_nan_literal,
    "duplicate_key": m_duplicate_key,
    "non_utf8_name": m_non_utf8_name,
    "surrogate_escape": m_surrogate_escape,
    "byte_flip": m_byte_flip,
    "wrong_type": m_wrong_type,
    "padding": m_padding,
    "trailing_data": m_trailing_data,
    "metadata": m_metadata,
}


def generate(cls: str, seed: int) -> bytes:
    """The input of class `cls` for `seed` (reproducible)."""
    return CLASSES[cls](random.Random(f"{cls}:{seed}"))


def corpus(per_class: int, seed0: int = 0) -> list[tuple[str, int, bytes]]:
    """`per_class` inputs of every class: (class, seed, bytes)."""
    return [(cls, s, generate(cls, s)) for cls in CLASSES for s in range(seed0, seed0 + per_class)]


# --- verdicts ---------------------------------------------------------------------------------------

def kimi_verdict(data: bytes) -> tuple[bool, list[str]]:
    """(accepted, error codes) of kimi-audit's parser on a whole file's bytes."""
    from kimi_audit.findings import Severity
    from kimi_audit.format.header import parse_shard_prefix

    h = parse_shard_prefix(data, shard="f.safetensors", file_size=len(data))
    errors = [f.code for f in h.findings if f.severity is Severity.ERROR]
    return not errors, errors


def library_verdict(path: str) -> tuple[bool, str]:
    """(accepted, message) of the safetensors library on a file: `safe_open` validates the whole header
    (and the data extent) when it opens; `keys()` only lists. No tensor is loaded, so bf16/fp8 are fine."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="np") as f:
            f.keys()
    except Exception as e:  # SafetensorError, or whatever the library raises on hostile input
        return False, f"{type(e).__name__}: {e}"
    return True, ""
