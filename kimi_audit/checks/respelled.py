"""One cause, one finding: a writer that spells a whole module family otherwise (llmcompressor writes
Kimi-Linear's experts `gate/up/down_proj` where the release has `w1/w3/w2`) left one TENSOR_MISSING and one
TENSOR_UNEXPECTED per tensor (218 findings on a tiny model). Pairs that differ in one dotted segment, the same
way for two tensors or more, are one TENSORS_RESPELLED finding naming the respelling and the names it covers,
and the scale findings of those modules beside them (an FP8_BLOCK family's misnamed scales)."""

from __future__ import annotations

from kimi_audit.checks.root_causes import QUANT_COVERED
from kimi_audit.findings import Finding, error
from kimi_audit.model.accounting.tree import collapse

MIN_FAMILY = 2
"""Pairs of one respelling below this stay as they are (a single renamed tensor is its own two findings)."""


def fold_respelled(findings: list[Finding]) -> list[Finding]:
    """Missing and unexpected names that agree but for one dotted segment at one place (a `hole`), as many of
    each there: a respelling. Holes with the same segments on both sides are one family, one finding."""
    missing = [f for f in findings if f.code == "TENSOR_MISSING" and f.tensor]
    unexpected = [f for f in findings if f.code == "TENSOR_UNEXPECTED" and f.tensor]
    if not missing or not unexpected:
        return findings
    holes: dict[tuple[int, tuple[str, ...]], tuple[list[Finding], list[Finding]]] = {}
    for side, group in ((0, missing), (1, unexpected)):
        for f in group:
            segs = str(f.tensor).split(".")
            for i, seg in enumerate(segs):
                if not seg.isdigit():
                    holes.setdefault((i, (*segs[:i], "*", *segs[i + 1:])), ([], []))[side].append(f)
    families: dict[tuple[int, tuple[str, ...], tuple[str, ...]], list[Finding]] = {}
    used: set[int] = set()
    for (i, _), (gone, found) in holes.items():
        gone = [f for f in gone if id(f) not in used]
        found = [f for f in found if id(f) not in used]
        if not gone or len(gone) != len(found):
            continue
        release = tuple(sorted(str(f.tensor).split(".")[i] for f in gone))
        written = tuple(sorted(str(f.tensor).split(".")[i] for f in found))
        if set(release) & set(written):
            continue
        used.update(map(id, gone + found))
        families.setdefault((i, release, written), []).extend(gone + found)
    out: list[Finding] = []
    kept: set[int] = set()
    for (_, release, written), members in families.items():
        pairs = len(members) // 2
        if pairs < MIN_FAMILY:
            kept.update(map(id, members))
            continue
        # the respelled modules' quantization tensors (an FP8 weight's scale under the other spelling, the scale
        # the unplanned weight is asked for) are the same cause: covered, not one finding each
        modules = {str(f.tensor).rsplit(".", 1)[0] for f in members}
        scales = [f for f in findings if f.code in QUANT_COVERED and f.tensor and id(f) not in used
                  and str(f.tensor).rsplit(".", 1)[0] in modules]
        used.update(map(id, scales))
        members = members + scales
        names = collapse(str(f.tensor) for f in members if f.code == "TENSOR_UNEXPECTED")
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3:,} more patterns" if len(names) > 3 else "")
        rel, wr = ", ".join(release), ", ".join(written)
        out.append(error("TENSORS_RESPELLED", f"{pairs:,} tensors are stored as {{{wr}}} where the release names "
                         f"them {{{rel}}} ({shown}): a writer's other spelling of one module family; loaders that "
                         "read the release's names find none of them", tensor=str(members[-1].tensor),
                         expected=list(release), actual=list(written), covers=len(members)))
    if not out:
        return findings
    return [f for f in findings if id(f) not in used or id(f) in kept] + out
