"""The writer fixtures (tests/writers/*_generate.py and what they wrote under tests/data/) hold together.

A note on the copies. Each writer script carries its own copy of the tiny model's config (`CONFIG`): the scripts
ran in their own venvs, now gone, and each PROVENANCE.json pins its script's sha256, so moving the config into one
shared module would break every pin with no way to run the writers again. The copies stay; this module holds
them equal instead: the writers of the tiny Kimi-K2-shaped DeepseekV3 (AutoRound, llmcompressor, ModelOpt, Quark)
carry the same config, AutoAWQ's differs from it in the two keys recorded below and nowhere else, and each
script's copy is the `source_config` its PROVENANCE.json records it ran with. The writers of other shapes (GPTQ's
and AWQ's, the GGUF converters', Kimi-Linear's, Mistral's) have configs of their own and are not copies.

Per-tensor digests. A PROVENANCE.json's whole-file sha256 is what its writer produced; a writer that stores its
header metadata in another key order on every run could not produce it again. tests/writers/tensor_digests.py
records every committed safetensors file's per-tensor sha256 (`tensor_sha256`) beside it; the test here computes
them again from the files, so a changed tensor is caught whichever order its header lists the metadata in.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
WRITERS = TESTS / "writers"
DATA = TESTS / "data"

COPIES = ("autoround_generate.py", "llmcompressor_generate.py", "modelopt_generate.py", "quark_generate.py",
          "autoawq_generate.py")
"""The writers whose CONFIG is a copy of the tiny Kimi-K2-shaped DeepseekV3's."""
VARIANTS: dict[str, dict[str, Any]] = {"autoawq_generate.py": {"kv_lora_rank": 96, "qk_rope_head_dim": 32}}
"""Where a copy differs from the others on purpose, and in what (AutoAWQ's, as its fixture was written)."""
FIXTURE = {"autoround_generate.py": "autoround", "llmcompressor_generate.py": "llmcompressor",
           "modelopt_generate.py": "modelopt", "quark_generate.py": "quark", "autoawq_generate.py": "autoawq"}


def literal(script: Path, name: str) -> Any:
    """A module-level literal of a writer script, read without running it (it imports its writer's packages)."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(f"{script.name} has no {name}")


def shared_config(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The copies with their recorded variants taken out must be one config: it, or AssertionError naming the
    copy and keys that drifted."""
    first = next(c for s, c in configs.items() if s not in VARIANTS)
    for script, c in configs.items():
        drift = sorted(k for k in first.keys() | c.keys()
                       if k not in VARIANTS.get(script, {}) and first.get(k, "absent") != c.get(k, "absent"))
        assert not drift, f"{script}'s CONFIG drifted from the other copies in {drift}"
    for script, variant in VARIANTS.items():
        assert {k: configs[script].get(k) for k in variant} == variant, f"{script}'s recorded variant changed"
    return first


def writer_configs() -> dict[str, dict[str, Any]]:
    return {s: literal(WRITERS / s, "CONFIG") for s in COPIES}


def test_the_writers_copies_of_the_tiny_config_agree() -> None:
    configs = writer_configs()
    shared = shared_config(configs)
    assert shared["architectures"] == ["DeepseekV3ForCausalLM"] and shared["first_k_dense_replace"] == 1
    # every copy differs from the shared config only where VARIANTS says
    for script, c in configs.items():
        assert {k: v for k, v in c.items() if shared.get(k) != v} == VARIANTS.get(script, {}), script


def test_each_copy_is_the_config_its_fixture_records() -> None:
    """The script's CONFIG is what ran: its PROVENANCE.json's `source_config` (written by the same script)."""
    for script, fixture in FIXTURE.items():
        prov = json.loads((DATA / fixture / "PROVENANCE.json").read_text())
        assert prov["written_by"] == f"tests/writers/{script}"
        assert prov["source_config"] == literal(WRITERS / script, "CONFIG"), script


def test_a_drifted_copy_is_caught() -> None:
    configs = writer_configs()
    configs["quark_generate.py"] = dict(configs["quark_generate.py"], kv_lora_rank=128)
    with pytest.raises(AssertionError, match=r"quark_generate.py's CONFIG drifted .* \['kv_lora_rank'\]"):
        shared_config(configs)
    configs = writer_configs()
    configs["autoawq_generate.py"] = dict(configs["autoawq_generate.py"], qk_rope_head_dim=16)
    with pytest.raises(AssertionError, match="recorded variant changed"):
        shared_config(configs)


def _digests_module() -> Any:
    spec = importlib.util.spec_from_file_location("tensor_digests", WRITERS / "tensor_digests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DIGESTS = _digests_module()


@pytest.mark.parametrize("provenance", DIGESTS.provenances(), ids=lambda p: str(p.parent.relative_to(DATA)))
def test_every_committed_tensor_is_what_its_provenance_records(provenance: Path) -> None:
    """Per-tensor sha256 over each tensor's bytes, names sorted: every safetensors file of the fixture, every
    tensor in it, as tests/writers/tensor_digests.py recorded them."""
    recorded = json.loads(provenance.read_text())[DIGESTS.KEY]
    assert list(recorded) == sorted(recorded)
    assert DIGESTS.provenance_digests(provenance) == recorded


def test_the_digests_are_of_the_tensors_not_the_header(tmp_path: Path) -> None:
    """Two files holding the same tensors, their header metadata in another key order (another whole-file sha256):
    the same per-tensor digests; a changed byte of a tensor: another digest for that tensor alone."""
    import hashlib
    import struct

    def write(path: Path, metadata: dict[str, str], payload: bytes) -> None:
        header = {"__metadata__": metadata, "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                  "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}
        raw = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)

    one, two, three = tmp_path / "1.safetensors", tmp_path / "2.safetensors", tmp_path / "3.safetensors"
    write(one, {"format": "pt", "writer": "x"}, b"abcdef")
    write(two, {"writer": "x", "format": "pt"}, b"abcdef")
    write(three, {"format": "pt", "writer": "x"}, b"abcdeZ")
    assert hashlib.sha256(one.read_bytes()).digest() != hashlib.sha256(two.read_bytes()).digest()
    d1, d2, d3 = (DIGESTS.tensor_digests(p) for p in (one, two, three))
    assert d1 == d2 and list(d1) == ["a", "b"]
    assert d3["a"] == d1["a"] and d3["b"] != d1["b"]
