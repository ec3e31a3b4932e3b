"""A small numpy reference evaluator for the simple op kinds, one op at a time.

``evaluate(op, arrays)`` computes an op's results from numpy arrays for its operands, following
ONNX semantics with the IR's normalized attributes (see :mod:`.ops`). It covers elementwise math
and activations, shape ops (Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Concat, Split, Slice,
Gather, Expand, Pad, Cast), comparisons and logic (bool results), Where, PRelu, Sign, Mod,
GatherND, ScatterND, reductions, Softmax, MatMul, Gemm and BatchNormalization: what
constant folding meets on weights and shape arithmetic. Convolutions and pooling are not here;
whole-model execution goes through onnxruntime.

    >>> evaluate(op, [np.ones((2, 3), np.float32)])   # op: %y = Transpose(%x) {perm = [1, 0]}
    [array of shape (3, 2)]

Results keep numpy's dtype for the operands' dtypes; callers that need the IR type exactly
(const-fold) cast to the result's declared dtype.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from .graph import Op
from .ops import REGISTRY
from .types import dequantize, np_dtype, quantize
from .windows import conv_sum

Kernel = Callable[[list, dict], list]
KERNELS: dict[str, Kernel] = {}


class EvalError(ValueError):
    """The op kind has no numpy kernel, or the kernel rejected its inputs."""


def registrar(table: dict):
    """A decorator factory: ``@kernel("Add", "Sub")`` registers a function in ``table`` under each kind."""
    def kernel(*kinds: str):
        def deco(fn):
            for k in kinds:
                table[k] = fn
            return fn
        return deco
    return kernel


kernel = registrar(KERNELS)
# kernels that also read the op (its operand/result types: quantization parameters, output shapes)
TYPED_KERNELS: dict[str, Callable[[Op, list, dict], list]] = {}
typed_kernel = registrar(TYPED_KERNELS)


def can_evaluate(kind: str) -> bool:
    return kind in KERNELS or kind in TYPED_KERNELS


def evaluate(op: Op, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Evaluate ``op`` on numpy ``arrays`` (one per operand); returns one array per result."""
    fn = KERNELS.get(op.kind)
    typed = TYPED_KERNELS.get(op.kind)
    if fn is None and typed is None:
        raise EvalError(f"{op.describe()}: no numpy kernel for op kind '{op.kind}'")
    attrs = {**(REGISTRY[op.kind].defaults if op.kind in REGISTRY else {}), **op.attrs}
    xs = [np.asarray(a) for a in arrays]
    out = fn(xs, attrs) if fn is not None else typed(op, xs, attrs)
    return [np.asarray(o) for o in out]


def _u(f):
    return lambda xs, a: [f(xs[0])]


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


def _erf(x) -> np.ndarray:
    """math.erf elementwise in float64 (the same values as np.vectorize(math.erf), 1.6x faster:
    a ViT's Gelu layers evaluate millions per reference run)."""
    x = np.asarray(x, np.float64)
    return np.fromiter(map(math.erf, x.ravel().tolist()), np.float64, x.size).reshape(x.shape)

# -- elementwise ---------------------------------------------------------------------------------
kernel("Identity", "Dropout")(_u(lambda x: x))
kernel("Relu")(_u(lambda x: np.maximum(x, np.zeros((), x.dtype))))
kernel("Sigmoid")(_u(_sigmoid))
for _k, _f in {"Tanh": np.tanh, "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Neg": np.negative,
               "Abs": np.abs, "Floor": np.floor, "Ceil": np.ceil, "Round": np.round}.items():
    kernel(_k)(_u(_f))
kernel("Reciprocal")(_u(lambda x: (np.ones((), x.dtype) / x).astype(x.dtype)))
kernel("Erf")(_u(lambda x: _erf(x).astype(x.dtype)))
kernel("Softplus")(_u(lambda x: np.logaddexp(0, x.astype(np.float64)).astype(x.dtype)))
kernel("HardSwish")(_u(lambda x: x * np.clip(x / 6 + 0.5, 0, 1).astype(x.dtype)))
kernel("LeakyRelu")(lambda xs, a: [np.where(xs[0] >= 0, xs[0], xs[0] * a["alpha"]).astype(xs[0].dtype)])
kernel("HardSigmoid")(lambda xs, a: [np.clip(xs[0] * a["alpha"] + a["beta"], 0, 1).astype(xs[0].dtype)])
kernel("Clip")(lambda xs, a: [np.clip(xs[0], a["min"], a["max"]).astype(xs[0].dtype)])


@kernel("Gelu")
def _gelu(xs, a):
    x = xs[0].astype(np.float64)
    if a["approximate"] == "tanh":
        y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    else:
        y = 0.5 * x * (1 + _erf(x / math.sqrt(2)))
    return [y.astype(xs[0].dtype)]


@kernel("Div")
def _div(xs, a):
    x, y = xs
    if x.dtype.kind in "iu":      # ONNX integer division truncates toward zero
        return [np.trunc(x.astype(np.float64) / y).astype(x.dtype)]
    return [np.divide(x, y)]


for _k, _f in {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum,
               "Min": np.minimum}.items():
    kernel(_k)(lambda xs, a, _f=_f: [_f(xs[0], xs[1])])
kernel("Pow")(lambda xs, a: [np.power(xs[0], xs[1].astype(xs[0].dtype)).astype(xs[0].dtype)])
kernel("Cast")(lambda xs, a: [xs[0].astype(np_dtype(a["to"]))])


def _softmax(x, axis, log=False):
    x64 = x.astype(np.float64)
    z = x64 - x64.max(axis=axis, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=axis, keepdims=True))
    return (z - lse if log else np.exp(z - lse)).astype(x.dtype)


kernel("Softmax")(lambda xs, a: [_softmax(xs[0], a["axis"])])
kernel("LogSoftmax")(lambda xs, a: [_softmax(xs[0], a["axis"], log=True)])


# -- shape ops -----------------------------------------------------------------------------------
kernel("Reshape")(lambda xs, a: [xs[0].reshape(a["shape"])])
kernel("Squeeze")(lambda xs, a: [np.squeeze(xs[0], axis=tuple(a["axes"]))])
kernel("Transpose")(lambda xs, a: [np.transpose(xs[0], a["perm"])])
kernel("Concat")(lambda xs, a: [np.concatenate(xs, axis=a["axis"])])
kernel("Expand")(lambda xs, a: [np.broadcast_to(xs[0], np.broadcast_shapes(xs[0].shape, tuple(a["shape"]))).copy()])


@kernel("Flatten")
def _flatten(xs, a):
    x = xs[0]
    ax = a["axis"] % (x.ndim + 1) if x.ndim else 0
    return [x.reshape(int(np.prod(x.shape[:ax])), int(np.prod(x.shape[ax:])))]


@kernel("Unsqueeze")
def _unsqueeze(xs, a):
    x = xs[0]
    r = x.ndim + len(a["axes"])
    return [np.expand_dims(x, tuple(sorted(ax % r for ax in a["axes"])))]


@kernel("Split")
def _split(xs, a):
    x = xs[0]
    cuts = np.cumsum(a["split"])[:-1]
    return np.split(x, cuts, axis=a["axis"])


@kernel("Slice")
def _slice(xs, a):
    x = xs[0]
    idx = [slice(None)] * x.ndim
    steps = a["steps"] or [1] * len(a["starts"])
    for st, en, ax, sp in zip(a["starts"], a["ends"], a["axes"], steps):
        idx[ax % x.ndim] = slice(*slice(st, en, sp).indices(x.shape[ax % x.ndim]))
    return [x[tuple(idx)]]


@kernel("Gather")
def _gather(xs, a):
    x, idx = xs
    ax = a["axis"] % x.ndim
    idx = np.where(idx < 0, idx + x.shape[ax], idx)
    return [np.take(x, idx, axis=ax)]


@kernel("Pad")
def _pad(xs, a):
    x, p = xs[0], a["pads"]
    r = x.ndim
    # negative pads crop
    crop = tuple(slice(max(-p[i], 0), x.shape[i] - max(-p[i + r], 0)) for i in range(r))
    x = x[crop]
    width = [(max(p[i], 0), max(p[i + r], 0)) for i in range(r)]
    mode = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}[a["mode"]]
    kw = {"constant_values": a["value"]} if mode == "constant" else {}
    return [np.pad(x, width, mode=mode, **kw)]


# -- reductions and linear algebra ---------------------------------------------------------------
def _reduce(f):
    def k(xs, a):
        x = xs[0]
        axes = tuple(range(x.ndim)) if not a["axes"] else tuple(ax % x.ndim for ax in a["axes"])
        return [np.asarray(f(x, axis=axes, keepdims=bool(a["keepdims"]))).astype(x.dtype)]
    return k


for _k, _f in {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}.items():
    kernel(_k)(_reduce(_f))
kernel("MatMul")(lambda xs, a: [np.matmul(xs[0], xs[1])])


@kernel("Gemm")
def _gemm(xs, a):
    A = xs[0].T if a["transA"] else xs[0]
    B = xs[1].T if a["transB"] else xs[1]
    y = a["alpha"] * (A @ B)
    if len(xs) == 3:
        y = y + a["beta"] * xs[2]
    return [y.astype(xs[0].dtype)]


@kernel("BatchNormalization")
def _batchnorm(xs, a):
    x, gamma, beta, mean, var = xs
    sh = (1, -1) + (1,) * (x.ndim - 2)
    s = gamma / np.sqrt(var + np.asarray(a["epsilon"], var.dtype))
    return [(x * s.reshape(sh) + (beta - mean * s).reshape(sh)).astype(x.dtype)]


# -- quantization (pre-quantized ONNX models; params in the types, see qcompiler.ir.ops) ------------
@typed_kernel("QuantizeLinear")
def _quantize_linear(op, xs, a):
    return [quantize(xs[0], op.result.type.quant)]


@typed_kernel("DequantizeLinear")
def _dequantize_linear(op, xs, a):
    return [dequantize(xs[0], op.operands[0].type.quant)]


def _int64(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A zero point (scalar or a vector along ``axis`` of an ``ndim``-D tensor) as int64."""
    v = np.asarray(v, np.int64)
    if v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = v.size
    return v.reshape(shape)


@typed_kernel("ConvInteger")
def _conv_integer(op, xs, a):
    x, w, zx, zw = xs
    xs64 = x.astype(np.int64) - _int64(zx, 0, x.ndim)          # padding then contributes 0
    ws64 = w.astype(np.int64) - _int64(zw, 0, w.ndim)
    y = conv_sum(xs64, ws64, a, tuple(op.result.type.shape[2:]))      # float64 sums of integers: exact below 2^53
    return [y.astype(np.int64).astype(np.int32)]


@typed_kernel("MatMulInteger")
def _matmul_integer(op, xs, a):
    A, B, za, zb = xs
    A64 = A.astype(np.int64) - _int64(za, -2, A.ndim)
    B64 = B.astype(np.int64) - _int64(zb, -1, B.ndim)
    return [np.matmul(A64, B64).astype(np.int32)]


# -- comparisons, logic, selection and index ops (bool results) ----------------------------------
for _k, _f in {"Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
               "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or,
               "Xor": np.logical_xor}.items():
    kernel(_k)(lambda xs, a, _f=_f: [np.asarray(_f(xs[0], xs[1]), bool)])
kernel("Not")(_u(np.logical_not))
kernel("IsNaN")(_u(np.isnan))
kernel("Sign")(_u(lambda x: np.sign(x).astype(x.dtype)))
kernel("Where")(lambda xs, a: [np.where(xs[0], xs[1], xs[2])])
kernel("PRelu")(lambda xs, a: [np.where(xs[0] < 0, xs[0] * xs[1], xs[0]).astype(xs[0].dtype)])


@kernel("IsInf")
def _isinf(xs, a):
    x = xs[0]
    return [np.isinf(x) & (((x > 0) & bool(a["detect_positive"])) | ((x < 0) & bool(a["detect_negative"])))]


@kernel("Mod")
def _mod(xs, a):
    x, y = xs
    with np.errstate(divide="ignore", invalid="ignore"):
        return [(np.fmod(x, y) if a["fmod"] else np.mod(x, y)).astype(x.dtype)]


@kernel("GatherND")
def _gather_nd(xs, a):
    x, idx = xs
    b = a["batch_dims"]
    k = idx.shape[-1]
    idx = np.where(idx < 0, idx + np.array(x.shape[b:b + k]), idx)
    bshape = x.shape[:b]
    out = np.empty(idx.shape[:-1] + x.shape[b + k:], x.dtype)
    for bi in np.ndindex(*bshape):
        sub = idx[bi].reshape(-1, k)
        got = x[bi][tuple(sub.T)] if k else np.broadcast_to(x[bi], (len(sub),) + x[bi].shape)
        out[bi] = got.reshape(idx.shape[b:-1] + x.shape[b + k:])
    return [out]


@kernel("ScatterND")
def _scatter_nd(xs, a):
    x, idx, upd = xs
    k = idx.shape[-1]
    out = x.copy()
    idx = np.where(idx < 0, idx + np.array(x.shape[:k]), idx).reshape(-1, k)
    upd = upd.reshape((len(idx),) + x.shape[k:])
    for i, row in enumerate(idx):               # in order: a repeated index keeps the last update
        out[tuple(row)] = upd[i]
    return [out]
