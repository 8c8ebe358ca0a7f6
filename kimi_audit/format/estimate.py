"""How many bytes to ask for in a shard's first read, from the tensor names the index lists for it.

A local read costs nothing extra when it is too big or too small; a remote one costs a round trip when
too small and bandwidth when too big. The index tells which tensors each shard holds; the expected
layout (from config.json) gives their dtype and shape, hence the exact JSON text of each entry except
for the offset digits.

Estimates, all pure:

- `header_upper_bound`: the JSON text of every entry, with each offset counted at the digit width of
  the file size (or 12 digits when the size is unknown), plus room for `__metadata__` and padding.
  It errs long by about 1% (file size known) to 3% (unknown) on Kimi-K2.
- the exact figure, when the file size is known (the Hub lists it): a shard is `8 + N + payload`, and
  the payload is the sum of the expected tensors' sizes (`ExpectedTensor.nbytes`), so
  `8 + N = file_size - payload`. Used when it is plausible: no shorter than the names' own length, and
  no longer than a quick bound (every entry with the widest dtype name and a two-dimensional shape of
  the widest dims) or, past that, the upper bound. A checkpoint that does not match its config falls
  back to the upper bound, and at worst to the format reader's second read.
- `first_read_bytes(names)`: names only (no config, no size), for callers that have nothing else.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Any, Protocol

from kimi_audit.constants import DTYPE_BITS, HEADER_LENGTH_BYTES, MAX_HEADER_BYTES

# `"__metadata__":{"format":"pt"},` is 31 bytes; leave room for a little more.
METADATA_ALLOWANCE = 64
PADDING = 7  # safetensors pads the JSON with spaces to a multiple of 8
UNKNOWN_DTYPE_TEXT = len('"F8_E4M3"')
UNKNOWN_SHAPE_TEXT = len("[129280,7168]")
UNKNOWN_OFFSET_DIGITS = 12
MAX_DTYPE_TEXT = 2 + max(map(len, DTYPE_BITS))
# Per entry, around the name: `:{"dtype":` `,"shape":` `,"data_offsets":[` `,` `]}` `,`
ENTRY_PUNCTUATION = len(':{"dtype":') + len(',"shape":') + len(',"data_offsets":[') + len(",") + len("]}") + len(",")
DEFAULT_FIRST_READ = 1 << 16


class _Expected(Protocol):
    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def nbytes(self) -> int | None: ...


def _json_len(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


_PLAIN_NAME_BYTES = bytes(b for b in range(0x20, 0x80) if b not in b'"\\')
"""ASCII bytes a JSON string holds as they are (no escape): printable, neither quote nor backslash."""


def _names_len(names: list[str]) -> int:
    """Sum of the names' lengths as JSON strings (one C-level dumps for the whole list)."""
    if not names:
        return 0
    joined = "".join(names)
    if joined.isascii() and not joined.encode().translate(None, _PLAIN_NAME_BYTES):
        return len(joined) + 2 * len(names)  # nothing to escape: each name is its text in quotes
    return len(json.dumps(names, ensure_ascii=False, separators=(",", ":")).encode()) - 2 - (len(names) - 1)


def _shape_len(shape: tuple[int, ...]) -> int:
    return 2 + max(0, len(shape) - 1) + sum(len(str(d)) for d in shape)


def header_upper_bound(
    names: Iterable[str],
    expected: Mapping[str, _Expected] | None = None,
    *,
    file_size: int | None = None,
) -> int:
    """8 + an upper estimate of N for a shard holding `names` (see module docstring)."""
    digits = len(str(max(file_size, 1))) if file_size is not None else UNKNOWN_OFFSET_DIGITS
    names = list(names)
    expected = expected or {}
    total = HEADER_LENGTH_BYTES + 2 + METADATA_ALLOWANCE + PADDING
    total += _names_len(names) + len(names) * (ENTRY_PUNCTUATION + 2 * digits)
    text_len: dict[tuple[str, tuple[int, ...]], int] = {}
    for name in names:
        t = expected.get(name)
        if t is None:
            total += UNKNOWN_DTYPE_TEXT + UNKNOWN_SHAPE_TEXT
            continue
        key = (t.dtype, tuple(t.shape))
        n = text_len.get(key)
        if n is None:
            n = text_len[key] = len(t.dtype) + 2 + _shape_len(key[1])
        total += n
    return total


def names_lower_bound(names: Iterable[str], names_len: int | None = None) -> int:
    """8 + the least N a header holding these names can have (names, braces, shortest fields).
    `names_len`: _names_len(names), if already known."""
    shortest = len(':{"dtype":"U8","shape":[],"data_offsets":[0,0]},')
    names = list(names)
    if names_len is None:
        names_len = _names_len(names)
    return HEADER_LENGTH_BYTES + 2 + names_len + shortest * len(names)


def estimate_first_read(
    names: Iterable[str],
    expected: Mapping[str, _Expected] | None = None,
    *,
    file_size: int | None = None,
) -> int:
    """Bytes to ask for on the first read of a shard whose index entries are `names`."""
    names = list(names)
    if not names:
        return DEFAULT_FIRST_READ
    cap = HEADER_LENGTH_BYTES + MAX_HEADER_BYTES
    if file_size is not None:
        cap = min(cap, file_size)
    if file_size is None or not expected:
        return max(min(header_upper_bound(names, expected, file_size=file_size), cap), HEADER_LENGTH_BYTES)
    digits = len(str(max(file_size, 1)))
    names_len = _names_len(names)
    lower = names_lower_bound(names, names_len)
    found = list(map(expected.get, names))
    payload: int | None = None
    if None not in found:
        sizes = list(map(attrgetter("nbytes"), found))
        payload = None if None in sizes else sum(sizes)
    if payload is not None:
        exact = file_size - payload
        # Plausible at a glance: no longer than entries of the widest dtype name and two-dimensional
        # shapes of the widest dims would make it. Past that, the bound from the entries' own text.
        per_entry = ENTRY_PUNCTUATION + 2 * digits + MAX_DTYPE_TEXT + len("[,]") + 2 * (digits + 1)
        bound = HEADER_LENGTH_BYTES + 2 + METADATA_ALLOWANCE + PADDING + names_len + len(names) * per_entry
        if lower <= exact <= bound:
            return max(min(exact, cap), HEADER_LENGTH_BYTES)
    upper = HEADER_LENGTH_BYTES + 2 + METADATA_ALLOWANCE + PADDING
    upper += names_len + len(names) * (ENTRY_PUNCTUATION + 2 * digits)
    known = [t for t in found if t is not None]
    upper += (len(names) - len(known)) * (UNKNOWN_DTYPE_TEXT + UNKNOWN_SHAPE_TEXT)
    # Entry text depends on (dtype, shape) only: count those pairs at C speed, then add up.
    kinds = Counter(zip(map(attrgetter("dtype"), known), map(tuple, map(attrgetter("shape"), known))))
    upper += sum(count * (len(dtype) + 2 + _shape_len(shape)) for (dtype, shape), count in kinds.items())
    estimate = upper
    if payload is not None and lower <= file_size - payload <= upper:
        estimate = file_size - payload
    return max(min(estimate, cap), HEADER_LENGTH_BYTES)


def first_read_bytes(
    tensor_names: list[str],
    expected: Mapping[str, _Expected] | None = None,
    file_size: int | None = None,
) -> int:
    """First-read size for one shard (names from the index; layout and file size when known)."""
    return estimate_first_read(tensor_names, expected, file_size=file_size)


def shard_first_reads(
    weight_map: Mapping[str, str],
    expected: Mapping[str, _Expected] | None = None,
    file_sizes: Mapping[str, int | None] | None = None,
) -> dict[str, int]:
    """First-read size for every shard the index names."""
    by_shard: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if isinstance(shard, str):
            by_shard.setdefault(shard, []).append(name)
    sizes = file_sizes or {}
    return {
        shard: estimate_first_read(names, expected, file_size=sizes.get(shard))
        for shard, names in by_shard.items()
    }
