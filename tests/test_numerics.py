"""Bit-identity of kimi_audit.numerics.kernels with torch (CPU), the test-time reference.

torch is never a runtime dependency; these tests skip without it (.ci/run installs torch==2.13.0).
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import pytest

from kimi_audit.numerics import kernels as nm

torch = pytest.importorskip("torch")
nn = torch.nn


class DeepseekV3RMSNorm(nn.Module):
    """The class from modeling_deepseek.py (Kimi-K2 / DeepSeek-V3), verbatim arithmetic."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def to_np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return t.numpy()


def bit_mismatches(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(elements whose bits differ, other than NaN-vs-NaN; elements where both are NaN)."""
    a = np.asarray(a)
    b = np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    ui = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    both_nan = np.isnan(a.astype(np.float32)) & np.isnan(b.astype(np.float32))
    diff = (a.view(ui) != b.view(ui)) & ~both_nan
    return int(diff.sum()), int(both_nan.sum())


def torch_rmsnorm(x: torch.Tensor, gain: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    mod = DeepseekV3RMSNorm(gain.shape[0], eps=eps)
    with torch.no_grad():
        mod.weight = nn.Parameter(gain.clone(), requires_grad=False)
        return mod(x)


@functools.lru_cache(maxsize=4)
def activations(rows: int, width: int, seed: int) -> torch.Tensor:
    """bf16 activations with a per-row scale spanning ~6 orders of magnitude and heavy tails."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, width, generator=g)
    tails = torch.distributions.StudentT(3.0).sample((rows, width))
    mix = torch.where(torch.rand(rows, width, generator=g) < 0.1, tails, base)
    scale = torch.exp(torch.empty(rows, 1).uniform_(-7.0, 7.0, generator=g))
    return (mix * scale).to(torch.bfloat16)


def gains(width: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(width, generator=g) * 2.5 + 0.02).to(torch.bfloat16)


# ------------------------------------------------------------------ RMSNorm


@pytest.mark.parametrize(
    "width,rows",
    [(1536, 24576), (512, 32768), (7168, 4096)],
    ids=["q_a_layernorm-1536", "kv_a_layernorm-512", "hidden-7168"],
)
def test_rmsnorm_bit_identical_to_deepseekv3_rmsnorm(width: int, rows: int) -> None:
    x = activations(rows, width, seed=width)
    g = gains(width, seed=width + 1)
    ref = torch_rmsnorm(x, g)
    assert ref.dtype == torch.bfloat16
    got = nm.rms_norm(to_np(x), to_np(g))
    assert got.dtype == ml_dtypes.bfloat16
    diff, _ = bit_mismatches(got, to_np(ref))
    assert diff == 0, f"{diff} of {rows * width} elements differ"


def test_rmsnorm_3d_batch_and_threads() -> None:
    x = activations(2 * 700, 1536, seed=5).reshape(2, 700, 1536)
    g = gains(1536, seed=6)
    ref = to_np(torch_rmsnorm(x, g))
    one = nm.rms_norm(to_np(x), to_np(g), threads=1, chunk_rows=97)
    two = nm.rms_norm(to_np(x), to_np(g), threads=2, chunk_rows=256)
    assert one.shape == (2, 700, 1536)
    assert bit_mismatches(one, ref)[0] == 0
    assert bit_mismatches(two, ref)[0] == 0


def _rms_with_naive_mean(x: np.ndarray, g: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Same steps but numpy's own (pairwise) mean: what a straightforward port would do."""
    h = x.astype(np.float32)
    var = (h * h).mean(-1, keepdims=True, dtype=np.float32)
    hn = (h * (np.float32(1) / np.sqrt(var + np.float32(eps)))).astype(ml_dtypes.bfloat16)
    return (hn.astype(np.float32) * g.astype(np.float32)).astype(ml_dtypes.bfloat16)


def test_summation_order_matters_so_the_test_can_fail() -> None:
    """A port with numpy's pairwise mean disagrees with torch on this data: the order is real."""
    x = activations(24576, 1536, seed=1536)
    g = gains(1536, seed=1537)
    ref = to_np(torch_rmsnorm(x, g))
    naive_diff, _ = bit_mismatches(_rms_with_naive_mean(to_np(x), to_np(g)), ref)
    # measured: 149 of 37,748,736 elements differ (torch 2.13.0); variance differs in 9,663 of 24,576 rows
    assert naive_diff > 0
    var_torch = x.float().pow(2).mean(-1).numpy()
    sq = to_np(x).astype(np.float32) ** 2
    assert int((sq.mean(-1, dtype=np.float32) != var_torch).sum()) > 0
    ours = nm.torch_sum_f32(sq) / np.float32(1536)
    assert int((ours != var_torch).sum()) == 0


def test_rmsnorm_special_rows() -> None:
    """Zeros, overflowing squares, subnormals, NaN and Inf rows: same bits / same NaN positions."""
    width = 1536
    rng = np.random.default_rng(7)
    rows = [
        np.zeros(width),
        np.full(width, 3.0e38),  # squares overflow -> var = inf -> rsqrt = 0
        np.full(width, 1.0e-40),  # subnormal inputs
        np.full(width, 1.0e20),
        rng.standard_normal(width) * 1.0e-19,  # tiny variance, eps dominates
        rng.standard_normal(width) * 1.0e19,
    ]
    nan_row = rng.standard_normal(width)
    nan_row[17] = np.nan
    inf_row = rng.standard_normal(width)
    inf_row[3] = np.inf
    rows += [nan_row, inf_row]
    x = torch.tensor(np.array(rows), dtype=torch.float32).to(torch.bfloat16)
    g = gains(width, seed=8)
    ref = to_np(torch_rmsnorm(x, g))
    got = nm.rms_norm(to_np(x), to_np(g))
    diff, both_nan = bit_mismatches(got, ref)
    assert diff == 0
    # NaN row: NaN throughout; Inf row: var = inf, rsqrt = 0, so only inf * 0 is NaN
    assert both_nan == width + 1
    assert not np.isnan(got[:6].astype(np.float32)).any()


@pytest.mark.parametrize(
    "xdt,gdt",
    [
        ("float16", "float16"),
        ("float32", "float32"),
        ("bfloat16", "float32"),
        ("float32", "bfloat16"),
        ("bfloat16", "float16"),
    ],
)
def test_rmsnorm_other_dtypes_follow_torch_promotion(xdt: str, gdt: str) -> None:
    x = (torch.randn(3000, 1536) * 3).to(getattr(torch, xdt))
    g = (torch.rand(1536) * 2).to(getattr(torch, gdt))
    ref = torch_rmsnorm(x, g)
    got = nm.rms_norm(to_np(x), to_np(g))
    assert got.dtype == to_np(ref).dtype
    assert bit_mismatches(got, to_np(ref))[0] == 0


@pytest.mark.parametrize("xdt", ["bfloat16", "float32"])
@pytest.mark.parametrize("width,rows", [(1536, 8192), (7168, 1024), (512, 4096)],
                         ids=["q_a_layernorm-1536", "hidden-7168", "kv_a_layernorm-512"])
def test_rmsnorm_f32_gains_deepseek_v32(xdt: str, width: int, rows: int) -> None:
    """DeepSeek-V3.2 stores its norm gains F32: ``weight * h.to(input_dtype)`` promotes to float32 (the
    bf16 value widened, one float32 multiply, never rounded back), still bit-identical."""
    x = activations(rows, width, seed=width + 7).to(getattr(torch, xdt))
    gen = torch.Generator().manual_seed(width)
    g = torch.rand(width, generator=gen, dtype=torch.float32) * 2.5 + 0.02  # full float32 mantissas
    assert (g.to(torch.bfloat16).float() != g).any()
    ref = torch_rmsnorm(x, g)
    assert ref.dtype == torch.float32
    got = nm.rms_norm(to_np(x), to_np(g))
    assert got.dtype == np.float32
    diff, _ = bit_mismatches(got, to_np(ref))
    assert diff == 0, f"{diff} of {rows * width} elements differ"
    y16 = nm.rms_norm(to_np(x), to_np(g.to(torch.bfloat16)))  # the same input, bf16 gains: another result
    assert y16.dtype == (ml_dtypes.bfloat16 if xdt == "bfloat16" else np.float32)
    assert not np.array_equal(y16.astype(np.float32), got)


def test_rmsnorm_rejects_bad_operands() -> None:
    x = np.zeros((4, 8), ml_dtypes.bfloat16)
    with pytest.raises(nm.NumericsError):
        nm.rms_norm(x, np.ones(7, ml_dtypes.bfloat16))
    with pytest.raises(nm.NumericsError):
        nm.rms_norm(x.astype(np.int32), np.ones(8, ml_dtypes.bfloat16))


# ------------------------------------------------------------------ float32 sum order


@pytest.mark.parametrize("width", [1, 7, 8, 9, 33, 127, 513, 1536, 8193, 16384, 32768])
def test_torch_sum_order(width: int) -> None:
    g = torch.Generator().manual_seed(width)
    x = torch.randn(5, width, generator=g) * torch.rand(5, 1, generator=g) * 100
    ref = x.sum(-1).numpy()
    got = nm.torch_sum_f32(x.numpy())
    assert int((ref.view(np.uint32) != got.view(np.uint32)).sum()) == 0


def test_torch_sum_single_wide_row_bound() -> None:
    """Not bit-identical: a single row over 32768 elements is split across threads by torch's
    two-pass reduction, which is not modelled.  Measured bound: relative error <= 1e-6."""
    x = torch.randn(1, 100_000, generator=torch.Generator().manual_seed(3))
    ref = float(x.sum(-1)[0])
    got = float(nm.torch_sum_f32(x.numpy())[0])
    assert math.isclose(got, ref, rel_tol=1e-6, abs_tol=1e-3)


# ------------------------------------------------------------------ conversions


def test_bf16_rounding_matches_torch_on_random_bit_patterns() -> None:
    rng = np.random.default_rng(11)
    u = rng.integers(0, 2**32, 4_000_000, dtype=np.uint64).astype(np.uint32)
    u[:10] = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 1, 0x007FFFFF, 0x7FC00001,
              0x3F808000, 0x3F818000]  # ties to even, both ways
    f = u.view(np.float32)
    ref = to_np(torch.from_numpy(f.copy()).to(torch.bfloat16))
    assert bit_mismatches(nm.f32_to_bf16_bits(f).view(ml_dtypes.bfloat16), ref)[0] == 0
    with np.errstate(invalid="ignore"):
        assert bit_mismatches(nm.f32_to_bf16(f), ref)[0] == 0
    back = nm.bf16_bits_to_f32(ref.view(np.uint16))
    tb = torch.from_numpy(ref.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    assert bit_mismatches(back, tb)[0] == 0


def test_fp8_decoding_all_codes() -> None:
    codes = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).float().numpy()
    lut = nm.fp8_e4m3_lut()
    assert bit_mismatches(lut, ref)[0] == 0
    assert np.isnan(lut[0x7F]) and np.isnan(lut[0xFF])
    assert int(np.isnan(lut).sum()) == 2 and not np.isinf(lut).any()
    assert lut[0x7E] == 448.0 and lut[0xFE] == -448.0
    dec = nm.decode(codes.tobytes(), "F8_E4M3", (16, 16))
    assert dec.dtype == ml_dtypes.float8_e4m3fn
    assert bit_mismatches(nm.to_float32(dec).reshape(-1), ref)[0] == 0


@pytest.mark.parametrize("dtype,tdt", [("BF16", "bfloat16"), ("F16", "float16"), ("F32", "float32"),
                                       ("I64", "int64"), ("I32", "int32"), ("U8", "uint8")])
def test_decode_safetensors_bytes(dtype: str, tdt: str) -> None:
    t = (torch.randn(3, 5) * 50).to(getattr(torch, tdt))
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    got = nm.decode(raw, dtype, (3, 5))
    assert got.shape == (3, 5)
    assert nm.to_float32(got).tolist() == t.float().tolist()
    with pytest.raises(nm.NumericsError):
        nm.decode(raw[:-1], dtype, (3, 5))
    with pytest.raises(nm.NumericsError):
        nm.decode(raw, "F4", (3, 5))


# ------------------------------------------------------------------ FP8 dequantization


def _torch_dequant(w: torch.Tensor, s: torch.Tensor, block=(128, 128), dtype=None):
    rows, cols = w.shape
    se = s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:rows, :cols]
    return (w.float() * se).to(dtype or torch.bfloat16)


def _fp8_weight(rows: int, cols: int, seed: int, all_codes: bool = True):
    g = torch.Generator().manual_seed(seed)
    if all_codes:  # every code, NaN (0x7F, 0xFF) and +-448 included
        codes = torch.randint(0, 256, (rows, cols), generator=g, dtype=torch.int32).to(torch.uint8)
        w = codes.view(torch.float8_e4m3fn)
    else:
        w = (torch.randn(rows, cols, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    grid = (-(-rows // 128), -(-cols // 128))
    s = torch.exp(torch.empty(grid).uniform_(-12.0, 3.0, generator=g))
    return w, s


@pytest.mark.parametrize(
    "rows,cols",
    [(7168, 2048), (1536, 7168), (300, 200), (129, 257), (1, 1), (127, 129), (128, 128), (1000, 7)],
)
def test_dequant_bit_identical(rows: int, cols: int) -> None:
    w, s = _fp8_weight(rows, cols, seed=rows * 31 + cols, all_codes=rows * cols < 10**6)
    ref = to_np(_torch_dequant(w, s))
    got = nm.dequantize_fp8(to_np(w), s.numpy())
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (rows, cols)
    diff, _ = bit_mismatches(got, ref)
    assert diff == 0
    nan_codes = np.isin(to_np(w).view(np.uint8), [0x7F, 0xFF])
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan_codes)


def test_dequant_float32_and_extreme_scales() -> None:
    w, _ = _fp8_weight(257, 300, seed=9)
    s = torch.tensor(
        [[3.0e38, 1.0e-38, 1.0e-45], [1.0, 0.0, -2.0], [float("inf"), 1e-3, 7.0]],
        dtype=torch.float32,
    )
    ref32 = to_np(_torch_dequant(w, s, dtype=torch.float32))
    got32 = nm.dequantize_fp8(to_np(w), s.numpy(), out_dtype=np.float32)
    assert bit_mismatches(got32, ref32)[0] == 0
    ref = to_np(_torch_dequant(w, s))
    got = nm.dequantize_fp8(to_np(w).view(np.uint8), s.numpy(), threads=2)
    assert bit_mismatches(got, ref)[0] == 0


def test_dequant_other_block_sizes() -> None:
    w, _ = _fp8_weight(100, 90, seed=10)
    s = torch.rand(-(-100 // 64), -(-90 // 32)) + 0.5
    ref = to_np(_torch_dequant(w, s, block=(64, 32)))
    got = nm.dequantize_fp8(to_np(w), s.numpy(), block=(64, 32))
    assert bit_mismatches(got, ref)[0] == 0


def test_dequant_rejects_wrong_grid_and_dtype() -> None:
    w = np.zeros((256, 300), np.uint8)
    with pytest.raises(nm.NumericsError, match=r"\[2, 3\]"):
        nm.dequantize_fp8(w, np.ones((2, 2), np.float32))
    with pytest.raises(nm.NumericsError):
        nm.dequantize_fp8(w.astype(np.int16), np.ones((2, 3), np.float32))
    with pytest.raises(nm.NumericsError):
        nm.dequantize_fp8(w, np.ones((2, 3), np.float32), out_dtype=np.float16)


# ------------------------------------------------------------------ statistics


def test_tensor_stats_counts_and_moments() -> None:
    codes = np.array([0x00, 0x80, 0x7E, 0xFE, 0x7F, 0xFF, 0x38, 0x40, 0xB8], np.uint8)
    a = codes.view(ml_dtypes.float8_e4m3fn)
    st = nm.tensor_stats(a, chunk=4)
    vals = nm.fp8_e4m3_lut()[codes].astype(np.float64)
    fin = vals[np.isfinite(vals)]
    assert (st.count, st.nan, st.inf, st.zeros, st.saturated) == (9, 2, 0, 2, 2)
    assert st.finite == 7 and st.min == -448.0 and st.max == 448.0
    assert math.isclose(st.mean, float(fin.mean()), rel_tol=1e-12)
    assert math.isclose(st.std, float(fin.std()), rel_tol=1e-12)
    assert st.dtype == "F8_E4M3" and st.healthy is False

    b = np.array([[1.0, -np.inf], [np.inf, 0.0]], np.float32)
    sb = nm.tensor_stats(b)
    assert (sb.posinf, sb.neginf, sb.zeros, sb.saturated, sb.finite) == (1, 1, 1, None, 2)
    assert nm.tensor_stats(np.zeros(5, ml_dtypes.bfloat16)).all_zero
    empty = nm.tensor_stats(np.zeros((0, 3), np.float32))
    assert empty.mean is None and empty.count == 0 and not empty.all_zero

    big = (torch.randn(3000, 700) * 5 + 2).to(torch.bfloat16)
    sbig = nm.tensor_stats(to_np(big), chunk=100_000)
    f = big.double()
    assert math.isclose(sbig.mean, float(f.mean()), rel_tol=1e-9)
    assert math.isclose(sbig.std, float(f.std(unbiased=False)), rel_tol=1e-9)
    assert math.isclose(sbig.rms, float(f.pow(2).mean().sqrt()), rel_tol=1e-9)
