"""relu6-to-relu: Clip(0, 6) -> Relu (also as a fused activation); its accuracy effect, measured."""
import numpy as np
import pytest
from ir_check import assert_ir, ort_session, run_ir, unchanged

T = "tensor<1x4x5x5xf32>"


def test_clip_and_fused_clip_become_relu():
    g = run_ir(f"""graph @g(%x: {T}) {{
  %w = const dense<0.5> : tensor<4x4x1x1xf32>
  %c = Clip(%x) {{max = 6.0, min = 0.0}} : {T}
  %y = FusedConv(%c, %w) {{activation = "Clip", activation_params = [0.0, 6.0], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]}} : {T}
  return %y
}}""", "relu6-to-relu")
    assert_ir(g, f"""graph @g(%x: {T}) {{
  %w = const dense<0.5> : tensor<4x4x1x1xf32>
  %clip_relu_out = Relu(%x) : {T}
  %y = FusedConv(%clip_relu_out, %w) {{activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]}} : {T}
  return %y
}}""")


def test_other_clips_stay():
    unchanged(f"""graph @g(%x: {T}) {{
  %a = Clip(%x) {{max = 6.0, min = -1.0}} : {T}
  %b = Clip(%a) {{max = 1.0, min = 0.0}} : {T}
  %c = Clip(%b) {{max = inf, min = 0.0}} : {T}
  return %c
}}
""", "relu6-to-relu")


def test_not_in_default_pipeline():
    from qcompiler.passes import DEFAULT_PIPELINE
    assert "relu6-to-relu" not in DEFAULT_PIPELINE


def top1(g, x: np.ndarray) -> np.ndarray:
    """Predicted classes of ``g`` on images ``x``, in batches of the graph's fixed batch size."""
    sess, name, n = ort_session(g), g.inputs[0].name, g.inputs[0].shape[0]
    return np.concatenate([sess.run(None, {name: x[i:i + n]})[0].argmax(1) for i in range(0, len(x), n)])


def test_accuracy_effect_on_fashion_mobilenet():
    """Top-1 on models/fashion_test.npz before and after relu6-to-relu (figure in the docstring)."""
    from realmodels import MODELS_DIR, fashion_test

    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.passes import run_passes
    path = MODELS_DIR / "fashion_mobilenet.onnx"
    data = fashion_test()
    if not path.exists() or data is None:
        pytest.skip("models/fashion_mobilenet.onnx or models/fashion_test.npz not there yet")
    x, y = data
    base = run_passes(import_onnx(str(path)), "default")
    relu = run_passes(base.clone(), "relu6-to-relu")
    assert any(op.attrs.get("activation") == "Clip" for op in base.ops)
    assert not any(op.attrs.get("activation") == "Clip" or op.kind == "Clip" for op in relu.ops)
    p0, p1 = top1(base, x), top1(relu, x)
    acc0, acc1, agree = (p0 == y).mean(), (p1 == y).mean(), (p0 == p1).mean()
    print(f"fashion_mobilenet top-1 on {len(y)} images: ReLU6 {acc0:.1%}, ReLU {acc1:.1%}, agreement {agree:.1%}")
    assert acc0 > 0.8
    assert abs(acc1 - acc0) <= 0.01 and agree >= 0.99     # "within noise", as the docstring reports
