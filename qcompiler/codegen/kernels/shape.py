"""Data-movement ops as :class:`Lazy` index maps: reshapes, transpose, concat, split, slice, pad,
gather, expand and resize. Same builder signature as :mod:`.elementwise`."""
from __future__ import annotations

import numpy as np
from tvm import tirx

from .tensor import Lazy, broadcast_index, cast, const, linearize, unravel

I32 = "int32"


def _i(v):
    return tirx.const(int(v), I32)


def _reshape(ctx, a, ins, outs):
    (x,) = ins
    shape = outs[0].shape
    if tuple(shape) == tuple(x.shape):
        return [x]
    return [Lazy(shape, outs[0].dtype, lambda idx: x.at(unravel(linearize(idx, shape), x.shape)))]


def _transpose(ctx, a, ins, outs):
    (x,) = ins
    perm = a["perm"] if a["perm"] is not None else list(reversed(range(x.rank)))
    inv = np.argsort(perm)
    return [Lazy(outs[0].shape, outs[0].dtype, lambda idx: x.at(tuple(idx[int(j)] for j in inv)))]


def _concat(ctx, a, ins, outs):
    shape = outs[0].shape
    ax = a["axis"] % len(shape)
    offs = np.cumsum([0] + [t.shape[ax] for t in ins])

    def fn(idx):
        def part(k):
            t = ins[k]
            sub = tuple(i - _i(offs[k]) if d == ax else i for d, i in enumerate(idx))
            return t.at(sub)
        v = part(len(ins) - 1)
        for k in range(len(ins) - 2, -1, -1):
            v = tirx.if_then_else(idx[ax] < _i(offs[k + 1]), part(k), v)
        return v
    return [Lazy(shape, outs[0].dtype, fn)]


def _split(ctx, a, ins, outs):
    (x,) = ins
    ax = a["axis"] % x.rank
    res, off = [], 0
    for t in outs:
        o = off
        res.append(Lazy(t.shape, t.dtype, lambda idx, o=o: x.at(
            tuple(i + _i(o) if d == ax else i for d, i in enumerate(idx)))))
        off += t.shape[ax]
    return res


def _slice(ctx, a, ins, outs):
    (x,) = ins
    start = [0] * x.rank
    step = [1] * x.rank
    steps = a["steps"] or [1] * len(a["starts"])
    axes = a["axes"] if a["axes"] is not None else list(range(len(a["starts"])))
    for st, en, ax, sp in zip(a["starts"], a["ends"], axes, steps):
        ax = ax % x.rank
        r = range(*slice(st, en, sp).indices(x.shape[ax]))
        start[ax], step[ax] = r.start, r.step
    return [Lazy(outs[0].shape, outs[0].dtype,
                 lambda idx: x.at(tuple(_i(s) + i * _i(p) if (s or p != 1) else i
                                        for i, s, p in zip(idx, start, step))))]


def _pad(ctx, a, ins, outs):
    x = ins[0]
    r = x.rank
    p = a["pads"]
    begin, mode = p[:r], a["mode"]
    value = a.get("value", 0.0)

    def fn(idx):
        src = [i - _i(b) if b else i for i, b in zip(idx, begin)]
        if mode == "constant":
            conds = [tirx.all(s >= 0, s < _i(d)) for s, d, b, e in zip(src, x.shape, begin, p[r:]) if b or e]
            if not conds:
                return x.at(src)
            return tirx.if_then_else(tirx.all(*conds), x.at(src), const(value, x.cdtype))
        out = []
        for s, d in zip(src, x.shape):
            d = _i(d)
            if mode == "edge":
                out.append(tirx.min(tirx.max(s, _i(0)), d - 1))
            elif mode == "reflect":
                s2 = tirx.abs(s)
                out.append(tirx.Select(s2 >= d, _i(2) * (d - 1) - s2, s2))
            else:
                raise NotImplementedError(f"Pad mode '{mode}'")
        return x.at(tuple(out))
    return [Lazy(outs[0].shape, outs[0].dtype, fn)]


def _gather(ctx, a, ins, outs):
    x, ind = ins
    ax = a["axis"] % x.rank
    k = ind.rank
    data = ctx.const_data(1)
    if data is not None and data.size == 1:          # a constant index: a slice
        c = int(np.asarray(data).reshape(-1)[0]) % x.shape[ax]
        return [Lazy(outs[0].shape, outs[0].dtype,
                     lambda idx: x.at(tuple(idx[:ax]) + (_i(c),) + tuple(idx[ax + k:])))]

    def fn(idx):
        j = cast(ind.at(tuple(idx[ax:ax + k])), I32)
        j = tirx.Select(j < 0, j + _i(x.shape[ax]), j)
        return x.at(tuple(idx[:ax]) + (j,) + tuple(idx[ax + k:]))
    return [Lazy(outs[0].shape, outs[0].dtype, fn)]


def _expand(ctx, a, ins, outs):
    (x,) = ins
    return [Lazy(outs[0].shape, outs[0].dtype, lambda idx: x.at(broadcast_index(idx, x.shape)))]


# ---- Resize (nearest / linear over the trailing axes; cubic is not supported) ------------------
def _src_coord(out_i, in_size: int, out_size: int, mode: str):
    """The (float) source coordinate of output index ``out_i`` along one axis."""
    f = lambda v: tirx.const(float(v), "float32")  # noqa: E731
    x = cast(out_i, "float32")
    scale = out_size / in_size
    if mode == "half_pixel":
        return (x + f(0.5)) / f(scale) - f(0.5)
    if mode == "pytorch_half_pixel":
        return (x + f(0.5)) / f(scale) - f(0.5) if out_size > 1 else f(0.0)
    if mode == "align_corners":
        return x * f((in_size - 1) / (out_size - 1)) if out_size > 1 else f(0.0)
    if mode == "asymmetric":
        return x / f(scale)
    if mode == "tf_half_pixel_for_nn":
        return (x + f(0.5)) / f(scale)
    raise NotImplementedError(f"Resize coordinate_transformation_mode '{mode}'")


def _nearest(c, mode: str, in_size: int):
    f = lambda v: tirx.const(float(v), "float32")  # noqa: E731
    if mode == "round_prefer_floor":
        i = tirx.ceil(c - f(0.5))
    elif mode == "round_prefer_ceil":
        i = tirx.floor(c + f(0.5))
    elif mode == "floor":
        i = tirx.floor(c)
    elif mode == "ceil":
        i = tirx.ceil(c)
    else:
        raise NotImplementedError(f"Resize nearest_mode '{mode}'")
    return tirx.min(tirx.max(cast(i, I32), _i(0)), _i(in_size - 1))


def _resize(ctx, a, ins, outs):
    x = ins[0]
    shape = outs[0].shape
    mode, ctm = a["mode"], a["coordinate_transformation_mode"]
    axes = [d for d in range(x.rank) if x.shape[d] != shape[d]]
    if mode == "nearest":
        def fn(idx):
            src = list(idx)
            for d in axes:
                src[d] = _nearest(_src_coord(idx[d], x.shape[d], shape[d], ctm), a["nearest_mode"], x.shape[d])
            return x.at(tuple(src))
        return [Lazy(shape, outs[0].dtype, fn)]
    if mode != "linear":
        raise NotImplementedError(f"Resize mode '{mode}' (only nearest and linear are lowered)")

    def fn(idx):
        corners = [(list(idx), None)]
        for d in axes:
            c = _src_coord(idx[d], x.shape[d], shape[d], ctm)
            c = tirx.max(c, tirx.const(0.0, "float32"))
            i0 = tirx.min(cast(tirx.floor(c), I32), _i(x.shape[d] - 1))
            i1 = tirx.min(i0 + 1, _i(x.shape[d] - 1))
            w1 = tirx.min(c - cast(i0, "float32"), tirx.const(1.0, "float32"))
            nxt = []
            for src, w in corners:
                for ii, ww in ((i0, tirx.const(1.0, "float32") - w1), (i1, w1)):
                    s2 = list(src)
                    s2[d] = ii
                    nxt.append((s2, ww if w is None else w * ww))
            corners = nxt
        acc = None
        for src, w in corners:
            v = cast(x.at(tuple(src)), "float32") * w if w is not None else cast(x.at(tuple(src)), "float32")
            acc = v if acc is None else acc + v
        return acc
    return [Lazy(shape, outs[0].dtype, fn)]


# ---- GatherND / ScatterND -----------------------------------------------------------------------
def _gather_nd(ctx, a, ins, outs):
    """out[i_0..i_{q-2}, rest] = x[batch, *ind[i_0..i_{q-2}, :], rest] (batch = the first batch_dims)."""
    x, ind = ins
    b, q, k = a["batch_dims"], ind.rank, ind.shape[-1]

    def fn(idx):
        pre = tuple(idx[:q - 1])
        coords = []
        for j in range(k):
            c = cast(ind.at(pre + (_i(j),)), I32)
            coords.append(tirx.Select(c < 0, c + _i(x.shape[b + j]), c))
        return x.at(tuple(idx[:b]) + tuple(coords) + tuple(idx[q - 1:]))
    return [Lazy(outs[0].shape, outs[0].dtype, fn)]


def _scatter_nd(ctx, a, ins, outs):
    """With constant indices: a compile-time map from each addressed slice of data to the update
    row that writes it (-1: none; a repeated index keeps the last row, as the reference does)."""
    x, _, upd = ins
    data = ctx.const_data(1)
    if data is None:
        raise NotImplementedError("ScatterND needs constant indices (run-time indices are not lowered)")
    k = data.shape[-1]
    if k == 0:
        raise NotImplementedError("ScatterND with an empty index tuple")
    rows = np.asarray(data, np.int64).reshape(-1, k)
    rows = np.where(rows < 0, rows + np.array(x.shape[:k]), rows)
    table = np.full(x.shape[:k], -1, np.int32)
    for i, row in enumerate(rows):
        table[tuple(row)] = i
    tt = ctx.param(table, "scatter_rows", keep_dtype=True)
    lead = tuple(data.shape[:-1])

    def fn(idx):
        r = cast(tt[tuple(idx[:k])], I32)
        u = upd.at(unravel(tirx.max(r, _i(0)), lead) + tuple(idx[k:]))
        return tirx.Select(r >= 0, u, x.at(idx))
    return [Lazy(outs[0].shape, outs[0].dtype, fn)]


BUILDERS = {
    "Reshape": _reshape, "Flatten": _reshape, "Squeeze": _reshape, "Unsqueeze": _reshape,
    "Transpose": _transpose, "Concat": _concat, "Split": _split, "Slice": _slice, "Pad": _pad,
    "Gather": _gather, "Expand": _expand, "Resize": _resize, "GatherND": _gather_nd, "ScatterND": _scatter_nd,
}
# pure index maps that may be duplicated into several consumer kernels instead of stored
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Split", "Slice", "Gather",
                   "Expand", "Identity", "Dropout", "GatherND"})
# reshapes: a stored plain value reshaped needs no kernel at all
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
