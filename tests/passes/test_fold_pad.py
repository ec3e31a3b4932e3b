"""fold-pad: a constant spatial Pad folds into the padding of the Conv/FusedConv (value 0), MaxPool
(value -inf) and AveragePool (value 0, count_include_pad) consuming it; every decline reason keeps
the IR as it is; ONNX models (TF 'SAME' stride-2 conv, depthwise, pools) give ONNX Runtime's
outputs after the pass, and the compiled module has fewer kernels."""
import numpy as np
import onnx
import pytest
from ir_check import assert_close, assert_ir, ort_outputs, run_ir, unchanged
from onnx import TensorProto, helper, numpy_helper

from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.passes import PassContext, parse_pipeline
from qcompiler.passes.fold_pad import FoldPadOptions

CONV = "{{dilations = [1, 1], group = {g}, pads = {p}, strides = [{s}, {s}]}}"
FUSED = ("{{activation = \"Relu\", activation_params = [], dilations = [1, 1], group = {g}, pads = {p}, "
         "strides = [{s}, {s}]}}")
MAXPOOL = "{{ceil_mode = 0, dilations = [1, 1], kernel_shape = [3, 3], pads = {p}, strides = [2, 2]}}"
AVGPOOL = "{{ceil_mode = 0, count_include_pad = {c}, kernel_shape = [3, 3], pads = {p}, strides = [2, 2]}}"


def pad(x, pads, value="0.0", mode="constant"):
    return f"Pad({x}) {{mode = \"{mode}\", pads = {pads}, value = {value}}}"


def g1(body: str, consts: str = "", ret: str = "%y", x: str = "tensor<1x3x8x8xf32>") -> str:
    return f"graph @g(%x: {x}) {{\n{consts}{body}\n  return {ret}\n}}\n"


W = "  %w = const dense<0.5> : tensor<4x3x3x3xf32>\n"
WDW = "  %w = const dense<0.5> : tensor<3x1x3x3xf32>\n  %b = const dense<0.25> : tensor<3xf32>\n"
SAME = "[0, 0, 0, 0, 0, 0, 1, 1]"          # TF 'SAME' for a 3x3 stride-2 conv on an even input


# ---- folds: IR in -> IR out -----------------------------------------------------------------------
def test_conv_stride2_tf_same():
    g = run_ir(g1(f"  %p = {pad('%x', SAME)} : tensor<1x3x9x9xf32>\n"
                  f"  %y = Conv(%p, %w) {CONV.format(g=1, p='[0, 0, 0, 0]', s=2)} : tensor<1x4x4x4xf32>", W),
               "fold-pad")
    assert_ir(g, g1(f"  %y = Conv(%x, %w) {CONV.format(g=1, p='[0, 0, 1, 1]', s=2)} : tensor<1x4x4x4xf32>", W))


def test_conv_with_own_pads_adds_them():
    g = run_ir(g1(f"  %p = {pad('%x', '[0, 0, 2, 0, 0, 0, 1, 3]')} : tensor<1x3x11x11xf32>\n"
                  f"  %y = Conv(%p, %w) {CONV.format(g=1, p='[1, 1, 1, 1]', s=1)} : tensor<1x4x11x11xf32>", W),
               "fold-pad")
    assert_ir(g, g1(f"  %y = Conv(%x, %w) {CONV.format(g=1, p='[3, 1, 2, 4]', s=1)} : tensor<1x4x11x11xf32>", W))


def test_depthwise_fused_conv():
    g = run_ir(g1(f"  %p = {pad('%x', SAME)} : tensor<1x3x9x9xf32>\n"
                  f"  %y = FusedConv(%p, %w, %b) {FUSED.format(g=3, p='[0, 0, 0, 0]', s=2)} : tensor<1x3x4x4xf32>",
                  WDW), "fold-pad")
    assert_ir(g, g1(f"  %y = FusedConv(%x, %w, %b) {FUSED.format(g=3, p='[0, 0, 1, 1]', s=2)} : tensor<1x3x4x4xf32>",
                    WDW))


@pytest.mark.parametrize("value", ["-inf", "-3.4028234663852886e+38"])
def test_maxpool_with_minus_inf_or_lowest(value):
    g = run_ir(g1(f"  %p = {pad('%x', SAME, value)} : tensor<1x3x9x9xf32>\n"
                  f"  %y = MaxPool(%p) {MAXPOOL.format(p='[0, 0, 0, 0]')} : tensor<1x3x4x4xf32>"), "fold-pad")
    assert_ir(g, g1(f"  %y = MaxPool(%x) {MAXPOOL.format(p='[0, 0, 1, 1]')} : tensor<1x3x4x4xf32>"))


def test_avgpool_count_include_pad():
    g = run_ir(g1(f"  %p = {pad('%x', '[0, 0, 1, 1, 0, 0, 1, 1]')} : tensor<1x3x10x10xf32>\n"
                  f"  %y = AveragePool(%p) {AVGPOOL.format(c=1, p='[1, 0, 0, 1]')} : tensor<1x3x5x5xf32>"),
               "fold-pad")
    assert_ir(g, g1(f"  %y = AveragePool(%x) {AVGPOOL.format(c=1, p='[2, 1, 1, 2]')} : tensor<1x3x5x5xf32>"))


def test_avgpool_without_own_pads_becomes_count_include_pad():
    """count_include_pad = 0 but no pool pads: every window lies in the padded input, divisor 9."""
    g = run_ir(g1(f"  %p = {pad('%x', SAME)} : tensor<1x3x9x9xf32>\n"
                  f"  %y = AveragePool(%p) {AVGPOOL.format(c=0, p='[0, 0, 0, 0]')} : tensor<1x3x4x4xf32>"),
               "fold-pad")
    assert_ir(g, g1(f"  %y = AveragePool(%x) {AVGPOOL.format(c=1, p='[0, 0, 1, 1]')} : tensor<1x3x4x4xf32>"))


def test_every_user_folds_and_pad_goes():
    g = run_ir(g1(f"  %p = {pad('%x', SAME)} : tensor<1x3x9x9xf32>\n"
                  f"  %a = Conv(%p, %w) {CONV.format(g=1, p='[0, 0, 0, 0]', s=2)} : tensor<1x4x4x4xf32>\n"
                  f"  %m = AveragePool(%p) {AVGPOOL.format(c=1, p='[0, 0, 0, 0]')} : tensor<1x3x4x4xf32>",
                  W, ret="%a, %m"), "fold-pad")
    assert_ir(g, g1(f"  %a = Conv(%x, %w) {CONV.format(g=1, p='[0, 0, 1, 1]', s=2)} : tensor<1x4x4x4xf32>\n"
                    f"  %m = AveragePool(%x) {AVGPOOL.format(c=1, p='[0, 0, 1, 1]')} : tensor<1x3x4x4xf32>",
                    W, ret="%a, %m"))


def test_chained_pads_fold_one_after_the_other():
    g = run_ir(g1(f"  %p = {pad('%x', '[0, 0, 1, 0, 0, 0, 0, 0]')} : tensor<1x3x9x8xf32>\n"
                  f"  %q = {pad('%p', '[0, 0, 0, 0, 0, 0, 0, 1]')} : tensor<1x3x9x9xf32>\n"
                  f"  %y = Conv(%q, %w) {CONV.format(g=1, p='[0, 0, 0, 0]', s=2)} : tensor<1x4x4x4xf32>", W),
               "fold-pad")
    assert_ir(g, g1(f"  %y = Conv(%x, %w) {CONV.format(g=1, p='[1, 0, 0, 1]', s=2)} : tensor<1x4x4x4xf32>", W))


PARTIAL = g1(f"  %p = {pad('%x', SAME)} : tensor<1x3x9x9xf32>\n"
             f"  %a = Conv(%p, %w) {CONV.format(g=1, p='[0, 0, 0, 0]', s=2)} : tensor<1x4x4x4xf32>\n"
             f"  %r = Relu(%p) : tensor<1x3x9x9xf32>", W, ret="%a, %r")


def test_partial_option_folds_what_it_can_and_keeps_the_pad():
    g = run_ir(PARTIAL, "fold-pad", PassContext(options={"fold-pad": FoldPadOptions(partial=True)}))
    assert_ir(g, g1(f"  %p = {pad('%x', SAME)} : tensor<1x3x9x9xf32>\n"
                    f"  %a = Conv(%x, %w) {CONV.format(g=1, p='[0, 0, 1, 1]', s=2)} : tensor<1x4x4x4xf32>\n"
                    f"  %r = Relu(%p) : tensor<1x3x9x9xf32>", W, ret="%a, %r"))


# ---- declines: the IR stays as it is ----------------------------------------------------------------
def conv_after(p: str, value="0.0", mode="constant", conv_pads="[0, 0, 0, 0]", extra="", padded="9x9",
               out="4x4", s=2) -> str:
    attrs = CONV.format(g=1, p=conv_pads, s=s)
    if extra:
        attrs = attrs[:-1] + ", " + extra + "}"
    return g1(f"  %p = {pad('%x', p, value, mode)} : tensor<1x3x{padded}xf32>\n"
              f"  %y = Conv(%p, %w) {attrs} : tensor<1x4x{out}xf32>", W)


DECLINES = {
    "nonzero_value_into_conv": conv_after(SAME, value="1.0"),
    "reflect": conv_after(SAME, mode="reflect"),
    "edge": conv_after(SAME, mode="edge"),
    "negative_pads": conv_after("[0, 0, 0, 0, 0, 0, -1, 1]", padded="7x9", out="3x4"),
    "channel_pads": g1(f"  %p = {pad('%x', '[0, 1, 0, 0, 0, 0, 1, 1]')} : tensor<1x4x9x9xf32>\n"
                       f"  %y = Conv(%p, %w) {CONV.format(g=1, p='[0, 0, 0, 0]', s=2)} : tensor<1x4x4x4xf32>",
                       "  %w = const dense<0.5> : tensor<4x4x3x3xf32>\n"),
    "auto_pad_on_consumer": conv_after(SAME, extra='auto_pad = "SAME_UPPER"'),
    "other_user": PARTIAL,
    "graph_output": g1(f"  %p = {pad('%x', SAME)} : tensor<1x3x9x9xf32>\n"
                       f"  %y = Conv(%p, %w) {CONV.format(g=1, p='[0, 0, 0, 0]', s=2)} : tensor<1x4x4x4xf32>",
                       W, ret="%y, %p"),
    "pad_is_the_weight": g1(f"  %p = {pad('%w', '[0, 0, 0, 0, 0, 0, 0, 0]')} : tensor<4x3x3x3xf32>\n"
                            f"  %y = Conv(%x, %p) {CONV.format(g=1, p='[0, 0, 0, 0]', s=2)} : tensor<1x4x3x3xf32>",
                            W),
    "zero_into_maxpool": g1(f"  %p = {pad('%x', SAME)} : tensor<1x3x9x9xf32>\n"
                            f"  %y = MaxPool(%p) {MAXPOOL.format(p='[0, 0, 0, 0]')} : tensor<1x3x4x4xf32>"),
    "maxpool_pads_reach_kernel": g1(f"  %p = {pad('%x', '[0, 0, 3, 0, 0, 0, 0, 0]', '-inf')} : tensor<1x3x11x8xf32>\n"
                                    f"  %y = MaxPool(%p) {MAXPOOL.format(p='[0, 0, 0, 0]')} : tensor<1x3x5x3xf32>"),
    "avgpool_exclude_pad_with_own_pads": g1(
        f"  %p = {pad('%x', SAME)} : tensor<1x3x9x9xf32>\n"
        f"  %y = AveragePool(%p) {AVGPOOL.format(c=0, p='[1, 1, 0, 0]')} : tensor<1x3x4x4xf32>"),
    "nonzero_value_into_avgpool": g1(
        f"  %p = {pad('%x', SAME, '2.0')} : tensor<1x3x9x9xf32>\n"
        f"  %y = AveragePool(%p) {AVGPOOL.format(c=1, p='[0, 0, 0, 0]')} : tensor<1x3x4x4xf32>"),
    # ceil_mode: the last window must start inside the input or the left pad; folded, it does not
    "ceil_mode_changes_shape": g1(
        f"  %p = {pad('%x', '[0, 0, 0, 0, 0, 0, 2, 2]', '-inf')} : tensor<1x3x10x10xf32>\n"
        "  %y = MaxPool(%p) {ceil_mode = 1, dilations = [1, 1], kernel_shape = [3, 3], pads = [0, 0, 0, 0], "
        "strides = [4, 4]} : tensor<1x3x3x3xf32>"),
}
REASONS = {"nonzero_value_into_conv": "pad value 1.0", "reflect": "mode 'reflect'", "edge": "mode 'edge'",
           "negative_pads": "negative pads", "channel_pads": "batch or channel axis", "auto_pad_on_consumer": "auto_pad",
           "other_user": "Relu 'relu' cannot absorb", "graph_output": "graph output",
           "pad_is_the_weight": "operand 1", "zero_into_maxpool": "MaxPool pads with -inf",
           "maxpool_pads_reach_kernel": "not below the kernel", "avgpool_exclude_pad_with_own_pads": "count_include_pad = 0",
           "nonzero_value_into_avgpool": "pad value 2.0", "ceil_mode_changes_shape": "output shape (1, 3, 2, 2)"}


@pytest.mark.parametrize("case", sorted(DECLINES))
def test_declines(case):
    """The IR stays as it is, and the log says why."""
    unchanged(DECLINES[case], "fold-pad")
    logs = []
    run_ir(DECLINES[case], "fold-pad", PassContext(log=logs.append))
    assert len(logs) == 1 and REASONS[case] in logs[0], logs


def test_computed_pads_never_reach_the_pass():
    """A Pad's pads are an IR attribute: the importer refuses pads that are not constant."""
    from qcompiler.errors import UserError
    m = _model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")], [1, 1, 4, 4], {})
    m.graph.input.append(helper.make_tensor_value_info("pads", TensorProto.INT64, [8]))
    with pytest.raises(UserError, match="not a constant"):
        import_onnx(m)


def test_default_pipeline_runs_fold_pad_before_fold_bn():
    p = parse_pipeline("default")
    assert p.index("cse") < p.index("fold-pad") < p.index("fold-bn") < p.index("fuse-act")


# ---- numerics: ONNX models, ONNX Runtime before and after -------------------------------------------
RNG = np.random.default_rng(0)


def _model(nodes, x_shape, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _pad_node(pads, value=0.0):
    return (helper.make_node("Pad", ["x", "pads", "pv"], ["p"], mode="constant"),
            {"pads": np.array(pads, np.int64), "pv": np.array(value, np.float32)})


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def conv_model(c=3, cout=8, group=1, pads=(0, 0, 0, 0, 0, 0, 1, 1), conv_pads=(0, 0, 0, 0), hw=10):
    pn, inits = _pad_node(list(pads))
    conv = helper.make_node("Conv", ["p", "w", "b"], ["y"], strides=[2, 2], pads=list(conv_pads), group=group,
                            kernel_shape=[3, 3])
    return _model([pn, conv], [1, c, hw, hw], {**inits, "w": _w(cout, c // group, 3, 3), "b": _w(cout)})


def pool_model(kind, value, **attrs):
    pn, inits = _pad_node([0, 0, 0, 0, 0, 0, 1, 1], value)
    pool = helper.make_node(kind, ["p"], ["y"], kernel_shape=[3, 3], strides=[2, 2], **attrs)
    return _model([pn, pool], [1, 4, 10, 10], inits)


MODELS = {
    "conv_s2_tf_same": lambda: conv_model(),
    "conv_s2_asymmetric_plus_own_pads": lambda: conv_model(pads=(0, 0, 2, 0, 0, 0, 1, 3), conv_pads=(1, 0, 0, 1)),
    "depthwise_s2": lambda: conv_model(c=8, cout=8, group=8, hw=11),
    "maxpool_minus_inf": lambda: pool_model("MaxPool", -np.inf),
    "avgpool_count_include_pad": lambda: pool_model("AveragePool", 0.0, count_include_pad=1, pads=[1, 1, 0, 0]),
    "avgpool_no_own_pads": lambda: pool_model("AveragePool", 0.0),
}


def _ort(model, feeds):
    import onnxruntime as ort
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_runtime_equivalence(name):
    model = MODELS[name]()
    g = import_onnx(model)
    assert "Pad" in g.op_histogram()
    after = run_ir(g.clone(), "fold-pad")
    assert "Pad" not in after.op_histogram() and len(after) == len(g) - 1
    x = RNG.standard_normal(g.inputs[0].shape).astype(np.float32)
    if "maxpool" in name:
        x -= 5.0                      # all negative: padding with 0 instead of -inf would show
    ref = _ort(model, {"x": x})
    assert_close(ref, ort_outputs(after, {"x": x}))


# ---- compiled for x86 fp32: the same numbers, one kernel fewer ---------------------------------------
def _prim_funcs(graph):
    import tvm

    from qcompiler.codegen.lower import lower
    from qcompiler.codegen.target import TargetSpec
    mod = lower(graph, TargetSpec("x86"))
    return [gv for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


def test_kernel_count_drops():
    g = import_onnx(conv_model())
    after = run_ir(g.clone(), "fold-pad")
    assert len(_prim_funcs(g)) == 2 and len(_prim_funcs(after)) == 1


def test_compiled_x86_fp32_matches_onnx_runtime():
    import tvm
    from tvm import relax

    from qcompiler.codegen.lower import build_module
    from qcompiler.codegen.target import TargetSpec
    pn, inits = _pad_node([0, 0, 0, 0, 0, 0, 1, 1])
    conv = helper.make_node("Conv", ["p", "w", "b"], ["c"], strides=[2, 2], kernel_shape=[3, 3])
    relu = helper.make_node("Relu", ["c"], ["r"])
    pn2 = helper.make_node("Pad", ["r", "pads", "ninf"], ["q"], mode="constant")
    pool = helper.make_node("MaxPool", ["q"], ["y"], kernel_shape=[3, 3], strides=[2, 2])
    model = _model([pn, conv, relu, pn2, pool], [1, 3, 16, 16],
                   {**inits, "w": _w(8, 3, 3, 3), "b": _w(8), "ninf": np.array(-np.inf, np.float32)})
    g = import_onnx(model)
    after = run_ir(g, "default")
    assert "Pad" not in after.op_histogram()
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    vm = relax.VirtualMachine(build_module(after, TargetSpec("x86")), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    got = [o.numpy() for o in (out if not isinstance(out, tvm.runtime.Tensor) else [out])]
    assert_close(_ort(model, {"x": x}), got)


# ---- the quantized path: fold-pad runs before quantize, the quantized graph still builds ----------
def _stem_model():
    """Pad -> Conv s2 -> Relu -> Pad(-inf) -> MaxPool -> Pad(0) -> AveragePool(count_include_pad) ->
    1x1 Conv (an integer reader of the pool, which would stay float without one). Without fold-pad the
    Pad of the input is quantized on its own: its range is given as the input's."""
    pn, inits = _pad_node([0, 0, 0, 0, 0, 0, 1, 1])
    nodes = [pn, helper.make_node("Conv", ["p", "w", "b"], ["c"], strides=[2, 2], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Pad", ["r", "pads", "ninf"], ["q"], mode="constant"),
             helper.make_node("MaxPool", ["q"], ["m"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("Pad", ["m", "pads", "pv"], ["s"], mode="constant"),
             helper.make_node("AveragePool", ["s"], ["a"], kernel_shape=[2, 2], count_include_pad=1),
             helper.make_node("Conv", ["a", "w2"], ["y"], kernel_shape=[1, 1])]
    return _model(nodes, [1, 3, 16, 16], {**inits, "w": _w(8, 3, 3, 3), "b": _w(8), "w2": _w(4, 8, 1, 1),
                                          "ninf": np.array(-np.inf, np.float32)})


def test_quantized_after_fold_matches_quantized_without_it_and_builds():
    import warnings

    import tvm
    from tvm import relax

    from qcompiler.codegen.lower import build_module
    from qcompiler.codegen.target import TargetSpec
    from qcompiler.passes import PassManager
    from qcompiler.passes.quantize import QuantizeOptions
    from qcompiler.quant import reference
    model = _stem_model()
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    ranges = {"x": (-3.0, 3.0), "p": (-3.0, 3.0), "c": (-4.0, 4.0), "r": (0.0, 4.0), "m": (0.0, 4.0), "a": (0.0, 4.0)}
    out = {}
    for name, pipeline in (("fold", "default,quantize"),
                           ("nofold", ",".join(p for p in parse_pipeline("default") if p != "fold-pad") + ",quantize")):
        g = import_onnx(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            PassManager(pipeline, ctx=PassContext(options={"quantize": QuantizeOptions(ranges=ranges)})).run(g)
        out[name] = (g, reference.run(g, {"x": x}))
    g, ref = out["fold"]
    assert "Pad" not in g.op_histogram() and "Pad" in out["nofold"][0].op_histogram()
    for a, b in zip(ref, out["nofold"][1]):
        np.testing.assert_array_equal(a, b)          # the zero point pads exactly like a Pad of 0 did
    vm = relax.VirtualMachine(build_module(g, TargetSpec("x86")), tvm.cpu())
    res = vm["main"](tvm.runtime.tensor(x))
    got = [o.numpy() for o in (res if not isinstance(res, tvm.runtime.Tensor) else [res])]
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a, b)
