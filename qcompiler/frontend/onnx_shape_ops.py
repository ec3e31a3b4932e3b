"""ONNX node -> IR op converters for shape operators (Reshape, Expand, Flatten, Transpose, Concat,
Split, Pad, Squeeze, Unsqueeze, Dropout, Resize, reductions, Gather, Slice), ConstantOfShape, Range
and Tile with run-time inputs, and Einsum (lowered to Transpose / ReduceSum / Reshape / MatMul /
Mul); registered in :data:`.onnx_registry.CONVERTERS` like those of :mod:`.onnx_ops`.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from .onnx_fold import axes_arg, onnx_slice, resolve_reshape
from .onnx_registry import checked_axis, converter, nonempty_const, opt_input


# ---- shape manipulation -----------------------------------------------------------------------
def _shape_from_input_or_inference(b, n, i, what):
    """A shape input that should be constant; falls back to ONNX's inferred static output shape."""
    v = b.const(n.input[i]) if opt_input(n, i) else None
    if v is not None:
        return v
    inferred = b.onnx_shape(n.output[0])
    if inferred is None:
        raise b.fail(n, f"{what} is computed at run time", "fix the input sizes with --input-shape so it folds")
    return None


@converter("Reshape")
def _reshape(b, n, a):
    x = b.val(n.input[0])
    v = _shape_from_input_or_inference(b, n, 1, "the target shape")
    try:
        shape = resolve_reshape(x.shape, v.reshape(-1), a.get("allowzero", 0)) if v is not None \
            else b.onnx_shape(n.output[0])
    except ValueError as e:
        raise b.fail(n, str(e), "check --input-shape against the sizes the model accepts") from None
    b.emit(n, "Reshape", [x], {"shape": list(shape)})


@converter("Expand")
def _expand(b, n, a):
    x = b.val(n.input[0])
    v = _shape_from_input_or_inference(b, n, 1, "the target shape")
    target = tuple(int(d) for d in v.reshape(-1)) if v is not None else b.onnx_shape(n.output[0])
    try:
        shape = np.broadcast_shapes(x.shape, target)
    except ValueError:
        raise b.fail(n, f"cannot expand {x.shape} to {target}", "fix the model") from None
    b.emit(n, "Expand", [x], {"shape": list(shape)})


@converter("Flatten")
def _flatten(b, n, a):
    x = b.val(n.input[0])
    ax = int(a.get("axis", 1))
    if not -x.type.rank <= ax <= x.type.rank:
        raise b.fail(n, f"axis {ax} out of range for rank {x.type.rank}", "fix the model")
    b.emit(n, "Flatten", [x], {"axis": ax + x.type.rank if ax < 0 else ax})


@converter("Transpose")
def _transpose(b, n, a):
    x = b.val(n.input[0])
    perm = list(a["perm"]) if "perm" in a else list(reversed(range(x.type.rank)))
    b.emit(n, "Transpose", [x], {"perm": perm})


@converter("Concat")
def _concat(b, n, a):
    vals = [b.val(v) for v in n.input if v and not b.is_empty(v)]
    if not vals:
        raise b.fail(n, "all inputs are empty", "fix the model")
    b.emit(n, "Concat", vals, {"axis": checked_axis(b, n, a["axis"], vals[0].type.rank)})


@converter("Split")
def _split(b, n, a):
    x = b.val(n.input[0])
    ax = checked_axis(b, n, a.get("axis", 0), x.type.rank)
    dim = x.shape[ax]
    outs = list(n.output)
    if opt_input(n, 1):
        sizes = [int(v) for v in b.need_const(n, 1, "split").reshape(-1)]
    elif "split" in a:
        sizes = list(a["split"])
    elif "num_outputs" in a:                          # opset 18: the last chunk may be smaller
        k = int(a["num_outputs"])
        chunk = -(-dim // k)
        sizes = [chunk] * (k - 1) + [dim - chunk * (k - 1)]
    else:
        if dim % len(outs):
            raise b.fail(n, f"cannot split {dim} evenly into {len(outs)}", "give explicit split sizes")
        sizes = [dim // len(outs)] * len(outs)
    if len(sizes) != len(outs) or sum(sizes) != dim or min(sizes) < 0:
        raise b.fail(n, f"split sizes {sizes} do not fit dimension {dim} into {len(outs)} outputs", "fix the model")
    b.emit(n, "Split", [x], {"axis": ax, "split": sizes}, outputs=outs)


@converter("Pad")
def _pad(b, n, a):
    x = b.val(n.input[0])
    r = x.type.rank
    mode = a.get("mode", "constant")
    if "pads" in a:                                # opset < 11: attributes
        pads, value = list(a["pads"]), float(a.get("value", 0.0))
    else:
        pads = [int(v) for v in b.need_const(n, 1, "pads").reshape(-1)]
        cv = nonempty_const(b, n, 2)
        value = cv.reshape(-1)[0].item() if cv is not None else 0.0
        axes = nonempty_const(b, n, 3)
        if axes is not None:                       # opset 18: pads only for the listed axes
            axes = [checked_axis(b, n, int(v), r) for v in axes.reshape(-1)]
            full = [0] * (2 * r)
            for i, ax in enumerate(axes):
                full[ax], full[ax + r] = pads[i], pads[i + len(axes)]
            pads = full
    if mode not in ("constant", "reflect", "edge"):
        raise b.fail(n, f"Pad mode '{mode}' is not supported", "use constant, reflect or edge padding")
    if len(pads) != 2 * r:
        raise b.fail(n, f"pads {pads} should have {2 * r} values", "fix the model")
    b.emit(n, "Pad", [x], {"pads": pads, "mode": mode, "value": float(value)})


def _const_inputs(b, n):
    return [None] + [b.const(v) if v else None for v in n.input[1:]]


@converter("Squeeze")
def _squeeze(b, n, a):
    x = b.val(n.input[0])
    if opt_input(n, 1):
        b.need_const(n, 1, "axes")
    axes = axes_arg(n, _const_inputs(b, n), a)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    b.emit(n, "Squeeze", [x], {"axes": sorted(checked_axis(b, n, ax, x.type.rank) for ax in axes)})


@converter("Unsqueeze")
def _unsqueeze(b, n, a):
    x = b.val(n.input[0])
    if opt_input(n, 1):
        b.need_const(n, 1, "axes")
    axes = axes_arg(n, _const_inputs(b, n), a) or []
    r = x.type.rank + len(axes)
    b.emit(n, "Unsqueeze", [x], {"axes": sorted(checked_axis(b, n, ax, r) for ax in axes)})


@converter("Dropout")
def _dropout(b, n, a):
    if opt_input(n, 2):
        tm = b.need_const(n, 2, "training_mode")
        if bool(tm.reshape(-1)[0]):
            raise b.fail(n, "training_mode is true", "export the model in eval/inference mode")
    x = b.val(n.input[0])
    if len(n.output) > 1 and n.output[1] and b.used(n.output[1]):
        b.set_const(n.output[1], np.ones(x.shape, bool))      # inference: the mask keeps everything
    b.emit(n, "Dropout", [x], {})


@converter("Resize")
def _resize(b, n, a):
    x = b.val(n.input[0])
    r = x.type.rank
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel")
    if ctm == "tf_crop_and_resize":
        raise b.fail(n, "coordinate_transformation_mode tf_crop_and_resize is not supported", "use another mode")
    if a.get("antialias", 0):
        raise b.fail(n, "antialias=1 is not supported", "export without antialiasing")
    axes = [checked_axis(b, n, ax, r) for ax in a["axes"]] if "axes" in a else list(range(r))
    scales, sizes = nonempty_const(b, n, 2), nonempty_const(b, n, 3)
    out = list(x.shape)
    if sizes is not None:
        if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise b.fail(n, "keep_aspect_ratio_policy other than stretch is not supported", "give exact sizes")
        for ax, s in zip(axes, sizes.reshape(-1)):
            out[ax] = int(s)
    elif scales is not None:
        for ax, s in zip(axes, scales.reshape(-1)):
            out[ax] = int(math.floor(x.shape[ax] * float(s)))
            if out[ax] != x.shape[ax] * float(s):
                raise b.fail(n, f"scale {float(s)} gives a fractional size on axis {ax} ({x.shape[ax]} x {float(s)})",
                             "re-export with output sizes instead of scales, or change --input-shape")
    else:
        raise b.fail(n, "has no constant scales or sizes", "fix the input sizes with --input-shape so they fold")
    b.emit(n, "Resize", [x], {
        "sizes": out, "mode": mode, "coordinate_transformation_mode": ctm,
        "nearest_mode": a.get("nearest_mode", "round_prefer_floor"), "cubic_coeff_a": float(a.get("cubic_coeff_a", -0.75)),
        "exclude_outside": int(a.get("exclude_outside", 0)),
        "extrapolation_value": float(a.get("extrapolation_value", 0.0))})


@converter("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")
def _reduce(b, n, a):
    x = b.val(n.input[0])
    if opt_input(n, 1):
        b.need_const(n, 1, "axes")
    axes = axes_arg(n, _const_inputs(b, n), a)
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            b.emit(n, "Identity", [x], {})
            return
        axes = list(range(x.type.rank))
    b.emit(n, n.op_type, [x], {"axes": sorted({checked_axis(b, n, ax, x.type.rank) for ax in axes}),
                               "keepdims": int(a.get("keepdims", 1))})


@converter("Gather")
def _gather(b, n, a):
    x = b.val(n.input[0])
    b.emit(n, "Gather", [x, b.val(n.input[1])], {"axis": checked_axis(b, n, a.get("axis", 0), x.type.rank)})


@converter("Slice")
def _slice(b, n, a):
    x = b.val(n.input[0])
    starts = b.need_const(n, 1, "starts").reshape(-1).tolist()
    ends = b.need_const(n, 2, "ends").reshape(-1).tolist()
    axes = b.need_const(n, 3, "axes").reshape(-1).tolist() if opt_input(n, 3) else None
    steps = b.need_const(n, 4, "steps").reshape(-1).tolist() if opt_input(n, 4) else None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    norm = {}
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = checked_axis(b, n, int(ax), x.type.rank)
        if sp == 0:
            raise b.fail(n, "slice step 0", "fix the model")
        dim = x.shape[ax]
        sl = onnx_slice(st, en, int(sp), dim)    # clamped: 0 <= start, end <= dim
        # an open end of a negative step is "before index 0": -dim-1 says that in ONNX and Python
        norm[ax] = (sl.start, -dim - 1 if sl.stop is None else sl.stop, sl.step)
    order = sorted(norm)
    b.emit(n, "Slice", [x], {"starts": [norm[k][0] for k in order], "ends": [norm[k][1] for k in order],
                             "axes": order, "steps": [norm[k][2] for k in order]})


# ---- ConstantOfShape, Range, Tile with run-time inputs (all-constant ones fold: onnx_fold.py) ----
@converter("ConstantOfShape")
def _constant_of_shape(b, n, a):
    """The values depend only on the shape: a constant whenever ONNX knows the output shape."""
    v = _shape_from_input_or_inference(b, n, 0, "the shape")
    shape = tuple(int(d) for d in v.reshape(-1)) if v is not None else b.onnx_shape(n.output[0])
    fill = numpy_helper.to_array(a["value"]).reshape(-1) if "value" in a else np.zeros(1, np.float32)
    b.set_const(n.output[0], np.full(shape, fill[0], fill.dtype))


@converter("Range")
def _range(b, n, a):
    """Reached only when start, limit or delta is computed at run time: the length is then dynamic."""
    raise b.fail(n, "its length depends on values computed at run time",
                 "fix the input sizes with --input-shape so start/limit/delta fold to constants")


@converter("Tile")
def _tile(b, n, a):
    """Tile as Reshape -> Expand -> Reshape: x[d0, d1] tiled (r0, r1) is x viewed as [1, d0, 1, d1],
    expanded to [r0, d0, r1, d1] and flattened to [r0 d0, r1 d1]."""
    x = b.val(n.input[0])
    reps = b.const(n.input[1])
    if reps is None:
        out = b.onnx_shape(n.output[0])
        if out is None:
            raise b.fail(n, "the repeats are computed at run time", "fix the input sizes with --input-shape so they fold")
        reps = np.array([o // d for o, d in zip(out, x.shape)])
    reps = [int(r) for r in reps.reshape(-1)]
    if len(reps) != x.type.rank or min(reps, default=1) < 1:
        raise b.fail(n, f"repeats {reps} do not fit an input of rank {x.type.rank}", "fix the model")
    out = [r * d for r, d in zip(reps, x.shape)]
    if all(r == 1 for r in reps):
        b.emit(n, "Identity", [x], {})
        return
    ones = [v for d in x.shape for v in (1, d)]
    t = b.aux(n, "Reshape", [x], {"shape": ones}, "interleave")
    t = b.aux(n, "Expand", [t], {"shape": [v for r, d in zip(reps, x.shape) for v in (r, d)]}, "expand")
    b.emit(n, "Reshape", [t], {"shape": out})


# ---- Einsum, lowered to Transpose / ReduceSum / Reshape / MatMul / Mul ------------------------
class _Term:
    """An einsum operand: an IR value (or the spec of an op not yet emitted) with one label per axis."""

    def __init__(self, value, labels, shape, pending=None):
        self.value, self.labels, self.shape, self.pending = value, list(labels), tuple(shape), pending


def _einsum_parse(b, n, eq: str, ranks: list[int]):
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise b.fail(n, f"equation '{eq}' names {len(terms)} operands, the node has {len(ranks)}", "fix the model")
    n_ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    ell = [f".{i}" for i in range(n_ell)]

    def labels(t, r):
        if "..." in t:
            head, tail = t.split("...")
            k = r - len(head) - len(tail)
            return list(head) + ell[n_ell - k:] + list(tail)
        if len(t) != r:
            raise b.fail(n, f"einsum term '{t}' does not fit an operand of rank {r}", "fix the model")
        return list(t)
    ins = [labels(t, r) for t, r in zip(terms, ranks)]
    if arrow:
        out = labels(rhs, n_ell + len(rhs.replace("...", ""))) if "..." in rhs else list(rhs)
    else:                       # implicit: the ellipsis, then the labels used once, alphabetically
        flat = [c for t in ins for c in t if not c.startswith(".")]
        out = ell + sorted(c for c in set(flat) if flat.count(c) == 1)
    return ins, out


@converter("Einsum")
def _einsum(b, n, a):
    vals = [b.val(x) for x in n.input]
    ins, out = _einsum_parse(b, n, a["equation"], [v.type.rank for v in vals])
    for t in ins:
        if len(set(t)) != len(t):
            raise b.fail(n, f"einsum '{a['equation']}' takes a diagonal (a label repeated in one operand)",
                         "rewrite the model without diagonals")
    sizes: dict = {}
    for t, v in zip(ins, vals):
        for lab, d in zip(t, v.shape):
            if sizes.setdefault(lab, d) != d and 1 not in (d, sizes[lab]):
                raise b.fail(n, f"einsum label '{lab}' has sizes {sizes[lab]} and {d}", "fix the model")
            sizes[lab] = max(sizes[lab], d)
    counter = [0]

    def real(t: _Term):
        if t.pending is not None:
            counter[0] += 1
            kind, ops, attrs = t.pending
            t.value, t.pending = b.aux(n, kind, [real(o) for o in ops], attrs, f"einsum{counter[0]}"), None
        return t.value

    def op(kind, ops, attrs, labels, shape):
        return _Term(None, labels, shape, (kind, ops, attrs))

    def arrange(t: _Term, order: list, shape=None):
        """Transpose ``t`` to label ``order``, then (optionally) reshape to ``shape``."""
        if t.labels != order:
            perm = [t.labels.index(lab) for lab in order]
            t = op("Transpose", [t], {"perm": perm}, order, [t.shape[p] for p in perm])
        if shape is not None and tuple(shape) != t.shape:
            t = op("Reshape", [t], {"shape": list(shape)}, order, shape)
        return t

    terms = [_Term(v, lab, v.shape) for v, lab in zip(vals, ins)]
    # labels in one operand only and not in the output: summed away first
    for i, t in enumerate(terms):
        others = set(out).union(*(set(o.labels) for j, o in enumerate(terms) if j != i))
        gone = [k for k, lab in enumerate(t.labels) if lab not in others]
        if gone:
            keep = [lab for lab in t.labels if lab in others]
            terms[i] = op("ReduceSum", [t], {"axes": gone, "keepdims": 0}, keep,
                          [d for k, d in enumerate(t.shape) if k not in gone])
    x = terms[0]
    for j, y in enumerate(terms[1:], 1):
        keep = set(out).union(*(set(o.labels) for o in terms[j + 1:]))
        batch = [lab for lab in x.labels if lab in y.labels and lab in keep]
        contr = [lab for lab in x.labels if lab in y.labels and lab not in keep]
        fx = [lab for lab in x.labels if lab not in y.labels]
        fy = [lab for lab in y.labels if lab not in x.labels]
        dx = dict(zip(x.labels, x.shape))
        dy = dict(zip(y.labels, y.shape))
        bshape = [sizes[lab] for lab in batch]
        res_shape = bshape + [dx[lab] for lab in fx] + [dy[lab] for lab in fy]
        if not contr:            # no summation: a broadcasting product
            xs = arrange(x, batch + fx, [dx[lab] for lab in batch + fx] + [1] * len(fy))
            ys = arrange(y, batch + fy, [dy[lab] for lab in batch] + [1] * len(fx) + [dy[lab] for lab in fy])
            x = op("Mul", [xs, ys], {}, batch + fx + fy, res_shape)
            continue
        m, k = int(np.prod([dx[lab] for lab in fx])), int(np.prod([dx[lab] for lab in contr]))
        nn = int(np.prod([dy[lab] for lab in fy]))
        ys = arrange(y, batch + contr + fy, [dy[lab] for lab in batch] + [k, nn])
        if batch:
            xs = arrange(x, batch + fx + contr, [dx[lab] for lab in batch] + [m, k])
            mm = op("MatMul", [xs, ys], {}, batch + ["?m", "?n"], bshape + [m, nn])
        else:       # x's free axes stay axes (an N-D MatMul): a leading batch is never merged into rows
            xs = arrange(x, fx + contr, [dx[lab] for lab in fx] + [k])
            mm = op("MatMul", [xs, ys], {}, fx + ["?n"], [dx[lab] for lab in fx] + [nn])
        x = arrange(mm, mm.labels, res_shape)
        x.labels = batch + fx + fy
    res = arrange(x, out)
    if tuple(res.shape) != tuple(sizes[lab] for lab in out):
        raise b.fail(n, f"einsum result shape {res.shape} is not the output's", "report this importer bug")
    if res.pending is None:
        b.emit(n, "Identity", [res.value], {})
    else:
        kind, ops, attrs = res.pending
        b.emit(n, kind, [real(o) for o in ops], attrs)


@converter("SpaceToDepth", "DepthToSpace")
def _space_depth(b, n, a):
    """As ONNX defines them: Reshape -> Transpose -> Reshape (DepthToSpace in DCR or CRD mode)."""
    x = b.val(n.input[0])
    k = int(a.get("blocksize", 0))
    if x.type.rank != 4 or k < 1:
        raise b.fail(n, f"needs a 4-D input and blocksize >= 1 (rank {x.type.rank}, blocksize {k})", "fix the model")
    N, C, H, W = x.shape
    if n.op_type == "SpaceToDepth":
        if H % k or W % k:
            raise b.fail(n, f"spatial size {H}x{W} is not a multiple of blocksize {k}", "fix --input-shape")
        shape, perm, out = [N, C, H // k, k, W // k, k], [0, 3, 5, 1, 2, 4], [N, C * k * k, H // k, W // k]
    else:
        if C % (k * k):
            raise b.fail(n, f"{C} channels are not a multiple of blocksize^2 = {k * k}", "fix the model")
        if a.get("mode", "DCR") == "DCR":
            shape, perm = [N, k, k, C // (k * k), H, W], [0, 3, 4, 1, 5, 2]
        else:
            shape, perm = [N, C // (k * k), k, k, H, W], [0, 1, 4, 2, 5, 3]
        out = [N, C // (k * k), H * k, W * k]
    r = b.aux(n, "Reshape", [x], {"shape": shape}, "blocks")
    t = b.aux(n, "Transpose", [r], {"perm": perm}, "move")
    b.emit(n, "Reshape", [t], {"shape": out})
