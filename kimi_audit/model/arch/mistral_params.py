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

RoPE: `yarn` and `llama_4_scaling` are read as both of their readers read them. llama.cpp's MistralMoeModel
(conversion/mistral.py lines 97-110, 173-182) requires `yarn` with `factor`, `beta`, `alpha`, `apply_scale` and
`original_max_position_embeddings`, writes them as `rope.scaling.{type yarn, factor, yarn_beta_fast,
yarn_beta_slow, original_context_length}` with `yarn_log_multiplier` 0.1, and `llama_4_scaling.beta` as
`attention.temperature_scale` beside yarn's original length as `attention.temperature_length`; vLLM's adapter
(vllm-project/vllm@01da88c5bef903224038ae4e57d653964740dc04 `transformers_utils/configs/mistral.py`,
_remap_mistral_yarn_args) turns `yarn` into `rope_parameters` (factor as float, the original length as int, beta as
beta_fast, alpha as beta_slow, mscale_all_dim 1, attention_factor 1 where apply_scale is false), asserts no other
yarn key, and asserts `llama_4_scaling` with `original_max_position_embeddings` and `beta` for Mistral Large 3 (a
MoE with shared experts), whose attention scaling reads that length (models/deepseek_v2.py _get_llama_4_scaling).
The adapter writes `rope_scaling` in that form where `yarn` is well-formed; `rope_findings` makes one finding of each
malformed block, with the bounds transformers' YaRN validation keeps (factor >= 1, beta_fast >= beta_slow).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.findings import Finding, error, warning

PARAMS_FILE = "params.json"
CONSOLIDATED_INDEX = "consolidated.safetensors.index.json"
"""The index of Mistral's sharded layout (`consolidated-00001-of-000NN.safetensors`): the file vLLM's `--load-format
mistral` keeps the consolidated shards it names by (vllm-project/vllm@00b5ad0712629374e6352e2b31de0460be0fdf17
model_executor/model_loader/default_loader.py DefaultModelLoader._prepare_weights and weight_utils.py
filter_duplicate_safetensors_files), and the name compressed-tensors reads RedHatAI/Mistral-Small-4-119B-2603-NVFP4's
index by (vllm-project/compressed-tensors@15819b96bd4d5f5aab855cae1bc0529337e073e1 utils/safetensors_load.py
find_safetensors_index_file)."""
CONSOLIDATED_SHARDS = "consolidated*.safetensors"
"""What both loaders of the layout glob for: vLLM's allow_patterns (default_loader.py, above) and llama.cpp's
converter with --mistral-format, which reads every one of them and no index (ggml-org/llama.cpp@0c1e57098
conversion/base.py lines 235-244: ModelBase.get_model_part_names with the prefix `consolidated`)."""
CONVERTER = "llama.cpp's converter with --mistral-format"
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


def params_key(config_key: str) -> str | None:
    """The params.json key a config.json key is read from (`moe.route_every_n` for moe_layer_freq), or None."""
    for table, prefix in ((TOP, ""), (MOE, "moe."), (dict(zip(SAME, SAME)), "")):
        for key, field in table.items():
            if field == config_key:
                return prefix + key
    return None


YARN = {"factor": "factor", "original_max_position_embeddings": "original_max_position_embeddings",
        "beta": "beta_fast", "alpha": "beta_slow"}
"""`yarn.` key -> rope_parameters key (vLLM's yarn_config_map); with `apply_scale`, every key llama.cpp's converter
reads (set_mistral_config)."""
APPLY_SCALE = "apply_scale"
LLAMA4 = ("original_max_position_embeddings", "beta")
"""The `llama_4_scaling` keys vLLM's adapter asserts and llama.cpp's converter reads (`beta`)."""
LLAMA4_BETA = "llama_4_scaling_beta"
"""Where transformers' Mistral4Config keeps the scaling's beta in `rope_parameters` (transformers 5.25
models/mistral4/configuration_mistral4.py), which the adapter's `rope_scaling` follows."""
UINT32 = 2**32 - 1
PRE_NORM, PROJECTOR_ID = "add_pre_mm_projector_layer_norm", "mm_projector_id"
"""`vision_encoder` keys that say whether the projector has its RMSNorm and its patch merger (`patch_merge`)."""
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
    tied = params.get("tied_embeddings", False)
    if not isinstance(tied, bool):  # both readers take any truthy value: "false" would tie the head
        raise ConfigError(f"{PARAMS_FILE} tied_embeddings must be true or false, got {tied!r}")
    cfg["tie_word_embeddings"] = tied
    # what MistralMoeModel.__init__ and vLLM's _remap_moe_args write for every Mistral MoE
    cfg.update(norm_topk_prob=True, scoring_func="softmax",
               max_position_embeddings=params.get("max_position_embeddings", 128_000))
    for key in ("rope_theta", "yarn", "llama_4_scaling"):  # carried as they are: rope_findings reads them
        if key in params:
            cfg[key] = params[key]
    rope = rope_scaling(params)
    if rope is not None:
        cfg["rope_scaling"] = rope
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
        # the projector's norm and patch merger exist where these say so (vLLM's VisionEncoderArgs: False and "")
        cfg[PRE_NORM] = vision.get(PRE_NORM, False)
        cfg[PROJECTOR_ID] = vision.get(PROJECTOR_ID, "")
        if "image_break_token_id" in vision:  # the token embedding's row `--mmproj` copies (model.arch.pixtral)
            cfg["image_break_token_id"] = vision["image_break_token_id"]
    return cfg


def parse_params(raw: bytes) -> dict[str, Any]:
    """params.json's bytes -> the config dict (a ConfigError for JSON that is not an object)."""
    try:
        params = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"{PARAMS_FILE} is not valid JSON: {e}") from None
    return config_from_params(params)


def rope_scaling(params: dict[str, Any]) -> dict[str, Any] | None:
    """`yarn` (and `llama_4_scaling`'s beta) as vLLM's adapter spells them in rope_parameters, None where either
    block is malformed (rope_findings says why)."""
    yarn = params.get("yarn")
    if not isinstance(yarn, dict) or _yarn_problems(yarn):
        return None
    out: dict[str, Any] = {"rope_type": "yarn", "mscale_all_dim": 1, **{new: yarn[old] for old, new in YARN.items()}}
    if not yarn[APPLY_SCALE]:
        out["attention_factor"] = 1.0
    if "rope_theta" in params:
        out["rope_theta"] = params["rope_theta"]
    llama4 = params.get("llama_4_scaling")
    if llama4 is not None:
        if not isinstance(llama4, dict) or _llama4_problems(llama4):
            return None
        out[LLAMA4_BETA] = llama4["beta"]
    return out


def _finite(v: Any) -> bool:
    """A JSON number a float holds (not a bool; an integer past the float range is not one)."""
    if type(v) is int:
        return abs(v) <= 2**1023
    return type(v) is float and math.isfinite(v)


def _length(v: Any) -> bool:
    """A context length both readers take: an integer llama.cpp writes as uint32, over 0 (vLLM divides by it)."""
    return type(v) is int and 0 < v <= UINT32


def _yarn_problems(yarn: dict[str, Any]) -> list[str]:
    out = [f"{key} missing ({CONVERTER} reads it)" for key in (*YARN, APPLY_SCALE) if key not in yarn]
    extra = sorted(map(str, set(yarn) - {*YARN, APPLY_SCALE}))
    if extra:
        out.append(f"{', '.join(extra)} unknown (vLLM's adapter refuses an unparsed yarn key)")
    factor: Any = yarn.get("factor")
    beta: Any = yarn.get("beta")
    alpha: Any = yarn.get("alpha")
    if "factor" in yarn and not (_finite(factor) and factor >= 1):
        out.append(f"factor {factor!r} is not a number >= 1")
    if "original_max_position_embeddings" in yarn and not _length(yarn["original_max_position_embeddings"]):
        out.append(f"original_max_position_embeddings {yarn['original_max_position_embeddings']!r} is not a "
                   f"length (an integer from 1 to {UINT32:,})")
    for key, v in (("beta", beta), ("alpha", alpha)):
        if key in yarn and not (_finite(v) and v > 0):
            out.append(f"{key} {v!r} is not a number > 0")
    if _finite(beta) and _finite(alpha) and beta < alpha:
        out.append(f"beta {beta!r} (beta_fast) is below alpha {alpha!r} (beta_slow): YaRN's correction range "
                   "is reversed")
    if APPLY_SCALE in yarn and type(yarn[APPLY_SCALE]) is not bool:
        out.append(f"apply_scale {yarn[APPLY_SCALE]!r} is not true or false (both readers take any truthy value)")
    return out


def _llama4_problems(llama4: dict[str, Any]) -> list[str]:
    out = [f"{key} missing (vLLM's adapter asserts it)" for key in LLAMA4 if key not in llama4]
    if "original_max_position_embeddings" in llama4 and not _length(llama4["original_max_position_embeddings"]):
        out.append(f"original_max_position_embeddings {llama4['original_max_position_embeddings']!r} is not a "
                   f"length (an integer from 1 to {UINT32:,})")
    if "beta" in llama4 and not _finite(llama4["beta"]):
        out.append(f"beta {llama4['beta']!r} is not a finite number")
    return out


def _block(key: str, v: Any, required: str | None, problems: Any) -> str | None:
    if v is None:
        return f"{key} missing ({required} requires it)" if required else None
    if not isinstance(v, dict):
        return f"{key} is a {type(v).__name__}, not an object"
    found: list[str] = problems(v)
    return f"{key}: {'; '.join(found)}" if found else None


def rope_findings(cfg: dict[str, Any]) -> list[Finding]:
    """One PARAMS_ROPE_INVALID per malformed block of a params.json MLA MoE's config (the adapter's dict, which
    carries `yarn` and `llama_4_scaling` as they are), and PARAMS_ROPE_LENGTHS where its two original lengths
    differ (vLLM scales attention by llama_4_scaling's, the GGUF holds yarn's)."""
    if cfg.get("model_type") != MLA_TYPE or cfg.get("source_format") != PARAMS_FILE:
        return []
    shared = cfg.get("n_shared_experts")
    large3 = isinstance(shared, int) and shared > 0  # vLLM's is_mistral_large_3
    out = []
    for key, required, problems in (("yarn", CONVERTER, _yarn_problems),
                                    ("llama_4_scaling", "vLLM's adapter (a MoE with shared experts)" if large3
                                     else None, _llama4_problems)):
        why = _block(key, cfg.get(key), required, problems)
        if why is not None:
            out.append(error("PARAMS_ROPE_INVALID", f"{PARAMS_FILE} {why}", shard=PARAMS_FILE))
    yarn, llama4 = cfg.get("yarn"), cfg.get("llama_4_scaling")
    if not out and isinstance(yarn, dict) and isinstance(llama4, dict):
        a, b = yarn["original_max_position_embeddings"], llama4["original_max_position_embeddings"]
        if a != b:
            out.append(warning("PARAMS_ROPE_LENGTHS", f"{PARAMS_FILE} llama_4_scaling.original_max_position_embeddings "
                               f"{b:,} and yarn.original_max_position_embeddings {a:,} differ: vLLM scales attention "
                               f"by the first, {CONVERTER} writes the second as attention.temperature_length",
                               shard=PARAMS_FILE, expected=a, actual=b))
    return out


PARAMS_PATH = {**{new: old for old, new in TOP.items()}, **{new: f"moe.{old}" for old, new in MOE.items()},
               "tie_word_embeddings": "tied_embeddings", "vision_config": "vision_encoder",
               "spatial_merge_size": "vision_encoder.spatial_merge_size",
               "multimodal_projector_bias": "vision_encoder.adapter_bias"}
"""config key -> where params.json holds it: what a field reader's error names."""
QUOTED = re.compile(r"config\.json( lacks)? '([^']*)'")
BARE = re.compile(r"config\.json ([a-z_][a-z0-9_.]*)")


def blamed(message: str) -> str:
    """A field reader's error about the config the adapter made, naming params.json and its own key."""
    def where(key: str) -> str | None:
        head = key.split(".")[0]
        if head not in PARAMS_PATH and head not in SAME:
            return None
        return f"{PARAMS_PATH.get(head, head)}{key[len(head):]}"

    def quoted(m: re.Match[str]) -> str:
        key = m.group(2)
        return f"{PARAMS_FILE}{m.group(1) or ''} '{where(key) or key}' (read as {key})"

    def bare(m: re.Match[str]) -> str:
        key = m.group(1)
        ours = where(key)
        return f"{PARAMS_FILE} {key}" if ours is None else f"{PARAMS_FILE} {ours} (read as {key})"

    return BARE.sub(bare, QUOTED.sub(quoted, message))
