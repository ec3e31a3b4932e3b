"""``dce``: dead code elimination — ops whose results reach no graph output, and unused constants.

An op is dead when none of its results is used by another op or returned by the graph; ONNX
inference ops have no side effects, so dead ops are removed. Visiting ops in reverse topological
order removes whole dead chains in one sweep (a consumer goes before its producers). Unused
constants are removed afterwards; graph inputs are part of the interface and stay.

Before::

    graph @g(%x: tensor<4xf32>) {
      %c = const dense<2.0> : tensor<4xf32>
      %dead = Mul(%x, %c) : tensor<4xf32>
      %y = Relu(%x) : tensor<4xf32>
      return %y
    }

After::

    graph @g(%x: tensor<4xf32>) {
      %y = Relu(%x) : tensor<4xf32>
      return %y
    }
"""
from __future__ import annotations

from ..ir.graph import Graph
from ._common import is_output
from .manager import PassContext, register_pass


def eliminate_dead_ops(graph: Graph) -> int:
    """Erase every op none of whose results is used; return how many were erased."""
    n = 0
    for op in reversed(graph.ops):
        if all(not r.uses and not is_output(r) for r in op.results):
            graph.erase_op(op)
            n += 1
    return n


@register_pass("dce")
def dce(graph: Graph, ctx: PassContext) -> bool:
    """Remove ops whose results are unused (transitively) and constants nothing uses."""
    n_ops = eliminate_dead_ops(graph)
    n_consts = graph.remove_unused_consts()
    ctx.log(f"dce: removed {n_ops} ops, {n_consts} constants")
    return bool(n_ops or n_consts)
