"""A tiny real checkpoint of the Kimi-K2 architecture (`demo --tiny`, and the tests' fixture), written with the
safetensors library: a few MB on which every command can be tried offline on real bytes (`verify`, `diff
--content`, `tensor --dequant`, `rmsnorm`).

Dimensions are scaled down but keep what matters: a dense block then MoE blocks, FP8 e4m3 weights with
128x128 block scales (several dims not multiples of 128, so edge blocks are partial), BF16 norms, an F32 router
bias, three shards and an index. Values are real: FP8 weights are quantized from random normals the way
DeepSeek's cast script does (scale = amax / 448 per block). A FAULT makes it show what a broken one looks like.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kimi_audit.constants import CONFIG_FILE, INDEX_FILE
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.kinds import BUFFER, SCALE
from kimi_audit.model.layout import expected_layout
from kimi_audit.model.quant.deepseek import SCALE_SUFFIX
from kimi_audit.model.quant.scheme import FP8_DTYPE
from kimi_audit.outputs import write_atomic
from kimi_audit.replica.files import undone_unless_finished

if TYPE_CHECKING:
    import numpy as np

TINY_CONFIG: dict[str, Any] = json.loads(resources.files("kimi_audit").joinpath(
    "data/tiny-kimi-k2.config.json").read_text())
"""Kimi-K2-Instruct's config.json with every dimension scaled down (its keys, its quantization_config)."""

Shards = dict[str, dict[str, "np.ndarray"]]


def quantize_fp8(w: np.ndarray, block: tuple[int, int] = (128, 128)) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek's block cast: scale = amax / 448 per block, w / scale rounded to e4m3."""
    import ml_dtypes
    import numpy as np

    out, inp = w.shape
    rows, cols = -(-out // block[0]), -(-inp // block[1])
    scale = np.empty((rows, cols), dtype=np.float32)
    q = np.empty(w.shape, dtype=ml_dtypes.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            blk = w[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            s = np.float32(max(float(np.abs(blk).max()), 1e-12) / 448.0)
            scale[i, j] = s
            q[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] = (blk / s).astype(
                ml_dtypes.float8_e4m3fn)
    return q, scale


def tiny_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """Every tensor of the layout TINY_CONFIG implies, with real values."""
    import numpy as np

    from kimi_audit.numerics.dtypes import numpy_dtype

    cfg = model_config_from_dict(TINY_CONFIG)
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for name, t in expected_layout(cfg).items():
        if t.kind == SCALE:
            continue
        if t.dtype == FP8_DTYPE:
            q, s = quantize_fp8(rng.normal(0, 0.02, t.shape).astype(np.float32))
            arrays[name] = q
            arrays[name[: -len(".weight")] + SCALE_SUFFIX] = s
        elif t.kind == BUFFER:
            n = t.shape[0]
            arrays[name] = (1.0 / (50000.0 ** (np.arange(n) * 2 / (2 * n)))).astype(numpy_dtype(t.dtype))
        elif name.endswith("norm.weight"):
            arrays[name] = (1.0 + rng.normal(0, 0.1, t.shape)).astype(numpy_dtype(t.dtype))
        else:
            arrays[name] = rng.normal(0, 0.02, t.shape).astype(numpy_dtype(t.dtype))
    return arrays


def tiny_shard_of(name: str) -> str:
    if name.startswith("model.embed_tokens") or name.startswith("model.layers.0."):
        return "model-1-of-3.safetensors"
    if name.startswith(("model.layers.1.", "model.layers.2.")):
        return "model-2-of-3.safetensors"
    return "model-3-of-3.safetensors"


def tiny_shards(seed: int = 0) -> Shards:
    """Shard name -> {tensor name: array}, as build_tiny writes them."""
    import numpy as np

    shards: Shards = {}
    for name, arr in tiny_tensors(seed).items():
        shards.setdefault(tiny_shard_of(name), {})[name] = np.ascontiguousarray(arr)
    return shards


def safetensors_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """One safetensors file holding `arrays` (ml_dtypes' bfloat16 and float8 included), by the safetensors
    library's own serializer."""
    import numpy as np
    from safetensors import TensorSpec, serialize

    specs = {k: TensorSpec(dtype=np.dtype(v.dtype).name, shape=list(v.shape), data_ptr=v.ctypes.data,
                           data_len=v.nbytes) for k, v in arrays.items()}
    return bytes(serialize(specs, metadata={"format": "pt"}))


def write_tiny(directory: Path, shards: Shards, config: dict[str, Any] | None = None) -> Path:
    """Write shards, a matching index and config.json into `directory` (each file new, renamed over its name).
    No other file there is touched: `demo --tiny DIR --force` promises to write only the checkpoint's own names."""
    directory.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    total = 0
    for shard, members in shards.items():
        write_atomic(directory / shard, safetensors_bytes(members))
        weight_map.update(dict.fromkeys(members, shard))
        total += sum(a.nbytes for a in members.values())
    write_atomic(directory / CONFIG_FILE, json.dumps(config or TINY_CONFIG, indent=2).encode())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_atomic(directory / INDEX_FILE, json.dumps(index, indent=2).encode())
    return directory


def build_tiny(directory: Path, seed: int = 0, fault: str | None = None) -> Path:
    """The tiny checkpoint in `directory`, or one broken as FAULTS[fault] says."""
    shards = tiny_shards(seed)
    if fault is not None:
        FAULTS[fault][1](shards)
    with undone_unless_finished(directory):  # an interrupted build leaves none of its files
        return write_tiny(directory, shards)


def _nan_gain(shards: Shards) -> None:
    import numpy as np

    name = "model.layers.2.self_attn.q_a_layernorm.weight"
    held = shards[tiny_shard_of(name)]
    held[name] = held[name].copy()
    held[name][7] = np.nan


def _missing_scale(shards: Shards) -> None:
    name = "model.layers.1.mlp.experts.3.up_proj" + SCALE_SUFFIX
    del shards[tiny_shard_of(name)][name]


def _wrong_shape(shards: Shards) -> None:
    name = "model.layers.3.self_attn.kv_a_layernorm.weight"
    held = shards[tiny_shard_of(name)]
    held[name] = held[name][:-1].copy()


FAULTS: dict[str, tuple[str, Callable[[Shards], None]]] = {
    "nan-gain": ("one value of layer 2's q_a_layernorm gain is NaN (audit --values, verify)", _nan_gain),
    "missing-scale": ("an FP8 expert weight's weight_scale_inv is gone (audit)", _missing_scale),
    "wrong-shape": ("layer 3's kv_a_layernorm gain is one element short (audit)", _wrong_shape),
}
"""`demo --tiny --fault NAME`: what each fault does and which command finds it."""
