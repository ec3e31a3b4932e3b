"""The quantize pass, steps 1 to 3 (see :mod:`.quantize` for the whole pass): ``prepare`` splits
what an integer kernel cannot fuse off FusedConv/FusedGemm, ``plan`` decides each op's role in
topological order (compute, keep, concat, fold, or float with the reason), and
``activation_qparams`` calibrates the ranges and turns them into the activations' QuantParams.

    prepare(graph, opts)                  # in place: NAME_add, NAME_<activation> split off
    p = plan(graph, opts)                 # Plan: p.role[op], p.why[op], p.boundary, ...
    P, ranges = activation_qparams(graph, p, opts, info)
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..ir.activations import make_activation
from ..ir.graph import Graph, Op, Value
from ..ir.ops import REGISTRY
from ..ir.quant_ops import QUANT_ACTIVATIONS
from ..quant import qparams as qpm
from ._common import CONVS, single_use

if TYPE_CHECKING:
    from .quantize import QuantizeOptions

GEMMS = ("Gemm", "FusedGemm", "MatMul")
KEEP_PARAMS = ("MaxPool", "GlobalMaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze",
               "Slice", "Pad", "Relu", "Clip", "Identity")
QUANT_KINDS = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearGemm", "QLinearAdd", "QLinearMul",
               "QLinearGlobalAveragePool", "QLinearAveragePool", "Requantize")


# ---- 1. prepare ---------------------------------------------------------------------------------
def _kept_float(op: Op, opts: QuantizeOptions) -> bool:
    return op.kind in opts.keep_float or op.name in opts.keep_float


def _splits(op: Op, opts: QuantizeOptions) -> bool:
    """Whether :func:`prepare` splits ``op``: a FusedConv/FusedGemm that could become integer and
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
    """The names :func:`prepare` gives the ops it splits off (``NAME_add``, ``NAME_<activation>``),
    which the selection and the report print; ``--keep-float`` accepts them before the split."""
    return {n for op in graph.ops if _splits(op, opts) for n in _split_off(op) if n}


def _split_off(op: Op) -> tuple[str | None, str | None]:
    """The names of the residual Add and the activation op :func:`prepare` splits off ``op`` (None:
    not made): whenever ``op`` splits, it has a residual or an activation that stays float."""
    act = op.attrs.get("activation", "")
    return (op.name + "_add" if len(op.operands) == 4 else None, op.name + "_" + act.lower() if act else None)


def prepare(graph: Graph, opts: QuantizeOptions) -> None:
    """Split residual adds and non-foldable activations off FusedConv/FusedGemm, and make a
    MatMul of a rank-3+ activation by a constant matrix (a transformer's linear layer) one row
    GEMM (:func:`_rows_gemm`)."""
    for op in graph.ops:
        found = _rows_gemm_bias(op, opts)
        if found is not False:
            _rows_gemm(graph, op, found)
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


def _rows_gemm_bias(op: Op, opts: QuantizeOptions):
    """For a MatMul ``x @ W`` with x a float activation of rank >= 3 and W a constant matrix: the
    Add that adds a constant bias of W's N columns to its only use (None: no such Add). False:
    ``op`` is not such a MatMul, or is kept float."""
    if op.kind != "MatMul" or _kept_float(op, opts) or len(op.operands) != 2:
        return False
    x, w = op.operands
    if not _is_float(x) or x.is_const or x.type.rank < 3 or not w.is_const or w.type.rank != 2:
        return False
    if any(not isinstance(d, int) for d in x.shape):
        return False
    n, r = w.shape[1], op.result
    if not single_use(r):
        return None
    add, _ = next(iter(r.uses))
    if add.kind != "Add" or _kept_float(add, opts) or not _is_float(add.result):
        return None
    b = next((v for v in add.operands if v is not r), None)
    if (b is None or not b.is_const or b.data.size != n or b.type.rank > r.type.rank
            or (b.type.rank and b.shape[-1] != n)):
        return None
    return add, b


def _rows_gemm(graph: Graph, op: Op, found: tuple | None) -> None:
    """``y = x @ W (+ b)`` with x of shape (d1, ..., dk, K) becomes the one 2-D GEMM over all rows
    that QLinearGemm runs, between two Reshapes (which carry the quantized value unchanged)::

        y = Reshape(Gemm(Reshape(x, [d1···dk, K]), W, b), [d1, ..., dk, N])

    The Gemm keeps the MatMul's name (``--keep-float NAME`` and the report name the layer as in
    the model) and the bias Add, when there is one, is absorbed into it. The same rows form as
    fold-qdq gives a QDQ model's rank-3 MatMul. ``found``: :func:`_rows_gemm_bias`'s (Add, bias), or None."""
    x, w = op.operands
    lead, k, n = tuple(x.shape[:-1]), x.shape[-1], w.shape[1]
    m = int(np.prod(lead))
    add, b = found if found else (None, None)
    last = add.result if add is not None else op.result
    rows = next((u.result for u, _ in x.uses if u.kind == "Reshape" and u.attrs.get("shape") == [m, k]), None)
    if rows is None:                    # one row view per activation: Q, K and V projections share it (and its Q)
        at = {"after": x.producer} if x.producer is not None else {"before": op}
        rows = graph.create_op("Reshape", [x], {"shape": [m, k]}, result_types=[x.type.with_shape((m, k))],
                               name=op.name + "/rows", result_names=[x.name + "_rows"], **at).result
    operands = [rows, w]
    if b is not None:
        operands.append(b if b.type.rank == 1 else graph.add_const(b.data.reshape(n), b.name + "_row"))
    gemm = graph.create_op("Gemm", operands, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
                           result_types=[last.type.with_shape((m, n))], name=op.name + "_gemm",
                           result_names=[op.result.name + "_rows"], before=op)
    back = graph.create_op("Reshape", [gemm.result], {"shape": list(lead) + [n]}, result_types=[last.type],
                           name=op.name + "/unrows", result_names=[last.name + "_unrows"], before=op)
    name, out_name = op.name, last.name
    last.replace_all_uses_with(back.result)
    if add is not None:
        graph.erase_op(add)
    graph.erase_op(op)
    graph.rename_op(gemm, name)
    if not graph.has_value(out_name):
        graph.rename(back.result, out_name)


def _fuses_hardswish(act: str, opts: QuantizeOptions) -> bool:
    """HardSwish stays fused: a float32 epilogue of the conv/gemm (qcompiler.quant.hardswish); not
    in a float8 build, whose convs end in a float32 clamp only."""
    return act == "HardSwish" and "HardSwish" not in opts.keep_float and opts.fp8 is None


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
        return "only 2-D Gemm/MatMul operands, or a rank-3+ activation by a constant matrix, are quantized"
    if op.kind != "MatMul":
        if op.attrs.get("transA", 0):
            return "transA = 1"
        n = op.result.shape[1]
        if len(ops) == 3 and ops[2].data.size not in (1, n):
            return "the bias does not broadcast along the output channels only"
    return None


def gemm_weight_bias(op: Op) -> tuple[np.ndarray, np.ndarray | None]:
    """A Gemm/FusedGemm/MatMul's constant weight as float32 N x K (output channels first, Gemm's
    alpha folded in) and its bias as N floats (beta folded in; None without one)."""
    a = {**REGISTRY[op.kind].defaults, **op.attrs}
    w = op.operands[1].data.astype(np.float32)
    b = op.operands[2].data.astype(np.float32) if len(op.operands) >= 3 else None
    if op.kind == "MatMul" or not a["transB"]:
        w = np.ascontiguousarray(w.T)
    if op.kind != "MatMul":
        w = w * np.float32(a["alpha"])
        if b is not None:
            b = np.broadcast_to(b.reshape(-1) * np.float32(a["beta"]), (w.shape[0],)).astype(np.float32)
    return w, b


def avgpool_decline(op: Op) -> str | None:
    """Why a (Global)AveragePool cannot be a QLinear pool with one constant window count (None: it can)."""
    a = {**REGISTRY[op.kind].defaults, **op.attrs}
    if op.kind == "AveragePool" and (a["ceil_mode"] or (any(a["pads"] or []) and not a["count_include_pad"])):
        return "window count varies (pads without count_include_pad, or ceil_mode)"
    return None


def window_count(op: Op, x_shape) -> int:
    """The number of inputs a (Global)AveragePool averages (constant: see :func:`avgpool_decline`)."""
    return int(np.prod(x_shape[2:])) if op.kind == "GlobalAveragePool" else int(np.prod(op.attrs["kernel_shape"]))


@dataclass
class Plan:
    role: dict = field(default_factory=dict)    # op -> "compute" | "keep" | "concat" | "fold"
    out: dict = field(default_factory=dict)     # compute op -> float value its output stands for
    fold: dict = field(default_factory=dict)    # compute op -> folded Relu/Clip/HardSwish op (its result: the output)
    absorbed: dict = field(default_factory=dict)  # compute op -> further folded ops (scaled HardSwish: Mul, HardSigmoid)
    gate: dict = field(default_factory=dict)    # compute op -> HardSwish activation_params ([alpha, beta, S...])
    why: dict = field(default_factory=dict)     # float op -> reason
    boundary: set = field(default_factory=set)  # float values entering quantized ops (need a Q)
    float_out: set = field(default_factory=set)  # compute convs/gemms whose result stays float32 (no integer reader)


NO_INTEGER_READER = "its result feeds no integer op"
FP8_FLOAT = "float32 in an fp8 build (only Conv/Gemm/MatMul run on float8 operands)"
DEMOTABLE = ("Add", "Mul", "GlobalAveragePool", "AveragePool", "Concat")
"""Ops that stay float when no integer op reads their result (their quantized operands dequantized)."""


def plan(graph: Graph, opts: QuantizeOptions) -> Plan:
    """Each op's role, with no quantization point that only float ops read. An Add, Mul, average
    pool or Concat whose result no integer op reads stays float: quantizing it would add a
    rounding and save nothing (a transformer's residual Add before its LayerNorm, GELU's x·Φ(x),
    ConvNeXt's global pool before its LayerNorm: 30.63 dB quantized against 31.96 dB float on
    convnext_tiny, its output 2.4 dB better). A Conv or Gemm whose result no integer op reads
    returns it dequantized in float32 from its int32 accumulator (``multiplier = []``): the FFN's
    second GEMM before the residual, the classifier's logits, a detector's head, and a conv
    followed by a float op such as PRelu: its result is then rounded once, on the grid of the
    float op's output where an integer op reads that, instead of also on a grid that covers the
    PRelu's whole input range, whose negative side it shrinks by its slope (mtcnn-onet: +6 dB).
    For a conv, pool or Concat, an element-wise float op that a lookup table computes on its
    quantized result (a gate's HardSigmoid) counts as an integer reader (:func:`_read_quantized`).
    Planned again until no such op is left (a demoted Add can leave its producer without an integer
    reader)."""
    demoted: set[Op] = set()
    # float8: every conv/gemm returns float32 and nothing else is quantized (a single pass)
    float_out: set[Op] = {op for op in graph.ops if op.kind in CONVS + GEMMS} if opts.fp8 else set()
    while True:
        p = _plan(graph, opts, demoted, float_out)
        need, via_table = _read_quantized(graph, p), _read_quantized(graph, p, tables=True)
        unread = [op for op, r in p.role.items() if r in ("compute", "concat") and op not in float_out
                  and p.out.get(op, op.result) not in (need if op.kind in ("Add", "Mul") + GEMMS else via_table)]
        new_d = {op for op in unread if op.kind in DEMOTABLE}
        new_f = {op for op in unread if op.kind in CONVS + GEMMS and op not in p.gate
                 and (op not in p.fold or p.fold[op].kind in ("Relu", "Clip"))       # a float clamp then
                 and (op.attrs.get("activation") or "") in ("", "Relu", "Clip")}
        if not new_d and not new_f:
            return p                                    # p.float_out is float_out
        demoted |= new_d
        float_out |= new_f


def _read_quantized(graph: Graph, p: Plan, tables: bool = False) -> set[Value]:
    """The float values that some integer op reads in quantized form (directly, or through ops
    that keep the params: Reshape, MaxPool, ...); with ``tables`` also through a float element-wise
    op whose result an integer op reads: QuantizeLinear(f(DequantizeLinear(q))) depends on q's 256
    values only, and the code generators compute it as a table lookup on q.

    A conv, pool or Concat keeps its quantized result for such a reader (a squeeze-excite gate's
    HardSigmoid; an Add, Mul or GEMM does not, as before: a residual Add before a HardSwish): the
    gate stays a table on integers, exact against ONNX Runtime also where float layers are stored
    in fp16, and the second rounding it saves was worth nothing measurable (mobilenet_v3_large,
    rapidocr-cls, efficientnet_b0 on 64 held-out inputs: -0.28, -0.06, +0.02 dB, within noise)."""
    need: set[Value] = set()
    for op in reversed(graph.ops):
        r = p.role.get(op)
        if r in ("compute", "concat"):
            need.update(op.operands[:1] if op.kind in CONVS + GEMMS else op.operands)
        elif r == "keep" and op.result in need:
            need.add(op.operands[0])
        elif tables and r is None and _table(op) and op.result in need:
            need.add(op.operands[0])
    return need


TABLE_KINDS = frozenset({"Relu", "Sigmoid", "Tanh", "Sqrt", "Erf", "Exp", "Log", "Neg", "Abs", "Reciprocal",
                         "Identity", "HardSwish", "Softplus", "LeakyRelu", "HardSigmoid", "Clip", "Gelu",
                         "Add", "Sub", "Mul", "Div"})
"""Element-wise float ops that a lookup table on a quantized operand evaluates (their other operands
scalar constants): :func:`qcompiler.codegen.kernels.quant._lookup_chain`."""


def _table(op: Op) -> bool:
    return (op.kind in TABLE_KINDS and len(op.results) == 1 and bool(op.operands)
            and all(v.is_const and v.data.size == 1 for v in op.operands[1:]))


def _plan(graph: Graph, opts: QuantizeOptions, demoted: set, float_out: set) -> Plan:
    p = Plan(float_out=float_out)
    quantized: set[Value] = set()                   # float values that will exist quantized
    for op in graph.ops:
        role, why = None, None
        x = op.operands[0] if op.operands else None
        if p.role.get(op) == "fold":                    # already claimed by a scaled HardSwish
            quantized.add(op.result)
            continue
        if _kept_float(op, opts):
            why = "kept float (keep_float)"
        elif op in demoted:
            why = NO_INTEGER_READER
        elif opts.fp8 and op.kind not in CONVS + GEMMS and not (
                op.kind in ("Relu", "Clip") and _returns_float(p, x) and _foldable(p, x, True)):
            why = FP8_FLOAT
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
            why = "input not quantized" if x not in quantized else avgpool_decline(op)
            role = "compute" if why is None else None
        elif op.kind in ("Relu", "Clip") and (x in quantized or _returns_float(p, x)) and _foldable(p, x, True):
            role = "fold"                               # the output clamp, or the float32 result's clamp
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
        if op not in float_out:
            quantized.add(op.result)
    return p


def _claim_scaled_hardswish(p: Plan, op: Op, opts: QuantizeOptions) -> None:
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


def _foldable(p: Plan, x: Value, clamp: bool = False) -> bool:
    """Whether an activation of ``x`` folds into its producer's epilogue: any into a quantized
    result, a clamp (``clamp``: Relu, Clip) also into a conv/gemm's float32 result."""
    prod = x.producer
    return (prod is not None and p.role.get(prod) == "compute" and prod not in p.fold
            and (prod not in p.float_out or clamp and prod.kind in CONVS + GEMMS)
            and prod.kind in CONVS + GEMMS + ("Add", "Mul") and not prod.attrs.get("activation")
            and single_use(x))


def _returns_float(p: Plan, x: Value) -> bool:
    """Whether ``x`` is the float32 result of a conv/gemm (``p.float_out``)."""
    return x.producer is not None and x.producer in p.float_out and p.role.get(x.producer) == "compute"


# ---- 3. ranges and params -------------------------------------------------------------------------
def value_ranges(graph: Graph, names: list[str], opts: QuantizeOptions, info: dict) -> dict[str, tuple[float, float]]:
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


def activation_qparams(graph: Graph, p: Plan, opts: QuantizeOptions, info: dict) -> tuple[dict, dict]:
    need = [v for op, v in p.out.items() if op not in p.float_out] + [op.result for op, r in p.role.items() if r == "concat"]
    need += sorted(p.boundary, key=lambda v: v.name)
    ranges = value_ranges(graph, list(dict.fromkeys(v.name for v in need)), opts, info)
    if opts.fp8:
        from ..quant.fp8 import fp8_params
        P = {v: fp8_params(*ranges[v.name], opts.fp8_storage) for v in need}
    else:
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
