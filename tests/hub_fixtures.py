"""Fixtures for the Hub tests: a loopback FakeHub serving the tiny checkpoint and the replica.

Import into a test module with ``from hub_fixtures import *  # noqa: F403``.
The environment is pinned for the real huggingface_hub client: no telemetry, no proxy for
loopback, an empty HF_HOME, no ambient token.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub_server import FakeHub
from kimi_audit.constants import PINNED_REPO_ID, PINNED_REVISION

TINY_REPO = "test-org/tiny-kimi"
GATED_REPO = "test-org/gated-kimi"
GATED_TOKEN = "hf_TestGatedToken0123456789abcdef"
GATED_REPLICA_REPO = "test-org/gated-kimi-replica"
REPLICA_REPO = PINNED_REPO_ID
REPLICA_COMMIT = PINNED_REVISION


@pytest.fixture(scope="session")
def hub_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("hf_home")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    mp.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    mp.setenv("NO_PROXY", "127.0.0.1,localhost")
    mp.setenv("no_proxy", "127.0.0.1,localhost")
    mp.setenv("HF_HOME", str(home))
    mp.setenv("HF_HUB_CACHE", str(home / "hub"))
    mp.delenv("HF_TOKEN", raising=False)
    mp.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    mp.delenv("HF_HUB_OFFLINE", raising=False)
    # huggingface_hub reads these at import; keep its view consistent if it is already imported.
    import huggingface_hub.constants as hc

    mp.setattr(hc, "HF_HUB_OFFLINE", False)
    mp.setattr(hc, "HF_HOME", str(home))
    mp.setattr(hc, "HF_HUB_CACHE", str(home / "hub"))
    mp.setattr(hc, "HF_TOKEN_PATH", str(home / "token"))
    mp.setattr(hc, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    yield home
    mp.undo()


@pytest.fixture(scope="session")
def fake_hub(hub_env: Path, tiny_dir: Path, replica_dir: Path) -> Iterator[FakeHub]:
    hub = FakeHub()
    tiny = hub.add_repo(TINY_REPO, tiny_dir)
    tiny.branches["release"] = tiny.commit
    hub.add_repo(GATED_REPO, tiny_dir, token=GATED_TOKEN)
    hub.add_repo(GATED_REPLICA_REPO, replica_dir, token=GATED_TOKEN)
    hub.add_repo(REPLICA_REPO, replica_dir, commit=REPLICA_COMMIT)
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture
def hub(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The session hub with clean faults and counters, and HF_ENDPOINT pointing at it."""
    fake_hub.clear_faults()
    fake_hub.reset_stats()
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    yield fake_hub
    fake_hub.clear_faults()


def needed_bytes(directory: Path) -> int:
    """config.json + index + every shard's 8 + N header bytes: what a header-only audit must read."""
    total = (directory / "config.json").stat().st_size + (directory / "model.safetensors.index.json").stat().st_size
    for shard in directory.glob("*.safetensors"):
        with open(shard, "rb") as f:
            total += 8 + struct.unpack("<Q", f.read(8))[0]
    return total


def shard_count(directory: Path) -> int:
    return sum(1 for _ in directory.glob("*.safetensors"))
