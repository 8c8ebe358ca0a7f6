"""Glm4MoeForCausalLM as data: GLM-4.5, GLM-4.5-Air, GLM-4.6 and GLM-4.7 (`glm4_moe`).

Mirrors transformers 5.25's modeling_glm4_moe.py, whose save_pretrained writes the release's names
(tests/test_glm4_moe.py):
- Glm4MoeAttention, grouped-query attention: `self_attn.{q,k,v}_proj` [heads × head_dim, hidden] and
  [kv heads × head_dim, hidden], each with a bias where `attention_bias` is set, `self_attn.o_proj` (no bias), and
  where `use_qk_norm` is set (GLM-4.5's 355B) the per-head RMSNorms `self_attn.{q,k}_norm` [head_dim]; `head_dim`
  from config.json, else hidden / heads; half of each head rotated (`partial_rotary_factor`, the GGUF's
  `rope.dimension_count`), which changes no stored shape;
- the first `first_k_dense_replace` layers' MLP `mlp.{gate,up,down}_proj`, then Glm4MoeMoE: the router
  `mlp.gate.weight` [E, hidden] and `mlp.gate.e_score_correction_bias` [E] (a float32 buffer the release stores;
  both kept in float32 by transformers, _keep_in_fp32_modules_strict), the routed experts `mlp.experts.E.*` (fused in
  memory, saved per expert) and the shared experts `mlp.shared_experts.*` (moe_intermediate_size × n_shared);
- the multi-token-prediction (NextN) layers after the main stack (`num_nextn_predict_layers`, transformers'
  `num_mtp_layers`; GLM-4.5's `model.layers.92`, GLM-4.5-Air's 46), which transformers builds no module for
  (`_keys_to_ignore_on_load_unexpected`): vLLM's Glm4MoeMultiTokenPredictorLayer (tests/data/loader_names/
  glm4_moe.vllm.json) reads `enorm`, `hnorm`, `eh_proj`, `shared_head.norm` beside an ordinary MoE layer. Its
  `embed_tokens` and `shared_head.head` are copies of the main embedding and output head that GLM-4.5 and
  4.5-Air store there and GLM-4.6 does not (llama.cpp #16359 made them optional for it); the loaders use the main
  model's: described as a part the tree leaves out (`undescribed`), one info where stored, never a fault.

llama.cpp's GGUF (`glm4moe`) is the dialect in model.arch.glm4_moe.gguf; GLM-4.7-Flash (`glm4_moe_lite`, MLA) is
DeepseekV3's tree: model.arch.glm4_moe_lite.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import deepseek_v3
from kimi_audit.model.arch.deepseek_v3 import _Describe as _DeepseekV3
from kimi_audit.model.arch.glm4_moe.gguf import GGUF_DIALECT, MTP_COPIES
from kimi_audit.model.arch.spec import (
    ATTENTION_BIAS_KEYS,
    BLOCK_KEYS,
    DTYPE_KEYS,
    Architecture,
    Factor,
    Group,
    Leaf,
    Linear,
    ModelTree,
    Node,
    register,
)
from kimi_audit.model.config_fields import (
    LINEAGE_BASE,
    ModelConfig,
    bounded,
    quantization,
    read_eps,
    read_int,
    weights_dtype,
)
from kimi_audit.model.quant.gguf import GGUF_TREE

MODEL_TYPES = ("glm4_moe",)
CLASS_NAME = "Glm4MoeForCausalLM"
DEFAULTS: dict[str, Any] = {
    "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
    "num_attention_heads": 96, "num_key_value_heads": 8, "moe_intermediate_size": 1408, "num_experts_per_tok": 8,
    "n_shared_experts": 1, "n_routed_experts": 128, "first_k_dense_replace": 1, "num_nextn_predict_layers": 1,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False, "use_qk_norm": False,
}
"""What a key absent from config.json means: transformers 5.25's Glm4MoeConfig defaults (its checkpoint
zai-org/GLM-4.5's docstring; configuration_glm4_moe.py), `head_dim` hidden / heads (Glm4MoeAttention's getattr)."""
ALIASES = {"n_routed_experts": ("num_local_experts",), "num_nextn_predict_layers": ("num_mtp_layers",)}
"""Glm4MoeConfig.attribute_map: other names config.json may hold them under."""
WRITER_TREES = (GGUF_TREE,)
COPIES = ("embed_tokens", "shared_head_head")
"""DeepseekV3's MTP-head leaves GLM-4.x's tree leaves out (MTP_COPIES)."""
"""The other writers' trees it knows: llama.cpp's converter's (experts stacked, the embedding a weight)."""


def read_bool(cfg: dict[str, Any], key: str) -> bool:
    v = cfg.get(key, DEFAULTS[key])
    if not isinstance(v, bool):
        raise ConfigError(f"config.json {key!r} must be true or false, got {v!r}")
    return v


def rotary(cfg: dict[str, Any], head_dim: int) -> None:
    """`partial_rotary_factor` (at the top or in rope_parameters): a number in (0, 1] that rotates an even whole
    number of each head's dimensions (Glm4MoeRotaryEmbedding: dim = head_dim x factor, its inv_freq over
    arange(0, dim, 2)); it sizes no tensor, so nothing else would see it (ConfigError naming it)."""
    rope = cfg.get("rope_parameters")
    v = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor") if isinstance(rope, dict) else None)
    if v is None:
        return
    dims = head_dim * v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if dims is None or not 0 < v <= 1 or dims != int(dims) or int(dims) % 2:
        raise ConfigError(f"config.json partial_rotary_factor is {v!r}: a number in (0, 1] that rotates an even whole "
                          f"number of the {head_dim} dimensions of each head is needed")


def read(cfg: dict[str, Any]) -> ModelConfig:
    """A glm4_moe config as Glm4MoeConfig reads it: GQA dimensions in `dims` (num_key_value_heads, head_dim,
    use_qk_norm), the DeepseekV3 fields it shares on ModelConfig, every layer from first_k_dense_replace MoE."""

    def i(key: str, optional: bool = False) -> Any:
        return read_int(cfg, key, DEFAULTS, aliases=ALIASES.get(key, ()), optional=optional)

    heads, hidden = i("num_attention_heads"), i("hidden_size")
    if heads == 0:
        raise ConfigError("config.json num_attention_heads must be at least 1")
    kv_heads = i("num_key_value_heads")
    if kv_heads == 0 or heads % kv_heads:
        raise ConfigError(f"config.json num_key_value_heads {kv_heads} does not divide the {heads} attention heads")
    head_dim = read_int(cfg, "head_dim", {"head_dim": hidden // heads})
    rotary(cfg, head_dim)
    dtype = weights_dtype(cfg)
    plan, unsupported = quantization(cfg, dtype, ARCHITECTURE.quant)
    layers, experts = i("num_hidden_layers"), i("n_routed_experts", optional=True)
    mtp = i("num_nextn_predict_layers")
    bounded(layers + mtp, experts or 0)
    fields = {
        "hidden_size": hidden, "intermediate_size": i("intermediate_size"),
        "moe_intermediate_size": i("moe_intermediate_size"), "num_attention_heads": heads,
        "num_hidden_layers": layers, "first_k_dense_replace": i("first_k_dense_replace"),
        "n_routed_experts": experts, "n_shared_experts": i("n_shared_experts", optional=True),
        "num_experts_per_tok": i("num_experts_per_tok"), "topk_method": "noaux_tc", "vocab_size": i("vocab_size"),
        "tie_word_embeddings": read_bool(cfg, "tie_word_embeddings"), "num_nextn_predict_layers": mtp,
        "attention_bias": read_bool(cfg, "attention_bias"), "rms_norm_eps": read_eps(cfg, DEFAULTS["rms_norm_eps"]),
    }
    dims = {"num_key_value_heads": kv_heads, "head_dim": head_dim, "use_qk_norm": int(read_bool(cfg, "use_qk_norm"))}
    return ModelConfig(**{**LINEAGE_BASE, **fields}, model_type=str(cfg.get("model_type", MODEL_TYPES[0])),
                       dtype=dtype, norm_dtype=dtype, quant=plan, quant_unsupported=unsupported,
                       dims=tuple(sorted(dims.items())))


def describe(cfg: ModelConfig) -> ModelTree:
    return _Describe(cfg).tree()


class _Describe(_DeepseekV3):
    """DeepseekV3's tree (its norms, dense MLP, router, experts, shared experts, embedding and head, stacked as
    llama.cpp's converter stacks them) with GLM's grouped-query attention and its NextN head."""

    def attention(self) -> Group:
        c = self.cfg
        h, heads = self.f("hidden_size", "hidden"), self.f("num_attention_heads", "heads")
        kv = Factor(c.dim("num_key_value_heads"), "kv heads", ("num_key_value_heads",))
        hd = Factor(c.dim("head_dim"), "head dim", ("head_dim",))
        bias, keys = c.attention_bias, (BLOCK_KEYS, DTYPE_KEYS, ATTENTION_BIAS_KEYS)
        nodes: list[Node] = [
            Leaf(p, p, title, f"gqa_{p}", (Linear(f"self_attn.{p}", out, (h,), bias),), keys)
            for p, title, out in (("q_proj", "Query projection", (heads, hd)),
                                  ("k_proj", "Key projection", (kv, hd)),
                                  ("v_proj", "Value projection", (kv, hd)))]
        nodes.append(Leaf("o_proj", "o_proj", "Attention output projection", "o_proj",
                          (Linear("self_attn.o_proj", (h,), (heads, hd)),), (BLOCK_KEYS, DTYPE_KEYS)))
        if c.dim("use_qk_norm"):
            nodes += [self.gain(f"{p}_norm", f"{p}_norm", f"{title} RMSNorm (per head)", f"gqa_{p}_norm",
                                f"self_attn.{p}_norm.weight", hd, (*deepseek_v3.NORM_KEYS, "use_qk_norm"))
                      for p, title in (("q", "Query"), ("k", "Key"))]
        return Group("attention", "Grouped-query attention", tuple(nodes))

    def mtp_head(self) -> Group:
        """DeepseekV3's MTP head less the embedding and output head copies (MTP_COPIES: undescribed)."""
        head = super().mtp_head()
        kept = tuple(n for n in head.children if not isinstance(n, Leaf) or n.key not in COPIES)
        return replace(head, title="MTP norms and projection", children=kept)


ARCHITECTURE = register(Architecture(
    name="GLM-4.5", model_types=MODEL_TYPES, read=read, describe=describe, class_names=(CLASS_NAME,),
    writer_trees=WRITER_TREES, gguf=GGUF_DIALECT, titles={MODEL_TYPES[0]: "GLM-4.x"},
    undescribed={MTP_COPIES: "the NextN layer's copies of the embedding and output head (GLM-4.5 and 4.5-Air "
                 "store them, GLM-4.6 does not; loaders use the main model's)"},
    float32_routers=deepseek_v3.ROUTER_FP32, buffered=deepseek_v3.ARCHITECTURE.buffered,
    value_roles=deepseek_v3.ARCHITECTURE.value_roles))
