"""No false PASS, round two (issue 31): each class of input that passed where it should not, held by a test
that fails on the code before the fix."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_audit.errors import ConfigError
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.quant.compressed.pack import PackQuantized

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "kimi_audit" / "data"
THINKING = json.loads((DATA / "kimi-k2-thinking.config.json").read_text())


def thinking_with(**weights: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(THINKING)
    for group in cfg["quantization_config"]["config_groups"].values():
        group["weights"].update(weights)
    return cfg


# ------------------------------------------------------------------ 2: config values as their reference reads them


def test_symmetric_false_as_a_string_is_asymmetric_as_compressed_tensors_reads_it() -> None:
    """`"symmetric": "false"` read by truthiness was symmetric (no zero points expected, the audit passed);
    compressed-tensors' pydantic QuantizationArgs reads False, and its loader expects zero points."""
    from compressed_tensors.quantization import QuantizationArgs

    weights = thinking_with(symmetric="false")["quantization_config"]["config_groups"]
    reference = QuantizationArgs.model_validate(next(iter(weights.values()))["weights"])
    plan = model_config_from_dict(thinking_with(symmetric="false")).quant
    assert plan is not None
    scheme = plan.quantized
    assert isinstance(scheme, PackQuantized) and scheme.symmetric is reference.symmetric is False
    assert ".weight_zero_point" in [s.suffix for s in scheme.stored(7168, 2048)]


@pytest.mark.parametrize("value", ["maybe", "", " false", 2, 1.5, [], {}])
def test_a_value_compressed_tensors_refuses_is_refused(value: Any) -> None:
    with pytest.raises(ConfigError, match="symmetric"):
        model_config_from_dict(thinking_with(symmetric=value))


LAX = st.one_of(st.booleans(), st.integers(-2, 3), st.sampled_from([0.0, 1.0, 0.5, 4.0]),
                st.sampled_from(["true", "False", "YES", "no", "on", "OFF", "t", "f", "y", "n", "1", "0", "2",
                                 " true", "4", " 4 ", "4.0", "4.5", "x", ""]))


@settings(max_examples=150, deadline=None)
@given(symmetric=LAX, num_bits=st.one_of(st.integers(1, 8), st.sampled_from(["4", " 4", "4.0", 4.0, 4.5, "x",
                                                                                  True, None])))
def test_typed_fields_are_read_as_compressed_tensors_validates_them(symmetric: Any, num_bits: Any) -> None:
    """Typed-config fuzzing against compressed-tensors' own validation: where its QuantizationArgs accepts the
    weights, the plan's scheme holds the same symmetric and num_bits; where it refuses them, so does the audit
    (a ConfigError, or an unsupported scheme for values it accepts that no scheme implements)."""
    from compressed_tensors.quantization import QuantizationArgs
    from pydantic import ValidationError

    weights = {"num_bits": num_bits, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": 32}
    try:
        reference: Any = QuantizationArgs.model_validate(weights)
    except (ValidationError, TypeError):
        reference = None
    try:
        cfg = model_config_from_dict(thinking_with(**weights))
    except ConfigError:
        assert reference is None or not 1 <= reference.num_bits <= 8, (weights, reference)
        return
    if cfg.quant is None:  # a method or format no scheme implements: QUANT_UNSUPPORTED
        assert cfg.quant_unsupported is not None
        return
    assert reference is not None, weights
    scheme = cfg.quant.quantized
    assert isinstance(scheme, PackQuantized)
    assert (scheme.symmetric, scheme.bits) == (reference.symmetric, reference.num_bits), weights


# ------------------------------------------------------------------ 6: a manifest that lists nothing


def empty_manifest(tiny: Path, tmp_path: Path) -> Path:
    """A well-formed model-signing statement of no files (`resources: []`, its subject the digest of none)."""
    from kimi_audit.verify.manifest import Manifest, manifest_statement

    path = tmp_path / "empty.json"
    path.write_text(json.dumps(manifest_statement(Manifest(model=tiny.name, files={}))))
    return path


def test_a_manifest_that_lists_nothing_fails_unless_unlisted_files_are_ignored(tiny_copy: Path,
                                                                               tmp_path: Path) -> None:
    """`verify --manifest` of a statement with `resources: []` compared nothing and exited 0 with warnings; a
    manifest that does not cover the checkpoint now fails (model_signing's verify does), and --ignore-unlisted
    makes the unlisted files warnings again."""
    from kimi_audit.verify.findings import MAX_PER_CODE

    manifest = empty_manifest(tiny_copy, tmp_path)
    r = run_cli("verify", str(tiny_copy), "--manifest", str(manifest), "--json", "--no-progress")
    doc = json.loads(r.stdout)
    unlisted = [f for f in doc["findings"] if f["code"] == "FILE_UNLISTED"]
    assert r.returncode == 1 and unlisted and {f["severity"] for f in unlisted} == {"error"}
    assert len(unlisted) <= MAX_PER_CODE + 1
    r = run_cli("verify", str(tiny_copy), "--manifest", str(manifest), "--ignore-unlisted", "--json",
                "--no-progress")
    doc = json.loads(r.stdout)
    assert r.returncode == 0, doc["findings"]
    assert {f["severity"] for f in doc["findings"] if f["code"] == "FILE_UNLISTED"} == {"warning"}


def run_cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kimi_audit", *argv], capture_output=True, text=True, env=env,
                          errors="surrogateescape",
                          timeout=timeout)


# ------------------------------------------------------------------ 10: one root cause, one finding


@pytest.mark.parametrize("cut", [0.5, 0.02, 0.99])
def test_a_truncated_index_is_one_finding(tiny_copy: Path, cut: float) -> None:
    """An interrupted download leaves index.json cut short: INDEX_INVALID was followed by every entry
    missing (139,645 errors on the full-scale replica); the unreadable index is now the one finding, and the
    shards are audited as if there were no index."""
    import kimi_audit

    index = tiny_copy / "model.safetensors.index.json"
    raw = index.read_bytes()
    index.write_bytes(raw[: int(len(raw) * cut)])
    report = kimi_audit.audit(tiny_copy)
    assert [(f.code, f.severity.value) for f in report.findings if f.severity.value != "info"] == [
        ("INDEX_INVALID", "error")]
    assert report.exit_code() == 1 and report.stats.tensors > 0


# ------------------------------------------------------------------ 4: a near-miss model_type


@pytest.mark.parametrize("spelled", ["deepseek_v3 ", "deepseek\u200b_v3", "DeepSeek_V3", "deepseek_v33"])
def test_a_near_miss_model_type_is_inconclusive_and_named(tiny_copy: Path, spelled: str) -> None:
    """`"deepseek_v3 "` (a trailing space, a zero-width character, another case) with a shard and its index
    entries gone exited 0 with one LAYOUT_UNSUPPORTED warning. Now exit 3 (inconclusive), the near match named,
    and the shard the series' names count is a warning (SHARD_SERIES_GAP); `--ignore LAYOUT_UNSUPPORTED` is the
    user's way to accept it."""
    cfg = json.loads((tiny_copy / "config.json").read_text())
    del cfg["architectures"]  # (a config that names its class is read by it: no near miss there)
    (tiny_copy / "config.json").write_text(json.dumps(dict(cfg, model_type=spelled)))
    index = json.loads((tiny_copy / "model.safetensors.index.json").read_text())
    last = sorted(set(index["weight_map"].values()))[-1]
    (tiny_copy / last).unlink()
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != last}
    (tiny_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    r = run_cli("audit", str(tiny_copy), "--json", "--no-progress")
    doc = json.loads(r.stdout)
    (f,) = [f for f in doc["findings"] if f["code"] == "LAYOUT_UNSUPPORTED"]
    assert r.returncode == 3 and f["expected"] == "deepseek_v3" and "did you mean 'deepseek_v3'" in f["message"]
    assert ("warning", "SHARD_SERIES_GAP") in {(g["severity"], g["code"]) for g in doc["findings"]}
    r = run_cli("audit", str(tiny_copy), "--ignore", "LAYOUT_UNSUPPORTED", "--no-progress")
    assert r.returncode == 0, r.stdout[-2000:]


# ------------------------------------------------------------------ 9: any name a filesystem holds


@pytest.mark.parametrize("fmt", ["json", "sarif", "junit", "markdown", "html", "table"])
def test_a_file_name_that_is_not_utf8_is_reported_in_every_format(tiny_copy: Path, tmp_path: Path,
                                                                  fmt: str) -> None:
    """A shard named with bytes that are not UTF-8: `--format json --output` and `--format sarif` ended in a
    UnicodeEncodeError traceback and wrote no report (exit 1, read as findings). Every renderer escapes it."""
    os.close(os.open(os.path.join(os.fsencode(tiny_copy), b"stray\xff\xfe.safetensors"), os.O_CREAT | os.O_WRONLY))
    out = tmp_path / f"report.{fmt}"
    for argv in (["--output", str(out)], []):
        r = run_cli("audit", str(tiny_copy), "--format", fmt, "--no-progress", *argv)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
        text = out.read_text() if argv else r.stdout
        shown = text.replace("<wbr>", "")  # (HTML marks where a long name may wrap)
        assert "stray\\udcff\\udcfe.safetensors" in shown.replace("\\\\", "\\") or fmt == "table"
        if fmt == "json":
            assert json.loads(text)["result"]["verdict"] == "FAIL"


# ------------------------------------------------------------------ 5: every float dtype scanned


@pytest.mark.parametrize("dtype", ["F64", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"])
def test_a_tensor_all_nan_is_found_in_every_float_dtype(tiny_copy: Path, dtype: str) -> None:
    """A tensor all NaN in F64 or F8_E5M2 verified PASS while the report said values were checked: verify's
    scan read BF16/F16/F32 and FP8 E4M3 only. Every float dtype safetensors defines is scanned now."""
    import torch
    from safetensors.torch import load_file, save_file

    index = json.loads((tiny_copy / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.norm.weight"
    shard = tiny_copy / index[name]
    tensors = load_file(str(shard))
    width = tensors[name].shape
    torch_dtype = {"F64": torch.float64, "F8_E5M2": torch.float8_e5m2, "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
                   "F8_E5M2FNUZ": torch.float8_e5m2fnuz}[dtype]
    if dtype.endswith("FNUZ"):  # one NaN code, 0x80
        tensors[name] = torch.full(width, 0x80, dtype=torch.uint8).view(torch_dtype)
    else:
        tensors[name] = torch.full(width, float("nan"), dtype=torch.float64).to(torch_dtype)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    r = run_cli("verify", str(tiny_copy), "--json", "--no-progress", "-j", "1")
    doc = json.loads(r.stdout)
    nan = [f for f in doc["findings"] if f["code"] == "VALUE_NAN"]
    assert r.returncode == 1 and [f["tensor"] for f in nan] == [name], doc["findings"]


# ------------------------------------------------------------------ 3 and 11: diff compares data, and files


def test_diff_content_of_header_only_copies_is_not_identical(tmp_path: Path) -> None:
    """Header-only copies of two checkpoints whose weights all differ were IDENTICAL (holes read as zeros, and
    on a full-scale replica terabytes of them): holes are "not present", so the verdict is INCOMPLETE and no
    byte of a hole is read."""
    from kimi_audit.checks.diff import INCOMPLETE, content_diff, header_diff, verdict
    from kimi_audit.model.checkpoint import load_checkpoint
    from kimi_audit.sources.local import LocalSource
    from tiny_checkpoint import build_tiny

    copies = []
    for side in ("a", "b"):
        d = build_tiny(tmp_path / side)
        for shard in d.glob("*.safetensors"):  # keep the header, punch the data out: a sparse file of zeros
            header_len = 8 + int.from_bytes(shard.read_bytes()[:8], "little")
            size = shard.stat().st_size
            with open(shard, "r+b") as f:
                f.truncate(header_len)
                f.truncate(size)
        copies.append(d)
    src_a, src_b = LocalSource(copies[0]), LocalSource(copies[1])
    a, b = load_checkpoint(src_a), load_checkpoint(src_b)
    if not src_a.holes(next(iter(a.headers)), 0, 1 << 20):
        pytest.skip("this filesystem keeps no sparse holes")
    c = content_diff(src_a, a, src_b, b)
    assert c.compared == 0 and c.not_present and c.bytes_read == (0, 0)
    assert verdict(header_diff(a, b), c) == INCOMPLETE


def test_diff_names_a_stray_shard_that_duplicates_every_tensor(tiny_copy: Path, tiny_dir: Path) -> None:
    """A copy with an extra, unindexed shard that holds every tensor again was IDENTICAL: a loader that reads
    every file (mlx-lm) gets other weights. The shard files on one side only, and the names stored twice, are
    differences."""
    import shutil

    shard = sorted(tiny_copy.glob("model-*.safetensors"))[0]
    shutil.copy(shard, tiny_copy / "model-extra.safetensors")
    r = run_cli("diff", str(tiny_dir), str(tiny_copy), "--json", "--no-progress")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["verdict"] == "DIFFERENT"
    assert doc["shards_only"] == {"a": [], "b": ["model-extra.safetensors"]} and doc["duplicates"]["b"] > 0


def test_diff_names_index_entries_no_shard_stores(tiny_copy: Path, tiny_dir: Path) -> None:
    """A copy whose index lists 3 more names that no shard stores was IDENTICAL (its shards are the same; `audit`
    fails it, INDEX_TENSOR_ABSENT): the names a side's index lists in vain are a difference, named."""
    index = tiny_copy / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    shard = next(iter(doc["weight_map"].values()))
    ghosts = [f"model.layers.0.ghost_{i}.weight" for i in range(3)]
    doc["weight_map"].update(dict.fromkeys(ghosts, shard))
    index.write_text(json.dumps(doc))
    r = run_cli("diff", str(tiny_dir), str(tiny_copy), "--json", "--no-progress")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["verdict"] == "DIFFERENT"
    assert out["listed_only"] == {"a": [], "b": sorted(ghosts)}
    assert not (out["added"] or out["removed"] or out["changed"] or out["moved"])
    text = run_cli("diff", str(tiny_dir), str(tiny_copy), "--no-progress")
    assert text.returncode == 1 and "B's index lists 3 names no shard of B stores" in text.stdout
    same = run_cli("diff", str(tiny_dir), str(tiny_dir), "--json", "--no-progress")
    assert same.returncode == 0 and json.loads(same.stdout)["listed_only"] == {"a": [], "b": []}


# ------------------------------------------------------------------ 1: what is hashed is what was audited


@pytest.mark.parametrize("how", ["replaced", "rewritten"])
def test_a_shard_swapped_after_its_header_was_audited_is_not_certified(tiny_copy: Path, how: str) -> None:
    """A shard replaced by another of the same size (or rewritten in place, mtime set back) after verify's
    header audit and before its worker reads it: exit 0, and --write-manifest recorded the new file's hash.
    The file hashed must be the one whose header was audited: FILE_CHANGED, and no hash for it."""
    from kimi_audit.sources.local import LocalSource
    from kimi_audit.verify.run import VerifyOptions, VerifyTarget, prepare, verify_files

    shard = sorted(tiny_copy.glob("model-*.safetensors"))[1]
    prepared = prepare(VerifyTarget(LocalSource(tiny_copy)), VerifyOptions(workers=1, tensor_hashes=True))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the same size, one byte of a tensor's data flipped
    st = shard.stat()
    if how == "replaced":
        other = shard.with_suffix(".new")
        other.write_bytes(bytes(data))
        os.replace(other, shard)
    else:
        with open(shard, "r+b") as f:
            f.write(bytes(data))
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    report, manifest = verify_files(prepared)
    changed = [f for f in report.findings if f.code == "FILE_CHANGED"]
    assert [f.shard for f in changed] == [shard.name] and report.exit_code == 1
    assert {f.name: f.sha256 for f in report.files}[shard.name] is None and shard.name not in manifest.files


# ------------------------------------------------------------------ 7 and 8: every Hub read bounded


@pytest.mark.parametrize("where", ["/resolve/", "/api/"], ids=["file", "listing"])
def test_a_hub_that_trickles_bytes_is_cut_off_at_the_deadline(hub: Any, monkeypatch: pytest.MonkeyPatch,
                                                               where: str) -> None:
    """A server sending one byte every 0.2 s never trips HF_HUB_DOWNLOAD_TIMEOUT (each read gets its byte):
    `audit` ran past 90 s on config.json alone. Every request has an overall deadline
    (KIMI_AUDIT_HUB_DEADLINE), and the error names what stalled."""
    import time

    from hub_repos import TINY_REPO

    hub.add_fault("trickle", times=1000, match=where, stall_s=0.2)
    started = time.monotonic()
    r = run_cli_env({"HF_ENDPOINT": hub.endpoint, "KIMI_AUDIT_HUB_DEADLINE": "2", "HF_HUB_DISABLE_TELEMETRY": "1",
                     "NO_PROXY": "127.0.0.1,localhost"}, "audit", TINY_REPO, "--no-progress")
    elapsed = time.monotonic() - started
    assert r.returncode == 2 and "KIMI_AUDIT_HUB_DEADLINE" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert ("config.json" in r.stderr) if where == "/resolve/" else ("model info" in r.stderr)
    assert elapsed < 60, elapsed


def test_a_compressed_listing_is_bounded_as_it_inflates(hub: Any) -> None:
    """The repo listing was read whole and decompressed without a bound: a 2 MB gzip answer inflating to 2 GiB
    took 4.25 GB RSS. It is read as it inflates and refused past MAX_API_BYTES."""
    import psutil

    from hub_repos import TINY_REPO

    hub.add_fault("gzip_bomb", times=10, match="/api/", inflated=1 << 30)
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1,localhost"}
    proc = psutil.Popen([sys.executable, "-m", "kimi_audit", "audit", TINY_REPO, "--no-progress"],
                        env={**os.environ, "PYTHONPATH": str(ROOT), **env}, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, proc.memory_info().rss)
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "decompressed" in err and "Traceback" not in err, err
    assert peak < 600 << 20, peak


def run_cli_env(env: dict[str, str], *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kimi_audit", *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=timeout,
                          errors="surrogateescape")


def test_a_config_named_by_its_class_is_described_by_that_architecture() -> None:
    """A near-miss model_type beside a registered `architectures` class is read by that class's architecture,
    and its tree is that architecture's too (it fell back to DeepseekV3's tree for a DeepSeek-V4 config)."""
    import kimi_audit

    config = json.loads((DATA / "deepseek-v4-flash.config.json").read_text())
    config["model_type"] = "deepseek_v4 "
    layout = kimi_audit.layout(config)
    assert "embed.weight" in layout and "layers.0.attn.kv_norm.weight" in layout
    assert layout == kimi_audit.layout(dict(config, model_type="deepseek_v4"))
