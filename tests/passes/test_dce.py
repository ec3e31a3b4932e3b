"""dce: dead ops (transitively) and unused constants go; outputs, inputs and live ops stay."""
from ir_check import assert_ir, run_ir, unchanged

from qcompiler.ir import parse_graph
from qcompiler.passes import PassContext
from qcompiler.passes.dce import dce


def test_dead_chain_and_unused_constants_removed():
    g = run_ir("""
    graph @g(%x: tensor<4xf32>, %unused: tensor<4xf32>) {
      %c = const dense<2.0> : tensor<4xf32>
      %d = const dense<3.0> : tensor<4xf32>
      %a = Mul(%x, %c) : tensor<4xf32>
      %b = Exp(%a) : tensor<4xf32>
      %y = Relu(%x) : tensor<4xf32>
      return %y
    }""", "dce")
    assert_ir(g, """
    graph @g(%x: tensor<4xf32>, %unused: tensor<4xf32>) {
      %y = Relu(%x) : tensor<4xf32>
      return %y
    }""")


def test_op_with_one_live_result_kept():
    unchanged("""graph @g(%x: tensor<4xf32>) {
  %a, %b = Split(%x) {axis = 0, split = [2, 2]} : tensor<2xf32>, tensor<2xf32>
  %y = Relu(%a) : tensor<2xf32>
  return %y
}
""", "dce")


def test_live_graph_reports_unchanged():
    g = parse_graph("""graph @g(%x: tensor<4xf32>) {
  %c = const dense<2.0> : tensor<4xf32>
  %y = Mul(%x, %c) : tensor<4xf32>
  return %y, %c
}""")
    assert dce(g, PassContext()) is False
    assert len(g) == 1 and "c" in g.consts
