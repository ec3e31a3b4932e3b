"""The x86 squeeze-excite QLinearMul in int32 arithmetic (x86/se_mul.py ``se_mul``, schedule
``se_mul``): the split-multiplier identity exhaustively in numpy over every product of two 8-bit
operands, and the kernel BIT-EXACT against the numpy oracle on blocked squeeze-excite blocks with
several output scales (shifts) and block/width combinations."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from qcompiler.codegen.x86.se_mul import split_multiplier
from qcompiler.codegen.lower import Lowering
from qcompiler.ir import Graph, QuantParams, TensorType
from qcompiler.quant.requant import quantize_multiplier, requantize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_x86_int8 import SPEC, X86_LEVELS, add_qconv, check_exact, qin  # noqa: E402


@pytest.mark.parametrize("m, s", [((1 << 31) - 1, 17), ((1 << 31) - 1, 38), (1 << 30, 30), (1787912865, 38),
                                  (1626040321, 38), (1073774593, 25), (2147450879, 21)])
def testsplit_multiplier_identity_exhaustive(m, s):
    """floor((p·M + 2^(S-1)) / 2^S) == (d·Gh + 2^(S-17) + ((d·Gl) >> 16)) >> (S-16) for every
    d, g in [-255, 255] (p = d·g), every intermediate inside int32."""
    mh, ml = split_multiplier(m)
    assert mh * 65536 + ml == m and -32768 <= ml < 32768
    d, g = np.meshgrid(np.arange(-255, 256, dtype=np.int64), np.arange(-255, 256, dtype=np.int64))
    want = requantize(d * g, m, s, 0, -(1 << 40), 1 << 40)
    gh, gl = g * mh, g * ml
    a, b = d * gh, d * gl
    t = b >> 16
    u = a + (1 << (s - 17)) + t
    lim = 1 << 31
    for v in (gh, gl, a, b, u):
        assert np.abs(v).max() < lim
    np.testing.assert_array_equal(u >> (s - 16), want)


def _se_graph(storage, c, w, out_scale):
    g = Graph("se")
    zq = -128 if storage == "int8" else 0
    qx = QuantParams(storage, (0.02,), (117,) if storage == "uint8" else (-5,))
    x = g.add_input("x", TensorType((1, c, 5, w), storage, qx))
    a = add_qconv(g, x, c, (3, 3), group=c, p=(1, 1, 1, 1),
                  out_qp=QuantParams(storage, (0.03,), (zq + 7,)))
    gate = add_qconv(g, a, c, (1, 1), out_qp=QuantParams(storage, (1 / 255,), (zq,)))
    mg, sg = quantize_multiplier(1 / (5 * w))                  # the mean of 5 x w values, same params
    gp = g.create_op("QLinearGlobalAveragePool", [gate], {"multiplier": [mg], "shift": [sg]},
                     result_types=[TensorType((1, c, 1, 1), storage, gate.type.quant)]).result
    qm = QuantParams(storage, (out_scale,), (zq + 3,))
    m, s = quantize_multiplier(0.03 * (1 / 255) / out_scale)
    y = g.create_op("QLinearMul", [a, gp], {"multiplier": [m], "shift": [s]},
                    result_types=[TensorType(a.type.shape, storage, qm)]).result
    g.outputs = [add_qconv(g, y, 8, (1, 1)), y]
    return g, qx


def _uses_se_mul(g, spec) -> bool:
    low = Lowering(g, spec)
    low.run()
    return any(kind == "se_mul" for _, kind in low.sources.values())


@pytest.mark.parametrize("cpu", X86_LEVELS)
def test_se_mul_kernel_chosen_for_each_cpu(cpu):
    from qcompiler.codegen.target import TargetSpec
    assert _uses_se_mul(_se_graph("uint8", 24, 12, 0.02)[0], TargetSpec("x86", cpu=cpu))


@pytest.mark.parametrize("storage", ["uint8", "int8"])
@pytest.mark.parametrize("c, w, out_scale", [(24, 12, 0.02), (32, 10, 0.0004), (16, 7, 0.3), (48, 9, 0.004)])
def test_se_mul_kernel_bit_exact(storage, c, w, out_scale):
    g, qx = _se_graph(storage, c, w, out_scale)
    assert _uses_se_mul(g, SPEC), "the int32 squeeze-excite kernel was not used"
    check_exact(g, {"x": qin(qx, (1, c, 5, w))}, f"SE mul {storage} c={c} w={w} scale={out_scale}")
