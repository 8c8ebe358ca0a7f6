"""Which description each config `model_type` gets: every architecture module names its MODEL_TYPES and its
`describe(cfg)`; adding an architecture is one module and one entry in MODULES.

An architecture may know more than one spelling of its tensor names (its DIALECTS: dialect -> a pattern only
that dialect's names match, and DIALECT_NOTES saying whose spelling it is): the release's own is canonical,
and a checkpoint written whole in another is audited against the same tree, named in that dialect."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from types import ModuleType

from kimi_audit.model.arch import deepseek_v3, deepseek_v4, kimi_linear
from kimi_audit.model.arch.spec import ModelTree
from kimi_audit.model.config import ModelConfig

MODULES: tuple[ModuleType, ...] = (deepseek_v3, deepseek_v4, kimi_linear)

ARCHITECTURES: dict[str, Callable[[ModelConfig], ModelTree]] = {
    model_type: module.describe for module in MODULES for model_type in module.MODEL_TYPES}
"""model_type -> the function describing a config of it."""

SPELLED: tuple[ModuleType, ...] = (deepseek_v4, kimi_linear)
"""The modules that know dialects of their names."""
DIALECTS: dict[str, dict[str, str]] = {t: m.DIALECTS for m in SPELLED for t in m.MODEL_TYPES}
DIALECT_NOTES: dict[str, dict[str, str]] = {t: m.DIALECT_NOTES for m in SPELLED for t in m.MODEL_TYPES}
UNDESCRIBED: dict[str, dict[str, str]] = {t: deepseek_v4.UNDESCRIBED for t in deepseek_v4.MODEL_TYPES}
"""model_type -> tensor names its release stores that its description leaves out (pattern -> what they are)."""


def describe(cfg: ModelConfig) -> ModelTree:
    """The module tree of a supported config (a config that names no model_type is read as DeepSeek-V3's,
    as model.config.in_family does)."""
    return ARCHITECTURES.get(cfg.model_type, deepseek_v3.describe)(cfg)


def dialects(cfg: ModelConfig) -> dict[str, str]:
    """Dialect -> whose spelling it is, for the config's architecture (none for most)."""
    return DIALECT_NOTES.get(cfg.model_type, {})


def with_dialect(cfg: ModelConfig, names: Iterable[str]) -> ModelConfig:
    """`cfg` naming its tensors in the dialect `names` are written in: the first of the architecture's dialects
    whose pattern some name matches, else the release's own."""
    patterns = DIALECTS.get(cfg.model_type, {})
    if not patterns or not cfg.layout_supported:
        return cfg
    compiled = {d: re.compile(p) for d, p in patterns.items()}
    for name in names:
        for dialect, pattern in compiled.items():
            if pattern.match(name):
                return cfg if cfg.dialect == dialect else replace(cfg, dialect=dialect)
    return cfg if not cfg.dialect else replace(cfg, dialect="")
