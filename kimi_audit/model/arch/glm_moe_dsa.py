"""GlmMoeDsaForCausalLM as data: GLM-5 (and 5.1, 5.2): multi-head latent attention with DeepSeek-V3.2's
sparse-attention indexer in every layer, dense then MoE blocks, a routed-expert router with
e_score_correction_bias.

transformers 5.25's modeling_glm_moe_dsa.py builds the same module tree as DeepseekV3 with V3.2's indexer
(`self_attn.indexer.{wq_b, wk, k_norm, weights_proj}`), so the description is deepseek_v3's; what differs is
config-side (GLM_DEFAULTS below): the norms are stored in the config's dtype (V3.2 keeps them F32),
no rotary buffer is stored, and an absent `num_nextn_predict_layers` declares no MTP layer.
Not covered: configs whose `indexer_types` share one layer's indexer with the next ("shared" layers hold no
indexer; `read` refuses them with a ConfigError).
"""

from __future__ import annotations

from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import deepseek_v3
from kimi_audit.model.arch.spec import Architecture, register
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


def read(cfg: dict[str, Any]) -> ModelConfig:
    indexer_types = cfg.get("indexer_types") or ()
    if not isinstance(indexer_types, (list, tuple)):
        raise ConfigError(f"config.json indexer_types must be a list, got {type(indexer_types).__name__}")
    if any(t != "full" for t in indexer_types):
        raise ConfigError("config.json indexer_types shares an indexer between layers ('shared'): this tool "
                          "derives layouts with an indexer in every layer only")
    return deepseek_v3.read_family(cfg, GLM_DEFAULTS, indexer=True, norm_f32=False)


ARCHITECTURE = register(Architecture(
    name="GLM-5", model_types=MODEL_TYPES, read=read, describe=deepseek_v3.describe,
    class_names=("GlmMoeDsaForCausalLM",), float32_routers=deepseek_v3.ROUTER_FP32,
    buffered=deepseek_v3.ARCHITECTURE.buffered, value_roles=deepseek_v3.ARCHITECTURE.value_roles))
