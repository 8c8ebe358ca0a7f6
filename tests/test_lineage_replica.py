"""The full-scale DeepSeek-V4-Flash replica (issue 23 item 5): a config whose every value cites a source,
built and audited clean by `demo --model deepseek-v4-flash`, its layout transformers' (test_lineage_differential)."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_audit.checks.audit import audit_source
from kimi_audit.cli import app
from kimi_audit.constants import INDEX_FILE
from kimi_audit.replica.build import replica_shards, write_shard
from kimi_audit.sources import LocalSource
from shard_builder import sparse_copy

DATA = resources.files("kimi_audit").joinpath("data")


def test_every_v4_flash_config_value_cites_a_source() -> None:
    config = json.loads(DATA.joinpath("deepseek-v4-flash.config.json").read_text())
    sources = json.loads(DATA.joinpath("deepseek-v4-flash.sources.json").read_text())
    cited = {k for k in sources if not k.startswith("_")}
    assert set(config) == cited
    assert all(isinstance(v, str) and v for v in sources.values() if isinstance(v, str))
    # what no source gives is left out, and the file says so
    assert not {"layer_types", "quantization_config", "expert_dtype"} & set(config)
    assert {"quantization_config / expert_dtype"} == set(sources["_left_out"])
    assert len(config["compress_ratios"]) == config["num_hidden_layers"] + 1  # the MTP slot last


def test_v4_flash_shards_are_balanced_and_keep_the_hash_tables() -> None:
    shards = replica_shards(model="deepseek-v4-flash")
    assert len(shards) == 46 and all(shards.values())
    names = [t.name for ts in shards.values() for t in ts]
    assert {n for n in names if n.endswith("tid2eid")} == {f"layers.{i}.ffn.gate.tid2eid" for i in range(3)}
    assert {"embed.weight", "head.weight", "norm.weight", "hc_head_fn"} <= set(names)
    assert not any(n.startswith("model.") for n in names)
    assert sum(n.startswith("mtp.0.") for n in names) == 797  # the MTP stage (BF16 stand-in: no scales)


@pytest.mark.slow
def test_demo_builds_and_audits_deepseek_v4_flash(tmp_path: Path) -> None:
    d = tmp_path / "v4-flash"
    r = CliRunner().invoke(app, ["demo", str(d), "--model", "deepseek-v4-flash", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["result"]["verdict"] == "PASS"
    assert len(list(d.glob("model-*-of-000046.safetensors"))) == 46
    audit = audit_source(LocalSource(d))
    assert audit.findings == ()  # the release's spelling: no dialect, nothing to report
    # a snapshot of what the layout derives (family.md's "~284 B total", unconfirmed), not a published figure
    assert (audit.stats.tensors, audit.stats.parameters, audit.stats.elements, audit.stats.payload_bytes) == (
        35_020, 290_942_289_362, 290_944_616_402, 581_975_531_080)  # README's family table (its MTP stage included)


def test_a_missing_router_bias_in_the_v4_flash_replica_is_named_once(
    family_replica: Callable[[str], Path], tmp_path: Path
) -> None:
    d = sparse_copy(family_replica("deepseek-v4-flash"), tmp_path / "v4")
    victim = "layers.20.ffn.gate.bias"
    index = json.loads((d / INDEX_FILE).read_text())
    shard = index["weight_map"].pop(victim)
    tensors = [t for t in replica_shards(model="deepseek-v4-flash")[shard] if t.name != victim]
    write_shard(d / shard, tensors, seed=0, fill_small=False)
    index["metadata"]["total_size"] -= 256 * 4
    (d / INDEX_FILE).write_text(json.dumps(index))
    errors = [(f.code, f.tensor) for f in audit_source(LocalSource(d)).findings if f.severity.value == "error"]
    assert errors == [("TENSOR_MISSING", victim)]
