"""Root causes first: one finding per cause, stating what it covers; nothing it explains reported again."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
from typer.testing import CliRunner

from kimi_audit.checks.audit import audit_source
from kimi_audit.cli import app
from kimi_audit.findings import Severity
from kimi_audit.sources import LocalSource
from tiny_checkpoint import TINY_CONFIG, tiny_shards, write_tiny

S1, S2, S3 = "model-1-of-3.safetensors", "model-2-of-3.safetensors", "model-3-of-3.safetensors"
L1 = "model.layers.1."
INDEX = "model.safetensors.index.json"


def codes(report) -> Counter[str]:
    return Counter(f.code for f in report.findings)


def listed_in(path: Path, shard: str) -> int:
    return sum(1 for s in json.loads((path / INDEX).read_text())["weight_map"].values() if s == shard)


def test_a_partial_download_with_a_fault_in_a_present_shard_fails(tmp_path):
    shards = tiny_shards()
    norm = L1 + "input_layernorm.weight"
    shards[S2][norm] = shards[S2][norm].astype(np.float16)  # a real fault in a present shard (F32: writer variance)
    path = write_tiny(tmp_path / "ckpt", shards)
    counts = {s: listed_in(path, s) for s in (S1, S3)}
    (path / S1).unlink()
    (path / S3).unlink()
    r = audit_source(LocalSource(path))
    # a fault in what is present is a FAIL, with the absent shards beside it: PARTIAL would hide it
    assert r.headline() == "FAIL (2 of 3 shards absent)" and r.verdict() == "FAIL"
    absent = {f.shard: f.covers for f in r.findings if f.code == "INDEX_SHARD_ABSENT"}
    assert absent == counts
    assert codes(r) == Counter({"INDEX_SHARD_ABSENT": 2, "DTYPE_MISMATCH": 1})
    assert [f.tensor for f in r.findings if f.code == "DTYPE_MISMATCH"] == [norm]


def test_only_config_json_is_one_finding(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    r = audit_source(LocalSource(tmp_path))
    assert codes(r) == Counter({"NO_SAFETENSORS": 1})
    assert r.exit_code() == 1


def test_a_truncated_shard_is_reported_once_with_what_it_held(tiny_copy):
    n = listed_in(tiny_copy, S2)
    (tiny_copy / S2).write_bytes((tiny_copy / S2).read_bytes()[:5])
    r = audit_source(LocalSource(tiny_copy))
    assert codes(r) == Counter({"HEADER_TOO_SHORT": 1})
    (f,) = r.findings
    assert f.covers == n and f"{n:,} tensors" in f.message


def test_an_unusable_header_without_an_index_hides_no_shard_of_its_own(tiny_copy):
    (tiny_copy / INDEX).unlink()
    (tiny_copy / S2).write_bytes(b"\x10\0\0\0\0\0\0\0{not json at all}")
    r = audit_source(LocalSource(tiny_copy))
    assert codes(r) == Counter({"INDEX_MISSING": 1, "HEADER_INVALID_JSON": 1})


def test_a_missing_weight_does_not_also_report_its_scale(tmp_path):
    weight = L1 + "self_attn.q_a_proj.weight"
    shards = tiny_shards()
    shards[S2].pop(weight)
    shards[S2].pop(L1 + "self_attn.q_a_proj.weight_scale_inv")
    r = audit_source(LocalSource(write_tiny(tmp_path / "ckpt", shards)))
    assert codes(r) == Counter({"TENSOR_MISSING": 1})
    shards = tiny_shards()
    shards[S2].pop(L1 + "self_attn.q_a_proj.weight_scale_inv")  # the scale alone: still SCALE_MISSING
    r = audit_source(LocalSource(write_tiny(tmp_path / "again", shards)))
    assert codes(r) == Counter({"SCALE_MISSING": 1})


def test_a_missing_quantization_config_is_one_finding_naming_it(tmp_path):
    config = {k: v for k, v in TINY_CONFIG.items() if k != "quantization_config"}
    r = audit_source(LocalSource(write_tiny(tmp_path / "ckpt", tiny_shards(), config)))
    assert codes(r) == Counter({"QUANT_CONFIG": 1})
    (f,) = r.findings
    assert "quantization_config" in f.message and f.covers > 0 and f.severity is Severity.ERROR


def test_a_wrong_block_size_is_one_finding_covering_the_scale_shapes(tmp_path):
    config = json.loads(json.dumps(TINY_CONFIG))
    config["quantization_config"]["weight_block_size"] = [64, 64]
    r = audit_source(LocalSource(write_tiny(tmp_path / "ckpt", tiny_shards(), config)))
    assert codes(r) == Counter({"QUANT_CONFIG": 1})
    assert r.findings[0].covers > 0


def test_a_declared_mtp_layer_never_saved_is_one_warning(tmp_path):
    config = dict(TINY_CONFIG, num_nextn_predict_layers=1)
    r = audit_source(LocalSource(write_tiny(tmp_path / "ckpt", tiny_shards(), config)))
    assert codes(r) == Counter({"MTP_ABSENT": 1})
    (f,) = r.findings
    assert f.severity is Severity.WARNING and "num_nextn_predict_layers" in f.message and f.covers > 0
    assert r.exit_code() == 0 and r.exit_code(Severity.WARNING) == 1


def test_a_partly_stored_mtp_layer_is_checked_tensor_by_tensor(tmp_path):
    config = dict(TINY_CONFIG, num_nextn_predict_layers=1)
    shards = tiny_shards()
    mtp = "model.layers.4.enorm.weight"
    shards[S3][mtp] = np.ones(TINY_CONFIG["hidden_size"], ml_dtypes.bfloat16)
    r = audit_source(LocalSource(write_tiny(tmp_path / "ckpt", shards, config)))
    assert "MTP_ABSENT" not in codes(r) and codes(r)["TENSOR_MISSING"] > 10


def test_the_json_report_stays_small_whatever_the_input(tmp_path):
    """20,000 unexpected tensors with long names: grouped, capped and cut below 1 MB; --all-findings
    lists every one."""
    shards = tiny_shards()
    for i in range(20_000):
        shards[S3][f"junk.{'x' * 300}.{i}.weight"] = np.zeros(1, np.float32)
    path = write_tiny(tmp_path / "ckpt", shards)
    runner = CliRunner()
    r = runner.invoke(app, ["audit", str(path), "--json", "--no-progress"])
    assert r.exit_code == 1
    assert len(r.stdout.encode()) < 1_000_000
    doc = json.loads(r.stdout)
    assert doc["listing"]["findings"] == 20_000 and not doc["listing"]["complete"]
    (group,) = [g for g in doc["finding_groups"] if g["code"] == "TENSOR_UNEXPECTED"]
    assert group["count"] == 20_000
    full = runner.invoke(app, ["audit", str(path), "--json", "--no-progress", "--all-findings"])
    doc = json.loads(full.stdout)
    assert len(doc["findings"]) == 20_000 and doc["listing"]["complete"]


def test_the_table_verdict_agrees_with_the_exit_code(tmp_path, tiny_copy):
    runner = CliRunner()
    config = dict(TINY_CONFIG, num_nextn_predict_layers=1)
    path = write_tiny(tmp_path / "ckpt", tiny_shards(), config)
    for fail_on, code, verdict in (("error", 0, "PASS"), ("warning", 1, "FAIL")):
        r = runner.invoke(app, ["audit", str(path), "--no-progress", "--fail-on", fail_on], env={"COLUMNS": "200"})
        assert r.exit_code == code
        assert r.stdout.strip().splitlines()[-1].startswith(verdict)
    os.unlink(tiny_copy / S1)
    r = runner.invoke(app, ["audit", str(tiny_copy), "--no-progress"], env={"COLUMNS": "200"})
    assert r.exit_code == 1 and r.stdout.strip().splitlines()[-1].startswith("PARTIAL: 1 of 3 shards absent")


def test_a_shard_cut_inside_its_data_names_the_tensors_it_cuts(tiny_copy):
    """Issue 33: a truncated shard named the shard but not the tensors whose bytes are lost; DATA_PAST_EOF now
    counts them (covers), names the first, and lists a few."""
    import os

    from kimi_audit.format.header import read_shard_header

    header = read_shard_header(LocalSource(tiny_copy), S2)
    size = (tiny_copy / S2).stat().st_size
    os.truncate(tiny_copy / S2, size - 1)  # the last byte of the last tensor: exactly one tensor cut
    (f,) = [f for f in audit_source(LocalSource(tiny_copy)).findings if f.code == "DATA_PAST_EOF"]
    last = max(header.tensors, key=lambda n: header.tensors[n].end)
    assert f.covers == 1 and f.tensor == last and "the bytes of 1 tensor are cut" in f.message
    os.truncate(tiny_copy / S2, header.data_start + 1)  # all but one byte of the data gone: every tensor cut
    (f,) = [f for f in audit_source(LocalSource(tiny_copy)).findings if f.code == "DATA_PAST_EOF"]
    assert f.covers == len(header.tensors) and "more)" in f.message


def test_a_partial_download_with_nothing_else_wrong_is_partial(tiny_copy):
    (tiny_copy / S3).unlink()
    r = audit_source(LocalSource(tiny_copy))
    assert r.verdict() == "PARTIAL" and r.headline() == "PARTIAL: 1 of 3 shards absent" and r.exit_code() == 1
