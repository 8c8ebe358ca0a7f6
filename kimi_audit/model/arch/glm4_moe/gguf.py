"""GLM-4.5/4.6/4.7 as llama.cpp's GGUF writes it (GGUF arch `glm4moe`): what `convert_hf_to_gguf.py`
(conversion/glm.py, Glm4MoeModel over TextModel) writes from a release and llama.cpp's loader (llama-model.cpp
load_hparams, src/models/glm4-moe.cpp) reads back, at llama.cpp 0c1e5709.

- The keys: TextModel's (`block_count`, `context_length`, `embedding_length`, `feed_forward_length`,
  `attention.head_count`, `attention.head_count_kv`, `attention.layer_norm_rms_epsilon`, the expert and group
  counts, `rope.freq_base` and scaling, `attention.key_length`/`value_length` from config.json's `head_dim`) and
  Glm4MoeModel's: `rope.dimension_count` = head_dim × partial_rotary_factor (0.5 absent), `expert_count`,
  `expert_feed_forward_length`, `expert_shared_count`, `leading_dense_block_count`, `expert_gating_func` (always
  sigmoid), `expert_weights_scale`, `expert_weights_norm`, and with the NextN layers kept (the converter's default;
  `--no-mtp` drops them) `nextn_predict_layers`, which `block_count` then counts.
- The loader requires `context_length`, `embedding_length`, `block_count`, `attention.layer_norm_rms_epsilon`,
  `expert_feed_forward_length` and `expert_shared_count`, asserts experts (GGML_ASSERT n_expert > 0 and
  n_expert_used > 0), and reads no `expert_gating_func` as sigmoid. The q/k/v biases, q/k norms and the NextN layer's
  embedding and head copies it loads where stored (TENSOR_NOT_REQUIRED): the files decide, as here.
- The tensors (gguf-py constants.py MODEL_ARCH.GLM4_MOE, tensor_mapping.py): `attn_{q,k,v}` (+ `.bias`),
  `attn_output`, `attn_{q,k}_norm`, `attn_norm`, `post_attention_norm` (GLM4_MOE has ATTN_POST_NORM, no FFN_NORM,
  so `post_attention_layernorm` maps there), the dense `ffn_{gate,up,down}`, the router `ffn_gate_inp` and
  `exp_probs_b.bias`, the routed experts stacked `ffn_{gate,up,down}_exps` [E, out, in], `ffn_*_shexp`, and the
  NextN layer's `nextn.{eh_proj, enorm, hnorm, shared_head_norm, embed_tokens, shared_head_head}`. No Q/K
  permutation (Glm4MoeModel.modify_tensors: NeoX order already).
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kimi_audit.errors import GgufKeyError
from kimi_audit.findings import Finding, error
from kimi_audit.format.gguf_keys import U32, U32_OR_PER_LAYER, one_value, vocab_findings
from kimi_audit.model.arch.deepseek_v3 import gguf as deepseek2
from kimi_audit.model.arch.kimi_linear.gguf import HPARAMS as TEXT_HPARAMS
from kimi_audit.model.arch.kimi_linear.gguf import find_hparam, rope_keys
from kimi_audit.model.arch.spec import GgufDialect, ReleaseReader

if TYPE_CHECKING:
    import numpy as np

GGUF_ARCH = "glm4moe"
MODEL_TYPE = "glm4_moe"
CLASS_NAME = "Glm4MoeForCausalLM"
GGUF_LAYER = tuple((f"{hf}.{suffix}", f"{gguf}.{suffix}") for hf, gguf, suffixes in (
    ("input_layernorm", "attn_norm", ("weight",)), ("post_attention_layernorm", "post_attention_norm", ("weight",)),
    ("self_attn.q_proj", "attn_q", ("weight", "bias")), ("self_attn.k_proj", "attn_k", ("weight", "bias")),
    ("self_attn.v_proj", "attn_v", ("weight", "bias")), ("self_attn.o_proj", "attn_output", ("weight",)),
    ("self_attn.q_norm", "attn_q_norm", ("weight",)), ("self_attn.k_norm", "attn_k_norm", ("weight",)),
    ("mlp.gate_proj", "ffn_gate", ("weight",)), ("mlp.up_proj", "ffn_up", ("weight",)),
    ("mlp.down_proj", "ffn_down", ("weight",)), ("mlp.gate", "ffn_gate_inp", ("weight",)),
    ("mlp.experts.gate_proj", "ffn_gate_exps", ("weight",)), ("mlp.experts.up_proj", "ffn_up_exps", ("weight",)),
    ("mlp.experts.down_proj", "ffn_down_exps", ("weight",)),
    ("mlp.shared_experts.gate_proj", "ffn_gate_shexp", ("weight",)),
    ("mlp.shared_experts.up_proj", "ffn_up_shexp", ("weight",)),
    ("mlp.shared_experts.down_proj", "ffn_down_shexp", ("weight",))) for suffix in suffixes) + (
    ("mlp.gate.e_score_correction_bias", "exp_probs_b.bias"), *deepseek2.NEXTN_LAYER)
"""GGUF's names of the llama.cpp tree (tests/test_gguf_glm4.py holds them to gguf-py's TensorNameMap)."""
MTP_COPIES = (r"^(?:model\.layers\.\d+\.(?:embed_tokens|shared_head\.head)"
              r"|blk\.\d+\.nextn\.(?:embed_tokens|shared_head_head))\.")
"""The NextN layer's embedding and output head copies, in the release's names and GGUF's (model.arch.glm4_moe:
stored by some releases, left out of the tree)."""

TEXT_KEYS = ("context_length", "embedding_length", "feed_forward_length", "attention.head_count",
             "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "expert_count", "expert_used_count",
             "expert_group_count", "expert_group_used_count")
HPARAMS = tuple((k, keys) for k, keys in TEXT_HPARAMS if k in TEXT_KEYS) + (
    ("attention.head_count_kv", ("num_key_value_heads", "n_kv_heads")),)
"""(the key, the config.json keys TextModel.set_gguf_parameters takes it from, the first present)."""
OWN = (("expert_count", "n_routed_experts"), ("expert_feed_forward_length", "moe_intermediate_size"),
       ("expert_shared_count", "n_shared_experts"), ("leading_dense_block_count", "first_k_dense_replace"),
       ("expert_weights_scale", "routed_scaling_factor"), ("expert_weights_norm", "norm_topk_prob"))
"""Glm4MoeModel.set_gguf_parameters: (the key, its config.json key), each written where the config has it."""
NEXTN = "nextn_predict_layers"
PARTIAL_ROTARY = 0.5
"""Glm4MoeModel's partial_rotary_factor where config.json names none."""

KEY_TYPES = {**{k: deepseek2.KEY_TYPES[k] for k in (
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length", "attention.layer_norm_rms_epsilon",
    "expert_count", "expert_used_count", "expert_group_count", "expert_group_used_count",
    "expert_feed_forward_length", "expert_shared_count", "leading_dense_block_count", "expert_weights_scale",
    "expert_weights_norm", "expert_gating_func", "rope.dimension_count", "rope.freq_base", "rope.scaling.type",
    "rope.scaling.factor", "rope.scaling.original_context_length")},
    NEXTN: U32, "rope.dimension_sections": U32_OR_PER_LAYER}
"""The `glm4moe.` keys and the types the loader reads them with (llama-model.cpp load_hparams' get_key into
uint32_t / float / std::string, get_key_or_arr for the per-layer ones; glm4-moe.cpp load_arch_hparams)."""
LOADER_REQUIRED = ("context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon",
                   "expert_feed_forward_length", "expert_shared_count")
"""What llama.cpp's loader requires of a glm4moe file (get_key / get_key_or_arr without `required = false`)."""
REQUIRED = (*LOADER_REQUIRED, "attention.head_count", "expert_count", "expert_used_count")
"""What this tool reads no model without: what the loader requires (one GGUF_KEY_MISSING, no layout from a file
llama.cpp does not load), the heads, the experts (glm4-moe.cpp asserts n_expert and n_expert_used)."""


def gguf_config(kv: Mapping[str, Any], stored: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Any], list[Finding]]:
    """The config.json a `glm4moe` GGUF was converted from, as llama.cpp's loader reads its hyperparameters, and
    what in the metadata llama.cpp would misread."""
    a = GGUF_ARCH

    def k(key: str, default: Any = None) -> Any:
        return one_value(kv.get(f"{a}.{key}", default), f"{a}.{key}")

    absent = [f"{a}.{key}" for key in REQUIRED if not kv.get(f"{a}.{key}")]
    if absent:
        raise GgufKeyError(f"the GGUF metadata lacks {', '.join(absent)} (or holds 0): llama.cpp cannot load it "
                           "(glm4-moe.cpp asserts its experts; kimi-audit derives no layout without it)", absent[0],
                           "GGUF_KEY_MISSING")
    findings = deepseek2.loader_asserts(kv, a, stored)
    gating = k("expert_gating_func")
    if gating not in (None, 0, deepseek2.SIGMOID) and any(n.endswith(deepseek2.GGUF_ROUTER_BIAS) for n in stored):
        findings.append(error("GGUF_GATING", f"{a}.expert_gating_func is {gating}, but the experts carry exp_probs_b "
                              "(GLM's sigmoid routing with a correction bias): llama.cpp routes by other logits. "
                              "Glm4MoeModel writes 2 (sigmoid); re-convert", tensor=f"{a}.expert_gating_func",
                              expected=deepseek2.SIGMOID, actual=gating))
    vocab, mismatch = vocab_findings(kv, a, stored)
    findings += mismatch
    hidden, heads = k("embedding_length"), k("attention.head_count")
    nextn = deepseek2.nextn_layers(kv, a)
    head_dim = k("attention.key_length") or (hidden // heads if heads else 0)
    cfg: dict[str, Any] = {
        "architectures": [CLASS_NAME], "model_type": MODEL_TYPE,
        "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": k("attention.head_count_kv", heads),
        "head_dim": head_dim, "num_hidden_layers": k("block_count") - nextn, "num_nextn_predict_layers": nextn,
        "intermediate_size": k("feed_forward_length", 0), "moe_intermediate_size": k("expert_feed_forward_length", 0),
        "n_routed_experts": k("expert_count"), "num_experts_per_tok": k("expert_used_count"),
        "n_shared_experts": k("expert_shared_count", 0), "first_k_dense_replace": k("leading_dense_block_count", 0),
        "rms_norm_eps": k("attention.layer_norm_rms_epsilon"),
        "vocab_size": vocab,
        "attention_bias": any(n.endswith(".attn_q.bias") for n in stored),
        "use_qk_norm": any(n.endswith(".attn_q_norm.weight") for n in stored),
        "tie_word_embeddings": "output.weight" not in stored, "torch_dtype": "float32",
        "quantization_config": {"quant_method": "gguf"},
    }
    return {key: v for key, v in cfg.items() if v is not None}, findings


def gguf_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `glm4moe.*` keys the converter writes from `config` (a config.json), its NextN layers kept: TextModel's
    and Glm4MoeModel's set_gguf_parameters (llama.cpp 0c1e5709 conversion/base.py, glm.py). Floats as GGUF
    stores them (float32). `audit --against` holds a GGUF's metadata to the config.json it was converted from."""
    a = GGUF_ARCH
    out: dict[str, Any] = {f"{a}.{key}": find_hparam(config, keys) for key, keys in HPARAMS}
    layers, nextn = config.get("num_hidden_layers"), config.get("num_nextn_predict_layers")
    if isinstance(layers, int):
        out[f"{a}.block_count"] = layers + (nextn if isinstance(nextn, int) else 0)
    out.update({f"{a}.{key}": config[c] for key, c in OWN if config.get(c) is not None})
    out[f"{a}.{NEXTN}"] = nextn
    out[f"{a}.expert_gating_func"] = deepseek2.SIGMOID
    if config.get("head_dim") is not None:
        out[f"{a}.attention.key_length"] = out[f"{a}.attention.value_length"] = config["head_dim"]
    out.update(rope_keys(config, a))
    rope = rope_parameters(config)
    head_dim, hidden, heads = config.get("head_dim"), config.get("hidden_size"), config.get("num_attention_heads")
    if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        head_dim = hidden // heads
    if isinstance(head_dim, int):
        out[f"{a}.rope.dimension_count"] = int(head_dim * rope.get("partial_rotary_factor", PARTIAL_ROTARY))
    if isinstance(rope.get("mrope_section"), list):
        out[f"{a}.rope.dimension_sections"] = (list(rope["mrope_section"]) + [0, 0, 0, 0])[:4]
    return {key: value for key, value in out.items() if value is not None}


def rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """The converter's `rope_parameters`: config.json's (or its `rope_scaling`), with the top-level
    `partial_rotary_factor` where they hold none (TextModel.__init__)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    params = dict(params) if isinstance(params, dict) else {}
    if "partial_rotary_factor" not in params:
        factor = find_hparam(config, ("partial_rotary_factor", "rope_pct", "rope_percent"))
        if factor is not None:
            params["partial_rotary_factor"] = factor
    return params


EXPERT = deepseek2.EXPERT
STACKED = deepseek2.STACKED


def converted(name: str, layers: int, stored: Container[str]) -> tuple[str, ...]:
    """The GGUF tensors the converter writes a release tensor into (Glm4MoeModel.modify_tensors): a routed expert's
    into its layer's stacked tensor, an FP8 scale and a rotary buffer into none, a NextN layer's tensor into its
    `blk.N.` where the file holds that layer (llama.cpp's probe: `blk.N.nextn.eh_proj.weight`), the rest renamed."""
    return deepseek2.converted_as(name, layers, stored, GGUF_DIALECT.rename, EXPERT)


def release_values(gguf_name: str, read: ReleaseReader, experts: int, heads: int,
                   nope: int) -> tuple[tuple[int, ...], Iterator[np.ndarray]] | None:
    """The float32 values the converter writes into GGUF tensor `gguf_name`: stacked experts one after another,
    the rest as released, in row bands (no transform: Glm4MoeModel permutes nothing). None where the release has no
    source of it."""
    return deepseek2.release_values_as(gguf_name, read, experts, heads, nope, GGUF_DIALECT, STACKED)


GGUF_DIALECT = GgufDialect((GGUF_ARCH,), gguf_config, gguf_metadata, deepseek2.GGUF_TOP, GGUF_LAYER, converted,
                           release_values, key_types=KEY_TYPES, required=LOADER_REQUIRED)
