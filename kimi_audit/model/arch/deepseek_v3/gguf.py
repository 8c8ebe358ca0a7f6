"""DeepseekV3 as llama.cpp's GGUF writes it (GGUF arch `deepseek2`): Kimi-K2 (Instruct, Base, 0905, Thinking),
DeepSeek-V3/R1/V3.1 and the Kimi-K2.5/K2.6 text model, as `convert_hf_to_gguf.py` (conversion/deepseek.py,
DeepseekV2Model) writes them and llama.cpp's loader (llama-model.cpp, LLM_ARCH_DEEPSEEK2) reads them back: its
metadata keys, its tensor names, what it would misread."""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kimi_audit.errors import GgufKeyError, KimiAuditError
from kimi_audit.findings import Finding, error, warning
from kimi_audit.format.gguf_keys import F32, FLAG, STR, U32, U32_OR_PER_LAYER, one_value, vocab_findings
from kimi_audit.model.arch.spec import GgufDialect, ReleaseReader

if TYPE_CHECKING:
    import numpy as np

GGUF_ARCH = "deepseek2"
GGUF_TOP = (("model.embed_tokens.weight", "token_embd.weight"), ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"))
NEXTN_LAYER = tuple((f"{hf}.weight", f"nextn.{gguf}.weight") for hf, gguf in (
    ("eh_proj", "eh_proj"), ("enorm", "enorm"), ("hnorm", "hnorm"), ("shared_head.norm", "shared_head_norm"),
    ("embed_tokens", "embed_tokens"), ("shared_head.head", "shared_head_head")))
"""A NextN (MTP) layer's own tensors beside its decoder layer (gguf-py TENSOR_NAMES NEXTN_*, mapped from
`model.layers.{bid}.*`), which the converters that keep it write (GLM-4.7-Flash's Glm4MoeLiteModel, GLM-4.x's
Glm4MoeModel); DeepseekV2Model drops the MTP layers."""
GGUF_LAYER = tuple((f"{hf}.weight", f"{gguf}.weight") for hf, gguf in (
    ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"), ("self_attn.q_proj", "attn_q"),
    ("self_attn.q_a_proj", "attn_q_a"), ("self_attn.q_a_layernorm", "attn_q_a_norm"),
    ("self_attn.q_b_proj", "attn_q_b"),
    ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"), ("self_attn.kv_a_layernorm", "attn_kv_a_norm"),
    ("self_attn.kv_b_proj", "attn_kv_b"), ("self_attn.k_b_proj", "attn_k_b"), ("self_attn.v_b_proj", "attn_v_b"),
    ("self_attn.o_proj", "attn_output"), ("mlp.gate", "ffn_gate_inp"), ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"), ("mlp.experts.gate_proj", "ffn_gate_exps"),
    ("mlp.experts.up_proj", "ffn_up_exps"), ("mlp.experts.down_proj", "ffn_down_exps"),
    ("mlp.shared_experts.gate_proj", "ffn_gate_shexp"), ("mlp.shared_experts.up_proj", "ffn_up_shexp"),
    ("mlp.shared_experts.down_proj", "ffn_down_shexp"))) + (("mlp.gate.e_score_correction_bias", "exp_probs_b.bias"),
                                                             *NEXTN_LAYER)
"""GGUF's names of the llama.cpp tree (gguf-py/gguf/constants.py TENSOR_NAMES and tensor_mapping.py, llama.cpp
0c1e5709: MODEL_ARCH.DEEPSEEK2's tensors; tests/test_gguf.py holds them to gguf-py's TensorNameMap), the NextN
layer's appended."""
GGUF_ROUTER_BIAS = ".exp_probs_b.bias"
"""The router's correction bias as GGUF names it (its value role: model.kinds.ROUTER_BIAS)."""
SIGMOID = 2
GLM47_FLASH_VOCAB = 154_880
"""The vocabulary by which llama.cpp's deepseek2 loader recognises GLM-4.7-Flash (with 47 or 48 main layers)."""
"""llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (gguf-py ExpertGatingFuncType)."""
GATING = {"softmax": 1, "sigmoid": SIGMOID}
"""config.json `scoring_func` -> `expert_gating_func` (the converter writes it only when the config has one)."""
TOKENIZER_PRE = "tokenizer.ggml.pre"
PRE_MODEL_TYPES = {"kimi-k2": ("kimi_k2", "DeepseekV3ForCausalLM"), "glm4": ("glm4_moe_lite", "Glm4MoeLiteForCausalLM")}
"""The release a `deepseek2` file's pre-tokenizer names, where it is not DeepSeek's: Kimi-K2's (DeepseekV2Model's
`kimi-k2`), GLM-4.7-Flash's (Glm4MoeLiteModel's `_set_vocab_glm`: `glm4`; GLM-5 is `glm-dsa`)."""
DIRECT = (
    ("block_count", "num_hidden_layers"), ("context_length", "max_position_embeddings"),
    ("embedding_length", "hidden_size"), ("feed_forward_length", "intermediate_size"),
    ("attention.head_count", "num_attention_heads"), ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ("expert_count", "n_routed_experts"), ("expert_used_count", "num_experts_per_tok"),
    ("expert_group_count", "n_group"), ("expert_group_used_count", "topk_group"), ("vocab_size", "vocab_size"),
    ("attention.q_lora_rank", "q_lora_rank"), ("attention.kv_lora_rank", "kv_lora_rank"),
    ("expert_feed_forward_length", "moe_intermediate_size"), ("expert_shared_count", "n_shared_experts"),
    ("expert_weights_scale", "routed_scaling_factor"), ("expert_weights_norm", "norm_topk_prob"),
    ("rope.dimension_count", "qk_rope_head_dim"))
"""(the `deepseek2.` key, the config.json key it holds), one value each way (TextModel.set_gguf_parameters and
DeepseekV2Model's; llama-model.cpp reads them back)."""


KEY_TYPES = {
    **{key: U32 for key in ("block_count", "context_length", "embedding_length", "expert_count", "vocab_size",
                            "expert_group_count", "expert_group_used_count", "attention.q_lora_rank",
                            "attention.kv_lora_rank", "attention.key_length", "attention.value_length",
                            "attention.key_length_mla", "attention.value_length_mla", "expert_shared_count",
                            "expert_gating_func", "rope.dimension_count", "leading_dense_block_count",
                            "rope.scaling.original_context_length", "nextn_predict_layers",
                            "attention.temperature_length")},
    **{key: U32_OR_PER_LAYER for key in ("feed_forward_length", "attention.head_count", "attention.head_count_kv",
                                         "expert_feed_forward_length", "expert_used_count")},
    **{key: F32 for key in ("attention.layer_norm_rms_epsilon", "expert_weights_scale", "rope.freq_base",
                            "rope.scaling.factor", "rope.scaling.yarn_log_multiplier",
                            "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
                            "attention.temperature_scale")},
    "expert_weights_norm": FLAG, "rope.scaling.type": STR,
}
"""The `deepseek2.` keys and the types llama.cpp's loader reads them with (llama-model.cpp
llama_model_base::load_hparams, src/models/deepseek2.cpp load_arch_hparams: get_key into uint32_t / float / bool /
std::string, get_key_or_arr for the per-layer ones)."""
LOADER_REQUIRED = ("context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon",
                   "attention.kv_lora_rank", "expert_feed_forward_length", "expert_shared_count")
"""What llama.cpp's loader requires of a deepseek2 file (get_key / get_key_or_arr without `required = false`:
llama-model.cpp load_hparams, src/models/deepseek2.cpp load_arch_hparams; q_lora_rank too, but not of the lite
variants, which this tool reads as q_proj models)."""
REQUIRED = ("block_count", "embedding_length", "attention.head_count", "attention.kv_lora_rank",
            "rope.dimension_count", "attention.key_length", "attention.value_length")
"""What this tool cannot read the model without (llama.cpp requires most of them, and reads the rest into its
head dimensions)."""


def loader_asserts(kv: Mapping[str, Any], a: str, stored: Mapping[str, tuple[int, ...]]) -> list[Finding]:
    """The hyperparameters llama.cpp's loader asserts on (llama-model.cpp load_hparams: the expert counts, the
    NextN layers; src/models/deepseek2.cpp: token_embd is [n_vocab, n_embd] with n_vocab the vocab_size key's):
    one GGUF_KEY_VALUE each, the key named."""
    def k(key: str) -> Any:
        return kv.get(f"{a}.{key}")

    def most(value: Any) -> int:
        values = getattr(value, "values", None)
        return max(values, default=0) if values is not None else (value or 0)

    out: list[Finding] = []

    def bad(key: str, why: str, value: Any) -> None:
        out.append(error("GGUF_KEY_VALUE", f"{a}.{key} is {value!r}: {why}, which llama.cpp's loader asserts",
                         tensor=f"{a}.{key}", actual=value if isinstance(value, int) else None))

    experts, used = k("expert_count") or 0, most(k("expert_used_count"))
    groups, group_used = k("expert_group_count") or 0, k("expert_group_used_count") or 0
    if used > experts:
        bad("expert_used_count", f"more experts routed per token than the {experts} there are", used)
    elif experts and not used:
        bad("expert_used_count", f"no expert routed per token of the {experts} there are", used)
    if experts and groups >= experts:
        bad("expert_group_count", f"not fewer groups than the {experts} experts", groups)
    elif experts and groups > 1 and (experts % groups or not 0 < group_used < groups):
        bad("expert_group_count", f"groups that do not divide the {experts} experts, or {group_used} of them "
            "used", groups)
    elif not experts and (used or groups):
        bad("expert_count", "no experts, yet experts routed or grouped", experts)
    if (k("nextn_predict_layers") or 0) > (k("block_count") or 0):
        bad("nextn_predict_layers", f"more NextN layers than the {k('block_count')} blocks", k("nextn_predict_layers"))
    vocab, embed = k("vocab_size"), stored.get("token_embd.weight")
    tokens = getattr(kv.get("tokenizer.ggml.tokens"), "count", None)
    if vocab is not None and embed and embed[0] != vocab and tokens in (None, embed[0]):  # (else GGUF_VOCAB_MISMATCH)
        bad("vocab_size", f"token_embd has {embed[0]:,} rows, and llama.cpp creates it with {vocab:,}", vocab)
    return out


def nextn_layers(kv: Mapping[str, Any], a: str) -> int:
    """The NextN (MTP) layers `block_count` counts beside the main ones (llama-model.cpp: n_layer_all holds them,
    n_layer_nextn the last ones); more than the blocks is the loader's GGML_ASSERT, and no model to derive."""
    nextn, blocks = kv.get(f"{a}.nextn_predict_layers") or 0, kv.get(f"{a}.block_count") or 0
    if nextn > blocks:
        raise GgufKeyError(f"{a}.nextn_predict_layers is {nextn}, more NextN layers than the {blocks} blocks: "
                           "llama.cpp's loader asserts (n_layer_nextn <= n_layer_all)", f"{a}.nextn_predict_layers",
                           "GGUF_KEY_VALUE")
    return int(nextn)


def loader_gating(stored: Any, main_layers: int, vocab: Any) -> Any:
    """The expert gating function llama.cpp routes by: the key's value, or where it is absent the loader's own
    default (src/models/deepseek2.cpp load_arch_hparams: sigmoid for 47 or 48 main layers and a 154,880-token
    vocabulary, GLM-4.7-Flash, whose GGUFs lack the key; else softmax, what DeepSeek-V2 GGUFs assume); None stands
    for softmax by absence."""
    if stored is None and main_layers in (47, 48) and vocab == GLM47_FLASH_VOCAB:
        return SIGMOID
    return stored


def gguf_config(kv: Mapping[str, Any], stored: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Any], list[Finding]]:
    """The config.json a `deepseek2` GGUF was converted from, as llama.cpp's loader reads its hyperparameters
    (llama-model.cpp, LLM_ARCH_DEEPSEEK2), and what in the metadata llama.cpp would misread."""
    a = GGUF_ARCH
    findings: list[Finding] = []

    def k(key: str, default: Any = None) -> Any:
        return one_value(kv.get(f"{a}.{key}", default), f"{a}.{key}")

    absent = [f"{a}.{key}" for key in REQUIRED if k(key) is None]
    if absent:
        raise GgufKeyError(f"the GGUF metadata lacks {', '.join(absent)}: llama.cpp cannot load it (kimi-audit "
                           "derives no layout without it)", absent[0], "GGUF_KEY_MISSING")
    if not k("expert_count") and any(n.endswith("_exps.weight") for n in stored):
        raise GgufKeyError(f"no {a}.expert_count, yet routed experts are stored: llama.cpp builds no expert "
                           "tensor to load them into", f"{a}.expert_count", "GGUF_KEY_MISSING")
    findings.extend(loader_asserts(kv, a, stored))
    rope = k("rope.dimension_count")
    split = any(n.endswith(".attn_k_b.weight") for n in stored)
    whole = any(n.endswith(".attn_kv_b.weight") for n in stored)
    mla = k("attention.key_length_mla") is not None and k("attention.value_length_mla") is not None
    if mla:
        nope, v = k("attention.key_length_mla") - rope, k("attention.value_length_mla")
    else:
        nope, v = k("attention.key_length") - rope, k("attention.value_length")
        if split:
            findings.append(error("GGUF_KEY_MISSING", f"attn_k_b/attn_v_b are stored but {a}.attention.key_length_mla"
                                  " and value_length_mla are not: llama.cpp reads the key and value lengths wrong",
                                  tensor=f"{a}.attention.key_length_mla"))
            nope, v = k("attention.key_length") - k("attention.kv_lora_rank") - rope, k("attention.value_length")
    if whole and not split:
        findings.append(warning("GGUF_PRE_MLA", "attention stored as one attn_kv_b per layer: a conversion from "
                                "before llama.cpp #12801, which runs without MLA (more KV cache, slower); "
                                "re-convert for attn_k_b/attn_v_b", tensor="attn_kv_b"))
    tokens = kv.get("tokenizer.ggml.tokens")
    vocab, mismatch = vocab_findings(kv, a, stored)
    findings += mismatch
    gating, bias = loader_gating(k("expert_gating_func"), k("block_count") - (k("nextn_predict_layers") or 0),
                                 k("vocab_size") or getattr(tokens, "count", None)), \
        any(n.endswith(GGUF_ROUTER_BIAS) for n in stored)
    if bias and gating != SIGMOID:
        said = "absent" if gating is None else f"{gating}"
        findings.append(error("GGUF_GATING", f"{a}.expert_gating_func is {said}, but the experts carry exp_probs_b "
                              "(sigmoid routing with a correction bias): llama.cpp routes by softmax, other logits. "
                              "The config.json converted had no scoring_func; re-convert with scoring_func: sigmoid",
                              tensor=f"{a}.expert_gating_func", expected=SIGMOID, actual=gating))
    nextn = nextn_layers(kv, a)
    model_type, class_name = PRE_MODEL_TYPES.get(str(kv.get(TOKENIZER_PRE)), ("deepseek_v3", "DeepseekV3ForCausalLM"))
    cfg: dict[str, Any] = {config: k(key) for key, config in DIRECT if k(key) is not None}
    cfg.update({
        "model_type": model_type, "architectures": [class_name],
        "intermediate_size": k("feed_forward_length", 0), "moe_intermediate_size": k("expert_feed_forward_length", 0),
        "first_k_dense_replace": k("leading_dense_block_count", 0), "moe_layer_freq": 1,
        "n_routed_experts": k("expert_count") or None, "qk_nope_head_dim": nope, "v_head_dim": v,
        "vocab_size": vocab,
        "topk_method": "noaux_tc" if bias or gating == SIGMOID else "greedy",
        "tie_word_embeddings": "output.weight" not in stored, "num_nextn_predict_layers": nextn,
        "num_hidden_layers": k("block_count") - nextn,
        "torch_dtype": "float32",
        "quantization_config": {"quant_method": "gguf", **({"format": "kv_b"} if whole and not split else {})},
    })
    return cfg, findings


def gguf_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `deepseek2.*` keys the converter writes from `config` (a config.json): DeepseekV2Model's and
    TextModel's set_gguf_parameters (llama.cpp 0c1e5709 conversion/deepseek.py, base.py). Floats as GGUF stores
    them (float32). `audit --against` holds a GGUF's metadata to the config.json it was converted from."""
    a = GGUF_ARCH
    out: dict[str, Any] = {f"{a}.{key}": config[c] for key, c in DIRECT if config.get(c) is not None}
    kvl, rope = config.get("kv_lora_rank", 512), config.get("qk_rope_head_dim")
    nope, v = config.get("qk_nope_head_dim"), config.get("v_head_dim")
    if isinstance(kvl, int) and isinstance(rope, int) and isinstance(nope, int) and isinstance(v, int):
        out.update({f"{a}.attention.kv_lora_rank": kvl, f"{a}.attention.key_length": kvl + rope,
                    f"{a}.attention.value_length": kvl, f"{a}.attention.key_length_mla": nope + rope,
                    f"{a}.attention.value_length_mla": v})
    out[f"{a}.attention.head_count_kv"] = 1  # MLA written as MQA
    out[f"{a}.leading_dense_block_count"] = config.get("first_k_dense_replace", 0)
    out[f"{a}.expert_shared_count"] = config.get("n_shared_experts", 0)
    if not config.get("norm_topk_prob"):
        out.pop(f"{a}.expert_weights_norm", None)
    scoring = config.get("scoring_func")
    gating = GATING.get(scoring) if isinstance(scoring, str) else None
    if gating is not None:
        out[f"{a}.expert_gating_func"] = gating
    rope_scaling = config.get("rope_scaling") or config.get("rope_parameters")
    theta = config.get("rope_theta") or (rope_scaling or {}).get("rope_theta")
    if theta is not None:
        out[f"{a}.rope.freq_base"] = theta
    if isinstance(rope_scaling, dict) and (rope_scaling.get("type") or rope_scaling.get("rope_type")) == "yarn":
        out.update({f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": rope_scaling.get("factor"),
                    f"{a}.rope.scaling.original_context_length": rope_scaling.get("original_max_position_embeddings"),
                    f"{a}.rope.scaling.yarn_beta_fast": rope_scaling.get("beta_fast"),
                    f"{a}.rope.scaling.yarn_beta_slow": rope_scaling.get("beta_slow")})
        if rope_scaling.get("mscale_all_dim") is not None:
            out[f"{a}.rope.scaling.yarn_log_multiplier"] = 0.1 * rope_scaling["mscale_all_dim"]
        if rope_scaling.get("llama_4_scaling_beta") is not None:  # Mistral's params.json (MistralMoeModel: the
            # scaling's beta with yarn's original length, conversion/mistral.py lines 108-110, 177)
            out.update({f"{a}.attention.temperature_scale": rope_scaling["llama_4_scaling_beta"],
                        f"{a}.attention.temperature_length": rope_scaling.get("original_max_position_embeddings")})
    return {key: value for key, value in out.items() if value is not None}


LAYER = re.compile(r"^model\.layers\.(\d+)\.")
EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+\.weight)$")
STACKED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\w+\.weight)$")
DROPPED = (".weight_scale_inv", ".inv_freq")
KV_B, K_B, V_B = "self_attn.kv_b_proj.weight", "self_attn.k_b_proj.weight", "self_attn.v_b_proj.weight"


def converted(name: str, layers: int, stored: Container[str]) -> tuple[str, ...]:
    """The GGUF tensors the converter writes a release tensor into (DeepseekV2Model.modify_tensors): none for an
    FP8 scale (multiplied into its weight), a rotary buffer or an MTP layer's tensor; a routed expert's into its
    layer's stacked tensor; kv_b_proj into attn_k_b and attn_v_b (one attn_kv_b in files before #12801)."""
    return converted_as(name, layers, stored, GGUF_DIALECT.rename)


def kept_nextn(layers: int, stored: Container[str], rename: Callable[[str], str]) -> bool:
    """The file holds the NextN (MTP) layers, as llama.cpp's loader probes for them (deepseek2.cpp, glm4-moe.cpp:
    `blk.{n_layer}.nextn.eh_proj.weight`): the converter kept them (GLM's converters do, but with `--no-mtp`)."""
    return rename(f"model.layers.{layers}.eh_proj.weight") in stored


def converted_as(name: str, layers: int, stored: Container[str], rename: Callable[[str], str],
                 expert: re.Pattern[str] = EXPERT) -> tuple[str, ...]:
    """`converted`, the names spelled by `rename` and the routed experts found by `expert` (its groups: the
    experts' module, the index, the weight): another architecture whose converter stacks experts and splits kv_b
    as DeepseekV2Model does (Kimi-Linear's). An MTP layer's tensors are written where the file keeps that layer."""
    m = LAYER.match(name)
    mtp = m is not None and int(m.group(1)) >= layers
    if name.endswith(DROPPED) or (mtp and not kept_nextn(layers, stored, rename)):
        return ()
    e = expert.match(name)
    if e is not None:
        name = f"{e.group(1)}.{e.group(3)}"
    if name.endswith(KV_B) and rename(name) not in stored:
        return rename(name[: -len(KV_B)] + K_B), rename(name[: -len(KV_B)] + V_B)
    return (rename(name),)


def release_values(gguf_name: str, read: ReleaseReader, experts: int, heads: int,
                   nope: int) -> tuple[tuple[int, ...], Iterator[np.ndarray]] | None:
    """The float32 values the converter writes into GGUF tensor `gguf_name`, from the release's tensors (`read`:
    the release's tensors dequantized, by rows), as (their shape, the values in pieces in the tensor's order):
    stacked experts one expert after another, each in row bands; kv_b split per head (its key half transposed);
    the rest in row bands. None for a name the release has no source of. Nothing is read until the pieces are."""
    return release_values_as(gguf_name, read, experts, heads, nope, GGUF_DIALECT, STACKED)


Values = tuple[tuple[int, ...], Iterator["np.ndarray"]]


def release_values_as(gguf_name: str, read: ReleaseReader, experts: int, heads: int, nope: int,
                      dialect: GgufDialect, stacked: re.Pattern[str],
                      special: Callable[[str, ReleaseReader], Values | None] | None = None) -> Values | None:
    """`release_values` for an architecture whose converter stacks experts (and splits kv_b) as DeepseekV2Model
    does (Kimi-Linear's, DeepSeek-V4's): its names (`dialect`, its layers under its `layer_prefix`), its routed
    experts (`stacked`: the experts' module and the weight), and `special`, the values of its own tensors the
    converter transforms (None: none here)."""
    tree = {v: k for k, v in dialect._table.items()}
    m = re.match(r"^blk\.(\d+)\.(.*)$", gguf_name)
    name = f"{dialect.layer_prefix}{m.group(1)}.{tree.get(m.group(2), '')}" if m else tree.get(gguf_name, "")
    if not name or name.endswith("."):
        return None
    s = stacked.match(name)
    if s is not None:
        names = [f"{s.group(1)}.{i}.{s.group(2)}" for i in range(experts)]
        one = read.shape(names[0]) if names else ()
        return (experts, *one), _stacked(read, names, one)
    for half in (K_B, V_B):
        if name.endswith(half):
            kv_b = name[: -len(half)] + KV_B
            rows, width = _kv_b_shape(read.shape(kv_b), heads, nope)
            shape = (heads, width, nope) if half == K_B else (heads, rows - nope, width)
            return shape, _kv_b_half(read, kv_b, heads, rows, nope, half == K_B)
    own = special(name, read) if special is not None else None
    return own if own is not None else (read.shape(name), read.bands(name))


def _stacked(read: ReleaseReader, names: list[str], one: tuple[int, ...]) -> Iterator[np.ndarray]:
    for name in names:
        if read.shape(name) != one:
            raise KimiAuditError(f"{name} has shape {list(read.shape(name))}, the first expert {list(one)}: the "
                                "converter cannot stack them")
        yield from read.bands(name)


def _kv_b_shape(shape: tuple[int, ...], heads: int, nope: int) -> tuple[int, int]:
    """kv_b_proj's rows per head and its width (kv_lora_rank)."""
    if len(shape) != 2 or heads <= 0 or shape[0] % heads or shape[0] // heads <= nope:
        raise KimiAuditError(f"kv_b_proj has shape {list(shape)}: not {heads} heads of more than {nope} rows")
    return shape[0] // heads, shape[1]


def _kv_b_half(read: ReleaseReader, kv_b: str, heads: int, rows: int, nope: int, key: bool) -> Iterator[np.ndarray]:
    """Per head: its key rows transposed ([kv_lora_rank, nope]) or its value rows ([v, kv_lora_rank])."""
    import numpy as np

    for h in range(heads):
        if key:
            yield np.ascontiguousarray(read.rows(kv_b, h * rows, h * rows + nope).T)
        else:
            yield read.rows(kv_b, h * rows + nope, (h + 1) * rows)


GGUF_DIALECT = GgufDialect((GGUF_ARCH,), gguf_config, gguf_metadata, GGUF_TOP, GGUF_LAYER, converted,
                           release_values, key_types=KEY_TYPES, required=LOADER_REQUIRED)


