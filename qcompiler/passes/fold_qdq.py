"""``fold-qdq``: a pre-quantized model's QuantizeLinear/DequantizeLinear groups become integer ops.

A QDQ model (ONNX Runtime's ``quantize_static``, PyTorch QAT, NVIDIA Model Optimizer, our own
``--export-qdq``) states its quantization as float ops between DequantizeLinear and
QuantizeLinear; the importer keeps each Q/DQ with its scale and zero point as the quantized type
(:mod:`qcompiler.frontend.onnx_qdq`). This pass maps each group onto the integer ops the
``quantize`` pass makes (:mod:`.quantize`), with the model's own parameters, never recalibrated
(TensorRT's "explicit quantization")::

    DQ(x_q) DQ(w_q) [DQ(b_q)] -> Conv [-> Relu|Clip|HardSwish] -> Q   =>   QLinearConv(x_q, w_q, b_q)
    DQ(x_q) DQ(w_q) [b] -> Gemm|MatMul [-> act] -> Q                  =>   QLinearGemm (MatMul of a
                                                                           rank-3 input: Reshape, QLinearGemm, Reshape)
    DQ(x_q) DQ(w_q) [b] -> Conv|Gemm|MatMul [{Relu|Clip}], no Q after =>   QLinearConv|QLinearGemm with a float32
                                                                           result (TensorRT-style Q/DQ on inputs
                                                                           only; our export of such a layer)
    DQ(a_q) DQ(b_q) -> Add|Mul [-> Relu|Clip] -> Q                    =>   QLinearAdd | QLinearMul
    DQ(x_q) -> GlobalAveragePool|AveragePool -> Q                     =>   QLinear(Global)AveragePool
    DQ(x_q) -> MaxPool|Reshape|Transpose|Slice|Pad|Relu|... -> Q      =>   the op on x_q (Requantize where
                                                                           the Q's params differ from x_q's)
    DQ(a_q) DQ(b_q) -> Concat -> Q                                    =>   Concat (Requantize per input)
    DQ(x_q) -> Q                                                      =>   Requantize (nothing when equal)

The arithmetic is the quantize pass's: with r = s (q - z) on every quantized value,

    acc[o] = Σ (x_q - z_x) w_q[o] + b_q[o],   y_q[o] = clamp(z_y + M[o] acc[o]),   M[o] = s_x s_w[o] / s_y

in fixed point (:mod:`qcompiler.quant.requant`). ONNX Runtime fuses the same groups into its
integer kernels with a float32 multiplier, so the two agree up to a rounding at .5 (1 LSB).
The bias is used as the model stores it when its scale is s_x s_w (ONNX Runtime's quantizer
writes exactly that); otherwise (or a float bias) it is re-expressed at s_x s_w, rounded half to
even. A Gemm's alpha scales s_w (the real weights are alpha s_w w_q) and its beta the bias. int8
weights need zero point 0; uint8 weights with zero point 128 (what ``--qdq-weights uint8``
writes) are the int8 weights w - 128. A weight of another zero point, 16-bit storage, a
per-channel activation, or an op between DQ and Q with no integer kernel (Softmax, LayerNorm,
Gelu, a MatMul of two activations, ...) stays float: the report names each such layer and why,
and the Q/DQ around it run as element-wise kernels, so the artifact still computes the model's
own quantization. DQ/Q of constants left (the weights of a float layer) become float constants
(:mod:`.dequantize_weights`).

The quantize pass's docstring example as a QDQ model (its Relu could as well be left to the
QuantizeLinear's zero point 0, as ONNX Runtime's quantizer does) folds to that pass's own result
(M = s_x s_w / s_y = 1442928868 * 2^-38).

Before::

    graph @g(%x: tensor<1x4xf32>) {
      %w_q = const dense<[63, -127, 32, 0, 127, 63, -63, 32]> : tensor<2x4x!quant.uniform<i8:f32:0, {0.007874017:0, 0.007874017:0}>>
      %x_q = QuantizeLinear(%x) : tensor<1x4x!quant.uniform<u8:f32, 0.007843138:127>>
      %x_d = DequantizeLinear(%x_q) : tensor<1x4xf32>
      %w_d = DequantizeLinear(%w_q) : tensor<2x4xf32>
      %z = Gemm(%x_d, %w_d) {alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<1x2xf32>
      %r = Relu(%z) : tensor<1x2xf32>
      %y_q = QuantizeLinear(%r) : tensor<1x2x!quant.uniform<u8:f32, 0.011764706:0>>
      %y = DequantizeLinear(%y_q) : tensor<1x2xf32>
      return %y
    }

After::

    graph @g(%x: tensor<1x4xf32>) {
      %w_q = const dense<[63, -127, 32, 0, 127, 63, -63, 32]> : tensor<2x4x!quant.uniform<i8:f32:0, {0.007874017:0, 0.007874017:0}>>
      %x_q = QuantizeLinear(%x) : tensor<1x4x!quant.uniform<u8:f32, 0.007843138:127>>
      %y_q = QLinearGemm(%x_q, %w_q) {activation = "Relu", activation_params = [], multiplier = [1442928868, 1442928868], shift = [38, 38]} : tensor<1x2x!quant.uniform<u8:f32, 0.011764706:0>>
      %y = DequantizeLinear(%y_q) : tensor<1x2xf32>
      return %y
    }

Float8 (opset 19 Q/DQ with float8e4m3fn / float8e5m2 zero points, e.g. NVIDIA Model Optimizer's
FP8 export): only the convs and gemms fold, into QLinearConv/QLinearGemm of float8 operands with a
float32 result and a float32 bias (the ``no Q after`` row; :mod:`qcompiler.quant.fp8`)::

    DQ(x_f8) DQ(w_f8) [b] -> Conv|Gemm|MatMul [{Relu|Clip}] [-> Q_f8]  =>  QLinearConv|QLinearGemm (float32) [-> Q_f8]

The QuantizeLinear after such a layer stays (a float8 kernel of its own, fused into the layer's
write-back by the code generator), and every other op between float8 Q and DQ stays float32
between them, as ONNX Runtime runs it: its results and ours then differ by the float32 rounding
of the sums (one float8 step where a value lands near a rounding boundary).

The folded op takes the float op's name and its result the QuantizeLinear's name, so a value of
the artifact is found in the given ONNX model under the same name (``qcompile verify --qdq``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.graph import Graph, Op, Value
from ..ir.ops import REGISTRY
from ..ir.types import FP8_MAX, QuantParams, dequantize, is_fp8, storage_range
from ..quant.hardswish import epilogue_attrs as hardswish_attrs
from ..quant.qparams import bias_params
from ..quant.requant import conv_multipliers, quantize_multiplier, quantize_multipliers
from ._common import is_output, single_use
from .dequantize_weights import dequantize_weights, quantized_constants
from .manager import PassContext, register_pass
from .quantize_plan import CONVS, GEMMS, KEEP_PARAMS, avgpool_decline, window_count
from .quantize_rewrite import qp_summary, requantize

ACTIVATION_STORAGE = ("uint8", "int8")       # what the integer kernels read and write
FOLDABLE_ACTS = ("Relu", "Clip")             # a standalone activation before the Q: the output clamp
SHAPE_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity")
"""Ops that only move values: DQ and Q commute with them (the importer's conv1d is Unsqueeze -> Conv -> Squeeze)."""
COMPUTE = CONVS + GEMMS + ("Add", "Mul")
FP8 = tuple(FP8_MAX)
INT32 = (-2 ** 31, 2 ** 31 - 1)


class Decline(Exception):
    """Why a group stays float (the report's reason)."""


def _f32(x) -> float:
    return float(np.float32(x))


def _moves(op: Op | None) -> bool:
    return op is not None and op.kind in SHAPE_OPS and len(op.operands) == 1 and len(op.results) == 1


class Folder:
    def __init__(self, graph: Graph):
        self.g = graph
        self.layers: dict[str, dict] = {}
        self.stands_for: dict[str, str] = {}      # integer value -> the float value of the model it encodes
        self.folded = 0

    # ---- operands ---------------------------------------------------------------------------
    def activation(self, v: Value, anchor: Op, fp8: bool = False) -> Value:
        """The quantized value behind operand ``v``: DequantizeLinear(x_q) (per tensor, 8-bit; with
        ``fp8`` also float8), or shape ops over one, then made again on x_q (before ``anchor``)."""
        chain = []
        while _moves(v.producer):
            chain.append(v.producer)
            v = v.producer.operands[0]
        dq = v.producer
        if dq is None or dq.kind != "DequantizeLinear":
            raise Decline(f"operand %{v.name} is float (no DequantizeLinear before it)")
        q = dq.operands[0]
        qp = q.type.quant
        if qp is None or qp.per_channel or not (qp.storage in ACTIVATION_STORAGE or fp8 and is_fp8(qp.storage)):
            raise Decline(f"operand %{v.name} is not quantized per tensor to uint8/int8"
                          + (" or float8" if fp8 else ""))
        for m in reversed(chain):
            q = self.g.create_op(m.kind, [q], dict(m.attrs), result_types=[m.result.type.with_quant(qp)],
                                 name=m.name + "_q", result_names=[m.result.name + "_q"], before=anchor).result
        return q

    def weight(self, v: Value, axis: int) -> tuple[np.ndarray, QuantParams]:
        """int8 data and params (zero point 0, per tensor or per ``axis``) of a DequantizeLinear'd
        constant, through shape ops that keep the output channels on axis 0."""
        from ..ir.interp import evaluate
        chain = []
        while _moves(v.producer) and v.shape[:1] == v.producer.operands[0].shape[:1] and axis == 0:
            chain.append(v.producer)
            v = v.producer.operands[0]
        dq = v.producer
        if dq is None or dq.kind != "DequantizeLinear" or not dq.operands[0].is_const:
            raise Decline("the weight is not a quantized constant")
        c = dq.operands[0]
        qp, data = c.type.quant, c.data
        if qp.per_channel and len(qp.scale) > 1 and qp.axis % c.type.rank != axis:
            raise Decline(f"the weight is quantized along axis {qp.axis}, not its output channels")
        storage = qp.storage if is_fp8(qp.storage) else "int8"
        if qp.storage == "uint8" and set(qp.zero_point) == {128}:
            data = (data.astype(np.int16) - 128).astype(np.int8)
        elif qp.storage != "int8" and not is_fp8(qp.storage) or any(qp.zero_point):
            raise Decline(f"{qp.storage} weights with zero point {qp.zero_point[0]} (the integer kernels "
                          "take int8 weights with zero point 0)")
        for m in reversed(chain):
            if m.kind == "Transpose" and list(m.attrs.get("perm") or [])[:1] != [0]:
                raise Decline("the weight's output channels are transposed")
            data = np.ascontiguousarray(evaluate(m, [data])[0])
        if qp.per_channel and len(qp.scale) > 1:
            return data, QuantParams(storage, qp.scale, (0,) * len(qp.scale), 0)
        return data, QuantParams(storage, qp.scale[:1], (0,))

    def bias(self, v: Value | None, xqp: QuantParams, wqp: QuantParams, n: int, beta: float = 1.0) -> Value | None:
        """The int32 bias at scale s_x s_w[o]: the model's own integers when it stores them so,
        else its real values re-expressed at that scale (rounded half to even)."""
        if v is None:
            return None
        if is_fp8(wqp.storage):                 # float8: the real values, as n float32
            real = np.broadcast_to(_bias_values(v).astype(np.float32).reshape(-1) * np.float32(beta), (n,))
            return self.g.add_const(np.ascontiguousarray(real, np.float32), (v.name if v.graph else "bias") + "_f")
        bqp = bias_params(xqp, wqp)
        dq = v.producer
        c = dq.operands[0] if not v.is_const and dq is not None and dq.kind == "DequantizeLinear" else None
        if (c is not None and c.is_const and beta == 1.0 and c.dtype == "int32" and c.data.size == n
                and not any(c.type.quant.zero_point) and c.type.quant.scale == bqp.scale):
            if c.shape == (n,) and c.type.quant == bqp:
                return c                          # the model's own constant
            return self.g.add_const(np.ascontiguousarray(c.data.reshape(n)), c.name, quant=bqp)
        real = np.broadcast_to(_bias_values(v).astype(np.float64).reshape(-1) * beta, (n,))
        step = np.broadcast_to(np.asarray(bqp.scale, np.float64), (n,))
        q = np.clip(np.round(real / step), *INT32).astype(np.int32)
        return self.g.add_const(q, (v.name if v.graph else "bias") + "_q", quant=bqp)

    # ---- the groups -------------------------------------------------------------------------
    def run(self) -> None:
        for q in list(self.g.ops):
            if q.graph is None or q.kind != "QuantizeLinear" or q.operands[0].is_const:
                continue
            y, qo = q.operands[0], q.result.type.quant
            op = y.producer
            if op is None or op.kind == "QuantizeLinear":
                continue
            if is_fp8(qo.storage):
                continue          # float8: a conv/gemm returns float32 (run_float_results), its Q stays
            try:
                if qo.per_channel or qo.storage not in ACTIVATION_STORAGE:
                    raise Decline(f"its QuantizeLinear is not per tensor uint8/int8 ({qo.storage})")
                if not single_use(y):
                    raise Decline(f"%{y.name} is also used as a float value")
                self.fold(op, q)
                self.folded += 1
            except Decline as why:
                self.layers.setdefault(op.name, {"kind": op.kind, "precision": "float", "reason": str(why)})

    def record_float(self) -> None:
        """Every op left float that no Decline named: a float region (no Q/DQ around it)."""
        for op in self.g.ops:
            if op.kind not in ("QuantizeLinear", "DequantizeLinear") and not op.kind.startswith("QLinear") \
                    and op.kind != "Requantize" and op.name not in self.layers \
                    and not (op.results and op.results[0].type.quant is not None):
                self.layers[op.name] = {"kind": op.kind, "precision": "float", "reason": "float region"}

    def fold(self, op: Op, q: Op) -> None:
        """Fold the group that ends in ``q`` (whose operand ``op`` makes): [compute op] [activation]
        [shape op] -> q, or a value-preserving op, Concat, or a DequantizeLinear -> q."""
        qo = q.result.type.quant
        dead: list[Op] = []                   # erased once q is replaced, in this order
        post = None
        if _moves(op) and op.operands[0].producer is not None and single_use(op.operands[0]) \
                and op.operands[0].producer.kind in COMPUTE + FOLDABLE_ACTS:
            post, op = op, op.operands[0].producer
            dead.append(post)
        act, params = "", []
        if op.kind in FOLDABLE_ACTS and op.operands[0].producer is not None and single_use(op.operands[0]) \
                and op.operands[0].producer.kind in COMPUTE \
                and not op.operands[0].producer.attrs.get("activation"):
            act = op.kind
            params = [float(op.attrs.get("min", float("-inf"))), float(op.attrs.get("max", float("inf")))] \
                if act == "Clip" else []
            dead.append(op)
            op = op.operands[0].producer
        elif op.kind in COMPUTE and op.attrs.get("activation"):
            act, params = op.attrs["activation"], list(op.attrs.get("activation_params") or [])
        if post is not None and op.kind not in COMPUTE:
            raise Decline(f"{post.kind} after {op.kind}")
        dead.append(op)
        out_type = (post.operands[0].type if post is not None else q.result.type).with_quant(qo)
        if op.kind in CONVS + GEMMS:
            new, out, info = self.linear(op, q, act, params, out_type)
        elif op.kind in ("Add", "Mul"):
            new, out, info = self.binary(op, q, act, params, out_type)
        elif op.kind in ("GlobalAveragePool", "AveragePool"):
            new, out, info = self.avgpool(op, q)
        elif op.kind in KEEP_PARAMS + ("GlobalMaxPool",) and len(op.results) == 1:
            new, out, info = self.keep(op, q)
        elif op.kind == "Concat":
            new, out, info = self.concat(op, q)
        elif op.kind == "DequantizeLinear":
            x = self.activation(op.result, q)
            new, out, info = None, self.requantized(x, qo, q, op.name), {"kind": "Requantize", "from": op.kind}
        else:
            raise Decline(f"no integer kernel for {op.kind}")
        if post is not None:
            out = self.g.create_op(post.kind, [out], dict(post.attrs), result_types=[q.result.type],
                                   name=post.name + "_q", result_names=[q.result.name + "_post"], before=q).result
        self.put(q, out, dead, new, {"output": qp_summary(qo), **info})

    def linear(self, op: Op, q: Op | None, act: str, params: list, out_type) -> tuple:
        """The QLinearConv/QLinearGemm of ``op`` requantized to ``q``'s params, or (``q`` None) with
        its float32 result."""
        g, qo = self.g, q.result.type.quant if q is not None else None
        anchor, rname = (q, q.result.name) if q is not None else (op, op.result.name)
        if len(op.operands) > 3:
            raise Decline("a residual operand fused into the conv")
        if act and act not in FOLDABLE_ACTS + ("HardSwish",):
            raise Decline(f"activation {act} between the {op.kind} and its QuantizeLinear has no integer epilogue")
        if act == "HardSwish" and params:
            raise Decline("a scaled HardSwish")
        b = op.operands[2] if len(op.operands) > 2 else None
        a = {**REGISTRY[op.kind].defaults, **op.attrs}
        if op.kind in CONVS:
            w, wqp = self.weight(op.operands[1], 0)
            x = self.activation(op.operands[0], q, fp8=q is None)
            if x.type.rank != 4:
                raise Decline("only 2-D convolutions (rank-4 input) are integer")
            kind, attrs = "QLinearConv", {k: op.attrs[k] for k in ("strides", "dilations", "pads", "group")
                                          if k in op.attrs}
            beta = 1.0
        else:
            if a.get("transA", 0):
                raise Decline("transA = 1")
            w_v = op.operands[1]
            n_axis = 0 if op.kind != "MatMul" and a["transB"] else 1
            if w_v.type.rank != 2:
                raise Decline("a MatMul of two activations (no integer kernel)" if not _dq_const(w_v)
                              else "the weight is not 2-D")
            w, wqp = self.weight(w_v, n_axis)
            if n_axis == 1:
                w = np.ascontiguousarray(w.T)
            if op.kind != "MatMul" and a["alpha"] != 1.0:
                wqp = QuantParams(wqp.storage, tuple(_f32(s * np.float32(a["alpha"])) for s in wqp.scale),
                                  wqp.zero_point, wqp.axis)
            beta = 1.0 if op.kind == "MatMul" else float(a["beta"])
            x = self.activation(op.operands[0], q, fp8=q is None)
            if x.type.rank < 2 or (x.type.rank > 2 and op.kind != "MatMul"):
                raise Decline(f"a rank-{x.type.rank} input")
            kind, attrs = "QLinearGemm", {}
        n = w.shape[0]
        if b is not None and int(np.prod(b.shape)) not in (1, n):
            raise Decline("the bias does not broadcast along the output channels only")
        xqp = x.type.quant
        if is_fp8(xqp.storage) != is_fp8(wqp.storage):
            raise Decline(f"a {xqp.storage} input with {wqp.storage} weights (float8 takes float8 with float8)")
        bq = self.bias(b, xqp, wqp, n, beta)
        try:
            if qo is None:
                attrs.update(multiplier=[], shift=[])
            elif act == "HardSwish":
                attrs.update(hardswish_attrs(xqp.scale[0], wqp.scale, qo, [], n))
            else:
                ms, ss = conv_multipliers(xqp.scale[0], wqp.scale, qo.scale[0])
                attrs.update(multiplier=ms, shift=ss)
        except ValueError as e:
            raise Decline(str(e)) from None
        attrs.update(activation=act, activation_params=params)
        c = _dq_const(op.operands[1])
        wv = c if c.data is w and c.type.quant == wqp else g.add_const(w, c.name, quant=wqp)
        operands = [x, wv] + ([bq] if bq is not None else [])
        info = {"kind": kind, "from": op.kind, "input": qp_summary(xqp),
                "weight": {"per_channel": wqp.per_channel, "channels": len(wqp.scale) if wqp.per_channel else 1,
                           "scale_min": min(wqp.scale), "scale_max": max(wqp.scale)}}
        if kind == "QLinearGemm" and x.type.rank > 2:        # rows of every leading index: one GEMM
            lead = x.shape[:-1]
            m = int(np.prod(lead))
            operands[0] = g.create_op("Reshape", [x], {"shape": [m, x.shape[-1]]},
                                      result_types=[x.type.with_shape((m, x.shape[-1])).with_quant(xqp)],
                                      name=op.name + "/rows", result_names=[x.name + "_rows"], before=anchor).result
            new = g.create_op(kind, operands, attrs, result_types=[out_type.with_shape((m, n)).with_quant(qo)],
                              name=op.name + "_q", result_names=[rname + "_rows"], before=anchor)
            back = g.create_op("Reshape", [new.result], {"shape": list(lead) + [n]}, result_types=[out_type],
                               name=op.name + "/unrows", result_names=[rname + "_gemm"], before=anchor)
            return new, back.result, info
        new = g.create_op(kind, operands, attrs, result_types=[out_type], name=op.name + "_q",
                          result_names=[rname + "_new"], before=anchor)
        return new, new.result, info

    def run_float_results(self) -> None:
        """A Conv/Gemm/MatMul of a DequantizeLinear'd activation by a DequantizeLinear'd constant
        whose result no QuantizeLinear takes (TensorRT's explicit quantization puts Q/DQ on the inputs
        of a layer only; our own export of a conv/GEMM that returns float32): QLinearConv/QLinearGemm
        with a float32 result."""
        for op in list(self.g.ops):
            if op.graph is None or op.kind not in CONVS + GEMMS or op.name in self.layers \
                    or op.result.type.quant is not None:
                continue
            x = op.operands[0]
            while _moves(x.producer):
                x = x.producer.operands[0]
            if x.producer is None or x.producer.kind != "DequantizeLinear" or _dq_const(op.operands[1]) is None:
                continue
            act = op.attrs.get("activation") or ""
            params = list(op.attrs.get("activation_params") or [])
            try:
                if act not in FOLDABLE_ACTS + ("",):
                    raise Decline(f"activation {act} has no float32 epilogue")
                new, out, info = self.linear(op, None, act, params, op.result.type)
            except Decline as why:
                self.layers.setdefault(op.name, {"kind": op.kind, "precision": "float", "reason": str(why)})
                continue
            name, rname = op.name, op.result.name
            op.result.replace_all_uses_with(out)
            self.g.erase_op(op)
            self.g.rename_op(new, name)
            if not self.g.has_value(rname):
                self.g.rename(out, rname)
            self.layers[name] = {"precision": "fp8" if is_fp8(info["input"]["dtype"]) else "int8", **info,
                                 "output": {"dtype": "float32"}}
            self.folded += 1

    def binary(self, op: Op, q: Op, act: str, params: list, out_type) -> tuple:
        qo = q.result.type.quant
        if act and act not in FOLDABLE_ACTS:
            raise Decline(f"activation {act} between the {op.kind} and its QuantizeLinear")
        a, b = (self.activation(v, q) for v in op.operands)
        sa, sb, sy = _f32(a.type.quant.scale[0]), _f32(b.type.quant.scale[0]), _f32(qo.scale[0])
        try:
            if op.kind == "Add":
                ms, s = quantize_multipliers([sa / sy, sb / sy])
                attrs = {"multiplier": ms, "shift": [s]}
            else:
                m, s = quantize_multiplier(sa * sb / sy)
                attrs = {"multiplier": [m], "shift": [s]}
        except ValueError as e:
            raise Decline(str(e)) from None
        attrs.update(activation=act, activation_params=params)
        kind = "QLinear" + op.kind
        new = self.g.create_op(kind, [a, b], attrs, result_types=[out_type], name=op.name + "_q",
                               result_names=[q.result.name + "_new"], before=q)
        return new, new.result, {"kind": kind, "from": op.kind,
                                 "inputs": [qp_summary(a.type.quant), qp_summary(b.type.quant)]}

    def avgpool(self, op: Op, q: Op) -> tuple:
        qo = q.result.type.quant
        x = self.activation(op.operands[0], q)
        why = avgpool_decline(op)
        if why:
            raise Decline(why)
        try:
            m, s = quantize_multiplier(x.type.quant.scale[0] / (qo.scale[0] * window_count(op, x.shape)))
        except ValueError as e:
            raise Decline(str(e)) from None
        kind = "QLinear" + op.kind
        new = self.g.create_op(kind, [x], {**op.attrs, "multiplier": [m], "shift": [s]},
                               result_types=[q.result.type], name=op.name + "_q",
                               result_names=[q.result.name + "_new"], before=q)
        return new, new.result, {"kind": kind, "from": op.kind, "input": qp_summary(x.type.quant)}

    def keep(self, op: Op, q: Op) -> tuple:
        """A value-preserving op on the stored integers, in its input's params, then Requantize."""
        qo = q.result.type.quant
        if any(not v.is_const for v in op.operands[1:]):
            raise Decline(f"{op.kind} with a computed operand")
        x = self.activation(op.operands[0], q)
        if op.kind == "Pad":
            if op.attrs.get("mode", "constant") != "constant":
                raise Decline("only constant padding is integer")
            if float(op.attrs.get("value", 0.0) or 0.0) != 0.0 and x.type.quant != qo:
                raise Decline("a non-zero pad value with different params on both sides")
        new = self.g.create_op(op.kind, [x] + list(op.operands[1:]), dict(op.attrs),
                               result_types=[op.result.type.with_quant(x.type.quant)], name=op.name + "_q",
                               result_names=[q.result.name + "_keep"], before=q)
        return new, self.requantized(new.result, qo, q, op.name), {"kind": op.kind, "from": op.kind}

    def concat(self, op: Op, q: Op) -> tuple:
        qo = q.result.type.quant
        xs = [self.requantized(self.activation(v, q), qo, q, v.name) for v in op.operands]
        new = self.g.create_op("Concat", xs, dict(op.attrs), result_types=[q.result.type], name=op.name + "_q",
                               result_names=[q.result.name + "_new"], before=q)
        return new, new.result, {"kind": "Concat", "from": "Concat"}

    def requantized(self, x: Value, qp: QuantParams, anchor: Op, hint: str) -> Value:
        if x.type.quant == qp:
            return x
        try:
            return requantize(self.g, x, qp, hint, anchor)
        except ValueError as e:
            raise Decline(str(e)) from None

    # ---- the rewrite ------------------------------------------------------------------------
    def put(self, q: Op, out: Value, dead: list[Op], new: Op | None, info: dict) -> None:
        """``out`` replaces ``q``'s result; the float ops ``dead`` go; ``new`` takes the compute op's name."""
        g, name, qname, fname = self.g, dead[-1].name, q.result.name, q.operands[0].name
        q.result.replace_all_uses_with(out)
        g.erase_op(q)
        for d in dead:                      # a DequantizeLinear may have other users still
            if d.graph is not None and not any(r.uses or is_output(r) for r in d.results):
                g.erase_op(d)
        if new is not None and new.graph is g:
            g.rename_op(new, name)
        if not g.has_value(qname):
            g.rename(out, qname)
        self.layers[name] = {"precision": "int8", **info}
        self.stands_for[out.name] = fname

    def sweep(self) -> int:
        """Erase the Q/DQ and shape ops left without users (the float ops a fold replaced)."""
        n, changed = 0, True
        while changed:
            changed = False
            for op in reversed(self.g.ops):
                if op.kind in ("QuantizeLinear", "DequantizeLinear") + SHAPE_OPS \
                        and not op.result.uses and not is_output(op.result):
                    self.g.erase_op(op)
                    n += 1
                    changed = True
        self.g.remove_unused_consts()
        return n


def _bias_values(v: Value) -> np.ndarray:
    """The real values of a conv/gemm's bias: a float constant, or DequantizeLinear of a quantized one."""
    dq = v.producer
    if v.is_const:
        return v.data
    if dq is not None and dq.kind == "DequantizeLinear" and dq.operands[0].is_const:
        return dequantize(dq.operands[0].data, dq.operands[0].type.quant)
    raise Decline("the bias is not constant")


def _dq_const(v: Value) -> Value | None:
    """The quantized constant behind ``v`` (DequantizeLinear of it, through shape ops), or None."""
    while _moves(v.producer):
        v = v.producer.operands[0]
    dq = v.producer
    return dq.operands[0] if dq is not None and dq.kind == "DequantizeLinear" and dq.operands[0].is_const else None


def _scheme(graph: Graph) -> dict[str, Any]:
    acts = sorted({r.type.quant.storage for op in graph.ops for r in op.results if r.type.quant is not None})
    w = [v.type.quant for v in graph.consts.values() if v.type.quant is not None and v.dtype in ("int8",) + FP8]
    kinds = "/".join(sorted({p.storage for p in w}))
    return {"source": "the model's own QuantizeLinear/DequantizeLinear (fold-qdq)",
            "activations": "/".join(acts) + " per tensor" if acts else "none",
            "weights": kinds + " " + ("per channel" if any(p.per_channel for p in w) else "per tensor") if w else "none",
            "bias": "float32" if w and all(is_fp8(p.storage) for p in w) else "int32"}


def float_reference(graph: Graph) -> Graph:
    """The float model a QDQ model stands for (what the build report measures the imported scales
    against): a copy in which every QuantizeLinear -> DequantizeLinear of an activation is a Clip
    to the range of its grid, s (q_min - z) .. s (q_max - z), and the weights are dequantized. The
    Clip keeps the saturation, which is part of the model: ONNX Runtime's quantizer drops a ReLU
    or ReLU6 whose range the QuantizeLinear enforces (fashion_mobilenet's 17 ReLU6). The rounding
    is what the report's per-layer SQNR then measures."""
    g = graph.clone()
    for dq in g.ops:
        q = dq.operands[0].producer if dq.kind == "DequantizeLinear" else None
        if q is not None and q.kind == "QuantizeLinear" and not q.operands[0].is_const:
            qp = q.result.type.quant
            lo, hi = storage_range(qp.storage)
            if qp.per_channel:
                ranged = q.operands[0]          # per-axis activations: no single range; kept unclamped
            else:
                s, z = float(np.float32(qp.scale[0])), qp.zero_point[0]
                ranged = g.create_op("Clip", [q.operands[0]], {"min": s * (lo - z), "max": s * (hi - z)},
                                       name=dq.name + "/range", result_names=[dq.result.name + "_range"],
                                       before=dq).result
            dq.result.replace_all_uses_with(ranged)
            g.erase_op(dq)
    for q in reversed(g.ops):
        if q.kind == "QuantizeLinear" and not q.result.uses and not is_output(q.result):
            g.erase_op(q)
    dequantize_weights(g, PassContext())
    return g


@register_pass("fold-qdq")
def fold_qdq(graph: Graph, ctx: PassContext) -> bool:
    """Map a pre-quantized model's Q/DQ groups onto integer QLinear ops with the model's own scales;
    what has no integer kernel stays float between its Q/DQ."""
    quantized_constants(graph)              # Q(w) of a float weight (QAT exports): the int8 constant
    ctx.data["quantize.float_graph"] = float_reference(graph)
    f = Folder(graph)
    f.run()
    f.run_float_results()
    f.sweep()
    f.record_float()
    dequantize_weights(graph, ctx)          # DQ/Q of constants left: a float layer's weights
    graph.meta["quant"] = {"scheme": _scheme(graph), "layers": f.layers, "float_values": f.stands_for}
    n_int = sum(1 for v in f.layers.values() if v["precision"] != "float")
    ctx.log(f"fold-qdq: {n_int} ops integer, {len(f.layers) - n_int} float")
    return f.folded > 0
