"""DeepSeek-V4 as llama.cpp's GGUF writes it (GGUF arch `deepseek4`): what `convert_hf_to_gguf.py`
(conversion/deepseek.py DeepseekV4Model) writes from DeepSeek's release and llama.cpp's loader
(src/models/deepseek4.cpp load_arch_hparams / load_arch_tensors, llama-model.cpp load_hparams) reads back, at
llama.cpp 0c1e5709.

- The names: gguf-py's TENSOR_NAMES of MODEL_ARCH.DEEPSEEK4's tensors (constants.py), from the release's names by
  the converter's own table (DeepseekV4Model._map_dsv4_tensor_name; gguf-py's TensorNameMap maps none of them):
  `hc_{attn,ffn}_{fn,base,scale}` and `output_hc_*`, `attn_sinks`, `attn_q_a`, `attn_q_a_norm`, `attn_q_b`,
  `attn_kv`, `attn_kv_a_norm`, `attn_output_{a,b}`, `attn_compressor_{kv,gate,ape,norm}`, `indexer.{attn_q_b,
  proj}`, `indexer_compressor_{kv,gate,ape,norm}`, `ffn_gate_inp`, `exp_probs_b.bias`, `ffn_gate_tid2eid`,
  `ffn_{gate,down,up}_exps`, `ffn_{gate,down,up}_shexp`.
- What the converter changes: an FP8 weight dequantized (x 2^(e - 127) per 128 x 128 block) and written Q8_0,
  the routed experts' FP4 codes and E8M0 scales repacked, losslessly, into one MXFP4 [E, out, in] tensor per
  projection (repack_mxfp4_blocks), a hash table I64 -> I32; BF16 and F32 sources kept as they are (2-D), 1-D
  tensors F32; a hash layer's routing bias and every `mtp.` tensor dropped (the MTP stage is not converted).
- The metadata: TextModel's keys and DeepseekV4Model.set_gguf_parameters's, their values from config.json with
  transformers' DeepseekV4Config defaults where it has none (the converter reads the config through AutoConfig);
  the loader requires the ones LOADER_REQUIRED lists, and refuses any `expert_gating_func` but sqrtsoftplus,
  `attention.compress_ratios` shorter than `block_count` and any ratio but 0, 4 and 128.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Container, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kimi_audit.errors import GgufKeyError
from kimi_audit.findings import Finding, error
from kimi_audit.format.gguf import KEEP_ARRAY, GgufArray
from kimi_audit.format.gguf_keys import (
    ARRAY,
    BOOL,
    F32,
    F32_OR_PER_LAYER,
    FLAG,
    FLOAT32,
    INT32,
    STR,
    U32,
    U32_OR_PER_LAYER,
    UINT32,
    KeyType,
    one_value,
    vocab_findings,
)
from kimi_audit.model.arch.deepseek_v3.gguf import loader_asserts, release_values_as
from kimi_audit.model.arch.spec import (
    Buffer,
    GgufDialect,
    Group,
    Leaf,
    Linear,
    ModelTree,
    Node,
    Param,
    ReleaseReader,
)
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.quant.gguf import GGML_ANY

if TYPE_CHECKING:
    import numpy as np

GGUF_ARCH = "deepseek4"
GGUF_TOP = (("embed.weight", "token_embd.weight"), ("norm.weight", "output_norm.weight"),
            ("head.weight", "output.weight"),
            *((f"hc_head_{p}", f"output_hc_{p}.weight") for p in ("fn", "base", "scale")))
GGUF_LAYER = tuple((f"{tree}.weight", f"{gguf}.weight") for tree, gguf in (
    ("attn_norm", "attn_norm"), ("ffn_norm", "ffn_norm"), ("attn.wq_a", "attn_q_a"), ("attn.q_norm", "attn_q_a_norm"),
    ("attn.wq_b", "attn_q_b"), ("attn.wkv", "attn_kv"), ("attn.kv_norm", "attn_kv_a_norm"),
    ("attn.wo_a", "attn_output_a"), ("attn.wo_b", "attn_output_b"),
    ("attn.compressor.wkv", "attn_compressor_kv"), ("attn.compressor.wgate", "attn_compressor_gate"),
    ("attn.compressor.norm", "attn_compressor_norm"), ("attn.indexer.wq_b", "indexer.attn_q_b"),
    ("attn.indexer.weights_proj", "indexer.proj"), ("attn.indexer.compressor.wkv", "indexer_compressor_kv"),
    ("attn.indexer.compressor.wgate", "indexer_compressor_gate"),
    ("attn.indexer.compressor.norm", "indexer_compressor_norm"), ("ffn.gate", "ffn_gate_inp"),
    ("ffn.experts.w1", "ffn_gate_exps"), ("ffn.experts.w2", "ffn_down_exps"), ("ffn.experts.w3", "ffn_up_exps"),
    ("ffn.shared_experts.w1", "ffn_gate_shexp"), ("ffn.shared_experts.w2", "ffn_down_shexp"),
    ("ffn.shared_experts.w3", "ffn_up_shexp"))) + tuple((tree, f"{gguf}.weight") for tree, gguf in (
        *((f"hc_{s}_{p}", f"hc_{s}_{p}") for s in ("attn", "ffn") for p in ("fn", "base", "scale")),
        ("attn.attn_sink", "attn_sinks"), ("attn.compressor.ape", "attn_compressor_ape"),
        ("attn.indexer.compressor.ape", "indexer_compressor_ape"), ("ffn.gate.tid2eid", "ffn_gate_tid2eid"))) + (
    ("ffn.gate.bias", "exp_probs_b.bias"),)
"""(the release's name relative to `layers.N.`, the routed experts' stacked; the GGUF name relative to `blk.N.`)."""

CONVERTER_DEFAULTS: dict[str, Any] = {
    "max_position_embeddings": 1048576, "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "n_routed_experts": 256,
    "num_experts_per_tok": 6, "scoring_func": "sqrtsoftplus", "head_dim": 512, "q_lora_rank": 1024,
    "sliding_window": 128, "moe_intermediate_size": 2048, "n_shared_experts": 1, "routed_scaling_factor": 1.5,
    "norm_topk_prob": True, "swiglu_limit": 10.0, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
    "o_groups": 8, "o_lora_rank": 1024, "compress_rope_theta": 160000.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "rope_theta": 10000.0, "hidden_size": 4096, "num_attention_heads": 64, "num_hidden_layers": 43,
}
"""transformers 5.25 DeepseekV4Config's defaults of the keys the converter reads (its hparams are AutoConfig's
to_dict, config.json's own keys added: `compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`, `rope_scaling`)."""
SQRT_SOFTPLUS = 4
"""gguf-py ExpertGatingFuncType.SQRTSOFTPLUS (llama-hparams.h LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS)."""
GATING = {"softmax": 1, "sigmoid": 2, "sqrtsoftplus": SQRT_SOFTPLUS}
GATING_KEYS = ("score_function", "scoring_func", "score_func", "moe_router_activation", "moe_router_activation_func",
               "expert_selection_fn")
RATIOS = (0, 4, 128)
"""The compress ratios the loader builds a layer for (load_arch_tensors: "only supports compression ratios 0, 4,
and 128")."""
DIRECT = (("block_count", "num_hidden_layers"), ("context_length", "max_position_embeddings"),
          ("embedding_length", "hidden_size"), ("attention.head_count", "num_attention_heads"),
          ("attention.head_count_kv", "num_key_value_heads"), ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
          ("expert_count", "n_routed_experts"), ("expert_used_count", "num_experts_per_tok"),
          ("attention.key_length", "head_dim"), ("attention.value_length", "head_dim"),
          ("attention.q_lora_rank", "q_lora_rank"), ("attention.sliding_window", "sliding_window"),
          ("expert_feed_forward_length", "moe_intermediate_size"), ("expert_shared_count", "n_shared_experts"),
          ("expert_weights_scale", "routed_scaling_factor"), ("expert_weights_norm", "norm_topk_prob"),
          ("attention.indexer.head_count", "index_n_heads"), ("attention.indexer.key_length", "index_head_dim"),
          ("attention.indexer.top_k", "index_topk"), ("attention.output_group_count", "o_groups"),
          ("attention.output_lora_rank", "o_lora_rank"), ("attention.compress_rope_freq_base", "compress_rope_theta"),
          ("hyper_connection.count", "hc_mult"), ("hyper_connection.sinkhorn_iterations", "hc_sinkhorn_iters"),
          ("hyper_connection.epsilon", "hc_eps"), ("hash_layer_count", "num_hash_layers"),
          ("rope.freq_base", "rope_theta"))
"""(the `deepseek4.` key, the config.json key) written one value each way."""

INT_ARRAY: KeyType = ((ARRAY, INT32), (ARRAY, UINT32), (ARRAY, BOOL))
"""`get_arr` into uint32_t: an array of integers (a scalar is "array key not found")."""
KEY_TYPES: dict[str, KeyType] = {
    **{key: U32 for key in ("block_count", "context_length", "embedding_length", "embedding_length_out",
                            "nextn_predict_layers", "expert_count", "expert_group_count", "expert_group_used_count",
                            "expert_gating_func", "expert_shared_count", "attention.key_length",
                            "attention.value_length", "rope.dimension_count", "rope.scaling.original_context_length",
                            "attention.q_lora_rank", "attention.sliding_window", "attention.indexer.head_count",
                            "attention.indexer.key_length", "attention.indexer.top_k",
                            "attention.output_group_count", "attention.output_lora_rank", "hyper_connection.count",
                            "hyper_connection.sinkhorn_iterations", "hash_layer_count")},
    **{key: U32_OR_PER_LAYER for key in ("feed_forward_length", "attention.head_count", "attention.head_count_kv",
                                         "expert_feed_forward_length", "expert_used_count")},
    **{key: F32 for key in ("attention.layer_norm_rms_epsilon", "expert_weights_scale", "rope.freq_base",
                            "rope.scaling.factor", "rope.scaling.attn_factor", "attention.compress_rope_freq_base",
                            "hyper_connection.epsilon")},
    "expert_weights_norm": FLAG, "rope.scaling.type": STR, "swiglu_clamp_exp": F32_OR_PER_LAYER,
    "swiglu_clamp_shexp": F32_OR_PER_LAYER, "attention.compress_ratios": INT_ARRAY,
}
"""The `deepseek4.` keys and the types llama.cpp's loader reads them with (llama-model.cpp load_hparams;
deepseek4.cpp load_arch_hparams: get_key into uint32_t / float / bool, get_key_or_arr, get_arr; llama-hparams.h
holds each dsv4_* field's type)."""
LOADER_REQUIRED = ("context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon",
                   "attention.q_lora_rank", "attention.sliding_window", "expert_feed_forward_length",
                   "expert_shared_count", "expert_weights_scale", "expert_weights_norm", "swiglu_clamp_exp",
                   "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
                   "attention.output_group_count", "attention.output_lora_rank", "attention.compress_rope_freq_base",
                   "hyper_connection.count", "hyper_connection.sinkhorn_iterations", "hyper_connection.epsilon",
                   "hash_layer_count", "attention.compress_ratios", "expert_gating_func")
"""What llama.cpp's loader cannot load a deepseek4 file without (get_key / get_arr without `required = false`)."""
REQUIRED = ("block_count", "embedding_length", "attention.head_count", "attention.key_length", "attention.q_lora_rank",
            "expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count",
            "attention.indexer.head_count", "attention.indexer.key_length", "attention.output_group_count",
            "attention.output_lora_rank", "hyper_connection.count", "hash_layer_count", "attention.compress_ratios")
"""What this tool derives no layout without."""


def gguf_config(kv: Mapping[str, Any], stored: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Any], list[Finding]]:
    """The config.json a `deepseek4` GGUF was converted from, as the loader reads its hyperparameters, and what in
    the metadata llama.cpp refuses."""
    a = GGUF_ARCH

    def k(key: str) -> Any:
        return one_value(kv.get(f"{a}.{key}"), f"{a}.{key}")

    absent = [f"{a}.{key}" for key in REQUIRED if kv.get(f"{a}.{key}") is None]
    if absent:
        raise GgufKeyError(f"the GGUF metadata lacks {', '.join(absent)}: llama.cpp cannot load it (kimi-audit "
                           "derives no layout without it)", absent[0], "GGUF_KEY_MISSING")
    findings = loader_asserts(kv, a, stored)
    nextn = k("nextn_predict_layers") or 0
    if nextn and f"blk.{k('block_count') - nextn}.nextn.eh_proj.weight" not in stored:
        nextn = 0  # deepseek4.cpp load_arch_hparams: no MTP probe tensor, n_layer_nextn = 0 (every block a layer)
    n = k("block_count") - nextn
    key = f"{a}.attention.compress_ratios"
    count, ratios = getattr(kv[key], "count", 0), getattr(kv[key], "values", None)
    if count < k("block_count") or ratios is None:
        raise GgufKeyError(f"{key} holds {count:,} values for {k('block_count')} blocks: llama.cpp refuses it "
                           f"(\"compress_ratios is shorter than block_count\", or more than {KEEP_ARRAY} layers)", key)
    if any(r not in RATIOS for r in ratios[:k("block_count")]):
        raise GgufKeyError(f"{key} is {list(ratios)[:8]}: llama.cpp's DeepSeek-V4 loader builds layers of ratio 0, 4 "
                           "and 128 alone (\"only supports compression ratios 0, 4, and 128\")", key)
    gating = k("expert_gating_func")
    if gating != SQRT_SOFTPLUS:
        findings.append(error("GGUF_KEY_VALUE", f"{a}.expert_gating_func is {gating!r}: llama.cpp's DeepSeek-V4 "
                              f"loader refuses any but sqrtsoftplus ({SQRT_SOFTPLUS}): \"expects sqrtsoftplus MoE "
                              "scoring\"", tensor=f"{a}.expert_gating_func", expected=SQRT_SOFTPLUS, actual=gating))
    vocab, mismatch = vocab_findings(kv, a, stored)
    findings += mismatch
    cfg: dict[str, Any] = {c: k(key) for key, c in DIRECT if kv.get(f"{a}.{key}") is not None}
    cfg.update({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "num_hidden_layers": n,
        "compress_ratios": list(ratios), "num_nextn_predict_layers": 0,
        "index_n_heads": k("attention.indexer.head_count"), "index_head_dim": k("attention.indexer.key_length"),
        "vocab_size": vocab,
        "tie_word_embeddings": False,  # the loader creates `output` required: its absence is TENSOR_MISSING
        "torch_dtype": "float32", "quantization_config": {"quant_method": "gguf"},
    })
    return cfg, findings


def f32(value: Any) -> Any:
    """A float as GGUF stores it (float32)."""
    return struct.unpack("<f", struct.pack("<f", value))[0] if isinstance(value, float) else value


def gguf_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `deepseek4.*` keys the converter writes from `config` (a release's config.json): TextModel's and
    DeepseekV4Model's set_gguf_parameters (conversion/base.py, deepseek.py), transformers' defaults where the
    config has no value. `audit --against` holds a GGUF's metadata to the config.json it was converted from."""
    a = GGUF_ARCH
    c = {**CONVERTER_DEFAULTS, **{key: v for key, v in config.items() if v is not None}}
    out: dict[str, Any] = {f"{a}.{key}": c.get(name) for key, name in DIRECT}
    ff = next((config[key] for key in ("prefix_dense_intermediate_size", "dense_intermediate_size",
                                       "intermediate_size", "n_inner", "hidden_dim") if key in config), None)
    out[f"{a}.feed_forward_length"] = ff
    score = next((config[key] for key in GATING_KEYS if key in config), c["scoring_func"])
    out[f"{a}.expert_gating_func"] = GATING.get(score) if isinstance(score, str) else None
    head = c.get("head_dim")
    rotary = c.get("qk_rope_head_dim", int(head * c.get("partial_rotary_factor", 64 / 512))
                   if isinstance(head, int) else None)
    out[f"{a}.rope.dimension_count"] = rotary
    n, limit, ratios = c.get("num_hidden_layers"), c.get("swiglu_limit"), config.get("compress_ratios")
    if isinstance(n, int) and isinstance(limit, (int, float)):
        clamp = GgufArray(FLOAT32, n, tuple(f32(float(limit)) for _ in range(n)) if n <= KEEP_ARRAY else None)
        out[f"{a}.swiglu_clamp_exp"] = out[f"{a}.swiglu_clamp_shexp"] = clamp
    if isinstance(ratios, list):
        out[f"{a}.attention.compress_ratios"] = GgufArray(INT32, len(ratios), tuple(ratios)
                                                          if len(ratios) <= KEEP_ARRAY else None)
    hc, h = c.get("hc_mult"), c.get("hidden_size")
    out[f"{a}.embedding_length_out"] = h * hc if isinstance(h, int) and isinstance(hc, int) else None
    out.update(_rope_scaling(config))
    return {key: value for key, value in out.items() if value is not None}


def _rope_scaling(config: Mapping[str, Any]) -> dict[str, Any]:
    """TextModel's rope scaling keys, from config.json's own `rope_scaling` (DeepseekV4Model's workaround: the
    transformers config nests its rope parameters under `main` / `compress`, which TextModel does not read)."""
    a = GGUF_ARCH
    params = config.get("rope_scaling")
    if not isinstance(params, dict):
        return {}
    kind, factor = params.get("rope_type", params.get("type")), params.get("factor")
    if kind not in ("linear", "yarn") or factor is None:
        return {}
    out = {f"{a}.rope.scaling.type": kind, f"{a}.rope.scaling.factor": factor}
    if kind == "yarn":
        out.update({f"{a}.rope.scaling.original_context_length": params.get("original_max_position_embeddings"),
                    f"{a}.rope.scaling.yarn_ext_factor": params.get("extrapolation_factor"),
                    f"{a}.rope.scaling.yarn_attn_factor": params.get("attention_factor", params.get("attn_factor")),
                    f"{a}.rope.scaling.yarn_beta_fast": params.get("beta_fast"),
                    f"{a}.rope.scaling.yarn_beta_slow": params.get("beta_slow")})
    return out


def gguf_tree(tree: ModelTree) -> ModelTree:
    """The release's tree as the converter writes it (model.quant.gguf's GGUF_TREE): each layer's routed experts
    stacked [E, out, in]; a 2-D parameter in whichever ggml type it is stored (the converter keeps BF16 and F32,
    llama-quantize may quantize any `.weight` but a norm, `ffn_gate_inp` and the hash table), a 1-D one F32 (the
    converter forces it); the hash table I32."""
    def node(n: Node) -> Node:
        if isinstance(n, Buffer):
            return replace(n, dtype="I32")
        if isinstance(n, Group):
            if n.repeat is not None:  # the routed experts: one tensor per projection
                return replace(n, repeat=None, index_at="", children=tuple(
                    replace(leaf, tensors=tuple(replace(t, stack=(n.repeat,)) if isinstance(t, Linear) else t
                                                for t in leaf.tensors))
                    for leaf in n.children if isinstance(leaf, Leaf)))
            return replace(n, children=tuple(node(c) for c in n.children))
        return replace(n, tensors=tuple(replace(t, dtype="F32" if len(t.shape) == 1 else GGML_ANY)
                                        if isinstance(t, Param) else t for t in n.tensors))
    blocks = {kind: tuple(map(node, nodes)) for kind, nodes in tree.blocks.items()}
    return ModelTree(tuple(map(node, tree.before)), blocks, tuple(map(node, tree.after)))


LAYER = re.compile(r"^layers\.(\d+)\.")
EXPERT = re.compile(r"^(layers\.\d+\.ffn\.experts)\.\d+\.(w[123]\.weight)$")
STACKED = re.compile(r"^(layers\.\d+\.ffn\.experts)\.(w[123]\.weight)$")


def converted(name: str, layers: int, stored: Container[str]) -> tuple[str, ...]:
    """The GGUF tensors the converter writes a release tensor into (DeepseekV4Model.modify_tensors and
    generate_extra_tensors): none for a `.scale` (multiplied into its FP8 weight, or packed into MXFP4's blocks),
    an `mtp.` tensor or a hash layer's routing bias; a routed expert's into its layer's stacked tensor."""
    m = LAYER.match(name)
    if name.endswith(".scale") or name.startswith("mtp.") or (m is not None and int(m.group(1)) >= layers):
        return ()
    if m is not None and name.endswith(".ffn.gate.bias") and f"blk.{m.group(1)}.ffn_gate_tid2eid.weight" in stored:
        return ()
    e = EXPERT.match(name)
    return (GGUF_DIALECT.rename(f"{e.group(1)}.{e.group(2)}" if e else name),)


def release_values(gguf_name: str, read: ReleaseReader, experts: int, heads: int,
                   nope: int) -> tuple[tuple[int, ...], Iterator[np.ndarray]] | None:
    """The float32 values the converter writes into GGUF tensor `gguf_name` from the release's (dequantized)
    tensors: a stacked projection's experts one after another (deepseek2's), everything else as released. None for
    a name the release has no source of."""
    return release_values_as(gguf_name, read, experts, heads, nope, GGUF_DIALECT, STACKED)


def written(name: str, elements: int, cfg: ModelConfig) -> int:
    """The elements the converter writes of a release tensor: a hash table's too (a buffer, which the release's
    parameter count leaves out: [vocab, top-k], written I32), every other tensor's as counted."""
    return cfg.vocab_size * (cfg.num_experts_per_tok or 0) if name.endswith(".ffn.gate.tid2eid") else elements


GGUF_DIALECT = GgufDialect((GGUF_ARCH,), gguf_config, gguf_metadata, GGUF_TOP, GGUF_LAYER, converted,
                           release_values, layer_prefix="layers.", key_types=KEY_TYPES, required=LOADER_REQUIRED,
                           written=written)
