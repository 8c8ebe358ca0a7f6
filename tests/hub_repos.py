"""The repositories the loopback FakeHub serves in the tests (fixtures `hub`, `replica_hub`: conftest.py), and
what a header-only read of a checkpoint directory must fetch."""

from __future__ import annotations

import struct
from pathlib import Path

from kimi_audit.constants import PINNED_REPO_ID, PINNED_REVISION

TINY_REPO = "test-org/tiny-kimi"
GATED_REPO = "test-org/gated-kimi"
GATED_TOKEN = "hf_TestGatedToken0123456789abcdef"
REPLICA_REPO = PINNED_REPO_ID
REPLICA_COMMIT = PINNED_REVISION
REPLICA_REPOS = (REPLICA_REPO,)
"""Served only to the tests that request `replica_hub` (and so the full-scale replica)."""


def needed_bytes(directory: Path) -> int:
    """config.json + index + every shard's 8 + N header bytes: what a header-only audit must read."""
    total = (directory / "config.json").stat().st_size + (directory / "model.safetensors.index.json").stat().st_size
    for shard in directory.glob("*.safetensors"):
        with open(shard, "rb") as f:
            total += 8 + struct.unpack("<Q", f.read(8))[0]
    return total


def shard_count(directory: Path) -> int:
    return sum(1 for _ in directory.glob("*.safetensors"))
