"""The Hugging Face cache: a `REPO[@REV]` resolved to a cached snapshot, and a path's commit.

The layout is huggingface_hub's (`constants.HF_HUB_CACHE`, HF_HOME/hub by default)::

    models--owner--name/
        blobs/<hash>                    the file contents
        refs/<branch or tag>            the commit it pointed at when last downloaded
        snapshots/<commit>/<file>       -> ../../blobs/<hash>

A revision is resolved the way huggingface_hub resolves it offline: a name through `refs/<name>`, a
full commit hash directly; a short hash (7-39 hex digits) also matches the one cached snapshot whose
commit it starts. Nothing here touches the network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from kimi_audit.constants import CONFIG_FILE, PINNED_REPO_ID, PINNED_REVISION
from kimi_audit.errors import NotRegularFileError, UnsafePathError
from kimi_audit.sources.base import safe_member_name
from kimi_audit.sources.files import open_regular
from kimi_audit.sources.hub_errors import HubOfflineError
from kimi_audit.sources.hub_network import check_environment

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHORT_RE = re.compile(r"^[0-9a-f]{7,39}$")
REPO_FOLDER_PREFIX = "models--"
"""huggingface_hub's `repo_folder_name` for a model repo: `models--owner--name`."""


class CacheMissError(HubOfflineError):
    """Offline mode is on and the HF cache holds no usable snapshot of the repo at that revision."""


class CachedSnapshot(NamedTuple):
    repo_id: str
    commit: str
    path: Path
    """`<cache>/models--owner--name/snapshots/<commit>`."""


def is_offline() -> bool:
    """huggingface_hub's offline mode (HF_HUB_OFFLINE, read when it was imported)."""
    check_environment()  # before huggingface_hub reads the environment on import
    from huggingface_hub import constants

    return constants.is_offline_mode()


def cache_dir() -> Path:
    """The hub cache huggingface_hub uses (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    check_environment()
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_folder(repo_id: str, cache: Path) -> Path:
    return cache / (REPO_FOLDER_PREFIX + repo_id.replace("/", "--"))


def default_revision(repo_id: str) -> str:
    """As HubSource: the pinned commit for the pinned repo, else `main`."""
    return PINNED_REVISION if repo_id == PINNED_REPO_ID else "main"


def _offline_note() -> str:
    return "offline mode is on: HF_HUB_OFFLINE=1"


def _cached_commits(folder: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(folder / "snapshots") if e.is_dir() and _COMMIT_RE.match(e.name))
    except OSError:
        return []


def _cached_refs(folder: Path) -> list[str]:
    refs = folder / "refs"
    out: list[str] = []
    for dirpath, _dirs, files in os.walk(refs):
        rel = os.path.relpath(dirpath, refs)
        out.extend(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/") for f in files)
    return sorted(out)


def _read_ref(folder: Path, name: str) -> str | None:
    """The commit `refs/<name>` records, or None when there is no such ref.

    huggingface_hub writes a ref as a regular file: a symlink or any other kind of file is no ref (its
    target's bytes are never read, so they cannot reach a message), and neither is a text that is not
    a commit hash.
    """
    try:
        safe_member_name(name)
    except UnsafePathError:
        return None
    try:
        with os.fdopen(open_regular(folder / "refs" / name, name, follow=False), "rb") as f:
            ref = f.read(256).strip().decode("ascii")
    except (OSError, UnicodeDecodeError, NotRegularFileError):  # a symlink: OSError (ELOOP)
        return None
    return ref if _COMMIT_RE.match(ref) else None


def resolve_commit(repo_id: str, revision: str, folder: Path) -> str | None:
    """The full commit `revision` names in this repo's cache folder, or None when the cache cannot tell."""
    ref = _read_ref(folder, revision)
    if ref is not None:
        return ref
    if _COMMIT_RE.match(revision):
        return revision
    if _SHORT_RE.match(revision):
        matches = [c for c in _cached_commits(folder) if c.startswith(revision)]
        if len(matches) > 1:
            raise CacheMissError(
                f"{repo_id}@{revision}: the short hash matches {len(matches)} cached snapshots "
                f"({', '.join(m[:12] for m in matches)}); give more digits ({_offline_note()})"
            )
        return matches[0] if matches else None
    return None


def find_snapshot(repo_id: str, revision: str | None = None, cache: Path | None = None) -> CachedSnapshot:
    """The cached snapshot of `repo_id` at `revision`; raises CacheMissError, saying what is missing.

    A snapshot counts when its config.json is there (the audit reads nothing without it). Shards the
    index names but the snapshot lacks (an interrupted or partial download) are left to the audit,
    which reports each as INDEX_SHARD_ABSENT.
    """
    cache = cache if cache is not None else cache_dir()
    rev = revision or default_revision(repo_id)
    what = f"{repo_id}@{rev}"
    if repo_id.count("/") != 1 or ".." in repo_id:
        raise CacheMissError(f"not a Hub repo id (owner/name): {repo_id!r}")
    folder = repo_folder(repo_id, cache)
    if not folder.is_dir():
        raise CacheMissError(f"{what}: not in the HF cache at {cache} ({_offline_note()})")
    commit = resolve_commit(repo_id, rev, folder) or ""
    snap = folder / "snapshots" / commit
    if not commit or not snap.is_dir():
        known = [f"{r} -> {(_read_ref(folder, r) or '?')[:12]}" for r in _cached_refs(folder)]
        cached = ", ".join(c[:12] for c in _cached_commits(folder)) or "none"
        refs = f"; refs: {', '.join(known)}" if known else ""
        raise CacheMissError(
            f"{what}: no cached snapshot for this revision in {folder} "
            f"(cached commits: {cached}{refs}; {_offline_note()})"
        )
    if not (snap / CONFIG_FILE).is_file():
        raise CacheMissError(
            f"{what}: the cached snapshot {snap} has no {CONFIG_FILE} "
            f"(an interrupted or partial download; {_offline_note()})"
        )
    return CachedSnapshot(repo_id, commit, snap)


def snapshot_of(path: str | os.PathLike[str]) -> CachedSnapshot | None:
    """The HF cache snapshot `path` is in (the snapshot itself, a folder or a file under it), or None.

    Recognized by the layout: `.../models--owner--name/snapshots/<40-hex commit>/...`. A directory is
    followed through symlinks; a file is not (a snapshot's files are links into ../../blobs).
    """
    if os.path.isdir(path):
        p = Path(os.path.realpath(path))
    else:
        p = Path(os.path.realpath(os.path.dirname(os.path.abspath(path))))
    for snap in (p, *p.parents):
        parent = snap.parent
        if (
            _COMMIT_RE.match(snap.name)
            and parent.name == "snapshots"
            and parent.parent.name.startswith(REPO_FOLDER_PREFIX)
        ):
            repo_id = parent.parent.name[len(REPO_FOLDER_PREFIX):].replace("--", "/")
            return CachedSnapshot(repo_id, snap.name, snap)
    return None
