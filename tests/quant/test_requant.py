"""requant: fixed-point multipliers and the rounding right shift, bit-exact against exact rationals."""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from qcompiler.ir.types import QuantParams
from qcompiler.quant.requant import (activation_clamp, conv_multipliers, quantize_multiplier, quantize_multipliers,
                                     requantize, rounding_right_shift)

ACC = st.integers(-2 ** 31, 2 ** 31 - 1)
MULT = st.floats(2.0 ** -40, 2.0 ** 30, allow_nan=False, allow_infinity=False)


def exact_requant(acc: int, m: int, s: int, zp: int, lo: int, hi: int) -> int:
    """The specification with Python integers: floor(acc * m / 2^s + 1/2), plus zp, clamped."""
    v = math.floor(Fraction(acc * m, 2 ** s) + Fraction(1, 2))
    return min(max(v + zp, lo), hi)


@settings(max_examples=400, deadline=None)
@given(MULT)
def test_quantize_multiplier_is_round_of_M_times_2_pow_shift(M):
    m, s = quantize_multiplier(M)
    assert 0 <= s <= 63
    assert m == round(Fraction(M) * 2 ** s)                         # the nearest integer (half even)
    if M >= 2.0 ** -32:
        assert 2 ** 30 <= m < 2 ** 31                               # normalized: 31 significant bits
        assert abs(Fraction(m, 2 ** s) - Fraction(M)) <= Fraction(M) / 2 ** 31


@settings(max_examples=600, deadline=None)
@given(st.lists(ACC, min_size=1, max_size=16), MULT, st.integers(-128, 255), st.sampled_from([(0, 255), (-128, 127)]))
def test_requantize_bit_exact_against_fractions(accs, M, zp, rng):
    m, s = quantize_multiplier(M)
    lo, hi = rng
    got = requantize(np.array(accs, np.int64), m, s, zp, lo, hi)
    assert got.tolist() == [exact_requant(a, m, s, zp, lo, hi) for a in accs]


@settings(max_examples=300, deadline=None)
@given(st.integers(-2 ** 20, 2 ** 20), st.floats(1e-6, 4.0))
def test_requantize_is_within_half_an_lsb_plus_multiplier_error(acc, M):
    """Against the real-valued ideal acc*M: off by at most 1/2 (rounding) + |acc| M 2^-31 (m)."""
    m, s = quantize_multiplier(M)
    got = int(requantize(np.array([acc]), m, s, 0, -2 ** 40, 2 ** 40)[0])
    ideal = Fraction(acc) * Fraction(M)
    assert abs(got - ideal) <= Fraction(1, 2) + abs(ideal) / 2 ** 31 + Fraction(1, 2 ** 40)


def test_multiplier_rounding_ties_go_to_even():
    """_round (float scaling by 2^s, exact) against Fractions where M 2^s is exactly k + 1/2,
    and for products beyond 2^53 (already integers)."""
    from qcompiler.quant.requant import _round
    for k in range(0, 4000, 7):
        for s in (0, 1, 20, 40, 63):
            M = (2 * k + 1) / 2.0 ** (s + 1)
            assert _round(M, s) == round(Fraction(M) * 2 ** s) == (k if k % 2 == 0 else k + 1)
    for M in (1.9999999999999998, 0.7071067811865476, 3.0e-9):
        assert _round(M, 63) == round(Fraction(M) * 2 ** 63)


def test_rounding_is_half_up():
    # x/2 for x = -3..3: -1.5 -> -1, -0.5 -> 0, 0.5 -> 1, 1.5 -> 2 (toward +inf on ties)
    assert rounding_right_shift(np.arange(-3, 4), 1).tolist() == [-1, -1, 0, 0, 1, 1, 2]
    assert rounding_right_shift(np.array([5, -5]), 0).tolist() == [5, -5]


def test_per_channel_broadcast():
    acc = np.array([[100, 100], [-100, -100]])
    m = np.array([2 ** 30, 2 ** 30 + 2 ** 29])          # 0.5, 0.75 at shift 31
    got = requantize(acc, m[None, :], np.array([31, 31])[None, :], 10, 0, 255)
    assert got.tolist() == [[60, 85], [0, 0]]               # 10 + 50, 10 + 75; -50 + 10 clamps at 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-4, 8.0), min_size=2, max_size=3), st.lists(st.integers(-255, 255), min_size=3, max_size=3))
def test_shared_shift_sum_rounds_once(Ms, qs):
    ms, s = quantize_multipliers(Ms)
    assert max(ms) < 2 ** 31 and max(ms) >= 2 ** 30
    assert all(m == round(Fraction(M) * 2 ** s) for m, M in zip(ms, Ms))
    total = sum(q * m for q, m in zip(qs, ms))
    got = int(requantize(np.array([total]), 1, s, 0, -2 ** 40, 2 ** 40)[0])
    assert got == math.floor(Fraction(total, 2 ** s) + Fraction(1, 2))


def test_bad_multipliers():
    for bad in (0.0, -1.0, float("inf"), float("nan"), 2.0 ** 31):
        with pytest.raises(ValueError):
            quantize_multiplier(bad)
    assert quantize_multiplier(2.0 ** -70) == (0, 63)         # underflows to a zero multiplier


def test_conv_multipliers_use_float32_scales():
    ms, ss = conv_multipliers(0.02, [0.001, 0.004], 0.05)
    for m, s, sw in zip(ms, ss, [0.001, 0.004]):
        M = float(np.float32(0.02)) * float(np.float32(sw)) / float(np.float32(0.05))
        assert m == round(Fraction(M) * 2 ** s)


def test_activation_clamp():
    u8 = QuantParams("uint8", (0.1,), (20,))
    assert activation_clamp("", [], u8) == (0, 255)
    assert activation_clamp("Relu", [], u8) == (20, 255)
    assert activation_clamp("Clip", [0.0, 6.0], u8) == (20, 80)
    assert activation_clamp("Clip", [-100.0, 100.0], u8) == (0, 255)
    assert activation_clamp("Clip", [float("-inf"), 1.0], u8) == (0, 30)
    with pytest.raises(ValueError, match="HardSwish"):
        activation_clamp("HardSwish", [], u8)
