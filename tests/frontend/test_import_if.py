"""ONNX If with a condition known at import is inlined (qcompiler/frontend/onnx_control.py), and
inputs bound with ``input_values`` / ``--input-value`` fold away: tiny onnx.helper models checked
against onnxruntime through export_onnx(import_onnx(...)); a run-time condition is one UserError
line naming the node, the input it comes from and the fix."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import realmodels as rm
from qcompiler.errors import UserError
from qcompiler.frontend import export_onnx, import_onnx
from qcompiler.frontend.onnx_control import parse_input_value

F = TensorProto.FLOAT
X = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)


def branch(name, nodes, outs):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, F, None) for o in outs])


def if_model(cond_nodes, then_nodes, then_outs, else_nodes, else_outs, extra_inputs=(), opset=16, outs=("y",),
             tail=()):
    """y = If(c) over input x [2, 3]; ``cond_nodes`` compute 'c'; ``tail`` nodes may follow."""
    node = helper.make_node("If", ["c"], list(outs), name="the_if",
                            then_branch=branch("then", then_nodes, then_outs),
                            else_branch=branch("else", else_nodes, else_outs))
    final = [tail[-1].output[0]] if tail else list(outs)
    ins = [helper.make_tensor_value_info("x", F, [2, 3])] + list(extra_inputs)
    g = helper.make_graph(list(cond_nodes) + [node] + list(tail), "if", ins,
                          [helper.make_tensor_value_info(o, F, None) for o in final])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def check(m, feeds, **kw):
    g = import_onnx(m, **kw)
    assert not any(op.kind == "If" for op in g.ops)
    ref = rm.ort_run(m, feeds)
    got = rm.ort_run(export_onnx(g), {v.name: feeds[v.name] for v in g.inputs})
    for y, r in zip(got, ref):
        np.testing.assert_allclose(y, r, rtol=1e-6, atol=1e-6)
    return g


@pytest.mark.parametrize("flag", [True, False])
def test_constant_condition_takes_its_branch(flag):
    m = if_model([const("c", np.array(flag))],
                 [helper.make_node("Relu", ["x"], ["t"])], ["t"],
                 [helper.make_node("Neg", ["x"], ["e"])], ["e"])
    g = check(m, {"x": X})
    assert [op.kind for op in g.ops] == (["Relu"] if flag else ["Neg"])
    assert [v.name for v in g.outputs] == ["y"]          # the If's output name, not the branch's


def test_condition_from_shapes_folds():
    """Equal(Gather(Shape(relu(x)), 0), 2): the shape is static, the condition folds (silero_vad's pattern)."""
    cond = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]), const("i0", np.int64(0)),
            helper.make_node("Gather", ["s", "i0"], ["d"]), const("two", np.int64(2)),
            helper.make_node("Equal", ["d", "two"], ["c"])]
    m = if_model(cond, [const("ax", np.array([0], np.int64)), helper.make_node("Unsqueeze", ["r", "ax"], ["t"])], ["t"],
                 [helper.make_node("Identity", ["r"], ["e"])], ["e"])
    g = check(m, {"x": X})
    assert g.outputs[0].shape == (1, 2, 3)


def test_nested_ifs_and_colliding_names():
    """An inner If reads a tensor of the outer branch; both branches reuse a name of the main graph ('r')."""
    inner = helper.make_node("If", ["c"], ["inner_y"], name="inner",
                             then_branch=branch("it", [helper.make_node("Mul", ["r", "r"], ["q"])], ["q"]),
                             else_branch=branch("ie", [helper.make_node("Add", ["r", "r"], ["q2"])], ["q2"]))
    then_nodes = [helper.make_node("Sigmoid", ["x"], ["r"]), inner]
    m = if_model([const("c", np.array(True))], then_nodes, ["inner_y"],
                 [helper.make_node("Tanh", ["x"], ["r"])], ["r"],
                 tail=[helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["y", "r"], ["z"])])
    # the branch's 'r' and the main graph's 'r' are different tensors: ORT needs unique names, so
    # the reference renames the main graph's one
    ref = onnx.ModelProto()
    ref.CopyFrom(m)
    ref.graph.node[-2].output[0] = "r_main"
    ref.graph.node[-1].input[1] = "r_main"
    g = import_onnx(m)
    got = rm.ort_run(export_onnx(g), {"x": X})
    np.testing.assert_allclose(got[0], rm.ort_run(ref, {"x": X})[0], rtol=1e-6)
    np.testing.assert_allclose(got[0], (1 / (1 + np.exp(-X))) ** 2 + np.maximum(X, 0), rtol=1e-5)


def test_branch_output_from_outer_scope_and_two_outputs():
    """A branch may return an outer tensor directly (valid ONNX that onnxruntime refuses) and the
    same tensor twice."""
    m = if_model([const("c", np.array([0], np.int64))],
                 [helper.make_node("Relu", ["x"], ["t1"])], ["t1", "t1"],
                 [helper.make_node("Exp", ["x"], ["e1"])], ["x", "e1"], outs=("y1", "y2"))
    g = import_onnx(m)
    assert [v.name for v in g.outputs] == ["y1", "y2"]
    got = rm.ort_run(export_onnx(g), {"x": X})
    np.testing.assert_allclose(got[0], X)
    np.testing.assert_allclose(got[1], np.exp(X), rtol=1e-6)
    m.graph.node[0].attribute[0].t.CopyFrom(numpy_helper.from_array(np.array([1], np.int64)))
    got = rm.ort_run(export_onnx(import_onnx(m)), {"x": X})
    np.testing.assert_allclose(got[0], np.maximum(X, 0))
    np.testing.assert_allclose(got[1], np.maximum(X, 0))


def bound_model():
    """Like silero_vad: y = If(Equal(sr, 16000)) -> x * 2 else x * 3, sr an int64 scalar input."""
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    cond = [const("k", np.int64(16000)), helper.make_node("Equal", ["sr", "k"], ["c"])]
    return if_model(cond, [const("two", np.float32(2)), helper.make_node("Mul", ["x", "two"], ["t"])], ["t"],
                    [const("three", np.float32(3)), helper.make_node("Mul", ["x", "three"], ["e"])], ["e"],
                    extra_inputs=[sr])


@pytest.mark.parametrize("sr", [16000, 8000])
def test_bound_input_selects_branch_and_disappears(sr):
    m = bound_model()
    g = check(m, {"x": X, "sr": np.array(sr, np.int64)}, input_values={"sr": np.array(sr)})
    assert [v.name for v in g.inputs] == ["x"]
    assert [op.kind for op in g.ops] == ["Mul"]
    np.testing.assert_allclose(g.ops[0].operands[1].data, 2 if sr == 16000 else 3)


def test_runtime_condition_is_user_error():
    """A condition read from a graph input (through a Not, so it is computed) that is not bound."""
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    m = if_model([helper.make_node("Not", ["flag"], ["c"])], [helper.make_node("Relu", ["x"], ["t"])], ["t"],
                 [helper.make_node("Neg", ["x"], ["e"])], ["e"], extra_inputs=[flag])
    m.graph.node[0].op_type = "Identity"          # Not may not be converted; Identity is
    with pytest.raises(UserError) as e:
        import_onnx(m)
    msg = str(e.value)
    assert "If 'the_if'" in msg and "'flag'" in msg and "--input-value" in msg and "\n" not in msg
    check(m, {"x": X, "flag": np.array(False)}, input_values={"flag": 0})


def test_bad_input_values():
    m = bound_model()
    with pytest.raises(UserError, match="not an input"):
        import_onnx(m, input_values={"rate": 16000})
    with pytest.raises(UserError, match="does not fit"):
        import_onnx(m, input_values={"sr": 16000.5})
    with pytest.raises(UserError, match="shape"):
        import_onnx(m, input_values={"sr": [16000, 8000]})


def test_parse_input_value():
    assert parse_input_value("sr=16000")[1].shape == ()
    name, v = parse_input_value("w=1,2.5,3")
    assert name == "w" and v.tolist() == [1, 2.5, 3]
    with pytest.raises(UserError, match="--input-value"):
        parse_input_value("sr")


def test_cli_input_value(tmp_path):
    from qcompiler.cli import main
    p = tmp_path / "m.onnx"
    onnx.save(bound_model(), p)
    out = tmp_path / "m2.onnx"
    assert main(["convert", str(p), "--input-value", "sr=8000", "-o", str(out), "-q"]) == 0
    m2 = onnx.load(out)
    assert [i.name for i in m2.graph.input] == ["x"]
    np.testing.assert_allclose(rm.ort_run(m2, {"x": X})[0], 3 * X, rtol=1e-6)
