"""DeepseekV3's tree with DeepSeek-V3.2's sparse-attention indexer as llama.cpp's GGUF writes it: the arch
`deepseek32` (DeepSeek-V3.2: conversion/deepseek.py DeepseekV32Model, src/models/deepseek32.cpp), and the parts
GLM-5's `glm-dsa` (model.arch.glm_moe_dsa) shares with it. Both converters are DeepseekV2Model's with the indexer's
keys and tensors added, so the `deepseek2` dialect (gguf.py) is read under the architecture's own key prefix, and
its names extended by the indexer's.

What `deepseek2` writes that this reads the same way: every MLA, MoE and rope key, the split kv_b, the stacked
experts, the router bias. What the DSA converters add: `{arch}.attention.indexer.{head_count, key_length, top_k}`
(`glm-dsa` also `.types`, one bool per layer), `{arch}.nextn_predict_layers` when the config has the key, and the
indexer's tensors `blk.N.indexer.{attn_q_b, attn_k, k_norm, proj}` (gguf-py constants.py MODEL_ARCH.DEEPSEEK32,
GLM_DSA; tensor_mapping.py maps them from `self_attn.indexer.{wq_b, wk, k_norm, weights_proj}`).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import replace
from typing import Any

from kimi_audit.errors import GgufKeyError
from kimi_audit.findings import Finding
from kimi_audit.format.gguf_keys import U32, U32_OR_PER_LAYER
from kimi_audit.model.arch.deepseek_v3.gguf import GGUF_ARCH, GGUF_LAYER, KEY_TYPES, gguf_config, gguf_metadata
from kimi_audit.model.arch.deepseek_v3.gguf import GGUF_DIALECT as DEEPSEEK2
from kimi_audit.model.arch.deepseek_v3.gguf import converted as deepseek2_converted
from kimi_audit.model.arch.deepseek_v3.gguf import release_values as deepseek2_release_values
from kimi_audit.model.arch.spec import GgufDialect, ReleaseReader

DEEPSEEK32 = "deepseek32"
INDEXER_LAYER = (("self_attn.indexer.wq_b.weight", "indexer.attn_q_b.weight"),
                 ("self_attn.indexer.wk.weight", "indexer.attn_k.weight"),
                 ("self_attn.indexer.k_norm.weight", "indexer.k_norm.weight"),
                 ("self_attn.indexer.k_norm.bias", "indexer.k_norm.bias"),
                 ("self_attn.indexer.weights_proj.weight", "indexer.proj.weight"))
"""The indexer's GGUF names (gguf-py TENSOR_NAMES INDEXER_*; tests/test_gguf_archs.py holds them to TensorNameMap)."""
DSA_LAYER = GGUF_LAYER + INDEXER_LAYER
INDEXER = (("attention.indexer.head_count", "index_n_heads"), ("attention.indexer.key_length", "index_head_dim"),
           ("attention.indexer.top_k", "index_topk"))
"""(the key after `{arch}.`, the config.json key): the converter's add_indexer_* calls, the loader's get_key."""
NEXTN = "nextn_predict_layers"
DSA_KEY_TYPES = {**KEY_TYPES, **{key: U32 for key, _ in INDEXER}, NEXTN: U32,
                 "attention.indexer.types": U32_OR_PER_LAYER}
"""The DSA archs' keys and the types their loaders read them with (src/models/deepseek32.cpp, glm-dsa.cpp:
get_key into uint32_t for the indexer, get_key_or_arr for `attention.indexer.types`; llama-model.cpp reads
`nextn_predict_layers` into a uint32_t)."""


def as_deepseek2(kv: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The metadata with the `{arch}.` keys under `deepseek2.`: what gguf.py's reader reads."""
    prefix, into = f"{arch}.", f"{GGUF_ARCH}."
    return {(into + k[len(prefix):] if k.startswith(prefix) else k): v for k, v in kv.items()}


def respell(findings: list[Finding], arch: str) -> list[Finding]:
    """deepseek2's findings with its key names in `arch`'s spelling."""
    a, b = f"{GGUF_ARCH}.", f"{arch}."
    return [replace(f, message=f.message.replace(a, b),
                    tensor=f.tensor.replace(a, b) if f.tensor else f.tensor) for f in findings]


def dsa_config(kv: Mapping[str, Any], stored: Mapping[str, tuple[int, ...]],
               arch: str) -> tuple[dict[str, Any], list[Finding]]:
    """deepseek2's config of a DSA arch's metadata, with the indexer's dimensions (deepseek2's reads the main
    layers and the NextN layers the converter appends, which the loader's block_count counts)."""
    absent = [f"{arch}.{key}" for key, _ in INDEXER if kv.get(f"{arch}.{key}") is None]
    if absent:  # src/models/deepseek32.cpp and glm-dsa.cpp get_key each of the three, required
        raise GgufKeyError(f"the GGUF metadata lacks {', '.join(absent)}: llama.cpp cannot load it", absent[0],
                           "GGUF_KEY_MISSING")
    cfg, findings = gguf_config(as_deepseek2(kv, arch), stored)
    cfg.update({c: kv[f"{arch}.{key}"] for key, c in INDEXER if kv.get(f"{arch}.{key}") is not None})
    return cfg, respell(findings, arch)


def dsa_metadata(config: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The `{arch}.*` keys a DSA converter writes from `config`: DeepseekV2Model's and the indexer's
    (DeepseekV32Model / GlmMoeDsaModel.set_gguf_parameters)."""
    prefix = f"{GGUF_ARCH}."
    out = {f"{arch}.{k[len(prefix):]}": v for k, v in gguf_metadata(config).items()}
    out.update({f"{arch}.{key}": config[c] for key, c in INDEXER if config.get(c) is not None})
    if config.get("num_nextn_predict_layers") is not None:
        out[f"{arch}.{NEXTN}"] = config["num_nextn_predict_layers"]
    return out


def dsa_converted(table: Callable[[], GgufDialect]) -> Callable[[str, int, Container[str]], tuple[str, ...]]:
    """deepseek2's `converted` with the indexer's names spelled by the dialect `table()` returns."""
    def converted(name: str, layers: int, stored: Container[str]) -> tuple[str, ...]:
        return tuple(table().rename(n) for n in deepseek2_converted(name, layers, stored))
    return converted


def dsa_release_values(table: Callable[[], GgufDialect]) -> Callable[..., Any]:
    """deepseek2's `release_values`; an indexer tensor is written as released (a weight, a norm's gain or bias)."""
    def release_values(gguf_name: str, read: ReleaseReader, experts: int, heads: int,
                       nope: int) -> tuple[tuple[int, ...], Iterator[Any]] | None:
        for tree, spelled in INDEXER_LAYER:
            if gguf_name.startswith("blk.") and gguf_name.endswith("." + spelled):
                name = f"model.layers.{gguf_name.split('.')[1]}.{tree}"
                return read.shape(name), read.bands(name)
        return deepseek2_release_values(gguf_name, read, experts, heads, nope)
    return release_values


def _config(kv: Mapping[str, Any], stored: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Any], list[Finding]]:
    """`deepseek2` as gguf.py reads it; `deepseek32` as DeepSeek-V3.2 (DeepseekV32ForCausalLM)."""
    if kv.get("general.architecture") != DEEPSEEK32:
        return gguf_config(kv, stored)
    cfg, findings = dsa_config(kv, stored, DEEPSEEK32)
    cfg.update({"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32"})
    return cfg, findings


def _metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepseekV32ForCausalLM is converted by DeepseekV32Model (arch `deepseek32`), the rest by DeepseekV2Model."""
    archs = config.get("architectures")
    if config.get("model_type") == "deepseek_v32" or (isinstance(archs, list) and "DeepseekV32ForCausalLM" in archs):
        return dsa_metadata(config, DEEPSEEK32)
    return gguf_metadata(config)


def _dialect() -> GgufDialect:
    return GGUF_DIALECT


GGUF_DIALECT = replace(DEEPSEEK2, archs=(GGUF_ARCH, DEEPSEEK32), config=_config,
                       metadata=_metadata, layer=DSA_LAYER, converted=dsa_converted(_dialect),
                       release_values=dsa_release_values(_dialect), key_types=DSA_KEY_TYPES)
"""DeepseekV3's GGUF spellings: `deepseek2` (gguf.py) and `deepseek32`, one table of names (the indexer's appear in
`deepseek32` files only) and the metadata read by the file's own `general.architecture`."""
