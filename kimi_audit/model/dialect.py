"""Which spelling of the architecture's names a checkpoint uses: the release's (canonical), or one dialect
(model.arch.spec.Dialect) throughout. A checkpoint wholly in a dialect is audited against the same tree
with its names respelled, and the dialect named once (LAYOUT_DIALECT, info); one that mixes both spellings
is audited against the canonical names, so the respelled tensors are findings (missing and unexpected)."""

from __future__ import annotations

from collections.abc import Iterable

from kimi_audit.findings import Finding, info
from kimi_audit.model.arch.registry import dialects
from kimi_audit.model.arch.spec import Dialect
from kimi_audit.model.config import ModelConfig
from kimi_audit.model.layout import ExpectedLayout


def respelled(layout: ExpectedLayout, dialect: Dialect) -> ExpectedLayout:
    """The same layout with every name in the dialect's spelling (dtypes, shapes and order unchanged)."""
    return ExpectedLayout(list(map(dialect.rename, layout.names)), layout.spec_of, layout.specs, layout.layer_of,
                          layout.meta_at, layout.meta_owner)


def resolve_dialect(cfg: ModelConfig, layout: ExpectedLayout,
                    stored: Iterable[str]) -> tuple[ExpectedLayout, list[Finding]]:
    """The layout in the spelling the stored names use, and the finding that names a dialect."""
    known = dialects(cfg)
    if not known:
        return layout, []
    names = set(stored)
    for dialect in known:
        moved = [(n, r) for n, r in zip(layout.names, map(dialect.rename, layout.names)) if n != r]
        canonical = sum(1 for n, _ in moved if n in names)
        spelled = sum(1 for _, r in moved if r in names)
        if spelled and not canonical:
            renames = "; ".join(f"{c}* as {d}*" for c, d in dialect.renames)
            return respelled(layout, dialect), [info(
                "LAYOUT_DIALECT", f"the checkpoint names its tensors in the {dialect.name} dialect ({renames}): "
                f"audited against the same layout so spelled. The release's names are canonical; vLLM and "
                f"SGLang load those ({dialect.note})", tensor=moved[0][1], expected=moved[0][0],
                actual=moved[0][1])]
    return layout, []
