"""The quantize pass, step 4 (see :mod:`.quantize`): ``Rewriter`` rewrites the planned ops into
QLinear ops with their quantized weights, int32 biases and fixed-point multipliers, inserts the
QuantizeLinear/DequantizeLinear at the float boundaries, and records each layer for
``graph.meta["quant"]``.

    rw = Rewriter(graph, plan, P, ranges, opts, means, rounding=rounding)
    rw.run()                               # rw.layers: name -> kind, precision, params, range

``rounding``: a :class:`~qcompiler.quant.gptq.GptqRounding` (``--weight-rounding gptq``): the
weights of the layers it holds Gram matrices for rounded by GPTQ onto the same grid (same scales)
as round-to-nearest's; the bias correction then corrects the mean error of those weights.

``weights``: a dict shared by the rewrites of clones of one graph with the same options and means
(the mixed-precision variants of :class:`~qcompiler.plan.sensitivity.Sensitivity`): a conv/gemm's
integer weight, bias and multipliers depend only on the op, its input and output params and the
means, so they are computed once per (op, params), not once per variant.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir.graph import Graph, Op, Value
from ..ir.types import QuantParams, quantize
from ..quant import fp8 as fp8q
from ..quant import qparams as qpm
from ..quant.hardswish import epilogue_attrs as hardswish_attrs
from ..quant.qparams import f32_at_least
from ..quant.requant import conv_multipliers, quantize_multiplier, quantize_multipliers
from ._common import is_output
from .bias_correct import empirical_error
from .quantize_plan import CONVS, GEMMS, Plan, gemm_weight_bias, window_count

if TYPE_CHECKING:
    from ..quant.gptq import GptqRounding
    from .quantize import QuantizeOptions

BIAS_LIMIT = 2 ** 30      # |b_q| bound: leaves 2^30 of int32 headroom for the products


class Rewriter:
    def __init__(self, graph: Graph, plan: Plan, P: dict, ranges: dict, opts: QuantizeOptions,
                 means: dict | None = None, weights: dict | None = None, rounding: GptqRounding | None = None):
        self.g, self.p, self.P, self.ranges, self.opts = graph, plan, P, ranges, opts
        self.rounding = rounding
        self.weights = weights                      # a cache shared by rewrites of one graph's clones (see linear)
        self.means = means or {}                    # Conv/Gemm name -> its input averaged over the calibration data
        self.qv: dict[Value, Value] = {}            # float value (or its DequantizeLinear) -> quantized
        self.dqs: list[Op] = []
        self.layers: dict[str, dict] = {}
        self.stands_for: dict[Value, str] = {}      # quantized value -> name of the float value it encodes

    def qval(self, v: Value, anchor: Op) -> Value:
        """The quantized form of float value ``v``: known, a quantized constant, or a new Q op."""
        if v in self.qv:
            return self.qv[v]
        qp = self.P[v]
        if v.is_const:
            q = self.g.add_const(quantize(v.data, qp), v.name + "_q", quant=qp)
        else:
            q = self.g.create_op("QuantizeLinear", [v], result_types=[v.type.with_quant(qp)],
                                 name="quantize_" + v.name, result_names=[v.name + "_q"], before=anchor).result
            self.stands_for[q] = v.name
        self.qv[v] = q
        return q

    def replace(self, op: Op, kind: str, operands: list[Value], attrs: dict, out: Value, qp: QuantParams | None) -> Op:
        """Put ``kind`` in place of ``op`` (and a folded activation); float users get a DQ (``qp``
        None: the new op's result is float32 and takes ``out``'s place)."""
        g, name, out_name = self.g, op.name, out.name
        new = g.create_op(kind, operands, attrs, result_types=[out.type if qp is None else out.type.with_quant(qp)],
                          name=name + "_q", result_names=[out_name + ("_f" if qp is None else "_q")], before=op)
        q = new.result
        if qp is None:
            out.replace_all_uses_with(q)
            if out in self.P:               # float8: the next conv quantizes this float32 result
                self.P[q] = self.P[out]
        else:
            self.stands_for[q] = out_name
        if qp is not None and (out.uses or is_output(out)):
            dq = g.create_op("DequantizeLinear", [q], name="dequantize_" + out_name,
                             result_names=[out_name + "_dq"], after=new)
            self.dqs.append(dq)
            out.replace_all_uses_with(dq.result)
            self.qv[dq.result] = q
        if op in self.p.fold:
            g.erase_op(self.p.fold[op])
            for extra in self.p.absorbed.get(op, []):
                g.erase_op(extra)
        g.erase_op(op)
        g.rename_op(new, name)
        if not g.has_value(out_name):
            g.rename(q, out_name)
        return new

    def run(self) -> None:
        for op in self.g.ops:
            role = self.p.role.get(op)
            if role == "fold" or op.graph is None:
                continue
            if role == "compute":
                self.compute(op)
            elif role == "keep":
                x = self.qval(op.operands[0], op)
                new = self.replace(op, op.kind, [x], dict(op.attrs), op.result, self.P[op.result])
                self.layers[new.name] = {"kind": op.kind, "precision": self.opts.precision,
                                         "output": qp_summary(self.P[op.result])}
            elif role == "concat":
                self.concat(op)
            else:
                self.layers[op.name] = {"kind": op.kind, "precision": "float", "reason": self.p.why.get(op, "")}
        for dq in self.dqs:
            if dq.graph is not None and not dq.result.uses and not is_output(dq.result):
                self.g.erase_op(dq)
        self.g.remove_unused_consts()

    def compute(self, op: Op) -> None:
        out = self.p.out[op]
        qo = None if op in self.p.float_out else self.P[out]
        act, params = "", []
        if op in self.p.fold:
            f = self.p.fold[op]
            act = f.kind if f.kind != "Mul" else "HardSwish"    # Mul: the scaled HardSwish's last op
            params = [float(f.attrs.get("min", float("-inf"))), float(f.attrs.get("max", float("inf")))] \
                if act == "Clip" else list(self.p.gate.get(op, []))
        elif op.attrs.get("activation"):
            act, params = op.attrs["activation"], list(op.attrs.get("activation_params") or [])
        info: dict[str, Any] = {"from": op.kind}
        if op.kind in CONVS + GEMMS:
            kind, operands, attrs = self.linear(op, info)
            attrs.update(activation=act, activation_params=params)
            if act == "HardSwish":                              # one quantization point: the epilogue
                wq = operands[1].type.quant
                attrs.update(hardswish_attrs(operands[0].type.quant.scale[0], wq.scale, qo, params,
                                             operands[1].shape[0]))
                info["hardswish"] = "scaled (equalized)" if params else "fused"
        elif op.kind == "Add":
            a, b = (self.qval(v, op) for v in op.operands)
            ms, s = quantize_multipliers([a.type.quant.scale[0] / qo.scale[0], b.type.quant.scale[0] / qo.scale[0]])
            kind, operands = "QLinearAdd", [a, b]
            attrs = {"activation": act, "activation_params": params, "multiplier": ms, "shift": [s]}
            info["inputs"] = [qp_summary(a.type.quant), qp_summary(b.type.quant)]
        elif op.kind == "Mul":                                  # y = a b: M = s_a s_b / s_y
            a, b = (self.qval(v, op) for v in op.operands)
            sa, sb = (float(np.float32(v.type.quant.scale[0])) for v in (a, b))
            m, s = quantize_multiplier(sa * sb / float(np.float32(qo.scale[0])))
            kind, operands = "QLinearMul", [a, b]
            attrs = {"activation": act, "activation_params": params, "multiplier": [m], "shift": [s]}
            info["inputs"] = [qp_summary(a.type.quant), qp_summary(b.type.quant)]
        else:                                                   # GlobalAveragePool, AveragePool
            x = self.qval(op.operands[0], op)
            m, s = quantize_multiplier(x.type.quant.scale[0] / (qo.scale[0] * window_count(op, x.shape)))
            kind, operands = "QLinear" + op.kind, [x]
            attrs = {k: v for k, v in op.attrs.items()}
            attrs.update(multiplier=[m], shift=[s])
            info["input"] = qp_summary(x.type.quant)
        rng = list(self.ranges.get(out.name, ()))
        new = self.replace(op, kind, operands, attrs, out, qo)
        self.layers[new.name] = {"kind": kind, "precision": self.opts.precision, **info,
                                 "output": qp_summary(qo) if qo is not None else {"dtype": "float32"},
                                 "range": rng, "method": self.opts.method}

    def linear(self, op: Op, info: dict) -> tuple[str, list[Value], dict]:
        """QLinearConv / QLinearGemm operands: quantized input, int8 weight, int32 bias."""
        x = self.qval(op.operands[0], op)
        qo = None if op in self.p.float_out else self.P[self.p.out[op]]
        key = (op.name, x.type.quant, qo, op.name in self.means)
        parts = self.weights.get(key) if self.weights is not None else None
        if parts is None:
            parts = self._linear_parts(op, x.type.quant, qo)
            if self.weights is not None:
                self.weights[key] = parts
        kind, attrs, (w_q, wqp), bias, extra = parts
        operands = [x, self.g.add_const(w_q, op.operands[1].name + "_q", quant=wqp)]
        if bias is not None:
            bname = op.operands[2].name if len(op.operands) >= 3 else op.name + "_bias"
            operands.append(self.g.add_const(bias[0], bname + "_q", quant=bias[1]))
        info.update({k: dict(v) if isinstance(v, dict) else v for k, v in extra.items()})
        return kind, operands, dict(attrs)

    def _linear_parts(self, op: Op, xqp: QuantParams, qo: QuantParams | None):
        """(kind, attrs, (int8 weight, its params), (int32 bias, its params) or None, report info)
        of a conv/gemm with input params ``xqp`` and output params ``qo`` (None: float result)."""
        info: dict[str, Any] = {}
        if op.kind in CONVS:
            kind = "QLinearConv"
            attrs = {k: op.attrs[k] for k in ("strides", "dilations", "pads", "group") if k in op.attrs}
            w = op.operands[1].data.astype(np.float32)
            b = op.operands[2].data.astype(np.float32) if len(op.operands) >= 3 else None
        else:
            kind, attrs = "QLinearGemm", {}
            w, b = gemm_weight_bias(op)                        # stored N x K
        fp8 = self.opts.fp8_storage
        if fp8 is not None:
            wqp = fp8q.per_channel_fp8(w, 0, fp8) if self.opts.per_channel else \
                fp8q.fp8_params(float(w.min()), float(w.max()), fp8)
        else:
            wqp = qpm.per_channel_symmetric(w, 0) if self.opts.per_channel else qpm.symmetric(float(w.min()), float(w.max()))
        w_grid = w                                             # the values to store (GPTQ's: on wqp's grid)
        if self.rounding is not None:
            w_hat, rounding = self.rounding.weights(op, w, wqp)
            if w_hat is not None:
                w_grid = w_hat
                info["rounding"] = dict(rounding)
        if op.name in self.means:
            eps = qpm.fake_quantize(w_grid, wqp).astype(np.float64) - w.astype(np.float64)
            err = empirical_error(op, eps, self.means[op.name])
            b = ((np.zeros(w.shape[0]) if b is None else b.astype(np.float64)) - err).astype(np.float32)
            info["bias_correction"] = float(np.max(np.abs(err)))
        if b is not None and fp8 is None:
            wqp, widened = _fit_bias(wqp, xqp.scale[0], b)
            if widened:
                info["bias_widened_channels"] = widened
        bias = None
        if b is not None and fp8 is not None:                   # float8: a float32 bias after the scale
            bias = (np.ascontiguousarray(b.astype(np.float32).reshape(-1)), None)
        elif b is not None:
            bqp = qpm.bias_params(xqp, wqp)
            bias = (quantize(b, bqp), bqp)
        if qo is None:                                          # float32 result: f32(acc) * s_x s_w
            attrs.update(multiplier=[], shift=[])
        else:
            ms, ss = conv_multipliers(xqp.scale[0], wqp.scale, qo.scale[0])
            attrs.update(multiplier=ms, shift=ss)
        info["input"] = qp_summary(xqp)
        info["weight"] = {"per_channel": wqp.per_channel, "channels": int(w.shape[0]),
                          "scale_min": min(wqp.scale), "scale_max": max(wqp.scale)}
        return kind, attrs, (quantize(w_grid, wqp), wqp), bias, info

    def concat(self, op: Op) -> None:
        qo = self.P[op.result]
        operands = []
        for v in op.operands:
            q = self.qval(v, op)
            if q.type.quant != qo:
                q = requantize(self.g, q, qo, v.name, op)
                self.stands_for[q] = v.name
            operands.append(q)
        rng = list(self.ranges.get(op.result.name, ()))
        new = self.replace(op, "Concat", operands, dict(op.attrs), op.result, qo)
        self.layers[new.name] = {"kind": "Concat", "precision": self.opts.precision, "output": qp_summary(qo),
                                 "range": rng, "method": self.opts.method}


def _fit_bias(wqp: QuantParams, s_x: float, b: np.ndarray) -> tuple[QuantParams, int]:
    """Widen weight scales where the int32 bias b / (s_x s_w) would exceed BIAS_LIMIT (a channel
    with tiny weights and a large folded-BN bias): s_w >= |b| / (s_x BIAS_LIMIT)."""
    need = np.abs(b.astype(np.float64)) / (float(s_x) * BIAS_LIMIT)
    if not wqp.per_channel:
        need = np.array([need.max()])
    scales = np.array(wqp.scale, np.float64)
    bad = need > scales
    if not bad.any():
        return wqp, 0
    new = [f32_at_least(max(s, n)) for s, n in zip(scales, need)]
    return QuantParams(wqp.storage, tuple(new), wqp.zero_point, wqp.axis), int(bad.sum())


def requantize(g: Graph, q: Value, qp: QuantParams, hint: str, before: Op) -> Value:
    """``Requantize(q)`` into ``qp`` (M = s_in / s_out), inserted before ``before``; raises
    ValueError for a multiplier the fixed point cannot hold."""
    m, s = quantize_multiplier(q.type.quant.scale[0] / qp.scale[0])
    return g.create_op("Requantize", [q], {"multiplier": [m], "shift": [s]}, result_types=[q.type.with_quant(qp)],
                       name="requantize_" + hint, result_names=[hint + "_rq"], before=before).result


def qp_summary(qp: QuantParams) -> dict:
    return {"dtype": qp.storage, "scale": qp.scale[0], "zero_point": qp.zero_point[0]}
