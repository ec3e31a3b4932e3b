"""simplify: no-op removal, reshape/transpose chain merging, x*1 and x+0, decomposed HardSwish."""
import pytest
from ir_check import assert_ir, check_pass_numerics, run_ir, unchanged

T = "tensor<2x3xf32>"


def test_identity_dropout_and_noop_shape_ops_removed():
    g = run_ir(f"""
    graph @g(%x: {T}) {{
      %a = Identity(%x) : {T}
      %b = Dropout(%a) : {T}
      %c = Reshape(%b) {{shape = [2, 3]}} : {T}
      %d = Transpose(%c) {{perm = [0, 1]}} : {T}
      %e = Cast(%d) {{to = "float32"}} : {T}
      %f = Pad(%e) {{mode = "constant", pads = [0, 0, 0, 0], value = 0.0}} : {T}
      %y = Relu(%f) : {T}
      return %y
    }}""", "simplify")
    assert_ir(g, f"""
    graph @g(%x: {T}) {{
      %y = Relu(%x) : {T}
      return %y
    }}""")


def test_reshape_chain_becomes_one_reshape():
    g = run_ir("""
    graph @g(%x: tensor<1x2x3x1xf32>) {
      %a = Squeeze(%x) {axes = [3]} : tensor<1x2x3xf32>
      %b = Flatten(%a) {axis = 1} : tensor<1x6xf32>
      %c = Unsqueeze(%b) {axes = [0]} : tensor<1x1x6xf32>
      %d = Reshape(%c) {shape = [3, 2]} : tensor<3x2xf32>
      %y = Relu(%d) : tensor<3x2xf32>
      return %y
    }""", "simplify")
    assert_ir(g, """
    graph @g(%x: tensor<1x2x3x1xf32>) {
      %reshape_out = Reshape(%x) {shape = [3, 2]} : tensor<3x2xf32>
      %y = Relu(%reshape_out) : tensor<3x2xf32>
      return %y
    }""")


def test_transpose_pairs_compose_or_cancel():
    g = run_ir("""
    graph @g(%x: tensor<2x3x4xf32>) {
      %a = Transpose(%x) {perm = [1, 2, 0]} : tensor<3x4x2xf32>
      %b = Transpose(%a) {perm = [2, 0, 1]} : tensor<2x3x4xf32>
      %c = Transpose(%b) {perm = [0, 2, 1]} : tensor<2x4x3xf32>
      %d = Transpose(%c) {perm = [2, 0, 1]} : tensor<3x2x4xf32>
      return %d
    }""", "simplify")
    assert_ir(g, """
    graph @g(%x: tensor<2x3x4xf32>) {
      %d = Transpose(%x) {perm = [1, 0, 2]} : tensor<3x2x4xf32>
      return %d
    }""")
    check_pass_numerics("""graph @g(%x: tensor<2x3x4xf32>) {
      %c = Transpose(%x) {perm = [0, 2, 1]} : tensor<2x4x3xf32>
      %d = Transpose(%c) {perm = [2, 0, 1]} : tensor<3x2x4xf32>
      return %d
    }""", "simplify")


def test_neutral_constants_removed_both_operand_orders():
    g = run_ir(f"""
    graph @g(%x: {T}) {{
      %one = const dense<1.0> : tensor<3xf32>
      %zero = const dense<0.0> : tensor<1x3xf32>
      %a = Mul(%one, %x) : {T}
      %b = Add(%a, %zero) : {T}
      %c = Sub(%b, %zero) : {T}
      %d = Div(%c, %one) : {T}
      %y = Add(%zero, %d) : {T}
      return %y
    }}""", "simplify")
    # the last Add stays: a graph output cannot be renamed into the graph input
    assert_ir(g, f"""
    graph @g(%x: {T}) {{
      %zero = const dense<0.0> : tensor<1x3xf32>
      %y = Add(%zero, %x) : {T}
      return %y
    }}""")


@pytest.mark.parametrize("body", [
    # broadcasting: x * 1 with a bigger constant changes the shape
    "%one = const dense<1.0> : tensor<2x2x3xf32>\n  %y = Mul(%x, %one) : tensor<2x2x3xf32>",
    # not neutral
    "%two = const dense<[1.0, 1.0, 2.0]> : tensor<3xf32>\n  %y = Mul(%x, %two) : tensor<2x3xf32>",
    "%zero = const dense<0.0> : tensor<3xf32>\n  %y = Sub(%zero, %x) : tensor<2x3xf32>",
    # a graph output cannot become the graph input
    "%y = Identity(%x) : tensor<2x3xf32>",
    "%y = Reshape(%x) {shape = [2, 3]} : tensor<2x3xf32>",
    # a real transpose and a real reshape
    "%y = Transpose(%x) {perm = [1, 0]} : tensor<3x2xf32>",
    "%y = Reshape(%x) {shape = [3, 2]} : tensor<3x2xf32>",
    "%y = Cast(%x) {to = \"float16\"} : tensor<2x3xf16>",
])
def test_not_simplified(body):
    unchanged(f"graph @g(%x: tensor<2x3xf32>) {{\n  {body}\n  return %y\n}}\n", "simplify")


HSWISH = """graph @g(%x: tensor<1x4x2x2xf32>) {
  %three = const dense<3.0> : tensor<f32>
  %six = const dense<6.0> : tensor<1xf32>
  %a = Add(%x, %three) : tensor<1x4x2x2xf32>
  %c = Clip(%a) {max = 6.0, min = 0.0} : tensor<1x4x2x2xf32>
  %m = Mul(MUL) : tensor<1x4x2x2xf32>
  %y = Div(%m, %six) : tensor<1x4x2x2xf32>
  return %y
}
"""


@pytest.mark.parametrize("mul", ["%x, %c", "%c, %x"])
def test_decomposed_hardswish_recognized(mul):
    text = HSWISH.replace("MUL", mul)
    g = run_ir(text, "simplify")
    assert_ir(g, """
    graph @g(%x: tensor<1x4x2x2xf32>) {
      %y = HardSwish(%x) : tensor<1x4x2x2xf32>
      return %y
    }""")
    check_pass_numerics(text, "simplify")


@pytest.mark.parametrize("change", [
    ("dense<3.0>", "dense<2.0>"),                               # not +3
    ("max = 6.0", "max = 5.0"),                                 # not ReLU6
    ("%m = Mul(%x, %c)", "%m = Mul(%x, %a)"),                   # no clip between
    ("return %y", "return %y, %c"),                             # the clip is used twice
])
def test_hardswish_lookalikes_not_rewritten(change):
    text = HSWISH.replace("MUL", "%x, %c").replace(*change)
    g = run_ir(text, "simplify")
    assert "HardSwish" not in [op.kind for op in g.ops]
