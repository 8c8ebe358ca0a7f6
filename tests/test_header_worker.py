"""The header worker: a second process reads a share of a remote checkpoint's headers.

Its results must be exactly what the parent would have read, with the same requests; a worker that
cannot start, dies or sends garbage leaves its shards to the parent; Hub errors still stop the audit.
"""

from __future__ import annotations

import pickle
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hub_fixtures import *  # noqa: F403
from hub_fixtures import GATED_REPLICA_REPO, GATED_TOKEN, REPLICA_REPO
from hub_server import FakeHub

from kimi_audit import checkpoint
from kimi_audit.audit import audit_checkpoint
from kimi_audit.checkpoint import load_checkpoint
from kimi_audit.header_worker import DISABLE_ENV, HeaderWorker, WorkerFailed, _ResultUnpickler, _read
from kimi_audit.sources.hub import HubSource


class _Recording(HeaderWorker):
    """The real worker, noting what it returned."""

    returned: list[int] = []

    def results(self) -> tuple[dict, dict]:
        got = super().results()
        _Recording.returned.append(len(got[0]))
        return got


def _shards(directory: Path) -> list[str]:
    return sorted((p.name for p in directory.glob("*.safetensors")), key=lambda n: int(n.split("-")[1]))


def _load(hub: FakeHub, progress=None):
    hub.reset_stats()
    ckpt = load_checkpoint(HubSource(REPLICA_REPO, endpoint=hub.endpoint), progress)
    st = hub.stats()
    return ckpt, sorted((r.path, r.status) for r in st.records), st.bytes_sent


@pytest.fixture
def in_process(hub: FakeHub, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(DISABLE_ENV, "0")
    ckpt, requests, sent = _load(hub)
    monkeypatch.delenv(DISABLE_ENV)
    return ckpt, requests, sent


def test_worker_reads_half_the_shards_exactly_as_the_parent_would(
    hub: FakeHub, in_process, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "HeaderWorker", _Recording)
    _Recording.returned = []
    calls: list[tuple[str, int, int]] = []
    ckpt, requests, sent = _load(hub, lambda shard, done, total: calls.append((shard, done, total)))
    base, base_requests, base_sent = in_process
    assert _Recording.returned == [len(checkpoint.worker_share(list(base.headers)))] and 0 < _Recording.returned[0] < 61
    assert ckpt.headers == base.headers and list(ckpt.headers) == list(base.headers)
    assert ckpt.findings == base.findings
    # each shard aligned with the layout where it was parsed, the worker's as the parent's
    assert set(base.alignments) == set(base.headers) and ckpt.alignments == base.alignments
    assert audit_checkpoint(ckpt) == audit_checkpoint(replace(ckpt, alignments={}))
    assert (requests, sent) == (base_requests, base_sent), "no request more or less than in one process"
    assert sorted(s for s, _, _ in calls) == sorted(base.headers)
    assert [d for _, d, _ in calls] == list(range(1, len(base.headers) + 1))


@pytest.mark.parametrize("command", [
    ("/nonexistent/python",),  # cannot start
    (sys.executable, "-c", "import sys; sys.stdin.buffer.read(); sys.exit(3)"),  # dies without a word
    (sys.executable, "-c", "import sys; sys.exit(3)"),  # dies before it reads its job
    (sys.executable, "-c", "import sys; sys.stdin.buffer.read(); sys.stdout.buffer.write(b'\\xff' * 8)"),  # garbage
    (sys.executable, "-c", "import sys, pickle, struct; sys.stdin.buffer.read(); "
                           "b = pickle.dumps(('results', ({'model-3-of-61.safetensors': 'skipped'}, {}))); "
                           "sys.stdout.buffer.write(struct.pack('<Q', len(b)) + b)"),  # answers for one shard only
])
def test_a_failing_worker_leaves_its_shards_to_the_parent(
    hub: FakeHub, in_process, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:
    monkeypatch.setattr(HeaderWorker, "command", command)
    ckpt, requests, sent = _load(hub)
    base, base_requests, base_sent = in_process
    if "'skipped'" in command[-1]:  # what the worker said about a shard stands; the rest is read here
        assert set(base.headers) - set(ckpt.headers) == {"model-3-of-61.safetensors"}
        assert any(f.code == "CHECKPOINT_TOO_LARGE" for f in ckpt.findings)
        return
    assert ckpt.headers == base.headers and ckpt.findings == base.findings
    assert (requests, sent) == (base_requests, base_sent)


def test_results_hold_only_this_packages_result_classes(tmp_path: Path) -> None:
    import io
    import os
    import struct

    for payload in (os.system, ("results", {"x": pickle.loads(pickle.dumps(Path("a")))})):
        blob = pickle.dumps(payload)
        with pytest.raises(WorkerFailed, match="not a result"):
            _read(io.BytesIO(struct.pack("<Q", len(blob)) + blob), _ResultUnpickler)


def test_the_total_header_budget_holds_across_both_processes(
    hub: FakeHub, replica_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import struct

    lengths = []
    for shard in sorted(replica_dir.glob("*.safetensors")):
        with open(shard, "rb") as f:
            lengths.append(struct.unpack("<Q", f.read(8))[0])
    monkeypatch.setattr(checkpoint, "MAX_TOTAL_HEADER_BYTES", 10 * max(lengths))  # about 10 of 61 headers
    monkeypatch.setattr(checkpoint, "HeaderWorker", _Recording)
    _Recording.returned = []
    ckpt, _, _ = _load(hub)
    too_large = [f for f in ckpt.findings if f.code == "CHECKPOINT_TOO_LARGE"]
    assert _Recording.returned == [len(checkpoint.worker_share(_shards(replica_dir)))], \
        "the worker answered for its whole share, read or skipped"
    assert len(too_large) == 1 and too_large[0].actual == 61 - len(ckpt.headers)
    # Each process stops past its half of the budget; beyond it are at most the reads then in flight,
    # one per thread (16 in all).
    read = sum(h.header_len for h in ckpt.headers.values())
    assert 10 * max(lengths) <= read <= (10 + 16) * max(lengths), (read, len(ckpt.headers))


def test_a_hub_error_the_worker_meets_stops_the_audit(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from kimi_audit.sources.hub import RangeNotSupportedError

    monkeypatch.setattr(checkpoint, "HeaderWorker", _Recording)
    _Recording.returned = []
    hub.add_fault("ignore_range", times=1000, match="model-3-of-61.safetensors")  # the worker's first shard
    with pytest.raises(RangeNotSupportedError, match="model-3-of-61.safetensors: .* ignored the Range request"):
        load_checkpoint(HubSource(REPLICA_REPO, endpoint=hub.endpoint))
    assert _Recording.returned == [], "raised from the worker's answer, not read again here"


def test_the_worker_reads_a_gated_repo_with_the_token_the_parent_was_given(
    hub: FakeHub, replica_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "HeaderWorker", _Recording)
    _Recording.returned = []
    ckpt = load_checkpoint(HubSource(GATED_REPLICA_REPO, endpoint=hub.endpoint, token=GATED_TOKEN))
    assert _Recording.returned == [len(checkpoint.worker_share(_shards(replica_dir)))]
    assert len(ckpt.headers) == 61 and not [f for f in ckpt.findings if f.severity.value == "error"]


def test_a_kimi_audit_folder_in_the_working_directory_does_not_stand_in_for_the_worker(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "kimi_audit"
    fake.mkdir()
    marker = tmp_path / "ran"
    (fake / "__init__.py").write_text("")
    (fake / "header_worker.py").write_text(f"open({str(marker)!r}, 'w').write('impostor')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checkpoint, "HeaderWorker", _Recording)
    _Recording.returned = []
    ckpt, _, _ = _load(hub)
    assert not marker.exists(), "the worker ran code from the working directory"
    assert _Recording.returned and len(ckpt.headers) == 61


def test_the_job_is_sent_without_holding_up_the_parent(
    hub: FakeHub, in_process, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job (megabytes: the names the index lists and the layout's columns) is more than a pipe
    holds; the parent goes on with its own share while a thread writes it."""
    monkeypatch.setattr(HeaderWorker, "command", (sys.executable, "-c", "import time; time.sleep(3)"))
    alive_after_submit: list[bool] = []
    submit = HeaderWorker.submit

    def watched(self, *args, **kwargs):
        submit(self, *args, **kwargs)
        alive_after_submit.append(self._proc.poll() is None)

    monkeypatch.setattr(HeaderWorker, "submit", watched)
    ckpt, requests, sent = _load(hub)
    base, base_requests, base_sent = in_process
    assert alive_after_submit == [True], "submit returned only once the worker, which reads nothing, was gone"
    assert ckpt.headers == base.headers and (requests, sent) == (base_requests, base_sent)
