"""Hand-made safetensors files for parser tests (any header bytes, any data length), and copies of replicas."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any


def header_json(entries: dict[str, Any]) -> bytes:
    return json.dumps(entries, separators=(",", ":")).encode()


def shard_bytes(header: bytes | dict[str, Any], data_len: int | None = None, *, pad: bool = True,
                length: int | None = None) -> bytes:
    """8-byte length + header (+ space padding to 8) + `data_len` zero bytes.

    `data_len` defaults to the largest data_offsets end; `length` overrides the length prefix.
    """
    raw = header if isinstance(header, bytes) else header_json(header)
    if pad:
        raw += b" " * (-len(raw) % 8)
    if data_len is None:
        ends = [v["data_offsets"][1] for k, v in (header.items() if isinstance(header, dict) else [])
                if k != "__metadata__"]
        data_len = max(ends, default=0)
    n = len(raw) if length is None else length
    return n.to_bytes(8, "little") + raw + b"\0" * data_len


def write_shard(path: Path, header: bytes | dict[str, Any], data_len: int | None = None, **kw: Any) -> Path:
    path.write_bytes(shard_bytes(header, data_len, **kw))
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def sparse_copy(src: Path, dst: Path) -> Path:
    """Copy a replica directory: shards as hard links (never write to them), small files as copies."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            os.link(f, dst / f.name)
        else:
            shutil.copy2(f, dst / f.name)
    return dst
