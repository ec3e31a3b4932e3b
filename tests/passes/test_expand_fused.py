"""expand-fused: FusedConv/FusedGemm back to Conv/Gemm [+ Add] [+ activation], the inverse of fuse-act."""
import pytest
from ir_check import assert_ir, assert_same_outputs, random_consts, random_feeds, run_ir

from qcompiler.ir import parse_graph
from qcompiler.passes.expand_fused import expand_fused

T = "tensor<1x4x5x5xf32>"
CONV = "dilations = [1, 1], group = 1, pads = [1, 1, 1, 1], strides = [1, 1]"


def test_fused_conv_with_residual_and_clip_golden():
    g = run_ir(f"""graph @g(%x: {T}, %skip: {T}) {{
  %w = const dense<0.5> : tensor<4x4x3x3xf32>
  %b = const dense<0.0> : tensor<4xf32>
  %y = FusedConv(%x, %w, %b, %skip) {{activation = "Clip", activation_params = [0.0, 6.0], {CONV}}} : {T} loc("conv")
  %z = Neg(%y) : {T}
  return %z
}}""", "expand-fused")
    assert_ir(g, f"""graph @g(%x: {T}, %skip: {T}) {{
  %w = const dense<0.5> : tensor<4x4x3x3xf32>
  %b = const dense<0.0> : tensor<4xf32>
  %y = Conv(%x, %w, %b) {{{CONV}}} : {T}
  %conv_add_out = Add(%y, %skip) : {T}
  %conv_act_out = Clip(%conv_add_out) {{max = 6.0, min = 0.0}} : {T}
  %z = Neg(%conv_act_out) : {T}
  return %z
}}""")
    assert [op.name for op in g.ops][:3] == ["conv", "conv_add", "conv_act"]


@pytest.mark.parametrize("act, params", [("", []), ("Relu", []), ("LeakyRelu", [0.2]), ("HardSigmoid", [0.2, 0.5]),
                                         ("HardSwish", []), ("Sigmoid", []), ("Tanh", []), ("Clip", [-1.0, 1.0])])
@pytest.mark.parametrize("residual", [False, True])
def test_expansion_matches_fused_semantics(act, params, residual):
    """Conv -> [Add] -> [act] fused by fuse-act and expanded again computes the same as the original."""
    attrs = {"": "", "LeakyRelu": " {alpha = 0.2}", "HardSigmoid": " {alpha = 0.2, beta = 0.5}",
             "Clip": " {max = 1.0, min = -1.0}"}.get(act, "")
    lines = [f"  %y = Conv(%x, %w, %b) {{{CONV}}} : {T}"]
    last = "%y"
    if residual:
        lines.append(f"  %s = Add({last}, %skip) : {T}")
        last = "%s"
    if act:
        lines.append(f"  %a = {act}({last}){attrs} : {T}")
        last = "%a"
    text = (f"graph @g(%x: {T}, %skip: {T}) {{\n  %w = const dense<0.5> : tensor<4x4x3x3xf32>\n"
            f"  %b = const dense<0.5> : tensor<4xf32>\n" + "\n".join(lines) + f"\n  return {last}\n}}")
    original = random_consts(parse_graph(text))
    fused = run_ir(original.clone(), "fuse-act")
    assert [op.kind for op in fused.ops] == (["FusedConv"] if act or residual else ["Conv"])
    expanded = run_ir(fused.clone(), "expand-fused")
    assert [op.kind for op in expanded.ops] == [op.kind for op in original.ops]
    assert [v.name for v in expanded.outputs] == [v.name for v in original.outputs]
    assert_same_outputs(original, expanded, random_feeds(original, 1), rtol=1e-6)


def test_fused_gemm_and_function_api():
    g = parse_graph("""graph @g(%a: tensor<3x5xf32>) {
  %w = const dense<0.5> : tensor<4x5xf32>
  %z = FusedGemm(%a, %w) {activation = "Tanh", activation_params = [], alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<3x4xf32>
  return %z
}""")
    assert expand_fused(g) is True
    g.verify()
    assert [op.kind for op in g.ops] == ["Gemm", "Tanh"] and g.outputs[0].name == "z"
    assert "activation" not in g.ops[0].attrs
    assert expand_fused(g) is False
