"""`kimi-audit diff A B`: what changed between two checkpoints (headers; bytes with --content).

Exit codes: 0 IDENTICAL, 1 DIFFERENT or INCOMPLETE (with --content: --max-read, or data not present, nothing compared
differs but tensors were left uncompared), 2 unusable input.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from kimi_audit.checks.diff import (
    DIFFERENT,
    IDENTICAL,
    Change,
    ContentDiff,
    HeaderDiff,
    content_diff,
    diff_dict,
    header_diff,
    verdict,
)
from kimi_audit.cli.application import app, byte_progress, shard_progress, stderr, stdout, user_errors
from kimi_audit.errors import KimiAuditError
from kimi_audit.model.accounting.tree import collapse
from kimi_audit.model.checkpoint import Checkpoint, load_checkpoint
from kimi_audit.sources import open_source
from kimi_audit.sources.base import Source
from kimi_audit.text import clip, json_dumps, printable

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_LINES = 40


def file_fingerprints(source: Source, shards: list[str]) -> dict[str, str]:
    """Shard -> identity of its file: the Hub's LFS sha256, an HF-cache blob's sha256 (its name), or,
    for other local files, device + inode + size + mtime (hard links share it)."""
    out: dict[str, str] = {}
    root = source.root
    for shard in shards:
        sha = source.lfs_sha256(shard)
        if sha is not None and SHA256_RE.match(sha.lower()):
            out[shard] = "sha256:" + sha.lower()
            continue
        if root is None:
            continue
        path = Path(root) / shard
        try:
            target = Path(os.path.realpath(path))
            st = os.stat(path)
        except OSError:
            continue
        if SHA256_RE.match(target.name) and target.parent.name == "blobs":
            out[shard] = "sha256:" + target.name
        else:
            out[shard] = f"file:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    return out


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]i?b?|b)?\s*", text.lower())
    if not m:
        raise KimiAuditError(f"--max-read must be a size such as 500MB, 4GiB or 1000000, got {text!r}")
    unit = (m.group(2) or "b").rstrip("b") or "b"
    base = 1024 if unit.endswith("i") else 1000
    power = {"b": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit[0]]
    multiplier: int = base ** power  # int ** int is typed Any (a negative power is a float); power >= 0 here
    return int(m.group(1)) * multiplier


def _list(title: str, changes: tuple[Change, ...], show: Any) -> None:
    if not changes:
        return
    stdout.print(Text(f"{title} ({len(changes):,})", style="bold"))
    if len(changes) > MAX_LINES:
        for line in collapse(x.name for x in changes)[:MAX_LINES]:
            stdout.print(Text(f"  {printable(line)}"))
        return
    for c in changes:
        stdout.print(Text(printable(f"  {c.name}: {show(c)}")))


def same_model(a: Checkpoint, b: Checkpoint, parameters: tuple[int, int]) -> str | None:
    """`same model (ARCH, N parameters); quantization differs: BF16 → NVFP4` where one checkpoint is the other
    quantized, as `audit --against` holds them from the headers (checks.same_model); None otherwise.
    `parameters`: A's and B's logical parameter counts, their accountings' (HeaderDiff.parameters): the header
    diff has built them, and neither direction builds them again (four accountings did: 6 s of a full-scale pair's
    16 s here)."""
    from dataclasses import replace

    from kimi_audit.checks.same_model import held, same_model_line

    def quantization(c: Checkpoint) -> object:
        return None if c.config.quant is None else c.config.quant.summary()

    if quantization(a) == quantization(b):  # one quantized the other needs two quantizations: nothing to weigh
        return None

    def count(c: Checkpoint) -> int:
        return parameters[0] if c is a else parameters[1]

    model_type = a.config_raw.get("model_type")
    line = same_model_line(held(b, a, count), model_type)
    if line is None:
        h = held(a, b, count)
        line = same_model_line(replace(h, quantization=h.quantization[::-1]), model_type)
    return line


def render_diff(d: HeaderDiff, c: ContentDiff | None, same: str | None = None) -> None:
    t = Table.grid(padding=(0, 2))
    t.add_row("A", Text(printable(d.a + (f" @ {d.a_revision}" if d.a_revision else ""))),
              f"{d.tensors[0]:,} tensors", f"{d.parameters[0]:,} parameters")
    t.add_row("B", Text(printable(d.b + (f" @ {d.b_revision}" if d.b_revision else ""))),
              f"{d.tensors[1]:,} tensors", f"{d.parameters[1]:,} parameters")
    stdout.print(t)
    stdout.print(f"added {len(d.added):,} · removed {len(d.removed):,} · changed dtype/shape {len(d.changed):,} · "
                 f"moved between shards {len(d.moved):,} · config keys changed {len(d.config):,}", highlight=False)
    if same is not None:  # the tensors the quantization added, removed and changed: one line (--json lists them)
        stdout.print(Text(printable(same), style="bold"))
    else:
        _list("added", d.added, lambda x: x.b.text())
        _list("removed", d.removed, lambda x: x.a.text())
        _list("changed", d.changed, lambda x: f"{x.a.dtype} {list(x.a.shape)} → {x.b.dtype} {list(x.b.shape)}")
    _list("moved", d.moved, lambda x: f"{x.a.shard} → {x.b.shard}")
    for side, only in zip("AB", d.shards_only):
        if only:
            stdout.print(Text(f"shard files only in {side} ({len(only):,})", style="bold"))
            for name in only[:MAX_LINES]:
                stdout.print(Text(printable(f"  {name}")))
    if d.listed_only[0] != d.listed_only[1]:
        for side, ghosts in zip("AB", d.listed_only):
            stdout.print(Text(f"{side}'s index lists {len(ghosts):,} names no shard of {side} stores (loaders look "
                              "for them and miss)", style="bold"))
            for name in ghosts[:MAX_LINES]:
                stdout.print(Text(printable(f"  {name}")))
    if d.duplicates[0] != d.duplicates[1]:
        stdout.print(Text(f"tensors stored in two shards or more: A {d.duplicates[0]:,} · B {d.duplicates[1]:,} "
                          "(which copy a loader takes is its own choice)", style="bold"))
    if d.config:
        stdout.print(Text("config.json", style="bold"))
        for k, va, vb in d.config:
            stdout.print(Text(printable(clip(f"  {k}: {json.dumps(va)} → {json.dumps(vb)}", 500))))
    if d.components:
        ct = Table(title="Parameter delta per component (found in the headers)", title_justify="left")
        for col in ("component", "A", "B", "delta"):
            ct.add_column(col, justify="left" if col == "component" else "right")
        for comp in d.components:
            ct.add_row(Text(f"{comp.title} ({comp.key})"), f"{comp.a:,}", f"{comp.b:,}", f"{comp.delta:+,}")
        stdout.print(ct)
    if c is not None:
        stdout.print(Text("content", style="bold") + Text(
            f"  {c.compared:,} tensors hashed on both sides ({c.bytes_read[0]:,} + {c.bytes_read[1]:,} bytes in "
            f"{c.reads[0]:,} + {c.reads[1]:,} reads), {c.identical_files:,} skipped as the same file on both sides"
            + (f", {c.excluded:,} outside --tensors" if c.excluded else "")))
        for name, x, y in c.differing[:MAX_LINES * 5]:
            stdout.print(Text(printable(f"  bytes differ: {name}  {x[:12]} → {y[:12]}"), style="red"))
        for note in c.notes:
            stdout.print(Text(printable(f"  {note}"), style="yellow"))
        if same is not None:
            stdout.print(Text(f"  {len(d.changed):,} quantized weights are not compared byte for byte: `kimi-audit "
                              "audit B --against A --values` holds them to their format's error bound", style="yellow"))
    headline = verdict(d, c)
    unchecked = len(c.unchecked) if c is not None else 0
    if headline == IDENTICAL:
        stdout.print(Text(headline, style="bold green"))
    elif headline == DIFFERENT:
        stdout.print(Text(headline, style="bold red") + (Text(f"  ({unchecked:,} unchecked)") if unchecked else ""))
    else:
        absent = len(c.not_present) if c is not None else 0
        why = "; ".join(w for w in (f"{unchecked:,} tensors were left unchecked by --max-read" if unchecked else "",
                                    f"{absent:,} tensors' data is not present (sparse holes)" if absent else "") if w)
        stdout.print(Text(headline, style="bold yellow") + Text(f"  nothing compared differs, but {why}"))


@app.command()
@user_errors
def diff(
    a: str = typer.Argument(..., help="A local checkpoint directory, or a Hub repo `owner/name[@revision]`."),
    b: str = typer.Argument(..., help="The other checkpoint, same forms."),
    content: bool = typer.Option(False, "--content", help="Also compare the bytes of the tensors both hold "
                                 "(ranged SHA-256; shards that are the same file on both sides are not read)."),
    tensors: list[str] | None = typer.Option(None, "--tensors", help="With --content: only tensors whose "
                                                "name matches this glob (repeatable)."),
    max_read: str | None = typer.Option(None, "--max-read", help="With --content: read at most this much per "
                                           "side (e.g. 4GiB), smallest tensors first; the rest is reported "
                                           "unchecked (exit 1)."),
    as_json: bool = typer.Option(False, "--json", help="Print the differences as JSON (schema kimi-audit/diff/1)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars on stderr."),
) -> None:
    """Compare two checkpoints' tensors, parameter counts and config.

    What differs between checkpoints A and B: tensors added, removed, changed dtype or shape, moved
    between shards, parameter delta per component, config keys; with --content, which tensors' bytes
    differ. Exit 0 identical, 1 different (or incomplete: tensors left unchecked by --max-read), 2 unusable
    input.
    """
    budget = parse_size(max_read) if max_read is not None else None
    if (tensors or budget is not None) and not content:
        raise KimiAuditError("--tensors and --max-read apply to --content")
    src_a, src_b = open_source(a), open_source(b)
    with shard_progress("reading A's headers", progress) as update:
        ckpt_a = load_checkpoint(src_a, update)
    with shard_progress("reading B's headers", progress) as update:
        ckpt_b = load_checkpoint(src_b, update)
    for label, ck in (("A", ckpt_a), ("B", ckpt_b)):
        if ck.findings:
            stderr.print(Text(printable(f"{label}: {len(ck.findings):,} problems while loading (run `kimi-audit "
                                        f"audit` on it): {ck.findings[0].message}")))
    d = header_diff(ckpt_a, ckpt_b)
    c = None
    if content:
        with byte_progress("comparing bytes of A and B", progress) as update:
            c = content_diff(src_a, ckpt_a, src_b, ckpt_b,
                             fingerprints_a=file_fingerprints(src_a, list(ckpt_a.headers)),
                             fingerprints_b=file_fingerprints(src_b, list(ckpt_b.headers)),
                             max_read=budget, include=tensors or (), progress=update)
    same = same_model(ckpt_a, ckpt_b, d.parameters)
    if as_json:
        sys.stdout.write(json_dumps({**diff_dict(d, c), "same_model": same}, indent=2) + "\n")
    else:
        render_diff(d, c, same)
    raise typer.Exit(0 if verdict(d, c) == IDENTICAL else 1)
