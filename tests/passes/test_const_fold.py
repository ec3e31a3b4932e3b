"""const-fold: ops on constants become constants (names and dtypes kept); the numpy kernels of
qcompiler.ir.interp agree with onnxruntime."""
import numpy as np
import pytest
from ir_check import assert_ir, ort_outputs, run_ir, unchanged

from qcompiler.ir import parse_graph
from qcompiler.ir.interp import KERNELS, evaluate
from qcompiler.passes import PassContext
from qcompiler.passes.const_fold import ConstFoldOptions


def test_weight_transpose_and_bias_reshape_fold():
    g = run_ir("""
    graph @g(%x: tensor<1x2xf32>) {
      %w = const dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]> : tensor<3x2xf32>
      %b = const dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
      %two = const dense<2.0> : tensor<f32>
      %wt = Transpose(%w) {perm = [1, 0]} : tensor<2x3xf32>
      %w2 = Mul(%wt, %two) : tensor<2x3xf32>
      %b2 = Reshape(%b) {shape = [1, 3]} : tensor<1x3xf32>
      %y = MatMul(%x, %w2) : tensor<1x3xf32>
      %z = Add(%y, %b2) : tensor<1x3xf32>
      return %z
    }""", "const-fold")
    assert_ir(g, """
    graph @g(%x: tensor<1x2xf32>) {
      %w2 = const dense<[2.0, 6.0, 10.0, 4.0, 8.0, 12.0]> : tensor<2x3xf32>
      %b2 = const dense<[1.0, 2.0, 3.0]> : tensor<1x3xf32>
      %y = MatMul(%x, %w2) : tensor<1x3xf32>
      %z = Add(%y, %b2) : tensor<1x3xf32>
      return %z
    }""")


def test_integer_shape_arithmetic_folds():
    g = run_ir("""
    graph @g(%x: tensor<2x3xf32>) {
      %s = const dense<[1, 2, 3, 4]> : tensor<4xi64>
      %i = const dense<[0, 2]> : tensor<2xi64>
      %g = Gather(%s, %i) {axis = 0} : tensor<2xi64>
      %c = Cast(%g) {to = "int32"} : tensor<2xi32>
      %k = Concat(%c, %c) {axis = 0} : tensor<4xi32>
      %d = Div(%k, %c2) : tensor<4xi32>
      return %d
    }""".replace("%c2)", "%k)"), "const-fold")
    # the output op stays; everything before it folds
    assert_ir(g, """
    graph @g(%x: tensor<2x3xf32>) {
      %k = const dense<[1, 3, 1, 3]> : tensor<4xi32>
      %d = Div(%k, %k) : tensor<4xi32>
      return %d
    }""")


def test_not_folded_non_constant_operand_and_big_expand():
    unchanged("""graph @g(%x: tensor<4xf32>) {
  %c = const dense<2.0> : tensor<1xf32>
  %e = Expand(%c) {shape = [300, 300]} : tensor<300x300xf32>
  %y = Mul(%x, %c) : tensor<4xf32>
  return %y, %e
}
""".replace("return %y, %e", "%s = ReduceSum(%e) {axes = [], keepdims = 0} : tensor<f32>\n  return %y, %s"), "const-fold")


def test_growth_limit_is_an_option():
    text = """graph @g() {
  %c = const dense<2.0> : tensor<1xf32>
  %e = Expand(%c) {shape = [8, 8]} : tensor<8x8xf32>
  %s = ReduceSum(%e) {axes = [], keepdims = 0} : tensor<f32>
  %y = Neg(%s) : tensor<f32>
  return %y
}
"""
    g = run_ir(text, "const-fold", PassContext(options={"const-fold": ConstFoldOptions(max_new_elements=16)}))
    assert [op.kind for op in g.ops] == ["Expand", "ReduceSum", "Neg"]
    g = run_ir(text, "const-fold")
    assert [op.kind for op in g.ops] == ["Neg"] and float(g.consts["s"].data) == 128.0


# ---- the numpy kernels against onnxruntime -------------------------------------------------------
F = "tensor<2x3x4xf32>"
KERNEL_CASES = {
    "Relu": f"%y = Relu(%a) : {F}", "Sigmoid": f"%y = Sigmoid(%a) : {F}", "Tanh": f"%y = Tanh(%a) : {F}",
    "Exp": f"%y = Exp(%a) : {F}", "Abs": f"%y = Abs(%a) : {F}", "Neg": f"%y = Neg(%a) : {F}",
    "Erf": f"%y = Erf(%a) : {F}", "Floor": f"%y = Floor(%a) : {F}", "Round": f"%y = Round(%a) : {F}",
    "Softplus": f"%y = Softplus(%a) : {F}", "HardSwish": f"%y = HardSwish(%a) : {F}",
    "Reciprocal": f"%y = Reciprocal(%a) : {F}", "Identity": f"%y = Identity(%a) : {F}",
    "LeakyRelu": f"%y = LeakyRelu(%a) {{alpha = 0.1}} : {F}",
    "HardSigmoid": f"%y = HardSigmoid(%a) {{alpha = 0.3, beta = 0.4}} : {F}",
    "Clip": f"%y = Clip(%a) {{max = 0.5, min = -0.25}} : {F}",
    "Gelu": f"%y = Gelu(%a) {{approximate = \"none\"}} : {F}",
    "Add": f"%y = Add(%a, %b) : {F}", "Sub": f"%y = Sub(%a, %b) : {F}", "Mul": f"%y = Mul(%a, %b) : {F}",
    "Div": f"%y = Div(%a, %b) : {F}", "Max": f"%y = Max(%a, %b) : {F}", "Min": f"%y = Min(%a, %b) : {F}",
    "Pow": f"%y = Pow(%p, %b) : {F}",
    "Cast": "%y = Cast(%a) {to = \"int32\"} : tensor<2x3x4xi32>",
    "Softmax": f"%y = Softmax(%a) {{axis = 1}} : {F}",
    "LogSoftmax": f"%y = LogSoftmax(%a) {{axis = -1}} : {F}",
    "Reshape": "%y = Reshape(%a) {shape = [6, 4]} : tensor<6x4xf32>",
    "Flatten": "%y = Flatten(%a) {axis = 2} : tensor<6x4xf32>",
    "Transpose": "%y = Transpose(%a) {perm = [2, 0, 1]} : tensor<4x2x3xf32>",
    "Squeeze": "%y = Squeeze(%r) {axes = [1]} : tensor<2x4xf32>",
    "Unsqueeze": "%y = Unsqueeze(%a) {axes = [0, -1]} : tensor<1x2x3x4x1xf32>",
    "Concat": "%y = Concat(%a, %b) {axis = 2} : tensor<2x3x8xf32>",
    "Split": "%y, %y2 = Split(%a) {axis = 2, split = [1, 3]} : tensor<2x3x1xf32>, tensor<2x3x3xf32>",
    "Slice": "%y = Slice(%a) {axes = [2, 1], ends = [-1, 100], starts = [0, 1], steps = [2, 1]} : tensor<2x2x2xf32>",
    "Gather": "%y = Gather(%a, %i) {axis = 1} : tensor<2x2x4xf32>",
    "Expand": "%y = Expand(%r) {shape = [2, 3, 4]} : tensor<2x3x4xf32>",
    "Pad": "%y = Pad(%a) {mode = \"constant\", pads = [0, 1, 0, 0, 0, 2], value = 1.5} : tensor<2x4x6xf32>",
    "ReduceMean": "%y = ReduceMean(%a) {axes = [1], keepdims = 1} : tensor<2x1x4xf32>",
    "ReduceSum": "%y = ReduceSum(%a) {axes = [0, 2], keepdims = 0} : tensor<3xf32>",
    "ReduceMax": "%y = ReduceMax(%a) {axes = [], keepdims = 0} : tensor<f32>",
    "ReduceMin": "%y = ReduceMin(%a) {axes = [-1], keepdims = 1} : tensor<2x3x1xf32>",
    "MatMul": "%y = MatMul(%a, %m) : tensor<2x3x5xf32>",
    "Gemm": "%y = Gemm(%g, %m, %c) {alpha = 0.5, beta = 2.0, transA = 1, transB = 0} : tensor<3x5xf32>",
    "BatchNormalization": "%y = BatchNormalization(%a, %s, %s, %s, %v) {epsilon = 0.001} : tensor<2x3x4xf32>",
}
ARGS = ("%a: tensor<2x3x4xf32>, %b: tensor<2x3x4xf32>, %p: tensor<2x3x4xf32>, %r: tensor<2x1x4xf32>, "
        "%i: tensor<2xi64>, %m: tensor<4x5xf32>, %g: tensor<4x3xf32>, %c: tensor<5xf32>, %s: tensor<3xf32>, "
        "%v: tensor<3xf32>")


@pytest.mark.parametrize("kind", sorted(KERNEL_CASES))
def test_numpy_kernel_matches_onnxruntime(kind):
    body = KERNEL_CASES[kind]
    outs = body.split(" = ")[0]
    g = parse_graph(f"graph @k({ARGS}) {{\n  {body}\n  return {outs}\n}}")
    g.verify()
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype) * 2 for v in g.inputs}
    feeds["p"] = np.abs(feeds["p"]) + 0.5
    feeds["v"] = np.abs(feeds["v"]) + 0.1
    feeds["i"] = np.array([2, -1], np.int64)
    op = g.ops[0]
    want = ort_outputs(g, feeds)
    got = evaluate(op, [feeds[v.name] for v in op.operands])
    assert len(got) == len(want)
    for w, o, r in zip(want, got, op.results):
        assert o.shape == w.shape and o.dtype == w.dtype, (o.shape, o.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(o, w, rtol=2e-6, atol=2e-6)


def test_every_kernel_is_tested():
    from opcases import covered_kinds      # the zoo ops' kernels: interpreter vs ORT in tests/frontend/test_import_*.py
    assert set(KERNELS) - set(KERNEL_CASES) - covered_kinds() <= {"Dropout", "Sqrt", "Log", "Ceil"}
