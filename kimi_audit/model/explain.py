"""Explain cards: one node of the accounting tree, as the design cards (shared/seeds) present it.

A card says what the component computes (formula), its input and output shapes with named axes,
the exact per-instance parameter accounting, the count across blocks, how it is stored (its quantization
scheme, the tensors storing one instance with their dtypes and shapes, stored elements by dtype), the
checkpoint tensors that hold it (names with indices collapsed, dtypes, shapes, shards), its quantization
metadata (listed, never counted) and the config keys it came from. The catalogue of what each role
computes is explain_docs.py.
Pure: everything comes from an Accounting (kimi_audit.model.accounting) and the config.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from kimi_audit.errors import KimiAuditError
from kimi_audit.model.accounting import (
    UNACCOUNTED,
    Accounting,
    FoundTensor,
    Node,
    StoredPart,
    collapse,
    tensor_slot,
)
from kimi_audit.model.config import ModelConfig
from kimi_audit.model.explain_docs import DOCS, RMSNORM_MATH, Doc
from kimi_audit.model.kinds import METADATA_SUFFIXES, PACKED, SCALE

WEIGHT_SUFFIXES = (".weight", ".weight_packed")

__all__ = ["DOCS", "Card", "Doc", "TensorGroup", "build_card", "card_dict", "card_text", "find_nodes",
           "tensor_groups"]


@dataclass(frozen=True)
class TensorGroup:
    names: str
    dtype: str
    shape: tuple[int, ...]
    count: int
    shards: str


@dataclass(frozen=True)
class Card:
    key: str
    name: str
    title: str
    breadcrumb: tuple[str, ...]
    computes: str | None
    description: str
    math: tuple[str, ...]
    eps: float | None
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    formula: str
    rows: tuple[tuple[str, str, int], ...]
    """Exact per-instance accounting: (component, calculation, parameters)."""
    per_instance: int
    instances: str
    instance_count: int
    derived: int
    found: int
    derived_tensors: int
    found_tensors: int
    mismatch: bool
    tensors: tuple[TensorGroup, ...]
    scales: tuple[TensorGroup, ...]
    config: tuple[tuple[str, Any], ...]
    code: str | None
    note: str
    model: str
    quantization: tuple[str, ...] = ()
    """How its Linear modules are stored (model.quant's scheme descriptions)."""
    stored: tuple[StoredPart, ...] = ()
    """Leaves: every tensor storing one instance, metadata included."""
    stored_by_dtype: tuple[tuple[str, int, int], ...] = ()
    """Stored elements across all instances by dtype: (dtype, derived, found), metadata included."""

    @property
    def verdict(self) -> str:
        if not self.mismatch:
            return ("Derived from the config; the model total matches the checkpoint's tensors "
                    f"({_n(self.found_tensors, 'tensor')}, {_n(self.found, 'parameter')}).")
        return (f"MISMATCH: the config implies {_n(self.derived_tensors, 'tensor')} and "
                f"{_n(self.derived, 'parameter')}; the checkpoint holds {_n(self.found_tensors, 'tensor')} and "
                f"{_n(self.found, 'parameter')}.")


def tensor_groups(tensors: tuple[FoundTensor, ...] | list[FoundTensor]) -> tuple[TensorGroup, ...]:
    by: dict[tuple[str, tuple[int, ...]], list[FoundTensor]] = {}
    for t in tensors:
        by.setdefault((t.dtype, t.shape), []).append(t)
    out = []
    for (dtype, shape), ts in by.items():
        names = ", ".join(collapse(sorted(t.name for t in ts)))
        shards = ", ".join(collapse(sorted({t.shard for t in ts}, key=_natural)))
        out.append(TensorGroup(names, dtype, shape, len(ts), shards))
    return tuple(out)


def _natural(s: str) -> list[Any]:
    import re

    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def find_nodes(acc: Accounting, cfg: ModelConfig, query: str) -> list[Node]:
    """Nodes named by `query`: a key (`blocks.moe.router.gate`), a key suffix on a dot boundary
    (`q_a_layernorm`, `experts.gate_proj`), a title (`Query latent RMSNorm`), or a tensor name
    (`model.layers.5.self_attn.q_a_layernorm.weight`). Raises KimiAuditError (with suggestions) if none."""
    q = query.strip()
    nodes = acc.nodes()
    exact = [n for n in nodes if n.key == q]
    if exact:
        return exact
    low = q.lower()
    hits = [n for n in nodes if n.key.endswith("." + q) or n.name == q]
    if not hits:
        hits = [n for n in nodes if n.title.lower() == low]
    if not hits and "." in q:
        # A tensor name: the leaf that holds it, or (when it is absent) the leaf whose part it would be.
        hits = [n for n in nodes if n.is_leaf and any(t.name == q for t in n.tensors + n.scales)]
        if not hits:
            block, comp, _ = tensor_slot(cfg, q)
            # a weight's own tensor or its quantization metadata: the Linear module it stores
            module = comp.rpartition(".")[0] if comp.endswith(METADATA_SUFFIXES + WEIGHT_SUFFIXES) else None
            prefix = {None: "", "dense": "blocks.dense.", "moe": "blocks.moe.", "mtp": "mtp."}.get(block, "?")
            hits = [n for n in nodes if n.is_leaf and n.key.startswith(prefix)
                    and any(p.component == comp or (p.scheme and p.component.rpartition(".")[0] == module)
                            for p in n.parts) and (block is not None or "." not in n.key)]
    if not hits:
        names = sorted({n.name for n in nodes} | {n.key for n in nodes})
        close = difflib.get_close_matches(q, names, n=4, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `kimi-audit params SOURCE` lists every node"
        raise KimiAuditError(f"no component {query!r} in the accounting tree{hint}")
    # MoE blocks first (the seed cards' order), then dense, MTP, the rest.
    rank = {"blocks.moe": 0, "blocks.dense": 1, "mtp": 2}
    return sorted(hits, key=lambda n: min([v for k, v in rank.items() if n.key.startswith(k)] or [3]))


def _per_instance_calc(child: Node, div: int) -> str:
    if not child.mult:
        return child.formula
    per = " + ".join(p.calculation() for p in child.parts) if child.is_leaf else f"{child.per_instance:,}"
    times = child.instances // div
    return per + (f" × {times:,} {child.mult[0][1]}" if times > 1 else "")


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def build_card(acc: Accounting, cfg: ModelConfig, config_raw: dict[str, Any], node: Node) -> Card:
    path = acc.path_to(node.key)
    crumbs = tuple(n.title for n in path[1:-1])
    doc = DOCS.get(node.role)
    stored: tuple[StoredPart, ...] = ()
    if node.is_leaf:
        rows = tuple((p.label, p.calculation(), p.numel) for p in node.parts)
        tensors = tensor_groups(node.tensors)
        scales = tensor_groups(node.scales)
        stored = node.stored_parts
    else:
        div = node.instances or 1
        rows = tuple((c.title, _per_instance_calc(c, div), c.derived // div) for c in node.children)
        tensors = scales = ()
    if doc is not None:
        ins, outs = doc.shapes(cfg)
    else:
        ins = outs = []
    config = tuple((k, config_raw.get(k)) for k in node.config_keys)
    is_norm = doc is not None and doc.math == RMSNORM_MATH
    description = doc.description if doc else (
        "Tensors in the checkpoint that the config does not account for." if node.key == UNACCOUNTED
        else f"{len(node.children)} components: " + ", ".join(c.title for c in node.children) + ".")
    return Card(
        key=node.key, name=node.name, title=node.title, breadcrumb=crumbs,
        computes=doc.computes if doc else None, description=description,
        math=doc.math if doc else (), eps=cfg.rms_norm_eps if is_norm else None,
        inputs=tuple(ins), outputs=tuple(outs), formula=node.formula, rows=rows,
        per_instance=node.per_instance if node.mult else node.derived,
        instances=node.instance_text(), instance_count=node.instances if node.mult else 1,
        derived=node.derived, found=node.found, derived_tensors=node.derived_tensors,
        found_tensors=node.found_tensors, mismatch=node.mismatch, tensors=tensors, scales=scales,
        config=config, code=doc.code if doc else None,
        note=" ".join(x for x in (doc.note if doc else "", node.note) if x),
        model=str(config_raw.get("model_type", cfg.model_type)),
        quantization=tuple(dict.fromkeys(s for _, n in node.walk() for s in n.schemes)), stored=stored,
        stored_by_dtype=tuple((r.dtype, r.derived, r.found) for r in node.stored),
    )


def card_dict(card: Card) -> dict[str, Any]:
    return {
        "key": card.key, "name": card.name, "title": card.title, "breadcrumb": list(card.breadcrumb),
        "computes": card.computes, "description": card.description, "math": list(card.math), "eps": card.eps,
        "in": [{"symbol": s, "shape": sh} for s, sh in card.inputs],
        "out": [{"symbol": s, "shape": sh} for s, sh in card.outputs],
        "formula": card.formula,
        "per_instance": [{"component": c, "calculation": calc, "parameters": p} for c, calc, p in card.rows],
        "per_instance_total": card.per_instance, "instances": card.instances, "instance_count": card.instance_count,
        "derived": card.derived, "found": card.found, "derived_tensors": card.derived_tensors,
        "found_tensors": card.found_tensors, "mismatch": card.mismatch, "verdict": card.verdict,
        "tensors": [{"names": g.names, "dtype": g.dtype, "shape": list(g.shape), "count": g.count,
                     "shards": g.shards} for g in card.tensors],
        "scales_excluded": [{"names": g.names, "dtype": g.dtype, "shape": list(g.shape), "count": g.count,
                             "shards": g.shards} for g in card.scales],
        "quantization": list(card.quantization),
        "stored_per_instance": [{"tensor": s.component, "dtype": s.dtype, "shape": list(s.shape), "kind": s.kind,
                                 "counts_for": s.logical} for s in card.stored],
        "stored_by_dtype": [{"dtype": d, "derived": a, "found": b} for d, a, b in card.stored_by_dtype],
        "config_keys": {k: v for k, v in card.config}, "code": card.code, "note": card.note,
    }


def card_text(card: Card) -> str:
    """The card as plain text (the seeds' order of sections)."""
    lines = [f"{_model_title(card.model)} · {card.title}", ""]
    if card.breadcrumb:
        lines += [" › ".join(card.breadcrumb), ""]
    lines += [f"{card.title}  ({card.key})"]
    if card.computes:
        lines += [f"computes: {card.computes}"]
    lines += ["", card.description]
    if card.math:
        lines += [""] + [f"  {m}" for m in card.math]
        if card.eps is not None:
            lines += [f"  ε = {card.eps:g}"]
    if card.inputs or card.outputs:
        lines += [""]
        lines += [f"in:  {s} {sh}" for s, sh in card.inputs]
        lines += [f"out: {s} {sh}" for s, sh in card.outputs]
    lines += [f"parameters: {card.formula}", ""]
    if card.note:
        lines += [card.note, ""]
    lines += ["Exact per-instance accounting"]
    w = max([len(r[0]) for r in card.rows] + [len("Per-instance total")])
    for comp, calc, p in card.rows:
        lines += [f"  {comp:<{w}}  {calc}  =  {p:,}"]
    lines += [f"  {'Per-instance total':<{w}}  {card.per_instance:,}"]
    if card.instances:
        lines += ["", f"Across {card.instances}: {card.per_instance:,} × {card.instance_count:,} = {card.derived:,} "
                      "parameters."]
    lines += ["", card.verdict]
    lines += _stored_lines(card)
    if card.tensors:
        lines += ["", "Tensors"]
        for g in card.tensors:
            lines += [f"  {g.names}  {g.dtype} {list(g.shape)}  ×{g.count:,}  in {g.shards}"]
    if card.scales:
        lines += ["", "Quantization metadata (listed, excluded from the counts)"]
        for g in card.scales:
            lines += [f"  {g.names}  {g.dtype} {list(g.shape)}  ×{g.count:,}  in {g.shards}"]
    if card.config:
        lines += ["", "Config keys: " + ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                                   for k, v in card.config)]
    if card.code:
        lines += [f"Code: {card.code}"]
    return "\n".join(lines) + "\n"


def _stored_lines(card: Card) -> list[str]:
    """How the component is stored: its scheme(s), one instance's tensors, the elements by dtype."""
    lines: list[str] = []
    if card.quantization:
        lines += ["", "Stored as: " + "; ".join(card.quantization)]
    if card.stored:
        lines += ["", "Tensors per instance"] if not card.quantization else []
        w = max(len(s.component) for s in card.stored)
        shapes = [f"{s.dtype} [" + ", ".join(f"{d:,}" for d in s.shape) + "]" for s in card.stored]
        ws = max(map(len, shapes))
        for s, shape in zip(card.stored, shapes):
            if s.kind == SCALE:
                what = "quantization metadata, not counted"
            elif s.kind == PACKED:
                what = f"packed words, count for {s.logical:,} parameters"
            else:
                what = f"{s.logical:,} parameters"
            lines += [f"  {s.component:<{w}}  {shape:<{ws}}  {what}"]
    if card.stored_by_dtype and (card.quantization or len(card.stored_by_dtype) > 1):
        parts = [f"{d} {a:,}" + ("" if a == b else f" (found {b:,})") for d, a, b in card.stored_by_dtype]
        lines += ["Stored elements" + (f" across {card.instances}" if card.instances else "") + ": "
                  + " · ".join(parts)]
    return lines


def _model_title(model_type: str) -> str:
    return {"kimi_k2": "Kimi K2", "deepseek_v3": "DeepSeek-V3", "deepseek_v32": "DeepSeek-V3.2"}.get(
        model_type, model_type)
