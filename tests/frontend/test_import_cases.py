"""Tricky importer cases, each a small model built with onnx.helper and checked numerically:
onnxruntime on the original == onnxruntime on export_onnx(import_onnx(original)); plus the
normalized IR attributes the importer must write."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import realmodels as rm
from qcompiler.errors import UserError
from qcompiler.frontend import export_onnx, import_onnx

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def arr(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def model(nodes, inputs: dict, outputs: list[str], inits: dict | None = None, opset: int = 13,
          dims: dict | None = None) -> onnx.ModelProto:
    """inputs: name -> example array (its shape is declared unless ``dims`` overrides it)."""
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype),
                                         (dims or {}).get(k, list(v.shape))) for k, v in inputs.items()]
    g = helper.make_graph(nodes, "case", ins, [onnx.ValueInfoProto(name=o) for o in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset <= 17 else 10
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    for o in m.graph.output:                      # declare the outputs' types as an exporter would
        o.CopyFrom(inferred.get(o.name, helper.make_tensor_value_info(o.name, F, None)))
        if not o.type.tensor_type.HasField("shape"):
            o.type.tensor_type.shape.SetInParent()
    return m


def check(m: onnx.ModelProto, feeds: dict, input_shapes=None, rtol=1e-5, checker=True):
    """Import, verify, export; ORT(original) == ORT(export). Returns the IR graph."""
    if checker:
        onnx.checker.check_model(m)
    g = import_onnx(m, input_shapes)
    g.verify()
    out = export_onnx(g)
    onnx.checker.check_model(out)
    ref, got = rm.ort_run(m, feeds), rm.ort_run(out, feeds)
    assert len(ref) == len(got)
    for r, o in zip(ref, got):
        assert r.shape == o.shape
        np.testing.assert_allclose(o, r, rtol=rtol, atol=rtol * max(1.0, float(np.abs(r).max())))
    return g


def only(g, kind):
    ops = g.find_ops(kind)
    assert len(ops) == 1, g.op_histogram()
    return ops[0]


# ---- convolution ------------------------------------------------------------------------------
@pytest.mark.parametrize("auto_pad, stride, expect", [
    ("SAME_UPPER", 2, [0, 1, 1, 1]), ("SAME_LOWER", 2, [1, 1, 0, 1]), ("VALID", 1, [0, 0, 0, 0])])
def test_conv_auto_pad(auto_pad, stride, expect):
    x = arr(1, 2, 8, 9)                         # H: odd total padding (1), W: even (2)
    n = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="c", auto_pad=auto_pad, strides=[stride, stride])
    g = check(model([n], {"x": x}, ["y"], {"w": arr(4, 2, 3, 3), "b": arr(4)}), {"x": x})
    assert only(g, "Conv").attrs == {"strides": [stride] * 2, "dilations": [1, 1], "pads": expect, "group": 1}


def test_depthwise_dilated_conv():
    x = arr(1, 6, 11, 11)
    n = helper.make_node("Conv", ["x", "w"], ["y"], group=6, dilations=[2, 2], pads=[2, 1, 2, 3])
    g = check(model([n], {"x": x}, ["y"], {"w": arr(6, 1, 3, 3)}), {"x": x})
    assert only(g, "Conv").attrs["group"] == 6


@pytest.mark.parametrize("attrs", [
    {"strides": [2, 2], "output_shape": [10, 9]},                 # odd total padding on one axis
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 2], "pads": [1, 0, 1, 0], "output_padding": [1, 1], "group": 2},
    {"strides": [3, 2], "output_shape": [14, 10], "dilations": [1, 2]},
])
def test_conv_transpose(attrs):
    x = arr(1, 4, 5, 5)
    w = arr(4, 2 if attrs.get("group", 1) == 2 else 4, 3, 3)
    n = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    check(model([n], {"x": x}, ["y"], {"w": w}), {"x": x})


@pytest.mark.parametrize("kind, attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("MaxPool", {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
])
def test_pools(kind, attrs):
    x = arr(1, 3, 10, 11)
    check(model([helper.make_node(kind, ["x"], ["y"], **attrs)], {"x": x}, ["y"]), {"x": x})


def test_ceil_mode_window_past_the_input_is_dropped_like_onnxruntime():
    """ONNX shape inference keeps a last ceil-mode window that starts past the input (10 -> 6);
    onnxruntime and the IR drop it (-> 5). The importer follows onnxruntime, also downstream."""
    x = arr(1, 2, 10, 11)
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[1, 1], strides=[2, 2], ceil_mode=1),
             helper.make_node("Conv", ["p", "w"], ["y"])]
    m = model(nodes, {"x": x}, ["y"], {"w": arr(3, 2, 1, 1)})
    # (its declared output shape comes from ONNX's inference: 1x3x6x6; the importer ignores it)
    g = check(m, {"x": x})
    assert g.outputs[0].shape == (1, 3, 5, 6)


# ---- softmax before and after opset 13 --------------------------------------------------------
@pytest.mark.parametrize("opset, axis, kind, reshapes", [
    (11, 1, "Softmax", 2), (11, 3, "Softmax", 0), (11, -2, "LogSoftmax", 2), (13, 1, "Softmax", 0)])
def test_softmax_semantics(opset, axis, kind, reshapes):
    x = arr(2, 3, 4, 5)
    g = check(model([helper.make_node(kind, ["x"], ["y"], axis=axis, name="sm")], {"x": x}, ["y"], opset=opset),
              {"x": x})
    assert len(g.find_ops("Reshape")) == reshapes
    assert only(g, kind).name == "sm" and g.outputs[0].name == "y"


# ---- reshape, clip, pad, resize ---------------------------------------------------------------
@pytest.mark.parametrize("shape, allowzero, expect", [
    ([0, -1, 4], 0, [2, 15, 4]), ([-1], 0, [120]), ([2, 0, 0, 5], 0, [2, 3, 4, 5]), ([6, 20], 1, [6, 20])])
def test_reshape_zero_and_minus_one(shape, allowzero, expect):
    x = arr(2, 3, 4, 5)
    n = helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=allowzero)
    g = check(model([n], {"x": x}, ["y"], {"s": np.array(shape, np.int64)}, opset=14), {"x": x})
    assert only(g, "Reshape").attrs["shape"] == expect


def test_clip_opset6_is_rejected_and_its_upgrade_imports():
    x = arr(1, 8)
    m6 = model([helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)], {"x": x}, ["y"], opset=6)
    with pytest.raises(UserError, match="opset 6 is older.*re-export"):
        import_onnx(m6)
    from onnx import version_converter
    g = check(version_converter.convert_version(m6, 11), {"x": x})
    assert only(g, "Clip").attrs == {"min": -0.5, "max": 0.5}


@pytest.mark.parametrize("inputs, expect", [
    (["x", "lo", "hi"], (-0.5, 0.5)), (["x", "", "hi"], (-np.inf, 0.5)), (["x", "lo"], (-0.5, np.inf))])
def test_clip_opset11_inputs(inputs, expect):
    x = arr(2, 8)
    inits = {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}
    g = check(model([helper.make_node("Clip", inputs, ["y"])], {"x": x}, ["y"], inits, opset=11), {"x": x})
    assert (only(g, "Clip").attrs["min"], only(g, "Clip").attrs["max"]) == expect


@pytest.mark.parametrize("mode, pads, opset, axes", [
    ("constant", [1, 0, 2, 1, 0, 3], 11, None), ("reflect", [0, 0, 1, 2, 0, 0, 2, 1], 13, None),
    ("edge", [0, 0, 1, 1, 0, 0, 1, 1], 13, None), ("constant", [0, 0, -1, 1, 0, 0, 2, -2], 13, None),
    ("constant", [2, 1, 0, 3], 18, [1, 3])])
def test_pad_forms(mode, pads, opset, axes):
    x = arr(2, 3, 5, 6) if len(pads) != 6 else arr(2, 3, 5)
    inits = {"p": np.array(pads, np.int64), "v": np.array(0.75, np.float32)}
    ins = ["x", "p", "v" if mode == "constant" else ""]
    if axes is not None:
        inits["a"] = np.array(axes, np.int64)
        ins.append("a")
    g = check(model([helper.make_node("Pad", ins, ["y"], mode=mode)], {"x": x}, ["y"], inits, opset=opset), {"x": x})
    assert len(only(g, "Pad").attrs["pads"]) == 2 * x.ndim


@pytest.mark.parametrize("opset, mode, ctm, scales, sizes", [
    (11, "nearest", "asymmetric", [1, 1, 2, 2], None),
    (13, "linear", "half_pixel", [1, 1, 2, 3], None),
    (13, "linear", "align_corners", None, [1, 3, 7, 5]),
    (13, "cubic", "pytorch_half_pixel", [1, 1, 0.5, 1.5], None),
])
def test_resize_resolves_sizes(opset, mode, ctm, scales, sizes):
    x = arr(1, 3, 4, 6)
    inits = {"roi": np.zeros(0, np.float32), "sc": np.array(scales or [], np.float32)}
    ins = ["x", "roi", "sc"]
    if sizes:
        inits["sz"] = np.array(sizes, np.int64)
        ins.append("sz")
    n = helper.make_node("Resize", ins, ["y"], mode=mode, coordinate_transformation_mode=ctm,
                         **({"nearest_mode": "floor"} if mode == "nearest" else {}))
    g = check(model([n], {"x": x}, ["y"], inits, opset=opset), {"x": x})
    want = sizes or [int(d * s) for d, s in zip(x.shape, scales)]
    assert only(g, "Resize").attrs["sizes"] == want


def test_resize_opset18_axes():
    x = arr(1, 2, 4, 4)
    n = helper.make_node("Resize", ["x", "", "sc"], ["y"], axes=[2, 3], mode="nearest")
    g = check(model([n], {"x": x}, ["y"], {"sc": np.array([2.0, 0.5], np.float32)}, opset=18), {"x": x})
    assert only(g, "Resize").attrs["sizes"] == [1, 2, 8, 2]


def test_resize_fractional_scale_is_a_user_error():
    x = arr(1, 1, 5, 5)
    n = helper.make_node("Resize", ["x", "", "sc"], ["y"], name="up")
    m = model([n], {"x": x}, ["y"], {"sc": np.array([1, 1, 1.5, 1.5], np.float32)})
    with pytest.raises(UserError, match=r"Resize 'up'.*fractional"):
        import_onnx(m)


# ---- shape sub-graphs fold away ---------------------------------------------------------------
def test_shape_subgraph_folds_to_constants():
    """x -> Shape -> Gather/Slice -> Concat -> Reshape, ConstantOfShape, Range/Equal/Where, Cast:
    all folded; a float Exp on constants goes to the onnxruntime batch."""
    x = arr(2, 3, 4, 5)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Slice", ["s", "st", "en"], ["hw"]),
        helper.make_node("ReduceProd", ["hw"], ["hw1"], keepdims=1),
        helper.make_node("Concat", ["n1", "minus1", "hw1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("ConstantOfShape", ["hw"], ["ones"], value=helper.make_tensor("v", F, [1], [1.0])),
        helper.make_node("Exp", ["ones"], ["e"]),                               # not in numpy: ORT batch
        helper.make_node("Range", ["z", "five", "one"], ["rng"]),
        helper.make_node("Equal", ["rng", "two"], ["eq"]),
        helper.make_node("Where", ["eq", "fa", "fb"], ["sel"]),
        helper.make_node("Cast", ["sel"], ["self"], to=F),
        helper.make_node("Unsqueeze", ["self", "ax0"], ["sel2"]),
        helper.make_node("Mul", ["r", "c"], ["r2"]),
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", F, [], [0.5])),
        helper.make_node("Reshape", ["e", "flat"], ["e2"]),
        helper.make_node("Add", ["r2", "e2"], ["y0"]),
        helper.make_node("Mul", ["y0", "sel3"], ["y"]),
        helper.make_node("Reshape", ["sel2", "flat"], ["sel3"]),
    ]
    inits = {"i0": np.array(0, np.int64), "ax0": np.array([0], np.int64), "st": np.array([2], np.int64),
             "en": np.array([4], np.int64), "minus1": np.array([-1], np.int64), "z": np.array(0, np.int64),
             "five": np.array(20, np.int64), "one": np.array(1, np.int64), "two": np.array(2, np.int64),
             "fa": np.array(3, np.int64), "fb": np.array(1, np.int64), "flat": np.array([1, 1, 20], np.int64)}
    m = model(nodes, {"x": x}, ["y"], inits)
    order = [1, 2, 0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 14, 16, 17, 19, 18]   # not in file order
    del m.graph.node[:]
    m.graph.node.extend(nodes[i] for i in order)
    g = check(m, {"x": x}, checker=False)       # (the checker insists on file order)
    assert g.op_histogram() == {"Mul": 2, "Add": 1, "Reshape": 1}
    assert only(g, "Reshape").attrs["shape"] == [2, 3, 20]


def test_dynamic_batch_defaults_to_one_with_a_warning():
    x = arr(1, 3, 8, 8)
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": x}, ["y"], dims={"x": ["N", 3, 8, 8]})
    with pytest.warns(UserWarning, match="dynamic batch.*using 1"):
        g = check(m, {"x": x})
    assert g.inputs[0].shape == (1, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = check(m, {"x": arr(4, 3, 8, 8)}, input_shapes={"x": (4, 3, 8, 8)})
    assert g.inputs[0].shape == (4, 3, 8, 8)


def test_dynamic_spatial_dims_from_input_shapes():
    x = arr(1, 3, 16, 24)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["c"], ["s"]),
             helper.make_node("Slice", ["s", "st", "en"], ["hw"]),
             helper.make_node("Concat", ["nc", "hw"], ["shape"], axis=0),
             helper.make_node("Reshape", ["c", "shape"], ["y"])]
    inits = {"w": arr(4, 3, 3, 3), "st": np.array([2], np.int64), "en": np.array([4], np.int64),
             "nc": np.array([1, 4], np.int64)}
    m = model(nodes, {"x": x}, ["y"], inits, dims={"x": ["N", 3, "H", "W"]})
    g = check(m, {"x": x}, input_shapes={"x": (1, 3, 16, 24)})
    assert g.outputs[0].shape == (1, 4, 16, 24)


# ---- the rest of the operator table -----------------------------------------------------------
def _unary(kind, **attrs):
    return [helper.make_node(kind, ["x"], ["y"], **attrs)], {}


CASES = {
    "relu": _unary("Relu"), "sigmoid": _unary("Sigmoid"), "tanh": _unary("Tanh"), "erf": _unary("Erf"),
    "exp": _unary("Exp"), "hardswish@14": _unary("HardSwish"),
    "hardsigmoid": _unary("HardSigmoid", alpha=0.1667, beta=0.5), "leakyrelu": _unary("LeakyRelu", alpha=0.2),
    "sqrt-abs": ([helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Sqrt", ["a"], ["y"])], {}),
    "pow-div-sub": ([helper.make_node("Pow", ["x", "two"], ["p"]), helper.make_node("Div", ["p", "c"], ["d"]),
                     helper.make_node("Sub", ["d", "x"], ["y"])],
                    {"two": np.array(2.0, np.float32), "c": arr(5)}),
    "sum3": ([helper.make_node("Sum", ["x", "x", "c"], ["y"])], {"c": arr(1, 5)}),
    "max3-min": ([helper.make_node("Max", ["x", "c", "c2"], ["m"]), helper.make_node("Min", ["m", "c"], ["y"])],
                 {"c": arr(5), "c2": arr(4, 1)}),
    "gemm-transB": ([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5, beta=2.0)],
                    {"w": arr(7, 5), "b": arr(7)}),
    "matmul-3d": ([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])],
                  {"s": np.array([2, 2, 5], np.int64), "w": arr(5, 3)}),
    "flatten-neg": ([helper.make_node("Flatten", ["x"], ["y"], axis=-1)], {}),
    "transpose": ([helper.make_node("Transpose", ["x"], ["y"])], {}),
    "concat-neg": ([helper.make_node("Concat", ["x", "c"], ["y"], axis=-1)], {"c": arr(4, 2)}),
    "split13": ([helper.make_node("Split", ["x", "sp"], ["a", "b2"], axis=1),
                 helper.make_node("Concat", ["b2", "a"], ["y"], axis=1)], {"sp": np.array([2, 3], np.int64)}),
    "squeeze-unsqueeze": ([helper.make_node("Unsqueeze", ["x", "ax"], ["u"]),
                           helper.make_node("Squeeze", ["u", "ax2"], ["y"])],
                          {"ax": np.array([-1, 0], np.int64), "ax2": np.array([0], np.int64)}),
    "slice-neg-steps": ([helper.make_node("Slice", ["x", "st", "en", "axs", "sp"], ["y"])],
                        {"st": np.array([-1, 4], np.int64), "en": np.array([-100, 0], np.int64),
                         "axs": np.array([1, 0], np.int64), "sp": np.array([-2, -1], np.int64)}),
    "gather-neg": ([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)], {"i": np.array([[-1, 0], [2, 2]], np.int64)}),
    "reduce": ([helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1], keepdims=1),
                helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=1),
                helper.make_node("Add", ["m", "s"], ["y"])], {"ax": np.array([1], np.int64)}),
    "reduce-max-all": ([helper.make_node("ReduceMax", ["x"], ["y"], keepdims=0)], {}),
    "expand": ([helper.make_node("Expand", ["x", "s"], ["y"])], {"s": np.array([3, 1, 1], np.int64)}),
    "dropout-mask-unused": ([helper.make_node("Dropout", ["x"], ["y", "mask"])], {}),
    "identity": ([helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Relu", ["i"], ["y"])], {}),
    "cast-roundtrip": ([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                        helper.make_node("Cast", ["h"], ["y"], to=F)], {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_operator(name):
    nodes, inits = CASES[name]
    x = arr(4, 5)
    opset = int(name.split("@")[1]) if "@" in name else 13
    check(model(nodes, {"x": x}, ["y"], inits, opset=opset), {"x": x})


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_opset_forms_of_axes(opset):
    """Squeeze/Unsqueeze/ReduceMean/Split axes: attributes before 13 (18 for ReduceMean), inputs after."""
    x = arr(2, 6, 1, 3)
    ax = {"sq": np.array([2], np.int64), "un": np.array([0], np.int64), "rm": np.array([3], np.int64),
          "sp": np.array([2, 4], np.int64)}
    attr = opset < 13
    nodes = [helper.make_node("Squeeze", ["x"] + ([] if attr else ["sq"]), ["a"], **({"axes": [2]} if attr else {})),
             helper.make_node("Unsqueeze", ["a"] + ([] if attr else ["un"]), ["b"], **({"axes": [0]} if attr else {})),
             helper.make_node("ReduceMean", ["b"] + (["rm"] if opset >= 18 else []), ["c"],
                              **({} if opset >= 18 else {"axes": [3]})),
             helper.make_node("Split", ["c"] + ([] if attr else ["sp"]), ["d", "e"], axis=2,
                              **({"split": [2, 4]} if attr else {})),
             helper.make_node("Concat", ["e", "d"], ["y"], axis=2)]
    g = check(model(nodes, {"x": x}, ["y"], {} if attr else ax, opset=opset), {"x": x})
    assert only(g, "Squeeze").attrs["axes"] == [2] and only(g, "Split").attrs["split"] == [2, 4]


def test_split_opset18_num_outputs_uneven():
    x = arr(2, 7)
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3),
             helper.make_node("Concat", ["c", "b", "a"], ["y"], axis=1)]
    g = check(model(nodes, {"x": x}, ["y"], opset=18), {"x": x})
    assert only(g, "Split").attrs["split"] == [3, 3, 1]


def test_batchnorm_layernorm_and_names_survive():
    x = arr(2, 4, 3, 3)
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"], name="bn1", epsilon=1e-3),
             helper.make_node("LayerNormalization", ["bn", "ls", "lb"], ["y"], name="", axis=-1, epsilon=1e-4)]
    inits = {"s": arr(4), "b": arr(4), "m": arr(4), "v": np.abs(arr(4)) + 0.5, "ls": arr(3), "lb": arr(3)}
    g = check(model(nodes, {"x": x}, ["y"], inits, opset=17), {"x": x})
    assert [op.name for op in g.ops] == ["bn1", "y"]          # an unnamed node takes its output's name
    assert only(g, "LayerNormalization").attrs == {"axis": 3, "epsilon": float(np.float32(1e-4))}
    assert {"s", "b", "m", "v", "ls", "lb"} == set(g.consts)


def test_dead_nodes_are_dropped_and_odd_outputs_survive():
    """An unsupported node nothing depends on is dropped; outputs may be an input or a constant."""
    x = arr(1, 3)
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("TopK", ["x", "k"], ["v", "i"], name="dead")]
    m = model(nodes, {"x": x}, ["y", "s", "x"], {"k": np.array([1], np.int64)})
    g = check(m, {"x": x})
    assert g.op_histogram() == {"Relu": 1}
    assert [v.name for v in g.outputs] == ["y", "s", "x"] and g.outputs[1].is_const and g.outputs[2].is_input


BIG = 2 ** 63 - 1
_bound = st.one_of(st.integers(-12, 12), st.sampled_from([BIG, -BIG]))


def _onnx_slice_indices(start, end, step, dim):
    """Straight from the ONNX spec: clamp, then walk from start by step while short of end."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    start = min(max(start, 0), dim) if step > 0 else min(max(start, 0), dim - 1)
    end = min(max(end, 0), dim) if step > 0 else min(max(end, -1), dim - 1)
    return list(range(start, end, step))


@settings(max_examples=40, deadline=None)
@given(dim=st.integers(1, 8), start=_bound, end=_bound, step=st.sampled_from([-3, -2, -1, 1, 2, 3]))
def test_slice_normalization_matches_onnxruntime(dim, start, end, step):
    x = np.arange(2 * dim, dtype=np.float32).reshape(2, dim)
    inits = {"s": np.array([start], np.int64), "e": np.array([end], np.int64), "a": np.array([-1], np.int64),
             "p": np.array([step], np.int64)}
    m = model([helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"])], {"x": x}, ["y"], inits)
    want = x[:, _onnx_slice_indices(start, end, step, dim)]
    if want.size == 0:
        with pytest.raises(UserError, match="empty tensor"):
            import_onnx(m)
        return
    g = check(m, {"x": x})
    np.testing.assert_array_equal(rm.ort_run(export_onnx(g), {"x": x})[0], want)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(3, 12), k=st.integers(1, 4), s=st.integers(1, 3), d=st.integers(1, 2),
       auto=st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]), ceil=st.integers(0, 1),
       kind=st.sampled_from(["Conv", "MaxPool", "AveragePool"]))
def test_window_arithmetic_matches_onnxruntime(size, k, s, d, auto, ceil, kind):
    if (k - 1) * d + 1 > size or (kind == "AveragePool" and d > 1) or (d > 1 and auto.startswith("SAME")):
        return                                      # (onnxruntime rejects dilated SAME padding)
    x = arr(1, 2, size, size + 1)
    attrs = {"strides": [s, s], "auto_pad": auto}
    if auto == "NOTSET":
        attrs["pads"] = [min(k - 1, 1), 0, 0, min(k - 1, 1)]
    if kind == "Conv":
        n = helper.make_node("Conv", ["x", "w"], ["y"], dilations=[d, d], **attrs)
        inits = {"w": arr(3, 2, k, k)}
    else:
        if auto != "NOTSET" and ceil:
            return                                   # (ceil_mode with auto_pad: not meaningful)
        n = helper.make_node(kind, ["x"], ["y"], kernel_shape=[k, k], ceil_mode=ceil, **attrs,
                             **({"dilations": [d, d]} if kind == "MaxPool" else {}))
        inits = {}
    m = model([n], {"x": x}, ["y"], inits, opset=13)
    try:
        rm.ort_run(m, {"x": x})
    except Exception:                               # e.g. onnxruntime's SAME pads for k < s go negative
        assume(False)
    check(m, {"x": x})
