"""`kimi-audit download` over the loopback FakeHub with the real huggingface_hub client."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hub_repos import GATED_REPO, REPLICA_COMMIT, REPLICA_REPO, TINY_REPO, needed_bytes, shard_count
from hub_server import FakeHub
from kimi_audit.checks.audit import audit_source
from kimi_audit.cli import app
from kimi_audit.download.hub import download, select_files, verify_files
from kimi_audit.report.json_report import report_dict
from kimi_audit.sources.hub import HubSource
from kimi_audit.sources.local import LocalSource

runner = CliRunner()


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def test_full_download_to_local_dir_with_verify(hub: FakeHub, tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "dl"
    result = runner.invoke(app, ["download", TINY_REPO, "--local-dir", str(out), "--verify"])
    assert result.exit_code == 0, result.output
    assert _files(out) == _files(tiny_dir)
    shards = [n for n in _files(tiny_dir) if n.endswith(".safetensors")]
    assert f"verified {len(shards)} files" in result.stdout
    assert hub.repos[TINY_REPO].commit in result.stdout


def test_download_into_the_cache_with_include(hub: FakeHub, tiny_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    res = download(TINY_REPO, cache_dir=cache, include=["*.json"], endpoint=hub.endpoint)
    commit = hub.repos[TINY_REPO].commit
    assert res.path == cache / "models--test-org--tiny-kimi" / "snapshots" / commit
    assert sorted(p.name for p in res.path.iterdir()) == sorted(n for n in _files(tiny_dir) if n.endswith(".json"))
    assert (cache / "models--test-org--tiny-kimi" / "refs").exists() or res.path.exists()
    # again: everything is in the cache, no file body is fetched a second time
    hub.reset_stats()
    download(TINY_REPO, cache_dir=cache, include=["*.json"], endpoint=hub.endpoint)
    assert not [r for r in hub.stats().records if r.method == "GET" and "/resolve/" in r.path]


def test_interrupted_download_resumes(hub: FakeHub, tmp_path: Path) -> None:
    """A body that breaks off after 10 MB (huggingface_hub's write chunk) resumes with a Range request."""
    import os

    repo_dir = tmp_path / "repo"
    repo_dir.mkdir()
    big = os.urandom(24 << 20)
    (repo_dir / "big.safetensors").write_bytes(big)
    (repo_dir / "config.json").write_text("{}")
    hub.add_repo("test-org/big-file", repo_dir)
    hub.add_fault("truncate", times=1, match="big.safetensors", method="GET", keep_fraction=0.6)
    out = tmp_path / "dl"
    try:
        res = download("test-org/big-file", local_dir=out, endpoint=hub.endpoint, verify=True)
    finally:
        hub.repos.pop("test-org/big-file")
    assert (out / "big.safetensors").read_bytes() == big and res.verify_ok
    gets = [r for r in hub.stats().records if r.method == "GET" and r.path.endswith("big.safetensors")]
    assert len(gets) == 2 and gets[0].range is None
    assert gets[1].status == 206 and gets[1].range is not None
    resumed_at = int(gets[1].range.split("=")[1].split("-")[0])
    assert 0 < resumed_at <= gets[0].bytes_sent, "resumed where the broken transfer left off, not from 0"
    assert gets[1].bytes_sent == len(big) - resumed_at


def test_verify_reports_a_tampered_file(hub: FakeHub, tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "dl"
    res = download(TINY_REPO, local_dir=out, endpoint=hub.endpoint, verify=True)
    assert res.verified and res.verify_ok
    shard = res.verified[0].name
    raw = bytearray((out / shard).read_bytes())
    raw[-1] ^= 0xFF
    (out / shard).write_bytes(bytes(raw))
    src = HubSource(TINY_REPO, endpoint=hub.endpoint)
    checked = {v.name: v for v in verify_files(src, out, select_files(src.list_files(), None))}
    assert not checked[shard].ok and checked[shard].actual == hashlib.sha256(bytes(raw)).hexdigest()
    assert checked[shard].expected == hashlib.sha256((tiny_dir / shard).read_bytes()).hexdigest()
    assert all(v.ok for n, v in checked.items() if n != shard)


@pytest.mark.usefixtures("replica_hub")
def test_headers_only_replica_audits_offline(hub: FakeHub, replica_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "headers"
    hub.reset_stats()
    result = runner.invoke(app, ["download", REPLICA_REPO, "--headers-only", "--local-dir", str(out)])
    assert result.exit_code == 0, result.output
    st = hub.stats()
    shards = shard_count(replica_dir)
    assert REPLICA_COMMIT in result.stdout and f"{shards} shard headers written" in result.stdout
    # budget: one API call, config + index, one request per shard
    assert st.requests <= shards + 3
    assert st.bytes_sent <= 1.02 * needed_bytes(replica_dir)
    for p in replica_dir.glob("*.safetensors"):
        q = out / p.name
        assert q.stat().st_size == p.stat().st_size
        assert q.stat().st_blocks * 512 < 4 << 20, "sparse: only the header is on disk"
    assert not list(out.glob(".*partial"))
    local = report_dict(audit_source(LocalSource(out)))
    want = report_dict(audit_source(LocalSource(replica_dir)))
    for d in (local, want):
        d.pop("source")
    assert local == want
    # resume: a second run finds every shard complete and fetches no header
    hub.reset_stats()
    result = runner.invoke(app, ["download", REPLICA_REPO, "--headers-only", "--local-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert not [r for r in hub.stats().records if r.path.endswith(".safetensors")]


def test_headers_only_redoes_a_damaged_shard(hub: FakeHub, tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "headers"
    download(TINY_REPO, local_dir=out, headers_only=True, endpoint=hub.endpoint)
    shard = sorted(p.name for p in tiny_dir.glob("*.safetensors"))[0]
    size = (tiny_dir / shard).stat().st_size
    (out / shard).write_bytes(b"\0" * size)  # right size, no header
    hub.reset_stats()
    res = download(TINY_REPO, local_dir=out, headers_only=True, endpoint=hub.endpoint)
    assert res.headers_only == [shard]
    head = (tiny_dir / shard).read_bytes()
    n = 8 + int.from_bytes(head[:8], "little")
    assert (out / shard).read_bytes()[:n] == head[:n]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["download", TINY_REPO, "--headers-only"], "--local-dir"),
        (["download", TINY_REPO, "--headers-only", "--verify", "--local-dir", "x"], "--verify"),
        (["download", TINY_REPO, "--include", "*.nothing"], "no file"),
        (["download", "test-org/no-such-repo"], "not found"),
        (["download", TINY_REPO, "--revision", "no-such-branch"], "no-such-branch"),
        (["download", GATED_REPO, "--local-dir", "g"], "gated"),
        (["download", GATED_REPO, "--local-dir", "g", "--headers-only"], "gated"),
    ],
)
def test_download_usage_errors(hub: FakeHub, args: list[str], words: str, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error:") and words in err and "\n" not in err and "Traceback" not in result.output


def test_select_files() -> None:
    names = ["config.json", "model-1-of-2.safetensors", "model-2-of-2.safetensors", "README.md"]
    assert select_files(names, None) == sorted(names)
    assert select_files(names, ["*.safetensors"]) == ["model-1-of-2.safetensors", "model-2-of-2.safetensors"]
    assert select_files(names, ["config.json", "*-2-of-*"]) == ["config.json", "model-2-of-2.safetensors"]
    assert json.dumps(select_files(names, ["nothing"])) == "[]"


def test_download_reads_the_hub_through_public_calls_only() -> None:
    """download/ uses the sources' public calls: no `source._token`, no `source._translate_errors`, no private
    attribute of anything."""
    package = Path(__file__).resolve().parent.parent / "kimi_audit" / "download"
    modules = sorted(package.glob("*.py"))
    assert modules
    for path in modules:
        private = sorted({(node.lineno, node.attr) for node in ast.walk(ast.parse(path.read_text()))
                          if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                          and not node.attr.startswith("__")})
        assert not private, f"{path.name} reaches into private attributes: {private}"
