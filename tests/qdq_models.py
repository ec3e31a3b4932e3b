"""Small pre-quantized ONNX models (onnx.helper), one per op configuration, and ORT as reference.

ORT runs them with graph optimizations off: its QDQ fusions would otherwise run integer kernels
with their own requantization, not the ONNX formulas the models spell out."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T, helper as h, numpy_helper as nh

RNG = np.random.default_rng(0)
X = (RNG.standard_normal((1, 4, 6, 6)) * 3).astype(np.float32)
W8 = RNG.integers(-128, 128, (6, 4, 3, 3)).astype(np.int8)
WU8 = RNG.integers(0, 256, (6, 4, 3, 3)).astype(np.uint8)
WS = (RNG.random(6) * 0.01 + 0.001).astype(np.float32)


def model(nodes, inits: dict, x_shape, outs=("y",), opset=18, x_type=T.FLOAT):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", x_type, list(x_shape))],
                     [onnx.ValueInfoProto(name=o) for o in outs],
                     [v if isinstance(v, onnx.TensorProto) else nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def ort_plain(m, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def qdq_conv(opset=13, per_channel=True, act="uint8", zp=True):
    """Q/DQ activation, DQ int8 weight (per channel or per tensor), DQ int32 bias, Conv, Q/DQ output."""
    s_x, s_y = np.float32(0.05), np.float32(0.1)
    z_x = np.uint8(128) if act == "uint8" else np.int8(-5)
    ws = WS if per_channel else WS[:1].reshape(())
    inits = {"s": s_x, "w": W8, "ws": ws, "b": RNG.integers(-999, 999, 6).astype(np.int32),
             "bs": (WS * s_x if per_channel else ws * s_x).astype(np.float32), "s2": s_y, "z2": np.int8(3)}
    if zp:
        inits["z"] = z_x
    waxis = {"axis": 0} if per_channel else {}
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z" if zp else ""], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "s", "z" if zp else ""], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "ws"], ["wd"], **waxis),
             h.make_node("DequantizeLinear", ["b", "bs"], ["bd"], **waxis),
             h.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("QuantizeLinear", ["c", "s2", "z2"], ["cq"]),
             h.make_node("DequantizeLinear", ["cq", "s2", "z2"], ["y"])]
    return model(nodes, inits, X.shape, opset=opset)


def dynamic_conv_integer(w=WU8, wz=np.uint8(131), pads=(1, 1, 1, 1), strides=(1, 1), group=1, channels=4):
    """DynamicQuantizeLinear's uint8 activation (a run-time zero point, stored in the padding) into
    ConvInteger: uint8 weights whose w - z_w leaves int8 (the extra window-sum channel), int8 ones
    with a zero point, grouped convs, a depthwise conv, a one-channel input (its taps folded)."""
    nodes = [h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             h.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["c"], pads=list(pads), strides=list(strides),
                         group=group),
             h.make_node("Cast", ["c"], ["cf"], to=T.FLOAT), h.make_node("Mul", ["cf", "xs"], ["y"])]
    return model(nodes, {"w": w, "wz": wz}, (1, channels, 6, 6), outs=("y", "xq", "xs", "xz"), opset=12)


def static_conv_integer():
    """ConvInteger with a constant activation zero point, int8 weight without zero point, strided/asymmetric pads."""
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             h.make_node("ConvInteger", ["xq", "w", "z"], ["c"], pads=[1, 0, 1, 2], strides=[2, 1]),
             h.make_node("Cast", ["c"], ["y"], to=T.FLOAT)]
    return model(nodes, {"w": W8, "s": np.float32(0.05), "z": np.int8(-3)}, X.shape, opset=13)


def dynamic_matmul_integer(per_column=True):
    b = RNG.integers(0, 256, (7, 5)).astype(np.uint8)
    bz = RNG.integers(0, 256, 5).astype(np.uint8) if per_column else np.uint8(128)
    nodes = [h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             h.make_node("MatMulInteger", ["xq", "b", "xz", "bz"], ["c"]),
             h.make_node("Cast", ["c"], ["cf"], to=T.FLOAT), h.make_node("Mul", ["cf", "xs"], ["y"])]
    return model(nodes, {"b": b, "bz": bz}, (2, 3, 7), opset=12)


def int8_matmul_integer(dynamic=True):
    """MatMulInteger with an int8 weight whose per-column zero points keep b - z_b in int8 (the int8 gemm
    path: K = 19, N = 37, rows from two leading dimensions), after DynamicQuantizeLinear's uint8 or a
    static int8 QuantizeLinear (the activation stored shifted by 128 on VNNI)."""
    b = RNG.integers(-100, 101, (19, 37)).astype(np.int8)
    bz = RNG.integers(-3, 4, 37).astype(np.int8)
    if dynamic:
        q = [h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"])]
        inits = {"b": b, "bz": bz}
    else:
        q = [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"])]
        inits = {"b": b, "bz": bz, "xs": np.float32(0.04), "xz": np.int8(-7)}
    nodes = q + [h.make_node("MatMulInteger", ["xq", "b", "xz", "bz"], ["c"]), h.make_node("Cast", ["c"], ["y"], to=T.FLOAT)]
    return model(nodes, inits, (2, 3, 19), opset=13)


def uint8_input_dequantize():
    """DequantizeLinear of a uint8 model input (no quantized type to take over): float formula."""
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])]
    return model(nodes, {"s": np.float32(0.02), "z": np.uint8(100)}, (2, 8), opset=13, x_type=T.UINT8)


def _feeds(m):
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    if m.graph.input[0].type.tensor_type.elem_type == T.UINT8:
        return {"x": RNG.integers(0, 256, shape).astype(np.uint8)}
    return {"x": (RNG.standard_normal(shape) * 3).astype(np.float32)}


def cases():
    """name -> (model, feeds)"""
    ms = {
        "qdq_conv_per_channel_u8": qdq_conv(),
        "qdq_conv_per_tensor_i8": qdq_conv(per_channel=False, act="int8"),
        "qdq_conv_no_zero_point_opset11": qdq_conv(opset=11, per_channel=False, zp=False),
        "qdq_conv_opset21": qdq_conv(opset=21),
        "dynamic_conv_integer_u8": dynamic_conv_integer(),
        "dynamic_conv_integer_i8_strided": dynamic_conv_integer(W8, np.int8(-2), strides=(2, 2)),
        "dynamic_conv_integer_grouped": dynamic_conv_integer(W8[:, :2], np.int8(0), group=2),
        "dynamic_conv_integer_grouped_u8": dynamic_conv_integer(WU8[:, :2], np.uint8(120), group=2),
        "dynamic_conv_integer_depthwise": dynamic_conv_integer(WU8[:4, :1], np.uint8(131), group=4),
        "dynamic_conv_integer_one_channel": dynamic_conv_integer(WU8[:, :1], np.uint8(140), channels=1),
        "static_conv_integer": static_conv_integer(),
        "dynamic_matmul_integer_per_column": dynamic_matmul_integer(),
        "dynamic_matmul_integer_scalar_zp": dynamic_matmul_integer(False),
        "dynamic_matmul_integer_int8_weight": int8_matmul_integer(),
        "static_matmul_integer_int8": int8_matmul_integer(dynamic=False),
        "uint8_input_dequantize": uint8_input_dequantize(),
    }
    return {k: (m, _feeds(m)) for k, m in ms.items()}


def ort_quantize_static(src: str, feeds: list[dict], out, qoperator: bool = False) -> str:
    """ONNX Runtime's own static quantization of the float model ``src`` on ``feeds``: quant_pre_process,
    then quantize_static (QDQ, or QOperator with ``qoperator``; per-channel int8 weights, uint8
    activations, MinMax); returns ``out``."""
    from pathlib import Path

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    out = Path(out)
    pre = out.with_name(out.stem + ".pre.onnx")
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)
    fmt = QuantFormat.QOperator if qoperator else QuantFormat.QDQ
    quantize_static(str(pre), str(out), Reader(), quant_format=fmt, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return str(out)
