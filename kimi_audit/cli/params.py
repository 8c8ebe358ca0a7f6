"""`kimi-audit params` (the parameter accounting tree) and `kimi-audit explain` (one node's card)."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from kimi_audit.checks.audit import audit_checkpoint, unsupported_reason
from kimi_audit.cli.application import app, shard_progress, stderr, stdout, user_errors
from kimi_audit.constants import PINNED_REPO_ID
from kimi_audit.findings import EXIT_INCONCLUSIVE
from kimi_audit.model.accounting.account import accounting_of_checkpoint
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.model.explain import build_card, find_nodes
from kimi_audit.report.accounting import accounting_dict, render_params
from kimi_audit.report.explain import card_dict, card_rich
from kimi_audit.sources import open_source
from kimi_audit.text import json_dumps

SOURCE_HELP = "A local checkpoint directory, or a Hub repo id `owner/name[@revision]`."


def _load(source: str, revision: str | None, progress: bool):  # type: ignore[no-untyped-def]
    src = open_source(source, revision)
    with shard_progress("reading headers", progress) as update:
        ckpt = load_checkpoint(src, update)
    if not ckpt.config.layout_supported:  # no tree to derive: why, once, as audit says it (not a tree of zeros)
        stderr.print(f"inconclusive: {unsupported_reason(ckpt)}: there is no parameter tree to derive (`kimi-audit "
                     "audit` runs the format, index and file checks)", highlight=False, soft_wrap=True, markup=False)
        raise typer.Exit(EXIT_INCONCLUSIVE)
    return ckpt, accounting_of_checkpoint(ckpt)


def log_console(file: Any) -> Console:
    """Off a terminal (a pipe, a CI log, an -o file): rows as wide as they are, never wrapped mid-name."""
    return Console(file=file, width=LOG_WIDTH, color_system=None, soft_wrap=False)


LOG_WIDTH = 10_000
"""Columns of a console that is not a terminal: wider than any row the tree or its tables print."""


@app.command()
@user_errors
def params(
    source: str = typer.Argument(PINNED_REPO_ID, help=SOURCE_HELP),
    revision: str | None = typer.Option(None, "--revision", "-r", help="Hub revision (commit, branch or tag)."),
    depth: int | None = typer.Option(None, "--depth", "-d", min=0,
                                        help="Show the tree down to this depth (0 = the model total only)."),
    as_json: bool = typer.Option(False, "--json", help="Print the tree as JSON (schema kimi-audit/params/1)."),
    fmt: str | None = typer.Option(None, "--format", "-f", help="table (default), json (--json) or html (one "
                                   "self-contained page, the tree as bars)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report (table, json or html, as "
                                       "--format says) to FILE, not stdout."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
) -> None:
    """Print the parameter accounting tree, derived from config.json and found in the tensors.

    Each component's count derived from config.json, next to the count found in the checkpoint's
    tensors, with the formula. Exits as `audit` does on the same checkpoint: 1 when its audit finds an error
    (every mismatching node is one), else 0.
    """
    from kimi_audit.cli.ci import choose_format, emit

    out_format = choose_format(fmt, as_json, ("table", "json", "html"), output)
    ckpt, acc = _load(source, revision, progress)
    if out_format == "table" and output is None:
        render_params(acc, stdout if stdout.is_terminal else log_console(sys.stdout), depth)
    elif out_format == "html":
        from kimi_audit.report.html import render_params_html

        emit(render_params_html(acc, depth), output)
    elif out_format == "json":
        emit(json_dumps(accounting_dict(acc, depth), indent=2) + "\n", output)
    else:
        buf = io.StringIO()
        render_params(acc, log_console(buf), depth)
        emit(buf.getvalue(), output)
    raise typer.Exit(audit_checkpoint(ckpt).exit_code())


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
        sys.stdout.write(json_dumps([card_dict(c) for c in cards], indent=2) + "\n")
    else:
        for i, c in enumerate(cards):
            if i:
                stdout.rule()
            stdout.print(card_rich(c), soft_wrap=True)
    raise typer.Exit(1 if any(c.mismatch for c in cards) else 0)
