"""Property: the default pipeline preserves the outputs of random conv nets (onnxruntime before and
after, max|diff| <= 1e-5 * max|ref|).

Graphs are drawn as recipes of layers (conv, depthwise conv, BatchNormalization after or before a
conv, activations Relu/Clip/LeakyRelu/HardSwish/HardSigmoid/Sigmoid/Tanh, residual adds, per-channel
affine constants, max/average pooling, extra outputs that make values multi-use) ending in an
optional global-pool + Gemm or 2-D MatMul + bias head; weights come from a seeded generator.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st
from ir_check import assert_same_outputs

from qcompiler.ir import Graph, InferError, TensorType
from qcompiler.ir.ops import REGISTRY
from qcompiler.passes import run_passes

ACTS = [("Relu", {}), ("Clip", {"min": 0.0, "max": 6.0}), ("Clip", {"min": -0.5, "max": 1.5}),
        ("LeakyRelu", {"alpha": 0.1}), ("HardSwish", {}), ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}),
        ("Sigmoid", {}), ("Tanh", {})]
LAYERS = ["conv", "dwconv", "bn", "act", "act", "residual", "pool", "affine", "bn_conv", "extra_output"]


def layer():
    return st.tuples(st.sampled_from(LAYERS), st.integers(0, 7), st.integers(1, 6), st.sampled_from([1, 3]),
                     st.booleans())


recipes = st.fixed_dictionaries({
    "channels": st.integers(1, 4), "size": st.integers(4, 9), "seed": st.integers(0, 2 ** 16),
    "layers": st.lists(layer(), min_size=1, max_size=7),
    "head": st.sampled_from(["none", "gemm", "gemm_act", "matmul_add"]),
})


class Builder:
    def __init__(self, seed: int):
        self.g = Graph("random")
        self.rng = np.random.default_rng(seed)
        self.outputs: list = []

    def const(self, shape, scale=1.0, positive=False):
        a = self.rng.standard_normal(shape) * scale
        return self.g.add_const((np.abs(a) + 0.2 if positive else a).astype(np.float32), "c")

    def op(self, kind, operands, **attrs):
        return self.g.create_op(kind, operands, {**REGISTRY[kind].defaults, **attrs}).result

    def conv(self, x, cout, k, group=1, pad=None, stride=1, bias=True):
        cin = x.shape[1]
        w = self.const((cout, cin // group, k, k), 1.0 / np.sqrt(cin // group * k * k))
        p = k // 2 if pad is None else pad
        ops = [x, w] + ([self.const((cout,), 0.5)] if bias else [])
        return self.op("Conv", ops, dilations=[1, 1], group=group, pads=[p] * 4, strides=[stride] * 2)

    def bn(self, x):
        c = x.shape[1]
        return self.op("BatchNormalization", [x, self.const((c,), positive=True), self.const((c,), 0.5),
                                              self.const((c,), 0.5), self.const((c,), positive=True)],
                       epsilon=1e-5)


def build(r) -> Graph:
    b = Builder(r["seed"])
    x = b.g.add_input("x", TensorType((1, r["channels"], r["size"], r["size"]), "float32"))
    history = [x]
    for kind, i, n, k, flag in r["layers"]:
        c = x.shape[1]
        try:
            if kind == "conv":
                x = b.conv(x, n, k, stride=2 if flag and k == 3 and x.shape[2] >= 6 else 1, bias=flag)
            elif kind == "dwconv":
                x = b.conv(x, c * (1 + (n > 4)), 3, group=c, bias=flag)
            elif kind == "bn":
                x = b.bn(x)
            elif kind == "act":
                a, attrs = ACTS[i]
                x = b.op(a, [x], **attrs)
            elif kind == "residual":       # conv (+ BN) branch added to the current value
                y = b.conv(x, c, k, bias=flag)
                y = b.bn(y) if n % 2 else y
                x = b.op("Add", [x, y] if i % 2 else [y, x])
            elif kind == "pool":
                pool = "MaxPool" if flag else "AveragePool"
                x = b.op(pool, [x], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
            elif kind == "affine":        # per-channel Mul or Add constant, either operand order
                cst = b.const((c, 1, 1))
                x = b.op("Mul" if flag else "Add", [x, cst] if i % 2 else [cst, x])
            elif kind == "bn_conv":       # BN on the input of an unpadded conv
                x = b.conv(b.bn(x), n, 1, pad=0, bias=flag)
            elif kind == "extra_output" and x is not history[0] and x not in b.outputs:
                b.outputs.append(x)
        except InferError:                 # the layer does not fit the current shape: skip it
            continue
        history.append(x)
    head = r["head"]
    if head != "none":
        v = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
        c = v.shape[1]
        if head == "matmul_add":
            x = b.op("Add", [b.op("MatMul", [v, b.const((c, 3))]), b.const((3,))])
        else:
            x = b.op("Gemm", [v, b.const((3, c)), b.const((3,))], transB=1)
            if head == "gemm_act":
                x = b.op("Relu", [x])
    if x not in b.outputs:
        b.outputs.append(x)
    if any(o is history[0] for o in b.outputs):
        b.outputs = [b.op("Identity", [o]) if o is history[0] else o for o in b.outputs]
    b.g.outputs = b.outputs
    b.g.verify()
    return b.g


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(recipes)
def test_default_pipeline_preserves_random_conv_nets(recipe):
    g = build(recipe)
    after = run_passes(g.clone(), "default")
    assert "BatchNormalization" not in after.op_histogram()
    assert_same_outputs(g, after)
