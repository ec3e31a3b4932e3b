"""The float32 polynomial functions of the element-wise kernels (qcompiler.codegen.kernels.elementwise),
compiled for the host and compared with float64 references on a dense grid.

erf: the rational fit's own error is 2.2e-7 (float64); in float32 arithmetic it reaches 5.6e-7,
under 5 steps of float32 at 1 (1.19e-7): the bound is 1e-6 absolute. exp: relative 3.1e-7 measured (3 ulp)."""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import te

from qcompiler.codegen.kernels.elementwise import ERF_CLAMP, fast_erf, fast_exp
from qcompiler.codegen.target import TargetSpec


def _run(fn, x: np.ndarray) -> np.ndarray:
    n = x.size
    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: fn(a[i]), name="b")
    f = tvm.compile(te.create_prim_func([a, b]), target=tvm.target.Target(TargetSpec("x86").tvm))
    out = tvm.runtime.tensor(np.zeros(n, np.float32))
    f(tvm.runtime.tensor(x), out)
    return out.numpy()


def test_fast_erf_within_1e6_of_erf():
    x = np.concatenate([np.linspace(-6, 6, 600_001), [0.0, -0.0, 1e-30, -1e-30, ERF_CLAMP, 50.0, -50.0]])
    x = x.astype(np.float32)
    got = _run(fast_erf, x)
    ref = np.array([math.erf(float(v)) for v in x])
    assert np.abs(got - ref).max() <= 1e-6
    assert np.all(np.abs(got) <= 1.0)
    assert got[x == 0].tolist() == [0.0, 0.0]              # odd: erf(0) = 0 exactly
    np.testing.assert_array_equal(got[x >= ERF_CLAMP], 1.0)  # saturates where float32 erf rounds to 1


def test_fast_exp_relative_error():
    x = np.linspace(-87, 88, 400_001).astype(np.float32)
    got = _run(fast_exp, x).astype(np.float64)
    ref = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - ref) / ref) <= 4e-7          # measured 3.1e-7
