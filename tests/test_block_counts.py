"""A block count the stored blocks contradict is one CONFIG_DISAGREES naming the key (checks.block_counts,
model.gguf_beside), not every tensor of the blocks it adds or removes: the layers and the leading dense layers of a
safetensors checkpoint and of a GGUF written by llama-quantize, and a projector's clip.vision.block_count."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import gguf_builder as gb
from kimi_audit import audit
from kimi_audit.replica.tiny import TINY_CONFIG, tiny_shards, write_tiny

DATA = Path(__file__).resolve().parent / "data"
Q2K = DATA / "gguf" / "tiny-Q2_K.gguf"
K25 = DATA / "gguf_k25"
U32 = 4


def only_root(report: object, key: str, expected: int, actual: int) -> int:
    """The report's one finding: CONFIG_DISAGREES naming `key`, `expected` against `actual`; its cover count."""
    found = [(f.code, f.tensor, f.expected, f.actual) for f in report.findings]  # type: ignore[attr-defined]
    assert found == [("CONFIG_DISAGREES", key, expected, actual)], found
    return int(report.findings[0].covers)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("field", "delta"), [("num_hidden_layers", -1), ("num_hidden_layers", 1),
                                              ("first_k_dense_replace", 1)])
def test_a_safetensors_block_count_is_one_cause(tmp_path: Path, field: str, delta: int) -> None:
    stored = TINY_CONFIG[field]
    d = write_tiny(tmp_path / "ckpt", tiny_shards(), {**TINY_CONFIG, field: stored + delta})
    report = audit(d)
    assert report.exit_code() == 1
    assert only_root(report, f"config.json {field}", stored + delta, stored) > 2


@pytest.mark.parametrize(("key", "value"), [("deepseek2.block_count", 2), ("deepseek2.block_count", 4),
                                            ("deepseek2.leading_dense_block_count", 0),
                                            ("deepseek2.leading_dense_block_count", 2)])
def test_a_gguf_block_count_is_one_cause(tmp_path: Path, key: str, value: int) -> None:
    g = gb.read(Q2K)
    stored = int(g.kv[key][1])
    g.set(key, U32, value)
    gb.write(g, tmp_path / "t.gguf")
    report = audit(tmp_path / "t.gguf")
    assert report.exit_code() == 1
    covers = only_root(report, key, value, stored)
    per_block = sum(1 for t in g.tensors if t.name.startswith("blk.2."))
    if key.endswith(".block_count"):  # one whole block added or removed
        assert covers == per_block


@pytest.mark.parametrize("value", [2, 5])
def test_a_projector_block_count_is_one_cause(tmp_path: Path, value: int) -> None:
    d = tmp_path / "pair"
    d.mkdir()
    shutil.copy(K25 / "Kimi-K25-tiny-Q8_0.gguf", d)
    g = gb.read(K25 / "mmproj-Kimi-K25-tiny-F16.gguf")
    g.set("clip.vision.block_count", U32, value)
    gb.write(g, d / "mmproj-Kimi-K25-tiny-F16.gguf")
    report = audit(d)
    assert report.exit_code() == 1
    per_block = sum(1 for t in g.tensors if t.name.startswith("v.blk.0."))
    assert only_root(report, "clip.vision.block_count", value, 3) == per_block * abs(value - 3)


def test_a_count_the_tree_has_no_block_for_is_no_traceback(tmp_path: Path) -> None:
    """Kimi-Linear has no MTP block: a count tried for it (num_nextn_predict_layers) builds no layout, and the audit
    of a layer switched from KDA to MLA still ends in its findings (once a KeyError out of the layout)."""
    g = gb.read(DATA / "gguf_archs" / "kimi-linear" / "tiny-Q8_0.gguf")
    g.set("kimi-linear.attention.head_count_kv", 9, [0, 1, 1], U32)
    gb.write(g, tmp_path / "t.gguf")
    report = audit(tmp_path / "t.gguf")
    assert report.exit_code() == 1 and "blk.1.attn_kv_a_mqa.weight" in {f.tensor for f in report.findings}


@pytest.mark.parametrize(("key", "value", "named"), [("first_k_dense_replace", 0, "moe.first_k_dense_replace"),
                                                     ("route_every_n", 2, "moe.route_every_n")])
def test_a_mistral_params_count_is_one_cause_in_its_own_words(tmp_path: Path, key: str, value: int,
                                                              named: str) -> None:
    """Mistral's params.json: a leading-dense count or MoE spacing the stored layers contradict is one
    CONFIG_DISAGREES naming params.json's own key (once a TENSORS_RESPELLED claiming `feed_forward` is a
    respelling of `shared_experts`, and 14 errors for route_every_n)."""
    import json

    d = tmp_path / "mistral"
    shutil.copytree(DATA / "mistral_format" / "bf16", d)
    params = json.loads((d / "params.json").read_text())
    params["moe"][key] = value
    (d / "params.json").write_text(json.dumps(params))
    report = audit(d)
    assert [(f.code, f.tensor) for f in report.findings] == [("CONFIG_DISAGREES", f"params.json {named}")]


@pytest.mark.parametrize(("field", "dropped"), [("first_k_dense_replace", "model.layers.1.mlp.gate.weight"),
                                                ("num_hidden_layers", "model.layers.3.self_attn.q_a_layernorm.weight")])
def test_a_second_fault_in_the_folded_blocks_is_named(tmp_path: Path, field: str, dropped: str) -> None:
    """A count off by one and a tensor dropped from the blocks it accounts for: the count's one CONFIG_DISAGREES
    and that tensor's own TENSOR_MISSING (the fold was all or nothing: 58 findings, the dropped one never named)."""
    shards = tiny_shards()
    for members in shards.values():
        members.pop(dropped, None)
    delta = 1 if field == "first_k_dense_replace" else -1
    report = audit(write_tiny(tmp_path / "ckpt", shards, {**TINY_CONFIG, field: TINY_CONFIG[field] + delta}))
    assert [(f.code, f.tensor) for f in report.findings] == [("CONFIG_DISAGREES", f"config.json {field}"),
                                                              ("TENSOR_MISSING", dropped)]


def mtp_checkpoint(tmp_path: Path, **config: int) -> Path:
    """The tiny checkpoint with its last layer made the MTP layer (num_hidden_layers 3, num_nextn_predict_layers 1:
    its six MTP tensors added, shaped by the layout), `config` changed on top."""
    import ml_dtypes
    import numpy as np

    from kimi_audit.model.config import model_config_from_dict
    from kimi_audit.model.layout import expected_layout

    cfg = {**TINY_CONFIG, "num_hidden_layers": 3, "num_nextn_predict_layers": 1}
    layout = expected_layout(model_config_from_dict(cfg))
    shards = tiny_shards()
    stored = {n for members in shards.values() for n in members}
    last = list(shards)[-1]
    for n in layout.names:
        if n not in stored:
            shards[last][n] = np.ones(layout.get(n).shape, dtype=ml_dtypes.bfloat16)  # type: ignore[union-attr]
    return write_tiny(tmp_path / "mtp", shards, {**cfg, **config})


@pytest.mark.parametrize(("field", "value", "held"), [("num_nextn_predict_layers", 0, 1), ("num_hidden_layers", 4, 3)])
def test_an_mtp_layer_is_blamed_on_the_right_count(tmp_path: Path, field: str, value: int, held: int) -> None:
    """An MTP layer stored as layer 3: num_nextn_predict_layers 0 is that key (once blamed on num_hidden_layers with 6
    more findings), num_hidden_layers 4 that one (once beside a false MTP_ABSENT): one finding each."""
    assert audit(mtp_checkpoint(tmp_path)).verdict() == "PASS"
    report = audit(mtp_checkpoint(tmp_path / "bad", **{field: value}))
    assert [(f.code, f.tensor, f.expected, f.actual) for f in report.findings] == [
        ("CONFIG_DISAGREES", f"config.json {field}", value, held)]


@pytest.mark.parametrize("value", [1, 2, 3])
def test_a_gguf_nextn_count_is_its_own_key(tmp_path: Path, value: int) -> None:
    """deepseek2.nextn_predict_layers on a file with no NextN layer: one CONFIG_DISAGREES naming that key (block_count
    holds the blocks either way), not six TENSOR_MISSING blk.N.nextn.* (or 29 findings at 3)."""
    g = gb.read(Q2K)
    g.set("deepseek2.nextn_predict_layers", U32, value)
    gb.write(g, tmp_path / "t.gguf")
    only_root(audit(tmp_path / "t.gguf"), "deepseek2.nextn_predict_layers", value, 0)


def test_a_shard_left_out_of_the_series_and_its_index_is_the_cause(tmp_path: Path) -> None:
    """model-3-of-3.safetensors gone and the index written without it (lm_head and the final norm moved to shard
    1): the names count three shards, so one SHARD_SERIES_GAP carries the last layer's missing tensors, not a
    CONFIG_DISAGREES blaming num_hidden_layers (round two of the red team)."""
    shards = tiny_shards()
    first, *_, last = list(shards)
    dropped = shards.pop(last)
    for name in ("lm_head.weight", "model.norm.weight"):
        if name in dropped:
            shards[first][name] = dropped.pop(name)
    report = audit(write_tiny(tmp_path / "ckpt", shards))
    found = [(f.code, f.shard) for f in report.findings]
    assert found == [("SHARD_SERIES_GAP", last)] and report.findings[0].covers > 0 and report.exit_code() == 1


@pytest.mark.parametrize(("change", "key"), [({"num_experts_per_tok": 9}, "num_experts_per_tok"),
                                             ({"n_group": 2, "topk_group": 3}, "topk_group"),
                                             ({"n_group": 3, "topk_group": 1}, "n_group")])
def test_a_router_no_model_runs_is_refused(tmp_path: Path, change: dict[str, int], key: str) -> None:
    """More experts per token than routed experts, more groups chosen than exist, groups that do not divide the
    experts: they size no tensor, so the layout passed (round three of the red team); the config is refused with
    the key named, as llama.cpp's loader asserts the same of a GGUF."""
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    d = write_tiny(tmp_path / "ckpt", tiny_shards(), {**TINY_CONFIG, **change})
    r = CliRunner().invoke(app, ["audit", str(d), "--no-progress"])
    assert r.exit_code == 2 and f"config.json {key} is" in r.stderr


@pytest.mark.parametrize("value", [0, 2])
def test_a_glm4moe_nextn_count_is_its_own_key(tmp_path: Path, value: int) -> None:
    """glm4moe's metadata moves block_count with the NextN layers too: the fold names nextn_predict_layers, the key
    that changed, not block_count, which is right (round three of the red team)."""
    g = gb.read(DATA / "gguf_archs" / "glm4moe" / "tiny-Q8_0.gguf")
    g.set("glm4moe.nextn_predict_layers", U32, value)
    gb.write(g, tmp_path / "t.gguf")
    only_root(audit(tmp_path / "t.gguf"), "glm4moe.nextn_predict_layers", value, 1)
