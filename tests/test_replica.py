"""The full-scale header replica audits with zero errors and the pinned checkpoint's totals."""

from __future__ import annotations

import json
import os

from kimi_audit.checks.audit import audit_source
from kimi_audit.model.config import parse_config_bytes, pinned_config_bytes
from kimi_audit.replica.build import replica_shards, write_shard
from kimi_audit.sources import LocalSource


def test_replica_files_match_the_pinned_layout(replica_dir):
    shards = sorted(p.name for p in replica_dir.glob("*.safetensors"))
    assert len(shards) == 61 and "model-1-of-61.safetensors" in shards and "model-61-of-61.safetensors" in shards
    apparent = sum(p.stat().st_size for p in replica_dir.glob("*.safetensors"))
    on_disk = sum(p.stat().st_blocks * 512 for p in replica_dir.iterdir())
    # The "958.51 GB" quoted for the release is binary: payload 1,029,173,256,720 bytes + headers = 958.5 GiB.
    assert 958.4 < apparent / 2**30 < 958.6
    assert on_disk < 0.5e9
    wm = json.loads((replica_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert wm["model.embed_tokens.weight"] == wm["model.layers.0.mlp.down_proj.weight"] == "model-1-of-61.safetensors"
    assert wm["model.layers.1.mlp.gate.weight"] == "model-2-of-61.safetensors"
    assert wm["lm_head.weight"] == wm["model.norm.weight"] == "model-61-of-61.safetensors"


def test_clean_replica_audits_with_the_pinned_totals(replica_dir):
    r = audit_source(LocalSource(replica_dir))
    assert r.errors == 0
    assert r.stats.tensors == 139_644
    assert r.stats.parameters == 1_026_408_232_448
    assert r.stats.elements == 1_026_470_731_056
    assert r.stats.payload_bytes == 1_029_173_256_720
    # the release's inv_freq [56] (not qk_rope_head_dim / 2 = 32) is expected as stored: the demo's first screen
    # showed an info BUFFER_SHAPE on each of the 61 layers of what the tool calls the official release
    assert r.findings == ()
    lines = [t.line(1536) for t in r.q_a_layernorm.totals]
    assert lines == ["60 MoE blocks × 1,536 = 92,160", "1 dense block × 1,536 = 1,536"]
    assert r.q_a_layernorm.total_params == 93_696


def test_fault_in_one_full_scale_shard_is_named(replica_copy):
    _, cfg = parse_config_bytes(pinned_config_bytes())
    shard = "model-31-of-61.safetensors"
    victim = "model.layers.30.mlp.experts.200.down_proj.weight_scale_inv"
    tensors = [t for t in replica_shards(cfg)[shard] if t.name != victim]
    tmp = replica_copy / (shard + ".new")
    write_shard(tmp, tensors, seed=0, fill_small=False)
    os.replace(tmp, replica_copy / shard)
    r = audit_source(LocalSource(replica_copy))
    assert [(f.code, f.tensor) for f in r.findings if f.severity.value == "error"] == [
        ("SCALE_MISSING", victim), ("INDEX_TENSOR_ABSENT", victim)]
