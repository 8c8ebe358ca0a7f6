"""GGUF files for the fault tests: a file llama.cpp's tools wrote (tests/data/gguf) read with llama.cpp's gguf-py
(GGUFReader: every key with its type, every tensor's bytes), changed, and written back by a plain struct writer
that can also write what no correct writer would (a stale count, a misaligned offset, an unknown type)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass
class Tensor:
    name: str
    ne: list[int]
    """Dimensions in ggml order (fastest first)."""
    type_id: int
    data: bytes
    offset: int | None = None
    """Where to put it in the data section (None: after the previous one, aligned)."""


@dataclass
class Gguf:
    kv: dict[str, tuple[int, Any, int | None]] = field(default_factory=dict)
    """key -> (value type, value, array item type)."""
    tensors: list[Tensor] = field(default_factory=list)
    alignment: int = 32
    version: int = 3

    def set(self, key: str, vtype: int, value: Any, item: int | None = None) -> None:
        self.kv[key] = (vtype, value, item)

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)


def read(path: Path) -> Gguf:
    r = GGUFReader(path)
    out = Gguf()
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        vtype = int(f.types[0])
        item = int(f.types[-1]) if vtype == GGUFValueType.ARRAY else None
        out.kv[f.name] = (vtype, f.contents(), item)
    for t in r.tensors:
        out.tensors.append(Tensor(t.name, [int(d) for d in t.shape], int(t.tensor_type), t.data.tobytes()))
    return out


def _value(vtype: int, value: Any, item: int | None) -> bytes:
    if vtype in SCALAR:
        return struct.pack(SCALAR[vtype], value)
    if vtype == GGUFValueType.STRING:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return struct.pack("<Q", len(raw)) + raw
    assert item is not None
    return struct.pack("<IQ", item, len(value)) + b"".join(_value(item, v, None) for v in value)


def write(g: Gguf, path: Path) -> None:
    head = b"GGUF" + struct.pack("<IQQ", g.version, len(g.tensors), len(g.kv))
    for key, (vtype, value, item) in g.kv.items():
        head += _value(GGUFValueType.STRING, key, None) + struct.pack("<I", vtype) + _value(vtype, value, item)
    data = b""
    infos = b""
    for t in g.tensors:
        offset = t.offset
        if offset is None:
            offset = -(-len(data) // g.alignment) * g.alignment
        data = data.ljust(offset, b"\0")[:offset] + t.data if offset >= len(data) else data
        infos += _value(GGUFValueType.STRING, t.name, None) + struct.pack("<I", len(t.ne))
        infos += struct.pack(f"<{len(t.ne)}Q", *t.ne) + struct.pack("<IQ", t.type_id, offset)
    head += infos
    head = head.ljust(-(-len(head) // g.alignment) * g.alignment, b"\0")
    data = data.ljust(-(-len(data) // g.alignment) * g.alignment, b"\0")
    path.write_bytes(head + data)


def assert_tensors_read_as_gguf_py(part: Any, theirs: GGUFReader) -> None:
    """kimi-audit's reading of a part (format.gguf.GgufPart) against gguf-py's: no finding, and every tensor's name,
    ggml type, shape (numpy order) and absolute offset the same."""
    cols = part.header.columns
    assert part.header.findings == ()
    assert cols.names == [t.name for t in theirs.tensors]
    assert cols.dtypes == [t.tensor_type.name for t in theirs.tensors]
    assert cols.shapes == [tuple(int(d) for d in reversed(t.shape)) for t in theirs.tensors]
    assert [part.header.data_start + b for b in cols.begins] == [int(t.data_offset) for t in theirs.tensors]
