"""DeepSeek-V4-Flash-0731's DSpark drafter: three stages `mtp.0..2` where its config declares one.

The stage parts are as DSpark's loaders and converters read them (model.arch.deepseek_v4 `dspark`): every stage a
sliding-window MoE layer, the first with `main_proj` and `main_norm`, the last with `norm`, `hc_head_*`, the
Markov head and the confidence head. The published inventories agree with the layout: 0731 holds 72,317 tensors,
V4-Flash 69,187 of which 1,575 are its one MTP stage, so three DSpark stages are 72,317 - (69,187 - 1,575) = 4,705
tensors. A tiny transformers V4 save, respelled as the release and given three DSpark stages, audits with one
info saying the files decided the stage count.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, DeepseekV4Config

from kimi_audit.checks.audit import audit_source
from kimi_audit.errors import ConfigError
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.layout import expected_layout
from kimi_audit.sources import LocalSource
from test_lineage_differential import SHARD, TINY, Shards, respell, rewrite, with_v4_stage_layers

PUBLISHED_0731, PUBLISHED_FLASH, PUBLISHED_FLASH_MTP = 72_317, 69_187, 1_575
"""Tensor counts of the published V4-Flash-0731 and V4-Flash, and of V4-Flash's MTP stage (family.md)."""
DSPARK = {"dspark_target_layer_ids": [1, 2, 3], "dspark_markov_rank": 8, "dspark_block_size": 4,
          "num_nextn_predict_layers": 1}


def flash_0731() -> dict[str, Any]:
    raw = json.loads(resources.files("kimi_audit").joinpath("data/deepseek-v4-flash.config.json").read_text())
    raw.update(quantization_config={"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                    "weight_block_size": [128, 128]}, expert_dtype="fp4",
               dspark_target_layer_ids=[1, 20, 40], dspark_markov_rank=256, dspark_block_size=8)
    return raw


def test_three_dspark_stages_are_what_0731_adds_to_v4_flash() -> None:
    layout = expected_layout(model_config_from_dict(dict(flash_0731(), num_nextn_predict_layers=3)))
    stages = [n for n in layout if n.startswith("mtp.")]
    assert len(stages) == PUBLISHED_0731 - (PUBLISHED_FLASH - PUBLISHED_FLASH_MTP) == 4_705
    assert {n.split(".")[1] for n in stages} == {"0", "1", "2"}
    assert "mtp.0.main_proj.scale" in layout and "mtp.2.markov_head.markov_w1.weight" in layout
    assert not any(n.startswith(f"mtp.{k}.e_proj") for k in range(3) for n in stages)


def test_v4_flash_holds_the_published_inventory() -> None:
    """With its published schedule (`compress_ratios`, kimi_audit/data/deepseek-v4-flash.sources.json) and the
    release's FP8/FP4, V4-Flash's layout is the published inventory: 69,187 tensors, 1,575 of them `mtp.0.*`."""
    raw = {k: v for k, v in flash_0731().items() if not k.startswith("dspark_")}
    layout = expected_layout(model_config_from_dict(raw))
    assert (len(layout), sum(n.startswith("mtp.0.") for n in layout)) == (PUBLISHED_FLASH, PUBLISHED_FLASH_MTP)


@pytest.fixture(scope="module")
def v4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(DeepseekV4Config(**TINY["deepseek_v4"]), dtype=torch.bfloat16)
    d = tmp_path_factory.mktemp("v4")
    model.save_pretrained(d, max_shard_size=SHARD)
    return d


def with_dspark(shards: Shards, stages: int = 3) -> None:
    """DSpark stages as 0731 stores them: a decoder layer in each (with_v4_stage_layers), the first and last
    stage's own parts beside."""
    cfg = {**TINY["deepseek_v4"], **DSPARK}
    h, v, r, hc = cfg["hidden_size"], cfg["vocab_size"], cfg["dspark_markov_rank"], cfg["hc_mult"]
    with_v4_stage_layers(shards, [f"mtp.{k}." for k in range(stages)])
    first = next(iter(shards.values()))
    last = f"mtp.{stages - 1}."
    own = {"mtp.0.main_proj.weight": ((h, len(cfg["dspark_target_layer_ids"]) * h), torch.bfloat16),
           "mtp.0.main_norm.weight": ((h,), torch.bfloat16), last + "norm.weight": ((h,), torch.bfloat16),
           last + "hc_head_fn": ((hc, hc * h), torch.float32), last + "hc_head_base": ((hc,), torch.float32),
           last + "hc_head_scale": ((1,), torch.float32),
           last + "markov_head.markov_w1.weight": ((v, r), torch.bfloat16),
           last + "markov_head.markov_w2.weight": ((v, r), torch.bfloat16),
           last + "confidence_head.proj.weight": ((1, h + r), torch.bfloat16)}
    for name, (shape, dtype) in own.items():
        first[name] = torch.ones(shape, dtype=dtype) / 8


def release(v4: Path, d: Path, stages: int = 3, declared: int = 1, extra: Any = None) -> Path:
    def change(shards: Shards) -> None:
        respell("deepseek_v4")(shards)
        with_dspark(shards, stages)
        if extra is not None:
            extra(next(iter(shards.values())))
    rewrite(v4, d, change)
    raw = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**raw, **DSPARK, "num_nextn_predict_layers": declared}))
    return d


def test_the_files_decide_dspark_stages_said_once(v4: Path, tmp_path: Path) -> None:
    d = release(v4, tmp_path / "0731")
    report = audit_source(LocalSource(d))
    assert [(f.severity.value, f.code, f.tensor, f.expected, f.actual) for f in report.findings] == [
        ("info", "MTP_STAGES_FROM_FILES", "mtp.2", 1, 3)]
    raw = json.loads((d / "config.json").read_text())
    three = expected_layout(model_config_from_dict(dict(raw, num_nextn_predict_layers=3)))
    assert report.stats.tensors == len(three)
    assert report.model["mtp_layers"] == 3


def test_a_config_that_declares_the_stages_is_silent(v4: Path, tmp_path: Path) -> None:
    assert audit_source(LocalSource(release(v4, tmp_path / "declared", declared=3))).findings == ()


def test_a_dspark_fault_is_one_finding(v4: Path, tmp_path: Path) -> None:
    def extra(first: dict[str, torch.Tensor]) -> None:
        del first["mtp.2.markov_head.markov_w2.weight"]
        first["mtp.99.x.weight"] = torch.zeros(2)  # beyond any stage count the files may decide

    report = audit_source(LocalSource(release(v4, tmp_path / "fault", extra=extra)))
    assert sorted((f.code, f.tensor) for f in report.findings) == [
        ("MTP_STAGES_FROM_FILES", "mtp.2"), ("TENSOR_MISSING", "mtp.2.markov_head.markov_w2.weight"),
        ("TENSOR_UNEXPECTED", "mtp.99.x.weight")]


def test_without_dspark_keys_the_config_decides(v4: Path, tmp_path: Path) -> None:
    """A plain V4 config (no DSpark keys) keeps its declared stage count: stages the files add are findings."""
    d = release(v4, tmp_path / "plain")
    raw = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if not k.startswith("dspark_")}))
    codes = {f.code for f in audit_source(LocalSource(d)).findings}
    assert "MTP_STAGES_FROM_FILES" not in codes and "TENSOR_UNEXPECTED" in codes


@pytest.mark.parametrize(("keys", "match"), [({"dspark_target_layer_ids": [9]}, "dspark_target_layer_ids"),
                                             ({"dspark_markov_rank": 0}, "dspark_markov_rank")])
def test_a_bad_dspark_key_is_a_config_error(keys: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        model_config_from_dict({"model_type": "deepseek_v4", **TINY["deepseek_v4"], **DSPARK, **keys})

