"""What a stranger's attack on the GGUF dialects found (this session's red team), each fixed at its root and held
here: per-layer arrays of the wrong length (llama.cpp's get_key_or_arr refuses them), per-layer widths that differ
(llama.cpp loads them; no layout here describes them: inconclusive, not PASS, not a false FAIL)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import gguf_builder as gb
from kimi_audit import audit

DATA = Path(__file__).resolve().parent / "data"
ARCHS = DATA / "gguf_archs"
Q2K = DATA / "gguf" / "tiny-Q2_K.gguf"
U32, F32, ARRAY = 4, 6, 9


def audited(tmp_path: Path, source: Path, edit: Callable[[gb.Gguf], object]) -> object:
    g = gb.read(source)
    edit(g)
    gb.write(g, tmp_path / "t.gguf")
    return audit(tmp_path / "t.gguf")


@pytest.mark.parametrize(("source", "key", "values", "item"), [
    (ARCHS / "deepseek4" / "tiny-Q8_0.gguf", "deepseek4.swiglu_clamp_exp", [10.0, 10.0], F32),
    (ARCHS / "deepseek4" / "tiny-Q8_0.gguf", "deepseek4.expert_feed_forward_length", [64] * 4, U32),
    (ARCHS / "glm4moe" / "tiny-Q8_0.gguf", "glm4moe.expert_feed_forward_length", [64] * 7, U32),
    (ARCHS / "kimi-k3" / "tiny-Q8_0.gguf", "kimi-k3.expert_feed_forward_length", [64], U32),
    (Q2K, "deepseek2.expert_feed_forward_length", [256, 256], U32),
])
def test_a_per_layer_array_of_the_wrong_length_is_refused(tmp_path: Path, source: Path, key: str,
                                                          values: list[object], item: int) -> None:
    """llama_model_loader::get_key_or_arr: "key %s has wrong array length; expected %u, got %u" (once a PASS)."""
    report = audited(tmp_path, source, lambda g: g.set(key, ARRAY, values, item))
    found = [(f.code, f.tensor) for f in report.findings]  # type: ignore[attr-defined]
    assert found == [("GGUF_KEY_VALUE", key)] and report.exit_code() == 1  # type: ignore[attr-defined]
    assert "wrong array length" in report.findings[0].message  # type: ignore[attr-defined]


def test_a_per_layer_array_of_one_value_is_that_value(tmp_path: Path) -> None:
    """An array of the right length, every layer alike, is what llama.cpp reads as the scalar (once a false FAIL
    that printed a Python repr)."""
    report = audited(tmp_path, Q2K, lambda g: g.set("deepseek2.expert_feed_forward_length", ARRAY, [256] * 3, U32))
    assert report.verdict() == "PASS"  # type: ignore[attr-defined]


def test_per_layer_widths_that_differ_are_inconclusive(tmp_path: Path) -> None:
    """llama.cpp loads layers of different widths; no layout this tool derives has them: one LAYOUT_UNSUPPORTED
    naming the key, exit 3, not a claim that llama.cpp refuses the file."""
    report = audited(tmp_path, Q2K, lambda g: g.set("deepseek2.expert_feed_forward_length", ARRAY, [256, 128, 256],
                                                     U32))
    found = [(f.code, f.tensor) for f in report.findings]  # type: ignore[attr-defined]
    assert found == [("LAYOUT_UNSUPPORTED", "deepseek2.expert_feed_forward_length")]
    assert report.exit_code() == 3 and "llama.cpp loads" in report.findings[0].message  # type: ignore[attr-defined]


@pytest.mark.parametrize(("source", "name"), [
    (ARCHS / "deepseek4" / "tiny-Q8_0.gguf", "blk.1.attn_sinks.weight"),
    (ARCHS / "deepseek4" / "tiny-Q8_0.gguf", "output_hc_fn.weight"),
    (ARCHS / "kimi-k3" / "tiny-Q8_0.gguf", "blk.0.ssm_a"),
    (ARCHS / "kimi-k3" / "tiny-Q8_0.gguf", "output_res_score.weight"),
    (ARCHS / "kimi-linear" / "tiny-Q8_0.gguf", "blk.0.ssm_dt.bias"),
])
def test_values_reads_every_small_float_tensor(tmp_path: Path, source: Path, name: str) -> None:
    """`audit --values` reads any float tensor up to 256 KiB for NaN and Inf, not only the classes it knows by name
    (an attention sink, a hyper-connection mix, KDA's A, a residual score: each once a PASS with a NaN)."""
    import math
    import struct

    from kimi_audit.checks.values import audit_with_values
    from kimi_audit.sources import LocalSource

    g = gb.read(source)
    t = g.tensor(name)
    assert t.type_id == 0  # F32
    t.data = struct.pack("<f", math.nan) + t.data[4:]
    (tmp_path / "d").mkdir()
    gb.write(g, tmp_path / "d" / "t.gguf")
    report = audit_with_values(LocalSource(tmp_path / "d"))
    assert [(f.code, f.tensor) for f in report.findings if f.severity.name == "ERROR"] == [("VALUE_NAN", name)]


def test_a_hash_routing_id_past_the_experts_is_found(tmp_path: Path) -> None:
    """DeepSeek-V4's hash-routing table indexes the stacked experts: an id of 99 among 4 experts was a PASS, with
    and without --values; --values reads the table (an expert-id class, model.arch.deepseek_v4's value_roles)."""
    import numpy as np

    from kimi_audit.checks.values import audit_with_values
    from kimi_audit.sources import LocalSource

    g = gb.read(ARCHS / "deepseek4" / "tiny-Q8_0.gguf")
    t = g.tensor("blk.0.ffn_gate_tid2eid.weight")
    ids = np.frombuffer(t.data, "<i4").copy()
    ids[5] = 99
    t.data = ids.tobytes()
    (tmp_path / "d").mkdir()
    gb.write(g, tmp_path / "d" / "t.gguf")
    report = audit_with_values(LocalSource(tmp_path / "d"))
    errors = [(f.code, f.tensor, f.expected) for f in report.findings if f.severity.name == "ERROR"]
    assert errors == [("EXPERT_ID_RANGE", "blk.0.ffn_gate_tid2eid.weight", "0..3")]


@pytest.mark.parametrize("count", [0, 513, 600])
def test_a_block_count_llama_cpp_aborts_on_is_one_finding(tmp_path: Path, count: int) -> None:
    """llama.cpp asserts 0 < block_count <= LLAMA_MAX_LAYERS (512) as it reads the key: one GGUF_KEY_VALUE naming
    it, no layout derived from it (600 was a fold claiming 'num_hidden_layers is 599')."""
    report = audited(tmp_path, ARCHS / "glm4moe" / "tiny-Q8_0.gguf", lambda g: g.set("glm4moe.block_count", U32,
                                                                                      count))
    assert [(f.code, f.tensor) for f in report.findings] == [  # type: ignore[attr-defined]
        ("GGUF_KEY_VALUE", "glm4moe.block_count")]


def test_the_block_count_fold_hides_no_second_fault(tmp_path: Path) -> None:
    """block_count 2 over 3 stored blocks folds the third block's tensors into one CONFIG_DISAGREES, but a tensor
    of that block stored in a type its role never takes (a norm in Q8_0) is still its own DTYPE_MISMATCH."""
    def edit(g: gb.Gguf) -> None:
        g.set("deepseek2.block_count", U32, 2)
        t = g.tensor("blk.2.attn_norm.weight")
        t.type_id, t.data = 8, bytes(t.ne[0] // 32 * 34)  # Q8_0

    report = audited(tmp_path, Q2K, edit)
    found = [(f.code, f.tensor) for f in report.findings]  # type: ignore[attr-defined]
    assert found == [("CONFIG_DISAGREES", "deepseek2.block_count"), ("DTYPE_MISMATCH", "blk.2.attn_norm.weight")]


@pytest.mark.parametrize(("count", "stored"), [(3, 4), (5, 4)])
def test_the_fold_names_the_keys_own_values_beside_a_nextn_layer(tmp_path: Path, count: int, stored: int) -> None:
    """GLM-4.7-Flash's deepseek2 file counts its NextN layer in block_count (4 = 3 + 1): the fold says the key's
    value and the one the tensors imply (3 and 4), not num_hidden_layers' (2 and 3)."""
    report = audited(tmp_path, ARCHS / "glm4moe-lite" / "tiny-Q8_0.gguf",
                     lambda g: g.set("deepseek2.block_count", U32, count))
    root = report.findings[0]  # type: ignore[attr-defined]
    assert (root.code, root.tensor, root.expected, root.actual) == ("CONFIG_DISAGREES", "deepseek2.block_count",
                                                                    count, stored)
    assert f"deepseek2.block_count is {count}, but the stored tensors are those of {stored}" in root.message


@pytest.mark.parametrize("stand_in", ["imatrix.gguf", "mmproj-Kimi-K25-tiny-F16.gguf"])
def test_a_part_replaced_by_a_file_that_is_no_model(tmp_path: Path, stand_in: str) -> None:
    """Part 2 of a 4-part set replaced by an importance matrix or a projector under its name: the set lacks part 2
    (GGUF_PART_MISSING) and the file is named for what it is (GGUF_SPLIT_INVALID), not 90 findings led by a false
    block_count and a claim that part 1 holds no split.count."""
    import shutil

    d = tmp_path / "set"
    shutil.copytree(DATA / "gguf" / "Q8_0", d)
    part = "tiny-Q8_0-00002-of-00004.gguf"
    shutil.copy(DATA / "gguf_k25" / stand_in, d / part)
    report = audit(d)
    found = sorted((f.code, f.shard) for f in report.findings)  # type: ignore[attr-defined]
    assert found == [("GGUF_PART_MISSING", part), ("GGUF_SPLIT_INVALID", part)]
    assert report.exit_code() == 1  # type: ignore[attr-defined]


def test_a_flipped_type_is_one_overlap_naming_the_tensor(tmp_path: Path) -> None:
    """One header byte turning blk.0.ffn_up.weight from Q2_K into F32 makes its extent run over the 19 tensors
    after it: one OFFSETS_OVERLAP naming it (covering the 19), where there were 19 naming the others."""
    raw = bytearray(Q2K.read_bytes())
    name = b"blk.0.ffn_up.weight"
    at = raw.index(name) + len(name)
    dims = int.from_bytes(raw[at:at + 4], "little")
    at += 4 + 8 * dims  # n_dims, the dims: then the ggml type
    assert int.from_bytes(raw[at:at + 4], "little") == 10  # Q2_K
    raw[at:at + 4] = (0).to_bytes(4, "little")  # F32
    (tmp_path / "t.gguf").write_bytes(bytes(raw))
    report = audit(tmp_path / "t.gguf")
    found = [(f.code, f.tensor, f.covers) for f in report.findings]  # type: ignore[attr-defined]
    assert found == [("OFFSETS_OVERLAP", "blk.0.ffn_up.weight", 19)]


@pytest.mark.parametrize(("source", "key", "value"), [
    (Q2K, "deepseek2.expert_weights_scale", float("nan")),
    (Q2K, "deepseek2.expert_weights_scale", float("inf")),
    (ARCHS / "kimi-k3" / "tiny-Q8_0.gguf", "kimi-k3.activation.situ_beta", float("nan")),
    (ARCHS / "deepseek4" / "tiny-Q8_0.gguf", "deepseek4.swiglu_clamp_exp", float("-inf")),
])
def test_a_hyperparameter_that_is_no_finite_number_is_one_finding(tmp_path: Path, source: Path, key: str,
                                                                   value: float) -> None:
    """llama.cpp loads a NaN or infinite float hyperparameter and computes NaN with it (kimi-k3's SiTU divides by
    its beta): one GGUF_KEY_VALUE naming the key (each was a PASS)."""
    report = audited(tmp_path, source, lambda g: g.set(key, F32, value))
    assert [(f.code, f.tensor) for f in report.findings] == [("GGUF_KEY_VALUE", key)]  # type: ignore[attr-defined]


def test_deepseek4_declared_nextn_without_its_tensors_is_every_block_a_layer(tmp_path: Path) -> None:
    """deepseek4.cpp probes `blk.{n_main}.nextn.eh_proj.weight` and, absent, sets n_layer_nextn to 0: the file
    loads with every block a layer. The audit follows the loader (was a FAIL of 28 findings)."""
    report = audited(tmp_path, ARCHS / "deepseek4" / "tiny-Q8_0.gguf",
                     lambda g: g.set("deepseek4.nextn_predict_layers", U32, 1))
    assert report.verdict() == "PASS", [(f.code, f.tensor) for f in report.findings]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("stand_in", "named"), [("imatrix.gguf", "mmproj-model-F16.gguf"),
                                                 ("mmproj-Kimi-K25-tiny-F16.gguf", "imatrix.gguf")])
def test_a_side_file_named_for_the_other_kind_is_a_warning(tmp_path: Path, stand_in: str, named: str) -> None:
    """An importance matrix named mmproj-*.gguf (mtmd refuses it as --mmproj), a projector named imatrix.gguf
    (llama-quantize refuses it as --imatrix): GGUF_MISNAMED naming it, where the first was an info and the second
    said nothing."""
    import shutil

    d = tmp_path / "pair"
    d.mkdir()
    shutil.copy(DATA / "gguf_k25" / "Kimi-K25-tiny-Q8_0.gguf", d)
    shutil.copy(DATA / "gguf_k25" / stand_in, d / named)
    report = audit(d)
    found = [(f.code, f.shard) for f in report.findings if f.code == "GGUF_MISNAMED"]  # type: ignore[attr-defined]
    assert found == [("GGUF_MISNAMED", named)] and report.exit_code() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("count", [2, 4])
def test_a_block_count_its_per_layer_arrays_contradict_is_named(tmp_path: Path, count: int) -> None:
    """deepseek4's swiglu_clamp arrays hold 3 values, as the file holds 3 blocks: block_count 2 or 4 is the one
    off, named (it was two GGUF_KEY_VALUE blaming the arrays, which were right)."""
    report = audited(tmp_path, ARCHS / "deepseek4" / "tiny-Q8_0.gguf", lambda g: g.set("deepseek4.block_count", U32,
                                                                                        count))
    found = [(f.code, f.tensor, f.expected, f.actual) for f in report.findings]  # type: ignore[attr-defined]
    assert found == [("GGUF_KEY_VALUE", "deepseek4.block_count", 3, count)]


def test_a_trunk_only_gguf_is_told_in_its_own_words(tmp_path: Path) -> None:
    """GLM-4.7-Flash's deepseek2 file with its NextN key but not its layer: PASS with MTP_ABSENT naming the GGUF's
    key and block (`blk.3`), not config.json, model.layers.3 and transformers; the HTML page draws it."""
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    report = audited(tmp_path, ARCHS / "glm4moe-lite" / "tiny-Q8_0.gguf",
                     lambda g: g.tensors.__setitem__(slice(None), [t for t in g.tensors if not t.name.startswith(
                         "blk.3.")]))
    (f,) = report.findings  # type: ignore[attr-defined]
    assert (f.code, f.tensor) == ("MTP_ABSENT", "blk.3") and "deepseek2.nextn_predict_layers" in f.message
    assert "config.json" not in f.message and "transformers" not in f.message
    page = tmp_path / "page.html"
    r = CliRunner().invoke(app, ["audit", str(tmp_path / "t.gguf"), "-o", str(page), "--no-progress"])
    assert r.exit_code == 0 and "MTP_ABSENT" in page.read_text()
