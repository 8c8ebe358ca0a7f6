"""Mistral Small 4 (`model_type: mistral4`, transformers 5.25 `models/mistral4/`): DeepseekV3's tree (multi-head
latent attention with q_lora, dense blocks before `first_k_dense_replace`, MoE blocks with shared experts) with
the routed experts of a layer stored as two stacked parameters, `mlp.experts.gate_up_proj` [E, 2·I, H] and
`mlp.experts.down_proj` [E, H, I] (Mistral4NaiveMoe; the release stores them so: a loader of the published
files explodes exactly these two packed names into per-expert weights), and a softmax router with no score
correction bias (Mistral4TopkRouter). Defaults are Mistral4Config's. Proven against transformers 5.25
(tests/test_mistral4.py: its save audits clean, parameters = sum(numel)); the release's FP8 (per-tensor scales,
`*_scale_inv` and `*_activation_scale` beside the stacked experts) is not described: QUANT_UNSUPPORTED.
"""

from __future__ import annotations

from typing import Any

from kimi_audit.model.arch import deepseek_v3
from kimi_audit.model.arch.spec import Architecture, ModelTree, register
from kimi_audit.model.config_fields import ModelConfig

MODEL_TYPES = ("mistral4",)

DEFAULTS: dict[str, Any] = {
    "moe_intermediate_size": 2048, "q_lora_rank": 1024, "first_k_dense_replace": 0, "moe_layer_freq": 1,
    "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 4, "topk_method": "softmax",
    "num_nextn_predict_layers": 0, "tie_word_embeddings": False, "attention_bias": False, "rms_norm_eps": 1e-6,
}
"""Mistral4Config's defaults (transformers 5.25); `topk_method` is not one of its keys: its router is softmax
top-k with no `e_score_correction_bias`, so any config value of it is read as that."""


def read(cfg: dict[str, Any]) -> ModelConfig:
    return deepseek_v3.read_family({**cfg, "topk_method": "softmax"}, DEFAULTS, indexer=False, norm_f32=False)


def describe(cfg: ModelConfig) -> ModelTree:
    return deepseek_v3.describe(cfg, fused_experts=True)


ARCHITECTURE = register(Architecture(
    name="Mistral Small 4", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("Mistral4ForCausalLM",)))
