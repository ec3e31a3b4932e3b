"""zoo/inline.py: the graph qcompiler compiles (static shapes, bound inputs, constant Ifs inlined), as
the ONNX file ORT's quantize_static gets (zoo.ort_quantize_static)."""
import numpy as np
import onnx
from onnx import TensorProto, helper

from zoo_checks import zoo  # noqa: F401 - zoo_checks puts the repository on sys.path

from zoo.inline import fixed_graph  # noqa: E402


def _ifs(g: onnx.GraphProto) -> int:
    return sum((n.op_type == "If") + sum(_ifs(a.g) for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)
               for n in g.node)


def _model() -> onnx.ModelProto:
    """y, z = If(sr == 16000, then={If(x.shape[0] == 2, Relu(a), Neg(a)); a}, else={Neg(a); Neg(a)}),
    a = Abs(x); the then-branch defines 'tmp', a name the outer graph defines too."""
    def const(name, v):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [], [v]))

    inner_then = helper.make_graph([helper.make_node("Relu", ["a"], ["r"])], "inner_then", [],
                                   [helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", 4])])
    inner_else = helper.make_graph([helper.make_node("Neg", ["a"], ["s"])], "inner_else", [],
                                   [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["n", 4])])
    then = helper.make_graph([
        helper.make_node("Shape", ["a"], ["shape"]), const("zero", 0), const("two", 2),
        helper.make_node("Gather", ["shape", "zero"], ["rows"]),
        helper.make_node("Equal", ["rows", "two"], ["c2"]),
        helper.make_node("If", ["c2"], ["tmp"], name="inner", then_branch=inner_then, else_branch=inner_else)],
        "then", [], [helper.make_tensor_value_info("tmp", TensorProto.FLOAT, ["n", 4]),
                     helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4])])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["n1"]), helper.make_node("Neg", ["a"], ["n2"])],
                              "else", [], [helper.make_tensor_value_info("n1", TensorProto.FLOAT, ["n", 4]),
                                           helper.make_tensor_value_info("n2", TensorProto.FLOAT, ["n", 4])])
    g = helper.make_graph([
        helper.make_node("Abs", ["x"], ["a"]),
        helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.INT64, [], [16000])),
        helper.make_node("Equal", ["sr", "k"], ["c"]),
        helper.make_node("If", ["c"], ["y0", "z"], name="outer", then_branch=then, else_branch=other),
        helper.make_node("Sigmoid", ["y0"], ["tmp"]),
        helper.make_node("Add", ["tmp", "x"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
              helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_constant_ifs_are_inlined_and_the_outputs_kept():
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator
    m = _model()
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)

    def run(model, sr):     # ORT refuses the model itself: a branch returns an outer-scope value
        feeds = {"x": x, "sr": np.array(sr, np.int64)}
        if model is m:
            return ReferenceEvaluator(model).run(None, feeds)
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for sr in (16000, 8000):
        f = fixed_graph(m, {"x": (2, 4)}, {"sr": np.array(sr, np.int64)})
        onnx.checker.check_model(f, full_check=True)
        assert _ifs(m.graph) == 2 and _ifs(f.graph) == 0
        assert [v.name for v in f.graph.input] == ["x", "sr"]        # the same feeds as the model
        assert [d.dim_value for d in f.graph.input[0].type.tensor_type.shape.dim] == [2, 4]
        assert not any(n.op_type == "Equal" for n in f.graph.node)   # the condition's nodes are gone
        for want, got in zip(run(m, sr), run(f, 12345)):             # sr is bound: its feed is not read
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_an_if_on_a_run_time_input_is_left_as_it_is():
    m = _model()
    f = fixed_graph(m)
    assert f.graph == m.graph
