"""Hostile input and faults in `verify`, its manifests and `download` (issue 21): no false PASS, nothing
destroyed, nothing written through a link, no hang, no traceback.

Checkpoints are the tiny real one (tests/tiny_checkpoint.py); the Hub is a loopback FakeHub through the real
huggingface_hub (this module's own instance where a request must stall at a chosen point).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
from typer.testing import CliRunner

from hub_repos import TINY_REPO
from hub_server import FakeHub, Fault
from kimi_audit.cli import app
from kimi_audit.sources import LocalSource
from kimi_audit.verify import pool
from kimi_audit.verify.manifest import read_manifest
from kimi_audit.verify.read import FileTask, verify_file
from kimi_audit.verify.references import cache_reference
from kimi_audit.verify.run import VerifyOptions, VerifyTarget, prepare, verify_files
from tiny_checkpoint import tiny_shards, write_tiny

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
S1, S2 = "model-1-of-3.safetensors", "model-2-of-3.safetensors"
Q_B = "model.layers.1.self_attn.q_b_proj.weight"  # F8_E4M3 [192, 192]: in model-2-of-3


def run(*args: str):
    return runner.invoke(app, list(args))


def verify_json(*args: str) -> tuple[int, dict]:
    r = run("verify", *args, "--json", "--no-progress")
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    return r.exit_code, json.loads(r.stdout)


def found(doc: dict) -> set[tuple[str, str | None]]:
    return {(f["code"], f.get("shard")) for f in doc["findings"]}


def flip_last_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 1]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("hostile") / "ckpt", tiny_shards())


@pytest.fixture
def ckpt(tiny: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny, tmp_path / "ckpt"))


# ------------------------------------------------------------------ 1: every referenced file, whatever its path


@pytest.mark.parametrize("folder", [".git", ".github", ".cache/huggingface"])
def test_a_shard_the_index_puts_under_an_ignored_path_is_verified(tmp_path: Path, folder: str) -> None:
    shards = tiny_shards()
    shards[S2][Q_B].view(np.uint8)[100, 7] = 0x7F  # an FP8 NaN
    moved = f"{folder}/{S2}"
    d = tmp_path / "ckpt"
    (d / folder).mkdir(parents=True)
    write_tiny(d, {moved if k == S2 else k: v for k, v in shards.items()})
    m = tmp_path / "m.json"
    code, doc = verify_json(str(d), "--write-manifest", str(m))
    assert code == 1 and ("FP8_NAN", moved) in found(doc)
    assert moved in {f["name"] for f in doc["files"]}
    statement = json.loads(m.read_text())
    assert moved in {r["name"] for r in statement["predicate"]["resources"]}
    assert folder.split("/")[0] not in statement["predicate"]["serialization"]["ignore_paths"]
    flip_last_byte(d / moved)  # tampered later: the manifest catches it
    code, doc = verify_json(str(d), "--manifest", str(m))
    assert code == 1 and ("FILE_HASH_MISMATCH", moved) in found(doc)


def test_unreferenced_files_of_ignored_paths_stay_out(ckpt: Path) -> None:
    (ckpt / ".git").mkdir()
    (ckpt / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    code, doc = verify_json(str(ckpt))
    assert code == 0 and ".git/HEAD" not in {f["name"] for f in doc["files"]}


# ------------------------------------------------------------------ 2: an output never replaces an input


def test_write_manifest_over_a_file_the_run_reads_is_refused(ckpt: Path, tmp_path: Path) -> None:
    shard = ckpt / S1
    before = shard.read_bytes()
    hard = tmp_path / "hard.json"
    os.link(shard, hard)
    soft = tmp_path / "soft.json"
    soft.symlink_to(shard)
    for target in (shard, hard, soft, ckpt / "config.json"):
        r = run("verify", str(ckpt), "--write-manifest", str(target), "--no-progress")
        assert r.exit_code == 2, (target, r.output)
        assert "a file this run reads" in r.output and "Traceback" not in r.output
    assert shard.read_bytes() == before and hard.read_bytes() == before
    m = tmp_path / "m.json"
    assert run("verify", str(ckpt), "--write-manifest", str(m), "--no-progress").exit_code == 0
    r = run("verify", str(ckpt), "--manifest", str(m), "--write-manifest", str(m), "--no-progress")
    assert r.exit_code == 2 and "a file this run reads" in r.output


def test_a_manifest_inside_the_checkpoint_may_be_written_again(ckpt: Path) -> None:
    m = ckpt / "manifest.json"
    for _ in range(2):
        r = run("verify", str(ckpt), "--write-manifest", str(m), "--no-progress")
        assert r.exit_code == 0, r.output
    assert "manifest.json" not in read_manifest(m).files


def test_audit_output_over_a_file_it_reads_is_refused(ckpt: Path, tmp_path: Path) -> None:
    config = ckpt / "config.json"
    before = config.read_bytes()
    hard = tmp_path / "report.json"
    os.link(config, hard)
    for target in (config, hard):
        r = run("audit", str(ckpt), "--format", "json", "--output", str(target), "--no-progress")
        assert r.exit_code == 2 and "a file this run reads" in r.output, r.output
    assert config.read_bytes() == before


# ------------------------------------------------------------------ 3: temporary files, links


def test_outputs_are_never_written_through_a_link(ckpt: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    # the temporary names the writers used, planted as links, and the outputs themselves as links
    (out / ".m.json.kimi-audit.partial").symlink_to(victim)
    (out / ".r.json.kimi-audit.partial").symlink_to(victim)
    (out / "m2.json").symlink_to(victim)
    assert run("verify", str(ckpt), "--write-manifest", str(out / "m.json"), "--no-progress").exit_code == 0
    assert run("verify", str(ckpt), "--write-manifest", str(out / "m2.json"), "--no-progress").exit_code == 0
    r = run("audit", str(ckpt), "--format", "json", "--output", str(out / "r.json"), "--no-progress")
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "keep"
    assert not (out / "m2.json").is_symlink() and read_manifest(out / "m2.json").files
    assert json.loads((out / "r.json").read_text())["result"]["exit_code"] == 0
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".partial")) == [
        ".m.json.kimi-audit.partial", ".r.json.kimi-audit.partial"]  # the planted ones only: no leftovers


def test_headers_only_download_never_writes_through_a_planted_link(hub, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    local = tmp_path / "dl"
    local.mkdir()
    (local / ".config.json.kimi-audit.partial").symlink_to(victim)
    (local / f".{S1}.kimi-audit.partial").symlink_to(victim)
    r = run("download", TINY_REPO, "--headers-only", "--local-dir", str(local))
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "keep" and (local / "config.json").is_file()


def test_download_verify_reads_the_cache_through_its_links(hub, tmp_path: Path) -> None:
    """The reader opens no link (O_NOFOLLOW): a cache snapshot's files are read at their blobs."""
    from kimi_audit.download.hub import download

    res = download(TINY_REPO, cache_dir=tmp_path / "cache", endpoint=hub.endpoint, verify=True)
    assert res.verified and res.verify_ok and (res.path / S1).is_symlink()


def test_write_atomic_gives_the_mode_of_a_plain_open(tmp_path: Path) -> None:
    from kimi_audit.outputs import write_atomic

    write_atomic(tmp_path / "a", b"x")
    with open(tmp_path / "b", "wb") as f:
        f.write(b"x")
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == stat.S_IMODE((tmp_path / "b").stat().st_mode)
    assert (tmp_path / "a").read_bytes() == b"x"


# ------------------------------------------------------------------ 4: a file that changes while it is read


def test_bytes_appended_during_the_read_are_a_finding(ckpt: Path) -> None:
    prepared = prepare(VerifyTarget(LocalSource(ckpt)), VerifyOptions(workers=1, chunk=1 << 16))
    appended = []

    def progress(name: str, done: int) -> None:
        if name == S2 and not appended:
            with open(ckpt / S2, "ab") as f:
                f.write(b"\0" * 4096)
            appended.append(name)

    report, _ = verify_files(prepared, progress)
    rows = {f.name: f for f in report.files}
    assert appended and rows[S2].status == "unreadable" and rows[S2].sha256 is None
    changed = [f for f in report.findings if f.code == "FILE_CHANGED"]
    assert [f.shard for f in changed] == [S2] and report.exit_code == 1


def test_a_file_replaced_after_planning_is_a_finding(ckpt: Path) -> None:
    prepared = prepare(VerifyTarget(LocalSource(ckpt)), VerifyOptions(workers=1))
    data = (ckpt / S2).read_bytes()
    (ckpt / S2).unlink()
    (ckpt / S2).write_bytes(data + b"\0")  # another file, longer, under the same name
    report, _ = verify_files(prepared)
    assert [f.shard for f in report.findings if f.code == "FILE_CHANGED"] == [S2]


SHRINK = """
import os, sys
from kimi_audit.verify.read import FileTask, verify_file
path = sys.argv[1]
size = os.path.getsize(path)
def cut(n):
    os.truncate(path, size // 2)
r = verify_file(FileTask("s", size, path=path, chunk=1 << 16), cut)
print("changed:", r.changed, "sha256:", r.sha256)
"""


def test_a_file_cut_short_during_the_read_is_a_finding_not_sigbus(ckpt: Path) -> None:
    p = subprocess.run([sys.executable, "-c", SHRINK, str(ckpt / S2)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert p.returncode == 0, (p.returncode, p.stderr)  # -7: SIGBUS under a memory map
    assert "changed: it shrank while it was read" in p.stdout and "sha256: None" in p.stdout


# ------------------------------------------------------------------ 5: HF cache links, non-regular files


def _fake_snapshot(src: Path, cache: Path) -> Path:
    """An HF cache snapshot of `src`: each file a link to ../../blobs/<its sha256>."""
    repo = cache / "models--test-org--tiny"
    snap = repo / "snapshots" / ("c" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for p in src.iterdir():
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        shutil.copy(p, repo / "blobs" / digest)
        (snap / p.name).symlink_to(Path("..", "..", "blobs", digest))
    return snap


def _verify_snapshot(snap: Path):
    src = LocalSource(snap)
    ref = cache_reference(src.root, src.list_files())
    return verify_files(prepare(VerifyTarget(src, (ref,) if ref else ()), VerifyOptions(workers=1)))[0]


def test_a_regular_file_in_place_of_a_cache_link_fails(tiny: Path, tmp_path: Path) -> None:
    snap = _fake_snapshot(tiny, tmp_path / "cache")
    assert _verify_snapshot(snap).exit_code == 0
    data = bytearray((snap / S2).read_bytes())
    data[-1] ^= 1
    (snap / S2).unlink()
    (snap / S2).write_bytes(data)  # the link replaced by a tampered regular file
    report = _verify_snapshot(snap)
    assert [f.shard for f in report.findings if f.code == "CACHE_FILE_NOT_BLOB"] == [S2]
    assert report.exit_code == 1 and {f.name: f.status for f in report.files}[S2] == "mismatch"


def test_a_cache_without_blobs_is_not_flagged(tiny: Path, tmp_path: Path) -> None:
    """A cache on a filesystem without symlinks moves the files into the snapshot and keeps no blobs."""
    snap = tmp_path / "models--test-org--tiny" / "snapshots" / ("d" * 40)
    shutil.copytree(tiny, snap)
    report = _verify_snapshot(snap)
    assert report.exit_code == 0 and not [f for f in report.findings if f.code == "CACHE_FILE_NOT_BLOB"]


def test_a_fifo_in_the_checkpoint_is_reported_not_dropped(ckpt: Path) -> None:
    os.mkfifo(ckpt / "notes.txt")
    code, doc = verify_json(str(ckpt))
    rows = {f["name"]: f for f in doc["files"]}
    assert rows["notes.txt"]["status"] == "unreadable"
    assert code == 1 and ("SHARD_UNREADABLE", "notes.txt") in found(doc)
    assert any("a FIFO" in f["message"] for f in doc["findings"])


def test_the_reader_opens_no_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f")  # the name could be swapped for one after planning: the open must not block
    r = verify_file(FileTask("f", 10, path=str(tmp_path / "f")))
    assert r.sha256 is None and "not a regular file" in (r.error or "")


# ------------------------------------------------------------------ 6: a manifest inside the checkpoint


def test_a_manifest_written_inside_lists_itself_as_ignored(ckpt: Path) -> None:
    m = ckpt / "manifest.json"
    assert run("verify", str(ckpt), "--write-manifest", str(m), "--no-progress").exit_code == 0
    statement = json.loads(m.read_text())
    ignore = statement["predicate"]["serialization"]["ignore_paths"]
    assert "manifest.json" in ignore
    # what `model_signing sign DIR` hashes: every file of DIR but the ignored paths
    on_disk = {p.name for p in ckpt.iterdir() if p.name not in ignore}
    assert {r["name"] for r in statement["predicate"]["resources"]} == on_disk
    code, _ = verify_json(str(ckpt), "--manifest", str(m))
    assert code == 0


# ------------------------------------------------------------------ 10: futures in flight are bounded


def test_the_pool_holds_a_bounded_number_of_futures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = threading.Lock()
    live = [0, 0]  # in flight now, the most at once
    submit = pool.ProcessPoolExecutor.submit

    def counting(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        fut = submit(self, fn, *args, **kwargs)
        with lock:
            live[0] += 1
            live[1] = max(live[1], live[0])

        def done(_: object) -> None:
            with lock:
                live[0] -= 1

        fut.add_done_callback(done)
        return fut

    monkeypatch.setattr(pool.ProcessPoolExecutor, "submit", counting)
    tasks = [FileTask(f"f{i}", 1, failed="planned to fail") for i in range(200)]
    results = list(pool.run_local(tasks, workers=2))
    assert len(results) == 200 and all(r.error == "planned to fail" for r in results)
    assert live[1] <= 2 * 2  # two workers, two tasks each (pool.IN_FLIGHT_PER_WORKER)


# ------------------------------------------------------------------ 11: an unsafe listing, a deep manifest


def test_download_refuses_a_listing_that_leaves_the_target(hub, tiny_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    repo_dir = tmp_path / "repo"
    shutil.copytree(tiny_dir, repo_dir)
    (tmp_path / "x").write_text("outside")
    real = hub.list_files
    monkeypatch.setattr(hub, "list_files", lambda repo: [*real(repo), "../x"] if repo.root == repo_dir else real(repo))
    hub.add_repo("test-org/evil-listing", repo_dir)
    try:
        for extra in ([], ["--headers-only"]):
            local = tmp_path / f"dl{len(extra)}"
            r = run("download", "test-org/evil-listing", "--local-dir", str(local), *extra)
            assert r.exit_code == 2 and "unsafe file name" in r.output, r.output
            assert not local.exists() or not list(local.iterdir())
    finally:
        hub.repos.pop("test-org/evil-listing")
    assert (tmp_path / "x").read_text() == "outside"


@pytest.mark.parametrize("dsse", [False, True])
def test_a_deeply_nested_manifest_is_a_clear_error(ckpt: Path, tmp_path: Path, dsse: bool) -> None:
    import base64

    deep = b"[" * 100_000 + b"]" * 100_000
    m = tmp_path / "deep.json"
    m.write_bytes(json.dumps({"payload": base64.b64encode(deep).decode()}).encode() if dsse else deep)
    r = run("verify", str(ckpt), "--manifest", str(m), "--no-progress")
    assert r.exit_code == 2 and "nested too deep" in r.output, r.output


def test_a_huge_resource_is_shown_short(ckpt: Path, tmp_path: Path) -> None:
    m = tmp_path / "m.json"
    assert run("verify", str(ckpt), "--write-manifest", str(m), "--no-progress").exit_code == 0
    doc = json.loads(m.read_text())
    doc["predicate"]["resources"][0] = {"name": [[["x" * 100_000]]]}
    m.write_text(json.dumps(doc))
    r = run("verify", str(ckpt), "--manifest", str(m), "--no-progress")
    assert r.exit_code == 2 and "Traceback" not in r.output and len(r.output) < 2000, r.output


# ------------------------------------------------------------------ 12: signals


class StallingHub(FakeHub):
    """Stalls every GET of a .safetensors file after its first (the audit's header read): the file reads of
    `verify --stream`, or a download's body, hang until the hub stops."""

    def __init__(self, first: int = 1) -> None:
        super().__init__()
        self.first = first
        self.seen: dict[str, int] = {}
        self.stalled = threading.Event()

    def _take_fault(self, method: str, path: str) -> Fault | None:
        if method != "GET" or not path.endswith(".safetensors"):
            return None
        with self._lock:
            self.seen[path] = self.seen.get(path, 0) + 1
            if self.seen[path] <= self.first:
                return None
        self.stalled.set()
        return Fault("stall", 1, stall_s=600.0)


def _no_sigint_ignored() -> None:  # a test runner started in the background may pass SIGINT on ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], endpoint: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_ENDPOINT": endpoint, "HF_HUB_DOWNLOAD_TIMEOUT": "600",
           "HF_HUB_ETAG_TIMEOUT": "600"}
    return subprocess.Popen([sys.executable, "-m", "kimi_audit", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_no_sigint_ignored)


def _wait_for(event: threading.Event, p: subprocess.Popen[bytes]) -> None:
    while not event.wait(0.05):
        assert p.poll() is None, p.communicate()


def test_sigterm_during_verify_ends_the_pools_workers(hub_env: Path, tiny_dir: Path) -> None:
    with StallingHub() as stalling:
        stalling.add_repo(TINY_REPO, tiny_dir)
        p = _start(["verify", TINY_REPO, "--stream", "--workers", "2", "--no-progress"], stalling.endpoint)
        try:
            _wait_for(stalling.stalled, p)
            workers = psutil.Process(p.pid).children(recursive=True)
            assert workers
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=120)
            _, alive = psutil.wait_procs(workers, timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    for proc in alive:  # what the test leaves behind it kills itself
        proc.kill()
    assert p.returncode == 143, err
    assert not alive, f"workers left running: {alive}"


def test_sigint_during_download_stops_at_once_and_resumes(hub_env: Path, tiny_dir: Path, tmp_path: Path) -> None:
    local = tmp_path / "dl"
    with StallingHub(first=0) as stalling:
        stalling.add_repo(TINY_REPO, tiny_dir)
        p = _start(["download", TINY_REPO, "--local-dir", str(local)], stalling.endpoint)
        try:
            _wait_for(stalling.stalled, p)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=120)  # in-flight files stall for 600 s: not waited for
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 130, err
    assert b"Traceback" not in err
    with FakeHub() as plain:  # the same repo, nothing stalls: the download completes where it left off
        plain.add_repo(TINY_REPO, tiny_dir)
        p = _start(["download", TINY_REPO, "--local-dir", str(local), "--verify"], plain.endpoint)
        _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert {q.name: q.read_bytes() for q in local.iterdir() if q.is_file()} == {
        q.name: q.read_bytes() for q in tiny_dir.iterdir()}
