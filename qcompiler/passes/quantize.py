"""``quantize``: post-training static quantization to integer-only ops.

Runs after the default pipeline (BatchNorm folded, activations fused into FusedConv/FusedGemm);
not part of it. Activations become asymmetric uint8 (or int8, or symmetric int8 for TensorRT),
weights symmetric int8 per output channel (or per tensor), biases int32. A real value r is stored as q with r = s (q - z), so a conv

    y[o] = Σ x * w[o] + b[o]  ≈  s_x s_w[o] (Σ (x_q - z_x) w_q[o] + b_q[o]) = s_x s_w[o] acc[o]
    y_q[o] = z_y + M[o] acc[o],   M[o] = s_x s_w[o] / s_y   (fixed point: qcompiler.quant.requant)

with b_q = round(b' / (s_x s_w[o])) in int32, where b' is the bias corrected for the mean error of the
int8 weights (``bias_correction``, on by default with calibration data; Nagel et al., *Data-Free
Quantization Through Weight Equalization and Bias Correction*, ICCV 2019, §5, the empirical variant)::

    b'[o] = b[o] - mean over output positions of (ε ⊛ x̄)[o],   ε = dequant(W_q) - W,  x̄ = E[x]

x̄ is the layer input averaged over the calibration data (spatial positions kept, so taps reading the
zero padding count as 0). Rounding the weights shifts each output channel's mean by that amount,
and the later layers amplify the shift; the correction removes it in expectation. It is kept only
where it lowers the error of the graph outputs on the calibration data (both versions run by the
reference interpreter; :func:`_bias_correction_helps`: it cost uspsnet 0.11 dB), recorded in
``graph.meta["quant"]["scheme"]["bias_correction"]``. The float graph itself is not changed (unlike the ``bias-correct`` pass, whose helpers this reuses). Steps:

1. prepare: what an integer kernel cannot fuse is split off: FusedConv(X, W, B, Z) becomes
   FusedConv(X, W, B) -> Add(., Z) -> activation, and activations other than Relu/Clip/HardSwish
   (Sigmoid, LeakyRelu, ...) become standalone ops that stay float.
2. plan, in topological order (``keep_float`` names or kinds stay float):

   ===============================================  =========================================
   float op                                         becomes
   ===============================================  =========================================
   Conv, FusedConv (act "", Relu, Clip), const W/B  QLinearConv (rank-4 input)
   FusedConv/FusedGemm act HardSwish, or a          QLinearConv/QLinearGemm with activation
   Conv/Gemm whose output z feeds only              "HardSwish": a float32 epilogue with ONE
   z·HardSigmoid(S·z) (equalize's form, S > 0)      quantization point (qcompiler.quant.hardswish)
   HardSwish after a QLinear conv/gemm (one use)    the same epilogue
   Gemm, FusedGemm, MatMul with const W             QLinearGemm (2-D input, transA = 0, bias
                                                    with N elements; W stored N x K)
   Add                                              QLinearAdd, when an operand is quantized
   Mul of two activations                           QLinearMul, when an operand is quantized (the
                                                    other, e.g. a squeeze-excite gate from
                                                    HardSigmoid, gets a QuantizeLinear);
                                                    y_q = z_y + rrs((a_q-z_a)(b_q-z_b) m, s)
   Relu, Clip after a QLinear op (single use)       folded into its output clamp
   GlobalAveragePool / AveragePool                  QLinear... (input quantized; constant count)
   MaxPool, GlobalMaxPool, Reshape, Flatten,        the same op on the quantized value, with the
   Transpose, Squeeze, Unsqueeze, Slice, Pad,       input's params (Pad pads with the zero point)
   Relu, Clip
   Concat                                           Concat of quantized values sharing the output's
                                                    params (Requantize where an input differs and
                                                    its producer cannot emit them directly)
   anything else (Softmax, Sigmoid, ...)            float, DequantizeLinear before it and
                                                    QuantizeLinear after it where needed
   ===============================================  =========================================

3. calibrate: one :func:`~qcompiler.quant.calibrate.collect_ranges` pass of the float graph over
   the data, for every value whose range sets params (QLinear outputs, Concat outputs, float values
   entering quantized ops); ``ranges`` given in the options take precedence. With calibration data
   and ``bias_correction``, a second pass over it averages the inputs of the Conv/Gemm layers (its
   outputs kept as the fp32 reference), and
   a third runs the quantized graph with and without the correction to decide whether to keep it.
4. rewrite, recording per layer in ``graph.meta["quant"]`` (JSON): kind, precision, params, range,
   and in ``graph.meta["quant"]["float_values"]`` which float value each quantized value stands for
   (``{"conv_out": "conv_out", "x_q": "x", "a_rq": "a"}``), named as in the float graph after step 1.
   That float graph is kept in ``ctx.data["quantize.float_graph"]`` (a clone sharing the constant
   arrays): the build report (:mod:`qcompiler.quant.report`) evaluates it as the fp32 reference, in
   which every split-off value (``y_acc`` of a fused residual block) has its fp32 counterpart.

Before (with ``ranges={"x": (-1, 1), "y": (0, 3)}`` in the options instead of calibration data)::

    graph @g(%x: tensor<1x4xf32>) {
      %w = const dense<[0.5, -1.0, 0.25, 0.0, 1.0, 0.5, -0.5, 0.25]> : tensor<2x4xf32>
      %y = FusedGemm(%x, %w) {activation = "Relu", activation_params = [], alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<1x2xf32>
      return %y
    }

After (x: 2/255 per step around 127; y: 3/255 from 0; M = s_x s_w / s_y = 1442928868 * 2^-38)::

    graph @g(%x: tensor<1x4xf32>) {
      %w_q = const dense<[63, -127, 32, 0, 127, 63, -63, 32]> : tensor<2x4x!quant.uniform<i8:f32:0, {0.007874017:0, 0.007874017:0}>>
      %x_q = QuantizeLinear(%x) : tensor<1x4x!quant.uniform<u8:f32, 0.007843138:127>>
      %y_q = QLinearGemm(%x_q, %w_q) {activation = "Relu", activation_params = [], multiplier = [1442928868, 1442928868], shift = [38, 38]} : tensor<1x2x!quant.uniform<u8:f32, 0.011764706:0>>
      %y = DequantizeLinear(%y_q) : tensor<1x2xf32>
      return %y
    }
"""
from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import UserError
from ..ir.graph import Graph, Op, Value
from ..ir.ops import QUANT_ACTIVATIONS, REGISTRY
from ..ir.types import QuantParams
from ..quant import qparams as qpm
from ..quant.hardswish import epilogue_attrs as hardswish_attrs
from ..quant.observers import Method
from ..quant.requant import conv_multipliers, quantize_multiplier, quantize_multipliers
from ._common import is_output, make_activation, pass_options, single_use
from .bias_correct import _empirical_error, mean_inputs
from .manager import PassContext, register_pass

CONVS = ("Conv", "FusedConv")
GEMMS = ("Gemm", "FusedGemm", "MatMul")
KEEP_PARAMS = ("MaxPool", "GlobalMaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze",
               "Slice", "Pad", "Relu", "Clip", "Identity")
QUANT_KINDS = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearGemm", "QLinearAdd", "QLinearMul",
               "QLinearGlobalAveragePool", "QLinearAveragePool", "Requantize")


@dataclass
class QuantizeOptions:
    method: str = "minmax"                 # range observer: minmax, percentile, entropy, mse
    percentile: float = 99.99              # for method = percentile
    per_channel: bool = True               # int8 weights: one scale per output channel, else per tensor
    calib: Any = None                      # calibration feeds (a quant.data.Dataset); None: random, warned
    activation_dtype: str = "uint8"        # uint8 or int8
    symmetric_activations: bool = False    # zero point 0, int8 (what TensorRT's explicit quantization takes)
    keep_float: frozenset = frozenset()    # op names or op kinds that stay float
    ranges: dict = field(default_factory=dict)   # value name -> (lo, hi): given ranges win over calibration
    random_samples: int = 16               # feeds of random data when calib is None
    progress: bool = False                 # a one-line progress bar on stderr while calibrating (TTY only)
    bias_correction: bool = True           # b -= ε·E[x] from the calibration data (not with calib None)

    def __post_init__(self):
        known = [m.value for m in Method]
        if str(getattr(self.method, "value", self.method)) not in known:
            _bad("method", self.method, known)
        self.method = Method(self.method).value
        if self.activation_dtype not in ("uint8", "int8"):
            _bad("activation_dtype", self.activation_dtype, ["uint8", "int8"])
        if self.symmetric_activations and self.activation_dtype != "int8":
            raise UserError("symmetric activations need activation_dtype int8", "quantize options",
                            "set activation_dtype='int8' or symmetric_activations=False")
        if not 0 < self.percentile <= 100:
            raise UserError(f"percentile {self.percentile} outside (0, 100]", "quantize options",
                            "give e.g. 99.99")
        self.keep_float = frozenset(self.keep_float)


def _bad(name, got, known):
    raise UserError(f"unknown {name} '{got}'", "quantize options", f"known: {', '.join(known)}")


# ---- 1. prepare ---------------------------------------------------------------------------------
def _kept_float(op: Op, opts: QuantizeOptions) -> bool:
    return op.kind in opts.keep_float or op.name in opts.keep_float


def _splits(op: Op, opts: QuantizeOptions) -> bool:
    """Whether :func:`_prepare` splits ``op``: a FusedConv/FusedGemm that could become integer and
    has a residual operand or an activation that is neither folded into the clamp nor a fused
    HardSwish.

    An op kept float by *name* is split too: the name stays on the conv/gemm part, and its residual
    add and activation are their own layers (``NAME_add``, ``NAME_<activation>``), planned like any
    other. That is what the selection and the report mean by NAME (they see the graph after this
    step), so ``--keep-float`` given the selection's float set builds the same graph as the
    selection did (keeping the whole fused block float would keep the add float as well: on
    rapidocr-cls, Conv@11 so, the held-back output SQNR read 17.17 dB instead of the selection's
    19.42). A *kind* kept float (``op:FusedConv``) keeps its fused blocks whole."""
    if op.kind not in ("FusedConv", "FusedGemm") or op.kind in opts.keep_float or _decline(op) is not None:
        return False
    act = op.attrs.get("activation", "")
    return len(op.operands) == 4 or not (act in QUANT_ACTIVATIONS or _fuses_hardswish(act, opts))


def split_names(graph: Graph, opts: QuantizeOptions) -> set[str]:
    """The names :func:`_prepare` gives the ops it splits off (``NAME_add``, ``NAME_<activation>``),
    which the selection and the report print; ``--keep-float`` accepts them before the split."""
    return {n for op in graph.ops if _splits(op, opts) for n in _split_off(op) if n}


def _split_off(op: Op) -> tuple[str | None, str | None]:
    """The names of the residual Add and the activation op :func:`_prepare` splits off ``op`` (None:
    not made): whenever ``op`` splits, it has a residual or an activation that stays float."""
    act = op.attrs.get("activation", "")
    return (op.name + "_add" if len(op.operands) == 4 else None, op.name + "_" + act.lower() if act else None)


def _prepare(graph: Graph, opts: QuantizeOptions) -> None:
    """Split residual adds and non-foldable activations off FusedConv/FusedGemm."""
    for op in graph.ops:
        if not _splits(op, opts):
            continue
        act, params = op.attrs.get("activation", ""), list(op.attrs.get("activation_params") or [])
        z = op.operands[3] if len(op.operands) == 4 else None
        r, name, rname = op.result, op.name, op.result.name
        keep = act if z is None and act in QUANT_ACTIVATIONS else ""
        base = graph.create_op(op.kind, op.operands[:3], {**op.attrs, "activation": keep, "activation_params":
                               params if keep else []}, result_types=[r.type], name=name + "_base",
                               result_names=[r.name + "_acc"], before=op)
        last = base.result
        add_name, act_name = _split_off(op)
        if z is not None:
            last = graph.create_op("Add", [last, z], name=add_name, result_names=[r.name + "_add"],
                                   before=op).result
        if act and not keep:
            last = make_activation(graph, act, params, last, name=act_name, before=op).result
        graph.replace_op(op, [last])
        graph.rename_op(base, name)
        if not graph.has_value(rname):
            graph.rename(last, rname)


def _fuses_hardswish(act: str, opts: QuantizeOptions) -> bool:
    """HardSwish stays fused: a float32 epilogue of the conv/gemm (qcompiler.quant.hardswish)."""
    return act == "HardSwish" and "HardSwish" not in opts.keep_float


# ---- 2. plan -------------------------------------------------------------------------------------
def _is_float(v: Value) -> bool:
    return v.type.quant is None and v.dtype == "float32"


def _decline(op: Op) -> str | None:
    """Why a Conv/Gemm-like op cannot become QLinearConv/QLinearGemm (None: it can)."""
    ops = op.operands
    if not _is_float(ops[0]) or ops[0].is_const:
        return "input is not a float32 activation"
    if not ops[1].is_const or any(not v.is_const for v in ops[2:3]):
        return "weight or bias is not constant"
    if op.kind in CONVS:
        if ops[0].type.rank != 4:
            return "only 2-D convolutions (rank-4 input) are quantized"
        return None
    if ops[0].type.rank != 2 or ops[1].type.rank != 2:
        return "only 2-D Gemm/MatMul operands are quantized"
    if op.kind != "MatMul":
        if op.attrs.get("transA", 0):
            return "transA = 1"
        n = op.result.shape[1]
        if len(ops) == 3 and ops[2].data.size not in (1, n):
            return "the bias does not broadcast along the output channels only"
    return None


@dataclass
class _Plan:
    role: dict = field(default_factory=dict)    # op -> "compute" | "keep" | "concat" | "fold"
    out: dict = field(default_factory=dict)     # compute op -> float value its output stands for
    fold: dict = field(default_factory=dict)    # compute op -> folded Relu/Clip/HardSwish op (its result: the output)
    absorbed: dict = field(default_factory=dict)  # compute op -> further folded ops (scaled HardSwish: Mul, HardSigmoid)
    gate: dict = field(default_factory=dict)    # compute op -> HardSwish activation_params ([alpha, beta, S...])
    why: dict = field(default_factory=dict)     # float op -> reason
    boundary: set = field(default_factory=set)  # float values entering quantized ops (need a Q)


def _plan(graph: Graph, opts: QuantizeOptions) -> _Plan:
    p = _Plan()
    quantized: set[Value] = set()                   # float values that will exist quantized
    for op in graph.ops:
        role, why = None, None
        x = op.operands[0] if op.operands else None
        if p.role.get(op) == "fold":                    # already claimed by a scaled HardSwish
            quantized.add(op.result)
            continue
        if _kept_float(op, opts):
            why = "kept float (keep_float)"
        elif op.kind in CONVS + GEMMS:
            why = _decline(op)
            role = "compute" if why is None else None
        elif op.kind == "Add":
            if all(_is_float(v) for v in op.operands) and any(v in quantized for v in op.operands):
                role = "compute"
            else:
                why = "no quantized operand"
        elif op.kind == "Mul":
            if (all(_is_float(v) and not v.is_const for v in op.operands)
                    and any(v in quantized for v in op.operands)):
                role = "compute"                        # the other operand (e.g. a gate) gets a Q
            else:
                why = "no quantized operand, or a constant factor"
        elif op.kind in ("GlobalAveragePool", "AveragePool"):
            a = {**REGISTRY[op.kind].defaults, **op.attrs}
            if x not in quantized:
                why = "input not quantized"
            elif op.kind == "AveragePool" and (a["ceil_mode"] or (any(a["pads"] or []) and not a["count_include_pad"])):
                why = "window count varies (pads without count_include_pad, or ceil_mode)"
            else:
                role = "compute"
        elif op.kind in ("Relu", "Clip") and x in quantized and _foldable(p, x):
            role = "fold"
        elif (op.kind == "HardSwish" and x in quantized and _foldable(p, x) and x.producer.kind in CONVS + GEMMS
              and _fuses_hardswish(op.kind, opts)):
            role = "fold"
        elif op.kind in KEEP_PARAMS and x in quantized and len(op.results) == 1:
            role = "keep" if op.kind != "Pad" or op.attrs.get("mode", "constant") == "constant" else None
            why = None if role else "only constant padding is quantized"
        elif op.kind == "Concat" and all(_is_float(v) for v in op.operands) and any(v in quantized for v in op.operands):
            role = "concat"
        else:
            why = "no integer kernel" if any(v in quantized for v in op.operands) else "float region"
        if role is None:
            p.why[op] = why
            continue
        p.role[op] = role
        if role == "fold":
            prod = x.producer
            p.fold[prod], p.out[prod] = op, op.result
        elif role == "compute":
            p.out[op] = op.result
            if op.kind in CONVS + GEMMS and not op.attrs.get("activation"):
                _claim_scaled_hardswish(p, op, opts)
        if role in ("compute", "concat"):
            acts = op.operands[:1] if op.kind in CONVS + GEMMS else op.operands
            p.boundary.update(v for v in acts if v not in quantized)
        quantized.add(op.result)
    return p


def _claim_scaled_hardswish(p: _Plan, op: Op, opts: QuantizeOptions) -> None:
    """Fold z · HardSigmoid(S·z) after a conv/gemm whose output z feeds only that pattern (the
    form ``equalize`` leaves a rescaled HardSwish in) into the conv's float32 HardSwish epilogue,
    with gate slopes alpha·S (S > 0)."""
    from .equalize import scaled_hardswish
    if not _fuses_hardswish("HardSwish", opts):
        return
    pattern = scaled_hardswish(op.result)
    if pattern is None or any(_kept_float(o, opts) for o in pattern):
        return
    m_s, hs, m_o = pattern
    S = next(v for v in m_s.operands if v is not op.result).data.astype(np.float64).reshape(-1)
    if not np.all(S > 0) or not np.all(np.isfinite(S)):
        return
    a = {**REGISTRY["HardSigmoid"].defaults, **hs.attrs}
    for o in pattern:
        p.role[o] = "fold"
    p.fold[op], p.absorbed[op], p.out[op] = m_o, [hs, m_s], m_o.result
    p.gate[op] = [float(a["alpha"]), float(a["beta"])] + [float(v) for v in S]


def _foldable(p: _Plan, x: Value) -> bool:
    prod = x.producer
    return (prod is not None and p.role.get(prod) == "compute" and prod not in p.fold
            and prod.kind in CONVS + GEMMS + ("Add", "Mul") and not prod.attrs.get("activation")
            and single_use(x))


# ---- 3. ranges and params -------------------------------------------------------------------------
def _ranges(graph: Graph, names: list[str], opts: QuantizeOptions, info: dict) -> dict[str, tuple[float, float]]:
    from ..quant.calibrate import collect_ranges
    ranges = {k: (float(v[0]), float(v[1])) for k, v in opts.ranges.items() if k in names}
    todo = [n for n in names if n not in ranges]
    consts = [n for n in todo if graph.value(n).is_const]
    for n in consts:
        d = graph.value(n).data
        ranges[n] = (float(d.min()), float(d.max()))
    todo = [n for n in todo if n not in ranges]
    info["calibration"] = "given ranges"
    if todo:
        data = opts.calib
        if data is None:
            from ..quant.data import random_dataset
            warnings.warn("quantize: no calibration data: calibrating on random normal inputs; "
                          "accuracy will suffer (give calibration data)", stacklevel=2)
            batch = graph.inputs[0].shape[0] if graph.inputs and graph.inputs[0].shape else 1
            n = -(-max(opts.random_samples, batch) // batch) * batch      # whole batches of the model's batch
            data = random_dataset(graph.inputs, n, batch=batch)
            info["calibration"] = f"random ({n} samples)"
        else:
            info["calibration"] = f"{len(data)} feeds" if hasattr(data, "__len__") else "data"
        kw = {"p": opts.percentile} if opts.method == "percentile" else \
            {"symmetric": opts.symmetric_activations} if opts.method in ("entropy", "mse") else {}
        ranges.update(collect_ranges(graph, data, todo, opts.method, quiet=not opts.progress, **kw))
    return ranges


def _params(graph: Graph, p: _Plan, opts: QuantizeOptions, info: dict) -> tuple[dict, dict]:
    need = [v for v in p.out.values()] + [op.result for op, r in p.role.items() if r == "concat"]
    need += sorted(p.boundary, key=lambda v: v.name)
    ranges = _ranges(graph, list(dict.fromkeys(v.name for v in need)), opts, info)
    scheme = qpm.symmetric if opts.symmetric_activations else qpm.asymmetric
    P = {v: scheme(*ranges[v.name], opts.activation_dtype) for v in need}
    made_by = {v: op for op, v in p.out.items()}
    for op, role in p.role.items():                 # concat inputs take the output's params if free to
        if role == "concat":
            for v in op.operands:
                if (v in made_by or v in p.boundary) and single_use(v) and not v.is_const:
                    P[v] = P[op.result]
    for op in graph.ops:                            # ops that keep their input's params
        if p.role.get(op) == "keep":
            P[op.result] = P[op.operands[0]]
    return P, ranges


# ---- 4. rewrite -----------------------------------------------------------------------------------
class _Rewriter:
    def __init__(self, graph: Graph, plan: _Plan, P: dict, ranges: dict, opts: QuantizeOptions,
                 means: dict | None = None):
        self.g, self.p, self.P, self.ranges, self.opts = graph, plan, P, ranges, opts
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
            q = self.g.add_const(qpm.quantize(v.data, qp), v.name + "_q", quant=qp)
        else:
            q = self.g.create_op("QuantizeLinear", [v], result_types=[v.type.with_quant(qp)],
                                 name="quantize_" + v.name, result_names=[v.name + "_q"], before=anchor).result
            self.stands_for[q] = v.name
        self.qv[v] = q
        return q

    def replace(self, op: Op, kind: str, operands: list[Value], attrs: dict, out: Value, qp: QuantParams) -> Op:
        """Put ``kind`` in place of ``op`` (and a folded activation); float users get a DQ."""
        g, name, out_name = self.g, op.name, out.name
        new = g.create_op(kind, operands, attrs, result_types=[out.type.with_quant(qp)], name=name + "_q",
                          result_names=[out_name + "_q"], before=op)
        q = new.result
        self.stands_for[q] = out_name
        if out.uses or is_output(out):
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
                self.layers[new.name] = {"kind": op.kind, "precision": "int8", "output": _summary(self.P[op.result])}
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
        qo = self.P[out]
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
            info["inputs"] = [_summary(a.type.quant), _summary(b.type.quant)]
        elif op.kind == "Mul":                                  # y = a b: M = s_a s_b / s_y
            a, b = (self.qval(v, op) for v in op.operands)
            sa, sb = (float(np.float32(v.type.quant.scale[0])) for v in (a, b))
            m, s = quantize_multiplier(sa * sb / float(np.float32(qo.scale[0])))
            kind, operands = "QLinearMul", [a, b]
            attrs = {"activation": act, "activation_params": params, "multiplier": [m], "shift": [s]}
            info["inputs"] = [_summary(a.type.quant), _summary(b.type.quant)]
        else:                                                   # GlobalAveragePool, AveragePool
            x = self.qval(op.operands[0], op)
            count = int(np.prod(x.shape[2:])) if op.kind == "GlobalAveragePool" else \
                int(np.prod(op.attrs["kernel_shape"]))
            m, s = quantize_multiplier(x.type.quant.scale[0] / (qo.scale[0] * count))
            kind, operands = "QLinear" + op.kind, [x]
            attrs = {k: v for k, v in op.attrs.items()}
            attrs.update(multiplier=[m], shift=[s])
            info["input"] = _summary(x.type.quant)
        rng = list(self.ranges.get(out.name, ()))
        new = self.replace(op, kind, operands, attrs, out, qo)
        self.layers[new.name] = {"kind": kind, "precision": "int8", **info, "output": _summary(qo),
                                 "range": rng, "method": self.opts.method}

    def linear(self, op: Op, info: dict) -> tuple[str, list[Value], dict]:
        """QLinearConv / QLinearGemm operands: quantized input, int8 weight, int32 bias."""
        x = self.qval(op.operands[0], op)
        w = op.operands[1].data.astype(np.float32)
        b = op.operands[2].data.astype(np.float32) if len(op.operands) >= 3 else None
        if op.kind in CONVS:
            kind = "QLinearConv"
            attrs = {k: op.attrs[k] for k in ("strides", "dilations", "pads", "group") if k in op.attrs}
        else:
            kind, attrs = "QLinearGemm", {}
            a = {**REGISTRY[op.kind].defaults, **op.attrs}
            if op.kind == "MatMul" or not a["transB"]:
                w = np.ascontiguousarray(w.T)                   # stored N x K
            if op.kind != "MatMul":
                w = w * np.float32(a["alpha"])
                if b is not None:
                    b = np.broadcast_to(b.reshape(-1) * np.float32(a["beta"]), (w.shape[0],)).astype(np.float32)
        wqp = qpm.per_channel_symmetric(w, 0) if self.opts.per_channel else qpm.symmetric(float(w.min()), float(w.max()))
        if op.name in self.means:
            eps = qpm.fake_quantize(w, wqp).astype(np.float64) - w.astype(np.float64)
            err = _empirical_error(op, eps, self.means[op.name])
            b = ((np.zeros(w.shape[0]) if b is None else b.astype(np.float64)) - err).astype(np.float32)
            info["bias_correction"] = float(np.max(np.abs(err)))
        if b is not None:
            wqp, widened = _fit_bias(wqp, x.type.quant.scale[0], b)
            if widened:
                info["bias_widened_channels"] = widened
        wname = op.operands[1].name
        operands = [x, self.g.add_const(qpm.quantize(w, wqp), wname + "_q", quant=wqp)]
        if b is not None:
            bqp = qpm.bias_params(x.type.quant, wqp)
            bname = op.operands[2].name if len(op.operands) >= 3 else op.name + "_bias"
            operands.append(self.g.add_const(qpm.quantize(b, bqp), bname + "_q", quant=bqp))
        ms, ss = conv_multipliers(x.type.quant.scale[0], wqp.scale, self.P[self.p.out[op]].scale[0])
        attrs.update(multiplier=ms, shift=ss)
        info["input"] = _summary(x.type.quant)
        info["weight"] = {"per_channel": wqp.per_channel, "channels": int(w.shape[0]),
                          "scale_min": min(wqp.scale), "scale_max": max(wqp.scale)}
        return kind, operands, attrs

    def concat(self, op: Op) -> None:
        qo = self.P[op.result]
        operands = []
        for v in op.operands:
            q = self.qval(v, op)
            if q.type.quant != qo:
                m, s = quantize_multiplier(q.type.quant.scale[0] / qo.scale[0])
                q = self.g.create_op("Requantize", [q], {"multiplier": [m], "shift": [s]},
                                     result_types=[q.type.with_quant(qo)], name="requantize_" + v.name,
                                     result_names=[v.name + "_rq"], before=op).result
                self.stands_for[q] = v.name
            operands.append(q)
        rng = list(self.ranges.get(op.result.name, ()))
        new = self.replace(op, "Concat", operands, dict(op.attrs), op.result, qo)
        self.layers[new.name] = {"kind": "Concat", "precision": "int8", "output": _summary(qo),
                                 "range": rng, "method": self.opts.method}


def _layer_input_means(graph: Graph, p: _Plan, opts: QuantizeOptions,
                       outputs: list | None = None) -> dict[str, np.ndarray]:
    """For bias correction: the data input of every Conv/Gemm to quantize, averaged over the
    calibration feeds (none without real calibration data or with ``bias_correction`` off).
    ``outputs`` receives the float graph's outputs per feed (see :func:`mean_inputs`)."""
    if not opts.bias_correction or opts.calib is None:
        return {}
    layers = [op for op, role in p.role.items() if role == "compute" and op.kind in CONVS + GEMMS]
    return mean_inputs(graph, opts.calib, layers, outputs) if layers else {}


def _rewritten(src: Graph, opts: QuantizeOptions, ranges: dict, means: dict) -> Graph:
    """A quantized copy of ``src`` (the float graph after step 1) with the given ranges (no
    calibration) and bias-correction means."""
    from dataclasses import replace
    g = src.clone()
    plan = _plan(g, opts)
    o = replace(opts, ranges=dict(ranges))
    P, _ = _params(g, plan, o, {})
    _Rewriter(g, plan, P, ranges, o, means).run()
    return g


def _bias_correction_helps(src: Graph, opts: QuantizeOptions, ranges: dict, means: dict,
                           float_outputs: list | None = None) -> tuple[bool, float, float]:
    """Whether the bias correction lowers the error of the graph outputs on the calibration data:
    (keep it, output SQNR in dB with it, without it, over the feeds compared), the quantized graph
    run by the reference interpreter against the float graph.

    The correction removes the mean output shift that rounding the weights causes, in
    expectation over the layer's float input. It does not see the other mean errors of the
    integer network (the input's own rounding, upstream layers, the output clamp), and on
    uspsnet it made the output worse even with E[x] taken from the evaluation data itself
    (36.37 -> 36.28 dB; on its 256 calibration samples 40.92 -> 40.68 dB, the same sign on all
    five real models). So it is kept only where the calibration data says it helps: strictly
    lower total squared error of the outputs. ``float_outputs``: ``src``'s outputs per calibration
    feed when already computed (:func:`_layer_input_means` runs the same float graph on the same
    feeds), else run here.

    The feeds are compared in groups of MIN_FEEDS (each group one batched run, :func:`_run_feeds`),
    and the comparison stops early once the remaining ones cannot plausibly reverse the sign
    (:func:`_sign_settled`): each feed costs two whole-model integer reference runs, most of a
    build's time, and the answer often is clear after a few."""
    from ..quant import reference
    from ..quant.qparams import sqnr_db
    variants = {"with": _rewritten(src, opts, ranges, means), "without": _rewritten(src, opts, ranges, {})}
    total = len(float_outputs) if float_outputs is not None else \
        (len(opts.calib) if hasattr(opts.calib, "__len__") else None)
    ref: list[np.ndarray] = []
    got: dict[str, list[np.ndarray]] = {k: [] for k in variants}
    diffs: list[float] = []
    stream = iter(opts.calib)
    i = 0
    while True:
        group = list(itertools.islice(stream, MIN_FEEDS))        # one batched run per group
        if not group:
            break
        runs = {k: _run_feeds(g, group) for k, g in variants.items()}
        for j, feeds in enumerate(group):
            outs = float_outputs[i + j] if float_outputs is not None else reference.run(src, feeds)
            r = [np.asarray(a, np.float64).ravel() for a in outs]
            ref += r
            err = {}
            for k in variants:
                y = [np.asarray(a, np.float64).ravel() for a in runs[k][j]]
                got[k] += y
                err[k] = sum(float(np.sum((b - a) ** 2)) for a, b in zip(r, y))
            diffs.append(err["with"] - err["without"])
        i += len(group)
        if total is not None and _sign_settled(diffs, total):
            break
    r = np.concatenate(ref)
    err = {k: float(np.sum((np.concatenate(v) - r) ** 2)) for k, v in got.items()}
    db = {k: sqnr_db(r, np.concatenate(v)) for k, v in got.items()}
    return err["with"] < err["without"], db["with"], db["without"]


def _run_feeds(g: Graph, group: list[dict]) -> list[list[np.ndarray]]:
    """The reference outputs of ``g`` for each feed of ``group``, run as ONE batch where the graph
    allows it (the reference kernels take any number of samples; bigger GEMMs and a quarter of
    the per-op overhead): every output must have the samples on its leading axis, else (or if the
    batched run fails) feed by feed. Integer kernels are exact, so the split outputs are the
    per-feed ones."""
    from ..ir.interp import EvalError
    from ..quant import reference
    sizes = [len(next(iter(f.values()))) for f in group]
    if len(group) > 1 and all(set(f) == set(group[0]) for f in group):
        try:
            outs = reference.run(g, {k: np.concatenate([np.asarray(f[k]) for f in group]) for k in group[0]})
        except (EvalError, ValueError):
            outs = None
        if outs is not None and all(np.ndim(o) and np.shape(o)[0] == sum(sizes) for o in outs):
            cuts = np.cumsum(sizes)[:-1]
            return [list(p) for p in zip(*(np.split(np.asarray(o), cuts) for o in outs))]
    return [reference.run(g, f) for f in group]


# one-sided 99.9 % quantiles of Student's t by degrees of freedom (smaller df: use the next lower row)
_T999 = ((3, 10.21), (4, 7.173), (5, 5.893), (6, 5.208), (7, 4.785), (8, 4.501), (9, 4.297), (10, 4.144),
         (12, 3.930), (15, 3.733), (20, 3.552), (30, 3.385), (60, 3.232), (120, 3.160))
MIN_FEEDS = 4


def _sign_settled(diffs: list[float], total: int) -> bool:
    """Whether the sign of Σ d over all ``total`` feeds is settled by the first m = len(diffs):
    d_i = (squared output error with the correction) - (without) on feed i.

    The remaining r = total - m feeds are modelled as independent draws like the first m (the
    calibration feeds are exchangeable), so their sum is predicted by r d̄ with standard error
    s sqrt(r (1 + r / m)) (s: the sample standard deviation; the r/m term is the uncertainty of d̄
    itself). The sign is settled when |Σ d + r d̄| exceeds t s sqrt(r (1 + r/m)), t Student's
    one-sided 99.9 % quantile with m - 1 degrees of freedom: the full comparison would reverse it
    with probability below about 0.1 %. Never before MIN_FEEDS feeds, and always at the last."""
    m = len(diffs)
    if m >= total:
        return True
    if m < MIN_FEEDS:
        return False
    d = np.asarray(diffs, np.float64)
    r = total - m
    t = next((q for df, q in reversed(_T999) if df <= m - 1), _T999[0][1])
    return abs(float(d.sum()) + r * float(d.mean())) > t * float(d.std(ddof=1)) * float(np.sqrt(r * (1 + r / m)))


# ctx.data key: {"calib", "means", "float_outputs"} of a float run over the calibration data made
# before the pass (qcompiler.quant.mixed's sensitivity), re-used when it is the same data
CALIB_RUN = "quantize.calib_run"
BIAS_LIMIT = 2 ** 30      # |b_q| bound: leaves 2^30 of int32 headroom for the products


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
    new = [qpm._f32_at_least(max(s, n)) for s, n in zip(scales, need)]
    return QuantParams(wqp.storage, tuple(new), wqp.zero_point, wqp.axis), int(bad.sum())


def _summary(qp: QuantParams) -> dict:
    return {"dtype": qp.storage, "scale": qp.scale[0], "zero_point": qp.zero_point[0]}


@register_pass("quantize", options=QuantizeOptions)
def quantize(graph: Graph, ctx: PassContext) -> bool:
    """Post-training static int8 quantization: calibrate activation ranges, quantize weights
    (per-channel int8) and biases (int32), rewrite Conv/Gemm/Add/pooling into integer-only QLinear
    ops with fixed-point requantization, and keep the rest float between Dequantize/QuantizeLinear."""
    opts = pass_options(ctx, "quantize", QuantizeOptions)
    if graph.meta.get("prequantized"):
        raise UserError("the model is already quantized (it has its own QuantizeLinear/DequantizeLinear, "
                        "ConvInteger or MatMulInteger); re-quantizing it to int8 is not supported yet (issue #35)",
                        "--dtype int8", "compile it with --dtype fp32: the float build computes the model's own "
                        "quantization as ONNX Runtime does")
    if any(op.kind in QUANT_KINDS for op in graph.ops):
        ctx.log("quantize: the graph is already quantized; nothing to do")
        return False
    _prepare(graph, opts)
    ctx.data["quantize.float_graph"] = graph.clone()
    plan = _plan(graph, opts)
    if not plan.role:
        graph.meta["quant"] = {"layers": {}, "note": "nothing to quantize"}
        return False
    info: dict[str, Any] = {}
    P, ranges = _params(graph, plan, opts, info)
    float_outputs: list = []
    pre = ctx.data.get(CALIB_RUN)
    if pre is not None and pre["calib"] is opts.calib and opts.bias_correction:
        # the sensitivity ran the same float graph (prepared the same way) on the same calibration data
        names = {op.name for op, role in plan.role.items() if role == "compute" and op.kind in CONVS + GEMMS}
        means = {k: v for k, v in pre["means"].items() if k in names}
        float_outputs = list(pre["float_outputs"])
    else:
        means = _layer_input_means(graph, plan, opts, float_outputs)
    if means:
        keep, with_db, without_db = _bias_correction_helps(ctx.data["quantize.float_graph"], opts, ranges, means,
                                                           float_outputs)
        info["bias_correction"] = {"applied": keep, "calibration_sqnr_db": {"with": round(with_db, 3),
                                                                             "without": round(without_db, 3)}}
        if not keep:
            means = {}
    rw = _Rewriter(graph, plan, P, ranges, opts, means)
    rw.run()
    graph.meta["quant"] = {
        "scheme": {"activations": f"{opts.activation_dtype} "
                                  f"{'symmetric' if opts.symmetric_activations else 'asymmetric'} per tensor",
                   "weights": "int8 symmetric " + ("per channel" if opts.per_channel else "per tensor"),
                   "bias": "int32", "method": opts.method, **info},
        "layers": rw.layers,
        "float_values": {q.name: f for q, f in rw.stands_for.items() if q.producer is not None
                         and q.producer.graph is graph},
    }
    n_int = sum(1 for v in rw.layers.values() if v["precision"] == "int8")
    ctx.log(f"quantize: {n_int} ops integer, {len(rw.layers) - n_int} float; calibration: {info['calibration']}")
    return True
