"""examples/custom_pass.py: a plugin pass registered through the public API, loaded with
load_plugin, rewrites HardSigmoid into Mul + Add + Clip without changing results."""
from pathlib import Path

import pytest
from ir_check import assert_close, assert_ir, ort_outputs, run_ir

from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.passes import available_passes, load_plugin, run_passes

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "custom_pass.py"


@pytest.fixture(scope="module", autouse=True)
def plugin():
    load_plugin(str(PLUGIN))
    assert "hardsigmoid-to-clip" in available_passes()


def test_golden():
    g = run_ir("""graph @g(%x: tensor<2x3xf32>) {
  %y = HardSigmoid(%x) {alpha = 0.25, beta = 0.75} : tensor<2x3xf32>
  return %y
}""", "hardsigmoid-to-clip")
    assert_ir(g, """graph @g(%x: tensor<2x3xf32>) {
  %alpha = const dense<0.25> : tensor<f32>
  %beta = const dense<0.75> : tensor<f32>
  %mul_out = Mul(%x, %alpha) : tensor<2x3xf32>
  %add_out = Add(%mul_out, %beta) : tensor<2x3xf32>
  %y = Clip(%add_out) {max = 1.0, min = 0.0} : tensor<2x3xf32>
  return %y
}""")


def test_rapidocr_classifier_outputs_unchanged():
    from realmodels import rapidocr_models
    (m,) = [m for m in rapidocr_models() if m.name == "rapidocr-cls"] or [None]
    if m is None:
        pytest.skip("rapidocr_onnxruntime is not installed")
    g = import_onnx(m.load(), m.input_shapes)
    n_hs = g.op_histogram()["HardSigmoid"]
    after = run_passes(g.clone(), "hardsigmoid-to-clip")
    hist = after.op_histogram()
    assert "HardSigmoid" not in hist and hist["Clip"] == g.op_histogram().get("Clip", 0) + n_hs
    feeds = m.feeds()
    assert_close(ort_outputs(g, feeds), ort_outputs(after, feeds))
    # and after the default pipeline too (the Clip fuses like any activation)
    fused = run_passes(after, "default")
    assert_close(ort_outputs(g, feeds), ort_outputs(fused, feeds))
