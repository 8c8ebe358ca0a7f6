"""Explain cards (kimi_audit.model.explain.Card) as the CLI shows them: plain text in the seeds' order of
sections, and the JSON form."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from kimi_audit.model.arch.registry import architecture
from kimi_audit.model.explain import Card
from kimi_audit.model.kinds import PACKED, SCALE


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


def card_rich(card: Card) -> Text:
    """The plain-text card with its first line in bold (for a rich console)."""
    plain = card_text(card)
    text = Text(plain)
    text.stylize("bold", 0, len(plain.split("\n", 1)[0]))
    return text


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
    arch = architecture(model_type)
    return model_type if arch is None else arch.title(model_type)
