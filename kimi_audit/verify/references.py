"""What `verify` compares each file's sha256 with: a reference, and where it came from.

- an HF cache snapshot: each LFS file is a symlink to `blobs/<its sha256>` (huggingface_hub names blobs by
  the LFS oid), so the link's target names the digest the Hub gave for it;
- the Hub: the LFS sha256 of every file at the resolved commit (one API call lists them all), for a local
  copy of `REPO[@REV]` (`--local-dir D` or the cache) or for the Hub's own bytes (`--stream`);
- a manifest (`--manifest FILE`, verify/manifest.py): every file's sha256, and per-tensor digests.

A reference that lists the whole model (the Hub's listing, a manifest) also says which files should be
there: one it lists that is absent, or one present that it does not list, is a finding.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kimi_audit.constants import SAFETENSORS_SUFFIX
from kimi_audit.sources.cache import snapshot_of
from kimi_audit.verify.manifest import Manifest, ignored

if TYPE_CHECKING:
    from kimi_audit.sources.hub import HubSource

_HEX64 = re.compile(r"^[0-9a-f]{64}$")

MANIFEST = "manifest"
HUB = "hub-lfs"
CACHE = "hf-cache"


@dataclass(frozen=True)
class Reference:
    kind: str
    """MANIFEST, HUB or CACHE."""
    where: str
    """For messages: `manifest m.json`, `the Hub's LFS sha256 at REPO@COMMIT`, `HF cache blob names`."""
    digests: dict[str, str]
    """File -> sha256 hex."""
    listing: frozenset[str] | None = None
    """Every file the reference says the model has (None: it speaks of single files only)."""
    tensors: dict[str, dict[str, str]] = field(default_factory=dict)
    revision: str | None = None
    not_blobs: tuple[str, ...] = ()
    """CACHE: the snapshot's files that are no link into its blobs (the cache writes none: CACHE_FILE_NOT_BLOB)."""


def cache_reference(root: Path, names: tuple[str, ...]) -> Reference | None:
    """The sha256 each file's HF cache blob is named by (symlinks into `blobs/`), or None outside a snapshot.

    In a snapshot (`snapshots/<commit>/`) whose cache keeps blobs (some file of it is a link into `blobs/`, or
    `blobs/` holds files) every file is such a link: any other (a regular file put in a link's place) is listed
    in `not_blobs`. A cache on a filesystem without symlinks moves the files into the snapshot and keeps no
    blobs: its files are not asked about."""
    digests: dict[str, str] = {}
    plain: list[str] = []
    for name in names:
        path = root / name
        try:
            target = os.path.basename(os.readlink(path)) if os.path.islink(path) else None
        except OSError:
            continue
        if target is not None and _HEX64.match(target):
            digests[name] = target
        elif target is None and not ignored(name):
            plain.append(name)
    snapshot = snapshot_of(root)
    linked = snapshot is not None and (bool(digests) or _holds_files(snapshot.path.parent.parent / "blobs"))
    not_blobs = tuple(plain) if linked else ()
    if not digests and not not_blobs:
        return None
    return Reference(CACHE, "the HF cache's blob names", digests, not_blobs=not_blobs)


def _holds_files(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def hub_reference(source: HubSource) -> Reference:
    """The Hub's LFS sha256 of every file at the resolved commit (a HubSource's listing)."""
    names = source.list_files()
    digests = {n: d for n in names if (d := source.lfs_sha256(n)) is not None}
    return Reference(HUB, f"the Hub's LFS sha256 at {source.label}", digests,
                     frozenset(n for n in names if not ignored(n) or n.endswith(SAFETENSORS_SUFFIX)),
                     revision=source.revision)


def manifest_reference(m: Manifest, path: Path) -> Reference:
    return Reference(MANIFEST, f"the manifest {path}", dict(m.files), frozenset(m.files), m.tensors, m.revision)
