"""A multi-GB GGUF and the safetensors checkpoint it was "converted" from, for `audit GGUF --against SRC --values`
at scale without multi-GB writes: one stacked-experts F32 tensor, `blk.1.ffn_gate_exps.weight` [E, moe, hidden],
whose data is a sparse hole (reads as zeros), and its source, E FP8 expert weights with their 128x128 scales,
zeros too (written: the source's reader refuses a hole as data). ggml's F32 of the dequantized zeros is the
hole's zeros, so the comparison's own result is equal. Used by tests/test_against_memory.py and
bench/against_memory.py. Needs no gguf-py: the part is written with `struct`."""

from __future__ import annotations

import json
import os
import struct
from importlib import resources
from pathlib import Path
from typing import Any

GGUF_TENSOR = "blk.1.ffn_gate_exps.weight"
F32_TYPE = 0
ALIGNMENT = 32
CHUNK = 1 << 24


def config(experts: int, hidden: int, moe: int) -> dict[str, Any]:
    """The tiny Kimi-K2 config with the MoE dimensions asked for (two layers: one dense, one MoE)."""
    cfg: dict[str, Any] = json.loads(resources.files("kimi_audit").joinpath(
        "data/tiny-kimi-k2.config.json").read_text())
    cfg.update(num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=experts, hidden_size=hidden,
               moe_intermediate_size=moe)
    return cfg


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, value: Any) -> bytes:
    if isinstance(value, bool):
        body = struct.pack("<I?", 7, value)
    elif isinstance(value, int):
        body = struct.pack("<II", 4, value)
    elif isinstance(value, float):
        body = struct.pack("<If", 6, value)
    else:
        body = struct.pack("<I", 8) + _string(str(value))
    return _string(key) + body


def write_gguf(path: Path, kv: dict[str, Any], tensors: list[tuple[str, list[int], int, bytes]]) -> None:
    """A GGUF v3 part of (name, ne in ggml's order, ggml type id, bytes) tensors, laid end to end, aligned."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(_kv(k, v) for k, v in kv.items())
    data = b""
    for name, ne, type_id, raw in tensors:
        data = data.ljust(-(-len(data) // ALIGNMENT) * ALIGNMENT, b"\0")
        head += _string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", type_id, len(data))
        data += raw
    head = head.ljust(-(-len(head) // ALIGNMENT) * ALIGNMENT, b"\0")
    path.write_bytes(head + data.ljust(-(-len(data) // ALIGNMENT) * ALIGNMENT, b"\0"))


def write_sparse_gguf(path: Path, kv: dict[str, Any], name: str, ne: list[int]) -> int:
    """A GGUF v3 part of one F32 tensor (`ne`: ggml's order, fastest first) whose data is one hole; its size."""
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv)) + b"".join(_kv(k, v) for k, v in kv.items())
    head += _string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
    head += struct.pack("<IQ", F32_TYPE, 0)
    head = head.ljust(-(-len(head) // ALIGNMENT) * ALIGNMENT, b"\0")
    nbytes = 4
    for d in ne:
        nbytes *= d
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + nbytes)
    return len(head) + nbytes


def write_zero_source(folder: Path, cfg: dict[str, Any]) -> int:
    """config.json and one model.safetensors holding layer 1's expert gate_proj weights (F8_E4M3) and their
    weight_scale_inv (F32), every byte a written zero; the file's size."""
    experts, hidden, moe = cfg["n_routed_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    grid = [-(-moe // 128), -(-hidden // 128)]
    header: dict[str, Any] = {}
    at = 0
    for i in range(experts):
        w = f"model.layers.1.mlp.experts.{i}.gate_proj"
        header[f"{w}.weight"] = {"dtype": "F8_E4M3", "shape": [moe, hidden], "data_offsets": [at, at + moe * hidden]}
        at += moe * hidden
        scales = 4 * grid[0] * grid[1]
        header[f"{w}.weight_scale_inv"] = {"dtype": "F32", "shape": grid, "data_offsets": [at, at + scales]}
        at += scales
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    zeros = bytes(CHUNK)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        left = at
        while left:
            n = min(left, CHUNK)
            f.write(zeros[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    return 8 + len(raw) + at


def build(folder: Path, experts: int, hidden: int = 8192, moe: int = 4096) -> tuple[Path, Path]:
    """(the GGUF part, the source folder): the GGUF tensor is experts x moe x hidden float32."""
    from kimi_audit.model.arch.deepseek_v3.gguf import gguf_metadata

    cfg = config(experts, hidden, moe)
    kv: dict[str, Any] = {"general.architecture": "deepseek2", "tokenizer.ggml.pre": "kimi-k2",
                          **gguf_metadata(cfg)}
    gguf = folder / "sparse-F32.gguf"
    folder.mkdir(parents=True, exist_ok=True)
    write_sparse_gguf(gguf, kv, GGUF_TENSOR, [hidden, moe, experts])
    src = folder / "source"
    write_zero_source(src, cfg)
    return gguf, src
