"""config.json -> ModelConfig: the registered architecture the config names (model.arch.registry) reads it
with model.config_fields' readers; a config of no registered architecture gets a placeholder with no layout
(LAYOUT_UNSUPPORTED)."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch.mistral_params import blamed, parse_params
from kimi_audit.model.arch.registry import architecture_of
from kimi_audit.model.config_fields import ModelConfig, unsupported_config

__all__ = ["in_family", "model_config_from_dict", "parse_config_bytes", "parse_params_bytes", "pinned_config_bytes"]


def in_family(cfg: dict[str, Any]) -> bool:
    """A config of a registered architecture (by model_type or architectures), whose layout this tool derives.
    One that names neither is read as the family root's (and must then hold its keys)."""
    return architecture_of(cfg) is not None


def model_config_from_dict(cfg: Any) -> ModelConfig:
    if not isinstance(cfg, dict):
        raise ConfigError("config.json is not a JSON object")
    arch = architecture_of(cfg)
    if arch is None:
        return unsupported_config(cfg)
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):  # a family member by its architectures
        raise ConfigError(f"config.json model_type must be a string, got {type(model_type).__name__}")
    parsed = arch.read(cfg)
    text, q = cfg.get("text_config"), cfg.get("quantization_config")
    if not (isinstance(q, dict) and q.get("quant_method") == "gguf"):  # a GGUF's: its dialect's asserts name the key
        _routing(parsed, text if isinstance(text, dict) else cfg)
    q = parsed.quant
    if q is not None and q.tree and q.tree not in arch.writer_trees:
        parsed = replace(parsed, quant=None, quant_unsupported=f"{q.quantized.key} ({arch.name} as {q.tree} "
                         "writes it: that module tree is not described)")
    if parsed.model_type in arch.model_types:
        return parsed
    return replace(parsed, described_as=arch.model_types[0])  # named by its class: the tree is that one's


def _routing(parsed: ModelConfig, raw: dict[str, Any]) -> None:
    """A router no model runs, though it sizes no tensor: more experts per token than routed experts, more groups
    chosen than there are, groups that do not divide the experts (DeepseekV3's group-limited top-k; llama.cpp's
    loader asserts the same of a GGUF: GGUF_KEY_VALUE). ConfigError naming the key."""
    experts, used = parsed.n_routed_experts, parsed.num_experts_per_tok
    if experts and used and used > experts:
        raise ConfigError(f"config.json num_experts_per_tok is {used}, more than the {experts} routed experts: no "
                          "router picks more experts than it has")
    groups, chosen = raw.get("n_group"), raw.get("topk_group")
    if not (isinstance(groups, int) and isinstance(chosen, int)) or isinstance(groups, bool) or groups <= 1:
        return
    if chosen > groups:
        raise ConfigError(f"config.json topk_group is {chosen}, more than the {groups} expert groups (n_group)")
    if experts and experts % groups:
        raise ConfigError(f"config.json n_group is {groups}, which does not divide the {experts} routed experts")


def parse_config_bytes(raw: bytes) -> tuple[dict[str, Any], ModelConfig]:
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"config.json is not valid JSON: {e}") from None
    if b"\\u" in raw:  # a lone surrogate escape decodes to a str no report can be written with
        try:
            json.dumps(cfg, ensure_ascii=False).encode("utf-8")
        except (UnicodeEncodeError, RecursionError, ValueError):
            raise ConfigError("config.json is not valid JSON: it holds a lone UTF-16 surrogate escape") from None
    return cfg, model_config_from_dict(cfg)


def parse_params_bytes(raw: bytes) -> tuple[dict[str, Any], ModelConfig]:
    """Mistral's params.json (a folder of consolidated shards with no config.json): the config dict its one
    adapter makes of it (model.arch.mistral_params), read as any config.json is."""
    cfg = parse_params(raw)
    try:
        return cfg, model_config_from_dict(cfg)
    except ConfigError as e:  # the field readers name config.json and its keys: name params.json and its own
        raise ConfigError(blamed(str(e))) from None


def pinned_config_bytes() -> bytes:
    """config.json of moonshotai/Kimi-K2-Instruct at the pinned revision, shipped as package data."""
    return resources.files("kimi_audit").joinpath("data/kimi-k2-instruct.config.json").read_bytes()
