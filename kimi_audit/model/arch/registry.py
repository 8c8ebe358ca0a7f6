"""Which description each config `model_type` gets: every architecture module names its MODEL_TYPES, its
`describe(cfg)` and its `dialects(cfg)` (the other spellings writers give its names); adding an architecture
is one module and one entry in MODULES. A checkpoint written whole in a dialect is audited against the same
tree, respelled (model.dialect)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from kimi_audit.model.arch import deepseek_v3, deepseek_v4, glm_moe_dsa, kimi_k25, kimi_linear
from kimi_audit.model.arch.spec import Dialect, ModelTree
from kimi_audit.model.config import ModelConfig

MODULES: tuple[ModuleType, ...] = (deepseek_v3, deepseek_v4, glm_moe_dsa, kimi_k25, kimi_linear)

BY_TYPE: dict[str, ModuleType] = {model_type: module for module in MODULES for model_type in module.MODEL_TYPES}

ARCHITECTURES: dict[str, Callable[[ModelConfig], ModelTree]] = {
    model_type: module.describe for model_type, module in BY_TYPE.items()}
"""model_type -> the function describing a config of it."""

UNDESCRIBED: dict[str, dict[str, str]] = {t: deepseek_v4.UNDESCRIBED for t in deepseek_v4.MODEL_TYPES}
"""model_type -> tensor names its release stores that its description leaves out (pattern -> what they are)."""


def describe(cfg: ModelConfig) -> ModelTree:
    """The module tree of a supported config (a config that names no model_type is read as DeepSeek-V3's,
    as model.config.in_family does)."""
    return ARCHITECTURES.get(cfg.model_type, deepseek_v3.describe)(cfg)


def dialects(cfg: ModelConfig) -> tuple[Dialect, ...]:
    """The other spellings of the config's tree that writers are known to use (none for most)."""
    module = BY_TYPE.get(cfg.model_type)
    return () if module is None else module.dialects(cfg)
