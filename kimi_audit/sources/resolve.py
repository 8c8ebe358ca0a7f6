"""Turn what the user typed (a path, or a Hub repo id) into a Source."""

from __future__ import annotations

import re
from pathlib import Path

from kimi_audit.errors import FileMissingError, KimiAuditError
from kimi_audit.sources.base import Source
from kimi_audit.sources.cache import find_snapshot, is_offline
from kimi_audit.sources.local import LocalSource

REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_repo_id(spec: str) -> bool:
    return bool(REPO_ID_RE.match(spec)) and not spec.startswith((".", "/"))


def open_source(spec: str, revision: str | None = None) -> Source:
    """A local path wins over a repo id of the same spelling; `REPO@REV` is accepted too.

    With huggingface_hub's offline mode on (HF_HUB_OFFLINE=1), a repo id is read from its snapshot in
    the HF cache (cache.py): a LocalSource whose revision is the snapshot's commit.
    """
    if Path(spec).exists():
        if revision is not None:
            raise KimiAuditError(f"--revision applies to Hub repos, but {spec!r} is a local path")
        return LocalSource(spec)
    repo, _, at_rev = spec.partition("@")
    if looks_like_repo_id(repo):
        rev = revision or at_rev or None
        if is_offline():
            snap = find_snapshot(repo, rev)
            return LocalSource(snap.path, label=f"{snap.repo_id}@{snap.commit} (HF cache)")
        try:
            from kimi_audit.sources.hub import HubSource
        except ImportError:  # pragma: no cover - hub support ships with the package
            raise KimiAuditError("Hub sources are not available in this build") from None
        return HubSource(repo, revision=rev)
    raise FileMissingError(f"no such file or directory, and not a Hub repo id (owner/name): {spec}")
