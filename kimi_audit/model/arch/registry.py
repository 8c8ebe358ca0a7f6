"""Which Architecture each config answers to. Every module of model.arch registers its own record
(spec.register) when it is imported, and this module imports them all (`load_architectures`): adding an
architecture is one new module and nothing else. Lists of families, router and buffer names and value roles
are derived here from the registered records, never written out.
"""

from __future__ import annotations

import importlib
import operator
import pkgutil
from pathlib import Path
from typing import Any

from kimi_audit.model.arch.spec import BY_CLASS, REGISTERED, Architecture, Dialect, GgufDialect, ModelTree
from kimi_audit.model.config_fields import ModelConfig

__all__ = ["architecture", "architecture_of", "block_titles", "buffered", "describe", "dialects", "float32_routers",
           "load_architectures", "model_types", "stages_from_files", "undescribed", "value_roles"]

DEFAULT_TYPE = "deepseek_v3"
"""The architecture of a config that names neither a model_type nor architectures (the family's root)."""


def load_architectures() -> None:
    """Imports every module of the model.arch package, so that each registers its Architecture."""
    package = __name__.rpartition(".")[0]
    for m in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if m.name not in ("spec", "registry"):
            importlib.import_module(f"{package}.{m.name}")


load_architectures()


def model_types() -> tuple[str, ...]:
    """Every registered model_type, sorted."""
    return tuple(sorted(REGISTERED))


def architecture(model_type: str) -> Architecture | None:
    return REGISTERED.get(model_type)


def architecture_of(cfg: dict[str, Any]) -> Architecture | None:
    """The registered architecture a config.json names: by its model_type, else by its `architectures`
    class names; one that names neither is the family root's (a nested `text_config` beside a
    `vision_config`: the architecture that nests it). None: no registered architecture."""
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type in REGISTERED:
        return REGISTERED[model_type]
    archs = cfg.get("architectures")
    if isinstance(archs, list):
        for a in archs:
            if isinstance(a, str) and a in BY_CLASS:
                return BY_CLASS[a]
    if "model_type" not in cfg and "architectures" not in cfg:
        if "text_config" in cfg and "vision_config" in cfg:
            nested = [a for a in REGISTERED.values() if a.nests_text]
            if nested:
                return nested[0]
        return REGISTERED[DEFAULT_TYPE]
    return None


def _arch(cfg: ModelConfig) -> Architecture:
    return REGISTERED.get(cfg.described_as or cfg.model_type) or REGISTERED[DEFAULT_TYPE]


def describe(cfg: ModelConfig) -> ModelTree:
    """The module tree of a supported config."""
    return _arch(cfg).describe(cfg)


def dialects(cfg: ModelConfig) -> tuple[Dialect, ...]:
    """The other spellings of the config's tree that writers are known to use (none for most)."""
    arch = REGISTERED.get(cfg.described_as or cfg.model_type)
    return () if arch is None else arch.dialects(cfg)


def stages_from_files(cfg: ModelConfig) -> bool:
    """Whether the files decide the config's MTP stage count when they hold more (Architecture.stages_from_files)."""
    arch = REGISTERED.get(cfg.described_as or cfg.model_type)
    return arch is not None and arch.stages_from_files(cfg)


def undescribed(model_type: str) -> dict[str, str]:
    """Names the release of `model_type` stores that its description leaves out (pattern -> what they are)."""
    arch = REGISTERED.get(model_type)
    return {} if arch is None else dict(arch.undescribed)


_unions: dict[str, tuple[Any, ...]] = {}
_unions_of: list[tuple[Architecture, ...]] = [()]
"""The registered architectures `_unions` was derived from: a registration or removal (a plug-in, a test's
throwaway architecture) makes another tuple, and the unions are derived again at the next call."""


def _union(attr: str) -> tuple[Any, ...]:
    """Every registered architecture's `attr` entries, in registration order, each once (derived once per state
    of the registry: the layout check asks per class of tensors, the accounting per component)."""
    archs = tuple(REGISTERED.values())
    known = _unions_of[0]
    if len(archs) != len(known) or not all(map(operator.is_, archs, known)):
        _unions.clear()
        _unions_of[0] = archs
    out = _unions.get(attr)
    if out is None:
        union: dict[Any, None] = {}
        for arch in dict.fromkeys(archs):
            union.update(dict.fromkeys(getattr(arch, attr)))
        out = _unions[attr] = tuple(union)
    return out


def float32_routers() -> tuple[str, ...]:
    """Every architecture's router components transformers keeps in float32."""
    return _union("float32_routers")


def buffered() -> frozenset[str]:
    """Every architecture's parameters transformers registers as buffers."""
    return frozenset(_union("buffered"))


def block_titles() -> dict[str, str]:
    """Every architecture's own block kinds -> their words (`moe_hash_csa`: "hash-routed MoE CSA")."""
    out: dict[str, str] = {}
    for arch in dict.fromkeys(REGISTERED.values()):
        out.update(arch.block_titles)
    return out


def value_roles() -> tuple[tuple[str, str], ...]:
    """Every architecture's (suffix, value role) pairs."""
    return _union("value_roles")


def gguf_architecture(name: object) -> Architecture | None:
    """The architecture whose GGUF dialect writes `general.architecture` `name` (None: none described)."""
    for arch in dict.fromkeys(REGISTERED.values()):
        if arch.gguf is not None and not arch.gguf.text_of and name in arch.gguf.archs:
            return arch
    return None


def gguf_converts(cfg: dict[str, Any], name: object) -> GgufDialect | None:
    """The dialect a config.json's release is converted to GGUF architecture `name` by (its architecture's, a
    wrapper's converting its text model included); None where its architecture is unknown or writes another."""
    arch = architecture_of(cfg)
    dialect = None if arch is None else arch.gguf
    return dialect if dialect is not None and name in dialect.archs and dialect.converts(cfg) else None


def gguf_projector(projector_type: object) -> Architecture | None:
    """The architecture whose vision tower llama.cpp writes as an mmproj of `clip.projector_type` (None: none)."""
    for arch in dict.fromkeys(REGISTERED.values()):
        p = None if arch.gguf is None else arch.gguf.projector
        if p is not None and projector_type in p.projector_types:
            return arch
    return None


def gguf_archs() -> tuple[str, ...]:
    """Every GGUF `general.architecture` a registered dialect reads, sorted."""
    return tuple(sorted({a for arch in REGISTERED.values() if arch.gguf is not None for a in arch.gguf.archs}))
