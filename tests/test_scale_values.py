"""No false PASS, round four (items 3 and 4): every scale a checkpoint stores is read by `audit --values` and
`verify` with the rule its format implies.

- A GGUF tensor of a quantized ggml type keeps its scales inside each block (`d`, `m`, `dmin`, MXFP4's E8M0 `e`,
  IQ1_M's nibbles): `verify` reads every block's as llama.cpp's `--check-tensors` does (ggml_validate_row_data),
  `audit --values` those of each tensor it reads whole. The offsets (format.gguf_types) are held to gguf-py's own
  dequantize: a NaN scale written at the kernel's offset is a NaN in exactly that block's values.
- Input and KV-cache scales (ModelOpt's `input_scale`, `k_scale`, `v_scale`; llmcompressor's `self_attn.k_scale`)
  must be finite and > 0.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import gguf_builder as gb
from kimi_audit import audit
from kimi_audit.checks import values as values_pass
from kimi_audit.checks.value_rules import VALUE_KINDS
from kimi_audit.format.gguf_types import E8M0, F16, F32, GGML_BY_NAME, GGML_TYPES, IQ1_M_F16
from kimi_audit.model import kinds
from kimi_audit.model.roles import suffix_roles
from kimi_audit.numerics.scan import ggml_scales
from kimi_audit.sources import LocalSource
from kimi_audit.verify.read import FileTask, TensorPlan, plan_pieces, tensor_kind, verify_file
from kimi_audit.verify.run import VerifyOptions, VerifyTarget, prepare, verify_files

gguf = pytest.importorskip("gguf")

DATA = Path(__file__).resolve().parent / "data"
Q2K = DATA / "gguf" / "tiny-Q2_K.gguf"
SPLIT = DATA / "gguf" / "Q8_0"
NAN16, INF16, NAN32 = 0x7E00, 0x7C00, 0x7FC00000

SCALED = sorted(n for n, t in GGML_BY_NAME.items() if t.quantized and t.scales)
"""Every ggml type whose blocks carry scales llama.cpp checks."""


def verify(d: Path) -> dict[str, list]:
    target = VerifyTarget(LocalSource(d), (), frozenset())
    report, _ = verify_files(prepare(target, VerifyOptions(workers=1)))
    out: dict[str, list] = {}
    for f in report.findings:
        out.setdefault(f.code, []).append(f)
    return out


def audit_errors(d: Path) -> list[tuple[str, str | None]]:
    report = audit(d, values=True)
    return [(f.code, f.tensor) for f in report.findings if f.severity.value == "error"]


# ------------------------------------------------------------------ the scale fields, against gguf-py


def put_scale(block: bytearray, code: str, off: int, bits: int) -> None:
    """Write a scale of these bits into one block's field (IQ1_M: the four top nibbles of its uint16 scales)."""
    if code == F16:
        block[off:off + 2] = struct.pack("<H", bits)
    elif code == F32:
        block[off:off + 4] = struct.pack("<I", bits)
    elif code == E8M0:
        block[off] = bits
    else:
        assert code == IQ1_M_F16
        for k in range(4):
            sc = struct.unpack_from("<H", block, off + 2 * k)[0]
            struct.pack_into("<H", block, off + 2 * k, (sc & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12))


def finite_blocks(name: str, n: int, seed: int = 0) -> bytearray:
    """`n` blocks of random bytes whose every scale field is 1.0 (E8M0: 2**0)."""
    t = GGML_BY_NAME[name]
    raw = bytearray(np.random.default_rng(seed).integers(0, 256, n * t.size, dtype=np.uint8).tobytes())
    one = {F16: 0x3C00, F32: 0x3F800000, E8M0: 127, IQ1_M_F16: 0x3C00}
    for i in range(n):
        block = raw[i * t.size:(i + 1) * t.size]
        for _field, code, off in t.scales or ():
            put_scale(block, code, off, one[code])
        raw[i * t.size:(i + 1) * t.size] = block
    return raw


def with_bad(name: str, n: int, at: int, field: int, bits: int) -> bytes:
    t = GGML_BY_NAME[name]
    raw = finite_blocks(name, n)
    block = raw[at * t.size:(at + 1) * t.size]
    _f, code, off = (t.scales or ())[field]
    put_scale(block, code, off, bits)
    raw[at * t.size:(at + 1) * t.size] = block
    return bytes(raw)


def nan_code(code: str) -> int:
    return {F16: NAN16, IQ1_M_F16: NAN16, F32: NAN32, E8M0: 0xFF}[code]


GGUF_PY = sorted(n for n in SCALED if hasattr(gguf.quants, n) and n != "MXFP4")
"""The types whose dequantize gguf-py has (MXFP4's reads 0xFF as 2**127, not NaN: held apart)."""


@pytest.mark.parametrize("name", GGUF_PY)
def test_scale_offsets_are_gguf_pys(name: str) -> None:
    """A NaN written where the kernel reads a scale field makes gguf-py's dequantize NaN in that block alone, and
    the kernel reads NaN in that block alone: the offsets are the ones llama.cpp's own Python reads."""
    t = GGML_BY_NAME[name]
    qtype = gguf.GGMLQuantizationType[name]
    assert gguf.GGML_QUANT_SIZES[qtype] == (t.block, t.size)
    n = 4
    clean = gguf.quants.dequantize(np.frombuffer(bytes(finite_blocks(name, n)), np.uint8), qtype)
    assert np.isfinite(clean).all()
    for j, (_f, code, _off) in enumerate(t.scales or ()):
        raw = with_bad(name, n, 2, j, nan_code(code))
        out = gguf.quants.dequantize(np.frombuffer(raw, np.uint8), qtype).reshape(n, t.block)
        assert np.isnan(out).any(axis=1).tolist() == [False, False, True, False], (name, j)
        mine = ggml_scales(raw, 0, n, name)
        assert np.isnan(mine).any(axis=1).tolist() == [False, False, True, False], (name, j)


def test_mxfp4_exponent_is_the_first_byte() -> None:
    """MXFP4's `e` (gguf-py decodes 0xFF as a finite 2**127): a changed `e` changes that block's values alone, and
    the kernel reads 0xFF as NaN there (llama.cpp: "invalid e value")."""
    qtype = gguf.GGMLQuantizationType.MXFP4
    clean = gguf.quants.dequantize(np.frombuffer(bytes(finite_blocks("MXFP4", 4)), np.uint8), qtype).reshape(4, 32)
    raw = with_bad("MXFP4", 4, 1, 0, 0xFF)
    with np.errstate(over="ignore"):
        out = gguf.quants.dequantize(np.frombuffer(raw, np.uint8), qtype).reshape(4, 32)
    assert [not np.array_equal(a, b) for a, b in zip(clean, out)] == [False, True, False, False]
    assert np.isnan(ggml_scales(raw, 0, 4, "MXFP4")).any(axis=1).tolist() == [False, True, False, False]


@pytest.mark.parametrize("name", sorted(set(SCALED) - set(GGUF_PY) - {"MXFP4"}))
def test_scale_offsets_of_the_types_gguf_py_cannot_dequantize(name: str) -> None:
    """Q1_0, Q2_0 (d first: ggml-common.h's block_q1_0, block_q2_0) and Q8_K (an F32 d first): hand-written blocks."""
    t = GGML_BY_NAME[name]
    assert (t.scales or ())[0][2] == 0
    raw = bytearray(finite_blocks(name, 3))
    code = (t.scales or ())[0][1]
    raw[t.size:t.size + (4 if code == F32 else 2)] = struct.pack("<I" if code == F32 else "<H", nan_code(code))
    assert np.isnan(ggml_scales(bytes(raw), 0, 3, name)).any(axis=1).tolist() == [False, True, False]


def test_the_scale_fields_are_llama_cpps() -> None:
    """Where each scale lies, per ggml-common.h: Q2_K's d, dmin close its block; Q3_K, Q6_K, TQ1_0, TQ2_0 close it
    with d; Q4_K, Q5_K open it with d, dmin; NVFP4 has none to check; Q8_1 is refused whole."""
    fields = {n: t.scales for n, t in GGML_BY_NAME.items()}
    assert fields["Q2_K"] == (("d", F16, 80), ("dmin", F16, 82))
    assert [fields[n][0][2] for n in ("Q3_K", "Q6_K", "TQ1_0", "TQ2_0")] == [108, 208, 52, 64]  # type: ignore[index]
    assert fields["Q4_K"] == fields["Q5_K"] == (("d", F16, 0), ("dmin", F16, 2))
    assert fields["Q4_1"] == fields["Q5_1"] == (("d", F16, 0), ("m", F16, 2))
    assert fields["Q8_K"] == (("d", F32, 0),) and fields["MXFP4"] == (("e", E8M0, 0),)
    assert fields["NVFP4"] == () and fields["Q8_1"] is None
    assert set(SCALED) == {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q1_0", "Q2_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                           "Q6_K", "Q8_K", "TQ1_0", "TQ2_0", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                           "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "MXFP4"}


# ------------------------------------------------------------------ faulty GGUF files


def fault(src: Path, dst: Path, tensor: str, block: int, field: int, bits: int) -> Path:
    """A copy of GGUF part `src` at `dst`, one scale field of one block of `tensor` set to `bits`."""
    g = gb.read(src)
    t = g.tensor(tensor)
    ggml = GGML_TYPES[t.type_id]
    data = bytearray(t.data)
    one = data[block * ggml.size:(block + 1) * ggml.size]
    _f, code, off = (ggml.scales or ())[field]
    put_scale(one, code, off, bits)
    data[block * ggml.size:(block + 1) * ggml.size] = one
    t.data = bytes(data)
    dst.parent.mkdir(parents=True, exist_ok=True)
    gb.write(g, dst)
    return dst


Q2K_CASES = [
    ("token_embd.weight", 3, 0, NAN16, "VALUE_NAN"),  # Q2_K d (at the block's end)
    ("token_embd.weight", 5, 1, NAN16, "VALUE_NAN"),  # Q2_K dmin
    ("blk.1.ffn_up_exps.weight", 0, 1, INF16, "VALUE_INF"),  # Q2_K dmin, stacked experts
    ("blk.0.ffn_down.weight", 7, 0, NAN16, "VALUE_NAN"),  # Q3_K d
    ("blk.0.attn_k_b.weight", 9, 0, INF16 | 0x8000, "VALUE_INF"),  # Q4_0 d, -Inf
    ("output.weight", 2, 0, NAN16, "VALUE_NAN"),  # Q6_K d
]


@pytest.mark.parametrize(("tensor", "block", "field", "bits", "code"), Q2K_CASES)
def test_a_bad_scale_in_a_llama_cpp_file_fails_verify_and_values(tmp_path: Path, tensor: str, block: int,
                                                                  field: int, bits: int, code: str) -> None:
    d = tmp_path / "q2k"
    fault(Q2K, d / Q2K.name, tensor, block, field, bits)
    found = verify(d)
    ggml = GGML_TYPES[gb.read(Q2K).tensor(tensor).type_id]
    (f,) = found[code]
    assert (f.tensor, f.actual, f.expected) == (tensor, 1, block * ggml.block), f.message
    assert f"block {block:,}" in f.message and ggml.name in f.message
    assert audit_errors(d) == [(code, tensor)]


@pytest.mark.parametrize(("bits", "code"), [(NAN16, "VALUE_NAN"), (INF16, "VALUE_INF")])
def test_a_bad_q8_0_scale_in_a_split_set(tmp_path: Path, bits: int, code: str) -> None:
    d = Path(shutil.copytree(SPLIT, tmp_path / "Q8_0"))
    part = d / "tiny-Q8_0-00002-of-00004.gguf"
    tensor = next(t.name for t in gb.read(part).tensors if t.type_id == gguf.GGMLQuantizationType.Q8_0)
    fault(part, part, tensor, 11, 0, bits)
    (f,) = verify(d)[code]
    assert (f.tensor, f.shard, f.expected) == (tensor, part.name, 11 * 32)
    assert audit_errors(d) == [(code, tensor)]


def test_the_llama_cpp_files_pass_and_count_their_quantized_tensors(tmp_path: Path) -> None:
    target = VerifyTarget(LocalSource(Q2K.parent / "Q8_0"), (), frozenset())
    report, _ = verify_files(prepare(target, VerifyOptions(workers=1)))
    assert report.exit_code == 0 and report.tensors_scanned == sum(len(gb.read(p).tensors)
                                                                   for p in (Q2K.parent / "Q8_0").glob("*.gguf"))
    checked = [f for f in audit(SPLIT, values=True).findings if f.code == "VALUES_CHECKED"]
    assert "the block scales of 35 quantized GGUF tensors, each read whole" in checked[0].message


def retyped(tmp_path: Path, name: str, raw: bytes, tensor: str = "token_embd.weight") -> Path:
    """tiny-Q2_K.gguf with `tensor` stored as ggml type `name` (its bytes `raw`)."""
    g = gb.read(Q2K)
    t = g.tensor(tensor)
    t.type_id, t.data = GGML_BY_NAME[name].id, raw
    d = tmp_path / name
    d.mkdir()
    gb.write(g, d / Q2K.name)
    return d


@pytest.mark.parametrize("name", SCALED)
def test_every_scaled_type_is_read_by_verify_and_values(tmp_path: Path, name: str) -> None:
    """token_embd [512, 256] stored in each type: one NaN scale in block 5, named by both."""
    t = GGML_BY_NAME[name]
    n = 512 * 256 // t.block
    d = retyped(tmp_path, name, with_bad(name, n, 5, len(t.scales or ()) - 1, nan_code((t.scales or ())[-1][1])))
    (f,) = verify(d)["VALUE_NAN"]
    assert (f.tensor, f.actual, f.expected) == ("token_embd.weight", 1, 5 * t.block)
    assert audit_errors(d) == [("VALUE_NAN", "token_embd.weight")]


def test_q8_1_is_refused_as_llama_cpp_refuses_it(tmp_path: Path) -> None:
    d = retyped(tmp_path, "Q8_1", bytes(512 * 256 // 32 * 36))
    (f,) = verify(d)["GGUF_TYPE_UNKNOWN"]
    assert f.tensor == "token_embd.weight" and "refuses" in f.message


def test_pieces_end_on_whole_blocks(tmp_path: Path) -> None:
    """Pieces shorter than a block, or cutting one, end on the blocks of a quantized GGUF tensor; a NaN scale in a
    block read in such pieces is found once."""
    d = tmp_path / "q2k"
    path = fault(Q2K, d / Q2K.name, "token_embd.weight", 100, 1, NAN16)
    from kimi_audit.model.checkpoint import load_checkpoint
    from kimi_audit.verify.run import plan_tasks

    task = plan_tasks(load_checkpoint(LocalSource(d)), VerifyTarget(LocalSource(d), (), frozenset()),
                      VerifyOptions(workers=1))[0]
    ggml = [p for p in task.tensors if p.kind == "ggml"]
    assert len(ggml) == 35
    for chunk in (100, 1000, 4099):
        for s, e in plan_pieces(task.size, task.tensors, chunk):
            for p in ggml:
                for edge in (s, e):
                    if p.begin < edge < p.end:
                        assert (edge - p.begin) % GGML_BY_NAME[p.dtype].size == 0
        r = verify_file(FileTask(task.name, task.size, path=str(path), tensors=task.tensors, chunk=chunk))
        assert [(h.tensor, h.code, h.count, h.first) for h in r.health] == [("token_embd.weight", "VALUE_NAN", 1,
                                                                              100 * 256)]
        assert r.tensors_scanned == len([p for p in task.tensors if p.kind is not None])


def test_values_says_which_quantized_tensors_it_left_to_verify(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantized tensor over the pass's size bound is not read: one VALUES_SKIPPED says how many and who reads
    them; no report claims their scales checked."""
    d = tmp_path / "q2k"
    fault(Q2K, d / Q2K.name, "output.weight", 2, 0, NAN16)  # 107,520 bytes
    monkeypatch.setattr(values_pass, "MAX_GGML_BYTES", 100_000)
    report = audit(d, values=True)
    (skipped,) = [f for f in report.findings if f.code == "VALUES_SKIPPED"]  # output and two ffn_down_exps
    assert (skipped.actual, skipped.tensor) == (3, "output.weight") and "verify" in skipped.message
    assert "over 100,000 bytes" in skipped.message
    assert "32 quantized GGUF tensors" in next(f.message for f in report.findings if f.code == "VALUES_CHECKED")
    assert [f.tensor for f in verify(d)["VALUE_NAN"]] == ["output.weight"]


# ------------------------------------------------------------------ input and KV-cache scales


def poke(d: Path, name: str, value: float) -> None:
    """Set every value of safetensors tensor `name` (in d/model.safetensors) to `value`, in its dtype."""
    path = d / "model.safetensors"
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        entry = json.loads(f.read(n))[name]
        begin, end = entry["data_offsets"]
        if entry["dtype"] == "BF16":
            raw = (np.array([value], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = np.array([value], {"F32": "<f4", "F16": "<f2"}[entry["dtype"]]).tobytes()
        f.seek(8 + n + begin)
        f.write(raw * ((end - begin) // len(raw)))


MODELOPT = DATA / "modelopt" / "nvfp4-kv"
KV = "model.layers.1.self_attn.k_proj.k_scale"
V = "model.layers.2.self_attn.v_proj.v_scale"
INPUT = "model.layers.0.self_attn.o_proj.input_scale"
LLMC_KV = "model.layers.1.self_attn.k_scale"


@pytest.mark.parametrize(("src", "tensor", "value", "code"), [
    (MODELOPT, KV, float("nan"), "VALUE_NAN"),
    (MODELOPT, KV, -3.0, "SCALE_NOT_POSITIVE"),
    (MODELOPT, V, 0.0, "SCALE_NOT_POSITIVE"),
    (MODELOPT, INPUT, float("nan"), "VALUE_NAN"),
    (MODELOPT, INPUT, 0.0, "SCALE_NOT_POSITIVE"),
    (MODELOPT, INPUT, float("inf"), "VALUE_INF"),
    (DATA / "llmcompressor" / "fp8-kv", LLMC_KV, -3.0, "SCALE_NOT_POSITIVE"),
    (DATA / "llmcompressor" / "fp8-kv", LLMC_KV, float("nan"), "VALUE_NAN"),
])
def test_a_bad_input_or_kv_cache_scale_fails_values_and_verify(tmp_path: Path, src: Path, tensor: str,
                                                                value: float, code: str) -> None:
    d = Path(shutil.copytree(src, tmp_path / "ckpt"))
    poke(d, tensor, value)
    assert (code, tensor) in audit_errors(d)
    found = verify(d)
    assert [f.tensor for f in found[code]] == [tensor]


def test_the_writers_input_and_kv_cache_scales_pass_and_are_counted() -> None:
    for src, n in ((MODELOPT, None), (DATA / "llmcompressor" / "fp8-kv", 6)):
        report = audit(src, values=True)
        assert report.verdict() == "PASS", [(f.code, f.message) for f in report.findings]
        checked = next(f.message for f in report.findings if f.code == "VALUES_CHECKED")
        assert "input and KV-cache scales" in checked
        if n is not None:
            assert f"{n:,} input and KV-cache scales" in checked


def test_every_scale_role_the_formats_declare_has_a_value_rule() -> None:
    """Every role of a scale tensor a format or an architecture declares (model.roles) is read by `--values` and,
    as a float, by `verify` as a scale (finite and > 0); what is left out holds integers (zero points, group
    indices, layout codes: every code a value)."""
    integers = {kinds.ZERO_POINT, kinds.GROUP_INDEX, kinds.WEIGHT_FORMAT}
    scales = {role for _suffix, role in suffix_roles() if kinds.KIND_OF_ROLE.get(role) == kinds.SCALE}
    assert scales - integers <= set(VALUE_KINDS)
    for suffix, role in suffix_roles():
        if role in (kinds.INPUT_SCALE, kinds.KV_SCALE, kinds.GROUP_SCALE, kinds.GLOBAL_SCALE, kinds.BLOCK_SCALE):
            name = "model.layers.0.self_attn.o_proj" + suffix
            assert tensor_kind(name, "F32", ()) in ("scale", "activation_scale"), suffix
            assert tensor_kind(name, "F8_E4M3", ()) == "fp8_scale", suffix
    assert TensorPlan("x", "Q8_0", (1, 32), 0, 34, tensor_kind("x", "Q8_0", (1, 32))).kind == "ggml"
    assert tensor_kind("x", "NVFP4", (1, 64)) is None  # llama.cpp takes every UE4M3 byte
