"""Reductions, Softmax/LogSoftmax and LayerNormalization, always computed in float32.

Each builder emits its reduction stages as te.compute (shape = the input with the reduced axes
kept as size 1) and returns the final elementwise step as a :class:`Lazy`, so that it fuses with
what follows. The x86 schedule computes the reduction stages per row, inside the output's
parallel loop (``rowwise``) when the reduced axes are the trailing ones.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from .elementwise import fast_exp
from .tensor import Buf, Lazy, compute, const, dtype_of

F32 = "float32"


def _reduce_stage(x, axes, fn, name):
    """te.compute over x's shape with ``axes`` kept as 1; ``fn(values, reduce_axes)`` reduces."""
    kshape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    red = [te.reduce_axis((0, x.shape[d]), f"r{d}") for d in axes]

    def body(*idx):
        src = list(idx)
        for d, r in zip(axes, red):
            src[d] = r
        return fn(x.at(tuple(src)), red)
    return compute(kshape or (1,), body, name=name), kshape


def _kidx(idx, axes):
    return tuple(tirx.const(0, "int32") if d in axes else i for d, i in enumerate(idx))


def _trailing(axes, rank):
    return sorted(axes) == list(range(rank - len(axes), rank))


def softmax(ctx, a, ins, outs, log: bool = False):
    (x,) = ins
    ax = a["axis"] % x.rank
    axes = [ax]
    mx, _ = _reduce_stage(x, axes, lambda v, r: te.max(v, axis=r), "rmax")
    # exp once, in a vectorizable stage; the sum and the output read it
    e = compute(x.shape, lambda *idx: fast_exp(x.at(idx) - mx[_kidx(idx, axes)]), "rexp")
    eb = Buf(e, x.shape, F32)
    sm, _ = _reduce_stage(eb, axes, lambda v, r: te.sum(v, axis=r), "rsum")
    ctx.schedule("rowwise" if _trailing(axes, x.rank) else "generic", rows=x.rank - 1)
    if log:
        return [Lazy(x.shape, outs[0].dtype,
                     lambda idx: x.at(idx) - mx[_kidx(idx, axes)] - tirx.log(sm[_kidx(idx, axes)]))]
    return [Lazy(x.shape, outs[0].dtype, lambda idx: eb.at(idx) / sm[_kidx(idx, axes)])]


def layernorm(ctx, a, ins, outs):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    ax = a["axis"] % x.rank
    axes = list(range(ax, x.rank))
    count = float(np.prod(x.shape[ax:]))
    inv = const(1.0 / count, F32)
    msum, _ = _reduce_stage(x, axes, lambda v, r: te.sum(v, axis=r), "rmean")
    mean = lambda k: msum[k] * inv  # noqa: E731
    vsum, _ = _reduce_stage(Lazy(x.shape, F32, lambda idx: _sq(x.at(idx) - mean(_kidx(idx, axes)))),
                            axes, lambda v, r: te.sum(v, axis=r), "rvar")
    eps = float(a["epsilon"])
    ctx.schedule("rowwise", rows=ax)

    def fn(idx):
        k = _kidx(idx, axes)
        v = (x.at(idx) - mean(k)) * tirx.rsqrt(vsum[k] * inv + const(eps, F32))
        v = v * scale.at(_bidx(idx, scale.shape))
        if bias is not None:
            v = v + bias.at(_bidx(idx, bias.shape))
        return v
    return [Lazy(x.shape, outs[0].dtype, fn)]


def _sq(v):
    return v * v


def _bidx(idx, shape):
    from .tensor import broadcast_index
    return broadcast_index(idx, shape)


REDUCERS = {
    "ReduceSum": lambda v, r: te.sum(v, axis=r),
    "ReduceMean": lambda v, r: te.sum(v, axis=r),
    "ReduceMax": lambda v, r: te.max(v, axis=r),
    "ReduceMin": lambda v, r: te.min(v, axis=r),
}


def reduce(ctx, a, ins, outs, kind: str):
    (x,) = ins
    axes = sorted(range(x.rank) if not a["axes"] else {d % x.rank for d in a["axes"]})
    st, kshape = _reduce_stage(x, axes, REDUCERS[kind], "reduce")
    ctx.schedule("rowwise" if _trailing(axes, x.rank) and len(axes) < x.rank else "generic",
                 rows=x.rank - len(axes))
    buf = Buf(st, kshape, x.dtype if x.dtype not in ("float16", "bfloat16") else F32)
    out_shape = outs[0].shape
    count = float(np.prod([x.shape[d] for d in axes]))

    def fn(idx):
        if a["keepdims"]:
            v = buf.at(idx)
        else:
            it = iter(idx)
            v = buf.at(tuple(tirx.const(0, "int32") if d in axes else next(it) for d in range(x.rank)))
        if kind == "ReduceMean":
            v = v / const(count, dtype_of(v))
        return v
    return [Lazy(out_shape, outs[0].dtype, fn)]
