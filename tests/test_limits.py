"""Resource limits: what a hostile checkpoint or server can make kimi-audit read, hold or wait for.

- a header length over 100 MB is refused from the 8-byte prefix, before anything else is read;
- an index.json (or config.json) over its limit is refused from its size, never read;
- 10 million tensor names do not fit under either limit (computed from the smallest possible entry),
  a 1-million-tensor header (68 MB) parses within ~12x its size, and many big shards together stop at
  MAX_TOTAL_HEADER_BYTES (CHECKPOINT_TOO_LARGE);
- a Hub server that streams an endless body is cut off after the bytes asked for; one that claims a
  gigantic header or index gets one small read, or none.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fake_sources import NoCapabilities
from hub_server import FakeHub
from kimi_audit.checks.audit import audit_source
from kimi_audit.constants import CONFIG_FILE, INDEX_FILE, MAX_CONFIG_BYTES, MAX_HEADER_BYTES, MAX_INDEX_BYTES
from kimi_audit.errors import ConfigError
from kimi_audit.format.header import read_shard_header
from kimi_audit.format.index import load_index
from kimi_audit.model import checkpoint
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.sources.base import RangeRead
from kimi_audit.sources.local import LocalSource

ENTRY_TAIL = ':{"dtype":"U8","shape":[0],"data_offsets":[0,0]}'  # the smallest valid entry after its key
NAME_CHARS = 128 - 32 - 2  # printable ASCII without '"' and '\\': one byte each, no escaping


def traced_peak(fn):  # type: ignore[no-untyped-def]
    """(fn(), the peak bytes Python allocated while it ran)."""
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class CountingSource(NoCapabilities):
    def __init__(self, inner: LocalSource, parallel_reads: int = 1) -> None:
        self.inner, self.label, self.revision, self.parallel_reads = inner, inner.label, None, parallel_reads
        self.ranges: list[tuple[str, int, int]] = []
        self.files: list[str] = []
        self.lock = threading.Lock()

    def list_files(self):
        return self.inner.list_files()

    def exists(self, name):
        return self.inner.exists(name)

    def read_file(self, name, max_bytes):
        with self.lock:
            self.files.append(name)
        return self.inner.read_file(name, max_bytes)

    def read_range(self, name, start, length) -> RangeRead:
        r = self.inner.read_range(name, start, length)
        with self.lock:
            self.ranges.append((name, start, len(r.data)))
        return r

    def bytes_read(self, name: str) -> int:
        return sum(n for s, _, n in self.ranges if s == name)


def sparse(path: Path, prefix: bytes, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(prefix)
        f.truncate(size)
    return path


def smallest_names_bytes(count: int) -> int:
    """Total bytes of `count` distinct JSON keys, shortest first (quotes included)."""
    total, length = 0, 1
    while count > 0:
        take = min(count, NAME_CHARS**length)
        total += take * (length + 2)
        count -= take
        length += 1
    return total


# --- header and index size limits -----------------------------------------------------------------

def test_header_over_100_mb_is_refused_after_reading_8_bytes(tmp_path: Path) -> None:
    sparse(tmp_path / "big.safetensors", struct.pack("<Q", MAX_HEADER_BYTES + 1), 8 + MAX_HEADER_BYTES + 1 + 100)
    src = CountingSource(LocalSource(tmp_path))
    h = read_shard_header(src, "big.safetensors", first_read=8)
    assert [f.code for f in h.findings] == ["HEADER_TOO_LARGE"]
    assert src.ranges == [("big.safetensors", 0, 8)]


def test_header_at_exactly_100_mb_is_read(tmp_path: Path) -> None:
    """The limit is the format's: N = 100,000,000 is allowed (and read), N + 1 is not."""
    raw = b"{}" + b" " * (MAX_HEADER_BYTES - 2)
    (tmp_path / "edge.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    src = CountingSource(LocalSource(tmp_path))
    h = read_shard_header(src, "edge.safetensors", first_read=8)
    assert h.ok and h.header_len == MAX_HEADER_BYTES
    assert src.bytes_read("edge.safetensors") == 8 + MAX_HEADER_BYTES and len(src.ranges) == 2


def test_oversized_header_in_an_audit_costs_one_small_read(tiny_copy: Path) -> None:
    shard = sorted(tiny_copy.glob("*.safetensors"))[0]
    sparse(shard, struct.pack("<Q", 10**12), 10**12 + 1000)  # claims a terabyte of header
    src = CountingSource(LocalSource(tiny_copy))
    report, peak = traced_peak(lambda: audit_source(src))
    assert any(f.code == "HEADER_TOO_LARGE" and f.shard == shard.name for f in report.findings)
    reads = [r for r in src.ranges if r[0] == shard.name]
    assert len(reads) == 1 and reads[0][2] <= 1 << 20
    assert peak < 64 << 20


def test_index_over_the_limit_is_refused_unread(tiny_copy: Path) -> None:
    sparse(tiny_copy / INDEX_FILE, b'{"weight_map": {', MAX_INDEX_BYTES + 1)
    src = LocalSource(tiny_copy)
    (index, findings), peak = traced_peak(lambda: load_index(src, src.list_files()))
    assert index is None and [f.code for f in findings] == ["INDEX_TOO_LARGE"]
    assert peak < 1 << 20  # 64 MB were never read into memory
    report = audit_source(src)
    assert "INDEX_TOO_LARGE" in {f.code for f in report.findings} and report.exit_code() == 1


def test_config_over_the_limit_is_a_one_line_error(tiny_copy: Path) -> None:
    sparse(tiny_copy / CONFIG_FILE, b"{", MAX_CONFIG_BYTES + 1)
    with pytest.raises(ConfigError) as ei:
        load_checkpoint(LocalSource(tiny_copy))
    assert "\n" not in str(ei.value) and "limit" in str(ei.value)


# --- ten million tensor names ---------------------------------------------------------------------

def test_ten_million_names_cannot_fit_under_either_limit(tmp_path: Path) -> None:
    n = 10_000_000
    header = 2 + smallest_names_bytes(n) + n * len(ENTRY_TAIL) + (n - 1)  # braces, keys, entries, commas
    index = len('{"weight_map":{}}') + smallest_names_bytes(n) + n * len(':"s"') + (n - 1)
    assert header > 5 * MAX_HEADER_BYTES and index > 1.5 * MAX_INDEX_BYTES  # 549 MB and 109 MB at the least
    # So a shard holding them is refused from its prefix, and such an index from its size.
    d = tmp_path / "ten-million"
    d.mkdir()
    (d / CONFIG_FILE).write_text(json.dumps(__import__("tiny_checkpoint").TINY_CONFIG))
    sparse(d / "model.safetensors", struct.pack("<Q", header), 8 + header)
    sparse(d / INDEX_FILE, b'{"weight_map":{', index)
    src = CountingSource(LocalSource(d))
    report, peak = traced_peak(lambda: audit_source(src))
    codes = {f.code for f in report.findings}
    assert {"HEADER_TOO_LARGE", "INDEX_TOO_LARGE"} <= codes
    assert src.bytes_read("model.safetensors") <= 1 << 16 and INDEX_FILE not in [r[0] for r in src.ranges]
    assert peak < 64 << 20


def _many_entries_header(n: int) -> bytes:
    parts = [f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(n)]
    return ("{" + ",".join(parts) + "}").encode()


def test_two_hundred_thousand_tensors_parse_within_16x_their_size() -> None:
    from kimi_audit.format.header import parse_header_json

    raw = _many_entries_header(200_000)
    h, peak = traced_peak(lambda: parse_header_json(raw, shard="s", file_size=8 + len(raw) + 200_000))
    assert h.ok and h.tensor_count == 200_000
    assert peak <= 16 * len(raw), (peak, len(raw))


MILLION_SCRIPT = r"""
import sys
from kimi_audit.format.header import parse_header_json
raw = open(sys.argv[1], "rb").read()
def vm(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
before = vm("VmRSS:")
h = parse_header_json(raw, shard="s", file_size=8 + len(raw) + int(sys.argv[2]))
print(h.ok, h.tensor_count, vm("VmHWM:") - before)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc for RSS")
def test_a_million_tensor_header_parses_in_bounded_memory(tmp_path: Path) -> None:
    n = 1_000_000
    raw = _many_entries_header(n)
    assert len(raw) < MAX_HEADER_BYTES  # 68 MB: allowed by the format
    (tmp_path / "h.json").write_bytes(raw)
    r = subprocess.run([sys.executable, "-c", MILLION_SCRIPT, str(tmp_path / "h.json"), str(n)],
                       capture_output=True, text=True, timeout=300)
    ok, count, grown = r.stdout.split()
    assert ok == "True" and int(count) == n
    assert int(grown) <= 14 * len(raw), f"peak RSS grew {int(grown) / 1e6:.0f} MB for a {len(raw) / 1e6:.0f} MB header"


def _shard_file(path: Path, n: int) -> None:
    raw = _many_entries_header(n)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * n)


@pytest.mark.parametrize("parallel", [1, 4])
def test_many_big_shards_stop_at_the_total_header_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: int
) -> None:
    """The shards' headers together are capped: past MAX_TOTAL_HEADER_BYTES no further shard is read."""
    d = tmp_path / "many"
    d.mkdir()
    (d / CONFIG_FILE).write_text(json.dumps(__import__("tiny_checkpoint").TINY_CONFIG))
    for i in range(1, 13):
        _shard_file(d / f"model-{i}-of-12.safetensors", 2000)  # ~130 KB of header each
    one = (d / "model-1-of-12.safetensors").stat().st_size - 2000 - 8
    monkeypatch.setattr(checkpoint, "MAX_TOTAL_HEADER_BYTES", 3 * one)  # 4 shards pass it
    src = CountingSource(LocalSource(d), parallel_reads=parallel)
    ckpt = load_checkpoint(src)
    too_large = [f for f in ckpt.findings if f.code == "CHECKPOINT_TOO_LARGE"]
    assert len(too_large) == 1 and too_large[0].severity.value == "error"
    read = {r[0] for r in src.ranges}
    assert len(ckpt.headers) == len(read) and 4 <= len(read) <= 4 + parallel
    assert too_large[0].actual == 12 - len(read)


def test_real_checkpoints_are_far_below_the_total_header_limit(replica_dir: Path) -> None:
    total = 0
    for shard in replica_dir.glob("*.safetensors"):
        with open(shard, "rb") as f:
            total += struct.unpack("<Q", f.read(8))[0]
    assert total * 5 < checkpoint.MAX_TOTAL_HEADER_BYTES  # Kimi-K2: 17.7 MB of headers, 7x under the 128 MB cap


# --- hostile Hub servers --------------------------------------------------------------------------

COMMIT = "c" * 40
REPO = "evil/endless"
BIG = 10**12


CONFIG_BYTES = json.dumps(__import__("tiny_checkpoint").TINY_CONFIG).encode()


class _EndlessHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "206"
    sent = 0
    done = threading.Event()
    stop = threading.Event()

    def log_message(self, *a):  # quiet
        pass

    def do_GET(self) -> None:
        cls = type(self)
        if self.path.startswith("/api/models/"):
            body = json.dumps({"id": REPO, "modelId": REPO, "sha": COMMIT, "private": False, "siblings": [
                {"rfilename": "model.safetensors", "size": BIG},
                {"rfilename": "config.json", "size": len(CONFIG_BYTES)}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Repo-Commit", COMMIT)
            self.end_headers()
            self.wfile.write(body)
            return
        rng = self.headers.get("Range", "bytes=0-0")
        first, last = (int(x) for x in rng.split("=")[1].split("-"))
        self.send_response(206 if cls.mode == "206" else 200)
        if cls.mode == "206":
            self.send_header("Content-Range", f"bytes {first}-{last}/{BIG}")
        self.send_header("Transfer-Encoding", "chunked")  # no length: the body never ends by itself
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        chunk = b"\0" * 65536
        frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
        try:
            if self.path.endswith("/config.json"):  # the real bytes, then garbage without end
                self.wfile.write(b"%x\r\n" % len(CONFIG_BYTES) + CONFIG_BYTES + b"\r\n")
            while not cls.stop.is_set():
                self.wfile.write(frame)
                cls.sent += len(chunk)
        except OSError:
            pass
        finally:
            self.close_connection = True
            cls.done.set()


@pytest.fixture
def endless(hub_env, monkeypatch: pytest.MonkeyPatch):
    _EndlessHandler.sent = 0
    _EndlessHandler.done = threading.Event()
    _EndlessHandler.stop = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EndlessHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    try:
        yield endpoint
    finally:
        _EndlessHandler.stop.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("want", [8, 65536, 1 << 20])
def test_endless_206_body_is_cut_off_after_the_bytes_asked_for(endless: str, want: int) -> None:
    from kimi_audit.sources.hub import HubSource

    src = HubSource(REPO, "main", endpoint=endless, retry_wait=0.01, timeout=5)
    r = src.read_range("model.safetensors", 0, want)
    assert len(r.data) == want and r.file_size == BIG
    assert _EndlessHandler.done.wait(10), "the client never hung up on the endless body"
    assert _EndlessHandler.sent < want + (32 << 20)  # what the socket buffers took, at most


def test_endless_200_body_is_not_read(endless: str) -> None:
    from kimi_audit.sources.hub import HubSource, RangeNotSupportedError

    _EndlessHandler.mode = "200"
    try:
        src = HubSource(REPO, "main", endpoint=endless, retry_wait=0.01, timeout=5)
        with pytest.raises(RangeNotSupportedError):
            src.read_range("model.safetensors", 0, 65536)
        assert _EndlessHandler.done.wait(10)
        assert _EndlessHandler.sent < 32 << 20
    finally:
        _EndlessHandler.mode = "206"


def test_endless_bodies_in_a_remote_audit(endless: str) -> None:
    """Every file of this repo streams without end, each ranged answer claiming a terabyte: config.json's listed
    size and its Content-Range total disagree, which is itself the error (SIZE_DISAGREES, exit 2: neither size is
    taken over the other), said after one bounded read."""
    from kimi_audit.errors import SizeDisagreesError
    from kimi_audit.sources.hub import HubSource

    src = HubSource(REPO, "main", endpoint=endless, retry_wait=0.01, timeout=5)
    with pytest.raises(SizeDisagreesError, match=r"config\.json: the repository lists"):
        audit_source(src)
    assert _EndlessHandler.sent < 64 << 20


@pytest.fixture
def hostile_repo(fake_hub: FakeHub, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    repo = "test-org/hostile-limits"
    if repo not in fake_hub.repos:
        d = tmp_path_factory.mktemp("hostile-limits")
        shutil.copy(tiny_dir / CONFIG_FILE, d / CONFIG_FILE)
        sparse(d / "model-1-of-2.safetensors", struct.pack("<Q", 150_000_000), 200_000_000)
        sparse(d / "model-2-of-2.safetensors", struct.pack("<Q", 2**63), 1000)
        sparse(d / INDEX_FILE, b'{"weight_map":{', MAX_INDEX_BYTES + 1)
        fake_hub.add_repo(repo, d)
    return repo


def test_hub_gigantic_header_and_index_cost_one_small_read_or_none(hub: FakeHub, hostile_repo: str) -> None:
    from kimi_audit.sources.hub import HubSource

    src = HubSource(hostile_repo, endpoint=hub.endpoint, retry_wait=0.01, timeout=5)
    hub.reset_stats()
    report = audit_source(src)
    codes = {(f.code, f.shard) for f in report.findings}
    assert ("INDEX_TOO_LARGE", INDEX_FILE) in codes
    assert ("HEADER_TOO_LARGE", "model-1-of-2.safetensors") in codes
    assert ("HEADER_TOO_LARGE", "model-2-of-2.safetensors") in codes
    stats = hub.stats()
    assert stats.for_path(INDEX_FILE) == (0, 0)  # refused from the listed size: never requested
    for shard in ("model-1-of-2.safetensors", "model-2-of-2.safetensors"):
        requests, nbytes = stats.for_path(shard)
        assert requests == 1 and nbytes <= 1 << 20, (shard, requests, nbytes)
    assert stats.bytes_sent < 2 << 20
    assert os.environ.get("HF_ENDPOINT") == hub.endpoint
