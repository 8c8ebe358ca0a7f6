"""What a tensor is, from its name: the one suffix classifier every stage uses, derived from the registries.

`role_of(name)` says what a tensor is by the suffix its name ends with (a block scale, packed words, a norm
gain, a router bias, a buffer ...); `kind_of(name)` says what it counts for (PARAMETER, PACKED, SCALE or
BUFFER) when the layout does not know the name. The suffixes are the registered format classes' `roles`
(model.quant) and the registered architectures' `value_roles` (model.arch); the longest suffix that matches
wins, so no order is written anywhere. A format or architecture registered later (a plug-in, a test) is
read at the next call.
"""

from __future__ import annotations

from kimi_audit.constants import WIDE_FLOATS
from kimi_audit.model.arch.registry import float32_routers, model_types, value_roles
from kimi_audit.model.kinds import (
    GAIN,
    GAIN_SUFFIX,
    KIND_OF_ROLE,
    OTHER,
    PACKED,
    PARAMETER,
    SCALE,
    WEIGHT,
    WEIGHT_SUFFIX,
)
from kimi_audit.model.quant.dispatch import formats

__all__ = ["float32_router", "kind_of", "metadata_suffixes", "role_of", "suffix_roles", "varies_by_writer",
           "weight_suffixes"]

_cache: dict[tuple[int, int], tuple[tuple[str, str], ...]] = {}


def suffix_roles() -> tuple[tuple[str, str], ...]:
    """(suffix, role) of every registered format and architecture, and the gain and weight every model has,
    longest suffix first; a suffix two owners give different roles is refused (ValueError)."""
    classes = formats()
    key = (len(classes), len(model_types()))
    table = _cache.get(key)
    if table is None:
        pairs: dict[str, str] = {GAIN_SUFFIX: GAIN, WEIGHT_SUFFIX: WEIGHT}
        for suffix, role in [*(p for cls in classes for p in cls.roles), *value_roles()]:
            if pairs.setdefault(suffix, role) != role:
                raise ValueError(f"tensor suffix {suffix!r} is given two roles: {pairs[suffix]} and {role}")
        table = tuple(sorted(pairs.items(), key=lambda p: -len(p[0])))
        _cache.clear()
        _cache[key] = table
    return table


def role_of(name: str) -> str:
    """What the tensor is, from its name's suffix (OTHER when no suffix says)."""
    for suffix, role in suffix_roles():
        if name.endswith(suffix):
            return role
    return OTHER


def kind_of(name: str) -> str:
    """What a tensor the layout does not know counts for, from its name alone."""
    return KIND_OF_ROLE.get(role_of(name), PARAMETER)


def metadata_suffixes() -> tuple[str, ...]:
    """Every quantization-metadata suffix (a scale, a shape, a zero point ...)."""
    return tuple(s for s, r in suffix_roles() if KIND_OF_ROLE.get(r) == SCALE)


def weight_suffixes() -> tuple[str, ...]:
    """The suffixes a Linear module's stored weight may have: `.weight`, and every format's packed words."""
    return (WEIGHT_SUFFIX, *(s for s, r in suffix_roles() if KIND_OF_ROLE.get(r) == PACKED))


def float32_router(component: str) -> bool:
    """A router part transformers keeps in float32 whatever the model's dtype (a layer's component)."""
    return component in float32_routers()


def varies_by_writer(component: str, dtype: str, ndim: int, quantized: bool) -> bool:
    """A part whose float dtype writers vary (WRITER_DTYPE and ROUTER_DTYPE are info for it): a norm's gain or
    a bias (1-D), or a router kept in float32; not a Linear weight or an embedding table. The one policy the
    layout check and the accounting read."""
    return not quantized and dtype in WIDE_FLOATS and (ndim == 1 or float32_router(component))
