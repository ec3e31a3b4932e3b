"""Small float8 models for the fp8 tests: an FP8 QDQ ONNX model made by hand with onnx.helper
(opset 19, as NVIDIA Model Optimizer's FP8 export writes them: a QuantizeLinear/DequantizeLinear
pair with a float8 zero point on every conv/gemm input, weights as float8 initializers behind a
DequantizeLinear, float biases), and the float IR graph of a conv + gemm network."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

ZERO_POINT_TYPE = {"float8_e4m3fn": TP.FLOAT8E4M3FN, "float8_e5m2": TP.FLOAT8E5M2}


def fp8_qdq_model(fmt: str = "float8_e4m3fn", seed: int = 0, per_channel: bool = True,
                  relu: str = "Relu") -> onnx.ModelProto:
    """x (1x3x16x16) -> Q/DQ -> Conv 3x3 pad 1 (16 filters, float bias) -> ``relu`` -> Q/DQ ->
    depthwise Conv 3x3 stride 2 -> Q/DQ -> GlobalAveragePool -> Flatten -> Q/DQ -> Gemm (10 x 16,
    transB, float bias) -> y. Weights float8 per output channel (or per tensor), scale amax / max."""
    rng = np.random.default_rng(seed)
    E = getattr(ml_dtypes, fmt)
    mx = float(ml_dtypes.finfo(E).max)
    inits, nodes = [], []

    def const(name, arr):
        inits.append(nh.from_array(np.asarray(arr), name))
        return name

    def qdq(x, scale, name):
        s, z = const(name + "_s", np.float32(scale)), const(name + "_z", np.zeros((), E))
        nodes.append(h.make_node("QuantizeLinear", [x, s, z], [name + "_q"], name=name + "_quant"))
        nodes.append(h.make_node("DequantizeLinear", [name + "_q", s, z], [name + "_dq"], name=name + "_deq"))
        return name + "_dq"

    def weight(w, name):
        amax = np.abs(w).reshape(w.shape[0], -1).max(axis=1) if per_channel else np.abs(w).max()
        s = (amax / mx).astype(np.float32)
        q = np.clip(w / (s.reshape((-1,) + (1,) * (w.ndim - 1)) if per_channel else s), -mx, mx).astype(E)
        ins = [const(name + "_wq", q), const(name + "_ws", s), const(name + "_wz", np.zeros(s.shape, E))]
        nodes.append(h.make_node("DequantizeLinear", ins, [name + "_w"], name=name + "_wdeq",
                                 **({"axis": 0} if per_channel else {})))
        return name + "_w"

    x = qdq("x", 4.0 / mx, "in")
    w1 = weight(rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3, "c1")
    b1 = const("c1_b", rng.standard_normal(16).astype(np.float32) * 0.1)
    nodes.append(h.make_node("Conv", [x, w1, b1], ["c1_y"], pads=[1, 1, 1, 1], name="c1"))
    if relu:
        nodes.append(h.make_node(relu, ["c1_y"], ["c1_r"], name="c1_relu"))
    a1 = qdq("c1_r" if relu else "c1_y", 3.0 / mx, "a1")
    w2 = weight(rng.standard_normal((16, 1, 3, 3)).astype(np.float32) * 0.5, "c2")
    nodes.append(h.make_node("Conv", [a1, w2], ["c2_y"], pads=[1, 1, 1, 1], group=16, strides=[2, 2], name="c2"))
    a2 = qdq("c2_y", 4.0 / mx, "a2")
    nodes.append(h.make_node("GlobalAveragePool", [a2], ["gap"], name="gap"))
    nodes.append(h.make_node("Flatten", ["gap"], ["flat"], axis=1, name="flatten"))
    a3 = qdq("flat", 2.0 / mx, "a3")
    w3 = weight(rng.standard_normal((10, 16)).astype(np.float32), "fc")
    b3 = const("fc_b", rng.standard_normal(10).astype(np.float32) * 0.1)
    nodes.append(h.make_node("Gemm", [a3, w3, b3], ["y"], transB=1, name="fc"))
    g = h.make_graph(nodes, "fp8qdq", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 10])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def ort_session(model: onnx.ModelProto, level: str = "basic"):
    """An ONNX Runtime CPU session; ``level`` "basic" (ORT_ENABLE_BASIC: no QDQ fusions) or "all"."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if level == "basic"
                                   else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns ``names`` (float8 ones through a Cast to float32:
    ONNX Runtime's Python API has no numpy type for float8e5m2)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in names:
        m.graph.node.append(h.make_node("Cast", [n], [n + "/f32"], to=TP.FLOAT, name=n + "/f32"))
        m.graph.output.append(onnx.ValueInfoProto(name=n + "/f32"))
    return m


NET = """graph @g(%x: tensor<1x2x4x4xf32>) {
  %w = const dense<[0.5, -1.0, 0.25, 2.0, 0.125, -0.75, 1.5, 0.0]> : tensor<4x2x1x1xf32>
  %b = const dense<[0.5, -0.25, 0.0, 1.0]> : tensor<4xf32>
  %y = FusedConv(%x, %w, %b) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x4x4x4xf32> loc("conv")
  %p = GlobalAveragePool(%y) : tensor<1x4x1x1xf32> loc("gap")
  %f = Flatten(%p) {axis = 1} : tensor<1x4xf32> loc("flatten")
  %fw = const dense<[1.0, -0.5, 0.25, 0.75, 0.5, -2.0, 3.0, 0.0]> : tensor<2x4xf32>
  %o = Gemm(%f, %fw) {alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<1x2xf32> loc("fc")
  return %o
}"""
"""A float conv (Relu fused) -> pool -> gemm network for the quantize pass's golden fp8 test."""
