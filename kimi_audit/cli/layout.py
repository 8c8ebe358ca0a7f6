"""`kimi-audit layout`: what a checkpoint of a config must hold, one tensor a line (or JSON), for converter
and quantizer authors. The library's `kimi_audit.layout` computes it; this module renders only."""

from __future__ import annotations

import json
import sys

import typer

from kimi_audit.api import layout as expected_tensors
from kimi_audit.cli.application import app, user_errors
from kimi_audit.constants import PINNED_REPO_ID
from kimi_audit.model.roles import role_of


@app.command()
@user_errors
def layout(
    source: str = typer.Argument(PINNED_REPO_ID, help="A config.json, a local checkpoint directory, or a Hub repo id "
                                 "`owner/name[@revision]` (its config.json alone is read)."),
    revision: str | None = typer.Option(None, "--revision", "-r", help="Hub revision (commit, branch or tag)."),
    dialect: str | None = typer.Option(None, "--dialect", help="Spell the names as another writer does "
                                       "(`transformers`: its save_pretrained) instead of the release."),
    as_json: bool = typer.Option(False, "--json", help="One JSON array of {name, dtype, shape, kind, role, "
                                 "format} on stdout; format is the Linear module's quantization format, "
                                 "\"none\" for a Linear left unquantized, null for a tensor of no Linear "
                                 "module (a norm, the embedding)."),
) -> None:
    """List every tensor a checkpoint of this config must hold: name, dtype, shape, what it is, and the
    quantization format of the module it stores, in checkpoint order.

    Examples: `kimi-audit layout config.json`, `kimi-audit layout moonshotai/Kimi-K2-Thinking --json`,
    `kimi-audit layout ./Kimi-K2.6 --dialect transformers` (a dialect is another writer's names where they differ
    from the release's: Kimi-K2.5/K2.6, DeepSeek-V4 and Kimi-Linear have one, Mistral Small 4 has `transformers-4.52`;
    Kimi-K2's are the same)."""
    rows = [{"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "kind": e.kind, "role": role_of(e.name),
             "format": e.scheme or None} for e in expected_tensors(source, revision, dialect=dialect).values()]
    out = sys.stdout
    if as_json:
        json.dump(rows, out, indent=None, separators=(",", ":"))
        out.write("\n")
        return
    for r in rows:
        shape = "[" + ", ".join(map(str, r["shape"])) + "]"
        out.write(f"{r['name']}\t{r['dtype']}\t{shape}\t{r['kind']}\t{r['role']}\t{r['format'] or '-'}\n")
