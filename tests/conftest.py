"""Shared fixtures: generated checkpoints (nothing large is committed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kimi_audit.model.replica import build_replica
from shard_builder import sparse_copy
from tiny_checkpoint import build_tiny

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pristine tiny real checkpoint. Do not modify: use `tiny_copy`."""
    return build_tiny(tmp_path_factory.mktemp("tiny") / "ckpt")


@pytest.fixture
def tiny_copy(tiny_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, dst)
    return dst


@pytest.fixture(scope="session")
def replica_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The full-scale sparse header replica of Kimi-K2-Instruct. Do not modify: use `replica_copy`."""
    return build_replica(tmp_path_factory.mktemp("replica") / "kimi-k2")


@pytest.fixture
def replica_copy(replica_dir: Path, tmp_path: Path) -> Path:
    """A copy of the replica whose shards are hard links: replace a shard file (write a new one and
    os.replace it), never write into one in place."""
    return sparse_copy(replica_dir, tmp_path / "kimi-k2")
