"""``cse``: common subexpression elimination — equal constants and equal ops computed once.

Two constants are equal when dtype, shape, bytes and quantized type agree (hashed by ``(dtype,
shape, sha1(bytes), quant params)``, then compared exactly: the same stored integers with another
scale are another value). Two ops are equal when they have the same kind, the same
attributes and the same operands (after constants were merged), the operands of commutative ops
(Add, Mul, Max, Min) taken as a multiset. The first in topological order is kept; later twins are
replaced by it. Ops are pure, so this preserves results exactly. A twin whose result is a graph
output is merged only if the kept value is not an output itself (two outputs stay two values).

Before::

    graph @g(%x: tensor<4xf32>) {
      %a = const dense<1.0> : tensor<4xf32>
      %b = const dense<1.0> : tensor<4xf32>
      %y1 = Add(%x, %a) : tensor<4xf32>
      %y2 = Add(%b, %x) : tensor<4xf32>
      %z = Mul(%y1, %y2) : tensor<4xf32>
      return %z
    }

After::

    graph @g(%x: tensor<4xf32>) {
      %a = const dense<1.0> : tensor<4xf32>
      %y1 = Add(%x, %a) : tensor<4xf32>
      %z = Mul(%y1, %y1) : tensor<4xf32>
      return %z
    }
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..ir.graph import Graph, Op
from ..ir.printer import fmt_attr
from ._common import is_output
from .manager import PassContext, register_pass

COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min"})


def merge_constants(graph: Graph) -> int:
    """Replace every constant by the first constant with equal dtype, shape, bytes and quant params."""
    seen: dict[tuple, list] = {}
    n = 0
    for c in list(graph.consts.values()):
        key = (c.data.dtype.str, c.data.shape, hashlib.sha1(np.ascontiguousarray(c.data).tobytes()).digest(),
               c.type.quant)
        twins = seen.setdefault(key, [])
        keep = next((k for k in twins if np.array_equal(k.data, c.data, equal_nan=c.data.dtype.kind == "f")), None)
        if keep is None or is_output(c):
            twins.append(c)
            continue
        c.replace_all_uses_with(keep)
        graph.erase_const(c)
        n += 1
    return n


def _op_key(op: Op) -> tuple:
    ids = [id(v) for v in op.operands]
    if op.kind in COMMUTATIVE:
        ids.sort()
    attrs = tuple((k, fmt_attr(op.attrs[k])) for k in sorted(op.attrs))
    return op.kind, attrs, tuple(ids), len(op.results)


def merge_ops(graph: Graph) -> int:
    """Replace every op by the first earlier op with the same key (kind, attributes, operands)."""
    seen: dict[tuple, Op] = {}
    n = 0
    for op in graph.ops:
        key = _op_key(op)
        keep = seen.get(key)
        if keep is None:
            seen[key] = op
            continue
        if any(is_output(r) and is_output(k) for r, k in zip(op.results, keep.results)):
            continue
        graph.replace_op(op, keep.results)
        n += 1
    return n


@register_pass("cse")
def cse(graph: Graph, ctx: PassContext) -> bool:
    """Merge equal constants and equal ops (same kind, attributes and operands)."""
    n_consts = merge_constants(graph)
    n_ops = merge_ops(graph)
    ctx.log(f"cse: merged {n_consts} constants, {n_ops} ops")
    return bool(n_consts or n_ops)
