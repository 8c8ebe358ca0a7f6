"""Kimi-Linear as llama.cpp's GGUF writes it (GGUF arch `kimi-linear`): what `convert_hf_to_gguf.py`
(conversion/kimi_linear.py, KimiLinearModel over TextModel) writes from a release and llama.cpp's loader
(src/models/kimi-linear.cpp, llama-model.cpp load_hparams) reads back, at llama.cpp 0c1e5709.

- The layers: `{arch}.attention.head_count_kv`, one value per layer, 0 for a KDA layer (the loader marks it
  recurrent) and 1 for an MLA layer (written as MQA); the KDA heads are `attention.head_count`'s (the loader's
  n_head; the converter writes no count of its own), their dimension `kda.head_dim`, the short convolutions'
  kernel `ssm.conv_kernel` (Moonshot's `linear_attn_config`); the MLA keys are deepseek2's
  (`attention.kv_lora_rank`, `key_length_mla`, `value_length_mla`, `rope.dimension_count`); dense layers before
  `leading_dense_block_count`.
- The tensors (gguf-py constants.py MODEL_ARCH.KIMI_LINEAR, tensor_mapping.py): a KDA layer's q/k/v/o as
  `attn_{q,k,v,output}`, its gates `ssm_{f_a, f_b, g_a, g_b, beta}`, `ssm_norm`, the convolutions
  `ssm_conv1d_{q,k,v}` reshaped [d_inner, 1, kernel] -> (1, d_inner, 1, kernel), `ssm_a` = -exp(A_log), `dt_bias`
  renamed `dt_proj.bias` -> `ssm_dt.bias`; an MLA layer's as deepseek2 writes them (kv_b_proj split into
  `attn_k_b` [heads, kv_lora, nope] and `attn_v_b`); the routed experts' w1/w2/w3 stacked into
  `ffn_{gate,down,up}_exps` [E, out, in]; the router `ffn_gate_inp`, its bias `exp_probs_b.bias`.
- The loader requires `expert_gating_func`, which the converter writes only from a config that names the router's
  function (`moe_router_activation_func` in Moonshot's config.json; transformers' save drops it).
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kimi_audit.errors import GgufKeyError
from kimi_audit.findings import Finding, error
from kimi_audit.format.gguf import KEEP_ARRAY, GgufArray
from kimi_audit.format.gguf_keys import INT32, U32, one_value, vocab_findings
from kimi_audit.model.arch.deepseek_v3 import gguf as deepseek2
from kimi_audit.model.arch.spec import GgufDialect, ReleaseReader

if TYPE_CHECKING:
    import numpy as np

GGUF_ARCH = "kimi-linear"
MODEL_TYPE = "kimi_linear"
CLASS_NAME = "KimiLinearForCausalLM"
GGUF_TOP = deepseek2.GGUF_TOP
GGUF_LAYER = tuple((f"{hf}.weight", f"{gguf}.weight") for hf, gguf in (
    ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_conv1d", "ssm_conv1d_q"), ("self_attn.k_conv1d", "ssm_conv1d_k"),
    ("self_attn.v_conv1d", "ssm_conv1d_v"), ("self_attn.f_a_proj", "ssm_f_a"), ("self_attn.f_b_proj", "ssm_f_b"),
    ("self_attn.b_proj", "ssm_beta"), ("self_attn.g_a_proj", "ssm_g_a"), ("self_attn.g_b_proj", "ssm_g_b"),
    ("self_attn.o_norm", "ssm_norm"),
    ("self_attn.q_a_proj", "attn_q_a"), ("self_attn.q_a_layernorm", "attn_q_a_norm"),
    ("self_attn.q_b_proj", "attn_q_b"), ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"),
    ("self_attn.kv_a_layernorm", "attn_kv_a_norm"), ("self_attn.kv_b_proj", "attn_kv_b"),
    ("self_attn.k_b_proj", "attn_k_b"), ("self_attn.v_b_proj", "attn_v_b"),
    ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
    ("block_sparse_moe.gate", "ffn_gate_inp"),
    ("block_sparse_moe.experts.w1", "ffn_gate_exps"), ("block_sparse_moe.experts.w2", "ffn_down_exps"),
    ("block_sparse_moe.experts.w3", "ffn_up_exps"),
    ("block_sparse_moe.shared_experts.gate_proj", "ffn_gate_shexp"),
    ("block_sparse_moe.shared_experts.up_proj", "ffn_up_shexp"),
    ("block_sparse_moe.shared_experts.down_proj", "ffn_down_shexp"))) + (
    ("self_attn.dt_bias", "ssm_dt.bias"), ("self_attn.A_log", "ssm_a"),
    ("block_sparse_moe.gate.e_score_correction_bias", "exp_probs_b.bias"))
"""GGUF's names of the llama.cpp tree (gguf-py TENSOR_NAMES of MODEL_ARCH.KIMI_LINEAR's tensors; the converter
renames `dt_bias` to `dt_proj.bias` first; tests/test_gguf_archs.py holds them to gguf-py's TensorNameMap)."""

KDA = (("ssm.conv_kernel", "short_conv_kernel_size"), ("kda.head_dim", "head_dim"))
"""(the key after `kimi-linear.`, its `linear_attn_config` key): add_ssm_conv_kernel, add_kda_head_dim."""
MLA = (("attention.kv_lora_rank", "kv_lora_rank"), ("rope.dimension_count", "qk_rope_head_dim"),
       ("attention.value_length_mla", "v_head_dim"))
DIRECT = (("block_count", "num_hidden_layers"), ("embedding_length", "hidden_size"),
          ("feed_forward_length", "intermediate_size"), ("attention.head_count", "num_attention_heads"),
          ("attention.layer_norm_rms_epsilon", "rms_norm_eps"), ("expert_count", "n_routed_experts"),
          ("expert_used_count", "num_experts_per_tok"), ("expert_feed_forward_length", "moe_intermediate_size"),
          ("expert_shared_count", "n_shared_experts"), ("leading_dense_block_count", "first_k_dense_replace"),
          ("attention.q_lora_rank", "q_lora_rank"), *MLA)
"""(the `kimi-linear.` key, the config field kimi_linear.read takes) of the loader's hyperparameters."""
HPARAMS = (
    ("block_count", ("n_layers", "num_hidden_layers", "n_layer", "num_layers")),
    ("context_length", ("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
                        "model_max_length")),
    ("embedding_length", ("hidden_size", "n_embd", "dim")),
    ("feed_forward_length", ("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size",
                             "n_inner", "hidden_dim")),
    ("attention.head_count", ("num_attention_heads", "n_head", "n_heads")),
    ("attention.layer_norm_rms_epsilon", ("rms_norm_eps", "norm_eps")),
    ("attention.layer_norm_epsilon", ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")),
    ("expert_count", ("num_local_experts", "num_experts", "n_routed_experts")),
    ("expert_used_count", ("num_experts_per_tok", "num_experts_per_token", "top_k_experts")),
    ("expert_group_count", ("n_group",)), ("expert_group_used_count", ("topk_group",)),
    ("vocab_size", ("vocab_size",)), ("attention.q_lora_rank", ("q_lora_rank", "n_lora_q")),
    ("attention.kv_lora_rank", ("kv_lora_rank", "n_lora_kv")), ("rope.dimension_count", ("qk_rope_head_dim", "n_rot")),
    ("expert_feed_forward_length", ("moe_intermediate_size",)), ("expert_shared_count", ("num_shared_experts",)),
    ("leading_dense_block_count", ("first_k_dense_replace",)), ("expert_weights_scale", ("routed_scaling_factor",)))
"""(the key, the config.json keys the converter takes its value from, the first present: find_hparam)."""
GATING_KEYS = ("score_function", "scoring_func", "score_func", "moe_router_activation",
               "moe_router_activation_func", "expert_selection_fn")
GATING = {**deepseek2.GATING, "sqrtsoftplus": 4}
"""TextModel.set_gguf_parameters: the router's function -> `expert_gating_func` (gguf-py ExpertGatingFuncType:
SQRTSOFTPLUS is 4; 3 is llama-hparams.h's SOFTMAX_WEIGHT, which no converter writes)."""

KEY_TYPES = {**deepseek2.KEY_TYPES, **{key: U32 for key, _ in KDA}}
"""The `kimi-linear.` keys and the types the loader reads them with (deepseek2's, and the KDA keys into
uint32_t: llama-hparams.h ssm_d_conv, n_embd_head_kda)."""
LOADER_REQUIRED = ("context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon",
                   "attention.key_length_mla", "attention.value_length_mla", "attention.kv_lora_rank",
                   "ssm.conv_kernel", "kda.head_dim", "expert_feed_forward_length", "expert_shared_count",
                   "expert_gating_func")
"""What llama.cpp's loader requires of a kimi-linear file (get_key without `required = false`: llama-model.cpp
load_hparams, src/models/kimi-linear.cpp load_arch_hparams)."""
REQUIRED = ("block_count", "embedding_length", "attention.head_count", "attention.key_length_mla", *(k for k, _ in MLA),
            *(k for k, _ in KDA))
"""What this tool cannot read the model without."""




def layer_types(kv: Mapping[str, Any], n: int, a: str = GGUF_ARCH) -> list[str]:
    """Each layer's attention as the loader decides it: KDA (recurrent) where `attention.head_count_kv` is 0, MLA
    elsewhere; absent, n_head_kv is n_head and no layer is KDA (kimi-k3's loader, `a`, decides alike)."""
    key = f"{a}.attention.head_count_kv"
    value = kv.get(key)
    count = getattr(value, "count", None)
    if count is not None and count != n:  # llama-model-loader.cpp get_key_or_arr: "wrong array length"
        raise GgufKeyError(f"{key} holds {count:,} values for {n} layers: llama.cpp cannot load it", key)
    per = getattr(value, "values", None) if count is not None else None
    if per is None:  # one value for every layer (absent: n_head_kv is n_head)
        per = [kv.get(f"{a}.attention.head_count") if value is None else value] * n
    return ["linear_attention" if v == 0 else "full_attention" for v in per]


def gguf_config(kv: Mapping[str, Any], stored: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Any], list[Finding]]:
    """The config.json a `kimi-linear` GGUF was converted from, as llama.cpp's loader reads its hyperparameters,
    and what in the metadata llama.cpp would misread."""
    a = GGUF_ARCH

    def k(key: str, default: Any = None) -> Any:
        return one_value(kv.get(f"{a}.{key}", default), f"{a}.{key}")

    absent = [f"{a}.{key}" for key in REQUIRED if kv.get(f"{a}.{key}") is None]
    if absent:
        raise GgufKeyError(f"the GGUF metadata lacks {', '.join(absent)}: llama.cpp cannot load it (kimi-audit "
                           "derives no layout without it)", absent[0], "GGUF_KEY_MISSING")
    findings = deepseek2.loader_asserts(kv, a, stored)  # the expert counts, vocab_size: llama-model.cpp's asserts
    gating = k("expert_gating_func")
    if gating is not None and gating != deepseek2.SIGMOID and any(n.endswith(deepseek2.GGUF_ROUTER_BIAS)
                                                                   for n in stored):
        findings.append(error("GGUF_GATING", f"{a}.expert_gating_func is {gating}, but the experts carry exp_probs_b "
                              "(Kimi-Linear's sigmoid routing with a correction bias): llama.cpp routes by other "
                              "logits. Re-convert from a config.json with moe_router_activation_func: sigmoid",
                              tensor=f"{a}.expert_gating_func", expected=deepseek2.SIGMOID, actual=gating))
    vocab, mismatch = vocab_findings(kv, a, stored)
    findings += mismatch
    cfg: dict[str, Any] = {c: k(key) for key, c in DIRECT if kv.get(f"{a}.{key}") is not None}
    n, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    cfg.update({
        "architectures": [CLASS_NAME], "model_type": MODEL_TYPE,
        "intermediate_size": k("feed_forward_length", 0), "moe_intermediate_size": k("expert_feed_forward_length", 0),
        "first_k_dense_replace": k("leading_dense_block_count", 0), "n_shared_experts": k("expert_shared_count", 0),
        "n_routed_experts": k("expert_count", 0),
        "qk_nope_head_dim": k("attention.key_length_mla") - k("rope.dimension_count"),
        "vocab_size": vocab,
        "layer_types": layer_types(kv, n),
        "linear_attn_config": {"num_heads": heads, **{c: k(key) for key, c in KDA}},
        "tie_word_embeddings": "output.weight" not in stored, "torch_dtype": "float32",
        "quantization_config": {"quant_method": "gguf", **({"format": "kv_b"} if _whole_kv_b(stored) else {})},
    })
    return cfg, findings


def _whole_kv_b(stored: Mapping[str, tuple[int, ...]]) -> bool:
    """attn_kv_b stored whole (a conversion before llama.cpp #12801, which the loader still reads)."""
    return any(n.endswith(".attn_kv_b.weight") for n in stored) and not any(n.endswith(".attn_k_b.weight")
                                                                             for n in stored)


def find_hparam(config: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """The converter's find_hparam: the value of the first key present (None where it is null or none is)."""
    return next((config[key] for key in keys if key in config), None)


def gguf_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `kimi-linear.*` keys the converter writes from `config` (a config.json): TextModel's and
    KimiLinearModel's set_gguf_parameters (llama.cpp 0c1e5709 conversion/base.py, kimi_linear.py). Floats as
    GGUF stores them (float32). `audit --against` holds a GGUF's metadata to the config.json it was converted
    from."""
    a = GGUF_ARCH
    out: dict[str, Any] = {f"{a}.{key}": find_hparam(config, keys) for key, keys in HPARAMS}
    score = find_hparam(config, GATING_KEYS)
    if isinstance(score, str) and score in GATING:
        out[f"{a}.expert_gating_func"] = GATING[score]
    if config.get("head_dim") is not None:
        out[f"{a}.attention.value_length"] = config["head_dim"]
    out.update(rope_keys(config))
    linear = config.get("linear_attn_config")
    n = config.get("num_hidden_layers")
    if isinstance(linear, dict) and isinstance(n, int) and isinstance(linear.get("full_attn_layers"), list):
        per = tuple(1 if i + 1 in linear["full_attn_layers"] else 0 for i in range(n))  # MLA written as MQA
        out[f"{a}.attention.head_count_kv"] = GgufArray(INT32, n, per if n <= KEEP_ARRAY else None)
        out.update({f"{a}.{key}": linear.get(c) for key, c in KDA})
    kvl, rope = out[f"{a}.attention.kv_lora_rank"], out[f"{a}.rope.dimension_count"]
    nope, v = config.get("qk_nope_head_dim"), config.get("v_head_dim")
    if isinstance(kvl, int) and isinstance(rope, int):
        out[f"{a}.attention.key_length"] = kvl + rope
        mla = config.get("n_embd_head_k_mla", nope + rope if isinstance(nope, int) else None)
        out[f"{a}.attention.key_length_mla"] = mla
    out[f"{a}.attention.value_length_mla"] = config.get("n_embd_head_v_mla", v)
    return {key: value for key, value in out.items() if value is not None}


def rope_keys(config: Mapping[str, Any], a: str = GGUF_ARCH) -> dict[str, Any]:
    """TextModel's rope keys (every TextModel's: kimi-k3's too, `a`): the base, and linear or YaRN scaling."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    params = params if isinstance(params, dict) else {}
    out: dict[str, Any] = {}
    kind, factor = params.get("rope_type", params.get("type")), params.get("factor")
    if kind in ("linear", "yarn") and factor is not None:
        out.update({f"{a}.rope.scaling.type": kind, f"{a}.rope.scaling.factor": factor})
    if kind == "yarn" and factor is not None:
        out.update({f"{a}.rope.scaling.original_context_length": params.get("original_max_position_embeddings"),
                    f"{a}.rope.scaling.yarn_ext_factor": params.get("extrapolation_factor"),
                    f"{a}.rope.scaling.yarn_attn_factor": params.get("attention_factor", params.get("attn_factor")),
                    f"{a}.rope.scaling.yarn_beta_fast": params.get("beta_fast"),
                    f"{a}.rope.scaling.yarn_beta_slow": params.get("beta_slow")})
    theta = params.get("rope_theta", config.get("rope_theta"))
    if theta is not None:
        out[f"{a}.rope.freq_base"] = theta
    return out


EXPERT = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.experts)\.(\d+)\.(w[123]\.weight)$")
STACKED = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.experts)\.(w[123]\.weight)$")
A_LOG, CONV = ".self_attn.A_log", ("_conv1d.weight",)


def converted(name: str, layers: int, stored: Container[str]) -> tuple[str, ...]:
    """The GGUF tensors the converter writes a release tensor into (KimiLinearModel.modify_tensors): a routed
    expert's into its layer's stacked tensor; kv_b_proj into attn_k_b and attn_v_b (one attn_kv_b in older
    files); an FP8 scale into none (multiplied into its weight)."""
    return deepseek2.converted_as(name, layers, stored, GGUF_DIALECT.rename, EXPERT)


def release_values(gguf_name: str, read: ReleaseReader, experts: int, heads: int,
                   nope: int) -> tuple[tuple[int, ...], Iterator[np.ndarray]] | None:
    """The float32 values the converter writes into GGUF tensor `gguf_name` from the release's tensors (`read`),
    as (their shape, the values in pieces in the tensor's order): stacked experts one after another and kv_b split
    per head as deepseek2's; a short convolution's rows as they are, in the 4-D shape; -exp(A_log); the rest in
    row bands. None for a name the release has no source of."""
    return deepseek2.release_values_as(gguf_name, read, experts, heads, nope, GGUF_DIALECT, STACKED, _transformed)


def _transformed(name: str, read: ReleaseReader) -> tuple[tuple[int, ...], Iterator[np.ndarray]] | None:
    """The KDA tensors the converter writes transformed: a short convolution in the 4-D shape, -exp(A_log)."""
    if name.endswith(CONV) and len(shape := read.shape(name)) == 3:
        return (1, shape[0], 1, shape[2]), read.bands(name)
    if name.endswith(A_LOG):
        return read.shape(name), _minus_exp(read, name)
    return None


def _minus_exp(read: ReleaseReader, name: str) -> Iterator[np.ndarray]:
    """-exp(A_log) as the converter writes it: in float32 (its modify_tensors receives the release's tensor cast
    to F32, a BF16 release's too: not rounded back to BF16), rounded as torch's exp rounds, correctly (numpy's
    float32 exp is one ulp off on some values: the fixture's blk.0.ssm_a), so computed in float64 and rounded."""
    import numpy as np

    for band in read.bands(name):
        yield (-np.exp(np.asarray(band, dtype=np.float64))).astype(np.float32)


GGUF_DIALECT = GgufDialect((GGUF_ARCH,), gguf_config, gguf_metadata, GGUF_TOP, GGUF_LAYER, converted,
                           release_values, key_types=KEY_TYPES, required=LOADER_REQUIRED)
