"""INT4 (compressed-tensors pack-quantized) unpacking and group dequantization in numpy, bit for bit
against compressed-tensors' own pack_to_int32 / unpack_from_int32 / quantize / dequantize and its
PackedQuantizationCompressor (test-time references only, beside torch)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kimi_audit.model.quant.compressed.pack import PackQuantized
from kimi_audit.numerics.dtypes import NumericsError
from kimi_audit.numerics.int4 import dequantize_group, packed_words, unpack_int4
from kimi_audit.replica.models import replica_model

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

from ct_checkpoint import as_released  # noqa: E402

TORCH_OF = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def to_np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def random_codes(gen: torch.Generator, shape: tuple[int, int], num_bits: int) -> torch.Tensor:
    lo, hi = -(1 << (num_bits - 1)), 1 << (num_bits - 1)
    return torch.randint(lo, hi, shape, generator=gen, dtype=torch.int8)


def args_for(num_bits: int, group: int, symmetric: bool) -> QuantizationArgs:
    return QuantizationArgs(num_bits=num_bits, type="int", symmetric=symmetric, strategy="group",
                            group_size=group)


def qparams(w: torch.Tensor, args: QuantizationArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors' own min-max observer math, per group."""
    g = w.unflatten(-1, (w.shape[-1] // args.group_size, args.group_size))
    return calculate_qparams(g.amin(-1), g.amax(-1), args)


# ------------------------------------------------------------------ unpacking

SHAPES = [(1, 8), (1, 1), (5, 7), (3, 33), (48, 96), (160, 320), (320, 160), (257, 250), (2, 1000)]


@pytest.mark.parametrize("num_bits", [4, 8, 3, 2, 1, 5])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_unpack_equals_compressed_tensors(num_bits: int, shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(shape[0] * 1000 + shape[1] + num_bits)
    codes = random_codes(gen, shape, num_bits)
    packed = pack_to_int32(codes, num_bits)
    assert packed.dtype == torch.int32 and packed.shape == (shape[0], packed_words(shape[1], num_bits))
    ref = unpack_from_int32(packed, num_bits, torch.Size(shape))
    got = unpack_int4(packed.numpy(), num_bits, shape[1])
    assert got.dtype == np.int8 and got.shape == shape
    assert np.array_equal(got, ref.numpy())
    assert np.array_equal(got, codes.numpy())


def test_unpack_random_words_and_the_nibble_order() -> None:
    """Any word decodes as compressed-tensors decodes it (padding bits included); nibbles LSB first, q+8."""
    gen = torch.Generator().manual_seed(3)
    words = torch.randint(-(1 << 31), (1 << 31) - 1, (37, 13), generator=gen, dtype=torch.int32)
    for num_bits, cols in ((4, 13 * 8), (4, 101), (8, 13 * 4), (8, 50), (3, 138)):
        w = words[:, : packed_words(cols, num_bits)]
        ref = unpack_from_int32(w, num_bits, torch.Size((37, cols)))
        assert np.array_equal(unpack_int4(w.numpy(), num_bits, cols), ref.numpy()), (num_bits, cols)
    word = np.array([[0x76543210 - (1 << 32)]], np.int64).astype(np.int32)  # nibbles 0..7 from the LSB
    assert unpack_int4(word, 4, 8).tolist() == [[-8, -7, -6, -5, -4, -3, -2, -1]]
    assert unpack_int4(word.astype(">i4"), 4, 8).tolist() == [[-8, -7, -6, -5, -4, -3, -2, -1]]


@pytest.mark.parametrize("shape", [(1, 3), (9, 3), (48, 3), (160, 10), (333, 7)], ids=str)
def test_unpack_zero_points_packed_along_the_output_dimension(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(shape[0])
    zp = random_codes(gen, shape, 4)
    packed = pack_to_int32(zp, 4, packed_dim=0)
    got = unpack_int4(packed.numpy(), 4, shape[0], packed_dim=0)
    assert got.shape == shape and np.array_equal(got, zp.numpy())
    if packed.shape[0] > 1:  # one word row: compressed-tensors' 4-bit view of the transposed words fails
        ref = unpack_from_int32(packed, 4, torch.Size(shape), packed_dim=0)
        assert np.array_equal(got, ref.numpy())


def test_unpack_rejects_wrong_words_and_dtypes() -> None:
    with pytest.raises(NumericsError, match="cannot hold 17 4-bit codes"):
        unpack_int4(np.zeros((2, 2), np.int32), 4, 17)
    with pytest.raises(NumericsError, match="int32 words"):
        unpack_int4(np.zeros((2, 2), np.int64), 4, 16)
    with pytest.raises(NumericsError, match="num_bits"):
        unpack_int4(np.zeros((2, 2), np.int32), 9, 7)


# ------------------------------------------------------------------ group dequantization

DEQ_SHAPES = [(1, 32), (7, 64), (48, 96), (160, 320), (320, 160), (257, 224), (64, 2048)]


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize("shape", DEQ_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dequantize_equals_compressed_tensors(shape: tuple[int, int], symmetric: bool) -> None:
    """Weights quantized with compressed-tensors' own observer math and quantize, dequantized by both."""
    gen = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    w = (torch.randn(shape, generator=gen) * torch.exp(torch.randn(shape[0], 1, generator=gen))).to(torch.bfloat16)
    args = args_for(4, 32, symmetric)
    scale, zp = qparams(w, args)
    q = quantize(w, scale, zp, args, dtype=torch.int8)
    ref = dequantize(q, scale, None if symmetric else zp, args)
    assert ref.dtype == torch.bfloat16 and scale.dtype == torch.bfloat16
    got = dequantize_group(q.numpy(), to_np(scale), None if symmetric else zp.numpy(), 32)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == shape
    assert np.array_equal(bits(got), bits(to_np(ref)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("num_bits,group", [(4, 32), (4, 128), (8, 64), (4, 16)])
def test_dequantize_scale_dtypes_bits_and_groups(dtype: str, num_bits: int, group: int) -> None:
    gen = torch.Generator().manual_seed(num_bits * 100 + group)
    w = torch.randn(96, 512, generator=gen).to(TORCH_OF[dtype])
    for symmetric in (True, False):
        args = args_for(num_bits, group, symmetric)
        scale, zp = qparams(w, args)
        q = quantize(w, scale, zp, args, dtype=torch.int8)
        z = None if symmetric else zp
        ref = dequantize(q, scale, z, args)
        got = dequantize_group(q.numpy(), to_np(scale), None if z is None else z.numpy(), group)
        assert got.dtype == to_np(ref).dtype
        assert np.array_equal(bits(got), bits(to_np(ref))), (dtype, num_bits, group, symmetric)
        for out in ("float32", "bfloat16", "float16"):  # dequantize(..., dtype=out): a cast of the result
            ref_o = dequantize(q, scale, z, args, dtype=TORCH_OF[out])
            got_o = dequantize_group(q.numpy(), to_np(scale), None if z is None else z.numpy(), group,
                                     to_np(torch.zeros(1, dtype=TORCH_OF[out])).dtype)
            assert np.array_equal(bits(got_o), bits(to_np(ref_o))), (dtype, out)


def test_dequantize_rounding_on_random_scale_bit_patterns() -> None:
    """Scales from random bf16 bit patterns (every exponent, subnormals to near-overflow): the products
    need rounding back to bf16 and overflow to Inf, as torch does."""
    gen = torch.Generator().manual_seed(11)
    pats = torch.randint(0, 0x7F80, (300, 8), generator=gen, dtype=torch.int32).to(torch.int16)
    scale = pats.view(torch.bfloat16)
    q = random_codes(gen, (300, 8 * 32), 4)
    zp = random_codes(gen, (300, 8), 4)
    for z in (None, zp):
        ref = dequantize(q, scale, z, args_for(4, 32, z is None))
        got = dequantize_group(q.numpy(), to_np(scale), None if z is None else z.numpy(), 32)
        assert np.array_equal(bits(got), bits(to_np(ref)))
    assert np.isinf(got.astype(np.float32)).any() and (got.astype(np.float32) == 0).any()


def test_dequantize_partial_last_group_and_g_idx() -> None:
    """Beyond compressed-tensors (it requires in % group == 0): a last partial group uses its own scale;
    g_idx assigns each input its group. Reference: torch elementwise in bf16."""
    gen = torch.Generator().manual_seed(5)
    q = random_codes(gen, (9, 40), 4)
    s = (torch.rand(9, 2, generator=gen) + 0.01).to(torch.bfloat16)
    ref = q.to(torch.bfloat16) * s.repeat_interleave(32, 1)[:, :40]
    got = dequantize_group(q.numpy(), to_np(s), None, 32)
    assert np.array_equal(bits(got), bits(to_np(ref)))
    g_idx = torch.randint(0, 2, (40,), generator=gen)
    ref = q.to(torch.bfloat16) * s[:, g_idx]
    got = dequantize_group(q.numpy(), to_np(s), None, 32, g_idx=g_idx.numpy().astype(np.int32))
    assert np.array_equal(bits(got), bits(to_np(ref)))
    trivial = np.arange(40) // 32
    assert np.array_equal(bits(dequantize_group(q.numpy(), to_np(s), None, 32, g_idx=trivial)),
                          bits(dequantize_group(q.numpy(), to_np(s), None, 32)))


def test_dequantize_rejects_mismatched_operands() -> None:
    q = np.zeros((4, 64), np.int8)
    s = np.ones((4, 2), ml_dtypes.bfloat16)
    with pytest.raises(NumericsError, match=r"scale shape \[4, 2\] != \[4, 4\]"):
        dequantize_group(q, s, None, 16)
    with pytest.raises(NumericsError, match="zero_point"):
        dequantize_group(q, s, np.zeros((4, 3), np.int8), 32)
    with pytest.raises(NumericsError, match="bf16 / f16 / f32"):
        dequantize_group(q, s.astype(np.float64), None, 32)
    with pytest.raises(NumericsError, match="g_idx"):
        dequantize_group(q, s, None, 32, g_idx=np.full(64, 2))


# ------------------------------------------------------------------ the scheme, end to end


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize("shape", [(160, 320), (320, 160), (2048, 64)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_scheme_dequantize_equals_compressed_tensors_decompress(shape: tuple[int, int], symmetric: bool) -> None:
    """PackedQuantizationCompressor.compress writes the tensors a checkpoint stores; PackQuantized
    .dequantize on them == its decompress, byte for byte."""
    gen = torch.Generator().manual_seed(sum(shape) + symmetric)
    w = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
    args = args_for(4, 32, symmetric)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    scale, zp = qparams(w, args)
    state = {"weight": w, "weight_scale": scale} | ({} if symmetric else {"weight_zero_point": zp})
    stored = PackedQuantizationCompressor.compress(state, scheme)
    ref = PackedQuantizationCompressor.decompress(stored, scheme)["weight"]
    ours = PackQuantized(bits=4, group_size=32, symmetric=symmetric)
    writer = {suffix: dtype for suffix, dtype, _ in PackQuantized.writer_dtypes}  # its own widths: weight_shape I64
    expected = {s.suffix: (writer.get(s.suffix, s.dtype), s.shape) for s in ours.stored(*shape)}
    got_tensors = {"." + k: to_np(v) for k, v in stored.items()}
    assert {k: (str(v.dtype), v.shape) for k, v in got_tensors.items()} == {
        k: ({"I32": "int32", "I64": "int64", "BF16": "bfloat16"}[d], s) for k, (d, s) in expected.items()}
    got = ours.dequantize(got_tensors, *shape)
    assert np.array_equal(bits(got), bits(to_np(ref)))
    with pytest.raises(NumericsError, match=r"weight_shape holds \[\d+, \d+\], the module is"):
        ours.dequantize(got_tensors, shape[0], shape[1] + 32)


# ------------------------------------------------------------------ a tiny INT4 checkpoint: `tensor`, `audit --values`

KIMI_THINKING_QUANT = json.loads(replica_model("kimi-k2-thinking").config_bytes())["quantization_config"]
"""Kimi-K2-Thinking's compressed-tensors quantization_config, as the package ships it."""

EXPERT = "model.layers.2.mlp.experts.7.gate_proj"


def int4_config(symmetric: bool = True) -> dict:
    from tiny_checkpoint import TINY_CONFIG

    q = json.loads(json.dumps(KIMI_THINKING_QUANT))
    q["config_groups"]["group_0"]["weights"]["symmetric"] = symmetric
    return dict(TINY_CONFIG, quantization_config=q)


def build_int4(d: Path, symmetric: bool = True, seed: int = 0, writers_widths: bool = False) -> Path:
    """The tiny architecture with Kimi-K2-Thinking's quantization: every routed expert projection written by
    compressed-tensors' own PackedQuantizationCompressor.compress (its weight_shape in the release's I32,
    ct_checkpoint.as_released), the rest BF16 / F32, saved with safetensors.torch in three shards with an index."""
    from safetensors.torch import save_file

    from kimi_audit.model.config import model_config_from_dict
    from kimi_audit.model.kinds import BUFFER, PACKED, SCALE
    from kimi_audit.model.layout import expected_layout
    from tiny_checkpoint import tiny_shard_of

    config = int4_config(symmetric)
    layout = expected_layout(model_config_from_dict(config))
    gen = torch.Generator().manual_seed(seed)
    args = args_for(4, 32, symmetric)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    dt = {"BF16": torch.bfloat16, "F32": torch.float32}
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in layout.items():
        if t.kind == SCALE:
            continue  # written by the compressor with its weight
        if t.kind == PACKED:
            module = name[: -len(".weight_packed")]
            out, inp = t.shape[0], t.logical // t.shape[0]
            w = (torch.randn(out, inp, generator=gen) * 0.02).to(torch.bfloat16)
            scale, zp = qparams(w, args)
            state = {"weight": w, "weight_scale": scale} | ({} if symmetric else {"weight_zero_point": zp})
            made = {f"{module}.{k}": v for k, v in PackedQuantizationCompressor.compress(state, scheme).items()}
            made = made if writers_widths else as_released(made)
        elif t.kind == BUFFER:
            made = {name: torch.ones(t.shape, dtype=dt[t.dtype])}
        elif name.endswith("norm.weight"):
            made = {name: (1 + 0.1 * torch.randn(t.shape, generator=gen)).to(dt[t.dtype])}
        else:
            made = {name: (0.02 * torch.randn(t.shape, generator=gen)).to(dt[t.dtype])}
        for k, v in made.items():
            shards.setdefault(tiny_shard_of(k), {})[k] = v.contiguous()
    d.mkdir(parents=True)
    weight_map = {}
    for shard, members in shards.items():
        save_file(members, str(d / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(members, shard))
    total = sum(v.numel() * v.element_size() for m in shards.values() for v in m.values())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                "weight_map": dict(sorted(weight_map.items()))}))
    (d / "config.json").write_text(json.dumps(config, indent=2))
    return d


@pytest.fixture(scope="module")
def int4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_int4(tmp_path_factory.mktemp("int4") / "ckpt")


def run_json(*args: str, code: int = 0) -> dict:
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == code, r.output
    return json.loads(r.stdout)


def decompressed(d: Path, module: str, symmetric: bool = True) -> torch.Tensor:
    """compressed-tensors' own decompression of the module's stored tensors (read with safetensors)."""
    from safetensors.torch import load_file

    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    state = {}
    for k in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point"):
        if f"{module}.{k}" in index:
            state[k] = load_file(str(d / index[f"{module}.{k}"]))[f"{module}.{k}"]
    scheme = QuantizationScheme(targets=["Linear"], weights=args_for(4, 32, symmetric))
    return PackedQuantizationCompressor.decompress(state, scheme)["weight"]


def poke(d: Path, name: str, values: np.ndarray, start_elem: int = 0) -> None:
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    path = d / index[name]
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        begin = json.loads(f.read(n))[name]["data_offsets"][0]
        f.seek(8 + n + begin + start_elem * values.dtype.itemsize)
        f.write(np.ascontiguousarray(values).tobytes())


def test_tiny_int4_checkpoint_audits_clean(int4_dir: Path) -> None:
    doc = run_json("audit", str(int4_dir), "--values", "--no-progress")
    assert [f["code"] for f in doc["findings"]] == ["VALUES_CHECKED"], doc["findings"]
    assert "72 weight scales, 72 weight_shapes" in doc["findings"][0]["message"]
    # the summary is the plan's: the scheme's own fields, no phantom FP8 block
    assert doc["model"]["quantization"] == {"method": "compressed-tensors", "format": "pack-quantized", "bits": 4,
                                            "group_size": 32, "strategy": "group", "symmetric": True}


@pytest.mark.parametrize("given", [EXPERT, EXPERT + ".weight_packed"], ids=["module", "weight_packed"])
def test_tensor_dequant_int4_expert_equals_compressed_tensors(int4_dir: Path, given: str) -> None:
    doc = run_json("tensor", str(int4_dir), given, "--dequant")
    assert doc["tensor"] == EXPERT + ".weight_packed" and doc["module"] == EXPERT
    assert doc["scheme"] == PackQuantized.key and doc["dtype"] == "I32" and doc["shape"] == [160, 40]
    assert doc["weight_shape"] == [160, 320] and doc["ok"] and doc["problems"] == []
    assert doc["scale"]["tensor"] == EXPERT + ".weight_scale" and doc["scale"]["stats"]["shape"] == [160, 10]
    ref = decompressed(int4_dir, EXPERT)
    r64 = ref.double()
    dq = doc["dequantized"]
    assert dq["dtype"] == "BF16" and dq["shape"] == [160, 320] and dq["count"] == ref.numel()
    assert dq["min"] == float(r64.min()) and dq["max"] == float(r64.max())
    assert dq["zeros"] == int((r64 == 0).sum()) and dq["nan"] == 0
    assert dq["mean"] == pytest.approx(float(r64.mean()), rel=1e-9, abs=1e-15)
    assert dq["std"] == pytest.approx(float(r64.std(unbiased=False)), rel=1e-9)
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    r = CliRunner().invoke(app, ["tensor", str(int4_dir), given, "--dequant"])
    assert r.exit_code == 0 and "dequantized BF16" in r.stdout and "INT4 symmetric" in r.stdout


def test_tensor_dequant_int4_asymmetric(tmp_path: Path) -> None:
    d = build_int4(tmp_path / "asym", symmetric=False, seed=1)
    doc = run_json("tensor", str(d), EXPERT, "--dequant")
    ref = decompressed(d, EXPERT, symmetric=False).double()
    assert doc["ok"] and doc["dequantized"]["min"] == float(ref.min()) and doc["dequantized"]["max"] == float(ref.max())
    assert doc["dequantized"]["std"] == pytest.approx(float(ref.std(unbiased=False)), rel=1e-9)
    assert run_json("audit", str(d), "--no-progress")["findings"] == []


def test_weight_shape_and_group_scale_faults(int4_dir: Path, tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "ckpt"
    shutil.copytree(int4_dir, d)
    down = "model.layers.3.mlp.experts.1.down_proj"
    poke(d, EXPERT + ".weight_shape", np.array([160, 352], np.int32))
    poke(d, down + ".weight_scale", np.array([np.nan, 0.0, -1.0], ml_dtypes.bfloat16), start_elem=4)
    doc = run_json("tensor", str(d), EXPERT, "--dequant", code=1)
    assert doc["weight_shape"] == [160, 352] and doc["dequantized"] is None
    assert doc["problems"] == [f"WEIGHT_SHAPE_MISMATCH: {EXPERT}.weight_shape holds [160, 352], the config "
                               "implies [160, 320]"]
    doc = run_json("tensor", str(d), down, code=1)  # the values pass's own check: the same codes as below
    assert doc["problems"] == [f"VALUE_NAN: {down}.weight_scale: 1 of 1,600 values are NaN",
                               f"SCALE_NOT_POSITIVE: {down}.weight_scale: 2 of 1,600 group scales are ≤ 0 "
                               "(dequantized weights would be zero or sign-flipped)"]
    doc = run_json("audit", str(d), "--values", "--no-progress", code=1)
    got = {(f["code"], f["severity"], f["tensor"], str(f["expected"]), f["actual"]) for f in doc["findings"]
           if f["severity"] != "info"}
    assert got == {("WEIGHT_SHAPE_MISMATCH", "error", EXPERT + ".weight_shape", "[160, 320]", 1),
                   ("VALUE_NAN", "error", down + ".weight_scale", "no NaN", 1),
                   ("SCALE_NOT_POSITIVE", "error", down + ".weight_scale", "finite scales > 0", 2)}


def test_the_compressors_own_weight_shape_width_is_one_info(int4_dir: Path, tmp_path: Path) -> None:
    """compressed-tensors' compressor writes weight_shape I64 (torch.tensor(weight.shape)); the releases store I32.
    A checkpoint the compressor wrote passes with one WRITER_DTYPE info for all 72; in a release-width checkpoint,
    one weight_shape cast to I64 on its own is a DTYPE_MISMATCH, the only error."""
    import shutil

    from safetensors.torch import load_file, save_file

    ct = build_int4(tmp_path / "ct", writers_widths=True)
    doc = run_json("audit", str(ct), "--no-progress")
    (f,) = [f for f in doc["findings"] if f["code"] == "WRITER_DTYPE"]
    assert (f["severity"], f["covers"], f["expected"], f["actual"]) == ("info", 72, "I32", "I64")
    assert "compressed-tensors' compressor" in f["message"] and doc["result"]["verdict"] == "PASS"
    stored = {r["dtype"]: (r["derived"], r["found"]) for r in run_json("params", str(ct))["stored_by_dtype"]}
    assert stored["I64"] == (144, 144) and all(d == f for d, f in stored.values())  # `params` derives it so too
    d = Path(shutil.copytree(int4_dir, tmp_path / "one"))
    name = EXPERT + ".weight_shape"
    index = json.loads((d / "model.safetensors.index.json").read_text())
    tensors = load_file(d / index["weight_map"][name])
    tensors[name] = tensors[name].to(torch.int64)
    save_file(tensors, str(d / index["weight_map"][name]), metadata={"format": "pt"})
    index["metadata"]["total_size"] += 8  # as the writer would count it
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    doc = run_json("audit", str(d), "--no-progress", code=1)
    assert [(f["code"], f["tensor"]) for f in doc["findings"] if f["severity"] != "info"] == [("DTYPE_MISMATCH", name)]
