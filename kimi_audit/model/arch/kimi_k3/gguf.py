"""Kimi K3 as llama.cpp's GGUF writes it (GGUF arch `kimi-k3`): what `convert_hf_to_gguf.py` (conversion/kimi_k3.py,
KimiK3Model over TextModel) writes from a release and llama.cpp's loader (src/models/kimi-k3.cpp load_arch_hparams,
load_arch_tensors; llama-model.cpp load_hparams) reads back, at llama.cpp 0c1e5709.

The converter writes the text model alone (`language_model.` stripped; `vision_tower.*`, `mm_projector.*` skipped)
in Kimi-Linear's skeleton (model.arch.kimi_linear.gguf: the KDA and MLA tensors, MLA as MQA, head_count_kv 0 on a
KDA layer, the experts stacked, kv_b split), with K3's own parts:
- the attention residuals: `<x>_res_norm.weight` × `<x>_res_proj.weight` fused into one F32 vector [H]
  (KimiK3Model._RES_FUSIONS: `attn_res_score`, `ffn_res_score` per layer, `output_res_score`), the loader requiring
  them where `attn_res.block_size` > 0;
- `self_attn.g_proj` resolved by the layer's kind: the KDA layers' full-rank gate `ssm_g`, the MLA layers' output
  gate `attn_gate` (this module's tree names the KDA one `self_attn.kda_g_proj` to tell them apart);
- `A_log` [linear head dim] cut to its heads and written -exp(A_log) [heads] (`ssm_a`);
- the latent MoE `ffn_routed_{down,up,norm}` (`expert_latent_length`), `expert_weights_norm` from
  `moe_renormalize`, the situ activation's betas, `kda.gate_lower_bound`;
- compressed-tensors `mxfp4-pack-quantized` experts repacked bit for bit into ggml MXFP4 (one stacked tensor per
  projection; `weight_scale` goes into its blocks), other experts stacked and quantized as the `--outtype` says.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kimi_audit.errors import GgufKeyError
from kimi_audit.findings import Finding, error
from kimi_audit.format.gguf import KEEP_ARRAY, GgufArray
from kimi_audit.format.gguf_keys import F32, INT32, U32, one_value, vocab_findings
from kimi_audit.model.arch.deepseek_v3 import gguf as deepseek2
from kimi_audit.model.arch.kimi_linear import gguf as kl
from kimi_audit.model.arch.renamed import RenamedReader
from kimi_audit.model.arch.spec import GgufDialect, ReleaseReader
from kimi_audit.model.config_fields import ModelConfig

if TYPE_CHECKING:
    import numpy as np

GGUF_ARCH = "kimi-k3"
MODEL_TYPE = "kimi_k3"
CLASS_NAME = "KimiK3ForConditionalGeneration"
TEXT_PREFIX = "language_model."
RESIDUALS = {"attn_res_score.weight": "self_attention_res", "ffn_res_score.weight": "mlp_res",
             "output_res_score.weight": "model.output_attn_res"}
"""GGUF name (relative to `blk.N.`, or whole) -> the release's `<x>` of the `<x>_res_norm.weight` and
`<x>_res_proj.weight` it is the product of (KimiK3Model._RES_FUSIONS)."""
KDA_GATE = "self_attn.kda_g_proj.weight"
GATE = "self_attn.g_proj.weight"
TEXT_TOP = (*deepseek2.GGUF_TOP, ("model.output_attn_res_norm.weight", "output_res_score.weight"))
TEXT_LAYER = tuple(p for p in kl.GGUF_LAYER if p[1] not in ("ssm_g_a.weight", "ssm_g_b.weight")) + tuple(
    (f"{hf}.weight", f"{gguf}.weight") for hf, gguf in (
        ("self_attention_res_norm", "attn_res_score"), ("mlp_res_norm", "ffn_res_score"),
        ("self_attn.g_proj", "attn_gate"), ("self_attn.kda_g_proj", "ssm_g"),
        ("block_sparse_moe.routed_expert_down_proj", "ffn_routed_down"),
        ("block_sparse_moe.routed_expert_up_proj", "ffn_routed_up"),
        ("block_sparse_moe.routed_expert_norm", "ffn_routed_norm")))
"""GGUF's names of the converter's tree, relative to a layer (gguf-py constants.py MODEL_ARCH.KIMI_K3's tensors:
Kimi-Linear's less the low-rank KDA gate, which K3 replaces with SSM_G; tests/test_gguf_kimi_k3.py holds them to
gguf-py's TensorNameMap and to what the converter wrote). A residual's fused score is named after its norm."""

KEYS = (("attn_res.block_size", "attn_res_block_size"), ("expert_latent_length", "routed_expert_hidden_size"),
        ("activation.situ_beta", "activation_situ_beta"),
        ("activation.situ_linear_beta", "activation_situ_linear_beta"))
"""(the `kimi-k3.` key, the config key KimiK3Model.set_gguf_parameters writes it from) beyond Kimi-Linear's."""
KEY_TYPES = {**kl.KEY_TYPES, "attn_res.block_size": U32, "expert_latent_length": U32, "activation.situ_beta": F32,
             "activation.situ_linear_beta": F32, "kda.gate_lower_bound": F32}
"""The `kimi-k3.` keys and the types the loader reads them with: kimi-linear's, and llama-hparams.h's uint32_t
attn_res_block_size, n_expert_latent, float situ_beta, situ_linear_beta, kda_gate_lower_bound."""
LOADER_REQUIRED = (*kl.LOADER_REQUIRED, "attn_res.block_size", "activation.situ_beta", "activation.situ_linear_beta")
"""What kimi-k3's loader requires (get_key without `required = false`: src/models/kimi-k3.cpp load_arch_hparams,
llama-model.cpp load_hparams): kimi-linear's, and the attention residuals' block size and the situ betas."""
REQUIRED = (*kl.REQUIRED, "attn_res.block_size")
"""What this tool cannot read the model without."""


def gguf_config(kv: Mapping[str, Any], stored: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Any], list[Finding]]:
    """The config.json a `kimi-k3` GGUF was converted from, as the loader reads its hyperparameters: the text model
    nested as the release nests it; what the loader creates only where the file holds it (the MLA output gate,
    the latent norm: TENSOR_NOT_REQUIRED) read from the stored names; the output head always (it requires it)."""
    a = GGUF_ARCH

    def k(key: str, default: Any = None) -> Any:
        return one_value(kv.get(f"{a}.{key}", default), f"{a}.{key}")

    absent = [f"{a}.{key}" for key in REQUIRED if kv.get(f"{a}.{key}") is None]
    if absent:
        raise GgufKeyError(f"the GGUF metadata lacks {', '.join(absent)}: llama.cpp cannot load it (kimi-audit "
                           "derives no layout without it)", absent[0], "GGUF_KEY_MISSING")
    findings = deepseek2.loader_asserts(kv, a, stored)
    gating = k("expert_gating_func")
    if gating is not None and gating != deepseek2.SIGMOID:
        findings.append(error("GGUF_GATING", f"{a}.expert_gating_func is {gating}, but Kimi K3 routes by sigmoid with "
                              "a correction bias (its converter asserts it): llama.cpp routes by other logits",
                              tensor=f"{a}.expert_gating_func", expected=deepseek2.SIGMOID, actual=gating))
    vocab, mismatch = vocab_findings(kv, a, stored)
    findings += mismatch
    text: dict[str, Any] = {c: k(key) for key, c in kl.DIRECT if kv.get(f"{a}.{key}") is not None}
    n, heads = text["num_hidden_layers"], text["num_attention_heads"]
    text.update({
        "model_type": kl.MODEL_TYPE, "intermediate_size": k("feed_forward_length", 0),
        "moe_intermediate_size": k("expert_feed_forward_length", 0),
        "first_k_dense_replace": k("leading_dense_block_count", 0), "n_shared_experts": k("expert_shared_count", 0),
        "n_routed_experts": k("expert_count", 0),
        "qk_nope_head_dim": k("attention.key_length_mla") - k("rope.dimension_count"),
        "vocab_size": vocab,
        "layer_types": kl.layer_types(kv, n, a),
        "linear_attn_config": {"num_heads": heads, "use_full_rank_gate": True, **{c: k(key) for key, c in kl.KDA}},
        "attn_res_block_size": k("attn_res.block_size") or None,
        "routed_expert_hidden_size": k("expert_latent_length") or None,
        "latent_moe_use_norm": any(name.endswith(".ffn_routed_norm.weight") for name in stored),
        "mla_use_output_gate": any(name.endswith(".attn_gate.weight") for name in stored),
    })
    kv_b = {"format": "kv_b"} if any(m.endswith(".attn_kv_b.weight") for m in stored) and not any(
        m.endswith(".attn_k_b.weight") for m in stored) else {}
    return {"architectures": [CLASS_NAME], "model_type": MODEL_TYPE, "text_config": text,
            "tie_word_embeddings": False, "torch_dtype": "float32",
            "quantization_config": {"quant_method": "gguf", **kv_b}}, findings


def gguf_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `kimi-k3.*` keys the converter writes from `config` (a K3 config.json, its text_config merged over its
    top as TextModel merges it): TextModel's and KimiK3Model's set_gguf_parameters (llama.cpp 0c1e5709
    conversion/base.py, kimi_k3.py). Floats as GGUF stores them (float32). `audit --against` holds a GGUF's
    metadata to the config.json it was converted from."""
    a = GGUF_ARCH
    nested = config.get("text_config")
    c: dict[str, Any] = {**config, **(nested if isinstance(nested, dict) else {})}
    out: dict[str, Any] = {f"{a}.{key}": kl.find_hparam(c, keys) for key, keys in kl.HPARAMS}
    score = kl.find_hparam(c, kl.GATING_KEYS)
    if isinstance(score, str) and score in kl.GATING:
        out[f"{a}.expert_gating_func"] = kl.GATING[score]  # (the converter asserts sigmoid)
    out.update(kl.rope_keys(c, a))
    linear = c.get("linear_attn_config")
    n = c.get("num_hidden_layers")
    if isinstance(linear, dict) and isinstance(n, int) and isinstance(linear.get("full_attn_layers"), list):
        per = tuple(1 if i + 1 in linear["full_attn_layers"] else 0 for i in range(n))  # MLA written as MQA
        out[f"{a}.attention.head_count_kv"] = GgufArray(INT32, n, per if n <= KEEP_ARRAY else None)
        out.update({f"{a}.{key}": linear.get(cfg_key) for key, cfg_key in kl.KDA})
        out[f"{a}.kda.gate_lower_bound"] = linear.get("gate_lower_bound")
    kvl, rope, nope = c.get("kv_lora_rank"), c.get("qk_rope_head_dim"), c.get("qk_nope_head_dim")
    if isinstance(kvl, int) and isinstance(rope, int):  # MLA served as MQA: the cache holds the latent
        out.update({f"{a}.attention.key_length": kvl + rope, f"{a}.attention.value_length": kvl})
        if isinstance(nope, int):
            out[f"{a}.attention.key_length_mla"] = nope + rope
    out[f"{a}.attention.value_length_mla"] = c.get("v_head_dim")
    out[f"{a}.expert_weights_norm"] = c.get("moe_renormalize")
    out.update({f"{a}.{key}": c.get(cfg_key) for key, cfg_key in KEYS})
    return {key: value for key, value in out.items() if value is not None}


LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _text(name: str) -> str | None:
    """A release name without `language_model.`; None for the vision tower and projector (text only)."""
    return name[len(TEXT_PREFIX):] if name.startswith(TEXT_PREFIX) else None


def converted(name: str, layers: int, stored: Container[str]) -> tuple[str, ...]:
    """The GGUF tensors the converter writes a release tensor into (KimiK3Model.modify_tensors, get_tensors):
    none for the vision tower (text only) or a residual's projection (multiplied into its norm's score); a
    residual's norm into its score; `g_proj` into `ssm_g` on a KDA layer, `attn_gate` on an MLA layer; a routed
    expert into its layer's stacked tensor (an MXFP4 one's `weight_packed` as its `.weight`, `checks.against`);
    kv_b_proj into attn_k_b and attn_v_b."""
    text = _text(name)
    if text is None or text.endswith("_res_proj.weight"):
        return ()
    m = LAYER.match(text)
    if m is not None and text.endswith(GATE) and int(m.group(1)) < layers:
        blk = f"blk.{m.group(1)}."
        kda, mla = f"{blk}ssm_g.weight", f"{blk}attn_gate.weight"
        if kda in stored or mla in stored:
            return (kda if kda in stored else mla,)
        return (mla if f"{blk}attn_kv_a_mqa.weight" in stored else kda,)  # (the layer's kind by its MLA tensors)
    return deepseek2.converted_as(text, layers, stored, TEXT.rename, kl.EXPERT)


def written(name: str, elements: int, config: ModelConfig) -> int:
    """The elements the converter writes of a release tensor: A_log's first heads alone (`[:n_head]`)."""
    return min(elements, config.num_attention_heads) if name.endswith(kl.A_LOG) else elements


Values = tuple[tuple[int, ...], Iterator["np.ndarray"]]


def release_values(gguf_name: str, read: ReleaseReader, experts: int, heads: int, nope: int) -> Values | None:
    """The float32 values the converter writes into GGUF tensor `gguf_name` from the release's tensors (`read`),
    as (their shape, the values in pieces in the tensor's order): a residual's score the product of its norm and
    projection; `ssm_g` the KDA layer's `g_proj`; `ssm_a` -exp of A_log's first `heads` values; the rest as
    Kimi-Linear's (stacked experts, an MXFP4 one dequantized as the release's format says, which the converter's
    repack keeps bit for bit; kv_b split; the 4-D short convolutions). None for a name the release has no source of."""
    text = RenamedReader(read, TEXT_PREFIX.__add__)
    m = re.match(r"^blk\.(\d+)\.(.*)$", gguf_name)
    layer, rest = (f"model.layers.{m.group(1)}.", m.group(2)) if m else ("", gguf_name)
    if rest in RESIDUALS and (m is None) == rest.startswith("output_"):
        stem = layer + RESIDUALS[rest]
        norm = f"{stem}_norm.weight"
        return (text.shape(norm)[0],), _product(text, norm, f"{stem}_proj.weight")
    if m is not None and rest == "ssm_g.weight":
        return text.shape(layer + GATE), text.bands(layer + GATE)
    if m is not None and rest == "ssm_a":
        a_log = layer + kl.A_LOG.lstrip(".")
        return (min(heads, text.shape(a_log)[0]),), _minus_exp(text, a_log, heads)
    return deepseek2.release_values_as(gguf_name, text, experts, heads, nope, TEXT, kl.STACKED, kl._transformed)


def _product(read: RenamedReader, norm: str, proj: str) -> Iterator[np.ndarray]:
    """norm.float() * proj.float(), both flattened (KimiK3Model._try_fuse_res): float32 products."""
    import numpy as np

    n = read.shape(norm)[0]
    yield (np.asarray(read.rows(norm, 0, n), dtype=np.float32).reshape(-1)
           * np.asarray(read.rows(proj, 0, read.shape(proj)[0]), dtype=np.float32).reshape(-1))


def _minus_exp(read: RenamedReader, name: str, heads: int) -> Iterator[np.ndarray]:
    """-exp(A_log.float()[:n_head]) as torch's float32 exp rounds it (correctly: computed in float64, rounded)."""
    import numpy as np

    values = np.asarray(read.rows(name, 0, min(heads, read.shape(name)[0])), dtype=np.float64)
    yield (-np.exp(values)).astype(np.float32)


def _no_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    return {}


TEXT = GgufDialect((), kl.gguf_config, _no_metadata, TEXT_TOP, TEXT_LAYER, converted, release_values)
"""The text model's names without `language_model.` (how the converter spells them once it strips the prefix)."""
GGUF_DIALECT = GgufDialect(
    (GGUF_ARCH,), gguf_config, gguf_metadata, tuple((TEXT_PREFIX + t, g) for t, g in TEXT_TOP), TEXT_LAYER,
    converted, release_values, layer_prefix=TEXT_PREFIX + "model.layers.", key_types=KEY_TYPES,
    required=LOADER_REQUIRED, written=written)
