"""quantize-dynamic: a transformer's linear layers become DynamicQLinearGemm (int8 weights, the
input quantized at run time per token), one DynamicQuantParams per activation shared by the layers
that read it, everything else float; the result stays within 8-bit error of the float model."""
import numpy as np
import pytest

from qcompiler.errors import UserError
from qcompiler.ir import parse_graph
from qcompiler.passes import PassContext, PassManager
from qcompiler.passes.quantize_dynamic import QuantizeDynamicOptions
from qcompiler.quant import reference, sqnr_db

from test_docstrings import example

from qcompiler.passes import quantize_dynamic

# the pass's docstring example (its After:: is checked by test_docstrings.py): the Q and K projections
# of x (rank-3 MatMuls, Q with its bias Add) share x's row view and run-time parameters; the
# attention scores (activation x activation) stay float
BEFORE = example(quantize_dynamic.__doc__, "Before")


def run(text, **opts):
    g = parse_graph(text)
    ctx = PassContext(options={"quantize-dynamic": QuantizeDynamicOptions(**opts)} if opts else {})
    PassManager(["quantize-dynamic"], ctx=ctx).run(g)
    return g, ctx


def test_outputs_within_8_bit_error_of_float():
    rng = np.random.default_rng(0)
    f = parse_graph(BEFORE)
    g, ctx = run(BEFORE)
    worst = min(sqnr_db(reference.run(f, feed)[0], reference.run(g, feed)[0])
                for feed in ({"x": rng.normal(0, 1, (1, 3, 4)).astype(np.float32)} for _ in range(8)))
    assert worst > 30.0, worst
    layers = g.meta["quant"]["layers"]
    assert {n for n, v in layers.items() if v["precision"] == "int8"} == {"q", "k"}
    assert layers["scores"]["precision"] == "float"
    assert g.meta["quant"]["scheme"]["mode"] == "dynamic"
    assert ctx.data["quantize.float_graph"].op_histogram()["Gemm"] == 2      # the report's fp32 reference


def test_keep_float_and_per_tensor_granularity():
    g, _ = run(BEFORE, keep_float={"k"}, granularity="tensor")
    kinds = g.op_histogram()
    assert kinds["DynamicQLinearGemm"] == 1 and kinds["MatMul"] == 2        # k kept as it was, and the scores
    p = next(op for op in g.ops if op.kind == "DynamicQuantParams")
    assert p.attrs["granularity"] == "tensor" and p.result.shape == (1, 3)
    assert g.meta["quant"]["layers"]["k"] == {"kind": "MatMul", "precision": "float",
                                               "reason": "kept float (--keep-float)"}


def test_fused_relu_folds_into_the_clamp():
    g, _ = run("""graph @g(%x: tensor<2x4xf32>) {
  %w = const dense<[0.5, -1.0, 0.25, 0.0, 1.0, 0.5, -0.5, 0.25]> : tensor<2x4xf32>
  %y = FusedGemm(%x, %w) {activation = "Relu", activation_params = [], alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<2x2xf32>
  return %y
}""")
    op = next(op for op in g.ops if op.kind == "DynamicQLinearGemm")
    assert op.attrs["activation"] == "Relu"
    y = reference.run(g, {"x": np.array([[1, 2, 3, 4], [-1, -2, 3, 0.5]], np.float32)})[0]
    assert y.min() >= 0 and y[0, 1] > 0


def test_refuses_a_prequantized_model_and_unknown_granularity():
    g = parse_graph(BEFORE)
    g.meta["prequantized"] = True
    with pytest.raises(UserError, match="already quantized"):
        PassManager(["quantize-dynamic"]).run(g)
    with pytest.raises(UserError, match="granularity"):
        QuantizeDynamicOptions(granularity="channel")


def test_qdq_export_refuses_run_time_scales():
    """QDQ ONNX has constant scales only: exporting a dynamic build is one clear error, not a crash."""
    from qcompiler.frontend.qdq_export import export_qdq
    g, _ = run(BEFORE)
    with pytest.raises(UserError, match="quantizes its input at run time"):
        export_qdq(g)
