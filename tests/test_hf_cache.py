"""The HF cache: `audit REPO[@REV]` offline reads the cached snapshot, and a snapshot path knows its commit.

The cache is written by huggingface_hub itself (`snapshot_download`, `hf_hub_download`) from the
loopback FakeHub, then offline mode is turned on the way a user does (HF_HUB_OFFLINE=1; huggingface_hub
reads it when imported, so its constant is set too) and the CLI must not touch the network.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hub_repos import TINY_REPO
from hub_server import FakeHub
from kimi_audit.cli import app
from kimi_audit.constants import PINNED_REPO_ID, PINNED_REVISION
from kimi_audit.sources import LocalSource, open_source
from kimi_audit.sources.cache import CacheMissError, find_snapshot, snapshot_of
from kimi_audit.sources.hub import HubSource

runner = CliRunner()
TINY_FOLDER = "models--test-org--tiny-kimi"


@pytest.fixture(scope="module")
def hf_cache(fake_hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache holding the tiny repo at main (refs/main) and its `release` branch (refs/release)."""
    from huggingface_hub import hf_hub_download, snapshot_download

    cache = tmp_path_factory.mktemp("hf_cache") / "hub"
    snapshot_download(TINY_REPO, cache_dir=cache, endpoint=fake_hub.endpoint)
    hf_hub_download(TINY_REPO, "config.json", revision="release", cache_dir=cache, endpoint=fake_hub.endpoint)
    return cache


@pytest.fixture
def commit(fake_hub: FakeHub) -> str:
    return fake_hub.repos[TINY_REPO].commit


def go_offline(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))


@pytest.fixture
def offline(hf_cache: Path, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Offline mode over the shared cache (do not modify it: use `offline_copy`); no request may reach the hub."""
    go_offline(monkeypatch, hf_cache)
    fake_hub.reset_stats()
    yield hf_cache
    assert not fake_hub.stats().records, "offline mode reached the network"


@pytest.fixture
def offline_copy(hf_cache: Path, fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    shutil.copytree(hf_cache, cache, symlinks=True)
    go_offline(monkeypatch, cache)
    return cache


def audit_json(*args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    r = runner.invoke(app, ["audit", *args, "--json", "--no-progress"])
    doc = json.loads(r.stdout) if r.stdout.strip() else {}
    return r.exit_code, doc, r.stderr


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


# --- REPO[@REV] offline -----------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["repo", "main", "release", "short", "full", "--revision"])
def test_offline_audit_of_a_repo_reads_the_cached_snapshot(offline: Path, commit: str, how: str) -> None:
    args = {
        "repo": [TINY_REPO],
        "main": [f"{TINY_REPO}@main"],
        "release": [f"{TINY_REPO}@release"],
        "short": [f"{TINY_REPO}@{commit[:7]}"],
        "full": [f"{TINY_REPO}@{commit}"],
        "--revision": [TINY_REPO, "--revision", commit[:10]],
    }[how]
    code, doc, err = audit_json(*args, "--expect-revision", commit[:12])
    assert code == 0, err
    assert doc["revision"] == commit
    assert doc["source"] == f"{TINY_REPO}@{commit} (HF cache)"
    assert doc["result"]["errors"] == 0


def test_the_cached_snapshot_is_huggingface_hubs(offline: Path, commit: str) -> None:
    from huggingface_hub import snapshot_download

    src = open_source(TINY_REPO)
    assert isinstance(src, LocalSource)
    assert src.root == Path(snapshot_download(TINY_REPO, local_files_only=True)) == (
        offline / TINY_FOLDER / "snapshots" / commit)


def test_online_a_repo_is_still_read_from_the_hub(hub: FakeHub, hf_cache: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(hf_cache))
    assert isinstance(open_source(TINY_REPO), HubSource)


def test_not_cached_exits_two_naming_the_cache(offline: Path) -> None:
    code, _, err = audit_json("test-org/never-downloaded")
    assert code == 2
    line = one_error_line(err)
    assert "test-org/never-downloaded@main: not in the HF cache at" in line
    assert str(offline) in line.replace("\n", "") and "HF_HUB_OFFLINE=1" in line


def test_an_uncached_revision_exits_two_listing_what_is_cached(offline: Path, commit: str) -> None:
    for rev in ("0123456789abcdef", "no-such-branch", "0" * 40):
        code, _, err = audit_json(f"{TINY_REPO}@{rev}")
        assert code == 2
        line = one_error_line(err)
        assert f"{TINY_REPO}@{rev}: no cached snapshot for this revision" in line
        assert commit[:12] in line and "main ->" in line and "HF_HUB_OFFLINE=1" in line


def test_the_default_repo_resolves_to_the_pinned_commit(tiny_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`audit` with no argument, offline: moonshotai/Kimi-K2-Instruct at the pinned commit, which needs no ref."""
    cache = tmp_path / "hub"
    snap = cache / "models--moonshotai--Kimi-K2-Instruct" / "snapshots" / PINNED_REVISION
    shutil.copytree(tiny_dir, snap)
    go_offline(monkeypatch, cache)
    code, doc, err = audit_json()
    assert code == 0, err
    assert (doc["revision"], doc["source"]) == (PINNED_REVISION, f"{PINNED_REPO_ID}@{PINNED_REVISION} (HF cache)")


def test_an_ambiguous_short_hash_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    for c in ("abcdef1" + "0" * 33, "abcdef1" + "1" * 33):
        shutil.copytree(tiny_dir, tmp_path / "models--o--n" / "snapshots" / c)
    assert find_snapshot("o/n", "abcdef10", tmp_path).commit == "abcdef1" + "0" * 33
    with pytest.raises(CacheMissError, match="matches 2 cached snapshots"):
        find_snapshot("o/n", "abcdef1", tmp_path)
    with pytest.raises(CacheMissError, match="not a Hub repo id"):
        find_snapshot("o/..", "main", tmp_path)


# --- partial snapshots ------------------------------------------------------------------------------

def test_a_partial_snapshot_is_audited_with_the_absent_shard(offline_copy: Path, commit: str) -> None:
    (offline_copy / TINY_FOLDER / "snapshots" / commit / "model-2-of-3.safetensors").unlink()
    code, doc, _ = audit_json(TINY_REPO)
    assert code == 1
    assert doc["revision"] == commit
    absent = [f for f in doc["findings"] if f["code"] == "INDEX_SHARD_ABSENT"]
    assert [f["shard"] for f in absent] == ["model-2-of-3.safetensors"]


def test_a_snapshot_without_config_exits_two(offline_copy: Path, commit: str) -> None:
    snap = offline_copy / TINY_FOLDER / "snapshots" / commit
    blob = Path(os.path.realpath(snap / "config.json"))
    blob.unlink()  # the link is left dangling, as after a blob was removed by hand
    code, _, err = audit_json(f"{TINY_REPO}@main")
    assert code == 2
    line = one_error_line(err)
    assert "has no config.json" in line and "HF_HUB_OFFLINE=1" in line


# --- a path inside a snapshot -----------------------------------------------------------------------

def test_a_snapshot_path_reports_its_commit(hf_cache: Path, commit: str) -> None:
    snap = hf_cache / TINY_FOLDER / "snapshots" / commit
    code, doc, err = audit_json(str(snap), "--expect-revision", commit[:12])
    assert code == 0, err
    assert doc["revision"] == commit and TINY_REPO in doc["source"]
    code, doc, _ = audit_json(str(snap), "--expect-revision", "0123456789ab")
    assert code == 1
    gate = [f for f in doc["findings"] if f["code"] == "REVISION_GATE"]
    assert len(gate) == 1 and gate[0]["actual"] == commit


def test_a_file_or_folder_inside_a_snapshot_reports_its_commit(offline_copy: Path, commit: str) -> None:
    repo = offline_copy / TINY_FOLDER
    snap = repo / "snapshots" / commit
    shard = snap / "model-1-of-3.safetensors"
    assert shard.is_symlink()  # into ../../blobs
    assert LocalSource(shard).revision == commit
    assert LocalSource(snap).revision == commit
    # a folder in the snapshot whose files link into the repo's blobs (../../../blobs)
    sub = snap / "sub"
    sub.mkdir()
    (sub / "config.json").symlink_to(Path("../../..") / os.path.relpath(os.path.realpath(snap / "config.json"), repo))
    src = LocalSource(sub)
    assert src.revision == commit and snapshot_of(sub) == (TINY_REPO, commit, snap.resolve())
    assert src.outside_links() == () and src.exists("config.json")


def test_a_plain_directory_has_no_revision(tiny_dir: Path) -> None:
    assert LocalSource(tiny_dir).revision is None and snapshot_of(tiny_dir) is None
