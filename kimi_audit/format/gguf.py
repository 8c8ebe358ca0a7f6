"""The GGUF container (llama.cpp's files): one part's header read strictly, by byte range, with `struct`.

A part is `GGUF` + u32 version + u64 tensor count + u64 key-value count, the key-values (metadata: the model's
hyperparameters, the tokenizer, `split.*`), one info per tensor (name, dims in ggml order, ggml type, offset into
the data section), then the data section at the next multiple of `general.alignment` (32 by default). gguf-py's
GGUFReader reads the same bytes (gguf-py/gguf/gguf_reader.py), but it builds a numpy view per array element: a
Kimi-K2 part 1 holds 163,840 tokens and as many merges, 9.9 s there, a fraction of a second here, where only a
string array's count is kept.

The header is read from the start in as few ranged reads as its counts allow (part 1 of Kimi-K2 carries a ~9 MB
tokenizer, the other parts a few KB): a first read of FIRST_READ bytes, then reads sized by what the parse knows
(`_Cursor.need`), never past MAX_GGUF_HEADER_BYTES or the file. Each part becomes a ShardHeader (shapes in numpy
order, the ggml type's name as the dtype, offsets relative to the data section) feeding the same tensor table and
checks as a safetensors shard; what is wrong with the container is a Finding on it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from kimi_audit.errors import SourceError
from kimi_audit.findings import Finding, error
from kimi_audit.format.columns import TensorColumns, label
from kimi_audit.format.gguf_types import GGML_TYPES
from kimi_audit.format.header import ShardHeader
from kimi_audit.sources.base import Source

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_GGUF_HEADER_BYTES = 256 << 20
"""A part's header at most (Kimi-K2's part 1: ~7 MB of tokenizer); past it the part is not read further."""
MAX_DIMS = 4
INT64_MAX = (1 << 63) - 1
"""gguf.cpp refuses a tensor whose dimensions or element count reach past int64 (and a dimension read negative)."""
"""GGML_MAX_DIMS."""
MAX_NAME_BYTES = 63
"""GGML_MAX_NAME is 64 with the terminating NUL: llama.cpp's gguf.cpp refuses a longer tensor name."""
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 64 << 20
"""One metadata string (a chat template, an embedded tokenizer.json: a few MB)."""
MAX_KEYS = 1 << 16
"""Metadata keys in one part (llama.cpp's files hold a few dozen)."""
MAX_TENSORS = 1 << 21
"""Tensor infos in one part (Kimi-K2's whole GGUF holds 1,096; the audit's layouts stop at 2,000,000 tensors)."""
MAX_STRINGS = 1 << 22
"""Strings in one metadata array (Kimi-K2's tokenizer: 163,840 tokens and as many merges), each walked in Python:
a bound on the time a hostile count can cost."""
KEEP_ARRAY = 512
"""Arrays up to this length keep their values (split sizes, per-layer schedules: LLAMA_MAX_LAYERS is 512, GLM-5's
78-layer indexer types among them); longer ones (a tokenizer's) their length only."""
FIRST_READ = 1 << 18
"""The first ranged read of a part (a Hub request): a part after the first holds a few KB of header; part 1 of
Kimi-K2 9.0 MB, read in two requests (10.4 MB: `_Cursor.need`)."""
TENSOR_INFO_BYTES = 8 + MAX_NAME_BYTES + 4 + 8 * MAX_DIMS + 4 + 8
"""A tensor info at most (name length, name, dims count, dims, type, offset): what a read still asks for them."""

# GGUF value types (gguf.cpp's gguf_type)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
UINT32 = 4
ALIGNMENT = "general.alignment"
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GgufArray:
    """A metadata array: its element type and length, and its values where it is short (KEEP_ARRAY)."""

    item_type: int
    count: int
    values: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class GgufPart:
    """One GGUF file: its metadata and its tensors as a ShardHeader."""

    header: ShardHeader
    version: int = 0
    kv: dict[str, Any] = field(default_factory=dict)
    alignment: int = DEFAULT_ALIGNMENT
    types: dict[str, int] = field(default_factory=dict)
    """Each key's GGUF value type (gguf.cpp's gguf_type: UINT32 4, FLOAT32 6, STRING 8, ARRAY 9, ...): what
    llama.cpp's typed getters hold a key to (an array's element type is its GgufArray's item_type)."""


class _Invalid(Exception):
    """The header cannot be read further: the message says why (GGUF_INVALID)."""


class _Cursor:
    """Reads a part's header front to back, fetching more of the file as the parse needs it.

    A read asks for what the parse needs, what it expects after that (`need`'s `rest`: the strings left in the
    array being skipped, extrapolated from their average so far) and the tensor infos still to come
    (`infos` x TENSOR_INFO_BYTES), plus an eighth, and never less than half of what was read before (a header of
    many small keys takes a few reads, not one per key). The first time a string array outruns the reads, `rest`
    also holds twice that array's extrapolated bytes: a tokenizer's tokens are followed by as many types (or
    scores) and about as many merges, each two tokens. Part 1 of Kimi-K2 (163,840 tokens and merges, 9.0 MB of
    header) is read in 2 requests, 10.4 MB."""

    def __init__(self, source: Source, name: str) -> None:
        self.source, self.name = source, name
        listed = source.file_size(name)
        first = source.read_range(name, 0, FIRST_READ if listed is None else max(0, min(FIRST_READ, listed)))
        self.buf = bytearray(first.data)
        self.file_size = first.file_size
        self.identity = first.identity
        self.pos = 0
        self.infos = 0
        """Tensor infos still to read (set by the parse once it knows the count)."""
        self.looked_ahead = False

    def need(self, n: int, rest: int = 0) -> None:
        """`n` bytes at `pos` in the buffer, reading more of the file when they are not: then also `rest` bytes
        the parse expects after them (an estimate: nothing is read past the file or MAX_GGUF_HEADER_BYTES)."""
        end = self.pos + n
        if end <= len(self.buf):
            return
        if end > self.file_size:
            raise _Invalid(f"the header runs past the end of the {self.file_size:,}-byte file (a partial download?)")
        if end > MAX_GGUF_HEADER_BYTES:
            raise _Invalid(f"the header exceeds {MAX_GGUF_HEADER_BYTES:,} bytes")
        guess = end - len(self.buf) + rest + self.infos * TENSOR_INFO_BYTES
        want = min(max(guess + guess // 8, len(self.buf) // 2), MAX_GGUF_HEADER_BYTES - len(self.buf),
                   self.file_size - len(self.buf))
        got = self.source.read_range(self.name, len(self.buf), want).data
        if len(self.buf) + len(got) < end:
            raise _Invalid("the file ended while its header was read")
        self.buf += got

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, limit: int, what: str) -> str:
        n = self.take("<Q")
        if n > limit:
            raise _Invalid(f"{what} is {n:,} bytes long (at most {limit:,})")
        self.need(n)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Invalid(f"{what} is not UTF-8") from None

    def skip_strings(self, count: int) -> None:
        """Past `count` strings, keeping none (a tokenizer's tokens and merges): a loop on locals, 327,680 strings in
        Kimi-K2's part 1."""
        buf, start = self.buf, self.pos
        pos, end = start, len(buf)
        length = _U64.unpack_from
        for i in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.need(8, self._rest(start, i, count))
                buf, end = self.buf, len(self.buf)
            (n,) = length(buf, pos)
            if n > MAX_STRING_BYTES:
                raise _Invalid(f"an array string is {n:,} bytes long")
            pos += 8 + n
            if pos > end:
                self.pos = pos - n
                self.need(n, self._rest(start, i, count))
                buf, end = self.buf, len(self.buf)
        self.pos = pos

    def _rest(self, start: int, done: int, count: int) -> int:
        """The bytes the array's strings after the `done` read since `start` will take, at their average so far;
        the first time, twice the whole array's besides (see the class)."""
        average = (self.pos - start) / max(done, 1)
        rest = int((count - done) * average)
        if not self.looked_ahead:
            self.looked_ahead = True
            rest += int(2 * count * average)
        return rest

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == STRING:
            return self.string(MAX_STRING_BYTES, f"the value of {label(key)}")
        if vtype != ARRAY or depth > 0:
            raise _Invalid(f"{label(key)} has value type {vtype}, which GGUF does not define"
                           if vtype != ARRAY else f"{label(key)} is an array of arrays")
        item, count = self.take("<I"), self.take("<Q")
        if item in _SCALARS:
            size = struct.calcsize(_SCALARS[item])
            if count * size > self.file_size:
                raise _Invalid(f"{label(key)} claims {count:,} elements, more than the file holds")
            self.need(count * size)
            values = None
            if count <= KEEP_ARRAY:
                values = struct.unpack_from(f"<{count}{_SCALARS[item][1]}", self.buf, self.pos)
            self.pos += count * size
            return GgufArray(item, count, values)
        if item == STRING:
            if count * 8 > self.file_size or count > MAX_STRINGS:
                raise _Invalid(f"{label(key)} claims {count:,} strings, more than the file holds or kimi-audit "
                               f"reads ({MAX_STRINGS:,})")
            if count <= KEEP_ARRAY:
                return GgufArray(item, count, tuple(self.string(MAX_STRING_BYTES, label(key))
                                                    for _ in range(count)))
            self.skip_strings(count)
            return GgufArray(item, count)
        raise _Invalid(f"{label(key)} is an array of value type {item}, which GGUF does not define"
                       if item != ARRAY else f"{label(key)} is an array of arrays")


def read_gguf_part(source: Source, name: str) -> GgufPart:
    """One part's header, checked: the container's own rules (magic, version, counts, alignment, every tensor's
    type, bytes inside the file, aligned, not overlapping, names unique)."""
    try:
        cur = _Cursor(source, name)
    except SourceError as e:
        return _failed(name, 0, f"unreadable: {e}")
    try:
        return _parse(cur, name)
    except _Invalid as e:
        return _failed(name, cur.file_size, str(e))
    except SourceError as e:
        return _failed(name, cur.file_size, f"unreadable: {e}")


def _failed(name: str, size: int, why: str) -> GgufPart:
    return GgufPart(ShardHeader(name, size, None, findings=(
        error("GGUF_INVALID", f"{name}: not a readable GGUF file: {why}", shard=name),)))


def _parse(cur: _Cursor, name: str) -> GgufPart:
    cur.need(4)
    magic = bytes(cur.buf[:4])
    if magic != MAGIC:
        raise _Invalid(f"it starts with {magic!r}, not the GGUF magic")
    cur.pos = 4
    version = cur.take("<I")
    if version not in VERSIONS:
        endian = " (a big-endian file)" if version & 0xFFFF == 0 else ""
        raise _Invalid(f"GGUF version {version}{endian}: llama.cpp reads versions 2 and 3, little-endian")
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    if n_tensors > cur.file_size // 24 or n_kv > cur.file_size // 12:
        raise _Invalid(f"it claims {n_tensors:,} tensors and {n_kv:,} metadata keys, more than its "
                       f"{cur.file_size:,} bytes can hold")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KEYS:
        raise _Invalid(f"it claims {n_tensors:,} tensors and {n_kv:,} metadata keys (kimi-audit reads at most "
                       f"{MAX_TENSORS:,} and {MAX_KEYS:,} in a part)")
    cur.infos = n_tensors
    kv: dict[str, Any] = {}
    types: dict[str, int] = {}
    for _ in range(n_kv):
        key = cur.string(MAX_KEY_BYTES, "a metadata key")
        if not key:
            raise _Invalid("a metadata key is empty")  # gguf.cpp gguf_init_from_reader: "key %d is empty"
        if key in kv:
            raise _Invalid(f"metadata key {label(key)} appears twice")
        types[key] = cur.take("<I")
        kv[key] = cur.value(types[key], key)
    alignment = kv.get(ALIGNMENT, DEFAULT_ALIGNMENT)
    if ALIGNMENT in types and types[ALIGNMENT] != UINT32:  # gguf.cpp: "key '%s' must be of type %s but is %s"
        raise _Invalid(f"{ALIGNMENT} is stored as GGUF value type {types[ALIGNMENT]}, not the UINT32 (4) "
                       "llama.cpp requires")
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise _Invalid(f"{ALIGNMENT} {alignment!r} is not a power of two")
    infos = []
    for _ in range(n_tensors):
        tname = cur.string(MAX_KEY_BYTES, "a tensor name")
        n_dims = cur.take("<I")
        if n_dims > MAX_DIMS:
            raise _Invalid(f"tensor {label(tname)} has {n_dims} dimensions (ggml has at most {MAX_DIMS})")
        cur.need(8 * n_dims + 12)
        ne = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
        cur.pos += 8 * n_dims
        infos.append((tname, ne, cur.take("<I"), cur.take("<Q")))
    data_offset = -(-cur.pos // alignment) * alignment
    columns, findings = _columns(infos, name, alignment, data_offset, cur.file_size)
    header = ShardHeader(name, cur.file_size, None, columns=columns, findings=tuple(findings),
                         identity=cur.identity, data_offset=data_offset)
    return GgufPart(header, version, kv, alignment, types)


def _columns(infos: list[tuple[str, tuple[int, ...], int, int]], part: str, alignment: int, data_offset: int,
             file_size: int) -> tuple[TensorColumns, list[Finding]]:
    findings: list[Finding] = []
    names: list[str] = []
    dtypes: list[str] = []
    shapes: list[tuple[int, ...]] = []
    begins: list[int] = []
    ends: list[int] = []
    seen: set[str] = set()
    cut: list[str] = []
    running: int | None = 0
    """Where llama.cpp expects the next tensor's data (None once a tensor it refuses stops the count)."""
    moved: list[tuple[str, int, int]] = []
    misaligned: list[tuple[str, int]] = []
    for tname, ne, type_id, offset in infos:
        t = GGML_TYPES.get(type_id)
        where = f"{part}: {label(tname)}"
        if len(tname.encode()) > MAX_NAME_BYTES:
            findings.append(error("GGUF_INVALID", f"{where}: a tensor name of {len(tname.encode())} bytes (llama.cpp "
                                  f"takes at most {MAX_NAME_BYTES})", tensor=tname, shard=part))
            running = None
            continue
        if tname in seen:
            findings.append(error("TENSOR_DUPLICATE", f"{where} is stored twice in the part", tensor=tname, shard=part))
            running = None
            continue
        if t is None:
            findings.append(error("GGUF_TYPE_UNKNOWN", f"{where}: ggml type {type_id} is not one llama.cpp defines",
                                  tensor=tname, shard=part, actual=type_id))
            running = None
            continue
        if any(d == 0 for d in ne) or (ne and ne[0] % t.block):
            why = (f"dimensions {list(ne)}: a tensor with no elements" if any(d == 0 for d in ne) else
                   f"a row of {ne[0]:,} elements is not whole {t.name} blocks of {t.block}")
            findings.append(error("GGUF_ROW_BLOCK", f"{where}: {why}", tensor=tname, shard=part, expected=t.block,
                                  actual=ne[0] if ne else 0))
            running = None
            continue
        numel = 1
        for d in ne:
            numel *= d
        if numel > INT64_MAX or any(d > INT64_MAX for d in ne):  # gguf.cpp: "may cause overflow errors"
            findings.append(error("SHAPE_INVALID", f"{where}: dimensions {list(ne)} hold more elements than 64 bits "
                                  "count (llama.cpp refuses the shape)", tensor=tname, shard=part))
            running = None
            continue
        nbytes = t.nbytes(numel)
        if offset % alignment:
            misaligned.append((tname, offset))
        elif running is not None and offset != running:
            moved.append((tname, offset, running))
        if running is not None:
            running += -(-nbytes // alignment) * alignment
        seen.add(tname)
        if data_offset + offset + nbytes > file_size:
            cut.append(tname)
        names.append(tname)
        dtypes.append(t.name)
        shapes.append(tuple(reversed(ne)))
        begins.append(offset)
        ends.append(offset + nbytes)
    if cut:
        first = ", ".join(label(n, 120) for n in cut[:3]) + (f" and {len(cut) - 3:,} more" if len(cut) > 3 else "")
        findings.append(error("DATA_PAST_EOF", f"{part}: the data of {len(cut):,} tensor{'s' if len(cut) != 1 else ''} "
                              f"is not within the file bounds ({file_size:,} bytes): a partial download? ({first})",
                              tensor=cut[0], shard=part, expected=file_size, actual=data_offset + max(ends),
                              covers=len(cut)))
    if misaligned:
        name, offset = misaligned[0]
        more = f"; {len(misaligned) - 1:,} more tensors too" if len(misaligned) > 1 else ""
        findings.append(error("GGUF_MISALIGNED", f"{part}: {label(name)}: data offset {offset:,} is not a multiple of "
                              f"the alignment {alignment}{more} (general.alignment not the one written with?)",
                              tensor=name, shard=part, expected=alignment, actual=offset, covers=len(misaligned)))
    pos, reach = 0, ""
    overlaps: dict[str, list[tuple[str, int, int]]] = {}  # the tensor whose data runs over -> those it runs over
    past = set(cut)  # a tensor reaching past the end of the file: its extent is DATA_PAST_EOF's, not an overlap
    for begin, end, tname in sorted(zip(begins, ends, names)):
        if tname in past:
            continue
        if begin < pos:
            overlaps.setdefault(reach, []).append((tname, begin, pos))
        if end > pos:
            pos, reach = end, tname
    for runner, over in overlaps.items():  # one cause: one tensor's extent (its type or shape as the header says)
        tname, begin, until = over[0]
        more = f" and {len(over) - 1:,} tensors after it" if len(over) > 1 else ""
        findings.append(error("OFFSETS_OVERLAP", f"{part}: {label(runner)}'s data runs to {until:,}, over "
                              f"{label(tname)} at {begin:,}{more}: the header gives it more bytes than were written "
                              "for it (its type or shape changed?), or gives them offsets inside it", tensor=runner,
                              shard=part, expected=until, actual=begin, covers=len(over)))
    if moved and not overlaps and not misaligned and not cut:
        findings.append(_out_of_place(part, moved))
    end_of_data = data_offset + -(-pos // alignment) * alignment
    if not cut and file_size > end_of_data:
        findings.append(error("GGUF_TRAILING_BYTES", f"{part}: {file_size - end_of_data:,} bytes follow the last "
                              "tensor, which llama.cpp never reads: the header does not describe the file (a tensor's "
                              "type or shape changed so that it reads fewer bytes than were written? parts joined with "
                              "cat? llama-gguf-split --merge joins them)", shard=part, expected=end_of_data,
                              actual=file_size))
    return TensorColumns(names, dtypes, shapes, begins, ends), findings


def _out_of_place(part: str, moved: list[tuple[str, int, int]]) -> Finding:
    """One finding for a part whose tensors are not laid end to end in the order they are listed: gguf.cpp
    (gguf_init_from_reader, "tensor '%s' has offset %zu, expected %zu") requires each tensor's data to begin where
    the previous one's, padded to the alignment, ends, and refuses the file otherwise. Tensors whose data swapped
    places (each under the other's name) or a gap between two tensors read as this."""
    name, offset, expected = moved[0]
    more = f"; {len(moved) - 1:,} more tensors after it are out of place too" if len(moved) > 1 else ""
    return error("GGUF_OFFSET", f"{part}: {label(name)} has data offset {offset:,}, where llama.cpp expects "
                 f"{expected:,} (each tensor's data begins where the previous one's ends, padded to the alignment)"
                 f"{more}: llama.cpp refuses the file, and data under the wrong names would load as other weights",
                 tensor=name, shard=part, expected=expected, actual=offset, covers=len(moved))
