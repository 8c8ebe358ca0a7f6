"""GlmMoeDsaForCausalLM as data: GLM-5 (and 5.1, 5.2): multi-head latent attention with DeepSeek-V3.2's
sparse-attention indexer in every layer, dense then MoE blocks, a routed-expert router with
e_score_correction_bias.

transformers 5.25's modeling_glm_moe_dsa.py builds the same module tree as DeepseekV3 with V3.2's indexer
(`self_attn.indexer.{wq_b, wk, k_norm, weights_proj}`), so the description is deepseek_v3's; what differs is
config-side (GLM_DEFAULTS below): the norms are stored in the config's dtype (V3.2 keeps them F32),
no rotary buffer is stored, and an absent `num_nextn_predict_layers` declares no MTP layer.
Per layer, `indexer_types` (or transformers' `index_topk_pattern`, or its `index_topk_freq` /
`index_skip_topk_offset` schedule) says whether the layer runs its own indexer (`full`) or reuses the previous
full layer's selection (`shared`: GlmMoeDsaAttention builds no indexer there, modeling_glm_moe_dsa.py); shared
layers are their own block kinds (`dense_shared`, `moe_shared`), the layer without its indexer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import deepseek_v3
from kimi_audit.model.arch.spec import DENSE, MOE, Architecture, Group, ModelTree, Node, register
from kimi_audit.model.config_fields import ModelConfig

MODEL_TYPES = ("glm_moe_dsa",)
GLM_DEFAULTS: dict[str, Any] = {**deepseek_v3.REFERENCE_DEFAULTS,
                                "index_n_heads": 32, "index_head_dim": 128, "num_nextn_predict_layers": 0,
                                "first_k_dense_replace": 3, "n_routed_experts": 256, "moe_intermediate_size": 2048,
                                "q_lora_rank": 2048, "rms_norm_eps": 1e-5}
"""What an absent key means in a glm_moe_dsa config: GlmMoeDsaConfig's defaults (transformers 5.25,
models/glm_moe_dsa/configuration_glm_moe_dsa.py). It has no `num_nextn_predict_layers`: absent, none is
declared (GLM-5's layer 78 is dropped on load, _keys_to_ignore_on_load_unexpected); no `topk_method` either
(its router always holds e_score_correction_bias, noaux_tc)."""


SHARED = "_shared"
"""The block-kind suffix of a layer that reuses the previous full layer's indexer selection (no indexer)."""


def indexer_types(cfg: dict[str, Any], n: int) -> list[str]:
    """Each decoder layer's indexer mode, as GlmMoeDsaConfig.__post_init__ reads it: `indexer_types`, else
    `index_topk_pattern` (`"FSSF..."`), else every `index_topk_freq`-th layer from `index_skip_topk_offset`."""
    types = cfg.get("indexer_types")
    if types is None and cfg.get("index_topk_pattern") is not None:
        pattern = cfg["index_topk_pattern"]
        if not isinstance(pattern, (str, list)) or any(c not in ("F", "S", "full", "shared") for c in pattern):
            raise ConfigError(f"config.json index_topk_pattern {pattern!r} is not a string of F and S")
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
    if types is None:
        freq, offset = cfg.get("index_topk_freq", 1), cfg.get("index_skip_topk_offset", 2)
        if type(freq) is not int or type(offset) is not int:
            raise ConfigError("config.json index_topk_freq and index_skip_topk_offset must be integers")
        freq = max(freq, 1)
        types = ["full" if (max(i - offset + 1, 0) % freq) == 0 else "shared" for i in range(n)]
    if not isinstance(types, (list, tuple)) or any(t not in ("full", "shared") for t in types) or len(types) < n:
        raise ConfigError(f"config.json indexer_types must give full or shared for each of the {n} layers")
    return list(types[:n])


def read(cfg: dict[str, Any]) -> ModelConfig:
    parsed = deepseek_v3.read_family(cfg, GLM_DEFAULTS, indexer=True, norm_f32=False)
    types = indexer_types(cfg, parsed.num_hidden_layers)
    if all(t == "full" for t in types):
        return parsed
    kinds = tuple((MOE if parsed.is_moe_layer(i) else DENSE) + ("" if t == "full" else SHARED)
                  for i, t in enumerate(types))
    return replace(parsed, layer_kinds=kinds)


def describe(cfg: ModelConfig) -> ModelTree:
    """DeepseekV3's tree with V3.2's indexer; shared layers the same layer without it."""
    tree = deepseek_v3.describe(cfg)
    blocks = dict(tree.blocks)
    for kind in dict.fromkeys(cfg.layer_kinds):
        if kind.endswith(SHARED):
            blocks[kind] = tuple(_without_indexer(n) for n in tree.blocks[kind.removesuffix(SHARED)])
    return ModelTree(tree.before, blocks, tree.after)


def _without_indexer(node: Node) -> Node:
    if isinstance(node, Group):
        return replace(node, children=tuple(_without_indexer(c) for c in node.children
                                            if not (isinstance(c, Group) and c.key == "indexer")))
    return node


ARCHITECTURE = register(Architecture(
    name="GLM-5", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("GlmMoeDsaForCausalLM",), float32_routers=deepseek_v3.ROUTER_FP32,
    buffered=deepseek_v3.ARCHITECTURE.buffered, value_roles=deepseek_v3.ARCHITECTURE.value_roles,
    quant=deepseek_v3.V32_RELEASE,
    block_titles={DENSE + SHARED: "dense (shared indexer)", MOE + SHARED: "MoE (shared indexer)"}))
