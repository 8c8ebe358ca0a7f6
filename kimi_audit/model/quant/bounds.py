"""How far a quantized weight may be from the weight it was quantized from: the relative RMS error
||dequantized - original|| / ||original|| each kind of grid allows, derived from the grid and from how a format
picks a group's scale. Each format's class says which grid, bits, group and scale rule it uses
(`Scheme.error_bound`); this module holds the arithmetic, each bound's derivation in its docstring.

A weight from another model, layer or expert (uncorrelated values of the same scale) is off by about
sqrt 2 = 1.41, a zeroed one by 1.0: every bound here stays under 0.95.
"""

from __future__ import annotations

import math

BF16_ROUNDING = 2.0 ** -9
"""A value rounded to BF16 (8 significant bits) errs by at most half an ulp, 2^-9 of itself: a dequantized result,
or a scale, rounded to BF16 (ModelOpt's FP8QTensor rounds both)."""
CAP = 0.95
"""The largest bound any grid is given: a zeroed weight (1.0) and an unrelated one (1.41) stay outside."""


def uniform_grid(bits: float) -> float:
    """Integer codes of `bits` bits on a uniform grid scaled to a group's absolute maximum (GPTQ, AWQ, AutoRound,
    compressed-tensors' int, MLX's affine; ggml's blocks with `bits` their bits per weight): each value rounds by
    at most half a step, the step at most 2 amax / (2^b - 1) (symmetric; asymmetric: (max - min) / (2^b - 1),
    no more), and the RMS of a rounding error spread evenly over a step is step / (2 sqrt 3): relative to the
    group's RMS, 0.58 (amax / rms) / (2^b - 1). Allowing amax / rms up to 5.2 (heavy-tailed groups; a Gaussian
    group of 32 to 256 values has about 2.5 to 3): 3 / (2^b - 1), at most CAP (2 bits: the cap)."""
    return float(min(CAP, 3.0 / (2.0 ** bits - 1)))


def float_grid(mantissa_bits: int) -> float:
    """A float grid of `mantissa_bits` mantissa bits (FP8 E4M3: 3), its scale at most the group's absolute
    maximum over the grid's largest value (never clipped): a normal value rounds to the nearest of values
    2^-m apart relative to its binade, so errs by at most 2^-(m+1) of itself, and the RMS error by no more;
    subnormals (E4M3: below 2^-6 of the scale) err by at most 2^-10 of the scale, amax / 448, which for weights
    within 2^8 of their RMS adds under 2^-11. Two BF16 roundings (the scale, the result) add 2^-8."""
    return 2.0 ** -(mantissa_bits + 1) + 2.0 ** -11 + 2 * BF16_ROUNDING


def e2m1_grid(group: int, low: float, high: float) -> float:
    """FP4 E2M1 codes (0, 0.5, 1, 1.5, 2, 3, 4, 6) times a group's scale s, amax / s between `low` and `high`
    (the format's scale rule): a normal value (|x| >= s) rounds within a quarter of itself (one mantissa bit),
    one above 6 s clips by at most (1 - 6 / high) of itself, and one under s (0, 0.5 s, s) errs by at most s / 4.
    Over a group of g values with sum x^2 >= amax^2 >= (low s)^2... per value err^2 <= c^2 x^2 + s^2 / 16 with
    c = max(1/4, 1 - 6 / high), so ||err||^2 / ||x||^2 <= c^2 + g s^2 / (16 sum x^2) <= c^2 + g / (16 low^2);
    the result rounded to BF16 adds 2^-9."""
    c = max(0.25, 1.0 - 6.0 / high)
    return float(min(CAP, math.sqrt(c * c + group / (16.0 * low * low)) + BF16_ROUNDING))


def nvfp4(group: int) -> float:
    """NVFP4: each group's scale amax / 6 stored as FP8 E4M3 (rounded within 2^-4 of itself, times an F32
    second-level scale): amax / s between 6 / (1 + 2^-4) and 6 / (1 - 2^-4)."""
    return e2m1_grid(group, 6.0 / (1 + 2.0 ** -4), 6.0 / (1 - 2.0 ** -4))


def power_of_two_fp4(group: int) -> float:
    """FP4 E2M1 with an E8M0 (power-of-two) scale per group (OCP MXFP4, DeepSeek-V4's FP4 experts): OCP's rule,
    2^(floor(log2 amax) - 2), gives amax / s in [4, 8); rounding the exponent up (no clipping) gives (3, 6]: the
    bound takes both, amax / s in [3, 8)."""
    return e2m1_grid(group, 3.0, 8.0)
