"""A full-scale header replica of moonshotai/Kimi-K2-Instruct at the pinned revision.

61 sparse shards `model-{i}-of-61.safetensors` whose headers hold every tensor of the published layout,
plus `config.json` (the pinned one) and `model.safetensors.index.json`. Big tensors are holes: the files
are ~959 GB apparent and a few hundred MB on disk. Small tensors (norm gains, router biases, FP8 scales,
rotary buffers) get deterministic synthetic values so the numeric commands have something real to read;
numpy and ml_dtypes are imported by the functions that make them.

Shard assignment follows the published description: shard 1 holds the embedding and layer 0,
shard i holds layer i-1, shard 61 also holds `model.norm.weight` and `lm_head.weight`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kimi_audit.constants import CONFIG_FILE, DTYPE_BITS, INDEX_FILE
from kimi_audit.model.config import ModelConfig, parse_config_bytes, pinned_config_bytes
from kimi_audit.model.layout import BUFFER, expected_layout

if TYPE_CHECKING:
    import numpy as np

# Published fact: the checkpoint stores rotary_emb.inv_freq as BF16 [56], not [qk_rope_head_dim / 2].
PUBLISHED_INV_FREQ_SHAPE = (56,)
SMALL_TENSOR_BYTES = 1 << 20


@dataclass(frozen=True)
class ReplicaTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BITS[self.dtype] // 8


def shard_name(i: int, n: int) -> str:
    return f"model-{i}-of-{n}.safetensors"


def replica_shards(cfg: ModelConfig) -> dict[str, list[ReplicaTensor]]:
    """Shard name -> tensors in it, one decoder layer per shard."""
    layout = expected_layout(cfg)
    n = cfg.total_layers
    shards: dict[str, list[ReplicaTensor]] = {shard_name(i + 1, n): [] for i in range(n)}
    for t in layout.values():
        if t.layer is not None:
            shard = shard_name(t.layer + 1, n)
        elif t.name == "model.embed_tokens.weight":
            shard = shard_name(1, n)
        else:
            shard = shard_name(n, n)
        shape = PUBLISHED_INV_FREQ_SHAPE if t.kind == BUFFER else t.shape
        shards[shard].append(ReplicaTensor(t.name, t.dtype, shape))
    for tensors in shards.values():
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
    """Plausible values for a small tensor: gains near 1, small biases, positive scales, rotary frequencies."""
    import ml_dtypes
    import numpy as np

    n = t.nbytes * 8 // DTYPE_BITS[t.dtype]
    if t.name.endswith(".inv_freq"):
        v = 1.0 / (50000.0 ** (np.arange(n, dtype=np.float64) * 2 / (2 * n)))
    elif t.name.endswith("_scale_inv"):
        v = rng.uniform(2e-5, 4e-4, n)
    elif t.name.endswith("e_score_correction_bias"):
        v = rng.normal(0.0, 0.02, n)
    else:
        v = 1.0 + rng.normal(0.0, 0.05, n)
    np_dtype = {"BF16": ml_dtypes.bfloat16, "F32": np.float32, "F16": np.float16}[t.dtype]
    return v.astype(np_dtype)


def write_shard(path: Path, tensors: list[ReplicaTensor], *, seed: int, fill_small: bool = True) -> int:
    """Write one sparse shard; returns the payload size."""
    import numpy as np

    head, payload = header_bytes(tensors, {"format": "pt"})
    rng = np.random.default_rng(seed)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(head)
        f.truncate(len(head) + payload)
        if fill_small:
            pos = len(head)
            for t in tensors:
                if t.nbytes <= SMALL_TENSOR_BYTES and t.dtype in ("BF16", "F32", "F16"):
                    f.seek(pos)
                    f.write(synthetic_values(t, rng).tobytes())
                pos += t.nbytes
    os.replace(tmp, path)
    return payload


def build_replica(
    directory: str | os.PathLike[str],
    *,
    fill_small: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write the replica into `directory` (created if needed). Returns the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    raw_cfg = pinned_config_bytes()
    _, cfg = parse_config_bytes(raw_cfg)
    (out / CONFIG_FILE).write_bytes(raw_cfg)
    weight_map: dict[str, str] = {}
    total = 0
    for seed, (shard, tensors) in enumerate(replica_shards(cfg).items()):
        total += write_shard(out / shard, tensors, seed=seed, fill_small=fill_small)
        weight_map.update((t.name, shard) for t in tensors)
        if progress:
            progress(shard)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return out
