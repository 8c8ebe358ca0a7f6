"""The `download` command (registers itself on cli.app when cli.py imports this module)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kimi_audit.cli.application import app, stderr, stdout, user_errors
from kimi_audit.constants import PINNED_REPO_ID


@app.command("download")
@user_errors
def download_command(
    repo_id: str = typer.Argument(PINNED_REPO_ID, help="Hub repo id (owner/name)."),
    revision: str | None = typer.Option(
        None, "--revision", "-r",
        help="Branch, tag or commit (full or short); default: the pinned commit for Kimi-K2-Instruct, else main."),
    local_dir: Path | None = typer.Option(
        None, "--local-dir", help="Download into this directory instead of the HF cache."),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="HF cache directory (default: HF_HUB_CACHE)."),
    include: list[str] | None = typer.Option(
        None, "--include", help="Only files matching this glob (repeatable), e.g. '*.json'."),
    headers_only: bool = typer.Option(
        False, "--headers-only",
        help="Config, index and small files whole; each shard's header only, in a sparse file of the shard's "
             "size (needs --local-dir). `kimi-audit audit DIR` then works offline."),
    verify: bool = typer.Option(
        False, "--verify", help="Check each downloaded LFS file's sha256 against the Hub's metadata for the commit."),
) -> None:
    """Download a checkpoint at a pinned commit: whole, selected files (--include), or headers only.

    Full downloads go through huggingface_hub (standard cache or --local-dir, resumable, progress bars).
    """
    from kimi_audit.download.hub import download

    if headers_only:
        with Progress(TextColumn("[bold]headers-only"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.description}"), TimeElapsedColumn(), console=stderr,
                      transient=True, disable=not stderr.is_terminal) as bar:
            task = bar.add_task("", total=None)
            result = download(repo_id, revision, local_dir=local_dir, cache_dir=cache_dir, include=include,
                              headers_only=True, verify=verify,
                              progress=lambda name: bar.update(task, advance=1, description=name))
    else:
        result = download(repo_id, revision, local_dir=local_dir, cache_dir=cache_dir, include=include,
                          verify=verify)

    stdout.print(f"{result.repo_id} @ {result.revision}", highlight=False)
    stdout.print(f"path: {result.path}", highlight=False)
    if headers_only:
        skipped = f", {len(result.skipped)} skipped (already complete, or too large)" if result.skipped else ""
        stdout.print(f"{len(result.files)} files whole, {len(result.headers_only)} shard headers written{skipped}",
                     highlight=False)
        stdout.print(f"audit it offline: kimi-audit audit {result.path}", highlight=False)
        return
    stdout.print(f"{len(result.files)} files", highlight=False)
    if not verify:
        return
    table = Table("file", "sha256 (Hub LFS metadata)", "result")
    for v in result.verified:
        status = ("ok" if v.ok else "no LFS sha256 on the Hub" if v.expected is None
                  else "MISMATCH" if v.actual else "missing")
        table.add_row(v.name, v.expected or "-", status)
    stdout.print(table)
    bad = [v for v in result.verified if not v.ok]
    if bad:
        stderr.print(f"[bold red]verify failed[/bold red] for {len(bad)} of {len(result.verified)} files: "
                     + ", ".join(v.name for v in bad[:5]) + (" ..." if len(bad) > 5 else ""), highlight=False)
        raise typer.Exit(1)
    stdout.print(f"verified {len(result.verified)} files against the Hub's sha256 for {result.revision}",
                 highlight=False)
