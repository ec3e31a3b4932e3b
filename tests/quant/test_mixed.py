"""qcompiler.plan.mixed: --keep-float NAME|op:TYPE, --force-int8, the budget flags' checks, and
the reasons each float layer gets; bad values are one UserError line and exit code 2."""
import contextlib
import io
import json

import numpy as np
import pytest

from qcompiler.cli import main
from qcompiler.errors import UserError
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.plan import mixed

from mixed_models import conv_feeds, outlier_mlp, residual_convnet


def tiny_onnx(path):
    """x[1,16] -> Gemm g1 -> Relu -> Gemm g2 -> Softmax sm -> y[1,10]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, s).astype(np.float32), n)
             for n, s in (("w1", (16, 16)), ("b1", (16,)), ("w2", (16, 10)), ("b2", (10,)))]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="g1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["z"], name="g2"),
             helper.make_node("Softmax", ["z"], ["y"], name="sm", axis=1)]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return str(path)


def test_keep_float_forms():
    g = outlier_mlp({})
    gemms = {op.name for op in g.ops if op.kind == "Gemm"}
    assert mixed.resolve_keep_float(g, ["op:Gemm"]) == {"Gemm", "FusedGemm"} == mixed.resolve_keep_float(g, ["Gemm"])
    assert mixed.resolve_keep_float(g, ["g3", "add1"]) == {"g3", "add1"}
    assert mixed.resolve_keep_float(g, ["op:Gemm"], force_int8=["g2"]) == gemms - {"g2"}   # force wins over a type
    with pytest.raises(UserError, match="names no op and no op type"):
        mixed.resolve_keep_float(g, ["g33"])


def test_keep_float_names_the_parts_of_a_split_residual_conv():
    """The quantize pass splits FusedConv(X, W, B, Z){HardSwish} into conv, conv_add, conv_hardswish,
    and the selection and the report name those parts; --keep-float takes them before the split:
    the add and the HardSwish stay float, the conv becomes QLinearConv."""
    from qcompiler.ir import parse_graph
    from qcompiler.passes import PassContext, PassManager
    from test_quantize import RESIDUAL
    g = parse_graph(RESIDUAL)
    keep = mixed.resolve_keep_float(g, ["conv_add", "conv_hardswish"])
    assert keep == {"conv_add", "conv_hardswish"}
    with pytest.raises(UserError, match="names no op"):
        mixed.resolve_keep_float(g, ["conv_sigmoid"])
    opts = QuantizeOptions(ranges={"x": (-1, 1), "z": (-2, 2), "y_acc": (-3, 3)}, keep_float=keep)
    PassManager("quantize", ctx=PassContext(options={"quantize": opts})).run(g)
    by_name = {op.name: op.kind for op in g.ops}
    assert by_name["conv"] == "QLinearConv" and by_name["conv_add"] == "Add" and by_name["conv_hardswish"] == "HardSwish"



def _quantized(g, opts):
    from qcompiler.passes import PassContext, PassManager
    PassManager("quantize", ctx=PassContext(options={"quantize": opts})).run(g)
    return g


def test_keep_float_by_name_builds_the_selections_graph():
    """The selection names its float set after the quantize pass split the fused blocks (c1 is the
    conv of the residual block c1 + c1_add) and the float set travels by name: ``--keep-float``
    with it must build the graph the selection scored, e.g. the aarch64 build of an x86 selection
    (tests/quant/test_sensitivity.py). Before, a block kept float by name was not split, so its
    residual add stayed float too: rapidocr-cls with Conv@11 float read 17.17 dB held back in the
    --keep-float build against the selection build's 19.42, the same on x86 and aarch64. For every
    candidate alone, and for all the split blocks' convs together, the --keep-float build (as the
    CLI runs it: mixed.plan, then the pass, which calibrates) and the selection's build (the
    shared ranges of its one calibration) have the same ops and compute the same outputs bit for
    bit, which are the selection's own variant's (Sensitivity.quantized)."""
    from dataclasses import replace
    from qcompiler.quant import reference
    from qcompiler.plan.sensitivity import Sensitivity
    g0 = residual_convnet()
    opts = QuantizeOptions(calib=[{"x": conv_feeds(32, 1)}], per_channel=False, bias_correction=False)
    x = {"x": conv_feeds(16, 2)}
    sens = Sensitivity(g0, opts, [(x, None)])
    assert {"c1", "c1_add", "c2", "c3"} <= set(sens.candidates)
    assert "c2_add" not in sens.candidates          # only the float HardSwish reads it: float anyway
    sets = [frozenset({c}) for c in sens.candidates] + [frozenset({"c1", "c2", "c3"})]
    for S in sets:
        sel = g0.clone()                                   # --min-sqnr: split first, then the set float
        o, _ = mixed.plan(sel, opts, mixed.BudgetOptions())
        _quantized(sel, replace(o, keep_float=o.keep_float | S, ranges=sens.ranges))
        kf = g0.clone()                                    # --keep-float NAME for each name of the set
        o, _ = mixed.plan(kf, opts, mixed.BudgetOptions(keep_float=tuple(sorted(S))))
        _quantized(kf, o)
        assert [(op.name, op.kind) for op in kf.ops] == [(op.name, op.kind) for op in sel.ops], S
        y_sel, y_kf = reference.run(sel, x)[0], reference.run(kf, x)[0]
        assert np.array_equal(y_kf, y_sel), (S, float(np.abs(y_kf - y_sel).max()))
        variant, _ = sens.quantized(S)
        assert np.array_equal(reference.run(variant, x)[0], y_sel), S
    kinds = {op.name: op.kind for op in kf.ops}           # the last set: c1, c2, c3 float, their parts int8
    assert kinds["c1"] == kinds["c2"] == kinds["c3"] == "FusedConv"
    assert kinds["c1_add"] == kinds["c2_add"] == "Add" and kinds["c3_sigmoid"] == "Sigmoid"   # only float layers read them


def test_keep_float_by_kind_keeps_fused_blocks_whole():
    """``op:FusedConv`` keeps every fused block float as it is (not split: no layer of it could be
    integer), unlike a name, which keeps that layer of the split block."""
    g = residual_convnet()
    opts, _ = mixed.plan(g, QuantizeOptions(calib=[{"x": conv_feeds(8, 1)}], bias_correction=False),
                         mixed.BudgetOptions(keep_float=("op:FusedConv",)))
    _quantized(g, opts)
    kinds = {op.name: op.kind for op in g.ops}
    assert not any(n.endswith(("_add", "_hardswish", "_sigmoid")) for n in kinds)
    assert [kinds[c] for c in ("c0", "c1", "c2", "c3")] == ["FusedConv"] * 4 and kinds["c4"] == "QLinearConv"

def test_force_int8_checks():
    g = outlier_mlp({})
    opts = QuantizeOptions(ranges={})
    mixed.check_forced(g, opts, ["g2", "add1"])
    with pytest.raises(UserError, match="names no op"):
        mixed.check_forced(g, opts, ["nope"])
    with pytest.raises(UserError, match="cannot be integer"):
        mixed.check_forced(g, QuantizeOptions(keep_float=frozenset({"g1", "g2"})), ["add1"])   # no quantized operand


def run(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue().strip()


@pytest.mark.parametrize("flags,message", [
    (["--force-int8", "sm"], "Softmax cannot be integer"),
    (["--force-int8", "nosuch"], "names no op"),
    (["--keep-float", "nosuch"], "names no op and no op type"),
    (["--min-sqnr", "nan"], "finite"),
    (["--max-accuracy-drop", "150"], "0..100"),
    (["--max-accuracy-drop", "1"], "needs labelled evaluation data"),
    (["--min-sqnr", "30", "--max-accuracy-drop", "1"], "both given"),
    (["--sensitivity-samples", "0", "--sensitivity"], "must be positive"),
    (["--min-sqnr", "30", "--budget-confidence", "1"], "point estimate) or in [0.5, 1)"),
    (["--min-sqnr", "30", "--budget-confidence", "0.2"], "point estimate) or in [0.5, 1)"),
])
def test_bad_values_are_one_line_exit_2(tmp_path, flags, message):
    m = tiny_onnx(tmp_path / "m.onnx")
    rc, err = run([m, "--dtype", "int8", "--calib", "random", "-q", "-o", str(tmp_path / "out")] + flags)
    assert rc == 2 and message in err and len(err.splitlines()) == 1 and err.startswith("qcompile: error:")
    assert not (tmp_path / "out").exists()


def test_budget_flags_need_int8(tmp_path):
    rc, err = run([tiny_onnx(tmp_path / "m.onnx"), "--min-sqnr", "30", "-o", str(tmp_path / "out")])
    assert rc == 2 and "--dtype int8" in err


def test_keep_float_type_force_int8_and_reasons(tmp_path):
    """--keep-float op:Gemm --force-int8 g2: g1 float (--keep-float), g2 int8, Softmax float by the
    default rule; the selection section of report.json says why each float layer is float."""
    m = tiny_onnx(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    np.save(tmp_path / "x.npy", rng.normal(0, 1, (48, 1, 16)).astype(np.float32).reshape(48, 16))
    out = tmp_path / "out"
    rc, err = run([m, "--dtype", "int8", "--calib", str(tmp_path / "x.npy"), "--calib-samples", "32",
                   "--keep-float", "op:Gemm", "--force-int8", "g2", "--sensitivity", "-q", "-o", str(out)])
    assert rc == 0, err
    rep = json.loads((out / "report.json").read_text())
    prec = {r["name"]: r["precision"] for r in rep["layers"]}
    assert prec["g1"] == "float" and prec["g2"] == "int8>f32" and prec["sm"] == "float"   # g2: float32 logits
    why = rep["selection"]["float_layer_reasons"]
    assert why == {"g1": "--keep-float", "sm": "default rule: Softmax stays float"}
    assert [r["layer"] for r in rep["sensitivity"]["rows"]] == ["g2"]      # the only candidate left


def test_accuracy_budget_at_the_bootstrap_bound(tmp_path):
    """--max-accuracy-drop is checked at the 95th percentile of the bootstrap drop: report.json's
    score is minus that bound (at most minus the point drop), the point drop is reported beside it,
    and --budget-confidence 0 gives the point estimate back."""
    import onnxruntime as ort
    m = tiny_onnx(tmp_path / "m.onnx")
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (96, 16)).astype(np.float32)
    sess = ort.InferenceSession(m)
    y = np.array([sess.run(None, {"x": x[i:i + 1]})[0].argmax() for i in range(96)])
    y[::6] = (y[::6] + 1) % 10                          # fp32 is wrong on every sixth sample
    np.savez(tmp_path / "ev.npz", x=x, y=y)
    np.save(tmp_path / "c.npy", x[:32])
    reps = {}
    for conf in ("0.95", "0"):
        out = tmp_path / f"out{conf}"
        rc, err = run([m, "--dtype", "int8", "--calib", str(tmp_path / "c.npy"), "--eval", str(tmp_path / "ev.npz"),
                       "--eval-samples", "96", "--sensitivity-samples", "96", "--max-accuracy-drop", "10",
                       "--budget-confidence", conf, "--layer-costs", "off", "-q", "-o", str(out)])
        assert rc == 0, err
        reps[conf] = json.loads((out / "report.json").read_text())["selection"]
    b, p = reps["0.95"], reps["0"]
    assert b["criterion"]["name"] == "bootstrap bound" and p["criterion"]["name"] == "point estimate"
    assert b["score"] < b["point"] <= 0 and b["baseline"] < b["baseline_point"]      # measured: -6.25 < -3.125
    assert p["score"] == p["point"] == b["point"] and p["baseline"] == b["baseline_point"]
    assert b["met"] == (b["score"] >= -10) and p["met"] == (p["score"] >= -10)
