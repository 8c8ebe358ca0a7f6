"""The parameter accounting as the CLI shows it: the rich tree and tables of `params`, and its JSON form
(schema kimi-audit/params/1). Pure: everything comes from an Accounting (kimi_audit.model.accounting)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from kimi_audit.model.accounting.summary import DtypeRow
from kimi_audit.model.accounting.tree import Accounting, Node, collapse
from kimi_audit.model.kinds import PARAMETER


def _status(n: Node) -> Text:
    if n.absent:
        return Text("⚠ absent", style="yellow")
    if n.own_mismatch:
        return Text("✗ mismatch", style="bold red")
    if n.mismatch:
        return Text("✗ below", style="red")
    return Text("✓", style="green")


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def dtypes_of(n: Node) -> list[str]:
    """A leaf's dtypes as its layout names them, or, where the format leaves the dtype to the writer (a GGUF
    weight's ggml type), as each was stored (its by_dtype rows, derived as found)."""
    named = list(dict.fromkeys(p.logical_dtype for p in n.parts))
    stored = [r.dtype for r in n.by_dtype if r.dtype not in named or r.derived]
    return stored if stored and not set(stored) & set(named) else named


def node_label(n: Node) -> Text:
    label = Text(n.title, style="bold" if not n.is_leaf else "")
    if n.is_leaf and n.name != n.title:
        label += Text(f" ({n.name})", style="dim")
    label += Text("  ") + _status(n) + Text(f"  {n.derived:,}")
    if n.is_leaf and n.parts:
        label += Text("  " + "/".join(dtypes_of(n)), style="dim")
    label += Text("\n" + n.formula, style="dim")
    if n.is_leaf and any(s.kind != PARAMETER for s in n.stored_parts):
        # a quantized Linear module: how one instance is stored, its metadata apart
        tensors = " + ".join(f"{s.component.rpartition('.')[2]} {s.dtype} [{', '.join(f'{d:,}' for d in s.shape)}]"
                             for s in n.stored_parts)
        label += Text(f"\nstored ({n.parts[0].logical_dtype}): {tensors}; metadata not counted", style="dim cyan")
    if n.note:
        label += Text("\n" + n.note, style="dim italic")
    if n.own_mismatch:
        label += Text(f"\nfound {n.found:,} in {_plural(n.found_tensors, 'tensor')} "
                      f"(derived: {_plural(n.derived_tensors, 'tensor')})"
                      + ("" if n.dtype_ok else "; dtype differs from the config's"), style="bold red")
    return label


def render_params(acc: Accounting, console: Console, depth: int | None = None) -> None:
    title = f"Parameter accounting · {acc.source}" + (f" @ {acc.revision[:12]}" if acc.revision else "")
    tree = Tree(node_label(acc.root), guide_style="dim")

    def add(parent: Tree, n: Node, d: int) -> None:
        if depth is not None and d > depth:
            return
        branch = parent.add(node_label(n))
        for c in n.children:
            add(branch, c, d + 1)

    for c in acc.root.children:
        add(tree, c, 1)
    console.print(Text(title, style="bold"))
    console.print(tree)
    if acc.incomplete is not None:
        console.print(Text(f"incomplete: {acc.incomplete}", style="bold red"))

    console.print(_dtype_table("Parameters by dtype (metadata excluded)", acc.dtypes))
    console.print(_dtype_table("Stored elements by dtype (all tensors)", acc.stored))

    ex = Table(title="Listed apart, not parameters: quantization metadata and stored buffers", title_justify="left")
    ex.add_column("class")
    ex.add_column("tensors", overflow="fold", ratio=1)
    ex.add_column("count", justify="right", no_wrap=True)
    ex.add_column("elements", justify="right", no_wrap=True)
    for x in acc.excluded:
        ok = x.derived_tensors == x.found_tensors
        count = f"{x.found_tensors:,}" if ok else f"{x.found_tensors:,} (derived {x.derived_tensors:,})"
        # a buffer is optional (loaders recompute it): stored or not, never a mismatch
        style = "" if ok else "dim" if x.kind == "buffer" else "bold red"
        ex.add_row(Text(f"{_KIND.get(x.kind, x.kind)} {x.dtype}"), Text(x.pattern),
                   Text(count + (" optional" if x.kind == "buffer" and not ok else ""), style=style),
                   f"{x.found_elements:,}")
    for kind in ("scale", "buffer"):
        rows = [r for r in acc.excluded if r.kind == kind]
        if rows:
            ex.add_row(Text(f"all {_KIND.get(kind, kind)}", style="bold"), "",
                       f"{sum(r.found_tensors for r in rows):,}", f"{sum(r.found_elements for r in rows):,}")
    console.print(ex)

    a = acc.activation
    console.print(
        f"activated per token: [bold]{a.per_token:,}[/bold] = {a.always_active:,} outside the routed experts "
        f"(embedding and lm_head in full) + {a.top_k} of {a.experts} routed experts × {a.per_expert:,} × "
        f"{a.moe_blocks} MoE blocks ({a.routed_active:,})" + (f"; MTP layers ({a.mtp_excluded:,}) not counted"
                                                             if a.mtp_excluded else ""), highlight=False)
    console.print(f"  without the embedding table: {a.without_embedding:,}", highlight=False)
    if acc.mtp is not None:
        m = acc.mtp
        console.print(
            f"with MTP: total {m.total:,} = main model {m.main:,} + {_plural(len(m.layers), 'MTP layer')} "
            f"{m.parameters:,}; the MTP embed_tokens and shared_head.head ({m.duplicates:,}) copy the main "
            f"embedding and lm_head: counted once, {m.counted_once:,}", highlight=False)
    if acc.comparisons:
        ct = Table(title="Against the published figures (reference constants)", title_justify="left")
        for col in ("source", "total", "computed / published", "activated", "computed / published"):
            ct.add_column(col, justify="left" if col == "source" else "right")
        for cmp in acc.comparisons:
            ct.add_row(cmp.source, f"{cmp.published_total / 1e12:g}T", _ratio(cmp.total_ratio, cmp.total_consistent),
                       f"{cmp.published_activated / 1e9:g}B", _ratio(cmp.activated_ratio, cmp.activated_consistent))
        console.print(ct)
    for n in acc.root.children:
        if n.absent:
            console.print(Text(f"warning MTP_ABSENT: {n.title}: declared by config.json, not one of its "
                               f"{n.derived_tensors:,} tensors stored ({n.derived:,} parameters left out of the "
                               "total); transformers drops that layer on load and never saves it", style="yellow"))
    verdict = Text("MISMATCH", style="bold red") if acc.mismatch else Text("MATCH", style="bold green")
    console.print(Text.assemble(verdict, f"  total derived {acc.derived:,} · found {acc.found:,}"))


_KIND = {"scale": "metadata", "buffer": "buffers"}


def _dtype_table(title: str, rows: tuple[DtypeRow, ...]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("dtype", "derived", "found", ""):
        t.add_column(col, justify="left" if col == "dtype" else "right")
    for r in rows:
        t.add_row(r.dtype, f"{r.derived:,}", f"{r.found:,}",
                  Text("✓", style="green") if r.derived == r.found else Text("✗", style="bold red"))
    return t


def _ratio(r: float, consistent: bool) -> Text:
    return Text(f"{r:.4f}" + (" (rounds to it)" if consistent else ""), style="green" if consistent else "yellow")


def _rows(rows: tuple[DtypeRow, ...]) -> list[dict[str, object]]:
    return [{"dtype": r.dtype, "derived": r.derived, "found": r.found} for r in rows]


def accounting_dict(acc: Accounting, depth: int | None = None) -> dict[str, object]:
    """JSON-ready form (schema kimi-audit/params/1). Leaves list their tensors collapsed, not one by one."""

    def node(n: Node, d: int) -> dict[str, object]:
        out: dict[str, object] = {
            "key": n.key, "name": n.name, "title": n.title, "formula": n.formula,
            "derived": n.derived, "found": n.found, "derived_tensors": n.derived_tensors,
            "found_tensors": n.found_tensors, "per_instance": n.per_instance,
            "instances": [{"count": v, "of": label} for v, label in n.mult],
            "mismatch": n.mismatch, "absent": n.absent, "config_keys": list(n.config_keys),
            "by_dtype": _rows(n.by_dtype), "stored_by_dtype": _rows(n.stored),
        }
        if n.note:
            out["note"] = n.note
        if n.is_leaf:
            out["parts"] = [{"label": p.label, "tensor": p.component, "calculation": p.calculation(),
                             "parameters": p.numel, "dtype": p.logical_dtype, "stored_dtype": p.dtype,
                             "stored_shape": list(p.stored_shape)} for p in n.parts]
            out["tensors"] = collapse(t.name for t in n.tensors)
            out["dtype_ok"] = n.dtype_ok
            if n.schemes:
                out["quantization"] = list(n.schemes)
                out["stored_tensors"] = [{"tensor": s.component, "dtype": s.dtype, "shape": list(s.shape),
                                          "kind": s.kind, "counts_for": s.logical} for s in n.stored_parts]
                out["metadata"] = collapse(sorted(t.name for t in n.scales))
        elif depth is None or d < depth:
            out["children"] = [node(c, d + 1) for c in n.children]
        return out

    a = acc.activation
    return {
        "schema": "kimi-audit/params/1",
        "source": acc.source,
        "revision": acc.revision,
        "total": {"derived": acc.derived, "found": acc.found, "mismatch": acc.mismatch,
                  "complete": acc.incomplete is None, "incomplete": acc.incomplete},
        "tree": node(acc.root, 0),
        "by_dtype": _rows(acc.dtypes),
        "stored_by_dtype": _rows(acc.stored),
        "mtp": None if acc.mtp is None else {
            "layers": list(acc.mtp.layers), "parameters": acc.mtp.parameters, "total_with_mtp": acc.mtp.total,
            "main_only": acc.mtp.main, "duplicates": acc.mtp.duplicates, "counted_once": acc.mtp.counted_once,
            "definition": "the MTP layers' embed_tokens and shared_head.head copy model.embed_tokens and "
                          "lm_head; counted_once is the total without those copies",
        },
        "excluded": [{"kind": r.kind, "tensors": r.pattern, "dtype": r.dtype, "derived_tensors": r.derived_tensors,
                      "found_tensors": r.found_tensors, "derived_elements": r.derived_elements,
                      "found_elements": r.found_elements} for r in acc.excluded],
        "activated": {
            "per_token": a.per_token, "always_active": a.always_active, "routed_total": a.routed_total,
            "routed_active": a.routed_active, "experts_per_token": a.top_k, "routed_experts": a.experts,
            "moe_blocks": a.moe_blocks, "per_expert": a.per_expert, "mtp_excluded": a.mtp_excluded,
            "without_embedding": a.without_embedding,
            "definition": "all parameters outside the routed experts (embedding and lm_head in full), plus "
                          "num_experts_per_tok of n_routed_experts experts per MoE block; MTP layers excluded",
        },
        "published": [{"source": c.source, "total": c.published_total, "activated": c.published_activated,
                       "total_ratio": c.total_ratio, "activated_ratio": c.activated_ratio,
                       "total_consistent": c.total_consistent, "activated_consistent": c.activated_consistent}
                      for c in acc.comparisons],
    }
