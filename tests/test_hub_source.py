"""HubSource against the loopback FakeHub, with the real huggingface_hub client."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from hub_repos import GATED_REPO, GATED_TOKEN, REPLICA_COMMIT, REPLICA_REPO, TINY_REPO
from hub_server import FakeHub
from kimi_audit.errors import FileMissingError, FileTooLargeError, KimiAuditError, ShortReadError
from kimi_audit.sources.base import Source, parse_content_range
from kimi_audit.sources.hub import (
    GatedRepoError,
    HubOfflineError,
    HubSource,
    HubTimeoutError,
    RangeNotSupportedError,
    RepoNotFoundError,
    RevisionNotFoundError,
)
from kimi_audit.sources.local import LocalSource

FAST = {"retry_wait": 0.05, "timeout": 5.0}


def _src(hub: FakeHub, repo: str = TINY_REPO, revision: str | None = None, **kw: object) -> HubSource:
    return HubSource(repo, revision, endpoint=hub.endpoint, **{**FAST, **kw})  # type: ignore[arg-type]


def _first_shard(d: Path) -> str:
    return sorted(p.name for p in d.glob("*.safetensors"))[0]


def test_resolves_revision_once_and_lists_files(hub: FakeHub, tiny_dir: Path) -> None:
    src = _src(hub)
    assert isinstance(src, Source)
    commit = hub.repos[TINY_REPO].commit
    assert src.revision == commit and src.label == f"{TINY_REPO}@{commit}"
    assert src.list_files() == LocalSource(tiny_dir).list_files()
    for name in src.list_files():
        assert src.file_size(name) == (tiny_dir / name).stat().st_size
    assert hub.stats().requests == 1  # one API call: commit + files + sizes
    # branch, short hash and full hash all resolve to the same full commit
    for rev in ("main", "release", commit[:7], commit[:12], commit):
        assert _src(hub, revision=rev).revision == commit


@pytest.mark.usefixtures("replica_hub")
def test_default_revision_is_pinned_for_the_pinned_repo(hub: FakeHub) -> None:
    src = _src(hub, REPLICA_REPO)
    assert src.requested_revision == REPLICA_COMMIT and src.revision == REPLICA_COMMIT
    assert any(r.path.endswith(f"/revision/{REPLICA_COMMIT}") for r in hub.stats().records)


def test_ranges_match_local_bytes(hub: FakeHub, tiny_dir: Path) -> None:
    src, local = _src(hub), LocalSource(tiny_dir)
    shard = _first_shard(tiny_dir)
    size = (tiny_dir / shard).stat().st_size
    for start, length in [(0, 8), (0, 1), (3, 100), (size - 5, 5), (size - 5, 500), (size, 10), (0, size), (1, 0)]:
        got, want = src.read_range(shard, start, length), local.read_range(shard, start, length)
        assert got == want, (start, length)
    assert src.read_file("config.json", 1_000_000) == (tiny_dir / "config.json").read_bytes()
    # never asked beyond what was wanted: every ranged request was for <= the bytes asked
    for rec in hub.stats().records:
        if rec.range is not None:
            first, last = (int(x) for x in rec.range.split("=")[1].split("-"))
            assert rec.bytes_sent == last - first + 1 or rec.bytes_sent == size - first


@pytest.mark.usefixtures("replica_hub")
def test_inclusive_range_boundary_on_a_real_header(hub: FakeHub, replica_dir: Path) -> None:
    """bytes=0-(8+N-1) gives exactly 8 + N bytes (the off-by-one peers got wrong)."""
    src = _src(hub, REPLICA_REPO)
    shard = _first_shard(replica_dir)
    with open(replica_dir / shard, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = f.read(n)
    hub.reset_stats()
    got = src.read_range(shard, 0, 8 + n)
    assert got.data[8:] == head and got.file_size == (replica_dir / shard).stat().st_size
    (rec,) = hub.stats().records
    assert rec.status == 206 and rec.range == f"bytes=0-{8 + n - 1}" and rec.bytes_sent == 8 + n


def test_content_range_parsing() -> None:
    assert parse_content_range("bytes 0-99999/100001") == (0, 99999, 100001)
    assert parse_content_range("bytes 5-5/*") == (5, 5, None)
    for bad in (None, "", "bytes 9-3/10", "bytes 0-10/10", "items 0-1/2"):
        with pytest.raises(ValueError):
            parse_content_range(bad)


def test_too_large_file_is_refused_without_fetching(hub: FakeHub) -> None:
    src = _src(hub)
    hub.reset_stats()
    with pytest.raises(FileTooLargeError):
        src.read_file("config.json", 3)
    with pytest.raises(FileMissingError):
        src.read_range("no-such.safetensors", 0, 8)
    assert hub.stats().requests == 0


def test_500_then_success_is_retried(hub: FakeHub, tiny_dir: Path) -> None:
    src = _src(hub)
    shard = _first_shard(tiny_dir)
    hub.add_fault("500", times=2, match="/resolve/")
    hub.reset_stats()
    assert src.read_range(shard, 0, 8).data == (tiny_dir / shard).read_bytes()[:8]
    assert [r.status for r in hub.stats().records] == [500, 500, 206]


def test_500_forever_gives_a_one_line_error(hub: FakeHub, tiny_dir: Path) -> None:
    src = _src(hub, max_retries=1)
    hub.add_fault("500", times=100, match="/resolve/")
    with pytest.raises(KimiAuditError) as e:
        src.read_range(_first_shard(tiny_dir), 0, 8)
    assert "HTTP 500" in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2


def test_429_waits_for_retry_after(hub: FakeHub, tiny_dir: Path) -> None:
    src = _src(hub)
    hub.add_fault("429", times=1, match="/resolve/", retry_after=0)
    hub.reset_stats()
    src.read_range(_first_shard(tiny_dir), 0, 8)
    first, retry = hub.stats().records
    assert (first.status, retry.status) == (429, 206)
    # The server saw the client wait before asking again (huggingface_hub sleeps Retry-After + 1 s): a lower
    # bound, which a slow runner only makes larger.
    assert retry.at - first.at >= 0.9


@pytest.mark.usefixtures("replica_hub")
def test_range_ignoring_server_is_an_error_and_reads_little(hub: FakeHub, replica_dir: Path) -> None:
    src = _src(hub, REPLICA_REPO)
    shard = _first_shard(replica_dir)
    size = (replica_dir / shard).stat().st_size
    hub.add_fault("ignore_range", times=1, match=shard)
    hub.reset_stats()
    with pytest.raises(RangeNotSupportedError) as e:
        src.read_range(shard, 0, 1 << 16)
    assert "ignored the Range" in str(e.value) and "\n" not in str(e.value)
    time.sleep(0.3)  # let the server notice the hang-up
    sent = hub.stats().bytes_sent
    assert sent < 64 << 20 < size, f"server streamed {sent:,} bytes of a {size:,}-byte shard"
    assert hub.stats().requests == 1  # not retried: the answer is an error, not a transient fault


def test_truncated_body_is_retried(hub: FakeHub, tiny_dir: Path) -> None:
    src = _src(hub)
    shard = _first_shard(tiny_dir)
    raw = (tiny_dir / shard).read_bytes()
    hub.add_fault("truncate", times=1, match=shard)
    hub.reset_stats()
    assert src.read_range(shard, 0, len(raw)).data == raw
    recs = hub.stats().records
    assert len(recs) == 2 and recs[0].bytes_sent < len(raw)


def test_truncated_body_forever_is_a_short_read(hub: FakeHub, tiny_dir: Path) -> None:
    src = _src(hub, max_retries=1)
    shard = _first_shard(tiny_dir)
    hub.add_fault("truncate", times=100, match=shard)
    with pytest.raises(ShortReadError) as e:
        src.read_range(shard, 0, 200)
    assert "of 200 bytes" in str(e.value) and "\n" not in str(e.value)


def test_stalled_connection_times_out_with_a_clear_message(hub: FakeHub, tiny_dir: Path) -> None:
    src = _src(hub, timeout=0.5, max_retries=1)
    stall = hub.add_fault("stall", times=100, match="/resolve/", stall_s=30)
    hub.reset_stats()
    with pytest.raises(HubTimeoutError) as e:
        src.read_range(_first_shard(tiny_dir), 0, 8)
    # Two requests (one retry), each given up on before its 30 s stall ended (the server counts a stalled
    # request when the stall is over): the timeout, not the server, ended them.
    assert stall.times == 98 and hub.stats().requests == 0
    msg = str(e.value)
    assert "timed out after 0.5 s" in msg and "\n" not in msg and e.value.exit_code == 2


def test_stalled_api_call_times_out(hub: FakeHub) -> None:
    stall = hub.add_fault("stall", times=100, match="/api/", stall_s=30)
    hub.reset_stats()
    with pytest.raises(HubTimeoutError):
        _src(hub, timeout=0.5, max_retries=0)
    assert stall.times == 99 and hub.stats().requests == 0  # one request, given up on before the stall ended


@pytest.mark.parametrize(
    ("repo", "revision", "error", "words"),
    [
        ("test-org/no-such-repo", None, RepoNotFoundError, "not found"),
        (TINY_REPO, "no-such-branch", RevisionNotFoundError, "no-such-branch"),
        (TINY_REPO, "0123456789abcdef0123456789abcdef01234567", RevisionNotFoundError, "not found"),
        ("test-org/no-such-repo", "0123456789abcdef0123456789abcdef01234567", RepoNotFoundError, "not found"),
        ("not a repo id", None, RepoNotFoundError, "owner/name"),
    ],
)
def test_unknown_repo_or_revision(hub: FakeHub, repo: str, revision: str | None, error: type, words: str) -> None:
    import threading

    with pytest.raises(error) as e:
        _src(hub, repo, revision)
    assert words in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2
    assert not [t for t in threading.enumerate() if t.name == "kimi-audit-early-config"], "nothing left running"


def test_file_missing_on_the_server(hub: FakeHub, tiny_dir: Path) -> None:
    """A file the listing has but the server no longer serves: EntryNotFound -> FileMissingError."""
    src = _src(hub)
    src._sizes["gone.safetensors"] = 100  # listed at resolve time, absent now
    with pytest.raises(FileMissingError) as e:
        src.read_range("gone.safetensors", 0, 8)
    assert "gone.safetensors" in str(e.value) and "\n" not in str(e.value)


def test_gated_repo(hub: FakeHub) -> None:
    """As on the Hub, a gated repo's listing is public and its files are refused: one HEAD at open
    time turns the refusal into a clear error before any work starts."""
    hub.reset_stats()
    with pytest.raises(GatedRepoError) as e:
        _src(hub, GATED_REPO, token=False)
    assert "gated" in str(e.value) and "HTTP 401" in str(e.value) and "\n" not in str(e.value)
    assert [(r.method, r.status) for r in hub.stats().records] == [("GET", 200), ("HEAD", 401)]
    wrong = "hf_WrongTokenShouldNeverBePrinted42"
    with pytest.raises(GatedRepoError) as e:
        _src(hub, GATED_REPO, token=wrong)
    assert "HTTP 403" in str(e.value) and wrong not in str(e.value) and wrong not in repr(e.value)
    src = _src(hub, GATED_REPO, token=GATED_TOKEN)
    assert src.read_file("config.json", 1_000_000)
    src._fatal = GatedRepoError("access revoked")  # a refusal mid-run: later reads fail fast, unasked
    hub.reset_stats()
    with pytest.raises(GatedRepoError):
        src.read_range("config.json", 0, 8)
    assert hub.stats().requests == 0
    assert GATED_TOKEN not in repr(src) and GATED_TOKEN not in repr(vars(src))


def test_offline_mode_is_a_clear_error(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubOfflineError) as e:
        _src(hub)
    assert "offline" in str(e.value)
    assert hub.stats().requests == 0


def test_endpoint_from_hf_endpoint(hub: FakeHub) -> None:
    """No endpoint argument: HF_ENDPOINT (set by the fixture) is used."""
    src = HubSource(TINY_REPO, **FAST)  # type: ignore[arg-type]
    assert src.endpoint == hub.endpoint and hub.stats().requests == 1


@pytest.mark.usefixtures("replica_hub")
def test_latency_makes_parallel_reads_worthwhile(hub: FakeHub, replica_dir: Path) -> None:
    """16 reads from a thread pool against 100 ms latency: one request each, several in flight at once."""
    from concurrent.futures import ThreadPoolExecutor

    src = _src(hub, REPLICA_REPO)
    shards = sorted(p.name for p in replica_dir.glob("*.safetensors"))[:16]
    hub.latency_s = 0.1
    hub.reset_stats()
    with ThreadPoolExecutor(src.parallel_reads) as pool:
        heads = list(pool.map(lambda s: src.read_range(s, 0, 8), shards))
    assert all(len(h.data) == 8 for h in heads)
    st = hub.stats()
    assert st.requests == 16  # one request a read: no connection setup or revision lookup repeated
    assert st.peak_in_flight >= 2  # the server held several at once: the reads did not queue behind each other


@pytest.mark.usefixtures("replica_hub")
def test_a_commits_config_is_read_beside_the_api_call(hub: FakeHub, replica_dir: Path, tiny_dir: Path) -> None:
    """At a full commit hash nothing waits for the resolve: config.json is fetched with it (one request,
    no retry), and read_file takes those bytes; a branch is resolved first, as before."""
    src = _src(hub, REPLICA_REPO)
    assert sorted((r.method, r.path.rsplit("/", 1)[-1], r.status) for r in hub.stats().records) == [
        ("GET", "config.json", 206), ("GET", REPLICA_COMMIT, 200)]
    hub.reset_stats()
    assert src.read_file("config.json", 1_000_000) == (replica_dir / "config.json").read_bytes()
    assert hub.stats().requests == 0
    assert src.read_file("config.json", 1_000_000) == (replica_dir / "config.json").read_bytes()
    assert hub.stats().requests == 1, "taken once: a second read asks the Hub"
    hub.reset_stats()
    branch = _src(hub, TINY_REPO, "main")
    assert hub.stats().requests == 1
    assert branch.read_file("config.json", 1_000_000) == (tiny_dir / "config.json").read_bytes()
    assert hub.stats().requests == 2


def test_an_early_config_that_failed_or_fell_short_is_read_again(
    hub: FakeHub, tiny_dir: Path, tmp_path: Path
) -> None:
    from kimi_audit.sources.hub import EARLY_CONFIG_BYTES

    commit = hub.repos[TINY_REPO].commit
    hub.add_fault("500", times=1, match="/config.json")
    src = _src(hub, TINY_REPO, commit, retry_wait=0.05)

    def config_statuses() -> list[int]:
        return [r.status for r in hub.stats().records if r.path.endswith("/config.json")]

    assert config_statuses() == [500], "one attempt, not retried"
    assert src.read_file("config.json", 1_000_000) == (tiny_dir / "config.json").read_bytes()
    assert config_statuses() == [500, 206]
    # a config.json longer than the early read: the rest is not guessed, the file is read whole
    big = tmp_path / "big-config"
    big.mkdir()
    config = (tiny_dir / "config.json").read_bytes()
    (big / "config.json").write_bytes(config.rstrip()[:-1] + b"," + b" " * EARLY_CONFIG_BYTES + b'"pad": 1}')
    repo = hub.add_repo("test-org/big-config", big)
    hub.reset_stats()
    src = _src(hub, "test-org/big-config", repo.commit)
    assert src.read_file("config.json", 1_000_000) == (big / "config.json").read_bytes()
    assert [r.range for r in hub.stats().records if r.path.endswith("/config.json")] == [
        f"bytes=0-{EARLY_CONFIG_BYTES - 1}", f"bytes=0-{len((big / 'config.json').read_bytes()) - 1}"]


def test_the_model_info_answer_is_decoded_into_typed_fields() -> None:
    from kimi_audit.sources.hub_api import decode_repo_info

    info = decode_repo_info(b'{"id": "a/b", "sha": "' + b"f" * 40 + b'", "gated": "manual", "siblings": ['
                            b'{"rfilename": "config.json", "size": 12}, {"rfilename": "m.safetensors", "size": 99,'
                            b' "blobId": "x", "lfs": {"sha256": "ab", "size": 99, "pointerSize": 1}}]}')
    assert info.sha == "f" * 40 and info.gated == "manual"
    assert [(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None) for s in info.siblings] == [
        ("config.json", 12, None), ("m.safetensors", 99, "ab")]
    for bad in (b"<html>", b'{"siblings": [{"size": 3}]}', b'{"siblings": "x"}', b'{"sha": 5}'):
        with pytest.raises(ValueError):
            decode_repo_info(bad)


def test_every_source_declares_the_protocols_capabilities(hub: FakeHub, tiny_dir: Path) -> None:
    """The Source protocol's optional capabilities are answered by every source, never probed for:
    the Hub lists sizes and LFS digests and has no directory, holes or links; a local directory the reverse."""
    remote, local = _src(hub), LocalSource(tiny_dir)
    shard = _first_shard(tiny_dir)
    assert isinstance(remote, Source) and isinstance(local, Source)
    assert remote.remote and remote.root is None
    assert remote.file_size(shard) == (tiny_dir / shard).stat().st_size and remote.lfs_sha256(shard)
    assert remote.holes(shard) == () and remote.outside_links() == ()
    assert not local.remote and local.root == tiny_dir
    assert local.file_size(shard) is None and local.lfs_sha256(shard) is None
    assert local.outside_links() == ()
