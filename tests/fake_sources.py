"""Pieces of test fakes of the Source protocol (kimi_audit.sources.base)."""

from __future__ import annotations


class NoCapabilities:
    """The protocol's optional capabilities, all absent: a fake that only wraps range reads (not remote, no
    root directory, no listed sizes, no holes, no LFS digests, no links)."""

    remote, root = False, None

    def file_size(self, name):
        return None

    def holes(self, name, start=0, length=None):
        return ()

    def lfs_sha256(self, name):
        return None

    def outside_links(self):
        return ()

    def reported_parameters(self):
        return None
