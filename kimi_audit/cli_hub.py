"""The `download` command (registered in cli.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kimi_audit.constants import PINNED_REPO_ID
from kimi_audit.errors import KimiAuditError


def download_command(
    repo_id: Annotated[str, typer.Argument(help="Hub repo id (owner/name).")] = PINNED_REPO_ID,
    revision: Annotated[
        Optional[str],
        typer.Option("--revision", "-r", help="Branch, tag or commit (default: the pinned commit for Kimi-K2-Instruct, else main)."),
    ] = None,
    local_dir: Annotated[
        Optional[Path], typer.Option("--local-dir", help="Download into this directory instead of the HF cache.")
    ] = None,
    cache_dir: Annotated[Optional[Path], typer.Option("--cache-dir", help="HF cache directory (default: HF_HUB_CACHE).")] = None,
    include: Annotated[
        Optional[list[str]], typer.Option("--include", help="Only files matching this glob (repeatable), e.g. '*.json'.")
    ] = None,
    headers_only: Annotated[
        bool,
        typer.Option("--headers-only", help="Store each shard's header in a sparse file of the right size (needs --local-dir)."),
    ] = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="Check each downloaded LFS file's sha256 against the Hub's metadata.")
    ] = False,
) -> None:
    """Download a checkpoint at a pinned commit (whole, selected files, or headers only)."""
    from kimi_audit.download import download

    err = Console(stderr=True)
    out = Console()
    try:
        if headers_only:
            with Progress(
                TextColumn("[bold]headers"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=err,
                transient=True,
            ) as bar:
                task = bar.add_task("", total=None)

                def step(name: str) -> None:
                    bar.update(task, advance=1, description=name)

                result = download(
                    repo_id, revision, local_dir=local_dir, cache_dir=cache_dir, include=include,
                    headers_only=True, progress=step,
                )
        else:
            result = download(
                repo_id, revision, local_dir=local_dir, cache_dir=cache_dir, include=include, verify=verify,
            )
    except KimiAuditError as e:
        err.print(f"[red]error:[/red] {e}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None

    out.print(f"{result.repo_id} @ {result.revision}", highlight=False)
    out.print(f"path: {result.path}", highlight=False)
    if headers_only:
        out.print(
            f"{len(result.files)} files whole, {len(result.headers_only)} shard headers written"
            f"{f', {len(result.skipped)} skipped (already complete or too large)' if result.skipped else ''}",
            highlight=False,
        )
        out.print(f"audit it offline with: kimi-audit audit {result.path}", highlight=False)
    else:
        out.print(f"{len(result.files)} files", highlight=False)
    if verify:
        table = Table("file", "sha256 (Hub LFS)", "result")
        for v in result.verified:
            status = "ok" if v.ok else ("no LFS sha256 on the Hub" if v.expected is None else "MISMATCH" if v.actual else "missing")
            table.add_row(v.name, (v.expected or "-")[:16], status)
        out.print(table)
        bad = [v for v in result.verified if not v.ok]
        if bad:
            err.print(f"[red]verify failed[/red] for {len(bad)} of {len(result.verified)} files", highlight=False)
            raise typer.Exit(1)
        out.print(f"verified {len(result.verified)} files against the Hub's sha256", highlight=False)
