"""Security: hostile paths, symlinks, pickles, tokens and interrupted downloads.

- shard names in index.json that are absolute, hold `..` or escape the directory: INDEX_UNSAFE_PATH,
  and the file they name is never opened (every open in the process is recorded);
- symlinks that leave the checkpoint directory: SYMLINK_OUTSIDE, never opened (an HF cache snapshot,
  whose files link into ../../blobs, is fine);
- a `.bin` whose unpickling would create a file: PICKLE_NOT_INSPECTED, and the file is not created;
- the HF token never appears in stdout, stderr, debug logs, reports or exceptions;
- a download interrupted mid-write leaves nothing under the final name.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from hub_repos import GATED_REPO, GATED_TOKEN, TINY_REPO
from hub_server import FakeHub
from kimi_audit.checks.audit import audit_source
from kimi_audit.constants import INDEX_FILE
from kimi_audit.errors import KimiAuditError
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.sources.local import LocalSource

CLI = [sys.executable, "-m", "kimi_audit"]


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path the process opens (builtins.open, io.open, os.open), resolved."""
    seen: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def rec(p: object) -> None:
        if isinstance(p, (str, bytes, os.PathLike)):
            seen.append(os.path.realpath(os.fsdecode(p)))

    def open_(file, *a, **kw):  # type: ignore[no-untyped-def]
        rec(file)
        return real_open(file, *a, **kw)

    def os_open(path, *a, **kw):  # type: ignore[no-untyped-def]
        rec(path)
        return real_os_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "open", os_open)
    return seen


def _canary(tmp_path: Path) -> Path:
    """A well-formed shard outside the checkpoint: if anything opened it, its tensor would show."""
    outside = tmp_path / "outside"
    outside.mkdir()
    canary = outside / "canary.safetensors"
    raw = json.dumps({"CANARY": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}).encode()
    canary.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0")
    return canary


def _add_to_index(ckpt: Path, entries: dict[str, str]) -> None:
    idx = json.loads((ckpt / INDEX_FILE).read_text())
    idx["weight_map"].update(entries)
    (ckpt / INDEX_FILE).write_text(json.dumps(idx))


# --- index.json shard names -----------------------------------------------------------------------

def test_unsafe_index_shard_names_are_refused_and_never_opened(
    tiny_copy: Path, tmp_path: Path, opened: list[str]
) -> None:
    canary = _canary(tmp_path)
    rel = os.path.relpath(canary, tiny_copy)
    hostile = {
        "t.abs": str(canary),  # absolute
        "t.dotdot": rel,  # ../outside/canary.safetensors
        "t.inner": f"sub/../{rel}",
        "t.dot": f"./{canary.name}",
        "t.backslash": "..\\outside\\canary.safetensors",
        "t.drive": "C:/outside/canary.safetensors",
        "t.nul": "canary.safetensors\x00.txt",
        "t.empty": "",
        "t.notstr": 5,
    }
    _add_to_index(tiny_copy, hostile)  # type: ignore[arg-type]
    ckpt = load_checkpoint(LocalSource(tiny_copy))
    unsafe = [f for f in ckpt.findings + ckpt.index.findings if f.code == "INDEX_UNSAFE_PATH"]  # type: ignore[union-attr]
    assert len(unsafe) == len(hostile)
    assert any(p.endswith(".safetensors") for p in opened)  # the recorder sees the shards being read
    assert str(canary) not in opened and not any("outside" in p for p in opened)
    assert all("CANARY" not in h.tensors for h in ckpt.headers.values())
    assert set(ckpt.index.weight_map) & set(hostile) == set()  # type: ignore[union-attr]


def test_unsafe_index_through_the_cli_is_one_finding_per_name(tiny_copy: Path, tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    _add_to_index(tiny_copy, {"t.abs": str(canary), "t.up": "../outside/canary.safetensors"})
    r = subprocess.run(
        [*CLI, "audit", str(tiny_copy), "--json", "--no-progress"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    codes = [f["code"] for f in json.loads(r.stdout)["findings"]]
    assert codes.count("INDEX_UNSAFE_PATH") == 2 and "CANARY" not in r.stdout


# --- symlinks -------------------------------------------------------------------------------------

def test_symlinks_leaving_the_directory_are_reported_and_never_opened(
    tiny_copy: Path, tmp_path: Path, opened: list[str]
) -> None:
    canary = _canary(tmp_path)
    (tiny_copy / "evil.safetensors").symlink_to(canary)
    (tiny_copy / "linkdir").symlink_to(canary.parent, target_is_directory=True)
    (tiny_copy / "abs.json").symlink_to("/etc/hostname")
    _add_to_index(tiny_copy, {"t.via_dir": "linkdir/canary.safetensors"})  # a "safe" name through a linked dir
    report = audit_source(LocalSource(tiny_copy))
    outside = sorted(f.shard for f in report.findings if f.code == "SYMLINK_OUTSIDE")
    assert outside == ["abs.json", "evil.safetensors", "linkdir"]
    assert all(f.severity.value == "error" for f in report.findings if f.code == "SYMLINK_OUTSIDE")
    assert any(p.endswith(".safetensors") for p in opened)
    assert str(canary) not in opened and os.path.realpath("/etc/hostname") not in opened
    assert report.exit_code() == 1


def test_symlinks_inside_the_directory_are_fine(tiny_copy: Path) -> None:
    shard = sorted(tiny_copy.glob("*.safetensors"))[0]
    moved = tiny_copy / "store" / shard.name
    moved.parent.mkdir()
    shard.rename(moved)
    shard.symlink_to(Path("store") / shard.name)
    report = audit_source(LocalSource(tiny_copy))
    assert not [f for f in report.findings if f.code in ("SYMLINK_OUTSIDE", "SHARD_UNREADABLE")]


def test_hf_cache_snapshot_links_into_blobs_are_fine(tiny_dir: Path, tmp_path: Path) -> None:
    """The HF cache layout: snapshots/<rev>/<file> -> ../../blobs/<hash>. Not an escape."""
    repo = tmp_path / "models--test-org--tiny"
    snap = repo / "snapshots" / ("a" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(tiny_dir.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    report = audit_source(LocalSource(snap))
    assert report.exit_code() == 0, [f for f in report.findings if f.severity.value == "error"]
    # ...but a link from the snapshot to another repo's blobs is an escape.
    other = tmp_path / "models--x--y" / "blobs"
    other.mkdir(parents=True)
    shutil.copy(sorted(tiny_dir.glob("*.safetensors"))[0], other / "b")
    (snap / "zz.safetensors").symlink_to(other / "b")
    report = audit_source(LocalSource(snap))
    assert [f.shard for f in report.findings if f.code == "SYMLINK_OUTSIDE"] == ["zz.safetensors"]


# --- pickles --------------------------------------------------------------------------------------

class _Payload:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (builtins.open, (self.path, "w"))  # unpickling creates the file


def test_pickle_checkpoint_is_reported_and_never_unpickled(tiny_copy: Path, tmp_path: Path) -> None:
    # The payload is live: unpickling it does create its file.
    control = tmp_path / "control-canary"
    pickle.loads(pickle.dumps(_Payload(str(control)))).close()
    assert control.exists()

    canary = tmp_path / "pickle-canary"
    payload = pickle.dumps(_Payload(str(canary)))
    for name in ("pytorch_model.bin", "training_args.bin", "model.pt", "optimizer.pth", "x.ckpt", "y.pkl"):
        (tiny_copy / name).write_bytes(payload)
    r = subprocess.run(
        [*CLI, "audit", str(tiny_copy), "--json", "--no-progress"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr  # warnings only
    found = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "PICKLE_NOT_INSPECTED"]
    assert sorted(f["shard"] for f in found) == sorted(
        ["pytorch_model.bin", "training_args.bin", "model.pt", "optimizer.pth", "x.ckpt", "y.pkl"])
    assert not canary.exists()


def test_pickle_only_checkpoint(tiny_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "pt"
    d.mkdir()
    shutil.copy(tiny_dir / "config.json", d)
    canary = tmp_path / "pickle-canary"
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(str(canary))))
    r = subprocess.run([*CLI, "audit", str(d), "--json", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    codes = {f["code"] for f in json.loads(r.stdout)["findings"]}
    assert {"PICKLE_NOT_INSPECTED", "NO_SAFETENSORS"} <= codes
    assert not canary.exists()


# --- the HF token ---------------------------------------------------------------------------------

SECRET = "hf_SuperSecretTokenDoNotLeak0123456789"


def _cli_env(hub: FakeHub, token: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_ENDPOINT=hub.endpoint, HF_TOKEN=token, HF_DEBUG="1", HF_HOME=str(tmp_path / "hf"),
               HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1,localhost", PYTHONWARNINGS="always")
    return env


def _assert_no_token(token: str, *texts: str) -> None:
    for t in texts:
        assert token not in t
        assert token[3:] not in t  # not even without its prefix


@pytest.mark.parametrize("argv, ok", [
    (["audit", GATED_REPO, "--no-progress"], False),  # wrong token for the gated repo: 403
    (["audit", GATED_REPO, "--json", "--no-progress"], False),
    (["audit", "test-org/no-such-repo", "--no-progress"], False),
    (["audit", f"{TINY_REPO}@0000000", "--no-progress"], False),  # unknown revision
    (["audit", TINY_REPO, "--json", "--no-progress"], True),  # public repo: token sent, never shown
    (["download", GATED_REPO, "--headers-only", "--local-dir", "{tmp}/dl"], False),
])
def test_token_never_appears_in_output_logs_or_errors(hub: FakeHub, tmp_path: Path, argv: list[str], ok: bool) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    r = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120, env=_cli_env(hub, SECRET, tmp_path))
    assert (r.returncode in (0, 1)) if ok else (r.returncode == 2), (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    if not ok:
        assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1
    _assert_no_token(SECRET, r.stdout, r.stderr)
    for f in tmp_path.rglob("*"):
        if f.is_file() and f.stat().st_size < 10_000_000:
            _assert_no_token(SECRET, f.read_bytes().decode("utf-8", "replace"))


def test_the_right_token_works_and_stays_hidden(hub: FakeHub, tmp_path: Path) -> None:
    r = subprocess.run([*CLI, "audit", GATED_REPO, "--json", "--no-progress"], capture_output=True, text=True,
                       timeout=120, env=_cli_env(hub, GATED_TOKEN, tmp_path))
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert json.loads(r.stdout)["source"].startswith(GATED_REPO)
    _assert_no_token(GATED_TOKEN, r.stdout, r.stderr)


def test_token_not_in_exceptions_or_reprs(hub: FakeHub) -> None:
    from kimi_audit.sources.hub import HubSource

    with pytest.raises(KimiAuditError) as ei:
        HubSource(GATED_REPO, endpoint=hub.endpoint, token=SECRET, retry_wait=0.01)
    text = "".join(traceback.format_exception(ei.value)) + str(ei.value) + repr(ei.value)
    text += repr(ei.traceback[-1].locals) if ei.traceback else ""
    _assert_no_token(SECRET, text)
    src = HubSource(GATED_REPO, endpoint=hub.endpoint, token=GATED_TOKEN, retry_wait=0.01)
    _assert_no_token(GATED_TOKEN, repr(src), str(src), repr(vars(src)), src.label)
    with pytest.raises(KimiAuditError) as ei:
        src.read_range("no-such-file.safetensors", 0, 8)
    _assert_no_token(GATED_TOKEN, "".join(traceback.format_exception(ei.value)))


# --- atomic downloads -----------------------------------------------------------------------------

class _Interrupt(BaseException):
    pass


def test_interrupted_headers_only_download_leaves_no_half_file(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kimi_audit.download import hub as dl
    from kimi_audit.sources.hub import HubSource

    src = HubSource(TINY_REPO, endpoint=hub.endpoint, retry_wait=0.01)
    shards = [n for n in src.list_files() if n.endswith(".safetensors")]
    real_fsync = os.fsync
    calls = {"n": 0}

    def fsync(fd: int) -> None:  # the interrupt lands after the bytes are written, before the rename
        calls["n"] += 1
        if calls["n"] == 3:
            raise _Interrupt()
        real_fsync(fd)

    monkeypatch.setattr(dl.os, "fsync", fsync)
    local = tmp_path / "dl"
    with pytest.raises(_Interrupt):
        dl.download(TINY_REPO, local_dir=local, headers_only=True, source=src)
    monkeypatch.setattr(dl.os, "fsync", real_fsync)
    # Whatever is under a final name is complete; the interrupted file was only under a temporary name, which
    # the interrupt removed (outputs.write_atomic).
    assert calls["n"] >= 3, "the interrupt should have caught a file mid-write"
    finals = [p for p in local.iterdir() if not p.name.startswith(".")]
    assert not [p for p in local.iterdir() if p.name.endswith(".partial")]
    for p in finals:
        if p.suffix == ".safetensors":
            assert p.stat().st_size == src.file_size(p.name)
            assert dl._header_complete(p, src.file_size(p.name))
        else:
            assert p.stat().st_size == src.file_size(p.name)
    assert len(finals) < len(src.list_files())
    # Resuming completes the download, and the audit of it is clean.
    dl.download(TINY_REPO, local_dir=local, headers_only=True, source=src)
    assert sorted(p.name for p in local.iterdir() if not p.name.startswith(".")) == sorted(src.list_files())
    assert {p.name for p in local.iterdir()} >= set(shards)
    assert audit_source(LocalSource(local)).exit_code() == 0


def test_truncated_full_download_leaves_no_file_under_the_final_name(hub: FakeHub, tmp_path: Path) -> None:
    from kimi_audit.download import hub as dl

    shard = sorted(n.name for n in hub.repos[TINY_REPO].root.glob("*.safetensors"))[0]
    hub.add_fault("truncate", times=50, match=shard)
    local = tmp_path / "full"
    with pytest.raises(KimiAuditError) as ei:  # one-line error after huggingface_hub's retries
        dl.download(TINY_REPO, local_dir=local, include=[shard], endpoint=hub.endpoint)
    assert "\n" not in str(ei.value)
    assert not (local / shard).exists()


# --- the CLI on hostile input: exit 1 or 2, never a traceback -------------------------------------

def _invoke(*argv: str):
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    result = CliRunner().invoke(app, list(argv))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)[:300]
    assert "Traceback" not in result.output
    return result


def _hostile_dir(tiny_dir: Path, d: Path) -> Path:
    from header_mutations import CLASSES, generate

    d.mkdir()
    shutil.copy(tiny_dir / "config.json", d)
    weight_map = {}
    for cls in CLASSES:
        for seed in range(3):
            name = f"model-{cls}-{seed}.safetensors"
            (d / name).write_bytes(generate(cls, seed))
            weight_map[f"{cls}.{seed}"] = name
    weight_map.update(
        {"u1": "/etc/passwd", "u2": "../x.safetensors", "u3": "a/../../b", "[/]\n\x1b[2J": "[/].safetensors"}
    )
    (d / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": "many"}, "weight_map": weight_map}))
    (d / "[red]\x1b[2J.safetensors").write_bytes(generate("valid", 1))
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04garbage")
    (d / "escape.safetensors").symlink_to("/etc/hostname")
    return d


def test_cli_on_a_directory_full_of_hostile_files(tiny_dir: Path, tmp_path: Path) -> None:
    d = _hostile_dir(tiny_dir, tmp_path / "hostile")
    table = _invoke("audit", str(d), "--no-progress")
    assert table.exit_code == 1 and table.output.strip().splitlines()[-1].startswith(("FAIL", "PARTIAL"))
    assert "\x1b[2J" not in table.output  # control characters from names are escaped
    js = _invoke("audit", str(d), "--json", "--no-progress")
    assert js.exit_code == 1
    codes = {f["code"] for f in json.loads(js.stdout)["findings"]}
    assert {"INDEX_UNSAFE_PATH", "SYMLINK_OUTSIDE", "PICKLE_NOT_INSPECTED", "HEADER_INVALID_JSON"} <= codes


def test_cli_on_each_hostile_shard_alone(tiny_dir: Path, tmp_path: Path) -> None:
    from header_mutations import CLASSES, generate

    for cls in CLASSES:
        for seed in range(2):
            d = tmp_path / f"{cls}-{seed}"
            d.mkdir()
            shutil.copy(tiny_dir / "config.json", d)
            (d / "model.safetensors").write_bytes(generate(cls, seed))
            r = _invoke("audit", str(d), "--json", "--no-progress")
            assert r.exit_code == 1, (cls, seed, r.output[-500:])  # the tiny layout is never all there
            json.loads(r.stdout)


def _cfg(**changes: object) -> bytes:
    from tiny_checkpoint import TINY_CONFIG

    return json.dumps({**TINY_CONFIG, **changes}).encode()


@pytest.mark.parametrize("config", [
    b"", b"not json", b"[]", b"\xff\xfe", b"[" * 100_000, b'{"hidden_size": "x"}', b"null",
    _cfg(torch_dtype=[]), _cfg(torch_dtype={"a": 1}), _cfg(rms_norm_eps="x"), _cfg(rms_norm_eps=float("nan")),
    _cfg(num_hidden_layers=10**6), _cfg(n_routed_experts=10**7), _cfg(num_hidden_layers=-1),
    _cfg(quantization_config={"weight_block_size": [0, 0]}), _cfg(quantization_config=[]),
    _cfg(hidden_size=10**30), _cfg(moe_layer_freq=0), _cfg(first_k_dense_replace=10**9), _cfg(vocab_size=True),
    _cfg(quantization_config={"quant_method": [], "fmt": {}, "weight_block_size": [1, 1]}),
    _cfg(model_type="\ud800"), _cfg(architectures=["\udc00"]), b"{\"a\": \"\\\\ud800\"}",
])
def test_cli_on_hostile_config_json(tiny_dir: Path, tmp_path: Path, config: bytes) -> None:
    d = tmp_path / "c"
    shutil.copytree(tiny_dir, d)
    (d / "config.json").write_bytes(config)
    r = _invoke("audit", str(d), "--no-progress")
    assert r.exit_code in (1, 2)
    if r.exit_code == 2:
        lines = [line for line in r.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), r.output


@pytest.mark.parametrize("index", [
    b"", b"\xff", b"[]", b"{}", b'{"weight_map": []}', b'{"weight_map": {"a": 5, "b": null, "c": []}}',
    b'{"weight_map": {}, "metadata": []}', b'{"weight_map": {}, "metadata": {"total_size": -1}}',
    b"[" * 100_000, b'{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}',
    b'{"weight_map": {"\\ud800": "model-1-of-3.safetensors"}}', b'{"weight_map": {"x": "' + b"a" * 100_000 + b'"}}',
])
def test_cli_on_hostile_index_json(tiny_dir: Path, tmp_path: Path, index: bytes) -> None:
    d = tmp_path / "i"
    shutil.copytree(tiny_dir, d)
    (d / INDEX_FILE).write_bytes(index)
    r = _invoke("audit", str(d), "--no-progress")
    assert r.exit_code in (1, 2)
    js = _invoke("audit", str(d), "--json", "--no-progress")
    assert js.exit_code == r.exit_code
    if js.exit_code == 1:
        json.loads(js.stdout)
