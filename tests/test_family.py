"""Full-scale header replicas of the family (Kimi-K2-Instruct-0905, -Thinking, DeepSeek-V3, V3.2) audit clean
with their snapshot totals, and a fault per quantization scheme is reported once, naming its tensor."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kimi_audit.checks.audit import AuditReport, audit_source
from kimi_audit.cli import app
from kimi_audit.constants import INDEX_FILE
from kimi_audit.replica.build import ReplicaTensor, replica_shards, write_shard
from kimi_audit.replica.models import REPLICA_MODELS
from kimi_audit.sources import LocalSource
from shard_builder import sparse_copy

SNAPSHOT = {
    # Regression snapshot, not a published figure: model -> (tensors, shards, parameters, elements with scales
    # and packed words) as this audit computed them from each replica when the replica was added. A change
    # here is a change in the layout derivation or the counting, to be explained.
    "kimi-k2-instruct-0905": (139_644, 62, 1_026_408_232_448, 1_026_470_731_056),
    "kimi-k2-thinking": (208_276, 62, 1_026_408_232_448, 170_267_041_624),
    "deepseek-v3": (91_991, 163, 684_489_845_504, 684_531_386_000),
    "deepseek-v32": (92_425, 163, 685_355_329_792, 685_396_921_376),
    "kimi-k3": (497_052, 96, 2_779_484_478_208, 1_503_199_714_048),
}


@pytest.fixture(scope="session")
def clean_reports(family_replica: Callable[[str], Path]) -> Callable[[str], AuditReport]:
    reports: dict[str, AuditReport] = {}

    def get(model: str) -> AuditReport:
        if model not in reports:
            reports[model] = audit_source(LocalSource(family_replica(model)))
        return reports[model]

    return get


def copy_of(src: Path, dst: Path) -> Path:
    """Shards as hard links (replace one, never write into it), the small files as copies."""
    return sparse_copy(src, dst)


def payload_of(path: Path) -> int:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
    return path.stat().st_size - 8 - n


def rewrite(directory: Path, shard: str, tensors: list[ReplicaTensor] | None) -> None:
    """Replace one shard by these tensors (None: delete it), and the index to match, as a writer that
    saved the faulty model would: the only fault left is the injected one."""
    index = json.loads((directory / INDEX_FILE).read_text())
    old = payload_of(directory / shard)
    wm = {n: s for n, s in index["weight_map"].items() if s != shard}
    new = 0
    if tensors is None:
        os.remove(directory / shard)
    else:
        tmp = directory / (shard + ".new")
        new = write_shard(tmp, tensors, seed=0, fill_small=False)
        os.replace(tmp, directory / shard)
        wm.update((t.name, shard) for t in tensors)
    index["weight_map"] = wm
    index["metadata"]["total_size"] += new - old
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def not_info(r: AuditReport) -> list[tuple[str, str, str | None]]:
    return [(f.severity.value, f.code, f.tensor) for f in r.findings if f.severity.value != "info"]


def shard_of(directory: Path, name: str) -> str:
    return str(json.loads((directory / INDEX_FILE).read_text())["weight_map"][name])


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(SNAPSHOT))
def test_replica_audits_clean_with_the_snapshot_totals(model, family_replica, clean_reports):
    tensors, shards, parameters, elements = SNAPSHOT[model]
    r = clean_reports(model)
    assert not_info(r) == []
    assert not r.findings  # Kimi's stored inv_freq [56] is what the layout expects (KIMI_K2_INV_FREQ)
    assert (r.stats.tensors, r.stats.shards, r.stats.parameters, r.stats.elements) == (
        tensors, shards, parameters, elements)
    names = sorted(p.name for p in family_replica(model).glob("*.safetensors"))
    assert names == [f"model-{i:05d}-of-{shards:06d}.safetensors" for i in range(1, shards + 1)]


@pytest.mark.slow
def test_deepseek_v3_stores_its_mtp_layer_alone_in_the_last_shard(family_replica):
    d = family_replica("deepseek-v3")
    wm = json.loads((d / INDEX_FILE).read_text())["weight_map"]
    last = "model-00163-of-000163.safetensors"
    assert {s for n, s in wm.items() if n.startswith("model.layers.61.")} == {last}
    assert all(n.startswith("model.layers.61.") for n, s in wm.items() if s == last)
    assert not any(n.endswith(".inv_freq") for n in wm)
    assert wm["model.embed_tokens.weight"] == "model-00001-of-000163.safetensors"


@pytest.mark.slow
def test_thinking_stores_int4_metadata_with_values(family_replica):
    d = family_replica("kimi-k2-thinking")

    def read(name: str, dtype: type) -> np.ndarray:
        path = d / shard_of(d, name)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            entry = json.loads(f.read(n))[name]
            begin, end = entry["data_offsets"]
            f.seek(8 + n + begin)
            return np.frombuffer(f.read(end - begin), dtype)

    assert read("model.layers.7.mlp.experts.100.gate_proj.weight_shape", np.int32).tolist() == [2048, 7168]
    assert read("model.layers.7.mlp.experts.0.down_proj.weight_shape", np.int32).tolist() == [7168, 2048]
    scale = read("model.layers.7.mlp.experts.0.down_proj.weight_scale", np.uint16)
    assert scale.size == 7168 * 64 and (scale > 0).all() and (scale < 0x7F80).all()  # positive, finite BF16


@pytest.mark.slow
def test_thinking_missing_group_scale_is_named_once(family_replica, tmp_path):
    d = copy_of(family_replica("kimi-k2-thinking"), tmp_path / "thinking")
    victim = "model.layers.30.mlp.experts.200.down_proj.weight_scale"
    shard = shard_of(d, victim)
    rewrite(d, shard, [t for t in replica_shards(model="kimi-k2-thinking")[shard] if t.name != victim])
    assert not_info(audit_source(LocalSource(d))) == [("error", "SCALE_MISSING", victim)]


@pytest.mark.slow
def test_thinking_packed_shape_off_by_one_is_named_once(family_replica, tmp_path):
    d = copy_of(family_replica("kimi-k2-thinking"), tmp_path / "thinking")
    victim = "model.layers.30.mlp.experts.200.gate_proj.weight_packed"
    shard = shard_of(d, victim)
    tensors = [ReplicaTensor(t.name, t.dtype, (2048, 895)) if t.name == victim else t
               for t in replica_shards(model="kimi-k2-thinking")[shard]]
    rewrite(d, shard, tensors)
    assert not_info(audit_source(LocalSource(d))) == [("error", "SHAPE_MISMATCH", victim)]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "victim"), [
    ("deepseek-v3", "model.layers.30.mlp.experts.200.down_proj.weight_scale_inv"),
    ("deepseek-v32", "model.layers.30.self_attn.indexer.wk.weight_scale_inv"),
])
def test_missing_fp8_scale_is_named_once(family_replica, tmp_path, model, victim):
    d = copy_of(family_replica(model), tmp_path / model)
    shard = shard_of(d, victim)
    rewrite(d, shard, [t for t in replica_shards(model=model)[shard] if t.name != victim])
    assert not_info(audit_source(LocalSource(d))) == [("error", "SCALE_MISSING", victim)]


@pytest.mark.slow
def test_absent_mtp_layer_is_one_warning(family_replica, tmp_path):
    d = copy_of(family_replica("deepseek-v3"), tmp_path / "v3")
    rewrite(d, "model-00163-of-000163.safetensors", None)  # the shard holds layer 61 alone
    r = audit_source(LocalSource(d))
    assert [(f.severity.value, f.code, f.tensor) for f in r.findings] == [("warning", "MTP_ABSENT", "model.layers.61")]
    assert r.stats.parameters == 671_026_419_200


@pytest.mark.slow
def test_every_model_has_its_shards_and_no_empty_one():
    for name, m in REPLICA_MODELS.items():
        shards = replica_shards(model=name)
        assert len(shards) == m.shards and all(shards.values()), name


@pytest.mark.slow
def test_demo_builds_and_audits_thinking(tmp_path):
    r = CliRunner().invoke(app, ["demo", str(tmp_path / "thinking"), "--model", "kimi-k2-thinking", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["result"]["verdict"] == "PASS"
    assert len(list((tmp_path / "thinking").glob("model-*-of-000062.safetensors"))) == 62


def test_demo_lists_and_checks_model_names(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["demo", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for name in REPLICA_MODELS:
        assert name in r.stdout
    r = runner.invoke(app, ["demo", str(tmp_path / "x"), "--model", "kimi-k9"])
    assert r.exit_code == 2 and "kimi-k2-thinking" in r.stderr
    assert not (tmp_path / "x").exists()
