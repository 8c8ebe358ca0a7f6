"""`kimi-audit diff`: header differences, parameter deltas, and byte differences by ranged hashing."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import threading
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from hub_repos import TINY_REPO
from kimi_audit.checks.diff import _Item, content_diff, hash_tensors, header_diff
from kimi_audit.cli import app
from kimi_audit.format.header import read_shard_header
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.model.config import parse_config_bytes, pinned_config_bytes
from kimi_audit.replica.build import ReplicaTensor, replica_shards, write_shard
from kimi_audit.sources import LocalSource
from tiny_checkpoint import TINY_CONFIG, tiny_shards, write_tiny

runner = CliRunner()
SHARD = "model-6-of-61.safetensors"
VICTIM = "model.layers.5.self_attn.q_a_layernorm.weight"
QA = "blocks.moe.attention.q_compression.q_a_layernorm"


def diff_json(*args):
    r = runner.invoke(app, ["diff", *map(str, args), "--json", "--no-progress"])
    return r.exit_code, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else r.output)


def rewrite_shard(replica_copy, tensors, flip: str | None = None):
    """Write shard 6 afresh (as build_replica does: seed 5), optionally flipping one tensor's first byte,
    and swap it in (the copy's shards are hard links: never written in place)."""
    tmp = replica_copy / (SHARD + ".new")
    write_shard(tmp, tensors, seed=5)
    if flip is not None:
        header = read_shard_header(LocalSource(replica_copy), SHARD + ".new")
        t = header.tensors[flip]
        with open(tmp, "r+b") as f:
            f.seek(header.data_start + t.begin)
            b = f.read(1)
            f.seek(header.data_start + t.begin)
            f.write(bytes([b[0] ^ 0x01]))
    os.replace(tmp, replica_copy / SHARD)


def pinned_cfg():
    return parse_config_bytes(pinned_config_bytes())[1]


def test_identical_replicas(replica_dir, replica_copy):
    r = runner.invoke(app, ["diff", str(replica_dir), str(replica_copy), "--content", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert not doc["differs"] and doc["a"]["parameters"] == doc["b"]["parameters"] == 1_026_408_232_448
    assert doc["added"] == doc["removed"] == doc["changed"] == doc["moved"] == doc["components"] == []
    c = doc["content"]
    assert c["reads"] == [0, 0] and c["identical_files"] == doc["a"]["tensors"]  # hard links: nothing read


def test_one_changed_tensor_shape_is_exactly_the_header_difference(replica_dir, replica_copy):
    tensors = [ReplicaTensor(t.name, t.dtype, (1535,)) if t.name == VICTIM else t
               for t in replica_shards(pinned_cfg())[SHARD]]
    rewrite_shard(replica_copy, tensors)
    code, doc = diff_json(replica_dir, replica_copy)
    assert code == 1
    assert doc["changed"] == [{"tensor": VICTIM, "a": {"dtype": "BF16", "shape": [1536], "shard": SHARD},
                               "b": {"dtype": "BF16", "shape": [1535], "shard": SHARD}}]
    assert doc["added"] == doc["removed"] == doc["moved"] == doc["config"] == []
    deltas = {c["key"]: c["delta"] for c in doc["components"]}
    assert deltas == {k: -1 for k in ("model", "blocks", "blocks.moe", "blocks.moe.attention",
                                      "blocks.moe.attention.q_compression", QA)}
    assert doc["b"]["parameters"] == doc["a"]["parameters"] - 1


def test_one_changed_tensor_bytes_found_by_ranged_hashing(replica_dir, replica_copy):
    rewrite_shard(replica_copy, replica_shards(pinned_cfg())[SHARD], flip=VICTIM)
    r = runner.invoke(app, ["diff", str(replica_dir), str(replica_copy), "--content", "--tensors",
                            "model.layers.5.self_attn.*", "--json", "--no-progress"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["added"] == doc["removed"] == doc["changed"] == doc["moved"] == doc["components"] == []
    c = doc["content"]
    assert [d["tensor"] for d in c["differing"]] == [VICTIM]
    layer5_attn = [t for t in replica_shards(pinned_cfg())[SHARD] if t.name.startswith("model.layers.5.self_attn.")]
    absent = set(c["not_present"])  # tensors in the original replica's sparse holes: not data, not compared
    assert c["compared"] + len(absent) == len(layer5_attn) and c["unchecked"] == [] and VICTIM not in absent
    assert c["bytes_read"] == [sum(t.nbytes for t in layer5_attn if t.name not in absent)] * 2
    # all of the changed shard's tensors, under a budget: the small ones are read, the rest reported unchecked
    budget = 8 << 20
    r = runner.invoke(app, ["diff", str(replica_dir), str(replica_copy), "--content", "--max-read", "8MiB",
                            "--json", "--no-progress"])
    c = json.loads(r.stdout)["content"]
    assert r.exit_code == 1 and [d["tensor"] for d in c["differing"]] == [VICTIM]
    assert max(c["bytes_read"]) <= budget
    in_shard = len(replica_shards(pinned_cfg())[SHARD])
    assert c["compared"] + len(c["unchecked"]) + len(c["not_present"]) == in_shard
    assert c["identical_files"] == json.loads(r.stdout)["a"]["tensors"] - in_shard


def test_added_removed_moved_and_config_on_tiny(tiny_dir, tmp_path):
    shards = tiny_shards()
    moved = "model.layers.2.self_attn.kv_a_layernorm.weight"
    removed = "model.layers.1.mlp.experts.3.up_proj.weight_scale_inv"
    shards["model-3-of-3.safetensors"][moved] = shards["model-2-of-3.safetensors"].pop(moved)
    shards["model-2-of-3.safetensors"].pop(removed)
    shards["model-2-of-3.safetensors"]["model.layers.1.extra"] = np.zeros(4, dtype=np.float32)
    b = write_tiny(tmp_path / "b", shards, {**TINY_CONFIG, "rope_theta": 10000.0})
    code, doc = diff_json(tiny_dir, b)
    assert code == 1
    assert [x["tensor"] for x in doc["moved"]] == [moved]
    assert doc["moved"][0]["b"]["shard"] == "model-3-of-3.safetensors"
    assert [x["tensor"] for x in doc["removed"]] == [removed]
    assert [x["tensor"] for x in doc["added"]] == ["model.layers.1.extra"]
    assert doc["config"] == [{"key": "rope_theta", "a": 50000.0, "b": 10000.0}]
    assert {c["key"]: c["delta"] for c in doc["components"]}["unaccounted"] == 4
    r = runner.invoke(app, ["diff", str(tiny_dir), str(b), "--no-progress"])
    assert r.exit_code == 1 and "DIFFERENT" in r.stdout and moved in r.stdout


def test_content_of_real_tiny_values(tiny_dir, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(tiny_dir, b)  # real copies: every tensor is hashed
    a_ck, b_ck = load_checkpoint(LocalSource(tiny_dir)), load_checkpoint(LocalSource(b))
    c = content_diff(LocalSource(tiny_dir), a_ck, LocalSource(b), b_ck)
    assert c.differing == () and c.compared == sum(h.tensor_count for h in a_ck.headers.values())
    shards = tiny_shards()
    name = "model.layers.3.mlp.shared_experts.down_proj.weight"
    arr = shards["model-3-of-3.safetensors"][name].copy()
    arr.view(np.uint8).reshape(-1)[-1] ^= 0x01
    shards["model-3-of-3.safetensors"][name] = arr
    write_tiny(b, shards)
    b_ck = load_checkpoint(LocalSource(b))
    assert not header_diff(a_ck, b_ck).differs
    c = content_diff(LocalSource(tiny_dir), a_ck, LocalSource(b), b_ck)
    assert [n for n, _x, _y in c.differing] == [name]


def test_hash_tensors_chunks_and_coalesces(tiny_dir):
    src = LocalSource(tiny_dir)
    shard = "model-2-of-3.safetensors"
    h = read_shard_header(src, shard)
    items = [_Item(n, shard, h.data_start + t.begin, t.end - t.begin) for n, t in h.tensors.items()]
    raw = (tiny_dir / shard).read_bytes()
    want = {i.name: hashlib.sha256(raw[i.start:i.start + i.length]).hexdigest() for i in items}
    for chunk in (1000, 1 << 16, 1 << 24):
        got, nbytes, reads = hash_tensors(src, items, chunk=chunk)
        assert got == want
        assert nbytes == sum(i.length for i in items)  # no byte read twice, none outside the tensors
    assert reads == 1  # one coalesced read when everything fits in a chunk


class _SlowSource(LocalSource):
    """A local checkpoint read like a remote one: reads in parallel, each taking a while."""

    parallel_reads = 4

    def __init__(self, root) -> None:
        super().__init__(root)
        self.active = self.most = 0
        self._lock = threading.Lock()

    def read_range(self, name, start, length):
        with self._lock:
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            time.sleep(0.01)
            return super().read_range(name, start, length)
        finally:
            with self._lock:
                self.active -= 1


def test_hash_tensors_reads_in_parallel_and_hashes_in_order(tiny_dir):
    shard = "model-2-of-3.safetensors"
    h = read_shard_header(LocalSource(tiny_dir), shard)
    items = [_Item(n, shard, h.data_start + t.begin, t.end - t.begin) for n, t in h.tensors.items()]
    raw = (tiny_dir / shard).read_bytes()
    want = {i.name: hashlib.sha256(raw[i.start:i.start + i.length]).hexdigest() for i in items}
    slow = _SlowSource(tiny_dir)
    got, nbytes, reads = hash_tensors(slow, items, chunk=1000)  # big tensors in many chunks, fed in order
    assert got == want
    assert (nbytes, reads) == hash_tensors(LocalSource(tiny_dir), items, chunk=1000)[1:]
    assert 1 < slow.most <= slow.parallel_reads


@pytest.mark.timeout(60)  # it was quadratic in the tensors left out: more than 60 s on the replica
def test_max_read_zero_leaves_every_tensor_unchecked(replica_dir):
    src = LocalSource(replica_dir)
    ckpt = load_checkpoint(src)
    c = content_diff(src, ckpt, src, ckpt, max_read=0)
    absent = set(c.not_present)  # the replica's sparse holes: never data, never in the budget
    total = sum(t.nbytes for h in ckpt.headers.values() for n, t in h.tensors.items() if n not in absent)
    assert c.compared == 0 and len(c.unchecked) + len(absent) == sum(h.tensor_count for h in ckpt.headers.values())
    assert absent and c.notes[0] == f"{len(c.unchecked):,} tensors ({total:,} bytes) not compared: over --max-read"


def test_hub_revisions_compared_by_lfs_sha256(hub, tiny_dir, tmp_path):
    commit = hub.repos[TINY_REPO].commit
    spec = f"{TINY_REPO}@{commit}"
    r = runner.invoke(app, ["diff", spec, f"{TINY_REPO}@{commit[:8]}", "--content", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)["content"]
    assert c["reads"] == [0, 0] and c["compared"] == 0 and c["identical_files"] > 0
    # against a local copy with one changed tensor: no shared file identity, so bytes are hashed
    shards = tiny_shards()
    name = "model.layers.0.self_attn.q_a_layernorm.weight"
    shards["model-1-of-3.safetensors"][name] = shards["model-1-of-3.safetensors"][name] * 2
    local = write_tiny(tmp_path / "local", shards)
    r = runner.invoke(app, ["diff", spec, str(local), "--content", "--json", "--no-progress"])
    assert r.exit_code == 1
    assert [d["tensor"] for d in json.loads(r.stdout)["content"]["differing"]] == [name]


def test_unusable_input_exits_2(tiny_dir, tmp_path):
    r = runner.invoke(app, ["diff", str(tiny_dir), str(tmp_path / "absent"), "--no-progress"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    r = runner.invoke(app, ["diff", str(tiny_dir), str(tiny_dir), "--max-read", "1GB", "--no-progress"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["diff", str(tiny_dir), str(tiny_dir), "--content", "--max-read", "lots"])
    assert r.exit_code == 2


def _smallest_and_budget(tiny_dir):
    """The smallest tensor (read first under --max-read) and a budget that reads about half the bytes."""
    ckpt = load_checkpoint(LocalSource(tiny_dir))
    sizes = sorted((t.end - t.begin, n, shard) for shard, h in ckpt.headers.items() for n, t in h.tensors.items())
    half = sum(s for s, _n, _sh in sizes) // 2
    return sizes[0], half


def test_max_read_leaving_tensors_unchecked_is_incomplete_not_different(tiny_dir, tiny_copy):
    _, budget = _smallest_and_budget(tiny_dir)  # tiny_copy: real copies, so every tensor is hashed
    code, doc = diff_json(tiny_dir, tiny_copy, "--content", "--max-read", budget)
    c = doc["content"]
    assert code == 1 and doc["verdict"] == "INCOMPLETE" and doc["differs"] is False
    assert c["differing"] == [] and c["unchecked"] and c["compared"] > 0
    assert max(c["bytes_read"]) <= budget  # a byte limit: not the gaps between the tensors it chose (issue 42)
    r = runner.invoke(app, ["diff", str(tiny_dir), str(tiny_copy), "--content", "--max-read", str(budget),
                            "--no-progress"])
    assert r.exit_code == 1 and "INCOMPLETE" in r.stdout and "DIFFERENT" not in r.stdout
    assert f"{len(c['unchecked']):,} tensors were left unchecked" in " ".join(r.stdout.split())
    # the whole of it read: IDENTICAL, exit 0
    code, doc = diff_json(tiny_dir, tiny_copy, "--content")
    assert code == 0 and doc["verdict"] == "IDENTICAL" and doc["content"]["unchecked"] == []


def test_a_checked_tensor_differing_is_different_even_with_some_unchecked(tiny_dir, tiny_copy):
    (_size, name, shard), budget = _smallest_and_budget(tiny_dir)
    h = read_shard_header(LocalSource(tiny_copy), shard)
    with open(tiny_copy / shard, "r+b") as f:  # a real copy: safe to write in place
        f.seek(h.data_start + h.tensors[name].begin)
        b = f.read(1)
        f.seek(h.data_start + h.tensors[name].begin)
        f.write(bytes([b[0] ^ 0x01]))
    code, doc = diff_json(tiny_dir, tiny_copy, "--content", "--max-read", budget)
    c = doc["content"]
    assert code == 1 and doc["verdict"] == "DIFFERENT" and doc["differs"] is True
    assert [d["tensor"] for d in c["differing"]] == [name] and c["unchecked"]
    r = runner.invoke(app, ["diff", str(tiny_dir), str(tiny_copy), "--content", "--max-read", str(budget),
                            "--no-progress"])
    assert r.exit_code == 1 and "DIFFERENT" in r.stdout and "INCOMPLETE" not in r.stdout
    assert f"{len(c['unchecked']):,} unchecked" in r.stdout


def test_content_progress_counts_bytes_up_to_the_total(tiny_dir, tiny_copy):
    a_src, b_src = LocalSource(tiny_dir), LocalSource(tiny_copy)
    calls: list[tuple[int, int]] = []
    c = content_diff(a_src, load_checkpoint(a_src), b_src, load_checkpoint(b_src), chunk=1000,
                     progress=lambda done, total: calls.append((done, total)))
    done = [d for d, _t in calls]
    totals = {t for _d, t in calls}
    assert len(totals) == 1 and calls[0] == (0, sum(c.bytes_read)) and len(calls) == 1 + sum(c.reads)
    assert all(x < y for x, y in itertools.pairwise(done)) and done[-1] == totals.pop()


def test_content_progress_bar_on_a_terminal(tiny_dir, tiny_copy, monkeypatch):
    import io

    from rich.console import Console

    import kimi_audit.cli.application as cli_app

    err = io.StringIO()
    monkeypatch.setattr(cli_app, "stderr", Console(file=err, force_terminal=True, width=150))
    r = runner.invoke(app, ["diff", str(tiny_dir), str(tiny_copy), "--content", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["verdict"] == "IDENTICAL"
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err.getvalue())  # without the terminal's escapes
    assert "comparing bytes of A and B" in shown
    assert re.search(r"(\d[\d.]*)/\1 [kMG]?B ", shown)  # the bytes done up to the total (DownloadColumn)
