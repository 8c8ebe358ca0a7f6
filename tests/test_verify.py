"""`kimi-audit verify`: one read of every byte, sha256 against references, weight health on the way.

Checkpoints are the tiny real one (tests/tiny_checkpoint.py: FP8 weights quantized as DeepSeek does) with one
fault put in each: a flipped byte, an FP8 NaN code, a zeroed block, a truncated shard, a sparse header-only
copy. References: a manifest written by --write-manifest (model-signing's form), the HF cache's blob names
and the Hub's LFS sha256 (the loopback FakeHub, through the real huggingface_hub). The Ray path runs on a
local Ray instance (`ray.init(num_cpus=2)`) and must give the local pool's results.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hub_repos import TINY_REPO
from kimi_audit.cli import app
from kimi_audit.sources import LocalSource
from kimi_audit.verify.manifest import PREDICATE_TYPE, STATEMENT_TYPE, parse_manifest, read_manifest, root_digest
from kimi_audit.verify.read import FileTask, TensorPlan, plan_pieces, tensor_kind, verify_file
from kimi_audit.verify.references import cache_reference, manifest_reference
from kimi_audit.verify.run import VerifyOptions, VerifyTarget, prepare, verify_files
from tiny_checkpoint import tiny_shards, write_tiny

runner = CliRunner()
S2 = "model-2-of-3.safetensors"
Q_B = "model.layers.1.self_attn.q_b_proj.weight"  # F8_E4M3 [192, 192]: in model-2-of-3
GATE = "model.layers.1.mlp.experts.0.gate_proj.weight"  # F8_E4M3 [160, 320]: partial edge blocks


def header_of(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return 8 + n, json.loads(f.read(n))


def run(*args: str):
    return runner.invoke(app, list(args))


def verify(d: Path, *, manifest: Path | None = None, workers: int = 1, ray: str | None = None,
           tensor_hashes: bool = False, chunk: int | None = None):
    src = LocalSource(d)
    refs = []
    ref = cache_reference(src.root, src.list_files()) if src.revision else None
    if ref:
        refs.append(ref)
    if manifest is not None:
        refs.append(manifest_reference(read_manifest(manifest), manifest))
    target = VerifyTarget(src, tuple(refs), frozenset({"m.json"}))
    options = VerifyOptions(workers=workers, ray_address=ray, tensor_hashes=tensor_hashes, chunk=chunk)
    return verify_files(prepare(target, options))


def codes(report) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in report.findings:
        out.setdefault(f.code, []).append(f)
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny checkpoint and its manifest (written by the command)."""
    d = write_tiny(tmp_path_factory.mktemp("verify") / "ckpt", tiny_shards())
    m = d.parent / "manifest.json"
    r = run("verify", str(d), "--write-manifest", str(m), "--no-progress")
    assert r.exit_code == 0, r.output
    return d, m


def copy_of(pristine: tuple[Path, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine[0], tmp_path / "ckpt"))


# ------------------------------------------------------------------ a clean checkpoint, the manifest


def test_clean_checkpoint_verifies_against_its_manifest(pristine: tuple[Path, Path]) -> None:
    d, m = pristine
    r = run("verify", str(d), "--manifest", str(m), "--json", "--workers", "2")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "kimi-audit/verify/1" and doc["result"]["verdict"] == "PASS"
    files = {f["name"]: f for f in doc["files"]}
    assert set(files) == {p.name for p in d.iterdir()}
    for name, f in files.items():
        assert f["status"] == "ok" and f["reference"] == "manifest"
        assert f["sha256"] == hashlib.sha256((d / name).read_bytes()).hexdigest()
    assert doc["totals"]["bytes_read"] == sum(p.stat().st_size for p in d.iterdir())
    assert doc["totals"]["tensors_scanned"] > 200
    found = {f["code"] for f in doc["findings"]}
    assert found == {"FP8_SATURATED"}  # each 128x128 block's maximum is at ±448: info


def test_manifest_is_model_signings_statement(pristine: tuple[Path, Path]) -> None:
    d, m = pristine
    doc = json.loads(m.read_text())
    assert doc["_type"] == STATEMENT_TYPE and doc["predicateType"] == PREDICATE_TYPE
    pred = doc["predicate"]
    assert pred["serialization"]["method"] == "files" and pred["serialization"]["hash_type"] == "sha256"
    names = [r["name"] for r in pred["resources"]]
    assert names == sorted(names, key=lambda n: n.split("/")) and set(names) == {p.name for p in d.iterdir()}
    assert all(r["algorithm"] == "sha256" for r in pred["resources"])
    # the subject's digest: sha256 over the resources' digests in order, as model_signing checks it
    h = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in pred["resources"])).hexdigest()
    assert doc["subject"][0]["digest"]["sha256"] == h
    assert h == root_digest({r["name"]: r["digest"] for r in pred["resources"]})
    start, header = header_of(d / S2)
    data = (d / S2).read_bytes()
    b, e = header[Q_B]["data_offsets"]
    assert pred["kimi_audit"]["tensors"][S2][Q_B] == hashlib.sha256(data[start + b:start + e]).hexdigest()
    # a tampered list is refused (exit 2), so is another serialization
    bad = json.loads(m.read_text())
    bad["predicate"]["resources"][0]["digest"] = "0" * 64
    with pytest.raises(Exception, match="inconsistent"):
        parse_manifest(bad)
    bad["predicate"]["serialization"]["method"] = "shards"
    with pytest.raises(Exception, match="files"):
        parse_manifest(bad)


def test_a_signed_bundle_is_read_too(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    import base64

    _, m = pristine
    bundle = {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
              "dsseEnvelope": {"payload": base64.b64encode(m.read_bytes()).decode(),
                               "payloadType": "application/vnd.in-toto+json", "signatures": []}}
    (tmp_path / "model.sig").write_text(json.dumps(bundle))
    assert read_manifest(tmp_path / "model.sig").files == read_manifest(m).files


# ------------------------------------------------------------------ hashes


def test_flipped_byte_names_the_file_and_the_tensor(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    d = copy_of(pristine, tmp_path)
    start, header = header_of(d / S2)
    b, e = header[Q_B]["data_offsets"]
    at = start + (b + e) // 2  # mid-tensor, mid-shard
    with open(d / S2, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x01]))  # a valid FP8 value still: only the hash sees it
    report, _ = verify(d, manifest=pristine[1], workers=2)
    found = codes(report)
    assert set(found) == {"FILE_HASH_MISMATCH", "TENSOR_HASH_MISMATCH", "FP8_SATURATED"}
    (file_f,) = found["FILE_HASH_MISMATCH"]
    assert file_f.shard == S2 and Q_B in file_f.message and "1 tensor differs:" in file_f.message
    (tensor_f,) = found["TENSOR_HASH_MISMATCH"]
    assert (tensor_f.tensor, tensor_f.shard) == (Q_B, S2)
    assert {f.name: f.status for f in report.files}[S2] == "mismatch" and report.exit_code == 1
    r = run("verify", str(d), "--manifest", str(pristine[1]), "--no-progress")
    assert r.exit_code == 1 and "FILE_HASH_MISMATCH" in r.stdout and "FAIL" in r.stdout


def test_absent_and_unlisted_files(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    d = copy_of(pristine, tmp_path)
    (d / "config.json").rename(d / "config.json.bak")
    shutil.copy(d / "config.json.bak", d / "config.json")
    (d / "model-3-of-3.safetensors").unlink()
    report, _ = verify(d, manifest=pristine[1])
    found = codes(report)
    assert [f.shard for f in found["FILE_ABSENT"]] == ["model-3-of-3.safetensors"]
    assert [f.shard for f in found["FILE_UNLISTED"]] == ["config.json.bak"]
    assert {f.name: f.status for f in report.files}["model-3-of-3.safetensors"] == "absent"


def test_truncated_shard(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    d = copy_of(pristine, tmp_path)
    size = (d / S2).stat().st_size
    os.truncate(d / S2, size - 1000)
    report, _ = verify(d, manifest=pristine[1])
    found = codes(report)
    assert found["DATA_PAST_EOF"][0].shard == S2  # the audit's header check, first
    assert found["FILE_HASH_MISMATCH"][0].shard == S2
    assert "FP8_NAN" not in found and report.exit_code == 1


def test_manifest_of_another_revision(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    """Two snapshots of an HF cache layout: the manifest of the first does not verify the second."""
    snaps = tmp_path / "models--test-org--tiny" / "snapshots"
    a, b = snaps / ("a" * 40), snaps / ("b" * 40)
    shutil.copytree(pristine[0], a)
    shutil.copytree(pristine[0], b)
    cfg = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps({**cfg, "rope_theta": 60000.0}))
    m = tmp_path / "a.json"
    assert run("verify", str(a), "--write-manifest", str(m), "--no-progress").exit_code == 0
    assert read_manifest(m).revision == "a" * 40
    report, _ = verify(b, manifest=m)
    found = codes(report)
    (rev,) = found["MANIFEST_REVISION"]
    assert rev.expected == "a" * 40 and rev.actual == "b" * 40
    assert [f.shard for f in found["FILE_HASH_MISMATCH"]] == ["config.json"]


# ------------------------------------------------------------------ weight health


def _with(mutate) -> dict:
    shards = tiny_shards()
    mutate(shards)
    return shards


def test_fp8_nan_named_with_tensor_and_offset(tmp_path: Path) -> None:
    def put_nan(shards: dict) -> None:
        w = shards[S2][Q_B].view(np.uint8)
        w[100, 7] = 0x7F
        w[120, 3] = 0xFF

    d = write_tiny(tmp_path / "ckpt", _with(put_nan))
    report, _ = verify(d)
    (f,) = codes(report)["FP8_NAN"]
    cols = tiny_shards()[S2][Q_B].shape[1]
    assert (f.tensor, f.shard, f.actual, f.expected) == (Q_B, S2, 2, 100 * cols + 7)
    assert f"element {100 * cols + 7:,}" in f.message and report.exit_code == 1


def test_all_zero_block_full_and_partial(tmp_path: Path) -> None:
    def zero(shards: dict) -> None:
        shards[S2][Q_B][0:128, 0:128] = 0  # [192, 192]: block (0, 0)
        shards[S2][GATE][128:160, 256:320] = 0  # [160, 320]: the corner block, 32 x 64

    d = write_tiny(tmp_path / "ckpt", _with(zero))
    found = {f.tensor: f for f in codes(verify(d, chunk=1 << 14)[0])["BLOCK_ALL_ZERO"]}
    assert set(found) == {Q_B, GATE}
    assert found[Q_B].actual == 1 and "block (0, 0)" in found[Q_B].message
    assert found[GATE].expected == 128 * 320 + 256 and "block (1, 2)" in found[GATE].message


def test_bf16_nan_inf_and_scales(tmp_path: Path) -> None:
    embed = "model.embed_tokens.weight"
    scale = Q_B + "_scale_inv"

    def bad(shards: dict) -> None:
        shards["model-1-of-3.safetensors"][embed][3, 5] = np.nan
        shards["model-1-of-3.safetensors"][embed][4, 0] = -np.inf
        shards[S2][scale][0, 1] = 0.0

    d = write_tiny(tmp_path / "ckpt", _with(bad))
    found = codes(verify(d)[0])
    width = tiny_shards()["model-1-of-3.safetensors"][embed].shape[1]
    assert [(f.tensor, f.expected) for f in found["VALUE_NAN"]] == [(embed, 3 * width + 5)]
    assert [(f.tensor, f.expected) for f in found["VALUE_INF"]] == [(embed, 4 * width)]
    assert [(f.tensor, f.expected) for f in found["SCALE_NOT_POSITIVE"]] == [(scale, 1)]


def test_small_pieces_give_the_same_results(pristine: tuple[Path, Path]) -> None:
    """Pieces end on tensor row bands and elements whatever the chunk: results do not depend on it."""
    d = pristine[0]
    start, header = header_of(d / S2)
    tensors = tuple(sorted((TensorPlan(n, v["dtype"], tuple(v["shape"]), start + v["data_offsets"][0],
                                       start + v["data_offsets"][1], tensor_kind(n, v["dtype"], tuple(v["shape"])),
                                       (128, 128)) for n, v in header.items() if n != "__metadata__"),
                           key=lambda t: t.begin))
    size = (d / S2).stat().st_size
    results = [verify_file(FileTask(S2, size, path=str(d / S2), tensors=tensors, tensor_hashes=True, chunk=c))
               for c in (1 << 24, 1 << 15, 1000)]
    assert all(r.error is None for r in results)
    for r in results[1:]:
        assert (r.sha256, r.tensor_sha256, r.saturated, r.health) == \
            (results[0].sha256, results[0].tensor_sha256, results[0].saturated, results[0].health)
    pieces = list(plan_pieces(size, tensors, 1000))
    assert pieces[0][0] == 0 and pieces[-1][1] == size and all(a[1] == b[0] for a, b in itertools.pairwise(pieces))


# ------------------------------------------------------------------ holes, interruption


def test_sparse_header_only_copy_is_data_not_present(pristine: tuple[Path, Path], tmp_path: Path) -> None:
    d = copy_of(pristine, tmp_path)
    for p in d.glob("*.safetensors"):
        start, _ = header_of(p)
        data = p.read_bytes()
        with open(p, "wb") as f:
            f.write(data[:start])
            f.truncate(len(data))
    if not LocalSource(d).holes(S2):
        pytest.skip(f"the filesystem under {d} makes no sparse holes")
    report, _ = verify(d, manifest=pristine[1])
    found = codes(report)
    assert sorted(f.shard for f in found["DATA_NOT_PRESENT"]) == sorted(p.name for p in d.glob("*.safetensors"))
    assert all(f.severity.value == "error" for f in found["DATA_NOT_PRESENT"])
    # never read as zeros: no all-zero block, no hash compared (none computed)
    assert not {"BLOCK_ALL_ZERO", "FILE_HASH_MISMATCH", "FP8_SATURATED"} & set(found)
    assert {f.status for f in report.files if f.name.endswith(".safetensors")} == {"data-not-present"}
    assert report.bytes_read < 100_000 and report.exit_code == 1


def test_interrupted_run_reports_what_was_checked(pristine: tuple[Path, Path]) -> None:
    src = LocalSource(pristine[0])
    prepared = prepare(VerifyTarget(src), VerifyOptions(workers=1))
    seen: list[str] = []

    def progress(name: str, done: int) -> None:
        if len(seen) == 2 and name not in seen:
            raise KeyboardInterrupt
        if name not in seen:
            seen.append(name)

    report, _ = verify_files(prepared, progress)
    assert report.interrupted and report.exit_code == 130
    assert report.verdict.startswith("INTERRUPTED:")
    assert 1 <= sum(f.status != "not-checked" for f in report.files) < len(report.files)


# ------------------------------------------------------------------ the Hub, the HF cache


def test_hub_lfs_reference_for_a_local_copy_and_streamed(hub, tiny_dir: Path, tmp_path: Path) -> None:
    good = run("verify", TINY_REPO, "--stream", "--json", "--no-progress")
    assert good.exit_code == 0, good.output
    doc = json.loads(good.stdout)
    shards = [f for f in doc["files"] if f["name"].endswith(".safetensors")]
    assert shards and all(f["status"] == "ok" and f["reference"] == "hub-lfs" for f in shards)
    local = Path(shutil.copytree(tiny_dir, tmp_path / "copy"))
    with open(local / S2, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        f.write(b"\x00")
    (local / "extra.txt").write_text("x")
    r = run("verify", TINY_REPO, "--local-dir", str(local), "--json", "--no-progress")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    found = {(f["code"], f["shard"]) for f in doc["findings"]}
    assert ("FILE_HASH_MISMATCH", S2) in found and ("FILE_UNLISTED", "extra.txt") in found
    assert doc["revision"] == hub.repos[TINY_REPO].commit


def test_hf_cache_blob_names_are_a_reference(hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as hc

    from kimi_audit.download.hub import download

    cache = tmp_path / "cache"
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    res = download(TINY_REPO, cache_dir=cache, endpoint=hub.endpoint)
    r = run("verify", TINY_REPO, "--json", "--no-progress")  # the cached snapshot, against the Hub's LFS
    assert r.exit_code == 0, r.output
    report, _ = verify(res.path)  # the snapshot itself: its blob names
    rows = {f.name: f for f in report.files}
    assert rows[S2].status == "ok" and rows[S2].reference == "hf-cache"
    blob = Path(os.path.realpath(res.path / S2))
    with open(blob, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        f.write(b"\x01")
    report, _ = verify(res.path)
    assert [f.shard for f in codes(report)["FILE_HASH_MISMATCH"]] == [S2]


def test_usage_errors() -> None:
    r = run("verify", "not/a-repo-on-disk", "--stream", "--local-dir", "x")
    assert r.exit_code == 2
    r = run("verify", "/no/such/dir/x")
    assert r.exit_code == 2


def test_audit_and_verify_open_a_source_alike(tiny_dir: Path) -> None:
    """One opener (sources.resolve_source): a Hub-only option on a local path, and a spec that is neither
    a path nor a repo id, are refused alike by audit and verify, with the same error code."""
    for command in ("audit", "verify"):
        r = run(command, str(tiny_dir), "--revision", "main", "--json")
        assert r.exit_code == 2
        err = json.loads(r.stdout)["error"]
        assert err["message"] == f"--revision applies to Hub repos, but {str(tiny_dir)!r} is a local path"
        r = run(command, "/no/such/dir/x", "--json")
        assert r.exit_code == 2 and json.loads(r.stdout)["error"]["code"] == "FILE_MISSING"
    r = run("verify", str(tiny_dir), "--revision", "main", "--local-dir", "x", "--json")
    assert json.loads(r.stdout)["error"]["message"].startswith("--revision and --local-dir apply to Hub repos")


# ------------------------------------------------------------------ Ray


@contextlib.contextmanager
def _own_ray_dir() -> Iterator[str]:
    """A Ray temp folder of this test's own, short (its socket paths must fit in 107 bytes), removed after."""
    path = tempfile.mkdtemp(prefix="kr-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("raised", ["LocalRayletDiedError", "RaySystemError", "ConnectionError"])
def test_ray_that_cannot_start_is_unusable_input_exit_2(pristine, monkeypatch, raised) -> None:
    """`verify --ray` beside another Ray on the host got LocalRayletDiedError from ray.init (a RayError, not
    the ConnectionError/RuntimeError/ValueError caught): a traceback, exit 1. Whatever Ray raises, one line,
    exit 2, naming the tool's options."""
    ray = pytest.importorskip("ray", reason="Ray is in the test extra: pip install -e '.[test]'")
    error = {"LocalRayletDiedError": ray.exceptions.LocalRayletDiedError(),
             "RaySystemError": ray.exceptions.RaySystemError("GCS went away. Retry later."),
             "ConnectionError": ConnectionError("Could not find any running Ray instance. Please ...")}[raised]

    def init(*args: object, **kw: object) -> None:
        raise error

    monkeypatch.setattr(ray, "init", init)
    d, _ = pristine
    r = run("verify", str(d), "--ray", "--no-progress")
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--ray-address" in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert "--address" not in lines[0].replace("--ray-address", "")


def test_ray_without_a_cluster_is_exit_2_whatever_runs_on_the_host(pristine, ray_alone) -> None:
    """`verify --ray` (Ray's "auto") on a host where no cluster runs: exit 2, one line. Ray's "auto" connects to
    any Ray it finds on the host (its processes, /tmp/ray): the test hides both (no process found, its own
    RAY_TMPDIR), so that another Ray running beside the suite does not decide the answer."""
    import ray

    d, _ = pristine
    r = run("verify", str(d), "--ray", "--no-progress")
    assert r.exit_code == 2 and not ray.is_initialized(), r.output
    assert "cannot connect to a Ray cluster at auto (Could not find any running Ray instance)" in r.stderr
    assert "--ray-address local" in r.stderr


def test_ray_gives_the_local_pools_results(pristine: tuple[Path, Path]) -> None:
    ray = pytest.importorskip("ray", reason="Ray is in the test extra: pip install -e '.[test]'")
    d, m = pristine
    local, _ = verify(d, manifest=m, workers=2)
    with _own_ray_dir() as temp_dir:  # its own session folder and sockets: never another Ray's on this host
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False, _temp_dir=temp_dir)
        try:
            remote, _ = verify(d, manifest=m, ray="local")
        finally:
            ray.shutdown()
    assert remote.workers.startswith("Ray")
    assert [(f.name, f.sha256, f.status) for f in remote.files] == [(f.name, f.sha256, f.status) for f in local.files]
    assert remote.findings == local.findings and remote.tensors_scanned == local.tensors_scanned


def test_help_loads_no_numpy() -> None:
    from test_imports import probe

    got, _ = probe(["verify", "--help"])
    assert got["code"] == 0 and not got["numpy"] and not got["ml_dtypes"]


def test_one_window_buffer_a_process(pristine: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker reads file after file into one buffer: a fresh bytearray a file (16 MiB, zero-filled and faulted in
    again) was counted, not timed. The tiny checkpoint's files in one process: the buffer is sized once, for the
    largest window (files are read largest first), then handed from each file's reader to the next."""
    import kimi_audit.verify.windows as windows

    sized: list[int] = []

    def counted(*args: int) -> bytearray:
        if args and args[0]:
            sized.append(args[0])
        return bytearray(*args)

    monkeypatch.setattr(windows, "bytearray", counted, raising=False)
    monkeypatch.setattr(windows, "_SPARE", [], raising=False)  # none from an earlier test
    d, _ = pristine
    report, _ = verify_files(prepare(VerifyTarget(LocalSource(d)), VerifyOptions(workers=1)))
    files = [f for f in report.files if f.bytes_read]
    assert len(files) >= 4 and report.verdict.startswith("PASS")
    assert len(sized) <= 2, (len(sized), len(files))  # the largest file's windows may grow once
