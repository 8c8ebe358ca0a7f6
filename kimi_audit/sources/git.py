"""The commit a local git clone's HEAD names, read from its files (no git subprocess): what `--expect-revision`
compares a local clone of a Hub repo with (`git clone https://huggingface.co/OWNER/NAME`).

Read as git reads them: `DIR/.git` is the git directory, or a file `gitdir: PATH` naming it (a worktree, a
submodule; its `commondir` names the shared one, where branches and packed-refs live); `HEAD` is a commit (a
detached HEAD) or `ref: refs/heads/NAME`, whose commit is in the file of that name or in `packed-refs`
(`SHA REF` lines; `^SHA` peels a tag). Only DIR itself is looked at, never a folder above it: a checkpoint that
merely lies inside some other repository's work tree is no clone. What HEAD names is the commit checked out,
not a proof that the work tree still holds it unchanged (`git status` tells that).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kimi_audit.errors import KimiAuditError
from kimi_audit.sources.files import read_bounded

_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_REF = re.compile(r"^refs/[A-Za-z0-9._/+-]+$")
SMALL = 64 << 10
"""HEAD, a ref file, `gitdir:` and `commondir`: a line each."""
PACKED_MAX = 64 << 20
"""packed-refs: one line per ref; a repository with a million tags stays under this."""


def _read(path: Path, limit: int) -> str | None:
    try:
        return read_bounded(path, path.name, limit).decode("utf-8", "replace")
    except (OSError, KimiAuditError):
        return None


def git_dir(root: Path) -> Path | None:
    """The git directory of the work tree at `root` (`.git`, or where a `.git` file's `gitdir:` points)."""
    dot = root / ".git"
    if dot.is_dir():
        return dot
    text = _read(dot, SMALL) if dot.is_file() else None
    if text is None or not text.startswith("gitdir:"):
        return None
    where = Path(text[len("gitdir:"):].strip())
    where = where if where.is_absolute() else root / where
    return where if where.is_dir() else None


def git_head(root: Path) -> str | None:
    """The full commit hash HEAD names in the git clone at `root` (lower case), or None: no clone there, an
    unborn branch, or files that do not read as git's."""
    gdir = git_dir(root)
    if gdir is None:
        return None
    head = _read(gdir / "HEAD", SMALL)
    if head is None:
        return None
    head = head.strip()
    if _SHA.match(head):
        return head
    if not head.startswith("ref:"):
        return None
    ref = head[len("ref:"):].strip()
    if not _REF.match(ref) or ".." in ref.split("/"):
        return None
    common = gdir
    shared = _read(gdir / "commondir", SMALL)
    if shared is not None and shared.strip():
        common = Path(shared.strip()) if os.path.isabs(shared.strip()) else gdir / shared.strip()
    for where in dict.fromkeys((gdir, common)):
        loose = _read(where.joinpath(*ref.split("/")), SMALL)
        if loose is not None and _SHA.match(loose.strip()):
            return loose.strip()
    return _packed(common / "packed-refs", ref)


def _packed(path: Path, ref: str) -> str | None:
    """`ref`'s commit in a packed-refs file (its `SHA REF` line), or None."""
    text = _read(path, PACKED_MAX)
    for line in (text or "").splitlines():
        sha, _, name = line.strip().partition(" ")
        if name == ref and _SHA.match(sha):
            return sha
    return None
