"""`kimi-audit params` (the parameter accounting tree) and `kimi-audit explain` (one node's card)."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from kimi_audit.cli.application import app, shard_progress, stdout, user_errors
from kimi_audit.constants import PINNED_REPO_ID
from kimi_audit.model.accounting import Accounting, DtypeRow, Node, accounting_dict, accounting_of_checkpoint
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.model.explain import build_card, card_dict, card_text, find_nodes
from kimi_audit.model.kinds import PARAMETER
from kimi_audit.sources import open_source

SOURCE_HELP = "A local checkpoint directory, or a Hub repo id `owner/name[@revision]`."


def _load(source: str, revision: str | None, progress: bool):  # type: ignore[no-untyped-def]
    src = open_source(source, revision)
    with shard_progress("reading headers", progress) as update:
        ckpt = load_checkpoint(src, update)
    return ckpt, accounting_of_checkpoint(ckpt)


def _status(n: Node) -> Text:
    if n.own_mismatch:
        return Text("✗ mismatch", style="bold red")
    if n.mismatch:
        return Text("✗ below", style="red")
    return Text("✓", style="green")


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def node_label(n: Node) -> Text:
    label = Text(n.title, style="bold" if not n.is_leaf else "")
    if n.is_leaf and n.name != n.title:
        label += Text(f" ({n.name})", style="dim")
    label += Text("  ") + _status(n) + Text(f"  {n.derived:,}")
    if n.is_leaf and n.parts:
        label += Text("  " + "/".join(dict.fromkeys(p.logical_dtype for p in n.parts)), style="dim")
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
        ex.add_row(Text(f"{_KIND.get(x.kind, x.kind)} {x.dtype}"), Text(x.pattern),
                   Text(count, style="" if ok else "bold red"), f"{x.found_elements:,}")
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


@app.command()
@user_errors
def params(
    source: str = typer.Argument(PINNED_REPO_ID, help=SOURCE_HELP),
    revision: str | None = typer.Option(None, "--revision", "-r", help="Hub revision (commit, branch or tag)."),
    depth: int | None = typer.Option(None, "--depth", "-d", min=0,
                                        help="Show the tree down to this depth (0 = the model total only)."),
    as_json: bool = typer.Option(False, "--json", help="Print the tree as JSON (schema kimi-audit/params/1)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
) -> None:
    """Print the parameter accounting tree, derived from config.json and found in the tensors.

    Each component's count derived from config.json, next to the count found in the checkpoint's
    tensors, with the formula. Exit 1 when any node mismatches.
    """
    _ckpt, acc = _load(source, revision, progress)
    if as_json:
        sys.stdout.write(json.dumps(accounting_dict(acc, depth), indent=2, ensure_ascii=False) + "\n")
    else:
        render_params(acc, stdout, depth)
    raise typer.Exit(1 if acc.mismatch else 0)


@app.command()
@user_errors
def explain(
    source: str = typer.Argument(..., help=SOURCE_HELP),
    component: str = typer.Argument(..., help="A node: `q_a_layernorm`, `experts.gate_proj`, a key such as "
                                              "`blocks.moe.router`, a title, or a tensor name."),
    revision: str | None = typer.Option(None, "--revision", "-r", help="Hub revision (commit, branch or tag)."),
    as_json: bool = typer.Option(False, "--json", help="Print the card(s) as JSON."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
) -> None:
    """Explain one component of the model in a card.

    The card says what it computes, its shapes with named axes, exact per-instance accounting, the count
    across blocks, the tensors that hold it and the config keys it came from. A name found in several
    blocks (e.g. q_a_layernorm: MoE and dense) prints one card for each.
    """
    ckpt, acc = _load(source, revision, progress)
    cards = [build_card(acc, ckpt.config, ckpt.config_raw, n) for n in find_nodes(acc, ckpt.config, component)]
    if as_json:
        sys.stdout.write(json.dumps([card_dict(c) for c in cards], indent=2, ensure_ascii=False) + "\n")
    else:
        for i, c in enumerate(cards):
            if i:
                stdout.rule()
            text = Text(card_text(c))
            text.stylize("bold", 0, len(card_text(c).split("\n", 1)[0]))
            stdout.print(text, soft_wrap=True)
    raise typer.Exit(1 if any(c.mismatch for c in cards) else 0)
