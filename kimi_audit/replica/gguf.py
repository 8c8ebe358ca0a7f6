"""A full-scale header replica of a GGUF split set, as unsloth publishes Kimi-K2 (`UD-Q2_K_XL/Kimi-K2-Instruct-
UD-Q2_K_XL-00001-of-00008.gguf`): the tensors llama.cpp's converter writes for the config (the architecture's GGUF
dialect, model.arch), a dynamic-2-bit-like type mix (routed experts at IQ2_XXS / Q2_K, attention, shared experts
and the embedding at Q4_K, the output at Q6_K, norms and routers F32), a tokenizer of the config's vocabulary size
(163,840 tokens and as many merges for Kimi-K2: part 1's ~7 MB), every part sparse (its header and the 1-D F32
tensors, gains and router biases, written; the rest a hole).

The metadata is what the converter writes from config.json (GgufDialect.metadata) plus llama.cpp's general and
split keys; each part is written as a new file (replica.files.new_file).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kimi_audit.format.gguf_types import GGML_BY_NAME, GgmlType
from kimi_audit.model.arch.registry import architecture_of
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.dialect import respelled
from kimi_audit.model.layout import expected_layout
from kimi_audit.replica.files import new_file

ALIGNMENT = 32
U32, I32, F32, BOOL, STRING, ARRAY, U16 = 4, 5, 6, 7, 8, 9, 2
MIX = (("_exps.weight", "IQ2_XXS"), ("ffn_down_exps.weight", "Q2_K"), ("output.weight", "Q6_K"))
"""Name suffix -> ggml type, the last match winning (the routed experts' down projection at Q2_K); every other
weight Q4_K, anything whose row its block does not divide Q8_0, then F16."""


def weight_type(name: str, shape: tuple[int, ...]) -> GgmlType:
    chosen = "Q4_K"
    for suffix, t in MIX:
        if name.endswith(suffix):
            chosen = t
    for t in (chosen, "Q8_0", "F16"):
        if shape[-1] % GGML_BY_NAME[t].block == 0:
            return GGML_BY_NAME[t]
    return GGML_BY_NAME["F32"]


def _value(vtype: int, value: Any, item: int = 0) -> bytes:
    if vtype == STRING:
        raw = str(value).encode()
        return struct.pack("<Q", len(raw)) + raw
    if vtype == ARRAY:
        fmt = {U32: "I", I32: "i", F32: "f"}.get(item)
        if fmt is not None:
            return struct.pack(f"<IQ{len(value)}{fmt}", item, len(value), *value)
        return struct.pack("<IQ", item, len(value)) + b"".join(_value(item, v) for v in value)
    return struct.pack({U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U16: "<H"}[vtype], value)


def _typed(key: str, value: Any) -> tuple[int, Any]:
    if isinstance(value, bool):
        return BOOL, value
    if isinstance(value, int):
        return U32, value
    if isinstance(value, float):
        return F32, value
    return STRING, str(value)


def tokenizer_kv(vocab: int) -> list[tuple[str, int, Any, int]]:
    """A byte-level BPE tokenizer of `vocab` tokens and as many merges, sized like Kimi-K2's."""
    tokens = [f"\u0120tok{i:06d}" for i in range(vocab)]
    merges = [f"\u0120tok{i:06d} merged{i:06d}" for i in range(vocab - 512)]
    return [("tokenizer.ggml.model", STRING, "gpt2", 0), ("tokenizer.ggml.pre", STRING, "kimi-k2", 0),
            ("tokenizer.ggml.tokens", ARRAY, tokens, STRING), ("tokenizer.ggml.token_type", ARRAY, [1] * vocab, I32),
            ("tokenizer.ggml.merges", ARRAY, merges, STRING), ("tokenizer.ggml.bos_token_id", U32, 163584, 0),
            ("tokenizer.ggml.eos_token_id", U32, 163585, 0)]


def build_gguf_replica(directory: Path, config: dict[str, Any], stem: str, parts: int,
                       progress: Callable[[str], None] | None = None) -> list[Path]:
    """Write the split set of `config` (a config.json the architecture's GGUF dialect converts) as `parts`
    parts `{stem}-0000N-of-0000M.gguf` in `directory`; returns their paths."""
    arch = architecture_of(config)
    if arch is None or arch.gguf is None:
        raise ValueError("no GGUF dialect describes this config")
    dialect = arch.gguf
    written = {**dialect.metadata(config), "general.architecture": dialect.archs[0], "tokenizer.ggml.pre": "kimi-k2"}
    kv_cfg, _ = dialect.config(written, {"output.weight": (0,), "blk.0.attn_k_b.weight": (0,)})
    layout = respelled(expected_layout(model_config_from_dict(kv_cfg)), dialect.rename)
    tensors = []
    for name, t in layout.items():
        ggml = GGML_BY_NAME["F32"] if t.dtype == "F32" else weight_type(name, t.shape)
        tensors.append((name, t.shape, ggml, ggml.nbytes(math.prod(t.shape))))
    total = sum(n for *_, n in tensors)
    assign = [min(parts, pos * parts // total + 1) for pos in _starts(tensors)]
    general = [("general.architecture", STRING, dialect.archs[0], 0), ("general.type", STRING, "model", 0),
               ("general.name", STRING, stem, 0), ("general.quantization_version", U32, 2, 0),
               ("general.file_type", U32, 10, 0)]
    meta = [(k, *_typed(k, v), 0) for k, v in dialect.metadata(config).items()]
    out = []
    for part in range(1, parts + 1):
        mine = [t for t, p in zip(tensors, assign) if p == part]
        kv = (general + meta + tokenizer_kv(config["vocab_size"])) if part == 1 else []
        kv = kv + [("split.no", U16, part - 1, 0), ("split.count", U16, parts, 0),
                   ("split.tensors.count", I32, len(tensors), 0)]
        path = directory / f"{stem}-{part:05d}-of-{parts:05d}.gguf"
        _write_part(path, kv, mine)
        out.append(path)
        if progress:
            progress(path.name)
    return out


def _starts(tensors: list[tuple[str, tuple[int, ...], GgmlType, int]]) -> list[int]:
    pos, out = 0, []
    for *_, n in tensors:
        out.append(pos)
        pos += n
    return out


def _write_part(path: Path, kv: list[tuple[str, int, Any, int]],
                tensors: list[tuple[str, tuple[int, ...], GgmlType, int]]) -> None:
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for key, vtype, value, item in kv:
        head += _value(STRING, key) + struct.pack("<I", vtype) + _value(vtype, value, item)
    offset, small = 0, []
    for name, shape, ggml, nbytes in tensors:
        ne = tuple(reversed(shape))
        head += _value(STRING, name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, ggml.id, offset)
        if ggml.name == "F32" and len(shape) == 1:
            small.append((offset, math.prod(shape), name))
        offset += -(-nbytes // ALIGNMENT) * ALIGNMENT
    data_start = -(-len(head) // ALIGNMENT) * ALIGNMENT
    with new_file(path) as f:
        f.write(bytes(head).ljust(data_start, b"\0"))
        for begin, n, name in small:  # gains near 1, router biases near 0: what --values reads
            f.seek(data_start + begin)
            value = 0.01 if name.endswith(".bias") else 1.0
            f.write(struct.pack(f"<{n}f", *([value] * n)))
        f.truncate(data_start + offset)
