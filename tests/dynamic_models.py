"""Two small ONNX encoders with a dynamic sequence dim ``S`` for the ``--dynamic`` tests.

``masked_attention``: one attention layer whose mask input turns padded keys into -1e4 scores
(as BERT's exporters write it), a residual and a LayerNormalization, plus a masked mean over the
sequence; padding with mask 0 leaves the real positions unchanged. ``unmasked_mean``: the same
layer without a mask, pooled by ReduceMean over every position, so padding changes it."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D = 8


def _weights(rng) -> list:
    return [numpy_helper.from_array((rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32), n)
            for n in ("wq", "wk", "wv")]


def masked_attention(path, dim: str = "S") -> str:
    rng = np.random.default_rng(0)
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)   # noqa: E731
    inits = _weights(rng) + [c("scale", 1 / np.sqrt(D)), c("one", 1.0), c("neg", -1e4),
                             numpy_helper.from_array(np.array([1], np.int64), "ax1"),
                             numpy_helper.from_array(np.ones(D, np.float32), "gamma"),
                             numpy_helper.from_array(np.zeros(D, np.float32), "beta")]
    N = helper.make_node
    nodes = [N("MatMul", ["x", "wq"], ["q"]), N("MatMul", ["x", "wk"], ["k"]), N("MatMul", ["x", "wv"], ["v"]),
             N("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), N("MatMul", ["q", "kt"], ["qk"]),
             N("Mul", ["qk", "scale"], ["s"]),
             N("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT), N("Sub", ["one", "mf"], ["inv"]),
             N("Mul", ["inv", "neg"], ["madd"]), N("Unsqueeze", ["madd", "ax1"], ["madd3"]),
             N("Add", ["s", "madd3"], ["sm"]), N("Softmax", ["sm"], ["p"], axis=-1),
             N("MatMul", ["p", "v"], ["a"]), N("Add", ["a", "x"], ["r"]),
             N("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
             N("Unsqueeze", ["mf", "ax1"], ["mcol0"]), N("Transpose", ["mcol0"], ["mcol"], perm=[0, 2, 1]),
             N("Mul", ["y", "mcol"], ["ym"]), N("ReduceSum", ["ym", "ax1"], ["num"], keepdims=0),
             N("ReduceSum", ["mcol", "ax1"], ["den"], keepdims=0), N("Div", ["num", "den"], ["pooled"])]
    g = helper.make_graph(nodes, "masked_attention",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim, D]),
                           helper.make_tensor_value_info("mask", TensorProto.INT64, [1, dim])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim, D]),
                           helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, D])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return str(path)


def unmasked_mean(path) -> str:
    rng = np.random.default_rng(1)
    N = helper.make_node
    nodes = [N("MatMul", ["x", "wq"], ["q"]), N("MatMul", ["x", "wk"], ["k"]), N("MatMul", ["x", "wv"], ["v"]),
             N("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), N("MatMul", ["q", "kt"], ["qk"]),
             N("Softmax", ["qk"], ["p"], axis=-1), N("MatMul", ["p", "v"], ["a"]),
             N("ReduceMean", ["a"], ["pooled"], axes=[1], keepdims=0)]
    g = helper.make_graph(nodes, "unmasked_mean", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", D])],
                          [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, D])], _weights(rng))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return str(path)


def feed(length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, length, D)).astype(np.float32), "mask": np.ones((1, length), np.int64)}
