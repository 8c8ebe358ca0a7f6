"""The DeepseekV3-family config (Kimi-K2, DeepSeek-V3/R1) as the layout needs it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from kimi_audit.errors import ConfigError

TORCH_DTYPE_TO_SAFETENSORS = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


@dataclass(frozen=True)
class Quantization:
    method: str
    fmt: str | None
    block: tuple[int, int]


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    q_lora_rank: int | None
    kv_lora_rank: int
    num_attention_heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    num_hidden_layers: int
    first_k_dense_replace: int
    moe_layer_freq: int
    n_routed_experts: int | None
    n_shared_experts: int | None
    num_experts_per_tok: int | None
    topk_method: str | None
    vocab_size: int
    tie_word_embeddings: bool
    num_nextn_predict_layers: int
    attention_bias: bool
    dtype: str
    """safetensors dtype of unquantized weights, from torch_dtype."""
    quantization: Quantization | None
    rms_norm_eps: float

    @property
    def q_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        """The rule of modeling_deepseek.py DeepseekV3DecoderLayer.__init__."""
        return (
            self.n_routed_experts is not None
            and layer >= self.first_k_dense_replace
            and layer % self.moe_layer_freq == 0
        )

    @property
    def total_layers(self) -> int:
        """Decoder layers stored in the checkpoint: the main stack plus multi-token-prediction layers."""
        return self.num_hidden_layers + self.num_nextn_predict_layers


MAX_LAYOUT_TENSORS = 2_000_000
"""Kimi-K2-Instruct implies 139,644 tensors; a config implying 14x that is not a real checkpoint (and its
layout would take GBs)."""


def _int(cfg: dict[str, Any], key: str, default: Any = ..., *, optional: bool = False) -> Any:
    if key not in cfg:
        if default is ...:
            raise ConfigError(f"config.json lacks {key!r}")
        return default
    v = cfg[key]
    if v is None and optional:
        return None
    if type(v) is not int or v < 0:
        raise ConfigError(f"config.json {key!r} must be a non-negative integer, got {v!r}")
    return v


def parse_quantization(q: Any) -> Quantization | None:
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ConfigError(f"config.json quantization_config must be an object, got {type(q).__name__}")
    block = q.get("weight_block_size", [128, 128])
    if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)):
        raise ConfigError(f"quantization_config.weight_block_size must be [rows, cols], got {block!r}")
    return Quantization(str(q.get("quant_method")), q.get("fmt"), (block[0], block[1]))


def model_config_from_dict(cfg: Any) -> ModelConfig:
    if not isinstance(cfg, dict):
        raise ConfigError("config.json is not a JSON object")
    torch_dtype = cfg.get("torch_dtype", "bfloat16")
    dtype = TORCH_DTYPE_TO_SAFETENSORS.get(torch_dtype) if isinstance(torch_dtype, str) else None
    if dtype is None:
        raise ConfigError(f"config.json torch_dtype {torch_dtype!r} is not one of {sorted(TORCH_DTYPE_TO_SAFETENSORS)}")
    eps = cfg.get("rms_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ConfigError(f"config.json rms_norm_eps must be a non-negative number, got {eps!r}")
    moe_layer_freq = _int(cfg, "moe_layer_freq", 1)
    if moe_layer_freq == 0:
        raise ConfigError("config.json moe_layer_freq must be at least 1")
    # A hostile config.json must not make the expected layout itself exhaust memory: bound its tensor
    # count (each layer holds ~40 tensors plus 6 per routed expert, weights and FP8 scales) before building it.
    layers = _int(cfg, "num_hidden_layers") + _int(cfg, "num_nextn_predict_layers", 0)
    experts = _int(cfg, "n_routed_experts", None, optional=True) or 0
    implied = layers * (40 + 6 * experts)
    if implied > MAX_LAYOUT_TENSORS:
        raise ConfigError(f"config.json implies about {implied:,} tensors ({layers:,} layers, {experts:,} routed "
                          f"experts), over the {MAX_LAYOUT_TENSORS:,} this tool builds a layout for")
    return ModelConfig(
        model_type=str(cfg.get("model_type", "deepseek_v3")),
        hidden_size=_int(cfg, "hidden_size"),
        intermediate_size=_int(cfg, "intermediate_size"),
        moe_intermediate_size=_int(cfg, "moe_intermediate_size", 0),
        q_lora_rank=_int(cfg, "q_lora_rank", None, optional=True),
        kv_lora_rank=_int(cfg, "kv_lora_rank"),
        num_attention_heads=_int(cfg, "num_attention_heads"),
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim"),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
        v_head_dim=_int(cfg, "v_head_dim"),
        num_hidden_layers=_int(cfg, "num_hidden_layers"),
        first_k_dense_replace=_int(cfg, "first_k_dense_replace", 0),
        moe_layer_freq=moe_layer_freq,
        n_routed_experts=_int(cfg, "n_routed_experts", None, optional=True),
        n_shared_experts=_int(cfg, "n_shared_experts", None, optional=True),
        num_experts_per_tok=_int(cfg, "num_experts_per_tok", None, optional=True),
        topk_method=cfg.get("topk_method"),
        vocab_size=_int(cfg, "vocab_size"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_nextn_predict_layers=_int(cfg, "num_nextn_predict_layers", 0),
        attention_bias=bool(cfg.get("attention_bias", False)),
        dtype=dtype,
        quantization=parse_quantization(cfg.get("quantization_config")),
        rms_norm_eps=float(eps),
    )


def parse_config_bytes(raw: bytes) -> tuple[dict[str, Any], ModelConfig]:
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"config.json is not valid JSON: {e}") from None
    if b"\\u" in raw:  # a lone surrogate escape decodes to a str no report can be written with
        try:
            json.dumps(cfg, ensure_ascii=False).encode("utf-8")
        except (UnicodeEncodeError, RecursionError, ValueError):
            raise ConfigError("config.json is not valid JSON: it holds a lone UTF-16 surrogate escape") from None
    return cfg, model_config_from_dict(cfg)


def pinned_config_bytes() -> bytes:
    """config.json of moonshotai/Kimi-K2-Instruct at the pinned revision, shipped as package data."""
    return resources.files("kimi_audit").joinpath("data/kimi-k2-instruct.config.json").read_bytes()
