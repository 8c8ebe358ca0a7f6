"""Kimi-K2.5 as people run it with llama.cpp: the text model as a GGUF (`deepseek2`) and its vision tower as an
`mmproj-*.gguf` (`clip`, projector type `kimik25`), with the importance matrix llama-imatrix writes beside a
quant. tests/data/gguf_k25 was written by llama.cpp 0c1e5709's own converter from a tiny kimi_k25 checkpoint
(tests/writers/gguf_k25_generate.py; PROVENANCE.json pins the script, the tools and every file): the pair is one
audit (the projector a second reader of the same checks), the projector held to the text model's width as mtmd
holds it, the text GGUF held to its kimi_k25 source, and files that are not models named for what they are."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

import gguf_builder as gb
from kimi_audit import audit
from kimi_audit.errors import GgufSetError
from kimi_audit.findings import Severity
from kimi_audit.format.gguf import read_gguf_part
from kimi_audit.model.arch.kimi_k25 import projector_name
from kimi_audit.sources import LocalSource

DATA = Path(__file__).resolve().parent / "data" / "gguf_k25"
TEXT = DATA / "Kimi-K25-tiny-Q8_0.gguf"
MMPROJ = DATA / "mmproj-Kimi-K25-tiny-F16.gguf"
WIDE = DATA / "wide" / "mmproj-Kimi-K25-wide-F16.gguf"
IMATRIX = DATA / "imatrix.gguf"
SOURCE = DATA / "source"


def folder(tmp_path: Path, *files: Path, names: tuple[str, ...] = ()) -> Path:
    d = tmp_path / "gguf"
    d.mkdir(parents=True)
    for i, f in enumerate(files):
        shutil.copy(f, d / (names[i] if i < len(names) else f.name))
    return d


def errors(report: object) -> list[tuple[str, str | None]]:
    return [(f.code, f.tensor) for f in report.findings if f.severity is Severity.ERROR]  # type: ignore[attr-defined]


def test_provenance_pins_the_generator_and_every_file() -> None:
    prov = json.loads((DATA / "PROVENANCE.json").read_text())
    script = Path(__file__).resolve().parent / "writers" / "gguf_k25_generate.py"
    assert prov["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    assert prov["llama.cpp"]["commit"].startswith("0c1e5709")
    for name, digest in prov["files"].items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name


def test_the_converter_wrote_what_the_dialect_names() -> None:
    """Every tensor of the mmproj is the kimi_k25 module's name of a release tensor (no name guessed), and its
    metadata says what it is: clip, a vision encoder, projector type kimik25."""
    part = read_gguf_part(LocalSource(DATA), MMPROJ.name)
    kv = part.kv
    assert (kv["general.architecture"], kv["general.type"], kv["clip.projector_type"]) == ("clip", "mmproj", "kimik25")
    assert kv["clip.has_vision_encoder"] is True
    source = set(json.loads((SOURCE / "model.safetensors.index.json").read_text())["weight_map"])
    named = {projector_name(n) for n in source} - {None}
    assert set(part.header.columns.names) == named


def test_the_pair_audits_clean_as_one_model(tmp_path: Path) -> None:
    """The text GGUF and its mmproj in one folder: one audit, the projector's tensors laid out and checked
    (every one of the source's parameters is in the pair), no error."""
    alone = audit(folder(tmp_path / "a", TEXT))
    pair = audit(folder(tmp_path / "b", TEXT, MMPROJ))
    source = audit(SOURCE)
    assert errors(pair) == [] and errors(alone) == []
    assert pair.stats.parameters == source.stats.parameters > alone.stats.parameters
    assert MMPROJ.name in pair.checkpoint.headers  # type: ignore[union-attr]


def test_a_projector_of_another_width_is_an_error_naming_the_key(tmp_path: Path) -> None:
    """The projector of a model whose text width is 128 beside this 64-wide one: mtmd refuses the pair
    (tools/mtmd/mtmd.cpp 603-608); one GGUF_PROJECTOR_WIDTH naming clip.vision.projection_dim, nothing else."""
    r = audit(folder(tmp_path, TEXT, WIDE))
    assert errors(r) == [("GGUF_PROJECTOR_WIDTH", "clip.vision.projection_dim")]
    f = next(f for f in r.findings if f.code == "GGUF_PROJECTOR_WIDTH")
    assert (f.expected, f.actual, f.shard) == (64, 128, WIDE.name)
    assert "deepseek2.embedding_length" in f.message and "mm.2.weight" in f.message


def test_a_projector_tensor_of_the_wrong_shape_is_found(tmp_path: Path) -> None:
    """The projector's tensors are held to the vision config its own keys imply: a block count its file
    contradicts is one CONFIG_DISAGREES naming the key, the block it leaves missing counted beneath."""
    d = folder(tmp_path, TEXT)
    data = bytearray(MMPROJ.read_bytes())
    key = b"clip.vision.block_count"
    at = data.index(key) + len(key) + 4  # the value type (u32), then the value
    assert data[at: at + 4] == (3).to_bytes(4, "little")
    data[at: at + 4] = (4).to_bytes(4, "little")
    (d / MMPROJ.name).write_bytes(bytes(data))
    report = audit(d)
    assert errors(report) == [("CONFIG_DISAGREES", "clip.vision.block_count")]
    assert report.findings[0].covers == sum(1 for n in gb.read(MMPROJ).tensors if n.name.startswith("v.blk.0."))


def test_against_a_kimi_k25_source_is_no_architecture_error(tmp_path: Path) -> None:
    """llama.cpp converts KimiK25ForConditionalGeneration's text model to deepseek2 (DeepseekV2Model's register
    list): the text GGUF, alone or with its projector, against the kimi_k25 checkpoint it came from: every
    tensor accounted for, the metadata the converter writes from text_config, no error."""
    for files in ((TEXT,), (TEXT, MMPROJ)):
        r = audit(folder(tmp_path / str(len(files)), *files), against=SOURCE)
        assert errors(r) == [], files
        assert not [f for f in r.findings if f.code == "AGAINST_ARCHITECTURE"]


def test_against_an_architecture_the_tool_does_not_describe(tmp_path: Path) -> None:
    """A source of an undescribed model_type: AGAINST_ARCHITECTURE says the tool does not know what llama.cpp
    converts it to, not that llama.cpp does not convert it."""
    src = tmp_path / "src"
    shutil.copytree(SOURCE, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg["text_config"], "model_type": "qwen3_moe",
                                                 "architectures": ["Qwen3MoeForCausalLM"]}))
    r = audit(folder(tmp_path, TEXT), against=src)
    f = next(f for f in r.findings if f.code == "AGAINST_ARCHITECTURE")
    assert "does not describe" in f.message and "does not convert" not in f.message


@pytest.mark.parametrize("name", ["imatrix.gguf", "calibration-data.gguf"])
def test_an_imatrix_beside_the_quant_is_named_and_the_quant_audited(tmp_path: Path, name: str) -> None:
    """llama-imatrix's output beside the quant (recognized by its metadata, whatever its name): one info, the
    quant audited, never '2 GGUF sets here: choose one'."""
    r = audit(folder(tmp_path, TEXT, IMATRIX, names=("Kimi-K25-tiny-Q8_0.gguf", name)))
    alone = audit(folder(tmp_path / "alone", TEXT))
    assert errors(r) == []
    info = [f for f in r.findings if f.code == "GGUF_NOT_A_MODEL"]
    assert len(info) == 1 and info[0].shard == name and "imatrix" in info[0].message
    assert r.stats.tensors == alone.stats.tensors


def test_all_three_beside_each_other(tmp_path: Path) -> None:
    """The quant, its projector and an imatrix: the pair audited, the imatrix named."""
    r = audit(folder(tmp_path, TEXT, MMPROJ, IMATRIX))
    assert errors(r) == [] and [f.shard for f in r.findings if f.code == "GGUF_NOT_A_MODEL"] == [IMATRIX.name]


@pytest.mark.parametrize("path", [MMPROJ, IMATRIX], ids=["mmproj", "imatrix"])
def test_a_file_that_is_not_a_model_alone_says_what_it_is(tmp_path: Path, path: Path) -> None:
    with pytest.raises(GgufSetError, match=r"no GGUF model file here: .*(projector|importance matrix)"):
        audit(folder(tmp_path, path))


# The pair as a stranger breaks it (the projector's values, its keys, the files beside it): each as llama.cpp's
# loaders decide, each named by the key or file at fault.

def mutated(tmp_path: Path, mutate: Callable[[gb.Gguf], object], source: Path = MMPROJ, name: str = "",
            beside: tuple[Path, ...] = (TEXT,)) -> Path:
    """A folder of `beside` and `source` changed by `mutate` (written back as gguf-py read it), named `name`."""
    d = folder(tmp_path, *beside)
    g = gb.read(source)
    mutate(g)
    gb.write(g, d / (name or source.name))
    return d


def tamper_projector(g: gb.Gguf) -> None:
    """Two blocks' ffn_up swapped, the output projection zeroed, the final LayerNorm's gain NaN."""
    a, b = g.tensor("v.blk.0.ffn_up.weight"), g.tensor("v.blk.1.ffn_up.weight")
    a.data, b.data = b.data, a.data
    out = g.tensor("mm.2.weight")
    out.data = bytes(len(out.data))
    g.tensor("v.post_ln.weight").data = struct.pack("<32f", *[math.nan] * 32)


def test_against_values_compares_the_projector_as_the_converter_writes_it(tmp_path: Path) -> None:
    """Every mmproj tensor compared with the source's vision tower as KimiK25Model writes it (wqkv permuted per head
    for 2-D RoPE): the converter's own file equal byte for byte, 99 of 99 tensors; the tampered one's four tensors
    one AGAINST_VALUES naming the mmproj."""
    clean = audit(folder(tmp_path / "clean", TEXT, MMPROJ), against=SOURCE, values=True)
    assert errors(clean) == []
    checked = next(f for f in clean.findings if f.code == "AGAINST_CHECKED")
    assert checked.actual == 99 and f"47 of {MMPROJ.name}" in checked.message
    assert not [f for f in clean.findings if f.code == "AGAINST_NOT_COMPARED"]
    r = audit(mutated(tmp_path / "t", tamper_projector), against=SOURCE, values=True)
    f = next(f for f in r.findings if f.code == "AGAINST_VALUES")
    assert (f.shard, f.covers) == (MMPROJ.name, 4)


def test_against_values_finds_a_changed_source_vision_tensor(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(SOURCE, src)
    shard = src / "model-00002-of-00002.safetensors"
    raw = bytearray(shard.read_bytes())
    size = int.from_bytes(raw[:8], "little")
    begin = json.loads(raw[8: 8 + size])["vision_tower.encoder.blocks.0.mlp.fc0.weight"]["data_offsets"][0]
    raw[8 + size + begin: 8 + size + begin + 2] = b"\x40\x40"  # one BF16 value 3.0
    shard.write_bytes(bytes(raw))
    r = audit(folder(tmp_path, TEXT, MMPROJ), against=src, values=True)
    assert [(f.code, f.tensor) for f in r.findings if f.code == "AGAINST_VALUES"] == [
        ("AGAINST_VALUES", "v.blk.0.ffn_up.weight")]


def test_values_reads_the_projector_gains(tmp_path: Path) -> None:
    """`audit --values` reads the mmproj's LayerNorm gains (ln1, ln2, v.post_ln) as it reads the model's norms."""
    r = audit(mutated(tmp_path, lambda g: setattr(g.tensor("v.post_ln.weight"), "data",
                                                  struct.pack("<32f", *[math.nan] * 32))), values=True)
    assert ("VALUE_NAN", "v.post_ln.weight") in errors(r)


U32, STRING, ARRAY, F32, BOOL = 4, 8, 9, 6, 7


def _wide_foo(g: gb.Gguf) -> None:
    g.set("clip.projector_type", STRING, "foo")
    g.set("clip.vision.projection_dim", U32, 128)


@pytest.mark.parametrize(("mutate", "code", "key"), [
    (lambda g: g.set("clip.projector_type", STRING, "foo"), "GGUF_KEY_VALUE", "clip.projector_type"),
    (lambda g: g.kv.pop("clip.projector_type"), "GGUF_KEY_MISSING", "clip.projector_type"),
    (lambda g: g.set("clip.projector_type", U32, 3), "GGUF_KEY_TYPE", "clip.projector_type"),
    (lambda g: g.set("clip.projector_type", ARRAY, ["kimik25"], STRING), "GGUF_KEY_TYPE", "clip.projector_type"),
    (lambda g: g.set("clip.has_vision_encoder", BOOL, False), "GGUF_KEY_VALUE", "clip.has_vision_encoder"),
    (lambda g: g.set("clip.vision.image_mean", ARRAY, [0.5], F32), "GGUF_KEY_VALUE", "clip.vision.image_mean"),
    (lambda g: g.set("clip.vision.image_mean", STRING, "0.5"), "GGUF_KEY_TYPE", "clip.vision.image_mean"),
    (lambda g: g.kv.pop("clip.vision.image_mean"), "GGUF_KEY_MISSING", "clip.vision.image_mean"),
    (lambda g: g.kv.pop("clip.vision.projection_dim"), "GGUF_KEY_MISSING", "clip.vision.projection_dim"),
    (_wide_foo, "GGUF_PROJECTOR_WIDTH", "clip.vision.projection_dim"),
    (lambda g: g.set("clip.vision.block_count", U32, 4_000_000_000), "GGUF_KEY_VALUE", "clip.vision.block_count"),
    (lambda g: g.kv.pop("clip.vision.embedding_length"), "GGUF_KEY_MISSING", "clip.vision.embedding_length"),
    (lambda g: g.set("clip.vision.projector.scale_factor", U32, 0), "GGUF_KEY_VALUE",
     "clip.vision.projector.scale_factor"),
], ids=["type-foo", "type-missing", "type-u32", "type-array", "no-vision", "mean-1", "mean-string", "mean-missing",
        "projection-dim-missing", "unknown-type-wrong-width", "block-count-4e9", "embedding-missing", "merge-0"])
def test_projector_keys_clip_cpp_refuses_are_errors_naming_the_key(tmp_path: Path, mutate: Callable[[gb.Gguf], object],
                                                                  code: str, key: str) -> None:
    """What tools/mtmd refuses in the mmproj's keys: an error naming the GGUF key (never config.json's words, never
    the reader's GgufArray), the text model still audited."""
    r = audit(mutated(tmp_path, mutate))
    assert (code, key) in errors(r)
    said = " ".join(f.message for f in r.findings)
    assert "config.json" not in said and "GgufArray" not in said


def test_a_position_table_key_clip_cpp_never_reads_is_no_error(tmp_path: Path) -> None:
    """vision.pos_emb_height is the converter's note; clip.cpp takes the table's shape from the tensor: a key of
    another type is no error, and the table is held to its own shape, not to a config.json."""
    assert errors(audit(mutated(tmp_path, lambda g: g.set("vision.pos_emb_height", STRING, "4")))) == []


def _nested(g: gb.Gguf) -> None:
    g.set("imatrix.datasets", STRING, "x" * 25)  # rewritten into an array of arrays below


def test_an_unreadable_file_beside_the_model_is_named_not_a_second_set(tmp_path: Path) -> None:
    """An mmproj whose general.alignment is UINT64, an imatrix with a nested array: each file's GGUF_INVALID, the
    model audited, never '2 GGUF sets here'."""
    r = audit(mutated(tmp_path / "a", lambda g: g.set("general.alignment", 10, 32)))
    assert errors(r) == [("GGUF_INVALID", None)]
    assert next(f for f in r.findings if f.code == "GGUF_INVALID").shard == MMPROJ.name
    d = mutated(tmp_path / "b", _nested, source=IMATRIX)
    raw = (d / IMATRIX.name).read_bytes()
    placeholder = struct.pack("<IQ", STRING, 25) + b"x" * 25
    nested = struct.pack("<IIQIQQ", ARRAY, ARRAY, 1, STRING, 1, 1) + b"a"
    assert len(nested) == len(placeholder)
    (d / IMATRIX.name).write_bytes(raw.replace(placeholder, nested))
    r = audit(d)
    assert [f.shard for f in r.findings if f.code == "GGUF_INVALID"] == [IMATRIX.name]
    assert [c for c, _ in errors(r)] == ["GGUF_INVALID"]


@pytest.mark.parametrize("mutate", [
    lambda g: g.set("general.type", STRING, "mmproj"), lambda g: g.set("general.type", STRING, "imatrix"),
    lambda g: g.set("clip.projector_type", STRING, "kimik25")], ids=["type-mmproj", "type-imatrix", "clip-key"])
def test_a_model_is_a_model_whatever_else_its_metadata_says(tmp_path: Path,
                                                            mutate: Callable[[gb.Gguf], object]) -> None:
    """llama.cpp's loader opens a file by general.architecture (src/llama.cpp refuses `clip` alone): a deepseek2
    model with general.type mmproj or imatrix, or a stray clip.* key, is audited as the model."""
    r = audit(mutated(tmp_path, mutate, source=TEXT, beside=()))
    assert errors(r) == [] and r.stats.tensors == audit(folder(tmp_path / "alone", TEXT)).stats.tensors


def test_a_projector_renamed_as_a_split_part_is_one_error(tmp_path: Path) -> None:
    """The mmproj as `Kimi-K25-tiny-Q8_0-00002-of-00002.gguf` beside the unsplit model: one GGUF_SPLIT_INVALID naming
    it (a projector, not a part of this set), not its 47 tensors unexpected in the model, nothing saying exit 3."""
    part = "Kimi-K25-tiny-Q8_0-00002-of-00002.gguf"
    r = audit(folder(tmp_path, TEXT, MMPROJ, names=(TEXT.name, part)))
    assert errors(r) == [("GGUF_SPLIT_INVALID", None)]
    f = next(f for f in r.findings if f.code == "GGUF_SPLIT_INVALID")
    assert f.shard == part and "projector" in f.message
    assert not [f for f in r.findings if "exit 3" in f.message or f.code == "LAYOUT_UNSUPPORTED"]


def test_an_importance_matrix_renamed_as_a_split_part_is_one_error(tmp_path: Path) -> None:
    """imatrix.gguf as `Kimi-K25-tiny-Q8_0-00002-of-00002.gguf` beside the unsplit model is no part of its set, as a
    renamed projector is not: one GGUF_SPLIT_INVALID naming it (once an info that let the set PASS)."""
    part = "Kimi-K25-tiny-Q8_0-00002-of-00002.gguf"
    r = audit(folder(tmp_path, TEXT, IMATRIX, names=(TEXT.name, part)))
    assert [(f.code, f.shard) for f in r.findings] == [("GGUF_SPLIT_INVALID", part)]
    assert "importance matrix" in r.findings[0].message and r.exit_code() == 1
