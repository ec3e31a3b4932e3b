"""Elementwise ops as :class:`Lazy` expressions (composed into their consumer kernel).

Every builder has the signature ``build(ctx, attrs, ins, out_types) -> list[LTensor]``.
Arithmetic happens in the compute dtype (float32 for float values, see :mod:`.tensor`).
"""
from __future__ import annotations

import math

from tvm import tirx

from .tensor import Lazy, broadcast_index, cast, compute_dtype, const, dtype_of


def _f(x, v):
    return const(v, dtype_of(x))


def fast_exp(x):
    """exp for float32 as a polynomial (Cephes, as TVM's fast_exp): vectorizes, unlike a libm
    call per lane; relative error ~1e-7 over the whole float range."""
    if dtype_of(x) != "float32":
        return tirx.exp(x)
    f = lambda v: tirx.const(v, "float32")  # noqa: E731
    xc = tirx.max(tirx.min(x, f(88.3762626647950)), f(-88.3762626647949))
    n = tirx.floor(xc * f(1.44269504088896341) + f(0.5))
    r = xc - n * f(0.6931471805599453)
    p = f(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + f(c)
    y = p * r * r + r + f(1.0)
    two_n = tirx.reinterpret("float32", tirx.shift_left(cast(n + f(127.0), "int32"), tirx.const(23, "int32")))
    return tirx.max(two_n * y, x)


# erf(x) ~ x P(x^2) / Q(x^2) on |x| <= 4 (erf rounds to +-1 in float32 beyond 3.92): a rational
# fit of our own (iteratively reweighted least squares on 8000 points of [0, 4] against math.erf;
# the fit script is in the engineering log, 2026-11-28). Max |error| 2.2e-7 in float64, 5.6e-7
# evaluated in float32 over [-6, 6] (libm's erff: 3e-8); one division, vectorizes.
_ERF_P = (1.1283786034511334, 0.19963251056834666, 0.05049982649538144, 0.0037062909768885853,
          0.0001434717655801274, -1.9898385045590493e-06, 2.031560836064392e-08)
_ERF_Q = (1.0, 0.5102477861494944, 0.11485446223065127, 0.014325775009691672, 0.0009629551558882491)
ERF_CLAMP = 4.0


def fast_erf(x):
    """erf for float32 as a rational function (see _ERF_P): a libm ``erff`` call per element does
    not vectorize (smart-turn's Gelu on 400x1536: 17.7 ms); other dtypes: ``tirx.erf``."""
    if dtype_of(x) != "float32":
        return tirx.erf(x)
    f = lambda v: tirx.const(v, "float32")  # noqa: E731
    xc = tirx.max(tirx.min(x, f(ERF_CLAMP)), f(-ERF_CLAMP))
    t = xc * xc
    p = f(_ERF_P[-1])
    for c in _ERF_P[-2::-1]:
        p = p * t + f(c)
    q = f(_ERF_Q[-1])
    for c in _ERF_Q[-2::-1]:
        q = q * t + f(c)
    return tirx.max(tirx.min(xc * p / q, f(1.0)), f(-1.0))


def activation(name: str, params, x):
    """The fused activation of FusedConv/FusedGemm (and the standalone ops) on expression ``x``."""
    if name == "":
        return x
    if name == "Relu":
        return tirx.max(x, _f(x, 0))
    if name == "Clip":
        lo, hi = (list(params) + [float("-inf"), float("inf")])[:2]
        return clip(x, lo, hi)
    if name == "LeakyRelu":
        alpha = params[0] if params else 0.01
        return tirx.Select(x >= _f(x, 0), x, x * _f(x, alpha))
    if name == "HardSigmoid":
        alpha, beta = (list(params) + [0.2, 0.5][len(params):])[:2]
        return clip(x * _f(x, alpha) + _f(x, beta), 0.0, 1.0)
    if name == "HardSwish":
        return x * clip(x * _f(x, 1.0 / 6.0) + _f(x, 0.5), 0.0, 1.0)
    if name == "Sigmoid":
        return _f(x, 1) / (_f(x, 1) + fast_exp(-x))
    if name == "Tanh":
        return tirx.tanh(x)
    raise ValueError(f"unknown activation '{name}'")


def clip(x, lo, hi):
    if lo is not None and lo != float("-inf"):
        x = tirx.max(x, _f(x, lo))
    if hi is not None and hi != float("inf"):
        x = tirx.min(x, _f(x, hi))
    return x


def _unary(fn):
    def build(ctx, a, ins, outs):
        (x,) = ins
        return [Lazy(x.shape, outs[0].dtype, lambda idx: fn(x.at(idx), a))]
    return build


def _round(x, a):
    return tirx.nearbyint(x) if dtype_of(x).startswith("float") else x


def _gelu(x, a):
    if a.get("approximate", "none") == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return _f(x, 0.5) * x * (_f(x, 1) + tirx.tanh(_f(x, c) * (x + _f(x, 0.044715) * x * x * x)))
    return _f(x, 0.5) * x * (_f(x, 1) + fast_erf(x * _f(x, 1 / math.sqrt(2.0))))


def _softplus(x, a):
    # log(1 + exp(x)), stable for large x
    return tirx.Select(x > _f(x, 20), x, tirx.log(_f(x, 1) + tirx.exp(x)))


UNARY = {
    "Relu": lambda x, a: tirx.max(x, _f(x, 0)),
    "Sigmoid": lambda x, a: activation("Sigmoid", [], x),
    "Tanh": lambda x, a: tirx.tanh(x),
    "Sqrt": lambda x, a: tirx.sqrt(x),
    "Erf": lambda x, a: fast_erf(x),
    "Exp": lambda x, a: fast_exp(x),
    "Log": lambda x, a: tirx.log(x),
    "Neg": lambda x, a: -x,
    "Abs": lambda x, a: tirx.abs(x),
    "Reciprocal": lambda x, a: _f(x, 1) / x,
    "Identity": lambda x, a: x,
    "Dropout": lambda x, a: x,
    "HardSwish": lambda x, a: activation("HardSwish", [], x),
    "Softplus": _softplus,
    "Floor": lambda x, a: tirx.floor(x) if dtype_of(x).startswith("float") else x,
    "Ceil": lambda x, a: tirx.ceil(x) if dtype_of(x).startswith("float") else x,
    "Round": _round,
    "LeakyRelu": lambda x, a: activation("LeakyRelu", [a["alpha"]], x),
    "HardSigmoid": lambda x, a: activation("HardSigmoid", [a["alpha"], a["beta"]], x),
    "Clip": lambda x, a: clip(x, a["min"], a["max"]),
    "Gelu": _gelu,
}


def _div(x, y):
    if dtype_of(x).startswith("float"):
        return x / y
    return tirx.truncdiv(x, y)


def _pow(x, y):
    return tirx.power(x, y)


BINARY = {
    "Add": lambda x, y: x + y,
    "Sub": lambda x, y: x - y,
    "Mul": lambda x, y: x * y,
    "Div": _div,
    "Max": lambda x, y: tirx.max(x, y),
    "Min": lambda x, y: tirx.min(x, y),
}


def _binary(fn):
    def build(ctx, a, ins, outs):
        x, y = ins
        shape = outs[0].shape
        return [Lazy(shape, outs[0].dtype,
                     lambda idx: fn(x.at(broadcast_index(idx, x.shape)), y.at(broadcast_index(idx, y.shape))))]
    return build


def _build_pow(ctx, a, ins, outs):
    x, y = ins
    shape, dt = outs[0].shape, outs[0].dtype
    cdt = compute_dtype(dt)
    exponent = ctx.scalar_value(1)
    if exponent is not None and float(exponent) in (1.0, 2.0, 3.0, 0.5):
        e = float(exponent)

        def fn(idx):
            v = cast(x.at(broadcast_index(idx, x.shape)), cdt)
            return {1.0: v, 2.0: v * v, 3.0: v * v * v}.get(e, tirx.sqrt(v) if e == 0.5 else v)
        return [Lazy(shape, dt, fn)]
    return [Lazy(shape, dt, lambda idx: tirx.power(cast(x.at(broadcast_index(idx, x.shape)), cdt),
                                                   cast(y.at(broadcast_index(idx, y.shape)), cdt)))]


def _build_cast(ctx, a, ins, outs):
    (x,) = ins
    to = compute_dtype(outs[0].dtype)

    def fn(idx):
        v = x.at(idx)
        if to == "bool":
            return tirx.NE(v, const(0, dtype_of(v)))      # (a te load's != is a lazy NotEqualOp)
        if dtype_of(v).startswith("float") and not to.startswith("float"):
            v = tirx.trunc(v)          # float -> int casts truncate toward zero (as ONNX / C)
        return cast(v, to)
    return [Lazy(outs[0].shape, outs[0].dtype, fn)]


def _build_batchnorm(ctx, a, ins, outs):
    x = ins[0]
    eps = float(a["epsilon"])
    data = [ctx.const_data(i) for i in range(1, 5)]
    c = x.shape[1] if x.rank > 1 else 1
    if all(d is not None for d in data):
        import numpy as np
        g, b, m, v = (np.asarray(d, np.float64) for d in data)
        scale = g / np.sqrt(v + eps)
        shift = b - m * scale
        s_t = ctx.vector(scale.astype(np.float32))
        h_t = ctx.vector(shift.astype(np.float32))
        return [Lazy(x.shape, outs[0].dtype, lambda idx: x.at(idx) * s_t.at((idx[1],)) + h_t.at((idx[1],)))]
    g, b, m, v = ins[1:]
    del c

    def fn(idx):
        ch = (idx[1],)
        xv = x.at(idx)
        return (xv - m.at(ch)) / tirx.sqrt(v.at(ch) + const(eps, dtype_of(xv))) * g.at(ch) + b.at(ch)
    return [Lazy(x.shape, outs[0].dtype, fn)]


def _build_lrn(ctx, a, ins, outs):
    """LRN across channels: x / (bias + alpha/size * sum of x^2 over a window of ``size`` channels)^beta."""
    (x,) = ins
    size = int(a["size"])
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    alpha, beta, bias = float(a["alpha"]), float(a["beta"]), float(a["bias"])
    nc = x.shape[1]

    def fn(idx):
        xv = x.at(idx)
        acc = None
        for d in range(-lo, hi + 1):
            c = idx[1] + d
            v = x.at((idx[0], c, *idx[2:]))
            term = tirx.if_then_else(tirx.all(c >= 0, c < nc), v * v, const(0.0, dtype_of(v)))
            acc = term if acc is None else acc + term
        base = const(bias, dtype_of(xv)) + const(alpha / size, dtype_of(xv)) * acc
        return xv / tirx.power(base, const(beta, dtype_of(xv)))
    return [Lazy(x.shape, outs[0].dtype, fn)]


# ---- comparisons, logic, selection (bool results: not conv/gemm epilogues) ----
def _sign(x, a):
    z = _f(x, 0)
    return tirx.Select(x > z, _f(x, 1), tirx.Select(x < z, _f(x, -1), z))


def _isinf(x, a):
    inf = tirx.isinf(x)
    if not a["detect_positive"]:
        inf = tirx.all(inf, x < _f(x, 0))
    if not a["detect_negative"]:
        inf = tirx.all(inf, x > _f(x, 0))
    return inf


def _mod(x, y, a):
    if dtype_of(x).startswith("float"):
        return x - tirx.trunc(x / y) * y       # C fmod (ONNX: floats need fmod=1); LLVM lowers no tirx.fmod
    return tirx.truncmod(x, y) if a["fmod"] else tirx.floormod(x, y)


LOGIC_UNARY = {"Not": lambda x, a: tirx.Not(x), "IsNaN": lambda x, a: tirx.isnan(x), "IsInf": _isinf}
def _cmp(fn):
    def f(x, y):
        if dtype_of(x) == "bool":         # TVM's LLVM codegen emits fcmp for i1 operands
            x, y = cast(x, "int8"), cast(y, "int8")
        return fn(x, y)
    return f


LOGIC_BINARY = {
    "Equal": _cmp(tirx.EQ), "Less": _cmp(tirx.LT), "Greater": _cmp(tirx.GT), "LessOrEqual": _cmp(tirx.LE),
    "GreaterOrEqual": _cmp(tirx.GE), "And": tirx.And, "Or": tirx.Or, "Xor": _cmp(tirx.NE),
}
UNARY["Sign"] = _sign


def _build_where(ctx, a, ins, outs):
    c, x, y = ins
    return [Lazy(outs[0].shape, outs[0].dtype,
                 lambda idx: tirx.Select(c.at(broadcast_index(idx, c.shape)), x.at(broadcast_index(idx, x.shape)),
                                         y.at(broadcast_index(idx, y.shape))))]


def _build_prelu(ctx, a, ins, outs):
    x, s = ins

    def fn(idx):
        v = x.at(idx)
        return tirx.Select(v < _f(v, 0), v * s.at(broadcast_index(idx, s.shape)), v)
    return [Lazy(outs[0].shape, outs[0].dtype, fn)]


def _build_mod(ctx, a, ins, outs):
    x, y = ins
    return [Lazy(outs[0].shape, outs[0].dtype,
                 lambda idx: _mod(x.at(broadcast_index(idx, x.shape)), y.at(broadcast_index(idx, y.shape)), a))]


BUILDERS = {k: _unary(f) for k, f in UNARY.items()}
BUILDERS.update({k: _binary(f) for k, f in BINARY.items()})
BUILDERS["Pow"] = _build_pow
BUILDERS["Cast"] = _build_cast
BUILDERS["BatchNormalization"] = _build_batchnorm
BUILDERS.update({k: _unary(f) for k, f in LOGIC_UNARY.items()})
BUILDERS.update({k: _binary(f) for k, f in LOGIC_BINARY.items()})
BUILDERS.update({"Where": _build_where, "PRelu": _build_prelu, "Mod": _build_mod})

# ops that read their operands at the output index (up to broadcasting): a conv/gemm epilogue
# (bool results are left out: a conv/gemm kernel writes its own dtype)
ELEMENTWISE = frozenset(BUILDERS) - frozenset(LOGIC_UNARY) - frozenset(LOGIC_BINARY)
BUILDERS["LRN"] = _build_lrn          # reads neighbouring channels: fused, but not an epilogue
