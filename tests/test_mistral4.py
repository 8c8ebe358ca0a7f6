"""Mistral Small 4 (`mistral4`) against transformers 5.25, which implements it: a tiny model built and saved
sharded by transformers audits clean, its parameters are sum(numel), `params` agrees, and a missing stacked
expert tensor is one finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import kimi_audit

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = {"vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64,
        "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 2, "n_routed_experts": 4,
        "kv_lora_rank": 32, "q_lora_rank": 64, "qk_rope_head_dim": 16, "v_head_dim": 32, "qk_nope_head_dim": 16,
        "first_k_dense_replace": 1, "num_experts_per_tok": 2}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    torch.manual_seed(0)
    model = transformers.Mistral4ForCausalLM(transformers.Mistral4Config(**TINY)).to(torch.bfloat16)
    out = tmp_path_factory.mktemp("mistral4")
    model.save_pretrained(out, max_shard_size="200KB")
    return out, sum(p.numel() for p in model.parameters())


def test_transformers_save_audits_clean_with_sum_numel(saved):
    path, numel = saved
    assert len(list(path.glob("*.safetensors"))) > 1
    report = kimi_audit.audit(path)
    assert report.findings == (), [f.message for f in report.findings]
    assert report.stats.parameters == numel
    assert json.loads((path / "config.json").read_text())["model_type"] == "mistral4"


def test_the_layout_holds_the_stacked_experts_and_no_router_bias(saved):
    names = set(kimi_audit.layout(saved[0] / "config.json").names)
    assert {"model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"} <= names
    assert not any("e_score_correction_bias" in n or ".experts.0." in n for n in names)


def test_params_agrees(saved):
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    r = CliRunner().invoke(app, ["params", str(saved[0]), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["activated"]["routed_experts"] == 4 and doc["activated"]["experts_per_token"] == 2
    assert doc["activated"]["per_expert"] == 3 * 64 * 128


def test_a_missing_stacked_expert_tensor_is_one_finding(saved, tmp_path):
    import shutil

    path = Path(shutil.copytree(saved[0], tmp_path / "m"))
    index = json.loads((path / "model.safetensors.index.json").read_text())
    name = "model.layers.2.mlp.experts.down_proj"
    shard = index["weight_map"].pop(name)
    tensors = load_file(path / shard)
    del tensors[name]
    save_file(tensors, path / shard, metadata={"format": "pt"})
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    errors = [f for f in kimi_audit.audit(path).findings if f.severity.value == "error"]
    assert [(f.code, f.tensor) for f in errors] == [("TENSOR_MISSING", name)], [f.message for f in errors]
