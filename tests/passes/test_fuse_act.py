"""fuse-act: activations and residual adds fuse into FusedConv/FusedGemm; MatMul + bias -> Gemm."""
import pytest
from ir_check import assert_ir, check_pass_numerics, run_ir

CONV_ATTRS = "{dilations = [1, 1], group = 1, pads = [1, 1, 1, 1], strides = [1, 1]}"
T = "tensor<1x4x5x5xf32>"
HEAD = f"""graph @g(%x: {T}, %skip: {T}) {{
  %w = const dense<0.5> : tensor<4x4x3x3xf32>
  %b = const dense<0.5> : tensor<4xf32>
  %y = Conv(%x, %w, %b) {CONV_ATTRS} : {T} loc("conv")
"""
ACTS = {
    "Relu": ("Relu", "", []), "Sigmoid": ("Sigmoid", "", []), "Tanh": ("Tanh", "", []),
    "HardSwish": ("HardSwish", "", []),
    "ReLU6": ("Clip", " {max = 6.0, min = 0.0}", [0.0, 6.0]),
    "Clip": ("Clip", " {max = 0.5, min = -1.0}", [-1.0, 0.5]),
    "LeakyRelu": ("LeakyRelu", " {alpha = 0.2}", [0.2]),
    "HardSigmoid": ("HardSigmoid", " {alpha = 0.25, beta = 0.4}", [0.25, 0.4]),
}


def kinds(g):
    return [op.kind for op in g.ops]


def test_conv_add_relu_golden():
    g = run_ir(HEAD + f"""  %s = Add(%y, %skip) : {T}
  %z = Relu(%s) : {T}
  return %z
}}""", "fuse-act")
    assert_ir(g, f"""graph @g(%x: {T}, %skip: {T}) {{
  %w = const dense<0.5> : tensor<4x4x3x3xf32>
  %b = const dense<0.5> : tensor<4xf32>
  %z = FusedConv(%x, %w, %b, %skip) {{activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [1, 1, 1, 1], strides = [1, 1]}} : {T}
  return %z
}}""")
    assert g.ops[0].name == "conv"          # the fused op keeps the conv's name (bn_stats keys)


@pytest.mark.parametrize("act", sorted(ACTS))
def test_each_activation_fuses_into_conv_and_gemm(act):
    kind, attrs, params = ACTS[act]
    g = check_pass_numerics(HEAD + f"  %z = {kind}(%y){attrs} : {T}\n  return %z\n}}", "fuse-act")
    (op,) = g.ops
    assert (op.kind, op.attrs["activation"], op.attrs["activation_params"]) == ("FusedConv", kind, params)
    g = check_pass_numerics(f"""graph @g(%a: tensor<3x5xf32>) {{
  %w = const dense<0.5> : tensor<4x5xf32>
  %y = Gemm(%a, %w) {{alpha = 1.0, beta = 1.0, transA = 0, transB = 1}} : tensor<3x4xf32>
  %z = {kind}(%y){attrs} : tensor<3x4xf32>
  return %z
}}""", "fuse-act")
    (op,) = g.ops
    assert (op.kind, op.attrs["activation"], op.attrs["activation_params"]) == ("FusedGemm", kind, params)


def test_residual_either_order_and_defined_after_the_conv():
    # the skip is computed after the conv: the fused op moves after it (toposort)
    g = check_pass_numerics(HEAD + f"""  %k = Sigmoid(%skip) : {T}
  %s = Add(%k, %y) : {T}
  %z = Clip(%s) {{max = 6.0, min = 0.0}} : {T}
  return %z
}}""", "fuse-act")
    assert kinds(g) == ["Sigmoid", "FusedConv"] and g.ops[1].operands[3] is g.ops[0].result


def test_conv_relu_add_keeps_the_add():
    g = check_pass_numerics(HEAD + f"""  %r = Relu(%y) : {T}
  %z = Add(%r, %skip) : {T}
  return %z
}}""", "fuse-act")
    assert kinds(g) == ["FusedConv", "Add"] and g.ops[0].attrs["activation"] == "Relu"
    assert len(g.ops[0].operands) == 3


def test_conv_without_bias_gets_zero_bias_for_residual():
    g = check_pass_numerics(f"""graph @g(%x: {T}, %skip: {T}) {{
  %w = const dense<0.5> : tensor<4x4x3x3xf32>
  %y = Conv(%x, %w) {CONV_ATTRS} : {T}
  %z = Add(%y, %skip) : {T}
  return %z
}}""", "fuse-act")
    assert kinds(g) == ["FusedConv"] and g.ops[0].attrs["activation"] == ""


def test_matmul_bias_becomes_gemm_then_fused_gemm():
    text = """graph @g(%a: tensor<3x5xf32>) {
  %w = const dense<0.5> : tensor<5x4xf32>
  %c = const dense<0.5> : tensor<4xf32>
  %y = MatMul(%a, %w) : tensor<3x4xf32>
  %s = Add(%c, %y) : tensor<3x4xf32>
  %z = LeakyRelu(%s) {alpha = 0.1} : tensor<3x4xf32>
  return %z
}"""
    check_pass_numerics(text, "fuse-act")
    assert_ir(run_ir(text, "fuse-act"), """graph @g(%a: tensor<3x5xf32>) {
  %w = const dense<0.5> : tensor<5x4xf32>
  %c = const dense<0.5> : tensor<4xf32>
  %z = FusedGemm(%a, %w, %c) {activation = "LeakyRelu", activation_params = [0.1], alpha = 1.0, beta = 1.0, transA = 0, transB = 0} : tensor<3x4xf32>
  return %z
}""")


NOT_FUSED = {
    # the conv result is also a graph output / has a second user
    "conv_output_used_twice": (f"  %z = Relu(%y) : {T}", "%z, %y", ["Conv", "Relu"]),
    "conv_feeds_two_ops": (f"  %r = Relu(%y) : {T}\n  %z = Add(%r, %y) : {T}", "%z", ["Conv", "Relu", "Add"]),
    # a broadcasting addend is not a residual (Z must have the output's shape)
    "broadcast_residual": (f"  %z = Add(%y, %c) : {T}", "%z", ["Conv", "Add"]),
    # Add that broadcasts the conv output to a bigger shape
    "add_grows_shape": ("  %z = Add(%y, %big) : tensor<2x4x5x5xf32>", "%z", ["Conv", "Add"]),
    # an activation after an already fused activation
    "two_activations": (f"  %r = Relu(%y) : {T}\n  %z = Sigmoid(%r) : {T}", "%z", ["FusedConv", "Sigmoid"]),
    # not an activation fuse-act knows
    "softplus": (f"  %z = Softplus(%y) : {T}", "%z", ["Conv", "Softplus"]),
}


@pytest.mark.parametrize("case", sorted(NOT_FUSED))
def test_not_fused(case):
    body, ret, want = NOT_FUSED[case]
    text = HEAD.replace("%skip: tensor<1x4x5x5xf32>", "%skip: tensor<1x4x5x5xf32>, %c: tensor<1x4x1x1xf32>, "
                        "%big: tensor<2x4x5x5xf32>") + f"{body}\n  return {ret}\n}}"
    g = check_pass_numerics(text, "fuse-act")
    assert kinds(g) == want


@pytest.mark.parametrize("text", [
    # 3-D MatMul: Gemm is 2-D only
    """graph @g(%a: tensor<2x3x5xf32>) {
  %w = const dense<0.5> : tensor<5x4xf32>
  %c = const dense<0.5> : tensor<4xf32>
  %y = MatMul(%a, %w) : tensor<2x3x4xf32>
  %z = Add(%y, %c) : tensor<2x3x4xf32>
  return %z
}""",
    # the addend is not a constant
    """graph @g(%a: tensor<3x5xf32>, %c: tensor<4xf32>) {
  %w = const dense<0.5> : tensor<5x4xf32>
  %y = MatMul(%a, %w) : tensor<3x4xf32>
  %z = Add(%y, %c) : tensor<3x4xf32>
  return %z
}""",
    # the addend grows the shape
    """graph @g(%a: tensor<3x5xf32>) {
  %w = const dense<0.5> : tensor<5x4xf32>
  %c = const dense<0.5> : tensor<2x3x4xf32>
  %y = MatMul(%a, %w) : tensor<3x4xf32>
  %z = Add(%y, %c) : tensor<2x3x4xf32>
  return %z
}""",
])
def test_matmul_add_not_gemm(text):
    assert kinds(check_pass_numerics(text, "fuse-act")) == ["MatMul", "Add"]
