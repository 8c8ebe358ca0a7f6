"""The remote audit over the loopback FakeHub: same report as local, the request/byte budget, faults."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hub_repos import GATED_REPO, GATED_TOKEN, REPLICA_COMMIT, REPLICA_REPO, TINY_REPO, needed_bytes, shard_count
from hub_server import FakeHub
from kimi_audit.checks.audit import audit_source
from kimi_audit.cli import app
from kimi_audit.report.json_report import report_dict
from kimi_audit.sources.hub import HubError, HubSource, HubTimeoutError
from kimi_audit.sources.local import LocalSource

runner = CliRunner()


def _without_source(report: object) -> dict:
    d = report_dict(report)  # type: ignore[arg-type]
    d.pop("source", None)
    d.pop("revision", None)
    return d


@pytest.mark.usefixtures("replica_hub")
def test_remote_audit_equals_local_within_budget(hub: FakeHub, replica_dir: Path) -> None:
    """Counted from the source's construction: the API call, and config.json read beside it."""
    src = HubSource(REPLICA_REPO, endpoint=hub.endpoint)
    remote = audit_source(src)
    st = hub.stats()
    local = audit_source(LocalSource(replica_dir))
    assert remote.revision == REPLICA_COMMIT
    assert _without_source(remote) == _without_source(local)
    assert remote.errors == 0
    shards = shard_count(replica_dir)
    need = needed_bytes(replica_dir)
    header_requests = [r for r in st.records if r.path.endswith(".safetensors")]
    assert len(header_requests) == shards, "exactly one header request per shard"
    assert all(r.status == 206 for r in header_requests)
    assert st.requests <= shards + 3, [r.path for r in st.records if not r.path.endswith(".safetensors")]
    assert need <= st.bytes_sent <= 1.02 * need, (st.bytes_sent, need)


def test_remote_audit_of_tiny_checkpoint_and_short_revision(hub: FakeHub, tiny_dir: Path) -> None:
    commit = hub.repos[TINY_REPO].commit
    result = runner.invoke(app, ["audit", f"{TINY_REPO}@{commit[:8]}", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["revision"] == commit  # the short hash is reported resolved
    local = json.loads(json.dumps(_without_source(audit_source(LocalSource(tiny_dir)))))
    assert {k: v for k, v in data.items() if k not in ("source", "revision")} == local
    result = runner.invoke(app, ["audit", TINY_REPO, "--revision", "release", "--json", "--no-progress"])
    assert result.exit_code == 0 and json.loads(result.stdout)["revision"] == commit


@pytest.mark.usefixtures("replica_hub")
def test_cli_default_target_is_the_pinned_commit(hub: FakeHub) -> None:
    result = runner.invoke(app, ["audit", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["revision"] == REPLICA_COMMIT and REPLICA_REPO in data["source"]
    assert any(r.path == f"/api/models/{REPLICA_REPO}/revision/{REPLICA_COMMIT}" for r in hub.stats().records)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["audit", "test-org/no-such-repo"], "not found"),
        (["audit", TINY_REPO, "--revision", "no-such-branch"], "no-such-branch"),
        (["audit", f"{TINY_REPO}@deadbeef"], "not found"),
        (["audit", GATED_REPO], "gated"),
    ],
)
def test_cli_unusable_remote_is_one_line_exit_2(hub: FakeHub, args: list[str], words: str) -> None:
    result = runner.invoke(app, [*args, "--no-progress"])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error:") and words in err and "\n" not in err, err
    assert "Traceback" not in result.output and result.stdout == ""


def test_cli_gated_repo_token_never_printed(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = "hf_WrongButSecretTokenValue0000000000"
    monkeypatch.setenv("HF_TOKEN", wrong)
    result = runner.invoke(app, ["audit", GATED_REPO, "--no-progress"])
    assert result.exit_code == 2 and "gated" in result.stderr
    assert wrong not in result.output and wrong not in result.stderr
    monkeypatch.setenv("HF_TOKEN", GATED_TOKEN)
    result = runner.invoke(app, ["audit", GATED_REPO, "--json", "--no-progress"])
    assert result.exit_code in (0, 1), result.output
    assert GATED_TOKEN not in result.output and GATED_TOKEN not in result.stderr
    assert json.loads(result.stdout)["revision"] == hub.repos[GATED_REPO].commit


@pytest.mark.usefixtures("replica_hub")
def test_range_ignoring_server_stops_the_audit_and_reads_little(hub: FakeHub, replica_dir: Path) -> None:
    total = sum(p.stat().st_size for p in replica_dir.glob("*.safetensors"))
    hub.add_fault("ignore_range", times=1000, match=".safetensors")
    hub.reset_stats()
    result = runner.invoke(app, ["audit", REPLICA_REPO, "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "ignored the Range request" in result.stderr and "\n" not in result.stderr.strip()
    time.sleep(0.5)  # let the server threads see the hang-ups
    st = hub.stats()
    assert st.bytes_sent < 300 << 20, f"{st.bytes_sent:,} bytes sent of a {total:,}-byte checkpoint"
    ignored = [r for r in st.records if r.range is not None and r.status == 200]
    assert len(ignored) == 1, st.records  # the first whole-file answer stops it, not retried


@pytest.mark.usefixtures("replica_hub")
def test_stalled_server_stops_the_audit_with_a_timeout(hub: FakeHub, replica_dir: Path) -> None:
    src = HubSource(REPLICA_REPO, endpoint=hub.endpoint, timeout=0.5, max_retries=0)
    stall = hub.add_fault("stall", times=1000, match=".safetensors", stall_s=30)
    with pytest.raises(HubTimeoutError) as e:
        audit_source(src)
    assert "timed out after 0.5 s" in str(e.value)
    # The first timeout ends the audit: at most the reads already in flight were made, not one per shard.
    assert 1 <= 1000 - stall.times <= src.parallel_reads, 1000 - stall.times


@pytest.mark.usefixtures("replica_hub")
def test_transient_faults_during_audit_are_absorbed(hub: FakeHub, replica_dir: Path) -> None:
    src = HubSource(REPLICA_REPO, endpoint=hub.endpoint, retry_wait=0.05)
    hub.add_fault("500", times=3, match=".safetensors")
    hub.add_fault("truncate", times=2, match=".safetensors")
    report = audit_source(src)
    assert report.errors == 0
    assert _without_source(report) == _without_source(audit_source(LocalSource(replica_dir)))


def test_audit_revision_pinned_in_every_request(hub: FakeHub) -> None:
    """Reads name the resolved commit, never the branch: a moving branch cannot mix commits."""
    commit = hub.repos[TINY_REPO].commit
    audit_source(HubSource(TINY_REPO, "main", endpoint=hub.endpoint))
    resolve = [r.path for r in hub.stats().records if "/resolve/" in r.path]
    assert resolve and all(f"/resolve/{commit}/" in p for p in resolve)


@pytest.mark.usefixtures("replica_hub")
def test_read_tensor_by_range_over_the_hub(hub: FakeHub, replica_dir: Path) -> None:
    from kimi_audit.numerics.tensor_io import TensorFetcher

    remote = TensorFetcher(HubSource(REPLICA_REPO, endpoint=hub.endpoint))
    local = TensorFetcher(LocalSource(replica_dir))
    for name in ("model.layers.3.self_attn.q_a_layernorm.weight", "model.layers.0.self_attn.q_a_proj.weight"):
        hub.reset_stats()
        got, info, shard = remote.read(name)
        if name.endswith("layernorm.weight"):
            want, _, _ = local.read(name)
            assert got.tobytes() == want.tobytes() and got.shape == want.shape
        else:  # a big weight is a hole in the replica: the local reader refuses it, the file's bytes decide
            start = local.header(shard).data_start + info.begin
            with open(replica_dir / shard, "rb") as f:
                f.seek(start)
                assert got.tobytes() == f.read(info.nbytes)
        data_reqs = [r for r in hub.stats().records if r.path.endswith(shard) and r.range != "bytes=0-7"]
        # the header (first read) and then exactly one ranged read of the tensor's own bytes
        tensor_reqs = [r for r in data_reqs if r.bytes_sent == info.nbytes]
        assert len(tensor_reqs) == 1, [(r.range, r.bytes_sent) for r in data_reqs]
        assert hub.stats().bytes_sent < info.nbytes + (20 << 20)  # tensor + index + header, nothing more


def test_remote_checkpoint_without_config_is_a_one_line_error_while_the_index_loads(
    hub: FakeHub, tiny_dir: Path, tmp_path: Path
) -> None:
    """config.json and the index are fetched side by side: the missing config still decides, cleanly."""
    import shutil

    copy = tmp_path / "noconfig"
    shutil.copytree(tiny_dir, copy)
    (copy / "config.json").unlink()
    hub.add_repo("someone/no-config", copy)
    result = runner.invoke(app, ["audit", "someone/no-config", "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "no config.json" in result.stderr and "\n" not in result.stderr.strip()


def test_remote_index_that_keeps_failing_is_a_one_line_error(hub: FakeHub, tiny_dir: Path) -> None:
    hub.add_fault("500", times=1000, match="index.json")
    src = HubSource(TINY_REPO, endpoint=hub.endpoint, retry_wait=0.01, max_retries=1)
    with pytest.raises(HubError) as e:
        audit_source(src)
    assert "model.safetensors.index.json" in str(e.value) and "HTTP 500" in str(e.value)


def test_the_hubs_parameter_count_is_a_reference(hub: FakeHub, tiny_dir: Path) -> None:
    """Issue 33: on a Hub source the model info's `safetensors.total` (the loopback Hub computes it from the shard
    headers by the Hub's own rule, independently of the tool) is compared with the files: silent where the rule
    explains it, one HUB_PARAMETERS warning where the Hub counted something else."""
    import dataclasses

    from hub_repos import TINY_REPO
    from kimi_audit.api import audit
    from kimi_audit.sources.hub import HubSource

    src = HubSource(TINY_REPO, endpoint=hub.endpoint)
    assert src.reported_parameters() == hub.safetensors_total(hub.repos[TINY_REPO]) > 0
    report = audit(TINY_REPO)
    assert "HUB_PARAMETERS" not in {f.code for f in report.findings}
    repo = hub.repos[TINY_REPO]
    hub.repos[TINY_REPO] = dataclasses.replace(repo, hub_total=src.reported_parameters() + 12)
    try:
        report = audit(TINY_REPO)
    finally:
        hub.repos[TINY_REPO] = repo
    (f,) = [f for f in report.findings if f.code == "HUB_PARAMETERS"]
    assert f.severity.value == "warning" and f.actual == f.expected + 12 and report.exit_code() == 0
    assert f"logical count is {report.stats.parameters:,}" in f.message  # the rotary buffers: stored, not params
