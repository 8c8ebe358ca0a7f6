"""The DeepseekV3-family config (Kimi-K2, DeepSeek-V3/R1, V3.2, GLM-5's glm_moe_dsa, and Kimi-K2.5/K2.6's
kimi_k25: that text model under `language_model.` with a MoonViT vision tower) as the layout needs it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.lineage import LINEAGE_BASE, LINEAGE_READERS, Read
from kimi_audit.model.quant.dispatch import quant_plan
from kimi_audit.model.quant.scheme import QuantPlan, UnsupportedQuantization

TORCH_DTYPE_TO_SAFETENSORS = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}

DTYPE_KEYS = ("dtype", "torch_dtype")
"""Where config.json records the weights' dtype: transformers 5 writes `dtype`, earlier writers `torch_dtype`."""

REFERENCE_DEFAULTS: dict[str, Any] = {
    "moe_intermediate_size": 2048,
    "q_lora_rank": 1536,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "topk_method": "noaux_tc",
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
}
"""What a key absent from config.json means: the defaults of `DeepseekV3Config.__init__` in DeepSeek's
configuration_deepseek.py (the reference the layout mirrors), so an omitted key builds the model that code
builds. transformers' DeepseekV3Config (5.x) agrees on every value it has, but has no `topk_method` (its
DeepseekV3TopkRouter always holds `e_score_correction_bias`, i.e. noaux_tc) and no `moe_layer_freq` (every
layer from `first_k_dense_replace` on is MoE, i.e. 1), so it never writes them; it writes
`num_nextn_predict_layers` (default 1) but builds and saves no MTP layer.

The dimensions (hidden_size, intermediate_size, kv_lora_rank, heads and head dims, num_hidden_layers,
vocab_size) stay required: every writer records them, and a config without them is not one to audit against
the 671B defaults; their absence is a ConfigError that names the key.
"""


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


VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 14,
    "pos_emb_height": 64, "pos_emb_width": 64, "merge_kernel_size": [2, 2],
}
"""Kimi_K25VisionConfig's defaults (transformers 5.25, models/kimi_k25/configuration_kimi_k25.py)."""
PROJECTION_HIDDEN_DEFAULT = 1152
"""Kimi_K25Config.projection_hidden_size's default (the same file)."""


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

    def dim(self, key: str) -> int:
        return dict(self.dims)[key]

    @property
    def layer_prefix(self) -> str:
        """What every decoder layer's names start with, before the layer index."""
        return f"{self.prefix}{self.layers_at}"

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


def _int(cfg: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    """An integer key; absent, its REFERENCE_DEFAULTS value, and a ConfigError naming it if it has none."""
    if key not in cfg:
        if key not in REFERENCE_DEFAULTS:
            raise ConfigError(f"config.json lacks {key!r}")
        return REFERENCE_DEFAULTS[key]
    v = cfg[key]
    if v is None and optional:
        return None
    if type(v) is not int or v < 0:
        raise ConfigError(f"config.json {key!r} must be a non-negative integer, got {v!r}")
    _within_int64(key, v)
    return v


I64_MAX = 2**63 - 1


def _within_int64(key: str, v: int) -> None:
    """A size beyond a signed 64-bit integer (what torch and safetensors hold a dim in) is no real config's,
    and products of such sizes run past the digits Python will print (4,300): refused up front."""
    if v > I64_MAX:
        raise ConfigError(f"config.json {key!r} is a {v.bit_length():,}-bit integer, over 2^63 - 1")


def _non_negative_float(cfg: dict[str, Any], key: str) -> float:
    """A number key as a finite float >= 0; a 4,000-digit integer (JSON allows it) is a ConfigError, not an
    OverflowError from float()."""
    v = _default(cfg, key)
    if type(v) in (int, float):
        try:
            f = float(v)
        except OverflowError:
            raise ConfigError(f"config.json {key} is a {int(v).bit_length():,}-bit integer, out of the float range") \
                from None
        if math.isfinite(f) and f >= 0:
            return f
    raise ConfigError(f"config.json {key} must be a non-negative number, got {v!r}")


def _weights_dtype(cfg: dict[str, Any]) -> str:
    """`dtype` first (transformers 5 writes only it), then `torch_dtype`; neither recorded means bfloat16."""
    for key in DTYPE_KEYS:
        value = cfg.get(key)
        if value is None:
            continue
        dtype = TORCH_DTYPE_TO_SAFETENSORS.get(value) if isinstance(value, str) else None
        if dtype is None:
            raise ConfigError(f"config.json {key} {value!r} is not one of {sorted(TORCH_DTYPE_TO_SAFETENSORS)}")
        return dtype
    return TORCH_DTYPE_TO_SAFETENSORS["bfloat16"]


def _default(cfg: dict[str, Any], key: str) -> Any:
    return cfg.get(key, REFERENCE_DEFAULTS[key])


FAMILY_TYPES = frozenset(("deepseek_v3", "deepseek_v32", "kimi_k2", "glm_moe_dsa", "kimi_k25"))
FAMILY_ARCHITECTURES = frozenset(("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM",
                                  "KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration"))
INDEXER_TYPES = frozenset(("deepseek_v32", "glm_moe_dsa"))
"""model_types with DeepSeek Sparse Attention's indexer in every layer."""
GLM_DEFAULTS: dict[str, Any] = {"index_n_heads": 32, "index_head_dim": 128, "num_nextn_predict_layers": 0,
                                "first_k_dense_replace": 3, "n_routed_experts": 256, "moe_intermediate_size": 2048,
                                "q_lora_rank": 2048, "rms_norm_eps": 1e-5}
"""What an absent key means in a glm_moe_dsa config: GlmMoeDsaConfig's defaults (transformers 5.25,
models/glm_moe_dsa/configuration_glm_moe_dsa.py). It has no `num_nextn_predict_layers`: absent, none is
declared (GLM-5's layer 78 is dropped on load, _keys_to_ignore_on_load_unexpected); no `topk_method` either
(its router always holds e_score_correction_bias, noaux_tc)."""


def in_family(cfg: dict[str, Any]) -> bool:
    """A DeepseekV3-family config (model_type or architectures), whose layout this tool derives. One that
    names neither is read as the family's (and must then hold its keys)."""
    archs = cfg.get("architectures")
    if "model_type" not in cfg and "architectures" not in cfg:
        return True
    model_type = cfg.get("model_type")
    return (type(model_type) is str and model_type in FAMILY_TYPES) or (
        isinstance(archs, list) and any(a in FAMILY_ARCHITECTURES for a in archs if isinstance(a, str)))


def unsupported_config(cfg: dict[str, Any]) -> ModelConfig:
    """A placeholder for a config outside the family: no layers, no layout (LAYOUT_UNSUPPORTED)."""
    return ModelConfig(
        model_type=str(cfg.get("model_type")), hidden_size=0, intermediate_size=0, moe_intermediate_size=0,
        q_lora_rank=None, kv_lora_rank=0, num_attention_heads=0, qk_nope_head_dim=0, qk_rope_head_dim=0,
        v_head_dim=0, num_hidden_layers=0, first_k_dense_replace=0, moe_layer_freq=1, n_routed_experts=None,
        n_shared_experts=None, num_experts_per_tok=None, topk_method=None, vocab_size=0, tie_word_embeddings=True,
        num_nextn_predict_layers=0, attention_bias=False, dtype="BF16", rms_norm_eps=1e-6,
        norm_dtype="BF16", layout_supported=False)


def _vision(cfg: dict[str, Any]) -> VisionConfig:
    raw = cfg.get("vision_config") or {}
    if not isinstance(raw, dict):
        raise ConfigError("config.json vision_config is not an object")
    v = {**VISION_DEFAULTS, **{k: raw[k] for k in VISION_DEFAULTS if k in raw}}
    for key in VISION_DEFAULTS:
        if key != "merge_kernel_size" and (type(v[key]) is not int or v[key] <= 0):
            raise ConfigError(f"config.json vision_config.{key} must be a positive integer, got {v[key]!r}")
    merge = v["merge_kernel_size"]
    if not (isinstance(merge, list) and len(merge) == 2 and all(type(m) is int and m > 0 for m in merge)):
        raise ConfigError(f"config.json vision_config.merge_kernel_size {merge!r} is not [rows, cols]")
    proj = cfg.get("projection_hidden_size", PROJECTION_HIDDEN_DEFAULT)
    if proj is None:
        proj = v["hidden_size"]
    if type(proj) is not int or proj <= 0:
        raise ConfigError(f"config.json projection_hidden_size must be a positive integer, got {proj!r}")
    return VisionConfig(v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"], v["patch_size"],
                        v["pos_emb_height"], v["pos_emb_width"], (merge[0], merge[1]), proj)


def _kimi_k25(cfg: dict[str, Any]) -> ModelConfig:
    """kimi_k25: the nested `text_config` is a DeepseekV3 config (Kimi-K2's); its `quantization_config` may
    sit inside it or at the top (both are read; the top one wins), and so may the dtype."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError("config.json (kimi_k25) lacks a text_config object")
    merged = {**text, "model_type": "deepseek_v3"}
    for key in ("quantization_config", *DTYPE_KEYS):
        if cfg.get(key) is not None:
            merged[key] = cfg[key]
    parsed = model_config_from_dict(merged)
    return replace(parsed, model_type="kimi_k25", prefix="language_model.", vision=_vision(cfg))


def model_config_from_dict(cfg: Any) -> ModelConfig:
    if not isinstance(cfg, dict):
        raise ConfigError("config.json is not a JSON object")
    model_type = cfg.get("model_type")
    reader = LINEAGE_READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is not None:
        return _lineage(cfg, reader)
    if not in_family(cfg):
        return unsupported_config(cfg)
    if model_type is not None and not isinstance(model_type, str):  # a family member by its architectures
        raise ConfigError(f"config.json model_type must be a string, got {type(model_type).__name__}")
    if cfg.get("model_type") == "kimi_k25" or (
            "model_type" not in cfg and "text_config" in cfg and "vision_config" in cfg):
        return _kimi_k25(cfg)
    if cfg.get("model_type") == "glm_moe_dsa":
        cfg = {**GLM_DEFAULTS, **cfg}
    dtype = _weights_dtype(cfg)
    raw_quant = cfg.get("quantization_config")
    plan, unsupported = None, None
    try:
        plan = quant_plan(raw_quant, dtype, cfg)
    except UnsupportedQuantization as e:
        unsupported = str(e)
    v32 = cfg.get("model_type") in INDEXER_TYPES
    indexer_types = cfg.get("indexer_types") or ()
    if cfg.get("model_type") == "glm_moe_dsa" and not isinstance(indexer_types, (list, tuple)):
        raise ConfigError(f"config.json indexer_types must be a list, got {type(indexer_types).__name__}")
    if cfg.get("model_type") == "glm_moe_dsa" and any(t != "full" for t in indexer_types):
        raise ConfigError("config.json indexer_types shares an indexer between layers ('shared'): this tool "
                          "derives layouts with an indexer in every layer only")
    eps = _non_negative_float(cfg, "rms_norm_eps")
    moe_layer_freq = _int(cfg, "moe_layer_freq")
    if moe_layer_freq == 0:
        raise ConfigError("config.json moe_layer_freq must be at least 1")
    # A hostile config.json must not make the expected layout itself exhaust memory: bound its tensor
    # count (each layer holds ~40 tensors plus 6 per routed expert, weights and FP8 scales) before building it.
    layers = _int(cfg, "num_hidden_layers") + _int(cfg, "num_nextn_predict_layers")
    experts = _int(cfg, "n_routed_experts", optional=True) or 0
    implied = layers * (40 + 6 * experts)
    if implied > MAX_LAYOUT_TENSORS:
        raise ConfigError(f"config.json implies about {implied:,} tensors ({layers:,} layers, {experts:,} routed "
                          f"experts), over the {MAX_LAYOUT_TENSORS:,} this tool builds a layout for")
    return ModelConfig(
        model_type=str(cfg.get("model_type", "deepseek_v3")),
        hidden_size=_int(cfg, "hidden_size"),
        intermediate_size=_int(cfg, "intermediate_size"),
        moe_intermediate_size=_int(cfg, "moe_intermediate_size"),
        q_lora_rank=_int(cfg, "q_lora_rank", optional=True),
        kv_lora_rank=_int(cfg, "kv_lora_rank"),
        num_attention_heads=_int(cfg, "num_attention_heads"),
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim"),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
        v_head_dim=_int(cfg, "v_head_dim"),
        num_hidden_layers=_int(cfg, "num_hidden_layers"),
        first_k_dense_replace=_int(cfg, "first_k_dense_replace"),
        moe_layer_freq=moe_layer_freq,
        n_routed_experts=_int(cfg, "n_routed_experts", optional=True),
        n_shared_experts=_int(cfg, "n_shared_experts", optional=True),
        num_experts_per_tok=_int(cfg, "num_experts_per_tok", optional=True),
        topk_method=_default(cfg, "topk_method"),
        vocab_size=_int(cfg, "vocab_size"),
        tie_word_embeddings=bool(_default(cfg, "tie_word_embeddings")),
        num_nextn_predict_layers=_int(cfg, "num_nextn_predict_layers"),
        attention_bias=bool(_default(cfg, "attention_bias")),
        dtype=dtype,
        rms_norm_eps=eps,
        quant=plan,
        quant_unsupported=unsupported,
        index_n_heads=_int(cfg, "index_n_heads", optional=True) if v32 else None,
        index_head_dim=_int(cfg, "index_head_dim", optional=True) if v32 else None,
        norm_dtype="F32" if cfg.get("model_type") == "deepseek_v32" else dtype,
    )


def _lineage(cfg: dict[str, Any], reader: Callable[[dict[str, Any]], Read]) -> ModelConfig:
    """A config of an architecture that schedules its layers itself (model.lineage): its reader's values on
    the fields they share with DeepseekV3's, the rest in `dims`."""
    dtype = _weights_dtype(cfg)
    plan, unsupported = None, None
    try:
        plan = quant_plan(cfg.get("quantization_config"), dtype, cfg)
    except UnsupportedQuantization as e:
        unsupported = str(e)
    fields, dims, kinds = reader(cfg)
    implied = len(kinds) * (40 + 6 * (fields.get("n_routed_experts") or 0))
    if implied > MAX_LAYOUT_TENSORS:
        raise ConfigError(f"config.json implies about {implied:,} tensors, over the {MAX_LAYOUT_TENSORS:,} this "
                          "tool builds a layout for")
    return ModelConfig(**{**LINEAGE_BASE, **fields}, model_type=str(cfg["model_type"]), dtype=dtype,
                       norm_dtype=dtype, quant=plan, quant_unsupported=unsupported, layer_kinds=kinds,
                       dims=tuple(sorted(dims.items())))


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
