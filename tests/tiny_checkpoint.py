"""A tiny real checkpoint of the DeepseekV3 / Kimi-K2 architecture, written with the safetensors library.

Dimensions are scaled down but keep what matters: a dense block then MoE blocks, FP8 e4m3 weights with
128x128 block scales (several not multiples of 128, so edge blocks are partial), BF16 norms, an F32
router bias, three shards and an index. Values are real: FP8 weights are quantized from random
normals the way DeepSeek's cast script does (scale = amax / 448 per block).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import TensorSpec, serialize_file

from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.kinds import BUFFER, SCALE
from kimi_audit.model.layout import expected_layout
from kimi_audit.model.quant.deepseek import SCALE_SUFFIX
from kimi_audit.model.quant.scheme import FP8_DTYPE

TINY_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "attention_bias": False,
    "first_k_dense_replace": 1,
    "hidden_size": 320,
    "intermediate_size": 640,
    "kv_lora_rank": 96,
    "moe_intermediate_size": 160,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 0,
    "q_lora_rank": 192,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_theta": 50000.0,
    "tie_word_embeddings": False,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "vocab_size": 1000,
}

NP_DTYPES = {"BF16": ml_dtypes.bfloat16, "F32": np.float32, FP8_DTYPE: ml_dtypes.float8_e4m3fn}
ST_DTYPES = {"BF16": "bfloat16", "F32": "float32", FP8_DTYPE: "float8_e4m3fn"}


def quantize_fp8(w: np.ndarray, block: tuple[int, int] = (128, 128)) -> tuple[np.ndarray, np.ndarray]:
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
    cfg = model_config_from_dict(TINY_CONFIG)
    rng = np.random.default_rng(seed)
    layout = expected_layout(cfg)
    arrays: dict[str, np.ndarray] = {}
    for name, t in layout.items():
        if t.kind == SCALE:
            continue
        if t.dtype == FP8_DTYPE:
            w = rng.normal(0, 0.02, t.shape).astype(np.float32)
            q, s = quantize_fp8(w)
            arrays[name] = q
            arrays[name[: -len(".weight")] + SCALE_SUFFIX] = s
        elif t.kind == BUFFER:
            n = t.shape[0]
            arrays[name] = (1.0 / (50000.0 ** (np.arange(n) * 2 / (2 * n)))).astype(NP_DTYPES[t.dtype])
        elif name.endswith("norm.weight"):
            arrays[name] = (1.0 + rng.normal(0, 0.1, t.shape)).astype(NP_DTYPES[t.dtype])
        else:
            arrays[name] = rng.normal(0, 0.02, t.shape).astype(NP_DTYPES[t.dtype])
    return arrays


def tiny_shard_of(name: str) -> str:
    if name.startswith("model.embed_tokens") or name.startswith("model.layers.0."):
        return "model-1-of-3.safetensors"
    if name.startswith(("model.layers.1.", "model.layers.2.")):
        return "model-2-of-3.safetensors"
    return "model-3-of-3.safetensors"


def write_safetensors(path: Path, arrays: dict[str, np.ndarray]) -> None:
    specs = {
        k: TensorSpec(dtype=np.dtype(v.dtype).name, shape=list(v.shape), data_ptr=v.ctypes.data, data_len=v.nbytes)
        for k, v in arrays.items()
    }
    serialize_file(specs, str(path), metadata={"format": "pt"})


def tiny_shards(seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """Shard name -> {tensor name: array}, as build_tiny writes them."""
    shards: dict[str, dict[str, np.ndarray]] = {}
    for name, arr in tiny_tensors(seed).items():
        shards.setdefault(tiny_shard_of(name), {})[name] = np.ascontiguousarray(arr)
    return shards


def write_tiny(directory: Path, shards: dict[str, dict[str, np.ndarray]], config: dict | None = None) -> Path:
    """Write shards, a matching index and config.json into `directory`, replacing any shards there."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors"):
        old.unlink()
    weight_map = {}
    total = 0
    for shard, members in shards.items():
        write_safetensors(directory / shard, members)
        weight_map.update({k: shard for k in members})
        total += sum(a.nbytes for a in members.values())
    (directory / "config.json").write_text(json.dumps(config or TINY_CONFIG, indent=2))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return directory


def build_tiny(directory: Path, seed: int = 0) -> Path:
    return write_tiny(directory, tiny_shards(seed))
