"""Import and the default pipeline do work linear in the graph size (issue #33).

No timing: the tests count work that a quadratic spot multiplies, for a chain of n and of 4n ops,
and ask that 4x the ops cost at most ~5x the work:

* comparisons of two distinct ops (``Op.__eq__``, counted by patching it): what a linear scan of an
  op list or a use list costs, i.e. ``list.index`` / ``list.remove`` / ``in`` over ops or
  ``(op, i)`` pairs (the verifier's use-list test, ``erase_op``'s removal, ...);
* pattern-match attempts of the rewrite driver (``rewrite.match``);
* Python function calls (``sys.setprofile``), which catch a quadratic loop anywhere in the
  importer or the passes.

The chains are the issue's: node i is Add if i is even else Mul, with a constant c{i % 7} of shape
[1], so seven constants are shared by n / 7 ops each. The second chain adds 0 and multiplies by 1,
which simplify removes op by op (rewrites that fire, and an erase per op).
"""
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.ir import Graph, TensorType
from qcompiler.ir.graph import Op
from qcompiler.passes import rewrite as rewrite_mod
from qcompiler.passes.dce import eliminate_dead_ops
from qcompiler.passes.manager import run_passes

N = 400          # and 4 * N
MAX_RATIO = 5.0  # 4x the ops; quadratic work would be ~16x


def chain_model(n: int, neutral: bool = False) -> onnx.ModelProto:
    vals = [(0.0 if k % 2 == 0 else 1.0) if neutral else 0.5 + k for k in range(7)]
    inits = [numpy_helper.from_array(np.array([v], np.float32), f"c{k}") for k, v in enumerate(vals)]
    nodes, prev = [], "x"
    for i in range(n):
        out = f"t{i}" if i < n - 1 else "y"
        c = f"c{i % 2}" if neutral else f"c{i % 7}"
        nodes.append(helper.make_node("Add" if i % 2 == 0 else "Mul", [prev, c], [out], name=f"n{i}"))
        prev = out
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


class Work:
    """Counters for one run: op comparisons, rewrite match attempts, Python calls."""

    def __init__(self, monkeypatch):
        self.op_eq = self.matches = self.calls = 0

        def eq(a, b):
            self.op_eq += 1
            return a is b

        monkeypatch.setattr(Op, "__eq__", eq)
        monkeypatch.setattr(Op, "__hash__", object.__hash__)
        real_match = rewrite_mod.match

        def counting_match(pattern, op):
            self.matches += 1
            return real_match(pattern, op)

        monkeypatch.setattr(rewrite_mod, "match", counting_match)

    def profile(self, fn):
        def prof(frame, event, arg):
            if event in ("call", "c_call"):
                self.calls += 1
        sys.setprofile(prof)
        try:
            return fn()
        finally:
            sys.setprofile(None)


def measure(monkeypatch, fn) -> Work:
    with monkeypatch.context() as mp:
        w = Work(mp)
        w.profile(fn)
    return w


def assert_linear(small: Work, big: Work, what: str):
    for name in ("op_eq", "matches", "calls"):
        a, b = getattr(small, name), getattr(big, name)
        # a handful of comparisons is no scan: allow a constant floor
        assert b <= MAX_RATIO * max(a, 50), f"{what}: {name} grew {a} -> {b} for 4x the ops"


def import_and_default(model):
    g = import_onnx(model)
    run_passes(g, "default")
    return g


@pytest.mark.parametrize("neutral", [False, True], ids=["shared-consts", "simplified-away"])
def test_import_and_default_pipeline_do_linear_work(monkeypatch, neutral):
    small_m, big_m = chain_model(N, neutral), chain_model(4 * N, neutral)
    small = measure(monkeypatch, lambda: import_and_default(small_m))
    big = measure(monkeypatch, lambda: import_and_default(big_m))
    assert big.calls > 3 * small.calls          # the counters do see the work
    assert_linear(small, big, "import + default passes")
    if neutral:                                  # x + 0 and x * 1 all simplified away
        g = import_and_default(chain_model(N, neutral))
        assert len(g) == 1


def dead_chain(n: int) -> Graph:
    """A live Relu and a dead chain of n ops over 7 shared constants."""
    g = Graph("g")
    x = g.add_input("x", TensorType((1, 8), "float32"))
    cs = [g.add_const(np.full((1,), k, np.float32), f"c{k}") for k in range(7)]
    v = x
    for i in range(n):
        v = g.create_op("Add" if i % 2 == 0 else "Mul", [v, cs[i % 7]]).result
    g.outputs = [g.create_op("Relu", [x]).result]
    return g


def test_dce_and_verify_of_a_dead_chain_do_linear_work(monkeypatch):
    """dce erases back to front: each erase removes the last use of a shared constant and the last
    op of the list (a list.remove scan each, before)."""
    def run(n):
        g = dead_chain(n)
        g.verify()
        w = measure(monkeypatch, lambda: (eliminate_dead_ops(g), g.remove_unused_consts(), g.verify()))
        assert len(g) == 1
        return w
    assert_linear(run(N), run(4 * N), "dce")


def test_use_list_keeps_list_behaviour():
    g = dead_chain(3)
    x = g.inputs[0]
    a = g.ops[0]
    relu = g.ops[-1]
    assert x.uses == [(a, 0), (relu, 0)] and x.uses[0] == (a, 0) and x.uses[-1] == (relu, 0)
    assert (relu, 0) in x.uses and (relu, 1) not in x.uses and len(x.uses) == 2
    a.set_operand(0, g.consts["c1"])               # moves the use; order of the others kept
    assert x.uses == [(relu, 0)] and g.consts["c1"].uses[-1] == (a, 0)
    with pytest.raises(ValueError):
        x.uses.remove((a, 0))
    a.set_operand(0, x)
    assert x.uses == [(relu, 0), (a, 0)]
    g.verify()
