"""GlmMoeDsaForCausalLM as data: GLM-5 (and 5.1, 5.2): multi-head latent attention with DeepSeek-V3.2's
sparse-attention indexer in every layer, dense then MoE blocks, a routed-expert router with
e_score_correction_bias.

transformers 5.25's modeling_glm_moe_dsa.py builds the same module tree as DeepseekV3 with V3.2's indexer
(`self_attn.indexer.{wq_b, wk, k_norm, weights_proj}`), so the description is deepseek_v3's; what differs is
config-side (model.config.GLM_DEFAULTS): the norms are stored in the config's dtype (V3.2 keeps them F32),
no rotary buffer is stored, and an absent `num_nextn_predict_layers` declares no MTP layer.
Not covered: configs whose `indexer_types` share one layer's indexer with the next ("shared" layers hold no
indexer; model.config refuses them with a ConfigError).
"""

from __future__ import annotations

from kimi_audit.model.arch import deepseek_v3
from kimi_audit.model.arch.spec import Dialect, ModelTree
from kimi_audit.model.config import ModelConfig

MODEL_TYPES = ("glm_moe_dsa",)


def describe(cfg: ModelConfig) -> ModelTree:
    return deepseek_v3.describe(cfg)


def dialects(cfg: ModelConfig) -> tuple[Dialect, ...]:
    return ()
