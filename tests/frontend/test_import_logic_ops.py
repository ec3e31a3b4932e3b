"""Comparisons, logic, selection (bool "i1" results), PRelu, Sign, Mod and the index ops
(GatherND, ScatterND), and ConstantOfShape / Range / Tile with run-time inputs: each imported
from a tiny ONNX model and run by the IR interpreter and an x86 build, against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from opcases import Case, check_case

RNG = np.random.default_rng(7)


def r(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def ints(*shape, lo=-5, hi=6, dtype=np.int64):
    return RNG.integers(lo, hi, shape).astype(dtype)


def bools(*shape):
    return RNG.random(shape) < 0.5


def _with_ties(a, b):
    """Float operands that are equal in a third of the places (so Equal/LessOrEqual see ties)."""
    b = b.copy()
    m = RNG.random(b.shape) < 1 / 3
    b[m] = np.broadcast_to(a, b.shape)[m] if a.shape == b.shape else b[m]
    return a, b


_a, _b = _with_ties(np.round(r(3, 4, 5), 1), np.round(r(3, 4, 5), 1))
_nan = r(4, 6)
_nan[0, :3] = [np.nan, np.inf, -np.inf]
_nan[2, 4] = -np.inf

CASES = [
    *[Case(f"{op.lower()}_f32", op, {"a": _a, "b": _b}) for op in
      ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")],
    Case("less_bcast_const", "Less", {"a": r(2, 3, 4)}, {"b": r(4)}),
    Case("equal_int64_bcast", "Equal", {"a": ints(3, 4, lo=0, hi=3), "b": ints(1, 4, lo=0, hi=3)}),
    Case("greaterorequal_int_scalar", "GreaterOrEqual", {"a": ints(2, 7)}, {"b": np.array(0, np.int64)}),
    Case("equal_bool", "Equal", {"a": bools(3, 4), "b": bools(3, 4)}),
    *[Case(f"{op.lower()}", op, {"a": bools(2, 3, 4), "b": bools(3, 1)}) for op in ("And", "Or", "Xor")],
    Case("and_const_true", "And", {"a": bools(5, 6)}, {"b": np.array(True)}),
    Case("not", "Not", {"a": bools(4, 5)}),
    Case("cast_int_to_bool", "Cast", {"a": ints(4, 5, lo=-2, hi=3)}, attrs={"to": 9}),
    Case("cast_float_to_bool_and_back", [("Cast", ["a"], ["t"], {"to": 9}), ("Cast", ["t"], ["y"], {"to": 1})],
         {"a": np.round(r(4, 5))}),
    Case("where_f32", [("Greater", ["a", "b"], ["c"], {}), ("Where", ["c", "a", "b"], ["y"], {})],
         {"a": r(3, 5), "b": r(3, 5)}),
    Case("where_bcast_scalars", "Where", {"c": bools(2, 1, 6)},
         {"p": np.array(-1e9, np.float32), "q": r(3, 1)}),
    Case("where_int64", "Where", {"c": bools(4, 3), "p": ints(4, 3), "q": ints(3)}),
    Case("where_bool_out", "Where", {"c": bools(4, 3), "p": bools(4, 3), "q": bools(1, 3)},   # not in ORT
         ref=lambda f: [np.where(f["c"], f["p"], f["q"])]),
    Case("isnan", "IsNaN", {"x": _nan}),
    Case("isnan_where", [("IsNaN", ["x"], ["m"], {}), ("Where", ["m", "z", "x"], ["y"], {})],
         {"x": _nan}, {"z": np.array(0.0, np.float32)}),
    Case("isinf", "IsInf", {"x": _nan}),
    Case("isinf_neg_only", "IsInf", {"x": _nan}, attrs={"detect_positive": 0}),
    Case("isinf_pos_only", "IsInf", {"x": _nan}, attrs={"detect_negative": 0}),
    Case("sign_f32", "Sign", {"x": np.concatenate([r(3, 5), np.zeros((1, 5), np.float32)])}),
    Case("sign_int64", "Sign", {"x": ints(3, 5)}),
    Case("mod_int_floor", "Mod", {"a": ints(4, 6, lo=-20, hi=20), "b": ints(6, lo=1, hi=7) * np.array([1, -1] * 3)}),
    Case("mod_int_fmod", "Mod", {"a": ints(4, 6, lo=-20, hi=20), "b": ints(4, 6, lo=1, hi=7)}, attrs={"fmod": 1}),
    Case("mod_f32_fmod", "Mod", {"a": r(4, 6, lo=-9, hi=9), "b": r(4, 6, lo=0.5, hi=3)}, attrs={"fmod": 1}),
    # PRelu: per-channel [C,1,1], ONNX's channels-last [C] / [1,1,C], a scalar, a run-time slope
    Case("prelu_per_channel", "PRelu", {"x": r(1, 6, 5, 7)}, {"s": r(6, 1, 1, lo=0, hi=0.5)}),
    Case("prelu_per_channel_4d", "PRelu", {"x": r(1, 16, 4, 4)}, {"s": r(1, 16, 1, 1, lo=0, hi=0.5)}),
    Case("prelu_channels_last", "PRelu", {"x": r(1, 5, 7, 6)}, {"s": r(1, 1, 6, lo=0, hi=0.5)}),
    Case("prelu_channels_last_1d", "PRelu", {"x": r(2, 9, 10)}, {"s": r(10, lo=0, hi=0.5)}),
    Case("prelu_scalar", "PRelu", {"x": r(3, 8)}, {"s": np.array([0.25], np.float32)}),
    Case("prelu_runtime_slope", "PRelu", {"x": r(2, 4, 3), "s": r(4, 1)}),
    Case("conv_prelu", [("Conv", ["x", "w"], ["c"], {"pads": [1, 1, 1, 1]}), ("PRelu", ["c", "s"], ["y"], {})],
         {"x": r(1, 3, 9, 9)}, {"w": r(16, 3, 3, 3), "s": r(16, 1, 1, lo=0, hi=0.5)}, tol=1e-4),
    # GatherND / ScatterND
    Case("gathernd_b0_k2", "GatherND", {"x": r(4, 5, 3)}, {"i": np.array([[0, 1], [3, -1], [2, 4]], np.int64)}),
    Case("gathernd_b0_full", "GatherND", {"x": r(4, 5)}, {"i": np.array([[[1, 2]], [[3, 4]]], np.int64)}),
    Case("gathernd_b1", "GatherND", {"x": r(2, 6, 3)}, {"i": np.array([[[1], [5]], [[0], [2]]], np.int64)},
         attrs={"batch_dims": 1}),
    Case("gathernd_b1_runtime_idx", "GatherND", {"x": r(3, 4, 5), "i": ints(3, 2, 2, lo=0, hi=4)},
         attrs={"batch_dims": 1}),
    Case("gathernd_bool", "GatherND", {"x": bools(3, 4)}, {"i": np.array([[2], [0]], np.int64)}),
    Case("scatternd_rows", "ScatterND", {"x": r(5, 4), "u": r(2, 4)}, {"i": np.array([[3], [0]], np.int64)},
         outputs=("y",)),
    Case("scatternd_elems", "ScatterND", {"x": r(3, 4, 2), "u": r(3, 2)},
         {"i": np.array([[0, 1], [2, -1], [1, 1]], np.int64)}),
]
# ScatterND's operand order is data, indices, updates
for _c in CASES:
    if _c.op == "ScatterND":
        _c.nodes = [("ScatterND", ["x", "i", "u"], ["y"], {})]

# ConstantOfShape / Range / Tile where some input is not constant but the result shape is static
SHAPE_CASES = [
    Case("tile_runtime_x", "Tile", {"x": r(2, 3)}, {"reps": np.array([3, 2], np.int64)}),
    Case("tile_ones_axis", "Tile", {"x": r(1, 4, 2)}, {"reps": np.array([2, 1, 3], np.int64)}),
    Case("tile_int64", "Tile", {"x": ints(3)}, {"reps": np.array([4], np.int64)}),
    Case("tile_identity", "Tile", {"x": r(2, 2)}, {"reps": np.array([1, 1], np.int64)}),
    Case("constantofshape_of_shape", [("Shape", ["x"], ["s"], {}), ("ConstantOfShape", ["s"], ["c"], {
        "value": __import__("onnx").helper.make_tensor("v", 1, [1], [2.5])}), ("Add", ["x", "c"], ["y"], {})],
         {"x": r(2, 3)}),
    Case("range_of_shape", [("Shape", ["x"], ["s"], {}), ("Gather", ["s", "one"], ["n"], {"axis": 0}),
                            ("Range", ["zero", "n", "one"], ["ar"], {}), ("Cast", ["ar"], ["arf"], {"to": 1}),
                            ("Add", ["x", "arf"], ["y"], {})],
         {"x": r(2, 5)}, {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)}),
]


@pytest.mark.parametrize("case", CASES + SHAPE_CASES, ids=repr)
def test_op_matches_onnxruntime(case):
    check_case(case)


def test_range_with_runtime_limit_is_a_clear_error():
    """A Range whose length depends on a run-time value has no static shape: a UserError naming it."""
    from qcompiler.errors import UserError
    from qcompiler.frontend.onnx_import import import_onnx
    c = Case("range_dynamic", [("Squeeze", ["x"], ["lim"], {}), ("Range", ["z", "lim", "d"], ["y"], {})],
             {"x": np.array([3], np.int64)}, {"z": np.array(0, np.int64), "d": np.array(1, np.int64)})
    with pytest.raises(UserError, match="Range"):
        import_onnx(c.model())


def test_bool_ops_print_as_i1_and_parse_back():
    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.ir.parser import parse_graph
    from qcompiler.ir.printer import print_graph
    g = import_onnx(CASES[0].model())
    text = print_graph(g)
    assert "xi1>" in text
    assert print_graph(parse_graph(text)) == text


def test_artifact_takes_and_returns_bool(tmp_path):
    """The artifact folder round trip: a bool input and a bool output through qcompiler.compile/load."""
    import qcompiler.api as qc
    from qcompiler.frontend.onnx_import import import_onnx
    from opcases import ort_ref
    c = Case("and_or", [("And", ["a", "b"], ["t"], {}), ("Not", ["t"], ["y"], {}),
                        ("Where", ["t", "x", "z"], ["w"], {})],
             {"a": bools(3, 4), "b": bools(3, 4), "x": r(3, 4)}, {"z": np.array(0.0, np.float32)},
             outputs=("y", "w"))
    m = c.model()
    model = qc.load(qc.compile(import_onnx(m), tmp_path / "art"))
    assert [s.dtype for s in model.inputs] == ["bool", "bool", "float32"]
    assert [s.dtype for s in model.outputs] == ["bool", "float32"]
    got = model(**c.inputs)
    for g, ref in zip(got, ort_ref(m, c.inputs)):
        np.testing.assert_array_equal(g, ref)
