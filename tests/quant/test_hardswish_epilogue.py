"""The integer HardSwish epilogue (qcompiler.quant.hardswish) against HardSwish computed in float64
and quantized once: within 1 LSB everywhere, and off by one only where the float value sits within
the documented error bound (0.05 step) of a rounding boundary."""
from __future__ import annotations

import numpy as np
import pytest

from qcompiler.ir.types import QuantParams
from qcompiler.quant import hardswish
from qcompiler.quant.requant import rounding_right_shift

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("storage, s_y, z_y, gate", [("uint8", 0.03, 20, "standard"), ("int8", 0.011, -110, "scaled"),
                                                      ("uint8", 0.002, 5, "scaled"), ("int8", 0.4, -120, "standard")])
def test_epilogue_matches_float_hardswish(storage, s_y, z_y, gate):
    channels, s_x = 6, 0.02
    s_w = RNG.uniform(0.001, 0.01, channels)
    params = [] if gate == "standard" else [1 / 6, 0.5, *RNG.uniform(0.3, 3.0, channels)]
    qo = QuantParams(storage, (s_y,), (z_y,))
    at = hardswish.epilogue_attrs(s_x, s_w, qo, params, channels)
    a, b = hardswish.gate(params, channels)
    M = np.float32(s_x).astype(np.float64) * s_w.astype(np.float32).astype(np.float64)
    z_hi = 300 * s_y                                   # well past saturation
    acc = np.round(RNG.uniform(-z_hi, z_hi, (20000, channels)) / M).astype(np.int64)
    acc[:10] = np.array([[-2 ** 31 + 1] * channels, [2 ** 31 - 1] * channels] * 5)   # int32 extremes: no overflow
    col = lambda v: np.asarray(v, np.int64) if len(v) == 1 else np.asarray(v, np.int64)[None, :]
    lo, hi = (0, 255) if storage == "uint8" else (-128, 127)
    got = hardswish.requantize(acc, col(at["multiplier"]), col(at["shift"]), [col(v) for v in at["hardswish"]],
                               z_y, lo, hi)
    z = acc * M
    y = z * np.clip(a * z + b, 0, 1) / np.float32(s_y).astype(np.float64) + z_y
    want = np.clip(np.floor(y + 0.5), lo, hi)
    diff = np.abs(got - want)
    assert diff.max() <= 1
    near = np.abs(y - np.floor(y) - 0.5) < 0.05        # within the error bound of a boundary
    assert not np.any((diff > 0) & ~near & (y > lo) & (y < hi)), "off by one away from a rounding boundary"
    gated = (a * z + b > 0) & (a * z + b < 1)
    assert gated.mean() > 0.005                        # the gate's open region is exercised
