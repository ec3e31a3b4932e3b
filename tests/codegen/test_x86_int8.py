"""x86 lowering of the quantized IR: every integer op kind BIT-EXACT against the numpy oracle
(qcompiler.quant.reference) on small shapes, and end to end on fashion_mobilenet (quantized by the
quantize pass): integer outputs equal to the oracle's, top-1 within 0.5 points of fp32.

Graphs are built with the IR API (as the quantize pass builds them); the int8 kernels are those of
qcompiler/codegen/kernels/quant.py. The schedules run with QC_STRICT_SCHEDULE semantics off, so a
schedule that falls back still has to be exact."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm

from qcompiler.codegen.isa import int8_isa
from qcompiler.codegen.lower import build_module, lower
from qcompiler.codegen.target import X86_LEVELS, TargetSpec
from qcompiler.ir import Graph, QuantParams, TensorType
from qcompiler.ir.ops import infer_types
from qcompiler.quant import hardswish, reference
from qcompiler.quant.requant import conv_multipliers, quantize_multiplier, quantize_multipliers

RNG = np.random.default_rng(7)
SPEC = TargetSpec("x86")          # this host's CPU: the tests that run kernels use it
U8 = QuantParams("uint8", (0.02,), (117,))
I8 = QuantParams("int8", (0.03,), (-5,))
ACT = {"uint8": U8, "int8": I8}


def run_tvm(g: Graph, feeds: dict, spec: TargetSpec = SPEC) -> list[np.ndarray]:
    ex = build_module(g, spec)
    vm = tvm.runtime.vm.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(feeds[v.name])) for v in g.inputs])
    outs = list(out) if len(g.outputs) > 1 else [out]
    return [o.numpy() for o in outs]


def conv_script(g: Graph, spec: TargetSpec = SPEC) -> str:
    """The scheduled TVMScript of the (one) QLinearConv kernel of ``g`` lowered for ``spec``."""
    mod = lower(g, spec)
    return next(mod[gv] for gv in mod.functions if "qlinearconv" in gv.name_hint).script()


def check_exact(g: Graph, feeds: dict, what: str = "", spec: TargetSpec = SPEC):
    g.verify()
    want = reference.run(g, feeds)
    got = run_tvm(g, feeds, spec)
    for w, o in zip(want, got):
        assert o.dtype == w.dtype and o.shape == w.shape, (what, o.dtype, w.dtype, o.shape, w.shape)
        diff = np.abs(o.astype(np.float64) - w.astype(np.float64))
        assert np.array_equal(o, w), f"{what}: {int((diff > 0).sum())} of {w.size} differ, max {diff.max()}"


def keep(g, kind, operands, attrs=None):
    """A plain op on quantized values: its result keeps the first operand's quant params."""
    attrs = attrs or {}
    t = infer_types(kind, [v.type for v in operands], attrs)[0]
    return g.create_op(kind, operands, attrs,
                       result_types=[TensorType(t.shape, t.dtype, operands[0].type.quant)]).result


def qin(qp: QuantParams, shape):
    lo, hi = (0, 256) if qp.storage == "uint8" else (-128, 128)
    return RNG.integers(lo, hi, shape).astype(qp.storage)


def add_qconv(g, x, o, k, *, group=1, s=(1, 1), d=(1, 1), p=(0, 0, 0, 0), act="", params=(), bias=True,
              out_qp=None, per_channel=True, float_result=False):
    sx = x.type.quant.scale[0]
    c = x.type.shape[1]
    ws = tuple(float(v) for v in RNG.uniform(0.002, 0.01, o)) if per_channel else (0.005,)
    qw = QuantParams("int8", ws, (0,) * len(ws), axis=0 if per_channel else None)
    wq = RNG.integers(-127, 128, (o, c // group, *k)).astype(np.int8)
    operands = [x, g.add_const(wq, "w", qw)]
    if bias:
        bs = tuple(float(np.float32(sx) * np.float32(v)) for v in ws)
        if not per_channel:
            bs = bs * o
        qb = QuantParams("int32", bs, (0,) * o, axis=0)
        operands.append(g.add_const(RNG.integers(-3000, 3000, o).astype(np.int32), "b", qb))
    out_qp = out_qp or QuantParams(x.type.dtype, (0.05,), (90,) if x.type.dtype == "uint8" else (3,))
    ms, ss = conv_multipliers(sx, ws, out_qp.scale[0])
    attrs = {"strides": list(s), "dilations": list(d), "pads": list(p), "group": group,
             "activation": act, "activation_params": list(params), "multiplier": ms, "shift": ss}
    if act == "HardSwish":
        attrs.update(hardswish.epilogue_attrs(sx, ws, out_qp, params, o))
    if float_result:                                # f32(acc) * f32(s_x s_w[c]): no output params
        attrs.update(multiplier=[], shift=[])
    shape = infer_types("QLinearConv", [v.type for v in operands], attrs)[0].shape
    out = TensorType(shape, "float32") if float_result else TensorType(shape, x.type.dtype, out_qp)
    return g.create_op("QLinearConv", operands, attrs, result_types=[out]).result


CONVS = [  # (C, O, group, kernel, strides, dilations, pads, activation)
    (4, 6, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "Relu"),
    (4, 4, 4, (3, 3), (2, 2), (1, 1), (1, 0, 1, 2), "Clip"),          # depthwise, asymmetric pads
    (4, 6, 2, (2, 3), (1, 2), (2, 1), (0, 1, 2, 0), ""),              # grouped, dilated
    (3, 5, 1, (1, 1), (2, 1), (1, 1), (0, 0, 0, 0), ""),
    (16, 32, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "Clip"),        # full vector blocks (NCHW16c)
    (32, 32, 32, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "Relu"),       # depthwise, blocked
    (16, 64, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), ""),            # pointwise, 2 vectors of output channels
]


@pytest.mark.parametrize("storage", ["uint8", "int8"])
@pytest.mark.parametrize("c, o, group, k, s, d, p, act", CONVS)
def test_qlinearconv_bit_exact(storage, c, o, group, k, s, d, p, act):
    g = Graph("q")
    x = g.add_input("x", TensorType((2, c, 9, 10), storage, ACT[storage]))
    g.outputs = [add_qconv(g, x, o, k, group=group, s=s, d=d, p=p, act=act,
                           params=(0.0, 6.0) if act == "Clip" else (), bias=(c != 3), per_channel=(o != 5))]
    check_exact(g, {"x": qin(ACT[storage], (2, c, 9, 10))}, f"QLinearConv {storage} {c}->{o} g{group}")


def test_quantized_block_chain_bit_exact():
    """QuantizeLinear -> conv (blocked output) -> depthwise -> pointwise + residual QLinearAdd
    (fused into the conv's epilogue) -> MaxPool -> GAP -> Flatten -> QLinearGemm -> DequantizeLinear:
    blocked int8 layouts between kernels and the epilogue fusions."""
    g = Graph("q")
    xf = g.add_input("x", TensorType((2, 3, 12, 12), "float32"))
    q0 = QuantParams("uint8", (0.013,), (128,))
    x = g.create_op("QuantizeLinear", [xf], result_types=[TensorType((2, 3, 12, 12), "uint8", q0)]).result
    a = add_qconv(g, x, 16, (3, 3), p=(1, 1, 1, 1), act="Clip", params=(0.0, 6.0),
                  out_qp=QuantParams("uint8", (0.03,), (0,)))
    b = add_qconv(g, a, 16, (3, 3), group=16, p=(1, 1, 1, 1), act="Relu")
    c = add_qconv(g, b, 16, (1, 1), out_qp=QuantParams("uint8", (0.04,), (100,)))
    qs = QuantParams("uint8", (0.05,), (95,))
    ms, s = quantize_multipliers([0.04 / 0.05, 0.03 / 0.05])
    r = g.create_op("QLinearAdd", [c, a], {"multiplier": ms, "shift": [s], "activation": "", "activation_params": []},
                    result_types=[TensorType(c.type.shape, "uint8", qs)]).result
    mp = keep(g, "MaxPool", [r], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    qg = QuantParams("uint8", (0.02,), (80,))
    m1, s1 = quantize_multiplier(qs.scale[0] / (qg.scale[0] * 36))
    gp = g.create_op("QLinearGlobalAveragePool", [mp], {"multiplier": [m1], "shift": [s1]},
                     result_types=[TensorType((2, 16, 1, 1), "uint8", qg)]).result
    fl = keep(g, "Flatten", [gp], {"axis": 1})
    ws = tuple(float(v) for v in RNG.uniform(0.002, 0.01, 10))
    w = g.add_const(RNG.integers(-127, 128, (10, 16)).astype(np.int8), "wg", QuantParams("int8", ws, (0,) * 10, axis=0))
    bq = g.add_const(RNG.integers(-500, 500, 10).astype(np.int32), "bg",
                     QuantParams("int32", tuple(float(np.float32(0.02) * np.float32(v)) for v in ws), (0,) * 10, axis=0))
    qo = QuantParams("uint8", (0.1,), (120,))
    mg, sg = conv_multipliers(0.02, ws, 0.1)
    lg = g.create_op("QLinearGemm", [fl, w, bq], {"multiplier": mg, "shift": sg},
                     result_types=[TensorType((2, 10), "uint8", qo)]).result
    g.outputs = [g.create_op("DequantizeLinear", [lg]).result, r]
    check_exact(g, {"x": RNG.uniform(-1.5, 1.8, (2, 3, 12, 12)).astype(np.float32)}, "chain")


@pytest.mark.parametrize("storage, m, k, n", [("uint8", 3, 20, 10), ("int8", 4, 64, 32), ("uint8", 1, 7, 3)])
def test_qlineargemm_bit_exact(storage, m, k, n):
    _gemm_exact(storage, m, k, n, SPEC)


def _qgemm_graph(storage, m, k, n, qo, attrs):
    """a (m x k, ``storage``) -> QLinearGemm with random int8 weights (per-channel scales ``ws``) and
    int32 bias -> (m x n) with params ``qo``; ``attrs(ws)`` gives the op's requantization attrs."""
    g = Graph("q")
    qa = ACT[storage]
    a = g.add_input("a", TensorType((m, k), storage, qa))
    ws = tuple(float(v) for v in RNG.uniform(0.002, 0.01, n))
    w = g.add_const(RNG.integers(-128, 128, (n, k)).astype(np.int8), "w", QuantParams("int8", ws, (0,) * n, axis=0))
    b = g.add_const(RNG.integers(-900, 900, n).astype(np.int32), "b",
                    QuantParams("int32", tuple(float(np.float32(qa.scale[0]) * np.float32(v)) for v in ws), (0,) * n, axis=0))
    out = TensorType((m, n), storage, qo) if qo is not None else TensorType((m, n), "float32")
    g.outputs = [g.create_op("QLinearGemm", [a, w, b], attrs(ws), result_types=[out]).result]
    return g


def _gemm_exact(storage, m, k, n, spec):
    qa, qo = ACT[storage], QuantParams(storage, (0.04,), (10,))

    def attrs(ws):
        ms, ss = conv_multipliers(qa.scale[0], ws, 0.04)
        return {"multiplier": ms, "shift": ss, "activation": "Relu"}
    g = _qgemm_graph(storage, m, k, n, qo, attrs)
    check_exact(g, {"a": qin(qa, (m, k))}, f"QLinearGemm {storage} {m}x{k}x{n}", spec)


@pytest.mark.parametrize("storage, m, k, n, act", [("uint8", 128, 384, 96, ""), ("int8", 5, 64, 32, "Relu"),
                                                     ("uint8", 1, 7, 3, "Clip")])
def test_qlineargemm_float_result_bit_exact(storage, m, k, n, act):
    """multiplier = []: the int8 GEMM returns f32(acc) * f32(s_a s_w[n]) (a transformer's FFN GEMM
    before its float residual), clamped by a fused Relu/Clip, bit for bit as the reference."""
    qa = ACT[storage]
    params = [-0.5, 0.75] if act == "Clip" else []
    g = _qgemm_graph(storage, m, k, n, None, lambda ws: {"multiplier": [], "shift": [], "activation": act,
                                                        "activation_params": params})
    got = reference.run(g, {"a": (a := qin(qa, (m, k)))})[0]
    assert got.dtype == np.float32
    w, b = g.consts["w"], g.consts["b"]
    acc = (a.astype(np.int64) - qa.zero_point[0]) @ w.data.T.astype(np.int64) + b.data
    want = acc.astype(np.float32) * (np.float32(qa.scale[0]) * np.asarray(w.type.quant.scale, np.float32))
    want = np.maximum(want, 0) if act == "Relu" else np.clip(want, -0.5, 0.75) if act == "Clip" else want
    np.testing.assert_array_equal(got, want.astype(np.float32))
    check_exact(g, {"a": a}, f"QLinearGemm -> f32 {storage} {m}x{k}x{n} {act}")


FLOAT_CONVS = [  # (C, O, group, kernel, strides, pads, activation): the kernels' paths
    (16, 32, 1, (3, 3), (1, 1), (1, 1, 1, 1), ""),          # 3x3 stride 1: Winograd / dot products
    (32, 32, 32, (3, 3), (2, 2), (1, 1, 1, 1), "Relu"),     # depthwise: the exact float32 kernel
    (16, 64, 1, (1, 1), (1, 1), (0, 0, 0, 0), "Clip"),      # pointwise
    (3, 5, 1, (2, 3), (2, 1), (0, 1, 1, 0), ""),            # odd channels: the blocked int16 conv
]


@pytest.mark.parametrize("storage", ["uint8", "int8"])
@pytest.mark.parametrize("c, o, group, k, s, p, act", FLOAT_CONVS)
def test_qlinearconv_float_result_bit_exact(storage, c, o, group, k, s, p, act):
    """multiplier = []: the int8 conv returns f32(acc) * f32(s_x s_w[c]) (a conv whose result only
    float ops read, e.g. a PRelu), clamped by a fused Relu/Clip, bit for bit as the reference, whose
    value is that formula on the exact integer accumulator."""
    from qcompiler.ir.windows import conv_sum
    g = Graph("q")
    qx = ACT[storage]
    x = g.add_input("x", TensorType((2, c, 9, 10), storage, qx))
    params = (-0.5, 0.75) if act == "Clip" else ()
    q = add_qconv(g, x, o, k, group=group, s=s, p=p, act=act, params=params, float_result=True)
    g.outputs = [q]
    xs = qin(qx, (2, c, 9, 10))
    got = reference.run(g, {"x": xs})[0]
    w, b = g.consts["w"], g.consts["b"]
    acc = conv_sum(xs.astype(np.float64) - qx.zero_point[0], w.data.astype(np.float64),
                   {"strides": list(s), "dilations": [1, 1], "pads": list(p), "group": group},
                   q.type.shape[2:]) + b.data.reshape(1, -1, 1, 1)
    sc = np.float32(qx.scale[0]) * np.asarray(w.type.quant.scale, np.float32)
    want = acc.astype(np.float32) * sc.reshape(1, -1, 1, 1)
    want = np.maximum(want, 0) if act == "Relu" else np.clip(want, *np.float32(params)) if act == "Clip" else want
    np.testing.assert_array_equal(got, want.astype(np.float32))
    check_exact(g, {"x": xs}, f"QLinearConv -> f32 {storage} {c}->{o} g{group} {act}")


@pytest.mark.parametrize("shifts", [(33, 34, 36, 38, 40, 44, 55, 62), (32, 33, 36, 38, 40, 44, 55, 62)])
def test_requantization_shift_edges_bit_exact(shifts):
    """The x86 epilogue computes ``(acc·m + r) >> s`` from the high word of ``acc·m`` in int32
    when every s is in [33, 62] (``kernels.requant.narrow_shift_ok``), else (one s = 32) in int64:
    both equal the reference at the edges: s = 33 and 62, m = 2^31 - 1 and 2^30, accumulators of
    both signs up to 256·138·128 ≈ 2^22, outputs clamped at 0 and 255 and in between."""
    from qcompiler.codegen.kernels.requant import narrow_shift_ok
    n, k = len(shifts), 256
    ms = [2 ** 31 - 1, 2 ** 30, 1_500_000_000, 2 ** 31 - 2, 1_073_741_825, 2 ** 30 + 12345, 2_000_000_000, 1_234_567_890]
    assert narrow_shift_ok({"multiplier": ms, "shift": list(shifts)}, n) == (min(shifts) >= 33)
    g = Graph("q")
    a = g.add_input("a", TensorType((6, k), "uint8", U8))
    w = np.tile(np.array([127, -128, 127, -128, 1, -1, 127, -128], np.int8)[:, None], (1, k))
    w[4:6, ::3] = 100                                          # mixed signs: mid-range sums
    ws = (0.005,) * n
    wq = g.add_const(w, "w", QuantParams("int8", ws, (0,) * n, axis=0))
    bq = g.add_const(np.array([0, 5, -7, 900, -900, 3, 1, -1], np.int32), "b",
                     QuantParams("int32", tuple(float(np.float32(0.02) * np.float32(v)) for v in ws), (0,) * n, axis=0))
    qo = QuantParams("uint8", (0.04,), (10,))
    g.outputs = [g.create_op("QLinearGemm", [a, wq, bq], {"multiplier": ms, "shift": list(shifts)},
                             result_types=[TensorType((6, n), "uint8", qo)]).result]
    x = np.where(RNG.random((6, k)) < 0.5, 0, 255).astype(np.uint8)
    x[0], x[1], x[2] = 255, 0, 117                               # a - z_a: +138, -117, 0 everywhere
    want = reference.run(g, {"a": x})[0]
    assert want.min() == 0 and want.max() == 255 and ((want > 0) & (want < 255)).any()
    check_exact(g, {"a": x}, f"shifts {shifts}")


def test_high_word_requantization_equals_rounding_shift():
    """The identity behind the x86 int32 epilogue, in int64 numpy on the int32 extremes and 40,000
    random accumulators (half of them anywhere in int32), every shift 33 <= s <= 62 and m at
    0, 1, 2^30, 2^31 - 1 and a random value in between:
    ``(hi + 2^(s-33)) >> (s-32)`` with ``hi = (acc·m) >> 32`` equals ``rrs(acc·m, s)``, and ``hi``
    and the sum stay inside int32."""
    from qcompiler.quant.requant import rounding_right_shift
    acc = np.concatenate([np.array([-2 ** 31, -2 ** 31 + 1, -1, 0, 1, 2 ** 31 - 1], np.int64),
                          RNG.integers(-2 ** 31, 2 ** 31, 20000), RNG.integers(-2 ** 16, 2 ** 16, 20000)])
    for s in range(33, 63):
        for m in (0, 1, 2 ** 30, 2 ** 31 - 1, int(RNG.integers(2 ** 30, 2 ** 31))):
            hi = (acc * m) >> 32
            t = hi + (1 << (s - 33))
            assert hi.min() >= -2 ** 31 and t.max() < 2 ** 31, (s, m)
            np.testing.assert_array_equal(t >> (s - 32), rounding_right_shift(acc * m, s), err_msg=f"s={s} m={m}")


def _int32_epilogue_conv():
    g = Graph("q")
    x = g.add_input("x", TensorType((1, 16, 6, 6), "uint8", U8))
    y = add_qconv(g, x, 16, (1, 1))
    assert min(y.producer.attrs["shift"]) >= 33 and len(set(y.producer.attrs["shift"])) > 1
    g.outputs = [y]
    return g


@pytest.mark.parametrize("cpu", X86_LEVELS)
def test_int32_epilogue_keeps_its_clamp(cpu):
    """The clamp of a per-channel int32 epilogue survives TVM's simplifier: with the per-channel
    shift loaded from an int8 constant and used as ``x >> (s - 32)``, TVM's bound of the shift
    (not known to lie in [0, 31]) made ``x >> t`` look like [-2, 1] and the clamp to [0, 255] was
    dropped as always true (rapidocr-cls: one output 252 instead of 0, and 66 layers off after it)."""
    script = conv_script(_int32_epilogue_conv(), TargetSpec("x86", cpu=cpu))
    assert "T.min(" in script and "T.max(" in script


def test_int32_epilogue_bit_exact():
    check_exact(_int32_epilogue_conv(), {"x": qin(U8, (1, 16, 6, 6))}, "per-channel int32 epilogue")


@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_qlinearadd_broadcast_requantize_bit_exact(storage):
    g = Graph("q")
    qa, qb = ACT[storage], QuantParams(storage, (0.011,), (7,))
    a = g.add_input("a", TensorType((2, 8, 5, 5), storage, qa))
    b = g.add_input("b", TensorType((1, 8, 1, 5), storage, qb))
    qo = QuantParams(storage, (0.025,), (-3,) if storage == "int8" else (60,))
    ms, s = quantize_multipliers([qa.scale[0] / qo.scale[0], qb.scale[0] / qo.scale[0]])
    y = g.create_op("QLinearAdd", [a, b], {"multiplier": ms, "shift": [s], "activation": "Relu"},
                    result_types=[TensorType((2, 8, 5, 5), storage, qo)]).result
    q2 = QuantParams(storage, (0.07,), (1,))
    m2, s2 = quantize_multiplier(qo.scale[0] / q2.scale[0])
    z = g.create_op("Requantize", [y], {"multiplier": [m2], "shift": [s2]},
                    result_types=[TensorType(y.type.shape, storage, q2)]).result
    g.outputs = [y, z]
    check_exact(g, {"a": qin(qa, (2, 8, 5, 5)), "b": qin(qb, (1, 8, 1, 5))}, "QLinearAdd/Requantize")


@pytest.mark.parametrize("storage", ["uint8", "int8"])
@pytest.mark.parametrize("ashape, bshape", [((2, 8, 5, 7), (2, 8, 1, 1)), ((1, 16, 3, 9), (1, 16, 3, 9)),
                                           ((1, 1, 4, 1), (2, 3, 1, 5))])
def test_qlinearmul_broadcast_bit_exact(storage, ashape, bshape):
    """QLinearMul q = clamp(z + rrs((a - z_a)(b - z_b) m, s)) with numpy broadcasting: the
    squeeze-excite gate N x C x 1 x 1, equal shapes, and both operands broadcasting."""
    g = Graph("q")
    qa, qb = ACT[storage], QuantParams(storage, (0.004,), (-128,) if storage == "int8" else (0,))
    a = g.add_input("a", TensorType(ashape, storage, qa))
    b = g.add_input("b", TensorType(bshape, storage, qb))
    qo = QuantParams(storage, (0.015,), (-9,) if storage == "int8" else (12,))
    m, s = quantize_multiplier(qa.scale[0] * qb.scale[0] / qo.scale[0])
    shape = tuple(np.broadcast_shapes(ashape, bshape))
    y = g.create_op("QLinearMul", [a, b], {"multiplier": [m], "shift": [s]},
                    result_types=[TensorType(shape, storage, qo)]).result
    g.outputs = [y]
    feeds = {"a": qin(qa, ashape), "b": qin(qb, bshape)}
    check_exact(g, feeds, f"QLinearMul {storage} {ashape}*{bshape}")
    # the oracle itself against the real-number formula: |error| <= 1/2 LSB + the multiplier's rounding
    real = (feeds["a"].astype(np.float64) - qa.zero_point[0]) * qa.scale[0] * \
        (feeds["b"].astype(np.float64) - qb.zero_point[0]) * qb.scale[0]
    lo, hi = (-128, 127) if storage == "int8" else (0, 255)
    want = np.clip(np.floor(real / qo.scale[0] + 0.5) + qo.zero_point[0], lo, hi)
    assert np.abs(reference.run(g, feeds)[0].astype(np.float64) - want).max() <= 1


@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_squeeze_excite_block_bit_exact(storage):
    """conv (blocked NCHWc output) -> GAP -> 1x1 conv -> gate; QLinearMul(x, gate) -> conv: the
    squeeze-excite block of MobileNetV3 on the integer kernels, the Mul between blocked layouts."""
    g = Graph("q")
    qx = ACT[storage]
    x = g.add_input("x", TensorType((1, 16, 6, 10), storage, qx))
    zq = -128 if storage == "int8" else 0
    a = add_qconv(g, x, 16, (3, 3), group=16, p=(1, 1, 1, 1), act="Relu",
                  out_qp=QuantParams(storage, (0.03,), (zq,)))
    qg = QuantParams(storage, (0.01,), (zq,))
    m1, s1 = quantize_multiplier(0.03 / (0.01 * 60))
    gp = g.create_op("QLinearGlobalAveragePool", [a], {"multiplier": [m1], "shift": [s1]},
                     result_types=[TensorType((1, 16, 1, 1), storage, qg)]).result
    gate = add_qconv(g, gp, 16, (1, 1), out_qp=QuantParams(storage, (1 / 255,), (zq,)))
    qm = QuantParams(storage, (0.02,), (zq + 3,))
    m, s = quantize_multiplier(0.03 * (1 / 255) / 0.02)
    y = g.create_op("QLinearMul", [a, gate], {"multiplier": [m], "shift": [s]},
                    result_types=[TensorType(a.type.shape, storage, qm)]).result
    g.outputs = [add_qconv(g, y, 24, (1, 1)), y]
    check_exact(g, {"x": qin(qx, (1, 16, 6, 10))}, f"squeeze-excite {storage}")


@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_fpn_concat_of_resized_quantized_values_bit_exact(storage):
    """Concat(Q(Resize_nearest(DQ(a))), Q(Resize_nearest(DQ(c))), b) as the FPN of rapidocr-det:
    a has other params than the output (a table on the gathered integers), c the same (a pure
    gather); then a conv on the concatenation (blocked layout) and the concatenation itself."""
    g = Graph("q")
    qo = QuantParams(storage, (0.05,), (90,) if storage == "uint8" else (-7,))
    a = g.add_input("a", TensorType((1, 8, 3, 4), storage, ACT[storage]))
    c = g.add_input("c", TensorType((1, 8, 6, 8), storage, qo))
    b = g.add_input("b", TensorType((1, 8, 12, 16), storage, qo))
    parts = []
    for v in (a, c):
        d = g.create_op("DequantizeLinear", [v]).result
        r = g.create_op("Resize", [d], {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                        "nearest_mode": "floor", "sizes": [1, 8, 12, 16]}).result
        parts.append(g.create_op("QuantizeLinear", [r], result_types=[TensorType((1, 8, 12, 16), storage, qo)]).result)
    cat = g.create_op("Concat", parts + [b], {"axis": 1},
                      result_types=[TensorType((1, 24, 12, 16), storage, qo)]).result
    g.outputs = [add_qconv(g, cat, 16, (3, 3), p=(1, 1, 1, 1), act="Relu"), cat]
    check_exact(g, {"a": qin(ACT[storage], (1, 8, 3, 4)), "c": qin(qo, (1, 8, 6, 8)), "b": qin(qo, (1, 8, 12, 16))},
                f"FPN concat {storage}")


@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_qlinear_pools_bit_exact(storage):
    g = Graph("q")
    qx = ACT[storage]
    x = g.add_input("x", TensorType((2, 6, 9, 8), storage, qx))
    qo = QuantParams(storage, (0.015,), (12,))
    m, s = quantize_multiplier(qx.scale[0] / (qo.scale[0] * 72))
    gap = g.create_op("QLinearGlobalAveragePool", [x], {"multiplier": [m], "shift": [s]},
                      result_types=[TensorType((2, 6, 1, 1), storage, qo)]).result
    outs = [gap]
    for pads, cip in (([0, 0, 0, 0], 0), ([1, 1, 1, 1], 1)):
        m, s = quantize_multiplier(qx.scale[0] / (qo.scale[0] * 9))
        attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": pads, "count_include_pad": cip,
                 "multiplier": [m], "shift": [s]}
        shape = infer_types("QLinearAveragePool", [x.type], attrs)[0].shape
        outs.append(g.create_op("QLinearAveragePool", [x], attrs,
                                result_types=[TensorType(shape, storage, qo)]).result)
    outs.append(keep(g, "MaxPool", [x], {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 1]}))
    outs.append(keep(g, "GlobalMaxPool", [x]))
    g.outputs = outs
    check_exact(g, {"x": qin(qx, (2, 6, 9, 8))}, "pools")


@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_quantize_dequantize_bit_exact(storage):
    g = Graph("q")
    qp = QuantParams(storage, (0.05,), (128,) if storage == "uint8" else (-3,))
    x = g.add_input("x", TensorType((4, 7, 3), "float32"))
    q = g.create_op("QuantizeLinear", [x], result_types=[TensorType((4, 7, 3), storage, qp)]).result
    qc = QuantParams(storage, (0.01, 0.02, 0.04), (0, 0, 0), axis=2)
    y = g.create_op("DequantizeLinear", [keep(g, "Relu", [q])]).result
    q2 = g.add_input("q2", TensorType((4, 7, 3), storage, qc))
    y2 = g.create_op("DequantizeLinear", [q2]).result
    g.outputs = [q, y, y2]
    xv = RNG.uniform(-9, 9, (4, 7, 3)).astype(np.float32)
    xv.flat[:24] = (np.arange(24) - 12 + 0.5).astype(np.float32) * np.float32(0.05)    # ties: half to even
    xv.flat[24:28] = [1e9, -1e9, 0.0, -0.0]
    check_exact(g, {"x": xv, "q2": qin(qc, (4, 7, 3))}, "Quantize/DequantizeLinear")


def test_plain_ops_on_quantized_values_bit_exact():
    g = Graph("q")
    qx = U8
    x = g.add_input("x", TensorType((2, 4, 5, 6), "uint8", qx))
    y = g.add_input("y", TensorType((2, 3, 5, 6), "uint8", qx))
    cat = keep(g, "Concat", [x, y], {"axis": 1})
    pad = keep(g, "Pad", [cat], {"pads": [0, 0, 1, 2, 0, 0, 2, 1], "mode": "constant", "value": 0.0})
    clip = keep(g, "Clip", [pad], {"min": 0.0, "max": 1.5})
    tr = keep(g, "Transpose", [clip], {"perm": [0, 2, 3, 1]})
    rs = keep(g, "Reshape", [tr], {"shape": [2, 8 * 9 * 7]})
    g.outputs = [rs, keep(g, "Relu", [x])]
    check_exact(g, {"x": qin(qx, (2, 4, 5, 6)), "y": qin(qx, (2, 3, 5, 6))}, "plain ops")




@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_float_island_lookup_table_bit_exact(storage):
    """conv -> DequantizeLinear -> HardSwish / Sigmoid·2 -> QuantizeLinear fuses into the conv as a
    256-entry table computed by the oracle: equal to the oracle on every value."""
    g = Graph("q")
    x = g.add_input("x", TensorType((2, 16, 7, 9), storage, ACT[storage]))
    y = add_qconv(g, x, 16, (3, 3), p=(1, 1, 1, 1))
    outs = []
    for kinds, qp in (((("HardSwish", None),), QuantParams(storage, (0.031,), (7,))),
                      ((("Sigmoid", None), ("Mul", 2.0)), QuantParams(storage, (0.009,), (-100 if storage == "int8" else 2,)))):
        f = g.create_op("DequantizeLinear", [y]).result
        for kind, c in kinds:
            ops = [f] if c is None else [f, g.add_const(np.float32(c), "c")]
            f = g.create_op(kind, ops).result
        outs.append(g.create_op("QuantizeLinear", [f], result_types=[TensorType(f.type.shape, storage, qp)]).result)
    g.outputs = outs
    check_exact(g, {"x": qin(ACT[storage], (2, 16, 7, 9))}, f"lookup {storage}")

# ---- the dot-product paths (qcompiler/codegen/kernels/qdot.py), each ISA forced by LLVM features ----
def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# name: (LLVM mattr over the host CPU, /proc/cpuinfo flags needed to run it, expected int8_isa, instruction)
ISAS = {
    "vnni512": ((), {"avx512_vnni", "avx512bw", "avx512vl"}, "vnnix16", "vpdpbusd"),
    "vnni256": (("-avx512f", "+avxvnni"), {"avx_vnni"}, "vnnix8", "vpdpbusd"),
    "pmaddwd512": (("-avx512vnni", "-avxvnni"), {"avx512bw", "avx512vl"}, "pmaddwdx16", "vpmaddwd"),
    "avx2": (("-avx512f", "-avxvnni"), {"avx2"}, "pmaddwdx8", "vpmaddwd"),         # AMD Zen 3
    "plain": (("-avx512f", "-avxvnni", "-avx2"), set(), "None", None),              # no dot product
}


def isa_spec(name: str) -> TargetSpec:
    feats, need, want, _ = ISAS[name]
    if not need <= _cpu_flags():
        pytest.skip(f"this CPU lacks {sorted(need - _cpu_flags())}")
    spec = TargetSpec("x86", features=feats)
    if str(int8_isa(spec)) != want:
        pytest.skip(f"{spec.host_tvm} gives {int8_isa(spec)}, not {want}")
    return spec


@pytest.fixture
def strict(monkeypatch):
    """A schedule rule that fails raises instead of falling back to plain loops: a test that
    passes ran the tensorized kernel."""
    from qcompiler.codegen.x86 import schedules as x86
    monkeypatch.setattr(x86, "STRICT", True)


DOT_CONVS = [  # (storage, C, O, group, kernel, strides, dilations, pads, activation)
    ("uint8", 16, 32, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "Clip"),      # aligned, input read blocked
    ("int8", 16, 64, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), ""),          # pointwise, 2 registers of outputs
    ("uint8", 3, 10, 1, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "Relu"),      # C, O not multiples of 4: padded
    ("int8", 20, 24, 1, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2), ""),          # dilated; O = 16 + 8
    ("uint8", 6, 6, 2, (3, 2), (2, 1), (1, 2), (0, 1, 2, 0), "Relu"),       # groups of 3 -> 3, padded per group
    ("int8", 32, 64, 4, (3, 3), (2, 2), (1, 1), (1, 0, 1, 2), "Clip"),      # groups of 8 -> 16, stride 2
    ("uint8", 4, 8, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), ""),           # channel multiplier 2
    ("uint8", 36, 48, 1, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0), ""),         # stride 2 pointwise, C = 36
    ("uint8", 32, 32, 32, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "Relu"),    # depthwise: taps in groups
    ("int8", 24, 24, 24, (5, 5), (2, 2), (1, 1), (2, 1, 2, 2), "Clip"),     # depthwise 5x5 s2, 8-channel blocks
    ("uint8", 20, 20, 20, (3, 3), (1, 2), (2, 2), (2, 2, 2, 2), ""),        # depthwise dilated, 4-channel blocks
    # one input channel: kernel taps folded into the dot product's groups (qdot.fold_taps)
    ("uint8", 1, 32, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "Relu"),      # mnistnet's stem
    ("int8", 1, 16, 1, (5, 5), (2, 2), (1, 2), (2, 1, 0, 3), ""),           # 5x5 (folds for q = 2 and 4), dilated
    ("uint8", 1, 8, 1, (3, 3), (1, 2), (2, 1), (0, 2, 1, 1), "Clip"),       # strided, asymmetric pads
    ("uint8", 1, 8, 1, (2, 2), (1, 1), (1, 1), (0, 0, 1, 1), ""),           # even width: one group of taps (vpdpbusd: two zero)
    # one or two output channels (a segmentation/VAD head): padded to a register of 4
    ("uint8", 8, 1, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), ""),
    ("int8", 16, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "Relu"),
    ("uint8", 8, 2, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), ""),
]


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("storage, c, o, group, k, s, d, p, act", DOT_CONVS)
def test_qlinearconv_dot_paths_bit_exact(strict, isa, storage, c, o, group, k, s, d, p, act):
    spec = isa_spec(isa)
    g = Graph("q")
    x = g.add_input("x", TensorType((2, c, 9, 11), storage, ACT[storage]))
    g.outputs = [add_qconv(g, x, o, k, group=group, s=s, d=d, p=p, act=act,
                           params=(0.0, 6.0) if act == "Clip" else (), bias=(o != 10), per_channel=(o != 10))]
    check_exact(g, {"x": qin(ACT[storage], (2, c, 9, 11))}, f"{isa} QLinearConv {storage} {c}->{o} g{group}", spec)


@pytest.mark.parametrize("vw, ow, tile", [
    (8, 14, (8, 7)),     # AVX2 (12 accumulators): 2 columns of two registers vs 7 of one -> one
    (8, 7, (8, 7)),
    (8, 32, (16, 4)),    # 4 x 2 = 8 accumulators either way: two registers (fewer broadcasts)
    (8, 8, (16, 4)),
    (8, 11, (8, 11)),
    (16, 14, (32, 14)),  # AVX-512 (28): 14 columns of two registers
    (16, 17, (16, 17)),
])
def test_register_tile_holds_the_most_accumulators(vw, ow, tile):
    from types import SimpleNamespace

    from qcompiler.codegen.kernels.conv import register_tile
    assert register_tile(ow, SimpleNamespace(vw=vw), vw, True) == tile
    assert register_tile(ow, SimpleNamespace(vw=vw), vw, False)[0] == vw


@pytest.mark.parametrize("vw, ow, kgp, tile", [
    (16, 56, 144, (16, 14)),   # 32 zmm: 14 accumulators + 14 broadcasts + 1 weight (was 28 columns: 25 spilled)
    (16, 56, 64, (32, 8)),     # two registers: 8 columns x 2 + 8 broadcasts + 2 weights = 26
    (16, 14, 64, (32, 7)),     # 14 accumulators either way: two registers (fewer broadcasts)
    (16, 7, 64, (16, 7)),      # narrower than 8 columns: one register
    (8, 56, 64, (16, 4)),      # 16 ymm (AVX2): 4 x 2 + 4 + 2
    (8, 14, 64, (8, 7)),       # 7 + 7 + 1
])
def test_dot_tile_counts_the_broadcasts(vw, ow, kgp, tile):
    """The int8 dot-product conv's register tile (qdot._blocking) leaves a register for each column's
    broadcast input: vpdpbusd/vpmaddwd take it from a register, and LLVM hoists them all."""
    from types import SimpleNamespace

    from qcompiler.codegen.kernels.qdot import _blocking
    isa = SimpleNamespace(kind="vnni")
    assert _blocking(SimpleNamespace(vw=vw), isa, kgp, vw, ow, 4) == tile


@pytest.mark.parametrize("isa", list(ISAS))
def test_qlinearconv_one_register_tile_bit_exact(strict, isa):
    """mnistnet's second conv (32 -> 64, 3x3, 14x14): on AVX2 a tile of 7 columns of one register
    of output channels (:func:`register_tile`), checked against the integer reference."""
    spec = isa_spec(isa)
    g = Graph("q")
    x = g.add_input("x", TensorType((1, 32, 14, 14), "uint8", U8))
    g.outputs = [add_qconv(g, x, 64, (3, 3), p=(1, 1, 1, 1), act="Relu")]
    check_exact(g, {"x": qin(U8, (1, 32, 14, 14))}, f"{isa} QLinearConv 32->64 14x14", spec)


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("storage, m, k, n", [("uint8", 3, 21, 10), ("int8", 4, 64, 33), ("uint8", 1, 7, 3),
                                               ("int8", 5, 130, 17), ("uint8", 16, 96, 48)])
def test_qlineargemm_dot_paths_bit_exact(strict, isa, storage, m, k, n):
    _gemm_exact(storage, m, k, n, isa_spec(isa))


HSWISH_CONVS = [  # (storage, C, O, group, kernel, pads, gate): dot-product conv, depthwise, per-tensor weights
    ("uint8", 16, 32, 1, (3, 3), (1, 1, 1, 1), "standard"),
    ("int8", 20, 24, 1, (1, 1), (0, 0, 0, 0), "scaled"),
    ("uint8", 24, 24, 24, (3, 3), (1, 1, 1, 1), "scaled"),
    ("int8", 3, 10, 1, (3, 3), (1, 1, 1, 1), "standard"),
]


def _gate_params(kind, o):
    return () if kind == "standard" else (1 / 6, 0.5, *(float(v) for v in RNG.uniform(0.3, 3.0, o)))


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("storage, c, o, group, k, p, gate", HSWISH_CONVS)
def test_qlinearconv_hardswish_epilogue_bit_exact(strict, isa, storage, c, o, group, k, p, gate):
    """The float32 HardSwish epilogue (qcompiler.quant.hardswish), plain HardSwish and the
    equalized per-channel form, on every forced ISA path, equal to the oracle."""
    spec = isa_spec(isa)
    g = Graph("q")
    x = g.add_input("x", TensorType((2, c, 9, 11), storage, ACT[storage]))
    g.outputs = [add_qconv(g, x, o, k, group=group, p=p, act="HardSwish", params=_gate_params(gate, o),
                           per_channel=(o != 10), bias=(o != 10))]
    check_exact(g, {"x": qin(ACT[storage], (2, c, 9, 11))}, f"{isa} QLinearConv HardSwish {storage} {c}->{o}", spec)


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("storage, m, k, n, gate", [("uint8", 3, 21, 10, "standard"), ("int8", 4, 64, 33, "scaled")])
def test_qlineargemm_hardswish_epilogue_bit_exact(strict, isa, storage, m, k, n, gate):
    qa = ACT[storage]
    qo = QuantParams(storage, (0.02,), (-100 if storage == "int8" else 20,))

    def attrs(ws):
        params = list(_gate_params(gate, n))
        return {"activation": "HardSwish", "activation_params": params,
                **hardswish.epilogue_attrs(qa.scale[0], ws, qo, params, n)}
    g = _qgemm_graph(storage, m, k, n, qo, attrs)
    check_exact(g, {"a": qin(qa, (m, k))}, f"{isa} QLinearGemm HardSwish {storage} {m}x{k}x{n}", isa_spec(isa))


@pytest.mark.parametrize("cpu", X86_LEVELS)
def test_dot_instructions_emitted(cpu):
    """The conv kernel built for each x86 level uses its dot-product instruction, on the level's
    widest registers (asm of the build; compiling needs no such CPU): vpdpbusd with AVX-512 VNNI,
    vpmaddwd on AVX2 and on AVX-512 without VNNI."""
    spec = TargetSpec("x86", cpu=cpu)
    isa = int8_isa(spec)
    instr = {"vnni": "vpdpbusd", "pmaddwd": "vpmaddwd"}[isa.kind]
    reg = {16: "%zmm", 8: "%ymm"}[isa.lanes]
    g = Graph("q")
    x = g.add_input("x", TensorType((1, 16, 6, 6), "uint8", U8))
    g.outputs = [add_qconv(g, x, 32, (3, 3), p=(1, 1, 1, 1))]
    lib = build_module(g, spec).mod
    asm = "".join(m.inspect_source("asm") for m in lib.imports if m.kind == "llvm") \
        if lib.imports else lib.inspect_source("asm")
    dots = [ln for ln in asm.splitlines() if ln.strip().startswith(instr)]
    assert dots and any(reg in ln for ln in dots), f"{cpu} ({isa}): no {instr} on {reg} in the generated code"


# ---- depthwise on exact float32 FMAs -----------------------------------------------------------------
def _extreme_depthwise(storage, c, k, p):
    """A depthwise QLinearConv whose window sums reach the exactness bound: activations at the
    storage extremes, weights 127/-128. One output step is 40 accumulator units, so most outputs
    saturate and those whose sums land within about ±5000 of the zero point resolve the sum to 40."""
    g = Graph("q")
    qx = ACT[storage]
    x = g.add_input("x", TensorType((1, c, k[0] + 3, k[1] + 2), storage, qx))
    wq = RNG.choice(np.array([-128, 127], np.int8), (c, 1, *k))
    ws = (0.004,) * c
    qw = QuantParams("int8", ws, (0,) * c, axis=0)
    qb = QuantParams("int32", tuple(float(np.float32(qx.scale[0]) * np.float32(v)) for v in ws), (0,) * c, axis=0)
    so = float(np.float32(qx.scale[0]) * np.float32(ws[0])) * 40.0          # 40 accumulator units per step
    qo = QuantParams(storage, (so,), (128,) if storage == "uint8" else (0,))
    ms, ss = conv_multipliers(qx.scale[0], ws, so)
    attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": list(p), "group": c, "activation": "",
             "activation_params": [], "multiplier": ms, "shift": ss}
    ops = [x, g.add_const(wq, "w", qw), g.add_const(RNG.integers(-3000, 3000, c).astype(np.int32), "b", qb)]
    shape = infer_types("QLinearConv", [v.type for v in ops], attrs)[0].shape
    g.outputs = [g.create_op("QLinearConv", ops, attrs, result_types=[TensorType(shape, storage, qo)]).result]
    lo, hi = (0, 255) if storage == "uint8" else (-128, 127)
    xv = RNG.choice(np.array([lo, hi, hi, lo + 1, hi - 1]), (1, c, k[0] + 3, k[1] + 2)).astype(storage)
    return g, {"x": xv}, wq


@pytest.mark.parametrize("storage", ["uint8", "int8"])
@pytest.mark.parametrize("c, k, p, f32", [
    (16, (7, 7), (3, 3, 3, 3), True),          # 49 taps x 255 x 128 = 1.6e6 < 2^24: float32 FMAs
    (8, (5, 5), (0, 0, 0, 0), True),           # no padding: the conversion runs in the packing stage
    (4, (23, 23), (1, 1, 1, 1), False),        # uint8: 529 x 255 x 128 > 2^24, the int16 kernel; int8: 8.7e6 < 2^24
])
def test_depthwise_exact_f32_bit_exact(monkeypatch, storage, c, k, p, f32):
    """The depthwise int8 conv on float32 FMAs is bit-exact at the largest sums it accepts, and a
    window whose sums could leave the exact float32 range keeps the integer kernel."""
    from qcompiler.codegen.kernels import conv, quant
    g, feeds, wq = _extreme_depthwise(storage, c, k, p)
    bound = conv.exact_f32_bound(storage, wq)
    want_f32 = bound < conv.F32_EXACT
    if storage == "uint8":
        assert want_f32 == f32, (bound, conv.F32_EXACT)
    used = []

    def spy(*args, **kw):
        r = conv.depthwise_int_exact_f32(*args, **kw)
        used.append(r is not None)
        return r
    monkeypatch.setattr(quant, "depthwise_int_exact_f32", spy)
    check_exact(g, feeds, f"depthwise {storage} {k} f32={want_f32}")
    assert used == [want_f32]


def test_exact_f32_bound():
    w = np.zeros((3, 1, 7, 7), np.int8)
    w[1] = -128
    w[2, 0, 0, :3] = 127
    assert conv_bound("uint8", w) == 255 * 128 * 49
    assert conv_bound("int8", w) == 128 * 128 * 49
    assert conv_bound("float32", w) >= 1 << 24                 # unknown storage: never the float path


def conv_bound(storage, w):
    from qcompiler.codegen.kernels.conv import exact_f32_bound
    return exact_f32_bound(storage, w)


# ---- end to end -----------------------------------------------------------------------------------
def test_fashion_mobilenet_int8_end_to_end():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import realmodels
    p = Path(realmodels.MODELS_DIR) / "fashion_mobilenet.onnx"
    data = realmodels.fashion_test()
    if not p.exists() or data is None:
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz not present")
    x, labels = data
    x = x[:1000].astype(np.float32)
    labels = labels[:1000]
    B = 250
    g, name = realmodels.quantize_batched(str(p), x, 200, B)
    ex = build_module(g, SPEC)
    vm = tvm.runtime.vm.VirtualMachine(ex, tvm.cpu())

    def run(xs):
        return np.concatenate([vm["main"](tvm.runtime.tensor(xs[s:s + B])).numpy() for s in range(0, len(xs), B)])
    # bit-exact against the oracle on 50 images (the graph ends with DequantizeLinear: exact floats)
    got = run(x[:B])[:50]
    want = reference.run(g, {name: x[:B]})[0][:50]
    assert np.array_equal(got, want), f"max diff {np.abs(got - want).max()}"
    # accuracy on x[500:] vs the fp32 model in onnxruntime
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])
    iname = sess.get_inputs()[0].name
    fp32 = np.concatenate([sess.run(None, {iname: x[i:i + 1]})[0] for i in range(500, 1000)])
    int8 = run(x[500:])
    acc_fp32 = float(np.mean(fp32.argmax(1) == labels[500:]))
    acc_int8 = float(np.mean(int8.argmax(1) == labels[500:]))
    print(f"fashion_mobilenet top-1: fp32 {acc_fp32:.4f}  int8 (TVM x86) {acc_int8:.4f}")
    assert abs(acc_fp32 - acc_int8) <= 0.005 + 1e-9


def test_host_cpu_override_builds_as_that_cpu_would(monkeypatch):
    """QCOMPILER_HOST_CPU=x86-64-v3 (how the suite emulates an AVX2 host on an AVX-512 one): a build
    for the host targets that CPU, takes its int8 path (vpmaddwd on ymm), and the kernel it
    compiles runs here and computes the oracle's integers."""
    monkeypatch.setenv("QCOMPILER_HOST_CPU", "x86-64-v3")
    spec = TargetSpec("x86")
    assert spec.host_tvm["mcpu"] == "x86-64-v3" and str(int8_isa(spec)) == "pmaddwdx8"
    check_exact(_int32_epilogue_conv(), {"x": qin(U8, (1, 16, 6, 6))}, "x86-64-v3 as the host", spec)
