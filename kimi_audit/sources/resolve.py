"""Turn what the user typed (a path, or a Hub repo id) into a Source: the one place a source is opened."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from kimi_audit.constants import GGUF_SUFFIX, INDEX_FILE, SAFETENSORS_SUFFIX
from kimi_audit.errors import FileMissingError, KimiAuditError
from kimi_audit.sources.base import Source
from kimi_audit.sources.cache import find_snapshot, is_offline
from kimi_audit.sources.local import LocalSource
from kimi_audit.sources.selected import Selected, set_globs

if TYPE_CHECKING:
    from kimi_audit.sources.hub import HubSource

REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

Mode = Literal["auto", "copy", "stream"]
"""How a Hub repo id is read. auto: from the Hub (offline: its HF cache snapshot). copy: from its local
copy (`local_dir`, else the HF cache snapshot of the resolved commit), the Hub asked only for the commit
and its listing. stream: from the Hub, even where a local path has the same spelling."""


@dataclass(frozen=True)
class Opened:
    source: Source
    """Where the files are read."""
    hub: HubSource | None = None
    """The Hub at the same commit, when it was asked (copy and stream modes, online): its listing and LFS
    sha256 are a reference for the files."""


def looks_like_repo_id(spec: str) -> bool:
    return bool(REPO_ID_RE.match(spec)) and not spec.startswith((".", "/"))


def open_source(spec: str, revision: str | None = None, include: tuple[str, ...] = ()) -> Source:
    """A local path wins over a repo id of the same spelling; `REPO@REV` is accepted too.

    With huggingface_hub's offline mode on (HF_HUB_OFFLINE=1), a repo id is read from its snapshot in
    the HF cache (cache.py): a LocalSource whose revision is the snapshot's commit. `include`: only the files
    these globs match (one GGUF set of several); a `.gguf` file stands for its folder's split set, and a
    `.safetensors` shard beside an index for its checkpoint (the folder), as config.json and the index do.
    """
    return resolve_source(spec, revision, include=include).source


def resolve_source(spec: str, revision: str | None = None, *, mode: Mode = "auto",
                   local_dir: Path | None = None, include: tuple[str, ...] = ()) -> Opened:
    """`spec` opened as `mode` says (see Mode); `local_dir` names a repo's local copy (copy mode only);
    `include`: only the files these globs match."""
    path = Path(spec)
    if mode != "stream" and path.suffix == GGUF_SUFFIX and path.is_file() and not include:
        folder = LocalSource(path.parent)
        return Opened(Selected(folder, set_globs(path.name), label=spec))
    if mode != "stream" and path.suffix == SAFETENSORS_SUFFIX and not include and path.is_file() \
            and (path.parent / INDEX_FILE).is_file():  # one shard is not a checkpoint: it names its own
        return Opened(LocalSource(path.parent, label=spec))
    opened = _resolve(spec, revision, mode=mode, local_dir=local_dir)
    if not include:
        return opened
    return Opened(Selected(opened.source, include), opened.hub)


def _resolve(spec: str, revision: str | None, *, mode: Mode, local_dir: Path | None) -> Opened:
    if mode == "stream" and local_dir is not None:
        raise KimiAuditError("--stream reads from the Hub: it takes no --local-dir")
    if mode != "stream" and Path(spec).exists():
        given = [opt for opt, value in (("--revision", revision), ("--local-dir", local_dir)) if value is not None]
        if given:
            raise KimiAuditError(f"{' and '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to Hub repos, "
                                 f"but {spec!r} is a local path")
        return Opened(LocalSource(spec))
    repo, _, at_rev = spec.partition("@")
    if not looks_like_repo_id(repo):
        raise FileMissingError(f"no such file or directory, and not a Hub repo id (owner/name): {spec}")
    rev = revision or at_rev or None
    if is_offline():
        if mode == "stream":
            raise KimiAuditError("--stream reads from the Hub, but offline mode is on (HF_HUB_OFFLINE)")
        if local_dir is not None:
            return Opened(LocalSource(local_dir))
        snap = find_snapshot(repo, rev)
        return Opened(LocalSource(snap.path, label=f"{snap.repo_id}@{snap.commit} (HF cache)"))
    from kimi_audit.sources.hub import HubSource

    hub = HubSource(repo, revision=rev)
    if mode == "auto":
        return Opened(hub)
    if mode == "stream":
        return Opened(hub, hub)
    if local_dir is not None:
        src = LocalSource(local_dir, label=f"{local_dir} (local copy of {hub.label})")
    else:
        try:
            snap = find_snapshot(repo, hub.revision)
        except KimiAuditError:
            raise KimiAuditError(f"{hub.label} is not in the HF cache: download it (kimi-audit download "
                                 f"{repo} --revision {hub.revision}), name its copy with --local-dir, or read "
                                 "it from the Hub with --stream") from None
        src = LocalSource(snap.path, label=f"{snap.repo_id}@{snap.commit} (HF cache)")
    src.revision = hub.revision
    return Opened(src, hub)
