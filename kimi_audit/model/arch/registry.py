"""Which description each config `model_type` gets: every architecture module names its MODEL_TYPES and its
`describe(cfg)`; adding an architecture is one module and one entry in MODULES."""

from __future__ import annotations

from collections.abc import Callable

from kimi_audit.model.arch import deepseek_v3
from kimi_audit.model.arch.spec import ModelTree
from kimi_audit.model.config import ModelConfig

MODULES = (deepseek_v3,)

ARCHITECTURES: dict[str, Callable[[ModelConfig], ModelTree]] = {
    model_type: module.describe for module in MODULES for model_type in module.MODEL_TYPES}
"""model_type -> the function describing a config of it."""


def describe(cfg: ModelConfig) -> ModelTree:
    """The module tree of a supported config (a config that names no model_type is read as DeepSeek-V3's,
    as model.config.in_family does)."""
    return ARCHITECTURES.get(cfg.model_type, deepseek_v3.describe)(cfg)
