"""Glm4MoeLiteForCausalLM as data: GLM-4.7-Flash (`glm4_moe_lite`), DeepseekV3's module tree.

transformers 5.25's modeling_glm4_moe_lite.py builds DeepseekV3Attention (multi-head latent attention) and
GLM-4.5's MoE (`mlp.gate.weight`, `mlp.gate.e_score_correction_bias`, the routed and shared experts), each name
DeepseekV3's, so the description is model.arch.deepseek_v3's; what differs is config-side (LITE_DEFAULTS): its
defaults, which layers are dense (`mlp_layer_types`, `"dense"` then `"sparse"` by default), and an absent
`num_nextn_predict_layers` declaring no MTP layer (the class has no such key: GLM-4.7-Flash's config.json declares
1, and its `model.layers.47` holds DeepseekV3's MTP head, `embed_tokens` and `shared_head.head` included, beside an
MoE layer; transformers drops it on load, _keys_to_ignore_on_load_unexpected). No rotary buffer is stored.

llama.cpp converts it to `deepseek2` (conversion/glm.py Glm4MoeLiteModel over DeepseekV2Model), deepseek_v3's
dialect, keeping the MTP layer (`deepseek2.nextn_predict_layers`, which `block_count` counts) where DeepseekV2Model
drops it; its file is read back by deepseek_v3's dialect (its `glm4` pre-tokenizer names this model type). This
record's dialect says how its release converts (`audit --against`): deepseek2's keys with the NextN layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kimi_audit.model.arch import deepseek_v3
from kimi_audit.model.arch.deepseek_v3 import gguf as deepseek2
from kimi_audit.model.arch.deepseek_v3.gguf_dsa import GGUF_DIALECT as DEEPSEEK_V3_GGUF
from kimi_audit.model.arch.spec import DENSE, MOE, Architecture, GgufDialect, register
from kimi_audit.model.config_fields import ModelConfig, read_int, read_layer_types

MODEL_TYPES = ("glm4_moe_lite",)
LITE_DEFAULTS: dict[str, Any] = {
    **deepseek_v3.REFERENCE_DEFAULTS, "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240,
    "moe_intermediate_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 20, "n_shared_experts": 1,
    "n_routed_experts": 64, "kv_lora_rank": 512, "q_lora_rank": 768, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "qk_nope_head_dim": 192, "num_experts_per_tok": 4, "rms_norm_eps": 1e-5, "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 0,
}
"""What an absent key means in a glm4_moe_lite config: transformers 5.25's Glm4MoeLiteConfig defaults (its
configuration_glm4_moe_lite.py; `first_k_dense_replace` 1 is its default `mlp_layer_types`, which the converter
reads as config.json's `first_k_dense_replace`), DeepseekV3's for the rest (noaux_tc routing)."""
MLP_TYPES = {"dense": DENSE, "sparse": MOE}


def read(cfg: dict[str, Any]) -> ModelConfig:
    """DeepseekV3's reader with GLM-4.7-Flash's defaults; `mlp_layer_types`, where config.json has it, decides
    each layer's MLP as Glm4MoeLiteDecoderLayer does."""
    parsed = deepseek_v3.read_family(cfg, LITE_DEFAULTS, indexer=False, norm_f32=False)
    n = read_int(cfg, "num_hidden_layers", LITE_DEFAULTS)
    types = read_layer_types(cfg, "mlp_layer_types", set(MLP_TYPES), n)
    if types is None:
        return parsed
    return replace(parsed, layer_kinds=tuple(MLP_TYPES[t] for t in types))


def gguf_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `deepseek2.*` keys Glm4MoeLiteModel writes from `config`: DeepseekV2Model's, with its NextN layers kept
    (`nextn_predict_layers`, and in `block_count`) where config.json declares them."""
    out = deepseek2.gguf_metadata(config)
    nextn, layers = config.get("num_nextn_predict_layers"), config.get("num_hidden_layers")
    if isinstance(nextn, int) and nextn > 0 and isinstance(layers, int):
        out.update({f"{deepseek2.GGUF_ARCH}.block_count": layers + nextn,
                    f"{deepseek2.GGUF_ARCH}.nextn_predict_layers": nextn})
    return out


GGUF_DIALECT: GgufDialect = replace(DEEPSEEK_V3_GGUF, metadata=gguf_metadata,
                                    text_of=deepseek_v3.MODEL_TYPES[0])
"""deepseek_v3's dialect with Glm4MoeLiteModel's metadata: the file reads back through deepseek_v3's (text_of)."""

ARCHITECTURE = register(Architecture(
    name="GLM-4.7-Flash", model_types=MODEL_TYPES, read=read, describe=deepseek_v3.describe,
    class_names=("Glm4MoeLiteForCausalLM",), float32_routers=deepseek_v3.ROUTER_FP32,
    buffered=deepseek_v3.ARCHITECTURE.buffered, value_roles=deepseek_v3.ARCHITECTURE.value_roles,
    writer_trees=deepseek_v3.WRITER_TREES, gguf=GGUF_DIALECT))
