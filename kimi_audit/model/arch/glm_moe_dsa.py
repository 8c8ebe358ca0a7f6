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

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kimi_audit.errors import ConfigError, GgufKeyError
from kimi_audit.findings import Finding
from kimi_audit.format.gguf import KEEP_ARRAY, GgufArray
from kimi_audit.format.gguf_keys import BOOL
from kimi_audit.model.arch import deepseek_v3
from kimi_audit.model.arch.deepseek_v3 import gguf as deepseek2
from kimi_audit.model.arch.deepseek_v3.gguf_dsa import (
    DSA_KEY_TYPES,
    DSA_LAYER,
    dsa_config,
    dsa_converted,
    dsa_metadata,
    dsa_release_values,
)
from kimi_audit.model.arch.spec import DENSE, MOE, Architecture, GgufDialect, Group, ModelTree, Node, register
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


GGUF_ARCH = "glm-dsa"
GLM_5_2_CONTEXT = 1048576
"""glm-dsa.cpp: a file whose context length is below it is GLM-5 / 5.1 (every indexer full) when it holds no
`attention.indexer.types`."""


def glm_5_2_indexers(n: int) -> list[bool]:
    """glm-dsa.cpp GLM_5_2_DEFAULT_INDEXER_TYPES: layers 0 and 1 full, then every fourth from layer 2."""
    return [i < 2 or (i - 2) % 4 == 0 for i in range(n)]


def gguf_config(kv: Mapping[str, Any], stored: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Any], list[Finding]]:
    """A `glm-dsa` GGUF's config.json, as llama.cpp's glm-dsa loader reads the metadata."""
    a = GGUF_ARCH
    kv = dict(kv)
    if not kv.get(f"{a}.expert_gating_func"):  # LLAMA_EXPERT_GATING_FUNC_TYPE_NONE reads as sigmoid
        kv[f"{a}.expert_gating_func"] = deepseek2.SIGMOID
    cfg, findings = dsa_config(kv, stored, a)
    key, kvl = kv.get(f"{a}.attention.key_length"), kv.get(f"{a}.attention.kv_lora_rank")
    mla = kv.get(f"{a}.attention.key_length_mla")
    if isinstance(key, int) and isinstance(kvl, int) and isinstance(mla, int):  # the whole rope dim, not the rotary
        cfg.update(qk_rope_head_dim=key - kvl, qk_nope_head_dim=mla - (key - kvl))
    n = cfg["num_hidden_layers"]
    types = kv.get(f"{a}.attention.indexer.types")
    count, blocks = getattr(types, "count", None), kv.get(f"{a}.block_count")
    if count is not None and count != blocks:  # llama-model-loader.cpp get_key_or_arr: "wrong array length"
        raise GgufKeyError(f"{a}.attention.indexer.types holds {count:,} values for {blocks} blocks: llama.cpp "
                           "cannot load it", f"{a}.attention.indexer.types")
    if types is not None and getattr(types, "values", types) is None:
        # an array longer than format.gguf keeps the values of (KEEP_ARRAY): the layers storing an indexer say
        types = [f"blk.{i}.indexer.attn_k.weight" in stored for i in range(n)]
    types = getattr(types, "values", types)  # an array (format.gguf.GgufArray) or one value for every layer
    if types is None:
        full = [True] * n if (kv.get(f"{a}.context_length") or 0) < GLM_5_2_CONTEXT else glm_5_2_indexers(n)
    else:
        full = [bool(t) for t in types] if isinstance(types, (list, tuple)) else [bool(types)] * n
        if len(full) < n:
            raise GgufKeyError(f"{a}.attention.indexer.types holds {len(full)} values for {n} layers: llama.cpp "
                               "cannot load it", f"{a}.attention.indexer.types")
    cfg.update({"architectures": ["GlmMoeDsaForCausalLM"], "model_type": MODEL_TYPES[0],
                "indexer_types": ["full" if f else "shared" for f in full]})
    return cfg, findings


def gguf_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `glm-dsa.*` keys GlmMoeDsaModel.set_gguf_parameters writes from `config`."""
    a = GGUF_ARCH
    out = dsa_metadata(config, a)
    rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    factor = (rope or {}).get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if isinstance(config.get("qk_rope_head_dim"), int):
        out[f"{a}.rope.dimension_count"] = int(config["qk_rope_head_dim"] * factor)
    types = config.get("indexer_types")
    if isinstance(types, list):  # a BOOL array, as format.gguf reads it back (values kept while short)
        full = tuple(t == "full" for t in types)
        out[f"{a}.attention.indexer.types"] = GgufArray(BOOL, len(full), full if len(full) <= KEEP_ARRAY else None)
    return out


def _gguf() -> GgufDialect:
    return GGUF_DIALECT


GGUF_DIALECT = replace(deepseek2.GGUF_DIALECT, archs=(GGUF_ARCH,), config=gguf_config, metadata=gguf_metadata,
                       layer=DSA_LAYER, converted=dsa_converted(_gguf), release_values=dsa_release_values(_gguf),
                       key_types=DSA_KEY_TYPES)
"""deepseek2's dialect (its required keys included) with GLM-5's metadata and the indexer's names."""


ARCHITECTURE = register(Architecture(
    name="GLM-5", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("GlmMoeDsaForCausalLM",), float32_routers=deepseek_v3.ROUTER_FP32,
    buffered=deepseek_v3.ARCHITECTURE.buffered, value_roles=deepseek_v3.ARCHITECTURE.value_roles,
    quant=deepseek_v3.V32_RELEASE, writer_trees=deepseek_v3.WRITER_TREES, gguf=GGUF_DIALECT,
    block_titles={DENSE + SHARED: "dense (shared indexer)", MOE + SHARED: "MoE (shared indexer)"}))
