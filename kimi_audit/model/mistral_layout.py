"""Which files an audit reads where Mistral's own layout (params.json, `consolidated*.safetensors`) is in the folder:
alone, or beside transformers' layout of the same release.

- params.json and no config.json: Mistral's layout alone. The config is params.json's (model.arch.mistral_params, the
  one adapter), the index `consolidated.safetensors.index.json`, read by format.index as model.safetensors.index.json
  is, with the same findings. A consolidated shard that index does not name is still read by llama.cpp's converter
  (it takes every consolidated*.safetensors and no index), so it is SHARD_LOADED_UNINDEXED, an error; vLLM's
  `--load-format mistral` keeps only the shards the index names.
- config.json and params.json: Mistral publishes both layouts in one repo (config.json and model-*.safetensors in
  transformers' names beside params.json and consolidated-*.safetensors). The audit is config.json's, as before;
  the consolidated shards config.json's index does not name, where that layout has shards of its own, are the other
  layout's, which no loader of this one reads (vLLM's weight_utils.filter_duplicate_safetensors_files keeps the
  shards the index names, "for models like Mistral-7B-Instruct-v0.3 [with] both sharded safetensors files and a
  consolidated safetensors file"): set aside, one MISTRAL_LAYOUT_BESIDE naming how to audit them (`--include`), and
  params.json must describe the model config.json does: PARAMS_DISAGREES names every key where they differ.
"""

from __future__ import annotations

from dataclasses import fields
from fnmatch import fnmatchcase
from typing import Any

from kimi_audit.constants import CONFIG_FILE, INDEX_FILE, MAX_CONFIG_BYTES, SAFETENSORS_SUFFIX
from kimi_audit.errors import KimiAuditError, UnsafePathError
from kimi_audit.findings import Finding, error, info
from kimi_audit.format.index import IndexFile
from kimi_audit.model.arch.mistral_params import (
    CONSOLIDATED_INDEX,
    CONSOLIDATED_SHARDS,
    CONVERTER,
    PARAMS_FILE,
    PARAMS_PATH,
    rope_findings,
)
from kimi_audit.model.config import parse_params_bytes
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.sources.base import Source

COMPARED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size",
            "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
            "first_k_dense_replace", "moe_layer_freq", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim", "tie_word_embeddings", "rms_norm_eps")
"""The ModelConfig fields both layouts' configs give (the text model's: config.json's text_config where it nests)."""
assert set(COMPARED) <= {f.name for f in fields(ModelConfig)}


def native(files: tuple[str, ...]) -> bool:
    """Mistral's layout alone: its params.json is the config."""
    return CONFIG_FILE not in files and PARAMS_FILE in files


def index_name(files: tuple[str, ...]) -> str:
    return CONSOLIDATED_INDEX if native(files) else INDEX_FILE


def loader_reads(files: tuple[str, ...], reads: str, loader: str) -> tuple[str, str]:
    """The glob of shards a loader reads whatever the index says, and that loader: the format's (`reads`,
    `loader`: Scheme.loader_reads), else in Mistral's layout llama.cpp's converter's."""
    if reads or not native(files):
        return reads, loader
    return CONSOLIDATED_SHARDS, CONVERTER


def set_aside(files: tuple[str, ...], index: IndexFile | None) -> tuple[tuple[str, ...], list[Finding]]:
    """The files the audit reads shards from, and MISTRAL_LAYOUT_BESIDE where Mistral's layout sits beside
    config.json's: its consolidated shards that config.json's index does not name are not read."""
    if CONFIG_FILE not in files or PARAMS_FILE not in files:
        return files, []
    listed = set(index.weight_map.values()) if index is not None else set()
    aside = [f for f in files if fnmatchcase(f, CONSOLIDATED_SHARDS) and f not in listed]
    own = [f for f in files if f.endswith(SAFETENSORS_SUFFIX) and f not in aside]
    if not aside or not own:  # config.json's layout has no shard of its own: the consolidated ones are its weights
        return files, []
    kept = tuple(f for f in files if f not in set(aside) and f != CONSOLIDATED_INDEX)
    return kept, [info("MISTRAL_LAYOUT_BESIDE", f"{len(aside):,} {CONSOLIDATED_SHARDS} file(s) beside {PARAMS_FILE}: "
                       f"Mistral's own layout of the release, not read with {CONFIG_FILE}'s (audit it with --include "
                       f"'{CONSOLIDATED_SHARDS}' --include {PARAMS_FILE}"
                       + (f" --include {CONSOLIDATED_INDEX})" if CONSOLIDATED_INDEX in files else ")"),
                       shard=aside[0], actual=len(aside))]


def params_beside(source: Source, files: tuple[str, ...], config: ModelConfig) -> list[Finding]:
    """params.json beside config.json, read through its adapter: PARAMS_DISAGREES where it describes another model
    (every differing key in one finding) or cannot be read (its reason)."""
    if CONFIG_FILE not in files or PARAMS_FILE not in files:
        return []
    try:
        _, params = parse_params_bytes(source.read_file(PARAMS_FILE, MAX_CONFIG_BYTES))
    except UnsafePathError:  # a link out of the folder: its SYMLINK_OUTSIDE is the finding
        return []
    except KimiAuditError as e:
        return [error("PARAMS_DISAGREES", f"{PARAMS_FILE} beside {CONFIG_FILE} cannot be read: {e}",
                      shard=PARAMS_FILE)]
    if not (params.layout_supported and config.layout_supported):
        return []
    differ = [k for k in COMPARED if getattr(params, k) != getattr(config, k)]
    if not differ:
        return []
    said = ", ".join(f"{PARAMS_PATH.get(k, k)} {getattr(params, k)!r} (its {k} {getattr(config, k)!r})"
                     for k in differ)
    return [error("PARAMS_DISAGREES", f"{PARAMS_FILE} describes another model than {CONFIG_FILE}: {said}; "
                  f"{CONVERTER} and vLLM's --config-format mistral build it from {PARAMS_FILE}",
                  shard=PARAMS_FILE)]


def findings(source: Source, files: tuple[str, ...], config_raw: dict[str, Any], config: ModelConfig) -> list[Finding]:
    """What the layouts' configs say beside the tensors: params.json's RoPE blocks where it is the config, its
    agreement with config.json where both are there."""
    return rope_findings(config_raw) + params_beside(source, files, config)
