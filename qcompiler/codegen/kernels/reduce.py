"""Reductions, Softmax/LogSoftmax and LayerNormalization, always computed in float32.

Each builder emits its reduction stages as te.compute (shape = the input with the reduced axes
kept as size 1) and returns the final elementwise step as a :class:`Lazy`, so that it fuses with
what follows. The x86 schedule computes the reduction stages per row, inside the output's
parallel loop (``rowwise``) when the reduced axes are the trailing ones.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from ..target import Family
from .elementwise import fast_exp
from .tensor import Buf, Lazy, compute, const, dtype_of

F32 = "float32"


_NEUTRAL = {"sum": lambda: const(0.0, F32), "max": lambda: tirx.min_value(F32), "min": lambda: tirx.max_value(F32)}
_REDUCE = {"sum": te.sum, "max": te.max, "min": te.min}


def _reduce_stage(ctx, x, axes, kind, name):
    """te.compute over x's shape with ``axes`` kept as 1, reducing with ``kind`` (sum/max/min).

    On a CPU a reduction over the last axis alone that spans at least two vectors is computed in
    two stages, so that its loop is vectorized instead of one scalar add chain: ``name_part``
    keeps ``vw`` partial results per row (lane l reduces elements l, l + vw, ...; the lanes past
    the end read the reduction's neutral element), then ``name`` reduces the ``vw`` lanes. The
    sum is reassociated (float32 rounding differs from the one-chain order by a few ulp)."""
    kshape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    reducer = _REDUCE[kind]
    last, n = x.rank - 1, x.shape[-1]
    vw = ctx.vw
    if axes == [last] and ctx.spec.family is not Family.CUDA and n >= 2 * vw and x.dtype == F32:
        ro = te.reduce_axis((0, -(-n // vw)), "ro")
        neutral = _NEUTRAL[kind]()

        def part_body(*idx):
            j = ro * vw + idx[-1]
            v = x.at(tuple(idx[:-1]) + (tirx.min(j, n - 1),))
            return reducer(v if n % vw == 0 else tirx.if_then_else(j < n, v, neutral), axis=ro)
        part = compute(kshape[:-1] + (vw,), part_body, name=name + "_part")
        rl = te.reduce_axis((0, vw), "rl")
        return compute(kshape, lambda *idx: reducer(part[tuple(idx[:-1]) + (rl,)], axis=rl), name=name), kshape
    red = [te.reduce_axis((0, x.shape[d]), f"r{d}") for d in axes]

    def body(*idx):
        src = list(idx)
        for d, r in zip(axes, red):
            src[d] = r
        return reducer(x.at(tuple(src)), axis=red)
    return compute(kshape or (1,), body, name=name), kshape


def _kidx(idx, axes):
    return tuple(tirx.const(0, "int32") if d in axes else i for d, i in enumerate(idx))


def _trailing(axes, rank):
    return sorted(axes) == list(range(rank - len(axes), rank))


def softmax(ctx, a, ins, outs, log: bool = False):
    (x,) = ins
    ax = a["axis"] % x.rank
    axes = [ax]
    mx, _ = _reduce_stage(ctx, x, axes, "max", "rmax")
    # exp once, in a vectorizable stage; the sum and the output read it
    e = compute(x.shape, lambda *idx: fast_exp(x.at(idx) - mx[_kidx(idx, axes)]), "rexp")
    eb = Buf(e, x.shape, F32)
    sm, _ = _reduce_stage(ctx, eb, axes, "sum", "rsum")
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
    msum, _ = _reduce_stage(ctx, x, axes, "sum", "rmean")
    mean = lambda k: msum[k] * inv  # noqa: E731
    vsum, _ = _reduce_stage(ctx, Lazy(x.shape, F32, lambda idx: _sq(x.at(idx) - mean(_kidx(idx, axes)))),
                            axes, "sum", "rvar")
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


REDUCERS = {"ReduceSum": "sum", "ReduceMean": "sum", "ReduceMax": "max", "ReduceMin": "min"}


def reduce(ctx, a, ins, outs, kind: str):
    (x,) = ins
    axes = sorted(range(x.rank) if not a["axes"] else {d % x.rank for d in a["axes"]})
    st, kshape = _reduce_stage(ctx, x, axes, REDUCERS[kind], "reduce")
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
