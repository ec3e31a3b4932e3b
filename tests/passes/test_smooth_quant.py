"""smooth-quant: the channel factors s = max|X|^α / max|W|^(1-α), divided out of the activation (in
its LayerNorm, or by a Mul) and multiplied into the weights, preserve the float model; with an
outlier channel they lower the int8 error of the quantize pass that follows."""
import numpy as np
import pytest

from qcompiler.errors import UserError
from qcompiler.ir import parse_graph
from qcompiler.passes import PassContext, PassManager
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.passes.smooth_quant import SmoothQuantOptions, factors
from qcompiler.quant import reference, sqnr_db

K, N = 8, 6


def _const(a):
    return "dense<[" + ", ".join(f"{v:.6g}" for v in np.asarray(a, np.float32).reshape(-1)) + "]>"


def net(post_ln: bool, seed: int = 0) -> str:
    """LayerNorm over K channels (γ: channel 3 is 40x the rest, the outlier, as in trained
    transformers, with small weights) -> x @ W + b, and in
    the post-LN form the LayerNorm output also feeds a residual Add."""
    rng = np.random.default_rng(seed)
    gamma = np.ones(K, np.float32)
    gamma[3] = 40.0
    beta = rng.normal(0, 0.1, K)
    w = rng.normal(0, 0.3, (K, N))
    w[3] /= 40.0                            # the outlier's weights small: it does not dominate the output
    b = rng.normal(0, 0.1, N)
    w2 = rng.normal(0, 0.3, (N, K))
    tail = (f"""  %w2 = const {_const(w2)} : tensor<{N}x{K}xf32>
  %z = MatMul(%y, %w2) : tensor<1x5x{K}xf32> loc("fc2")
  %r = Add(%z, %x) : tensor<1x5x{K}xf32> loc("residual")
  return %r""" if post_ln else "  return %y")
    return f"""graph @g(%h: tensor<1x5x{K}xf32>) {{
  %gamma = const {_const(gamma)} : tensor<{K}xf32>
  %beta = const {_const(beta)} : tensor<{K}xf32>
  %x = LayerNormalization(%h, %gamma, %beta) {{axis = -1, epsilon = 1e-05}} : tensor<1x5x{K}xf32> loc("ln")
  %w = const {_const(w)} : tensor<{K}x{N}xf32>
  %m = MatMul(%x, %w) : tensor<1x5x{N}xf32> loc("fc")
  %b = const {_const(b)} : tensor<{N}xf32>
  %y = Add(%m, %b) : tensor<1x5x{N}xf32> loc("bias")
{tail}
}}"""


def calib(n=16, seed=1):
    rng = np.random.default_rng(seed)
    return [{"h": rng.normal(0, 1, (1, 5, K)).astype(np.float32)} for _ in range(n)]


def run(text, passes, **options):
    g = parse_graph(text)
    PassManager(passes, ctx=PassContext(options=options)).run(g)
    return g


def outputs(g, feeds):
    return np.concatenate([reference.run(g, f)[0] for f in feeds])


def test_factors_follow_the_formula():
    a, w = np.array([4.0, 100.0, 0.0, 1.0]), np.array([1.0, 0.25, 2.0, 0.0])
    s = factors(a, w, 0.5)
    np.testing.assert_allclose(s, [2.0, 20.0, 1.0, 1.0], rtol=1e-6)     # dead channels keep s = 1
    np.testing.assert_allclose(factors(a, w, 1.0)[:2], [4.0, 100.0], rtol=1e-6)


def test_pre_ln_folds_into_layernorm_and_preserves_the_model():
    src = net(post_ln=False)
    g = run(src, "smooth-quant", **{"smooth-quant": SmoothQuantOptions(alpha=0.5, calib=calib())})
    assert [op.kind for op in g.ops] == ["LayerNormalization", "MatMul", "Add"]        # no Mul: γ, β absorbed 1/s
    rec = g.meta["smooth_quant"]["x"]
    assert rec["alpha"] == 0.5 and rec["into"] == "layernorm" and rec["layers"] == ["fc"]
    gamma = g.find_ops("LayerNormalization")[0].operands[1].data
    assert gamma[3] / np.delete(gamma, 3).mean() < 40 / 2                 # the outlier channel flattened
    feeds = calib(4, seed=7)
    np.testing.assert_allclose(outputs(g, feeds), outputs(parse_graph(src), feeds), rtol=1e-5, atol=1e-5)


def test_post_ln_gets_a_mul_on_the_linear_path_only():
    src = net(post_ln=True)
    g = run(src, "smooth-quant", **{"smooth-quant": SmoothQuantOptions(alpha=0.5, calib=calib())})
    assert g.meta["smooth_quant"]["x"]["into"] == "mul" and g.meta["smooth_quant"]["y"]["into"] == "mul"
    mul = next(op for op in g.find_ops("Mul") if op.operands[0].name == "x")
    residual = next(op for op in g.ops if op.name == "residual")
    assert residual.operands[1].name == "x" and g.find_ops("LayerNormalization")[0].operands[1].name == "gamma"
    assert next(op for op in g.ops if op.name == "fc").operands[0] is mul.result
    feeds = calib(4, seed=7)
    np.testing.assert_allclose(outputs(g, feeds), outputs(parse_graph(src), feeds), rtol=1e-5, atol=1e-5)


def test_outlier_channel_int8_error_drops_with_smoothing():
    """The int8 build of the pre-LN net (quantize pass, per-tensor uint8 activations): SmoothQuant
    with α chosen from the data gains more than 6 dB of output SQNR over plain static int8."""
    src, cal, feeds = net(post_ln=False), calib(), calib(8, seed=9)
    ref = outputs(parse_graph(src), feeds)
    q = QuantizeOptions(calib=cal, bias_correction=False)
    plain = run(src, "quantize", quantize=q)
    smooth = run(src, "smooth-quant,quantize", quantize=q)
    rec = smooth.meta["smooth_quant"]["x"]
    assert rec["alpha"] is not None and rec["error"]["with"] < rec["error"]["without"]
    assert sqnr_db(ref, outputs(smooth, feeds)) > sqnr_db(ref, outputs(plain, feeds)) + 6


def test_needs_calibration_data():
    with pytest.raises(UserError, match="calibration data"):
        run(net(False), "smooth-quant")
    with pytest.raises(UserError, match="outside"):
        SmoothQuantOptions(alpha=1.5)


def _encoder_onnx(path, seed=0):
    """x[1,6,8] -> LayerNormalization (γ with an outlier channel) -> MatMul W (8x8) + b -> Gelu-free
    Tanh -> MatMul W2 (8x8) + residual x: an encoder block's linear layers with a post-LN residual."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    gamma = np.ones(K, np.float32)
    gamma[3] = 40.0
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("gamma", gamma), ("beta", rng.normal(0, 0.1, K)), ("w", rng.normal(0, 0.3, (K, K))),
        ("b", rng.normal(0, 0.1, K)), ("w2", rng.normal(0, 0.3, (K, K))))]
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln", axis=-1),
             helper.make_node("MatMul", ["ln", "w"], ["m"], name="fc"),
             helper.make_node("Add", ["m", "b"], ["h"], name="bias"),
             helper.make_node("Tanh", ["h"], ["t"], name="act"),
             helper.make_node("MatMul", ["t", "w2"], ["m2"], name="fc2"),
             helper.make_node("Add", ["m2", "ln"], ["y"], name="residual")]
    g = helper.make_graph(nodes, "enc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, K])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def _cli(argv):
    import contextlib
    import io
    from qcompiler.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue().strip()


def test_cli_smooth_quant_builds_and_refuses_bad_requests(tmp_path):
    """`--smooth-quant` (α per layer) builds the encoder block; the artifact runs and matches fp32
    within the int8 error (SQNR > 25 dB on held-out inputs); a bad α, an fp32 build and no
    calibration data are refused with one line and exit code 2, and no artifact."""
    from qcompiler.runtime import load
    m = _encoder_onnx(tmp_path / "enc.onnx")
    rng = np.random.default_rng(3)
    np.save(tmp_path / "x.npy", rng.normal(0, 1, (40, 6, K)).astype(np.float32))
    out = tmp_path / "out"
    rc, err = _cli([m, "--dtype", "int8", "--calib", str(tmp_path / "x.npy"), "--calib-samples", "32",
                    "--eval-samples", "8", "--smooth-quant", "-q", "-o", str(out)])
    assert rc == 0, err
    import onnxruntime as ort
    sess = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    xs = rng.normal(0, 1, (8, 1, 6, K)).astype(np.float32)
    art = load(out)
    want = np.concatenate([sess.run(None, {"x": x})[0] for x in xs])
    got = np.concatenate([art(x)[0] for x in xs])
    assert sqnr_db(want, got) > 25
    for flags, message in ((["--smooth-quant", "1.5"], "between 0 and 1"),
                           (["--smooth-quant", "x"], "between 0 and 1")):
        rc, err = _cli([m, "--dtype", "int8", "--calib", str(tmp_path / "x.npy"), "-q", "-o", str(tmp_path / "bad")]
                       + flags)
        assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    rc, err = _cli([m, "--dtype", "fp32", "--smooth-quant", "-q", "-o", str(tmp_path / "bad")])
    assert rc == 2 and "--dtype int8" in err and len(err.splitlines()) == 1, err
    rc, err = _cli([m, "--dtype", "int8", "--calib", "random", "--smooth-quant", "-q", "-o", str(tmp_path / "bad")])
    assert rc == 2 and "calibration data" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "bad").exists()
