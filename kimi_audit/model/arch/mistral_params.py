"""Mistral's own release format: `params.json` in place of config.json, beside `consolidated*.safetensors` in
Mistral's names. This module is the one adapter: it turns params.json into the config dict the architecture's
reader takes (model.config reads it where a checkpoint has no config.json), so the rest of the audit sees one
path. The names are the architecture's own (model.arch.mistral4's Mistral spelling, `load_format: mistral`).

The keys are read as llama.cpp's converter reads them (ggml-org/llama.cpp@0c1e57098 `conversion/mistral.py`
MistralMoeModel.__init__, lines 127-168, transcribed in tests/data/loader_names/mistral_format.llamacpp.json):
top-level `dim`, `norm_eps`, `n_kv_heads`, `n_layers`, `n_heads`, `hidden_dim`, `tied_embeddings`, and under
`moe` `route_every_n`, `first_k_dense_replace`, `num_experts_per_tok`, `num_experts`, `expert_hidden_dim`,
`routed_scale`, `num_shared_experts`, `num_expert_groups`, `num_expert_groups_per_tok`; the MLA keys
(`q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`) and `vocab_size` keep their
names (DeepseekV2Model.set_gguf_parameters reads them as they are). `quantization` (`qformat_weight`) is the
FP8 format's (model.quant.mistral_fp8); `vision_encoder` is the Pixtral tower's config (conversion/base.py
MmprojModel.get_vision_config reads `vision_encoder` in the Mistral format).

A params.json of a model outside the family (a dense Mistral, Mixtral's MoE without a latent KV) becomes a
config of no registered architecture: LAYOUT_UNSUPPORTED, as for any other.
"""

from __future__ import annotations

import json
from typing import Any

from kimi_audit.errors import ConfigError

PARAMS_FILE = "params.json"
LOAD_FORMAT = "mistral"
"""The `load_format` the adapter writes (vLLM's `--load-format mistral`): the reader spells the tree in Mistral's
names."""
MLA_TYPE = "mistral4"
"""The architecture an MLA MoE params.json is (Mistral Small 4, Mistral Large 3: DeepseekV3's tree)."""

TOP = {"dim": "hidden_size", "norm_eps": "rms_norm_eps", "n_kv_heads": "num_key_value_heads",
       "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size"}
"""params.json key -> config.json key (MistralMoeModel's `config_mapping`)."""
SAME = ("vocab_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""Keys the converter reads under their config.json names."""
MOE = {"route_every_n": "moe_layer_freq", "first_k_dense_replace": "first_k_dense_replace",
       "num_experts_per_tok": "num_experts_per_tok", "num_experts": "n_routed_experts",
       "expert_hidden_dim": "moe_intermediate_size", "routed_scale": "routed_scaling_factor",
       "num_shared_experts": "n_shared_experts", "num_expert_groups": "n_group",
       "num_expert_groups_per_tok": "topk_group"}
"""`moe.` key -> config.json key (MistralMoeModel's `moe_config_map`)."""
VISION = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
          "patch_size", "image_size")
"""`vision_encoder` keys a Pixtral vision_config holds under the same names."""


def config_from_params(params: Any) -> dict[str, Any]:
    """params.json -> the config dict the architecture's reader takes."""
    if not isinstance(params, dict):
        raise ConfigError(f"{PARAMS_FILE} is not a JSON object")
    moe = params.get("moe")
    if moe is not None and not isinstance(moe, dict):
        raise ConfigError(f"{PARAMS_FILE} moe is a {type(moe).__name__}, not an object")
    if moe is None or "kv_lora_rank" not in params:  # what llama.cpp converts as MistralModel, or Mixtral's MoE
        return {"model_type": "mixtral" if moe is not None else "mistral", "source_format": PARAMS_FILE}
    cfg: dict[str, Any] = {"model_type": MLA_TYPE, "load_format": LOAD_FORMAT, "source_format": PARAMS_FILE,
                           # the converter's defaults where params.json is silent: no query latent, no shared
                           # expert, no dense layer (DeepseekV2Model reads `q_lora_rank` only where present)
                           "q_lora_rank": None, "n_shared_experts": 0, "first_k_dense_replace": 0}
    cfg.update({new: params[old] for old, new in TOP.items() if old in params})
    cfg.update({k: params[k] for k in SAME if k in params})
    cfg.update({new: moe[old] for old, new in MOE.items() if old in moe})
    cfg["tie_word_embeddings"] = params.get("tied_embeddings", False)
    for key in ("quantization", "dtype"):
        if key in params:
            cfg["quantization_config" if key == "quantization" else key] = params[key]
    vision = params.get("vision_encoder")
    if vision is not None:
        if not isinstance(vision, dict):
            raise ConfigError(f"{PARAMS_FILE} vision_encoder is a {type(vision).__name__}, not an object")
        cfg["vision_config"] = {k: vision[k] for k in VISION if k in vision}
        cfg["spatial_merge_size"] = vision.get("spatial_merge_size", 2)
        cfg["multimodal_projector_bias"] = vision.get("adapter_bias", False)
    return cfg


def parse_params(raw: bytes) -> dict[str, Any]:
    """params.json's bytes -> the config dict (a ConfigError for JSON that is not an object)."""
    try:
        params = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"{PARAMS_FILE} is not valid JSON: {e}") from None
    return config_from_params(params)
