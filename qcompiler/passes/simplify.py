"""``simplify``: algebraic and structural identities that remove or merge ops.

Each rule is an identity that holds exactly (or, for HardSwish, to float rounding):

* ``Identity(x) = Dropout(x) = x`` (inference);
* ``Reshape/Flatten/Squeeze/Unsqueeze(x) = x`` when the result has x's shape, and a chain of them
  is one ``Reshape(x, shape of the last)`` (all four only reinterpret the row-major layout);
* ``Transpose(x, p) = x`` for the identity permutation; ``Transpose(Transpose(x, p), q) =
  Transpose(x, r)`` with ``r[i] = p[q[i]]`` (y[i] = x[p[i]] composed), dropped when r is identity;
* ``x * 1 = x``, ``x / 1 = x``, ``x + 0 = x``, ``x - 0 = x`` for a constant 1 or 0 that does not
  broadcast x to a bigger shape; ``Cast(x, dtype of x) = x``; ``Expand(x, s) = x`` and
  ``Concat(x) = x`` when the shape is unchanged; ``Pad(x)`` with all-zero pads is x;
* ``Max(x, 0) = Relu(x)`` and ``Max(Min(x, hi), lo) = Clip(x, lo, hi)`` for scalar constants
  (the form ``--export-qdq`` gives a clamp before a float8 QuantizeLinear, past ONNX Runtime's
  Relu/Clip fusions: :func:`qcompiler.frontend.qdq_export.fp8_clamps_as_max_min`), so fuse-act
  fuses them again;
* the decomposed hard swish ``x * Clip(x + 3, 0, 6) / 6`` (also ``* (1/6)``), which exporters
  emit for opsets before 14, is ``HardSwish(x) = x * max(0, min(1, x/6 + 1/2))`` (Howard et al.,
  *Searching for MobileNetV3*, 2019, eq. 2), so fuse-act can fuse it.

A rule that would replace a graph output by a graph input or constant declines (the model keeps
its output names).

Before::

    graph @g(%x: tensor<2x3xf32>) {
      %one = const dense<1.0> : tensor<1xf32>
      %i = Identity(%x) : tensor<2x3xf32>
      %t1 = Transpose(%i) {perm = [1, 0]} : tensor<3x2xf32>
      %t2 = Transpose(%t1) {perm = [1, 0]} : tensor<2x3xf32>
      %m = Mul(%t2, %one) : tensor<2x3xf32>
      %r1 = Reshape(%m) {shape = [6]} : tensor<6xf32>
      %r2 = Unsqueeze(%r1) {axes = [0]} : tensor<1x6xf32>
      %y = Relu(%r2) : tensor<1x6xf32>
      return %y
    }

After::

    graph @g(%x: tensor<2x3xf32>) {
      %reshape_out = Reshape(%x) {shape = [1, 6]} : tensor<1x6xf32>
      %y = Relu(%reshape_out) : tensor<1x6xf32>
      return %y
    }
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.ops import broadcast_shapes, full_attrs
from ._common import can_forward
from .manager import PassContext, register_pass
from .rewrite import Any, Const, Op, rewrite

SHAPE_KINDS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _forward(root, x: Value):
    """Replace the root's result by the existing value x (when the output names allow it)."""
    return x if can_forward(root.result, x) else None


def _keeps_shape(x: Value, *others: Value) -> bool:
    try:
        return broadcast_shapes(x.shape, *(o.shape for o in others)) == x.shape
    except ValueError:
        return False


def _drop(g, m):
    return _forward(m.root, m["x"])


def _same_shape(g, m):
    return _forward(m.root, m["x"]) if m.root.result.shape == m["x"].shape else None


def _reshape_chain(g, m):
    root, x = m.root, m["x"]
    if root.result.shape == x.shape:
        return _forward(root, x)
    return g.create_op("Reshape", [x], {"shape": list(root.result.shape)}, before=root).result


def _transpose_identity(g, m):
    perm = m.root.attrs.get("perm")
    rank = m["x"].type.rank
    if (perm is None and rank <= 1) or (perm is not None and list(perm) == list(range(rank))):
        return _forward(m.root, m["x"])
    return None


def _perm(op) -> list[int]:
    p = op.attrs.get("perm")
    return list(p) if p is not None else list(reversed(range(op.operands[0].type.rank)))


def _transpose_pair(g, m):
    p, q = _perm(m["inner"]), _perm(m.root)
    r = [p[i] for i in q]
    if r == list(range(len(r))):
        return _forward(m.root, m["x"])
    return g.create_op("Transpose", [m["x"]], {"perm": r}, before=m.root).result


def _neutral(value: float):
    def fn(g, m):
        c, x = m["c"], m["x"]
        if x.dtype != c.dtype or not _keeps_shape(x, c) or not np.all(c.data == value):
            return None
        return _forward(m.root, x)
    fn.__name__ = f"neutral_{value:g}"
    return fn


def _cast_same(g, m):
    return _forward(m.root, m["x"]) if m.root.attrs.get("to") == m["x"].dtype else None


def _pad_zero(g, m):
    return _forward(m.root, m["x"]) if not any(m.root.attrs.get("pads") or []) else None


def _is_scalar(value: float, tol: float = 0.0):
    return lambda a: a.size == 1 and abs(float(a.reshape(-1)[0]) - value) <= tol


def _scalar_of(v: Value, x: Value) -> float | None:
    """The value of constant ``v`` when it is one float scalar of x's dtype (None otherwise)."""
    d = v.data
    return float(d.reshape(-1)[0]) if d.size == 1 and v.dtype == x.dtype and d.dtype.kind == "f" else None


def _max_as_relu(g, m):
    x = m["x"]
    if _scalar_of(m["c"], x) != 0.0 or not _keeps_shape(x, m["c"]):
        return None
    return g.create_op("Relu", [x], before=m.root, name=m.root.name).result


def _max_min_as_clip(g, m):
    x = m["x"]
    lo, hi = _scalar_of(m["lo"], x), _scalar_of(m["hi"], x)
    if lo is None or hi is None or lo > hi or not _keeps_shape(x, m["lo"], m["hi"]):
        return None
    return g.create_op("Clip", [x], {"min": lo, "max": hi}, before=m.root, name=m.root.name).result


def _is_relu6(op) -> bool:
    a = full_attrs("Clip", **op.attrs)
    return a["min"] == 0.0 and a["max"] == 6.0


def _hard_swish(g, m):
    x = m["x"]
    if m.root.result.shape != x.shape or m["add"].result.shape != x.shape:
        return None
    return g.create_op("HardSwish", [x], {}, before=m.root, name="hardswish").result


def _hswish_patterns():
    def clip():
        return Op("Clip", Op("Add", Any("x"), Const(where=_is_scalar(3.0)), name="add", single_use=True),
                  where=_is_relu6, single_use=True)
    out = []
    for mul in (Op("Mul", Any("x"), clip(), single_use=True), Op("Mul", clip(), Any("x"), single_use=True)):
        out.append(Op("Div", mul, Const(where=_is_scalar(6.0))))
        out.append(Op("Mul", mul, Const(where=_is_scalar(1 / 6, 1e-7))))
    return out


RULES = [
    (Op(("Identity", "Dropout"), Any("x")), _drop),
    (Op(SHAPE_KINDS, Op(SHAPE_KINDS, Any("x"))), _reshape_chain),
    (Op(SHAPE_KINDS + ("Expand", "Concat"), Any("x")), _same_shape),
    (Op("Transpose", Op("Transpose", Any("x"), name="inner")), _transpose_pair),
    (Op("Transpose", Any("x")), _transpose_identity),
    (Op(("Mul", "Div"), Any("x"), Const("c")), _neutral(1.0)),
    (Op("Mul", Const("c"), Any("x")), _neutral(1.0)),
    (Op(("Add", "Sub"), Any("x"), Const("c")), _neutral(0.0)),
    (Op("Add", Const("c"), Any("x")), _neutral(0.0)),
    (Op("Cast", Any("x")), _cast_same),
    (Op("Pad", Any("x")), _pad_zero),
    (Op("Max", Op("Min", Any("x"), Const("hi"), single_use=True), Const("lo")), _max_min_as_clip),
    (Op("Max", Any("x"), Const("c")), _max_as_relu),
] + [(p, _hard_swish) for p in _hswish_patterns()]


@register_pass("simplify")
def simplify(graph: Graph, ctx: PassContext) -> bool:
    """Remove no-op ops (Identity, Dropout, identity reshapes/transposes, x*1, x+0), merge reshape
    and transpose chains, and recognize the decomposed HardSwish."""
    changed = rewrite(graph, RULES)
    if changed:
        graph.remove_unused_consts()
    return changed
