"""What every architecture's config reader returns (ModelConfig), and the one set of field readers they all
read config.json with: the same types, the same bounds and the same errors whatever the architecture
(`read_int`, `read_eps`, `weights_dtype`, `quantization`, `bounded`). Which reader a config gets is the
architecture registry's (model.arch); model.config dispatches."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kimi_audit.constants import TORCH_DTYPE_TO_SAFETENSORS
from kimi_audit.errors import ConfigError
from kimi_audit.model.quant.dispatch import quant_plan
from kimi_audit.model.quant.scheme import QuantPlan, ReleaseQuant, UnsupportedQuantization

DTYPE_KEYS = ("dtype", "torch_dtype")
"""Where config.json records the weights' dtype: transformers 5 writes `dtype`, earlier writers `torch_dtype`."""

@dataclass(frozen=True)
class VisionConfig:
    """kimi_k25's `vision_config` (MoonViT) and the projector's width: Kimi_K25VisionConfig in transformers
    5.25, whose defaults are moonshotai/Kimi-K2.6's (its docstring's checkpoint)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    patch_size: int
    pos_emb_height: int
    pos_emb_width: int
    merge_kernel: tuple[int, int]
    projection_hidden_size: int
    """The projector's LayerNorm width (`projection_hidden_size`); its Linear layers take
    projection_hidden_size x the merge kernel's area."""

    @property
    def merged_size(self) -> int:
        return self.projection_hidden_size * self.merge_kernel[0] * self.merge_kernel[1]


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
    """safetensors dtype of unquantized weights, from `dtype` (transformers 5) or `torch_dtype`."""
    rms_norm_eps: float
    quant: QuantPlan | None = None
    """Which scheme stores each Linear module (model.quant): the one description of the checkpoint's
    quantization; None: nothing quantized (or a method no scheme implements: see quant_unsupported)."""
    quant_unsupported: str | None = None
    """quantization_config's method or format that no scheme implements (a QUANT_UNSUPPORTED finding)."""
    index_n_heads: int | None = None
    """DeepSeek-V3.2's sparse-attention indexer (with index_head_dim); None: no indexer."""
    index_head_dim: int | None = None
    norm_dtype: str = ""
    """Dtype of the RMSNorm gains: F32 in DeepSeek-V3.2, else the weights' dtype."""
    layout_supported: bool = True
    """False for a config outside the DeepseekV3 family: only the format, index and file checks apply."""
    layer_kinds: tuple[str, ...] = ()
    """The block kind of each decoder layer, where the architecture schedules its layers itself (deepseek_v4's
    attention and MLP types, kimi_linear's KDA and MLA layers); empty: the DeepseekV3 rule (is_moe_layer)."""
    dims: tuple[tuple[str, int], ...] = ()
    """Dimensions of an architecture beyond the DeepseekV3 ones (config key -> value), read by its description
    (model.arch); `dim(key)` reads one."""

    prefix: str = ""
    """Where the text model's names sit: "" (`model.layers.N.`), `language_model.` for kimi_k25."""
    vision: VisionConfig | None = None
    """kimi_k25's MoonViT vision tower and projector; None: a text-only model."""
    layers_at: str = "model.layers."
    """Where the decoder layers sit in the text model (`model.layers.`; DeepSeek-V4's release: `layers.`)."""
    described_as: str = ""
    """The registered model_type whose architecture read this config, where config.json's own model_type is not
    one (a config named by its `architectures` class: `"deepseek_v4 "` beside DeepseekV4ForCausalLM)."""
    mtp_at: str = ""
    """Where the multi-token-prediction layers sit when not after the decoder layers under `layers_at`
    (DeepSeek-V4's release: `mtp.`, its stages `mtp.0.`, `mtp.1.` ...); "": they follow the decoder layers."""

    def dim(self, key: str) -> int:
        return dict(self.dims)[key]

    @property
    def layer_prefix(self) -> str:
        """What every decoder layer's names start with, before the layer index."""
        return f"{self.prefix}{self.layers_at}"

    def layer_name(self, layer: int) -> str:
        """The names of layer `layer` (MTP layers counted after the decoder layers) start with this:
        `model.layers.61.`, DeepSeek-V4's `layers.42.` and, for its first MTP stage, `mtp.0.`."""
        if self.mtp_at and layer >= self.num_hidden_layers:
            return f"{self.prefix}{self.mtp_at}{layer - self.num_hidden_layers}."
        return f"{self.layer_prefix}{layer}."

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


I64_MAX = 2**63 - 1
LAYER_KEYS = frozenset(("num_hidden_layers", "num_nextn_predict_layers", "depth", "num_layers"))
"""Keys that count layers (of a text model, its MTP stages, a vision tower): bounded where they are read."""
MAX_LAYERS = 10_000
"""Layers a config may declare in one stack (released models: under 100): a count checked before any per-layer
schedule is built from it (each layer holds dozens of tensors: MAX_LAYOUT_TENSORS bounds the layout after)."""


def layer_count(key: str, v: int) -> int:
    """A layer count, refused past MAX_LAYERS before anything is built from it."""
    if key in LAYER_KEYS and v > MAX_LAYERS:
        raise ConfigError(f"config.json {key!r} is {v:,} layers, over the {MAX_LAYERS:,} this tool builds a layout "
                          "for")
    return v


def _within_int64(key: str, v: int) -> None:
    """A size beyond a signed 64-bit integer (what torch and safetensors hold a dim in) is no real config's,
    and products of such sizes run past the digits Python will print (4,300): refused up front."""
    if v > I64_MAX:
        raise ConfigError(f"config.json {key!r} is a {v.bit_length():,}-bit integer, over 2^63 - 1")


def _writer_major(cfg: dict[str, Any]) -> int | None:
    """The major version of the transformers that last wrote config.json (`transformers_version`), if it says."""
    version = cfg.get("transformers_version")
    head = version.split(".", 1)[0] if isinstance(version, str) else ""
    return int(head) if head.isascii() and head.isdigit() and len(head) <= 4 else None


def dtype_keys(cfg: dict[str, Any]) -> tuple[str, ...]:
    """The dtype keys in the order they decide: `dtype` first (transformers 5 writes only it), then `torch_dtype`;
    where both are recorded and the last writer was a transformers before 5 (its `transformers_version`), its
    `torch_dtype` first. Such a writer (AutoAWQ under transformers 4.51) keeps a `dtype` it does not know as an
    extra attribute, from the transformers 5 that wrote the config before it: `torch_dtype: float16` is what it
    saved the tensors in, `dtype: bfloat16` stale (an error per unquantized tensor, read the other way)."""
    major = _writer_major(cfg)
    if major is not None and major < 5 and all(cfg.get(k) is not None for k in DTYPE_KEYS):
        return tuple(reversed(DTYPE_KEYS))
    return DTYPE_KEYS


def weights_dtype(cfg: dict[str, Any]) -> str:
    """The weights' dtype from the key that decides (dtype_keys); neither recorded means bfloat16."""
    for key in dtype_keys(cfg):
        value = cfg.get(key)
        if value is None:
            continue
        dtype = TORCH_DTYPE_TO_SAFETENSORS.get(value) if isinstance(value, str) else None
        if dtype is None:
            raise ConfigError(f"config.json {key} {value!r} is not one of {sorted(TORCH_DTYPE_TO_SAFETENSORS)}")
        return dtype
    return TORCH_DTYPE_TO_SAFETENSORS["bfloat16"]


def read_int(cfg: dict[str, Any], key: str, defaults: dict[str, Any], *, aliases: tuple[str, ...] = (),
             optional: bool = False) -> Any:
    """An integer key (or the first of its aliases config.json holds): a non-negative int within int64, None
    where `optional` allows it; absent, its `defaults` value (the architecture's configuration class's), and a
    ConfigError naming it where it has none."""
    for k in (key, *aliases):
        if k in cfg:
            v = cfg[k]
            if v is None and optional:
                return None
            if type(v) is not int or v < 0:
                raise ConfigError(f"config.json {k!r} must be a non-negative integer, got {v!r}")
            _within_int64(k, v)
            return layer_count(key, v)
    if key not in defaults:
        raise ConfigError(f"config.json lacks {key!r}")
    return defaults[key]


def read_eps(cfg: dict[str, Any], default: float, key: str = "rms_norm_eps") -> float:
    """A number key as a finite float >= 0; a 4,000-digit integer (JSON allows it) is a ConfigError, not an
    OverflowError from float()."""
    v = cfg.get(key, default)
    if type(v) in (int, float):
        try:
            f = float(v)
        except OverflowError:
            raise ConfigError(f"config.json {key} is a {int(v).bit_length():,}-bit integer, out of the float range") \
                from None
        if math.isfinite(f) and f >= 0:
            return f
    raise ConfigError(f"config.json {key} must be a non-negative number, got {v!r}")


def quantization(cfg: dict[str, Any], dtype: str, release: ReleaseQuant) -> tuple[QuantPlan | None, str | None]:
    """(the plan quantization_config describes, the method or format no scheme implements)."""
    try:
        return quant_plan(cfg.get("quantization_config"), dtype, cfg, release), None
    except UnsupportedQuantization as e:
        return None, str(e)


def bounded(layers: int, experts: int) -> None:
    """A hostile config.json must not make the expected layout itself exhaust memory: its tensor count (each
    layer holds ~40 tensors plus 6 per routed expert, weights and scales) is bounded before it is built."""
    implied = layers * (40 + 6 * experts)
    if implied > MAX_LAYOUT_TENSORS:
        raise ConfigError(f"config.json implies about {implied:,} tensors ({layers:,} layers, {experts:,} routed "
                          f"experts), over the {MAX_LAYOUT_TENSORS:,} this tool builds a layout for")


LINEAGE_BASE: dict[str, Any] = {
    "hidden_size": 0, "intermediate_size": 0, "moe_intermediate_size": 0, "q_lora_rank": None, "kv_lora_rank": 0,
    "num_attention_heads": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0,
    "num_hidden_layers": 0, "first_k_dense_replace": 0, "moe_layer_freq": 1, "n_routed_experts": None,
    "n_shared_experts": None, "num_experts_per_tok": None, "topk_method": None, "vocab_size": 0,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "attention_bias": False, "rms_norm_eps": 1e-6,
}
"""What a DeepseekV3 field means where an architecture has no such thing."""


def scheduled(cfg: dict[str, Any], fields: dict[str, Any], dims: dict[str, int], kinds: tuple[str, ...],
              release: ReleaseQuant) -> ModelConfig:
    """The ModelConfig of an architecture that schedules its layers itself (DeepSeek-V4, Kimi-Linear): its
    reader's values on the fields it shares with DeepseekV3, the rest in `dims`, the block kind of every layer."""
    dtype = weights_dtype(cfg)
    plan, unsupported = quantization(cfg, dtype, release)
    bounded(len(kinds), fields.get("n_routed_experts") or 0)
    return ModelConfig(**{**LINEAGE_BASE, **fields}, model_type=str(cfg["model_type"]), dtype=dtype,
                       norm_dtype=dtype, quant=plan, quant_unsupported=unsupported, layer_kinds=kinds,
                       dims=tuple(sorted(dims.items())))


def unsupported_config(cfg: dict[str, Any]) -> ModelConfig:
    """A placeholder for a config of no registered architecture: no layers, no layout (LAYOUT_UNSUPPORTED)."""
    return ModelConfig(
        model_type=str(cfg.get("model_type")), hidden_size=0, intermediate_size=0, moe_intermediate_size=0,
        q_lora_rank=None, kv_lora_rank=0, num_attention_heads=0, qk_nope_head_dim=0, qk_rope_head_dim=0,
        v_head_dim=0, num_hidden_layers=0, first_k_dense_replace=0, moe_layer_freq=1, n_routed_experts=None,
        n_shared_experts=None, num_experts_per_tok=None, topk_method=None, vocab_size=0, tie_word_embeddings=True,
        num_nextn_predict_layers=0, attention_bias=False, dtype="BF16", rms_norm_eps=1e-6,
        norm_dtype="BF16", layout_supported=False)


def nested_text(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """A multimodal config's text model (`text_config`), with the `quantization_config` and dtype of the top
    level winning over its own (releases keep them in either place)."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"config.json ({model_type}) lacks a text_config object")
    return {**text, **{k: cfg[k] for k in ("quantization_config", *DTYPE_KEYS) if cfg.get(k) is not None}}


def read_layer_types(cfg: dict[str, Any], key: str, allowed: set[str], n: int) -> list[str] | None:
    """A per-layer list of kinds (`layer_types`, `mlp_layer_types`): one of `allowed` for each of the `n`
    layers (a longer list is cut to n, as the configuration classes cut it); None where the key is absent."""
    v = cfg.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or any(not isinstance(t, str) or t not in allowed for t in v[:n]) or len(v) < n:
        raise ConfigError(f"config.json {key!r} must list one of {sorted(allowed)} for each of the {n} layers")
    return list(v[:n])
