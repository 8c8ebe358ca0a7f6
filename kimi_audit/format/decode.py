"""The typed header path: msgspec decodes a well-formed header straight into Structs.

A header as safetensors writes it (no escapes, `__metadata__` first, every entry exactly `dtype`,
`shape`, `data_offsets`) is decoded by one cached `msgspec.json.Decoder` into `dict[str, Entry]`, the
dtype checked against the format's as a Literal, and validated column by column (columns.py).
`typed_header` returns None for anything else, and header.py then sends the header to the strict
path (strict.py), which names each violation. So this path only has to be sure of what it accepts:

- msgspec keeps the last of duplicate keys silently: a count of the colons in the raw bytes proves
  there are none (every colon is a key's, or inside a string the decoded header holds);
- msgspec reads `-0` as the integer 0, where serde_json (the reference reader) reads a float;
- escapes may hide lone surrogates or colons: any backslash goes the strict way;
- a malformed, out-of-range or unexpected value is a msgspec error, also sent the strict way.
"""

from __future__ import annotations

import re
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from kimi_audit.constants import DTYPE_BITS
from kimi_audit.format.columns import FAST_MAX_DIMS, TensorColumns, sound_columns

if TYPE_CHECKING:
    DType = str
else:  # decoded as one of these very strings: a checkpoint's dtype column shares a few str objects
    DType = Literal[tuple(DTYPE_BITS)]


class Entry(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One tensor entry as the format defines it; any other field or type is a ValidationError."""

    dtype: DType
    shape: Annotated[tuple[int, ...], msgspec.Meta(max_length=FAST_MAX_DIMS)]  # bounds math.prod's work
    data_offsets: tuple[int, int]


_ENTRIES = msgspec.json.Decoder(dict[str, Entry])
_METADATA = msgspec.json.Decoder(dict[str, str])
_METADATA_KEY = b'{"__metadata__":'
_NEGATIVE_ZERO = re.compile(rb"[\[,:][ \t\n\r]*-0")  # a `-0` number: before it only `[`, `,` or `:`
_DTYPE, _SHAPE, _OFFSETS = attrgetter("dtype"), attrgetter("shape"), attrgetter("data_offsets")


def typed_header(body: bytes) -> tuple[dict[str, str] | None, TensorColumns] | None:
    """Metadata and columns of the header bytes `body` (valid UTF-8, trailing spaces stripped), or
    None when the strict path must judge it: it gives the same result, naming what is wrong."""
    if b"\\" in body or (b"-" in body and _NEGATIVE_ZERO.search(body)):
        return None
    metadata = None
    rest = body
    comma = False
    try:
        if body.startswith(_METADATA_KEY + b"{"):
            # A flat string map ends at its first `}` (quotes always delimit strings without escapes;
            # a `}` inside one leaves an unterminated string, a nested object an unclosed one).
            end = body.find(b"}", len(_METADATA_KEY)) + 1
            metadata = _METADATA.decode(memoryview(body)[len(_METADATA_KEY):end])
            after = body[end:end + 1]
            comma = after == b","
            if comma:  # the entries as an object of their own: `{` + what follows the comma
                rest = b"".join((b"{", memoryview(body)[end + 1:]))
            elif after == b"}":
                rest = b"{" + body[end:]
            else:
                return None
        entries = _ENTRIES.decode(rest)
    except msgspec.MsgspecError:
        return None
    if "__metadata__" in entries or (comma and not entries):
        return None  # `__metadata__` again or elsewhere (the strict path reads it), or a trailing comma
    pairs = 4 * len(entries) + (0 if metadata is None else 1 + len(metadata))
    colons = body.count(b":")
    if colons != pairs:  # colons in strings, or a duplicate key
        strings = chain(entries, metadata or (), (metadata or {}).values())
        if colons != pairs + "".join(strings).count(":"):
            return None
    vals = entries.values()
    offsets = list(chain.from_iterable(map(_OFFSETS, vals)))
    columns = sound_columns(list(entries), list(map(_DTYPE, vals)), list(map(_SHAPE, vals)),
                            offsets[0::2], offsets[1::2])
    return None if columns is None else (metadata, columns)
