"""The op registry: every op kind the IR knows, with its normalized attributes and type inference.

Kinds are ONNX operator names. Attributes are *normalized*: the importer writes every attribute
out, resolves ``auto_pad`` into explicit ``pads``, and turns operands that must be constant in
ONNX (Reshape's shape, Clip's bounds, Pad's pads, Slice's starts/ends, Resize's sizes, Squeeze and
Unsqueeze axes, ReduceMean axes, Expand's shape) into attributes, so the IR does not depend on the
opset. The exporter writes them back in the form of its target opset.

Type inference (``infer_types``) is used when a pass creates an op and by the verifier, which
checks that every op's result types are what its operands and attributes imply.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .types import TensorType

InferFn = Callable[[Sequence[TensorType], dict], list[TensorType]]


@dataclass(frozen=True)
class OpDef:
    kind: str
    infer: InferFn | None
    defaults: dict[str, Any] = field(default_factory=dict)
    num_operands: tuple[int, int] = (1, 1)        # (min, max)
    doc: str = ""
    quantized_result: Any = False                 # results must have a quantized type (verifier); or f(attrs) -> bool


REGISTRY: dict[str, OpDef] = {}


class InferError(ValueError):
    pass


def register_op(kind: str, infer: InferFn | None, defaults: dict | None = None,
                num_operands: tuple[int, int] = (1, 1), doc: str = "", quantized_result: Any = False) -> OpDef:
    d = OpDef(kind, infer, dict(defaults or {}), num_operands, doc, quantized_result)
    REGISTRY[kind] = d
    return d


def full_attrs(kind: str, **attrs: Any) -> dict[str, Any]:
    """The registry's defaults for ``kind`` overridden by ``attrs``: every attribute spelled out."""
    return {**REGISTRY[kind].defaults, **attrs}


def infer_types(kind: str, types: Sequence[TensorType], attrs: dict, datas: Sequence[Any] = ()) -> list[TensorType]:
    d = REGISTRY.get(kind)
    if d is None or d.infer is None:
        raise InferError(f"op kind '{kind}' has no type inference: pass result_types")
    lo, hi = d.num_operands
    if not lo <= len(types) <= hi:
        raise InferError(f"{kind} takes {lo}..{hi} operands, got {len(types)}")
    key = _infer_key(kind, types, attrs)
    if key is not None:
        hit = _INFER_CACHE.get(key)
        if hit is not None:
            return list(hit)
    full = {**d.defaults, **attrs}
    out = d.infer(list(types), full)
    if key is not None:
        if len(_INFER_CACHE) >= 8192:
            _INFER_CACHE.clear()
        _INFER_CACHE[key] = tuple(out)
    return out


# Inference is a pure function of (kind, operand types, attributes) (``datas`` is not passed to it),
# and is run for every op at creation and again by every verify (after each pass): memoized on
# that key when the attributes are hashable (type-tagged, so 1, 1.0 and True stay apart). A graph has
# few distinct keys, so this turns the verifier's per-op inference into a dict lookup.
_INFER_CACHE: dict[tuple, tuple] = {}


def _frozen(v):
    if isinstance(v, (tuple, list)):
        return (type(v), tuple(_frozen(x) for x in v))
    return (type(v), v)


def _infer_key(kind: str, types: Sequence[TensorType], attrs: dict):
    try:
        key = (kind, tuple(types), tuple((k, _frozen(v)) for k, v in attrs.items()))
        hash(key)
    except TypeError:
        return None
    return key


# ---- elementwise ------------------------------------------------------------------------------
def _same(ts, a):
    return [TensorType(ts[0].shape, ts[0].dtype)]


_BROADCAST_CACHE: dict[tuple, tuple[int, ...]] = {}


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    # memoized: every elementwise op is inferred at creation and again by each verify, and a graph
    # has few distinct shape pairs (np.broadcast_shapes costs ~7 us a call)
    try:
        key = tuple(tuple(s) for s in shapes)
        hit = _BROADCAST_CACHE.get(key)
    except TypeError:                 # not iterable / unhashable: let numpy judge it
        key, hit = None, None
    if hit is not None:
        return hit
    try:
        out = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise InferError(f"shapes {' and '.join(map(str, shapes))} do not broadcast") from None
    if key is not None and len(_BROADCAST_CACHE) < 4096:
        _BROADCAST_CACHE[key] = out
    return out


def _binary(ts, a):
    if ts[0].dtype != ts[1].dtype:
        raise InferError(f"operand dtypes differ: {ts[0].dtype} vs {ts[1].dtype}")
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), ts[0].dtype)]


def _pow(ts, a):
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), ts[0].dtype)]


for _k in ("Relu", "Sigmoid", "Tanh", "Sqrt", "Erf", "Exp", "Log", "Neg", "Abs", "Reciprocal",
           "Identity", "HardSwish", "Softplus", "Floor", "Ceil", "Round"):
    register_op(_k, _same)
register_op("LeakyRelu", _same, {"alpha": 0.01})
register_op("HardSigmoid", _same, {"alpha": 0.2, "beta": 0.5})
register_op("Clip", _same, {"min": float("-inf"), "max": float("inf")},
            doc="bounds are attributes (constant in ONNX inputs)")
register_op("Dropout", _same, doc="inference: identity (the mask output is dropped on import)")
register_op("LRN", _same, {"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": None},
            doc="local response normalization across channels (AlexNet, Inception v1)")
register_op("Softmax", _same, {"axis": -1}, doc="opset-13 semantics (along one axis)")
register_op("LogSoftmax", _same, {"axis": -1})
register_op("Gelu", _same, {"approximate": "none"})
for _k in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
    register_op(_k, _binary, num_operands=(2, 2))
register_op("Pow", _pow, num_operands=(2, 2))
register_op("Cast", lambda ts, a: [TensorType(ts[0].shape, a["to"])], {"to": "float32"})


def _layernorm(ts, a):
    return [TensorType(ts[0].shape, ts[0].dtype)]


register_op("LayerNormalization", _layernorm, {"axis": -1, "epsilon": 1e-5}, (2, 3))
register_op("BatchNormalization", _same, {"epsilon": 1e-5}, (5, 5),
            doc="operands: X, scale (gamma), B (beta), mean, var; inference mode")


# ---- convolution and pooling ------------------------------------------------------------------
def _spatial_out(size, k, s, d, pb, pe, ceil=False):
    eff = d * (k - 1) + 1
    num = size + pb + pe - eff
    if num < 0:
        raise InferError(f"kernel {k} (dilation {d}) larger than padded input {size + pb + pe}")
    out = (-(-num // s) if ceil else num // s) + 1
    if ceil and (out - 1) * s >= size + pb:   # the last window must start inside the input or left pad
        out -= 1
    return out


def _conv(ts, a):
    x, w = ts[0], ts[1]
    nsp = x.rank - 2
    if x.rank < 3 or w.rank != x.rank:
        raise InferError(f"Conv input rank {x.rank} and weight rank {w.rank} do not fit")
    g = a["group"]
    if x.shape[1] != w.shape[1] * g:
        raise InferError(f"Conv input has {x.shape[1]} channels, weight expects {w.shape[1]}×group {g}")
    if w.shape[0] % g:
        raise InferError(f"Conv output channels {w.shape[0]} not divisible by group {g}")
    if len(ts) == 3 and ts[2].shape != (w.shape[0],):
        raise InferError(f"Conv bias shape {ts[2].shape} != ({w.shape[0]},)")
    k = w.shape[2:]
    _window_attrs(nsp, strides=(a["strides"], nsp), pads=(a["pads"], 2 * nsp), dilations=(a["dilations"], nsp))
    s, d, p = a["strides"] or [1] * nsp, a["dilations"] or [1] * nsp, a["pads"] or [0] * (2 * nsp)
    sp = [_spatial_out(x.shape[2 + i], k[i], s[i], d[i], p[i], p[i + nsp]) for i in range(nsp)]
    return [TensorType((x.shape[0], w.shape[0], *sp), x.dtype)]


register_op("Conv", _conv, {"strides": None, "dilations": None, "pads": None, "group": 1}, (2, 3),
            doc="X, W[, B]; pads = [begin..., end...]")


def _conv_transpose(ts, a):
    x, w = ts[0], ts[1]
    nsp = x.rank - 2
    g = a["group"]
    if x.shape[1] != w.shape[0]:
        raise InferError(f"ConvTranspose input has {x.shape[1]} channels, weight expects {w.shape[0]}")
    _window_attrs(nsp, strides=(a["strides"], nsp), pads=(a["pads"], 2 * nsp), dilations=(a["dilations"], nsp),
                  output_padding=(a["output_padding"], nsp))
    s, d, p = a["strides"] or [1] * nsp, a["dilations"] or [1] * nsp, a["pads"] or [0] * (2 * nsp)
    op_ = a["output_padding"] or [0] * nsp
    k = w.shape[2:]
    sp = [(x.shape[2 + i] - 1) * s[i] - p[i] - p[i + nsp] + d[i] * (k[i] - 1) + op_[i] + 1 for i in range(nsp)]
    return [TensorType((x.shape[0], w.shape[1] * g, *sp), x.dtype)]


register_op("ConvTranspose", _conv_transpose,
            {"strides": None, "dilations": None, "pads": None, "group": 1, "output_padding": None}, (2, 3))


def _window_attrs(nsp: int, **lists) -> None:
    """Window attributes must have one entry per spatial axis (pads: two)."""
    for name, (vals, n) in lists.items():
        if vals is not None and len(vals) != n:
            raise InferError(f"{name} has {len(vals)} entries, the input has {nsp} spatial axes (needs {n})")


def _pool(ts, a):
    x = ts[0]
    nsp = x.rank - 2
    k = a["kernel_shape"]
    if nsp < 1 or k is None:
        raise InferError(f"pooling needs a kernel_shape and an input of rank >= 3, got rank {x.rank}")
    _window_attrs(nsp, kernel_shape=(k, nsp), strides=(a["strides"], nsp), pads=(a["pads"], 2 * nsp),
                  dilations=(a.get("dilations"), nsp))
    s, d, p = a["strides"] or [1] * nsp, a.get("dilations") or [1] * nsp, a["pads"] or [0] * (2 * nsp)
    sp = [_spatial_out(x.shape[2 + i], k[i], s[i], d[i], p[i], p[i + nsp], bool(a["ceil_mode"])) for i in range(nsp)]
    return [TensorType((x.shape[0], x.shape[1], *sp), x.dtype)]


register_op("MaxPool", _pool, {"kernel_shape": None, "strides": None, "pads": None, "dilations": None,
                               "ceil_mode": 0})
register_op("AveragePool", _pool, {"kernel_shape": None, "strides": None, "pads": None, "ceil_mode": 0,
                                   "count_include_pad": 0})


def _global_pool(ts, a):
    x = ts[0]
    return [TensorType((x.shape[0], x.shape[1]) + (1,) * (x.rank - 2), x.dtype)]


register_op("GlobalAveragePool", _global_pool)
register_op("GlobalMaxPool", _global_pool)


# ---- linear algebra ---------------------------------------------------------------------------
def _gemm(ts, a):
    A, B = ts[0], ts[1]
    if A.rank != 2 or B.rank != 2:
        raise InferError(f"Gemm needs 2-D operands, got {A.shape} and {B.shape}")
    m, ka = (A.shape[1], A.shape[0]) if a["transA"] else A.shape
    kb, n = (B.shape[1], B.shape[0]) if a["transB"] else B.shape
    if ka != kb:
        raise InferError(f"Gemm inner dimensions differ: {ka} vs {kb}")
    if len(ts) == 3:
        broadcast_shapes(ts[2].shape, (m, n))
    return [TensorType((m, n), A.dtype)]


register_op("Gemm", _gemm, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}, (2, 3))


def _matmul(ts, a):
    A, B = ts[0].shape, ts[1].shape
    a2 = (1,) + A if len(A) == 1 else A
    b2 = B + (1,) if len(B) == 1 else B
    if a2[-1] != b2[-2]:
        raise InferError(f"MatMul inner dimensions differ: {A} @ {B}")
    out = broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(A) == 1:
        out = out[:-2] + out[-1:]
    if len(B) == 1:
        out = out[:-1]
    return [TensorType(out, ts[0].dtype)]


register_op("MatMul", _matmul, num_operands=(2, 2))


# ---- shape manipulation -----------------------------------------------------------------------
def _axis(ax, rank):
    if not -rank <= ax < max(rank, 1):
        raise InferError(f"axis {ax} out of range for rank {rank}")
    return ax % rank if rank else 0


def _flatten(ts, a):
    x = ts[0]
    ax = a["axis"] + x.rank if a["axis"] < 0 else a["axis"]     # ONNX: negative counts from the back
    return [TensorType((int(np.prod(x.shape[:ax])), int(np.prod(x.shape[ax:]))), x.dtype)]


register_op("Flatten", _flatten, {"axis": 1})


def _reshape(ts, a):
    x, shape = ts[0], tuple(a["shape"])
    if int(np.prod(shape)) != x.size or any(d < 0 for d in shape):
        raise InferError(f"cannot reshape {x.shape} to {shape}")
    return [TensorType(shape, x.dtype)]


register_op("Reshape", _reshape, {"shape": None}, doc="shape is the resolved output shape")


def _transpose(ts, a):
    x = ts[0]
    perm = a["perm"] if a["perm"] is not None else list(reversed(range(x.rank)))
    if sorted(perm) != list(range(x.rank)):
        raise InferError(f"bad permutation {perm} for rank {x.rank}")
    return [TensorType(tuple(x.shape[p] for p in perm), x.dtype)]


register_op("Transpose", _transpose, {"perm": None})


def _concat(ts, a):
    r = ts[0].rank
    ax = _axis(a["axis"], r)
    for t in ts[1:]:
        if t.rank != r or any(t.shape[i] != ts[0].shape[i] for i in range(r) if i != ax):
            raise InferError(f"Concat shapes {[t.shape for t in ts]} differ off axis {ax}")
        if t.dtype != ts[0].dtype:
            raise InferError("Concat operand dtypes differ")
    shape = list(ts[0].shape)
    shape[ax] = sum(t.shape[ax] for t in ts)
    return [TensorType(shape, ts[0].dtype)]


register_op("Concat", _concat, {"axis": 0}, (1, 1 << 16))


def _split(ts, a):
    x = ts[0]
    ax = _axis(a["axis"], x.rank)
    sizes = a["split"]
    if sum(sizes) != x.shape[ax]:
        raise InferError(f"Split sizes {sizes} do not sum to {x.shape[ax]}")
    out = []
    for s in sizes:
        sh = list(x.shape)
        sh[ax] = s
        out.append(TensorType(sh, x.dtype))
    return out


register_op("Split", _split, {"axis": 0, "split": None}, doc="split sizes resolved")


def _pad(ts, a):
    x, p = ts[0], a["pads"]
    if len(p) != 2 * x.rank:
        raise InferError(f"Pad needs {2 * x.rank} pads, got {len(p)}")
    shape = [x.shape[i] + p[i] + p[i + x.rank] for i in range(x.rank)]
    if any(d < 0 for d in shape):
        raise InferError(f"Pad gives a negative dimension: {shape}")
    return [TensorType(shape, x.dtype)]


register_op("Pad", _pad, {"pads": None, "mode": "constant", "value": 0.0})


def _squeeze(ts, a):
    x = ts[0]
    axes = [_axis(ax, x.rank) for ax in a["axes"]]
    for ax in axes:
        if x.shape[ax] != 1:
            raise InferError(f"cannot squeeze axis {ax} of size {x.shape[ax]}")
    return [TensorType([d for i, d in enumerate(x.shape) if i not in axes], x.dtype)]


register_op("Squeeze", _squeeze, {"axes": None}, doc="axes resolved (all size-1 axes when ONNX gave none)")


def _unsqueeze(ts, a):
    x = ts[0]
    r = x.rank + len(a["axes"])
    axes = sorted(_axis(ax, r) for ax in a["axes"])
    shape = list(x.shape)
    for ax in axes:
        shape.insert(ax, 1)
    return [TensorType(shape, x.dtype)]


register_op("Unsqueeze", _unsqueeze, {"axes": None})


def _slice(ts, a):
    x = ts[0]
    shape = list(x.shape)
    for st, en, ax, sp in zip(a["starts"], a["ends"], a["axes"], a["steps"]):
        ax = _axis(ax, x.rank)
        shape[ax] = len(range(*slice(st, en, sp).indices(x.shape[ax])))
    return [TensorType(shape, x.dtype)]


register_op("Slice", _slice, {"starts": None, "ends": None, "axes": None, "steps": None})


def _gather(ts, a):
    x, idx = ts[0], ts[1]
    ax = _axis(a["axis"], x.rank)
    return [TensorType(x.shape[:ax] + idx.shape + x.shape[ax + 1:], x.dtype)]


register_op("Gather", _gather, {"axis": 0}, (2, 2))
register_op("Expand", lambda ts, a: [TensorType(broadcast_shapes(ts[0].shape, tuple(a["shape"])), ts[0].dtype)],
            {"shape": None})
register_op("Resize", lambda ts, a: [TensorType(tuple(a["sizes"]), ts[0].dtype)],
            {"sizes": None, "mode": "nearest", "coordinate_transformation_mode": "half_pixel",
             "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75, "exclude_outside": 0,
             "extrapolation_value": 0.0}, doc="sizes is the resolved output shape")


def _reduce(ts, a):
    x = ts[0]
    axes = range(x.rank) if not a["axes"] else [_axis(ax, x.rank) for ax in a["axes"]]
    axes = set(axes)
    if a["keepdims"]:
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
    else:
        shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return [TensorType(shape, x.dtype)]


for _k in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
    register_op(_k, _reduce, {"axes": None, "keepdims": 1}, doc="axes resolved; empty = all")


# ---- qcompiler extensions: fused ops (made by the fuse-act pass, one kernel each in codegen) ----
# Semantics follow ONNX Runtime's com.microsoft FusedConv / FusedGemm:
#   FusedConv(X, W[, B[, Z]]) = activation(Conv(X, W, B) + Z)
#   FusedGemm(A, B[, C])      = activation(Gemm(A, B, C))
# ``activation`` is "" (none), "Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid" or
# "Tanh"; ``activation_params`` holds Clip's [min, max], LeakyRelu's [alpha], HardSigmoid's [alpha, beta].
ACTIVATIONS = ("", "Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh")


def _fused_conv(ts, a):
    if a["activation"] not in ACTIVATIONS:
        raise InferError(f"unknown fused activation '{a['activation']}'")
    out = _conv(ts[:3], a)
    if len(ts) == 4 and broadcast_shapes(ts[3].shape, out[0].shape) != out[0].shape:
        raise InferError(f"FusedConv residual {ts[3].shape} does not broadcast to {out[0].shape}")
    return out


def _fused_gemm(ts, a):
    if a["activation"] not in ACTIVATIONS:
        raise InferError(f"unknown fused activation '{a['activation']}'")
    return _gemm(ts, a)


register_op("FusedConv", _fused_conv, {"strides": None, "dilations": None, "pads": None, "group": 1,
                                       "activation": "", "activation_params": []}, (2, 4),
            doc="activation(Conv(X, W, B) + Z)")
register_op("FusedGemm", _fused_gemm, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0,
                                       "activation": "", "activation_params": []}, (2, 3),
            doc="activation(Gemm(A, B, C))")


# ---- comparisons, logic, selection and index ops (bool results are dtype "bool", printed i1) ----
# Comparisons take two operands of one dtype and give bool; And/Or/Xor/Not take and give bool;
# Where(cond: bool, x, y) broadcasts all three. PRelu(x, slope): slope broadcasts to x (per-channel
# [C,1,1] or channels-last [C]). Mod: ONNX semantics (fmod=0: the sign of the divisor, integers
# only; fmod=1: C fmod, the sign of the dividend). None of these has an integer kernel: the
# quantize pass leaves them float.
def _compare(ts, a):
    if ts[0].dtype != ts[1].dtype:
        raise InferError(f"compared dtypes differ: {ts[0].dtype} vs {ts[1].dtype}")
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), "bool")]


def _logical(ts, a):
    if any(t.dtype != "bool" for t in ts):
        raise InferError(f"logical ops take bool operands, got {', '.join(t.dtype for t in ts)}")
    return [TensorType(broadcast_shapes(*(t.shape for t in ts)), "bool")]


def _where(ts, a):
    c, x, y = ts
    if c.dtype != "bool" or x.dtype != y.dtype:
        raise InferError(f"Where needs a bool condition and equal value dtypes, got {c.dtype}, {x.dtype}, {y.dtype}")
    return [TensorType(broadcast_shapes(c.shape, x.shape, y.shape), x.dtype)]


def _float_test(ts, a):
    if ts[0].dtype not in ("float32", "float16", "bfloat16", "float64"):
        raise InferError(f"IsNaN/IsInf take a float operand, got {ts[0].dtype}")
    return [TensorType(ts[0].shape, "bool")]


def _prelu(ts, a):
    x, s = ts
    if x.dtype != s.dtype or broadcast_shapes(x.shape, s.shape) != x.shape:
        raise InferError(f"PRelu slope {s} must have x's dtype and broadcast to x {x}")
    return [TensorType(x.shape, x.dtype)]


def _mod(ts, a):
    if a["fmod"] == 0 and ts[0].dtype in ("float32", "float16", "bfloat16", "float64"):
        raise InferError("Mod with fmod=0 takes integers (ONNX): use fmod=1 for floats")
    return _binary(ts, a)


for _k in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
    register_op(_k, _compare, num_operands=(2, 2))
for _k in ("And", "Or", "Xor"):
    register_op(_k, _logical, num_operands=(2, 2))
register_op("Not", _logical)
register_op("Where", _where, num_operands=(3, 3), doc="Where(cond, x, y): x where cond else y")
register_op("IsNaN", _float_test)
register_op("IsInf", _float_test, {"detect_negative": 1, "detect_positive": 1})
register_op("Sign", _same)
register_op("Mod", _mod, {"fmod": 0}, (2, 2))
register_op("PRelu", _prelu, num_operands=(2, 2), doc="x if x >= 0 else slope * x (slope broadcasts to x)")


def _gather_nd(ts, a):
    x, idx = ts
    b = a["batch_dims"]
    k = idx.shape[-1] if idx.rank else 0
    if idx.dtype not in ("int64", "int32") or idx.rank < 1 or not 0 <= b < min(x.rank, idx.rank) \
            or b + k > x.rank or x.shape[:b] != idx.shape[:b]:
        raise InferError(f"GatherND cannot index {x} with {idx} (batch_dims {b})")
    return [TensorType(idx.shape[:-1] + x.shape[b + k:], x.dtype)]


def _scatter_nd(ts, a):
    x, idx, upd = ts
    k = idx.shape[-1] if idx.rank else 0
    if a["reduction"] != "none":
        raise InferError(f"ScatterND reduction '{a['reduction']}' is not supported (only 'none')")
    want = idx.shape[:-1] + x.shape[k:]
    if idx.dtype not in ("int64", "int32") or idx.rank < 1 or k > x.rank or upd.shape != want \
            or upd.dtype != x.dtype:
        raise InferError(f"ScatterND: updates {upd} do not fit data {x} and indices {idx} (want {want})")
    return [TensorType(x.shape, x.dtype)]


register_op("GatherND", _gather_nd, {"batch_dims": 0}, (2, 2))
register_op("ScatterND", _scatter_nd, {"reduction": "none"}, (3, 3),
            doc="a copy of data with updates written at indices (a repeated index: the last write wins)")
