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
from ._common import single_use

if TYPE_CHECKING:
    from .quantize import QuantizeOptions

CONVS = ("Conv", "FusedConv")
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


def plan(graph: Graph, opts: QuantizeOptions) -> Plan:
    p = Plan()
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
            why = "input not quantized" if x not in quantized else avgpool_decline(op)
            role = "compute" if why is None else None
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


def _foldable(p: Plan, x: Value) -> bool:
    prod = x.producer
    return (prod is not None and p.role.get(prod) == "compute" and prod not in p.fold
            and prod.kind in CONVS + GEMMS + ("Add", "Mul") and not prod.attrs.get("activation")
            and single_use(x))


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
    need = [v for v in p.out.values()] + [op.result for op, r in p.role.items() if r == "concat"]
    need += sorted(p.boundary, key=lambda v: v.name)
    ranges = value_ranges(graph, list(dict.fromkeys(v.name for v in need)), opts, info)
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
