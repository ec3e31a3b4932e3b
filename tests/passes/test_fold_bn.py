"""fold-bn: BatchNormalization and per-channel Mul/Add constants fold into Conv, ConvTranspose,
Gemm and MatMul; BN statistics are recorded; what cannot fold becomes Mul + Add."""
import json

import pytest
from ir_check import assert_ir, assert_same_outputs, check_pass_numerics, run_ir

from qcompiler.ir import parse_graph

BN_PARAMS = """  %gamma = const dense<[2.0, 1.0, 0.5, 1.5]> : tensor<4xf32>
  %beta = const dense<[0.5, -0.5, 0.0, 1.0]> : tensor<4xf32>
  %mean = const dense<[1.0, 0.0, -1.0, 2.0]> : tensor<4xf32>
  %var = const dense<[3.0, 0.0, 1.0, 0.25]> : tensor<4xf32>
"""
BN = "BatchNormalization({x}, %gamma, %beta, %mean, %var) {{epsilon = 1.0}}"
CONV = "{{dilations = [1, 1], group = {g}, pads = [{p}, {p}, {p}, {p}], strides = [1, 1]}}"


def graph(args: str, consts: str, body: str, ret: str = "%z") -> str:
    return f"graph @g({args}) {{\n{consts}{BN_PARAMS}{body}\n  return {ret}\n}}\n"


def test_conv_bn_golden_and_stats():
    g = run_ir(graph("%x: tensor<1x2x4x4xf32>", "  %w = const dense<1.0> : tensor<4x2x1x1xf32>\n",
                     f"  %y = Conv(%x, %w) {CONV.format(g=1, p=0)} : tensor<1x4x4x4xf32> loc(\"conv1\")\n"
                     f"  %z = {BN.format(x='%y')} : tensor<1x4x4x4xf32>"), "fold-bn")
    # s = gamma / sqrt(var + 1) = [1, 1, 0.5/sqrt(2), 1.5/sqrt(1.25)], t = beta - mean * s
    assert_ir(g, """
    graph @g(%x: tensor<1x2x4x4xf32>) {
      %w_folded = const dense<[1.0, 1.0, 1.0, 1.0, 0.35355338, 0.35355338, 1.3416408, 1.3416408]> : tensor<4x2x1x1xf32>
      %conv1_bias = const dense<[-0.5, -0.5, 0.35355338, -1.6832815]> : tensor<4xf32>
      %z = Conv(%x, %w_folded, %conv1_bias) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x4x4x4xf32>
      return %z
    }""")
    stats = g.meta["bn_stats"]["conv1"]
    assert stats == {"gamma": [2.0, 1.0, 0.5, 1.5], "beta": [0.5, -0.5, 0.0, 1.0], "mean": [1.0, 0.0, -1.0, 2.0],
                     "var": [3.0, 0.0, 1.0, 0.25], "eps": 1.0}
    json.dumps(g.meta["bn_stats"])
    assert g.ops[0].name == "conv1"


# Each case: (inputs, constants, ops before the BN, the BN's input, BN result type)
FOLDS = {
    "conv_bias_depthwise": ("%x: tensor<1x4x5x5xf32>", "  %w = const dense<1.0> : tensor<4x1x3x3xf32>\n"
                            "  %b = const dense<1.0> : tensor<4xf32>\n",
                            f"  %y = Conv(%x, %w, %b) {CONV.format(g=4, p=1)} : tensor<1x4x5x5xf32>\n", "tensor<1x4x5x5xf32>"),
    "conv_transpose_groups": ("%x: tensor<1x4x3x3xf32>", "  %w = const dense<1.0> : tensor<4x2x2x2xf32>\n"
                              "  %b = const dense<1.0> : tensor<4xf32>\n",
                              "  %y = ConvTranspose(%x, %w, %b) {dilations = [1, 1], group = 2, output_padding = [0, 0], "
                              "pads = [0, 0, 0, 0], strides = [2, 2]} : tensor<1x4x6x6xf32>\n", "tensor<1x4x6x6xf32>"),
    "gemm_transB_bias": ("%x: tensor<3x5xf32>", "  %w = const dense<1.0> : tensor<4x5xf32>\n"
                         "  %c = const dense<1.0> : tensor<1x4xf32>\n",
                         "  %y = Gemm(%x, %w, %c) {alpha = 0.5, beta = 2.0, transA = 0, transB = 1} : tensor<3x4xf32>\n",
                         "tensor<3x4xf32>"),
    "gemm_no_bias": ("%x: tensor<5x3xf32>", "  %w = const dense<1.0> : tensor<5x4xf32>\n",
                     "  %y = Gemm(%x, %w) {alpha = 1.0, beta = 1.0, transA = 1, transB = 0} : tensor<3x4xf32>\n",
                     "tensor<3x4xf32>"),
    "matmul": ("%x: tensor<3x5xf32>", "  %w = const dense<1.0> : tensor<5x4xf32>\n",
               "  %y = MatMul(%x, %w) : tensor<3x4xf32>\n", "tensor<3x4xf32>"),
}


@pytest.mark.parametrize("case", sorted(FOLDS))
def test_bn_folds_into_producer(case):
    args, consts, body, t = FOLDS[case]
    text = graph(args, consts, body + f"  %z = {BN.format(x='%y')} : {t}")
    after = check_pass_numerics(text, "fold-bn")
    kinds = [op.kind for op in after.ops]
    assert kinds == ["Gemm" if case == "matmul" else body.split("= ")[1].split("(")[0]]
    (name,) = after.meta["bn_stats"]
    assert name == after.ops[0].name and len(after.meta["bn_stats"][name]["gamma"]) == 4


def test_per_channel_add_and_mul_fold_and_update_stats():
    text = graph("%x: tensor<1x2x4x4xf32>",
                 "  %w = const dense<1.0> : tensor<4x2x3x3xf32>\n"
                 "  %c = const dense<[1.0, 2.0, 3.0, 4.0]> : tensor<1x4x1x1xf32>\n"
                 "  %s = const dense<[2.0, -1.0, 0.5, 3.0]> : tensor<4x1x1xf32>\n",
                 f"  %y = Conv(%x, %w) {CONV.format(g=1, p=1)} : tensor<1x4x4x4xf32> loc(\"conv\")\n"
                 f"  %n = {BN.format(x='%y')} : tensor<1x4x4x4xf32>\n"
                 "  %a = Add(%c, %n) : tensor<1x4x4x4xf32>\n"
                 "  %z = Mul(%a, %s) : tensor<1x4x4x4xf32>")
    before = parse_graph(text)
    after = run_ir(before.clone(), "fold-bn")
    assert_same_outputs(before, after)
    assert [op.kind for op in after.ops] == ["Conv"]
    st = after.meta["bn_stats"]["conv"]
    assert st["gamma"] == [4.0, -1.0, 0.25, 4.5]          # s * gamma
    assert st["beta"] == [3.0, -1.5, 1.5, 15.0]           # s * (beta + c)
    assert st["mean"] == [1.0, 0.0, -1.0, 2.0]


def test_bn_before_unpadded_grouped_conv_folds_into_its_input_side():
    text = graph("%x: tensor<1x4x5x5xf32>", "  %w = const dense<1.0> : tensor<6x2x3x3xf32>\n",
                 f"  %n = {BN.format(x='%x')} : tensor<1x4x5x5xf32>\n"
                 f"  %z = Conv(%n, %w) {CONV.format(g=2, p=0)} : tensor<1x6x3x3xf32>")
    after = check_pass_numerics(text, "fold-bn")
    assert [op.kind for op in after.ops] == ["Conv"] and len(after.ops[0].operands) == 3
    assert "bn_stats" not in after.meta


NOT_FOLDED = {
    # the conv result has a second use
    "multi_use": ("%x: tensor<1x2x4x4xf32>", "  %w = const dense<1.0> : tensor<4x2x1x1xf32>\n",
                  f"  %y = Conv(%x, %w) {CONV.format(g=1, p=0)} : tensor<1x4x4x4xf32>\n", "%y", "%z, %y"),
    # the weights are not constant
    "weight_input": ("%x: tensor<1x2x4x4xf32>, %w: tensor<4x2x1x1xf32>", "",
                     f"  %y = Conv(%x, %w) {CONV.format(g=1, p=0)} : tensor<1x4x4x4xf32>\n", "%y", "%z"),
    # a BN on the input of a padded conv: the padding would see t instead of 0
    "before_padded_conv": ("%x: tensor<1x4x4x4xf32>", "  %w = const dense<1.0> : tensor<4x4x3x3xf32>\n",
                           "", "%x", None),
    # BN on axis 1 of a batched MatMul is not the weight's last axis
    "batched_matmul": ("%x: tensor<2x4x5xf32>", "  %w = const dense<1.0> : tensor<5x3xf32>\n",
                       "  %y = MatMul(%x, %w) : tensor<2x4x3xf32>\n", "%y", "%z"),
}


@pytest.mark.parametrize("case", sorted(NOT_FOLDED))
def test_bn_that_cannot_fold_becomes_mul_add(case):
    args, consts, body, x, ret = NOT_FOLDED[case]
    t = "tensor<2x4x3xf32>" if case == "batched_matmul" else "tensor<1x4x4x4xf32>"
    tail = f"  %z = {BN.format(x=x)} : {t}"
    if ret is None:
        tail = f"  %n = {BN.format(x=x)} : {t}\n  %z = Conv(%n, %w) {CONV.format(g=1, p=1)} : tensor<1x4x4x4xf32>"
    text = graph(args, consts, body + tail, ret or "%z")
    before = [op.kind for op in run_ir(text, "none").ops]
    after = check_pass_numerics(text, "fold-bn")
    kinds = [op.kind for op in after.ops]
    i = before.index("BatchNormalization")
    assert kinds == before[:i] + ["Mul", "Add"] + before[i + 1:]
    assert "bn_stats" not in after.meta


def test_lowered_bn_golden():
    g = run_ir("""graph @g(%x: tensor<2x4xf32>, %w: tensor<4x2x1x1xf32>) {
""" + BN_PARAMS + """  %z = BatchNormalization(%x, %gamma, %beta, %mean, %var) {epsilon = 1.0} : tensor<2x4xf32> loc("bn")
  return %z
}""", "fold-bn")
    assert_ir(g, """graph @g(%x: tensor<2x4xf32>, %w: tensor<4x2x1x1xf32>) {
  %bn_scale = const dense<[1.0, 1.0, 0.35355338, 1.3416408]> : tensor<4xf32>
  %bn_shift = const dense<[-0.5, -0.5, 0.35355338, -1.6832815]> : tensor<4xf32>
  %bn_scale_out = Mul(%x, %bn_scale) : tensor<2x4xf32>
  %z = Add(%bn_scale_out, %bn_shift) : tensor<2x4xf32>
  return %z
}""")


@pytest.mark.parametrize("const", ["dense<1.0> : tensor<1x4x4x4xf32>", "dense<1.0> : tensor<4x4xf32>",
                                   "dense<1.0> : tensor<2x4x1x1xf32>"])
def test_add_of_non_per_channel_constant_not_folded(const):
    text = f"""graph @g(%x: tensor<1x2x4x4xf32>) {{
  %w = const dense<1.0> : tensor<4x2x1x1xf32>
  %c = const {const}
  %y = Conv(%x, %w) {CONV.format(g=1, p=0)} : tensor<1x4x4x4xf32>
  %z = Add(%y, %c) : tensor<{'2' if const.startswith('dense<1.0> : tensor<2') else '1'}x4x4x4xf32>
  return %z
}}
"""
    assert [op.kind for op in run_ir(text, "fold-bn").ops] == ["Conv", "Add"]


@pytest.mark.parametrize("pads, affine, folded", [
    (0, "mul_add", True),        # both fold into an unpadded conv
    (1, "mul", True),            # a scale folds into a padded conv
    (1, "add", False),           # a shift does not: the padded zeros would have become t
    (1, "mul_add", False),       # ... and the Mul then feeds the Add, not the conv
])
def test_per_channel_affine_folds_into_consuming_conv(pads, affine, folded):
    lines, x = [], "%x"
    if "mul" in affine:
        lines.append("  %m = Mul(%s, %x) : tensor<1x4x5x5xf32>")
        x = "%m"
    if "add" in affine:
        lines.append(f"  %a = Add({x}, %t) : tensor<1x4x5x5xf32>")
        x = "%a"
    out = 5 - 2 * (1 - pads)
    text = f"""graph @g(%x: tensor<1x4x5x5xf32>) {{
  %w = const dense<1.0> : tensor<6x2x3x3xf32>
  %s = const dense<[2.0, -1.0, 0.5, 3.0]> : tensor<4x1x1xf32>
  %t = const dense<[1.0, 2.0, 3.0, 4.0]> : tensor<1x4x1x1xf32>
{chr(10).join(lines)}
  %z = Conv({x}, %w) {CONV.format(g=2, p=pads)} : tensor<1x6x{out}x{out}xf32>
  return %z
}}"""
    after = check_pass_numerics(text, "fold-bn")
    before = [op.kind for op in run_ir(text, "none").ops]
    assert [op.kind for op in after.ops] == (["Conv"] if folded else before)
