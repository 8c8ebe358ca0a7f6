"""Shared fixtures: generated checkpoints (nothing large is committed) and the loopback Hub.

Full-scale replicas (~270 MB on disk and a few seconds to write each) are built once per session, each by
its own session fixture (REPLICA_FIXTURES); a test that changes one works on a sparse copy (`replica_copy`:
hard links, a shard replaced, never written into). Every test that uses one of those fixtures, directly or
through another fixture, is marked `slow` at collection; a test that builds a full-scale replica itself
(build_replica, the `demo` command) fails unless it carries the marker.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kimi_audit.replica.build as replica_build
from hub_repos import (
    GATED_REPO,
    GATED_TOKEN,
    REPLICA_COMMIT,
    REPLICA_REPO,
    REPLICA_REPOS,
    TINY_REPO,
)
from hub_server import FakeHub
from shard_builder import sparse_copy
from tiny_checkpoint import build_tiny

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

# --- full-scale replicas: built once, marked slow --------------------------------------------------------------

REPLICA_FIXTURES = {"replica_dir", "family_replica"}
"""The session fixtures that build a full-scale replica: a test that uses one (even through another fixture)
is marked `slow`."""

BUILDS: list[str] = []
"""One entry per full-scale replica built in this process (see the terminal summary)."""

_build_replica = replica_build.build_replica


def _counted_build_replica(directory: str | os.PathLike[str], **kw: Any) -> Path:
    BUILDS.append(str(kw.get("model", replica_build.DEFAULT_MODEL)))
    return _build_replica(directory, **kw)


# Every caller (the fixtures, `demo`, a test) looks build_replica up in its module after this: each build counts.
replica_build.build_replica = _counted_build_replica  # type: ignore[assignment]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if REPLICA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _fail_unmarked_builds(item: pytest.Item, before: int) -> None:
    if len(BUILDS) > before and item.get_closest_marker("slow") is None:
        pytest.fail(f"{item.nodeid} builds a full-scale replica ({', '.join(BUILDS[before:])}): mark it "
                    "`slow`, or use a replica fixture (conftest.REPLICA_FIXTURES)", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    before = len(BUILDS)
    yield
    _fail_unmarked_builds(item, before)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    before = len(BUILDS)
    made = _temp_folders(item.config)
    try:
        yield
    finally:
        CALL_FOLDERS[item.nodeid] = _temp_folders(item.config) - made
    _fail_unmarked_builds(item, before)


# --- temporary folders: a red run keeps the failed tests' own, not the session's replicas -------------------------

SESSION_FOLDERS: set[Path] = set()
"""Folders the session fixtures made (replicas, the tiny checkpoint): never kept, a red run or not."""

CALL_FOLDERS: dict[str, set[Path]] = {}
"""nodeid -> the folders of pytest's base temporary folder its call made (its own tmp_path_factory.mktemp)."""

KEEP: set[Path] = set()
"""A failed test's tmp_path and the folders its call made: what a red run leaves behind."""


def _temp_folders(config: pytest.Config) -> set[Path]:
    basetemp = config._tmp_path_factory._basetemp  # type: ignore[attr-defined]
    return set(basetemp.iterdir()) if basetemp is not None and basetemp.is_dir() else set()


def session_folder(factory: pytest.TempPathFactory, name: str) -> Path:
    """factory.mktemp(name), removed at the end of the session whatever its result."""
    path = factory.mktemp(name)
    SESSION_FOLDERS.add(path)
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report = yield
    if report.failed:
        tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
        KEEP.update([tmp_path] if isinstance(tmp_path, Path) else [])
        KEEP.update(CALL_FOLDERS.get(item.nodeid, ()))
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """pytest's `tmp_path_retention_policy = "failed"` keeps the whole base folder of a red run: every session
    and module fixture's folder beside the failed test's (the full-scale replicas: 2.7 GB). Keep only what a
    failed test made itself (its tmp_path, its own mktemp folders); with --basetemp, pytest's rules alone."""
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its replica count goes to the controller
        session.config.workeroutput["replicas"] = len(BUILDS)
    factory = session.config._tmp_path_factory  # type: ignore[attr-defined]
    if factory._given_basetemp is not None or factory._retention_policy != "failed":
        return
    for path in _temp_folders(session.config):
        if path.is_dir() and not path.is_symlink() and (path not in KEEP or path in SESSION_FOLDERS):
            shutil.rmtree(path, ignore_errors=True)


WORKER_BUILDS: list[int] = []
"""Under pytest-xdist (README's command runs `-n 2`): the replicas each worker built, sent back at its end."""


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    WORKER_BUILDS.append(int(getattr(node, "workeroutput", {}).get("replicas", 0)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    workers = f" (by {len(WORKER_BUILDS)} workers)" if WORKER_BUILDS else ""
    terminalreporter.write_line(f"full-scale replicas built in this session: {len(BUILDS) + sum(WORKER_BUILDS)}"
                                f"{workers}")


@pytest.fixture(scope="session")
def replica_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The full-scale sparse header replica of Kimi-K2-Instruct. Do not modify: use `replica_copy`."""
    return replica_build.build_replica(session_folder(tmp_path_factory, "replica") / "kimi-k2")


@pytest.fixture
def replica_copy(replica_dir: Path, tmp_path: Path) -> Path:
    """A copy of the replica whose shards are hard links: replace a shard file (write a new one and
    os.replace it, as replica.build.write_shard does), never write into one in place."""
    return sparse_copy(replica_dir, tmp_path / "kimi-k2")


@pytest.fixture(scope="session")
def family_replica(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """model (a REPLICA_MODELS name) -> its full-scale replica, built once per session on first use.
    Do not modify: copy with shard_builder.sparse_copy."""
    built: dict[str, Path] = {}

    def get(model: str) -> Path:
        if model not in built:
            built[model] = replica_build.build_replica(session_folder(tmp_path_factory, "family") / model,
                                                       model=model)
        return built[model]

    return get


# --- small checkpoints ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pristine tiny real checkpoint. Do not modify: use `tiny_copy`."""
    return build_tiny(session_folder(tmp_path_factory, "tiny") / "ckpt")


@pytest.fixture
def tiny_copy(tiny_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, dst)
    return dst


# --- the loopback Hub (tests/hub_server.py; its repositories: tests/hub_repos.py) ----------------------------------


@pytest.fixture(scope="session")
def hub_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The environment pinned for the real huggingface_hub client: no telemetry, no proxy for loopback, an
    empty HF_HOME, no ambient token."""
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
def fake_hub(hub_env: Path, tiny_dir: Path) -> Iterator[FakeHub]:
    """The session's FakeHub, serving the tiny checkpoint (TINY_REPO, gated GATED_REPO); the full-scale replica
    only to the tests that ask for it (`replica_hub`)."""
    hub = FakeHub()
    tiny = hub.add_repo(TINY_REPO, tiny_dir)
    tiny.branches["release"] = tiny.commit
    hub.add_repo(GATED_REPO, tiny_dir, token=GATED_TOKEN)
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture
def hub(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The session hub with clean faults and counters, and HF_ENDPOINT pointing at it. It does not serve the
    replica repositories (REPLICA_REPOS): a test that reads them asks for `replica_hub`."""
    for repo_id in REPLICA_REPOS:
        fake_hub.repos.pop(repo_id, None)
    fake_hub.clear_faults()
    fake_hub.reset_stats()
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    yield fake_hub
    fake_hub.clear_faults()


@pytest.fixture
def replica_hub(hub: FakeHub, replica_dir: Path) -> FakeHub:
    """`hub`, also serving the full-scale replica as REPLICA_REPO at REPLICA_COMMIT (the pinned default target)."""
    hub.add_repo(REPLICA_REPO, replica_dir, commit=REPLICA_COMMIT)
    return hub


@pytest.fixture(scope="module")
def quiet_transformers() -> Iterator[None]:
    """No progress bars and no load reports from transformers on the test output (a test reads them from
    loading_info); the modules that build transformers models use it for all their tests (pytestmark)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    yield
    hf_logging.enable_progress_bar()
    hf_logging.set_verbosity(verbosity)


@pytest.fixture
def ray_alone(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Ray's "auto" with no cluster to find: it connects to any Ray on the host (its processes, /tmp/ray), so both
    are hidden (no Ray process found, a RAY_TMPDIR of the test's own), and another Ray beside the suite does not
    decide the answer."""
    services = pytest.importorskip("ray._private.services", reason="Ray is in the test extra: pip install -e '.[test]'")

    def no_ray_processes() -> list[str]:
        return []

    no_ray_processes.cache_clear = lambda: None  # type: ignore[attr-defined]  # as Ray's own has
    monkeypatch.setattr(services, "find_gcs_addresses", no_ray_processes)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path_factory.mktemp("ray")))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
