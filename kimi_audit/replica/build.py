"""Full-scale header replicas of the family: Kimi-K2-Instruct at the pinned revision (the default), and
Kimi-K2-Base, -Instruct-0905, -Thinking, DeepSeek-V3 and V3.2 from the facts of their releases (replica.models).

Sparse shards whose headers hold every tensor of the release's layout, plus `config.json` (shipped as
package data) and `model.safetensors.index.json`. Big tensors are holes: Kimi-K2-Instruct's files are
~958 GiB apparent and a few hundred MB on disk. Small tensors (norm gains, router biases, FP8 scales,
rotary buffers, INT4 `weight_shape`s, and the INT4 group scales of expert 0 of each layer: all of them
would be 63 GB) get deterministic synthetic values so the numeric commands have something real to read;
numpy and ml_dtypes are imported by the functions that make them.

Shard names, count and assignment are the model's (replica.models); Kimi-K2-Instruct's follows its
release's index: shard 1 holds the embedding and layer 0, shard i holds layer i-1, shard 61 also
holds `model.norm.weight` and `lm_head.weight`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kimi_audit.constants import CONFIG_FILE, DTYPE_BITS, INDEX_FILE
from kimi_audit.model.config import parse_config_bytes
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.kinds import (
    BLOCK_SCALE,
    BUFFER,
    GROUP_SCALE,
    ROTARY_BUFFER,
    ROUTER_BIAS,
    WEIGHT_SHAPE,
)
from kimi_audit.model.layout import expected_layout
from kimi_audit.model.roles import role_of
from kimi_audit.replica.files import new_file, undone_unless_finished
from kimi_audit.replica.models import DEFAULT_MODEL, plain_name, replica_model

if TYPE_CHECKING:
    import numpy as np

SMALL_TENSOR_BYTES = 1 << 20
FILLED_DTYPES = ("BF16", "F32", "F16")
FILLED_EXPERT = ".mlp.experts.0."
"""INT4 group scales (~0.9 MB each, 1,152 a layer) get values in this expert only."""


@dataclass(frozen=True)
class ReplicaTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    values: tuple[int, ...] | None = None
    """Exact integer values to store (an INT4 `weight_shape`: [out, in]); None: synthetic or a hole."""

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BITS[self.dtype] // 8

    @property
    def filled(self) -> bool:
        """Whether the replica writes values for it (else it is a hole)."""
        if self.values is not None:
            return True
        if self.nbytes > SMALL_TENSOR_BYTES or self.dtype not in FILLED_DTYPES:
            return False
        return role_of(self.name) != GROUP_SCALE or FILLED_EXPERT in self.name


def shard_name(i: int, n: int) -> str:
    """Kimi-K2-Instruct's shard names (each model's: ReplicaModel.shard_name)."""
    return plain_name(i, n)


def model_config(model: str = DEFAULT_MODEL) -> ModelConfig:
    return parse_config_bytes(replica_model(model).config_bytes())[1]


def replica_shards(cfg: ModelConfig | None = None, *, model: str = DEFAULT_MODEL) -> dict[str, list[ReplicaTensor]]:
    """Shard name -> tensors in it, in the safetensors writer's order, as the model's release stores them.
    `cfg`: the model's config (default: the one shipped for it)."""
    m = replica_model(model)
    if cfg is None:
        cfg = model_config(model)
    layout = expected_layout(cfg)
    entries = [t for t in layout.values()
               if t.kind != BUFFER or role_of(t.name) != ROTARY_BUFFER or m.inv_freq is not None]
    shards: dict[str, list[ReplicaTensor]] = {m.shard_name(i + 1, m.shards): [] for i in range(m.shards)}
    names = list(shards)
    for t, i in zip(entries, m.assign(entries, m.shards)):
        shape = m.inv_freq if role_of(t.name) == ROTARY_BUFFER and m.inv_freq is not None else t.shape
        values = None
        if role_of(t.name) == WEIGHT_SHAPE and t.owner:  # [out, in] of the packed weight it describes
            w = layout.entry(t.position - t.owner)
            values = (w.shape[0], w.logical // w.shape[0])
        shards[names[i - 1]].append(ReplicaTensor(t.name, t.dtype, shape, values))
    for shard, tensors in shards.items():
        if not tensors:
            raise ValueError(f"replica of {model}: shard {shard} would be empty")
        # The safetensors writer's order: wider dtypes first, then by name. It also keeps the small
        # F32/BF16 tensors together, so the replica's written blocks stay few.
        tensors.sort(key=lambda t: (-DTYPE_BITS[t.dtype], t.name))
    return shards


def header_bytes(tensors: Iterable[ReplicaTensor], metadata: dict[str, str] | None = None) -> tuple[bytes, int]:
    """The 8-byte length + JSON header (space-padded to 8 bytes, as safetensors writes), and the payload size."""
    entries: dict[str, object] = {}
    if metadata is not None:
        entries["__metadata__"] = metadata
    pos = 0
    for t in tensors:
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [pos, pos + t.nbytes]}
        pos += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, pos


def synthetic_values(t: ReplicaTensor, rng: np.random.Generator) -> np.ndarray:
    """Plausible values for a small tensor: gains near 1, small biases, positive scales, rotary frequencies,
    the exact values of a `weight_shape`."""
    import ml_dtypes
    import numpy as np

    if t.values is not None:
        return np.array(t.values, dtype={"I64": np.int64, "I32": np.int32}[t.dtype])
    n = t.nbytes * 8 // DTYPE_BITS[t.dtype]
    role = role_of(t.name)
    if role == ROTARY_BUFFER:
        v = 1.0 / (50000.0 ** (np.arange(n, dtype=np.float64) * 2 / (2 * n)))
    elif role == BLOCK_SCALE:
        v = rng.uniform(2e-5, 4e-4, n)
    elif role == GROUP_SCALE:  # INT4 group scales: max |w| of 32 weights / 7
        v = rng.uniform(2e-4, 4e-3, n)
    elif role == ROUTER_BIAS:
        v = rng.normal(0.0, 0.02, n)
    else:
        v = 1.0 + rng.normal(0.0, 0.05, n)
    np_dtype = {"BF16": ml_dtypes.bfloat16, "F32": np.float32, "F16": np.float16}[t.dtype]
    return v.astype(np_dtype)


def write_shard(path: Path, tensors: list[ReplicaTensor], *, seed: int, fill_small: bool = True) -> int:
    """Write one sparse shard (a new file, see `new_file`); returns the payload size."""
    import numpy as np

    head, payload = header_bytes(tensors, {"format": "pt"})
    rng = np.random.default_rng(seed)
    with new_file(path) as f:
        f.write(head)
        f.truncate(len(head) + payload)
        if fill_small:
            pos = len(head)
            for t in tensors:
                if t.filled:
                    f.seek(pos)
                    f.write(synthetic_values(t, rng).tobytes())
                pos += t.nbytes
    return payload


def write_index(directory: Path, weight_map: dict[str, str], total_size: int) -> None:
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    with new_file(directory / INDEX_FILE) as f:
        f.write((json.dumps(index, indent=2) + "\n").encode())


def build_replica(
    directory: str | os.PathLike[str],
    *,
    model: str = DEFAULT_MODEL,
    fill_small: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write the replica of `model` (a REPLICA_MODELS name) into `directory` (created if needed). Returns the
    directory. Each file is written new (`new_file`): what stood under its name is replaced, never written
    through."""
    out = Path(directory)
    with undone_unless_finished(out):  # an interrupted build leaves none of its files (demo DIR, Ctrl-C)
        _build_replica(out, model, fill_small, progress)
    return out


def _build_replica(out: Path, model: str, fill_small: bool, progress: Callable[[str], None] | None) -> None:
    m = replica_model(model)
    out.mkdir(parents=True, exist_ok=True)
    raw_cfg = m.config_bytes()
    config_raw, cfg = parse_config_bytes(raw_cfg)
    if m.gguf_stem:
        from kimi_audit.replica.gguf import build_gguf_replica

        folder = out / m.gguf_stem.rpartition("/")[0]
        folder.mkdir(parents=True, exist_ok=True)
        build_gguf_replica(folder, config_raw, m.gguf_stem.rpartition("/")[2], m.shards, progress)
        return
    with new_file(out / CONFIG_FILE) as f:
        f.write(raw_cfg)
    weight_map: dict[str, str] = {}
    total = 0
    for seed, (shard, tensors) in enumerate(replica_shards(cfg, model=model).items()):
        total += write_shard(out / shard, tensors, seed=seed, fill_small=fill_small)
        weight_map.update((t.name, shard) for t in tensors)
        if progress:
            progress(shard)
    if cfg.quant is not None and cfg.quant.index_counts_files:  # the writer's habit (AMD Quark): whole files
        total = sum((out / shard).stat().st_size for shard in dict.fromkeys(weight_map.values()))
    write_index(out, weight_map, total)
