"""The IR keeps its own use-def links: passes mutate through the API, never patch lists."""
import numpy as np
import pytest

from qcompiler.ir import Graph, IRError, QuantParams, TensorType, parse_graph, print_graph

F = "float32"


def small_graph():
    g = Graph("g")
    x = g.add_input("x", TensorType((1, 2, 4, 4), F))
    w = g.add_const(np.ones((3, 2, 1, 1), F), "w")
    conv = g.create_op("Conv", [x, w], {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1})
    relu = g.create_op("Relu", [conv.result])
    g.outputs = [relu.result]
    return g, x, w, conv, relu


def test_create_op_infers_types_and_links_uses():
    g, x, w, conv, relu = small_graph()
    assert conv.result.type == TensorType((1, 3, 4, 4), F)
    assert x.uses == [(conv, 0)] and w.uses == [(conv, 1)]
    assert conv.result.users == [relu]
    g.verify()


def test_set_operand_moves_the_use():
    g, x, w, conv, relu = small_graph()
    sig = g.create_op("Sigmoid", [conv.result], before=relu)
    relu.set_operand(0, sig.result)
    assert conv.result.users == [sig] and sig.result.users == [relu]
    assert [op.kind for op in g.ops] == ["Conv", "Sigmoid", "Relu"]
    g.verify()


def test_replace_all_uses_keeps_the_output_name():
    g, x, w, conv, relu = small_graph()
    out_name = relu.result.name
    tanh = g.create_op("Tanh", [conv.result])
    g.replace_op(relu, [tanh.result])
    assert g.outputs[0] is tanh.result and tanh.result.name == out_name
    assert relu.graph is None and [op.kind for op in g.ops] == ["Conv", "Tanh"]
    g.verify()


def test_erase_refuses_a_used_op_and_names_it():
    g, x, w, conv, relu = small_graph()
    with pytest.raises(IRError, match="cannot erase Conv 'conv'.*used by Relu"):
        g.erase_op(conv)


def test_toposort_restores_order_and_detects_cycles():
    g, x, w, conv, relu = small_graph()
    g._ops.reverse()
    with pytest.raises(IRError, match="not defined before use"):
        g.verify()
    g.toposort()
    g.verify()
    relu2 = g.create_op("Relu", [relu.result])
    conv.set_operand(0, relu2.result)           # make a cycle conv -> relu -> relu2 -> conv
    with pytest.raises(IRError, match="cycle"):
        g.toposort()


def test_networkx_view_and_histogram():
    g, *_ = small_graph()
    nxg = g.to_networkx()
    assert nxg.number_of_nodes() == 2 and nxg.number_of_edges() == 1
    assert g.op_histogram() == {"Conv": 1, "Relu": 1}
    assert g.param_count() == (6, 24)


def test_clone_is_independent_and_prints_the_same():
    g, *_ = small_graph()
    c = g.clone()
    assert print_graph(c) == print_graph(g)
    c.erase_op(c.ops[-1]) if False else None
    c.outputs = [c.ops[0].result]
    c.erase_op(c.ops[1])
    assert len(g) == 2 and len(c) == 1


def test_quant_params_validate_and_print_like_mlir():
    q = QuantParams("int8", (0.5, 0.25), (0, 0), axis=0)
    t = TensorType((2, 3), "int8", q)
    assert str(t) == "tensor<2x3x!quant.uniform<i8:f32:0, {0.5:0, 0.25:0}>>"
    assert str(TensorType((4,), "uint8", QuantParams("uint8", (0.1,), (128,)))) == \
        "tensor<4x!quant.uniform<u8:f32, 0.1:128>>"
    with pytest.raises(ValueError, match="3 channels but 2 scales"):
        TensorType((3, 3), "int8", q)
    with pytest.raises(ValueError, match="zero point 300 outside"):
        QuantParams("uint8", (0.1,), (300,))
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        QuantParams("int8", (0.0,), (0,))
    with pytest.raises(ValueError, match="stores int8 but element dtype is uint8"):
        TensorType((4,), "uint8", QuantParams("int8", (0.1,), (0,)))


def test_anchored_inserts_and_erases_keep_list_insert_order():
    """create_op(before=/after=) and erase_op are O(1) edits applied at the next read; the order
    read back is the one list.insert / list.remove would have made, for any mix of edits."""
    import random
    rng = random.Random(33)
    for trial in range(30):
        g = Graph("g")
        x = g.add_input("x", TensorType((4,), F))
        ref = []                                  # the order list.insert / list.remove make
        for step in range(60):
            live = [o for o in ref if not any(r.uses for r in o.results)]
            r = rng.random()
            if ref and r < 0.35:
                anchor = rng.choice(ref)
                op = g.create_op("Relu", [x], before=anchor)
                ref.insert(ref.index(anchor), op)
            elif ref and r < 0.7:
                anchor = rng.choice(ref)
                op = g.create_op("Relu", [x], after=anchor)
                ref.insert(ref.index(anchor) + 1, op)
            elif live and r < 0.85:
                op = rng.choice(live)
                g.erase_op(op)
                ref.remove(op)
            else:
                op = g.create_op("Relu", [x])
                ref.append(op)
            assert len(g) == len(ref)
            if rng.random() < 0.2:                # reads in between apply the edits so far
                assert g.ops == ref
        assert g.ops == ref and list(g) == ref
        g.verify()
    with pytest.raises(IRError, match="not in graph"):
        g.create_op("Relu", [x], before=Graph("other").create_op("Relu", [Graph("o").add_input("y", TensorType((4,), F))]))
