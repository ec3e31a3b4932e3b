"""Kernel grouping: which IR ops become one TIR PrimFunc.

A *group* is rooted at one stored value (a kernel output). It holds at most one *anchor* (an op
with its own loop nest: conv, pooling, gemm/matmul, softmax, layer norm, reductions) and any
number of injective ops (elementwise and data movement), which are composed into the kernel's
output expression instead of being stored.

Grouping walks the ops in reverse topological order:

* a value is stored (roots a group) when it is a graph output, when an anchor reads it, or when
  its users fall into several groups (pure index maps such as Reshape or Slice are instead
  duplicated into up to 4 consumer groups);
* otherwise its op joins the group of its users;
* an anchor joins its users' group as the group's anchor when the path from the anchor to the
  root is elementwise and keeps the anchor's shape (bias + residual + activation epilogues:
  the schedule fuses them into the register write-back); otherwise it roots a group.

Example (MobileNet block)::

    %c = Conv(%x, %w)  %b = BatchNormalization(%c, ...)  %h = HardSigmoid(%b)  %y = Mul(%b, %h)

gives one group: anchor Conv, epilogue BN→HardSigmoid→Mul (``%b`` is read twice but both uses
are inside the group), root ``%y``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Graph, Op, Value
from ..ir.types import is_fp8
from .kernels.elementwise import ELEMENTWISE as _FLOAT_ELEMENTWISE
from .kernels.integer import ANCHOR_BUILDERS as _INTEGER_ANCHORS
from .kernels.nbits import ANCHOR_BUILDERS as _NBITS_ANCHORS
from .kernels.quant import ANCHORS as _QUANT_ANCHORS, ELEMENTWISE as _QUANT_ELEMENTWISE
from .kernels.shape import VIEWS

ANCHORS = frozenset({"Conv", "FusedConv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
                     "GlobalMaxPool", "Gemm", "FusedGemm", "MatMul", "Softmax", "LogSoftmax",
                     "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"}) | _QUANT_ANCHORS | frozenset(_INTEGER_ANCHORS) \
    | frozenset(_NBITS_ANCHORS)
# elementwise ops an anchor's epilogue may absorb: quantized ones too (QLinearAdd after QLinearConv
# is the residual add of an inverted-residual block; DequantizeLinear after QLinearGemm the logits)
ELEMENTWISE = _FLOAT_ELEMENTWISE | _QUANT_ELEMENTWISE
MAX_DUPLICATES = 4


@dataclass(eq=False)
class Group:
    root: Value
    ops: list[Op] = field(default_factory=list)      # members, in reverse topological order while planning
    anchor: Op | None = None

    def members_in_order(self, order: dict[Op, int]) -> list[Op]:
        return sorted(set(self.ops), key=order.__getitem__)


def _epilogue_ok(anchor_result: Value, group: Group) -> bool:
    """Is every op on a path from the anchor's result to the root elementwise and shape-preserving?"""
    members = set(group.ops)
    stack, seen = [anchor_result], set()
    shape = anchor_result.shape
    if group.root.shape != shape:
        return False
    while stack:
        v = stack.pop()
        for u in v.users:
            if u not in members or u in seen:
                continue
            seen.add(u)
            if u.kind not in ELEMENTWISE or any(r.shape != shape for r in u.results):
                return False
            stack.extend(u.results)
    return True


def _float8_quantized(op: Op, r: Value) -> bool:
    """A float8 QuantizeLinear's result is always stored: its encode (and the decode of a
    DequantizeLinear reading it) uses its operand several times, so a chain of float8 Q/DQ pairs
    composed into one kernel (ONNX Runtime's FP8 quantizer writes Q/DQ between a conv and its
    BatchNormalization, and around residual Adds) would grow the kernel's expression exponentially
    with the chain's length (TVM inlines the kernels' Lets: tests/codegen/test_x86_fp8.py). Stored,
    each float8 rounding is also a value ``qcompile verify`` compares on its own."""
    return op.kind == "QuantizeLinear" and is_fp8(r.dtype)


def plan(graph: Graph) -> list[Group]:
    """The kernel groups of ``graph``, in an order where producers come first."""
    order = {op: i for i, op in enumerate(graph.ops)}
    outputs = {id(v) for v in graph.outputs}
    member_of: dict[Op, list[Group]] = {}
    groups: list[Group] = []

    def new_group(r: Value, op: Op) -> Group:
        g = Group(r, [op])
        groups.append(g)
        return g

    for op in reversed(graph.ops):
        is_anchor = op.kind in ANCHORS
        mine: list[Group] = []
        for r in op.results:
            if not r.uses and id(r) not in outputs:
                continue
            need = id(r) in outputs or any(u.kind in ANCHORS for u in r.users) or _float8_quantized(op, r)
            cgs: list[Group] = []
            for u in r.users:
                for g in member_of.get(u, []):
                    if g not in cgs:
                        cgs.append(g)
            if is_anchor:
                g = cgs[0] if len(cgs) == 1 else None
                if (not need and g is not None and g.anchor is None and len(op.results) == 1
                        and _epilogue_ok(r, g)):
                    g.anchor = op
                    g.ops.append(op)
                    mine.append(g)
                else:
                    g = new_group(r, op)
                    g.anchor = op
                    mine.append(g)
                continue
            dup_ok = op.kind in VIEWS and len(cgs) <= MAX_DUPLICATES
            if need or not cgs or (len(cgs) > 1 and not dup_ok):
                mine.append(new_group(r, op))
            else:
                for g in cgs:
                    if g not in mine:
                        g.ops.append(op)
                        mine.append(g)
        if mine:
            member_of[op] = mine
    groups.sort(key=lambda g: (order[g.root.producer], g.root.producer.results.index(g.root)))
    return groups
