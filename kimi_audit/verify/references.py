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


def cache_reference(root: Path, names: tuple[str, ...]) -> Reference | None:
    """The sha256 each file's HF cache blob is named by (symlinks into `blobs/`), or None outside a snapshot."""
    digests: dict[str, str] = {}
    for name in names:
        path = root / name
        try:
            if not os.path.islink(path):
                continue
            target = os.path.basename(os.readlink(path))
        except OSError:
            continue
        if _HEX64.match(target):
            digests[name] = target
    return Reference(CACHE, "the HF cache's blob names", digests) if digests else None


def hub_reference(source: HubSource) -> Reference:
    """The Hub's LFS sha256 of every file at the resolved commit (a HubSource's listing)."""
    names = source.list_files()
    digests = {n: d for n in names if (d := source.lfs_sha256(n)) is not None}
    return Reference(HUB, f"the Hub's LFS sha256 at {source.label}", digests,
                     frozenset(n for n in names if not ignored(n)), revision=source.revision)


def manifest_reference(m: Manifest, path: Path) -> Reference:
    return Reference(MANIFEST, f"the manifest {path}", dict(m.files), frozenset(m.files), m.tensors, m.revision)
