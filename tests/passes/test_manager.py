"""The pass manager: pipelines by name, verification after each pass, banners, failures named."""
import io

import pytest

from qcompiler.errors import UserError
from qcompiler.ir import parse_graph, print_graph
from qcompiler.passes import PassFailed, PassManager, parse_pipeline, register_pass
from qcompiler.passes.rewrite import Any, Op, rewrite

TEXT = """graph @t(%x: tensor<1x4xf32>) {
  %a = Identity(%x) : tensor<1x4xf32>
  %b = Relu(%a) : tensor<1x4xf32>
  %c = Identity(%b) : tensor<1x4xf32>
  return %c
}
"""


@register_pass("test-drop-identity")
def _drop_identity(g, ctx):
    """Remove Identity ops."""
    return rewrite(g, [(Op("Identity", Any("x")), lambda g, m: m["x"])])


@register_pass("test-break-ir")
def _break_ir(g, ctx):
    op = g.ops[0]
    op.set_operand(0, op.result)        # an op that uses its own result: not SSA any more
    return True


def test_rewrite_pass_and_banner():
    out = io.StringIO()
    g = parse_graph(TEXT)
    PassManager("test-drop-identity", print_ir_after="all", time_passes=True, out=out).run(g)
    assert print_graph(g, locs=False) == (
        "graph @t(%x: tensor<1x4xf32>) {\n  %c = Relu(%x) : tensor<1x4xf32>\n  return %c\n}\n")
    text = out.getvalue()
    assert "// -----// IR Dump After test-drop-identity //----- //" in text
    assert "Pass execution timing report" in text and "3 -> 1" in text


def test_verifier_failure_names_the_pass_and_those_before():
    g = parse_graph(TEXT)
    with pytest.raises(PassFailed, match=r"pass 'test-break-ir' failed \(passes before it: test-drop-identity\)"):
        PassManager("test-drop-identity,test-break-ir").run(g)


def test_unknown_pass_is_a_user_error():
    with pytest.raises(UserError, match="unknown pass 'no-such-pass'"):
        parse_pipeline("test-drop-identity,no-such-pass")
    assert parse_pipeline("none") == []
