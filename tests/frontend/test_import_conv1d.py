"""A 1-D Conv imports as Unsqueeze -> 2-D Conv of height 1 -> Squeeze (silero_vad's STFT and
encoder): onnxruntime on the original == onnxruntime on export_onnx(import_onnx(original))."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import realmodels as rm
from qcompiler.frontend import export_onnx, import_onnx

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("attrs,group,bias", [
    ({}, 1, True),
    ({"strides": [2], "pads": [1, 2], "dilations": [2]}, 1, False),
    ({"auto_pad": "SAME_UPPER", "strides": [3]}, 2, True),
])
def test_conv1d_matches_ort(attrs, group, bias):
    x = RNG.standard_normal((2, 4, 17)).astype(np.float32)
    inits = {"w": RNG.standard_normal((6, 4 // group, 3)).astype(np.float32)}
    if bias:
        inits["b"] = RNG.standard_normal(6).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], name="c1", group=group, **attrs)
    g = helper.make_graph([node], "c1", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    ir = import_onnx(m)
    assert sorted(op.kind for op in ir.ops) == ["Conv", "Squeeze", "Unsqueeze"]
    assert [v.name for v in ir.outputs] == ["y"]
    ref = rm.ort_run(m, {"x": x})[0]
    np.testing.assert_allclose(rm.ort_run(export_onnx(ir), {"x": x})[0], ref, rtol=1e-5, atol=1e-5)
