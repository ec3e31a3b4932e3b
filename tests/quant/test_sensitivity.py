"""Sensitivity: the table's numbers against a direct computation (the quantize pass run with
keep_float = all but one layer, or one layer, and SQNR / KL / RMSE in numpy), one calibration for
the whole table, and the trained Fashion-MNIST model through the CLI with a --min-sqnr that plain
int8 misses."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qcompiler.codegen.arm import toolchain as arm
from qcompiler.passes import PassContext, PassManager
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.quant import reference
from qcompiler.plan.sensitivity import Sensitivity, output_scores
from qcompiler.verify import verify

from mixed_models import feeds, outlier_mlp

ROOT = Path(__file__).resolve().parents[2]
SEVERITY = {"g2": 60, "g4": 25, "g5": 8}


def build(calls=None, monkeypatch=None, exact=True):
    """The outlier MLP's table; ``exact``: run by the reference interpreter (these tests check its
    numbers bit for bit), else by onnxruntime (the compile's default)."""
    g = outlier_mlp(SEVERITY)
    opts = QuantizeOptions(calib=[{"x": feeds(64, 1)}], per_channel=False, bias_correction=False)
    return g, Sensitivity(g, opts, [({"x": feeds(64, 2)}, None)], exact=exact)


def direct(g, ranges, keep):
    """The quantize pass itself with these layers float, run by the reference interpreter."""
    q = g.clone()
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(
        keep_float=frozenset(keep), ranges=ranges, per_channel=False, bias_correction=False)})).run(q)
    return reference.run(q, {"x": feeds(64, 2)})[0]


def numpy_metrics(r, y):
    r, y = r.astype(np.float64), y.astype(np.float64)
    sqnr = 10 * np.log10(np.sum(r ** 2) / np.sum((y - r) ** 2))
    p = np.exp(r - r.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
    q = np.exp(y - y.max(1, keepdims=True)); q /= q.sum(1, keepdims=True)
    kl = np.mean(np.sum(p * np.log(p / q), axis=1))
    return sqnr, kl, np.sqrt(np.mean((y - r) ** 2))


def test_table_equals_direct_computation():
    g, sens = build()
    ref = reference.run(g, {"x": feeds(64, 2)})[0]
    rows = {r["layer"]: r for r in sens.table()}
    assert set(rows) == {"g1", "g2", "add1", "g3", "g4", "add2", "g5", "g6"}
    for name in ("g2", "g4", "g6"):
        y = direct(g, sens.ranges, [c for c in sens.candidates if c != name])        # only `name` int8
        sq, kl, rmse = numpy_metrics(ref, y)
        a = sens.only_int8(name)
        assert a.sqnr_db == pytest.approx(sq, abs=1e-9) and a.kl == pytest.approx(kl, rel=1e-9)
        assert a.rmse == pytest.approx(rmse, rel=1e-9)
        assert rows[name]["sqnr_only_int8_db"] == pytest.approx(sq, abs=1e-4)
        y = direct(g, sens.ranges, [name])                                          # only `name` float
        sq, kl, rmse = numpy_metrics(ref, y)
        assert sens.only_float(name).sqnr_db == pytest.approx(sq, abs=1e-9)
        assert rows[name]["sqnr_only_float_db"] == pytest.approx(sq, abs=1e-4)
    # the outliers rank as built: g2 (60x) worst alone, and keeping it float buys the most back
    assert rows["g2"]["rank"] == 1 and rows["g2"]["gain_db"] > 5
    assert rows["g2"]["sqnr_only_int8_db"] < rows["g4"]["sqnr_only_int8_db"] < rows["g1"]["sqnr_only_int8_db"]
    # an Add is integer only behind a quantized operand: no "only int8" number, said so
    assert rows["add1"]["sqnr_only_int8_db"] is None and "quantized operand" in rows["add1"]["note"]


def test_onnxruntime_table_is_the_exact_one():
    """The default engine (onnxruntime on each variant's QDQ export) gives the reference
    interpreter's table: the same ranking, every SQNR within 0.01 dB (the runs differ only where a
    float32 sum lands near a rounding tie; measured here 1e-6 dB)."""
    _, exact = build()
    _, fast = build(exact=False)
    a, b = exact.table(), fast.table()
    assert [r["layer"] for r in a] == [r["layer"] for r in b]
    for r, s in zip(a, b):
        for k in ("sqnr_only_int8_db", "sqnr_only_float_db"):
            assert (r[k] is None) == (s[k] is None) and (r[k] is None or abs(r[k] - s[k]) <= 0.01), (r, s)


def test_variants_from_cached_weights_are_built_afresh():
    """A variant's integer weights, biases and multipliers come from the Rewriter's cache once a
    layer was quantized with the same input and output params: the graph is the one a cold
    rewrite builds, constants and attributes included."""
    _, sens = build()
    c = sens.candidates
    for S in (frozenset(), frozenset(c[:2]), frozenset(c[3:]), frozenset({"g2", "add2"})):
        warm, _ = sens.quantized(S)
        assert sens._weights
        sens._weights.clear()
        cold, _ = sens.quantized(S)
        assert str(warm) == str(cold)
        for name, v in cold.consts.items():
            assert np.array_equal(warm.consts[name].data, v.data) and warm.consts[name].type == v.type


def test_prior_in_onnxruntime_is_the_reference_ranking():
    """The cheap ranking (SQNR lost across each layer in one all-int8 run) measured on the QDQ
    export in onnxruntime, streamed run by run, orders the layers as the reference interpreter's
    exact run does; the worst outlier built in (g2, 60x) comes first."""
    _, exact = build()
    _, fast = build(exact=False)
    assert fast.prior() == exact.prior()
    assert fast.prior()[0] == "g2" and sorted(fast.prior()) == sorted(fast.candidates)


def test_table_reports_progress_per_layer_and_per_evaluation():
    from qcompiler.progress import StageLine, listening
    seen = []
    g, sens = build()
    with listening(lambda *a: seen.append(a)):
        sens.table(progress=True)
    n = len(sens.candidates)
    assert [d for s, d, t in seen if s == "sensitivity"] == list(range(n + 1))
    assert all(t == n for s, _, t in seen if s == "sensitivity")
    evals = [d for s, d, t in seen if s == "evaluate layer sets"]
    assert evals == list(range(1, sens.evaluations + 1))        # every new layer set, all int8 first
    assert StageLine.line("evaluate layer sets", 7, None, 1.25) == "compile: evaluate layer sets 7 1.2 s"


def test_cached_prefix_run_is_exact():
    """Variants re-use the all-int8 run's values upstream of their float layers: bit for bit what
    the reference interpreter computes on the whole graph."""
    g, sens = build()
    for S in ([], ["g6"], ["g4"], ["g2", "add2"], ["g1"], sens.candidates):
        q, _ = sens.quantized(frozenset(S))
        want = reference.run(q, {"x": feeds(64, 2)})
        got = sens._run(q, 0)
        assert all(np.array_equal(a, b) for a, b in zip(want, got))


def test_scores_from_a_subset_base_are_exact():
    """Greedy-like growth: once a scored set is the best base twice, later sets run from its
    values (_choose_base); their scores equal a fresh Sensitivity's, which runs from all-int8."""
    g, sens = build()
    sets = [["g2"], ["g2", "g4"], ["g2", "g5"], ["g2", "g6"], ["g2", "g4", "g5"], ["g2", "g4", "g6"], ["g1", "g5"]]
    got = [sens.scores(frozenset(S)) for S in sets[:-1]]
    assert len(sens._parent) == 2                                # a subset's run became the base
    got.append(sens.scores(frozenset(sets[-1])))                 # not inside it: back to all-int8
    assert not sens._parent
    for S, a in zip(sets, got):
        _, fresh = build()
        assert fresh.scores(frozenset(S)) == a and not fresh._parent, S


def test_one_calibration_and_the_pass_agrees(monkeypatch):
    """The table calibrates once (every activation in one pass); all-int8 with those shared ranges
    is what the quantize pass gives when it calibrates by itself."""
    import qcompiler.quant.calibrate as cal
    calls = []
    real = cal.collect_ranges
    monkeypatch.setattr(cal, "collect_ranges", lambda *a, **k: calls.append(1) or real(*a, **k))
    g, sens = build()
    sens.table()
    assert len(calls) == 1 and sens.evaluations == 1 + 2 * len(sens.candidates)      # all-int8 + 2 per layer
    q = g.clone()
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(
        calib=[{"x": feeds(64, 1)}], per_channel=False, bias_correction=False)})).run(q)
    y = reference.run(q, {"x": feeds(64, 2)})[0]
    ref = reference.run(g, {"x": feeds(64, 2)})[0]
    assert sens.scores(frozenset()).sqnr_db == pytest.approx(numpy_metrics(ref, y)[0], abs=1e-9)


def test_labels_and_metric_callback():
    r = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]])
    y = np.array([[2.1, 0.0, -1.0], [2.0, 1.0, 0.0]])                 # second row flips its argmax
    s = output_scores([r], [y], labels=np.array([0, 1]), metric=lambda outs: float(outs[0].max()))
    assert s.accuracy == 0.5 and s.metric == pytest.approx(2.1)
    assert s.sqnr_db == pytest.approx(10 * math.log10(14 / (0.01 + 4 + 4)))
    exact = output_scores([r], [r])
    assert exact.sqnr_db == math.inf and exact.kl == 0 and exact.rmse == 0


_no_qemu = arm.emulation_problems()
TARGETS = ["x86", pytest.param("arm", marks=[pytest.mark.qemu, pytest.mark.skipif(
    bool(_no_qemu), reason="; ".join(_no_qemu))])]


def _qcompile(args: list[str], out, timeout: int) -> dict:
    """``qcompile ARGS --debug-layers -q -o OUT`` in a subprocess; its report.json."""
    p = subprocess.run([sys.executable, "-m", "qcompiler.cli", *args, "--debug-layers", "-q", "-o", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return json.loads((out / "report.json").read_text())


def _assert_int8_layers_within_1_lsb(out, x, min_layers: int) -> None:
    """``qcompile verify``'s check of OUT on ``x``: every int8 layer within 1 LSB of the QDQ export."""
    report = verify(out, x)
    print("\n" + report.table())
    assert len(report.compared) >= min_layers
    assert all(r.max_lsb <= 1 for r in report.compared), [(r.name, r.max_lsb) for r in report.compared]
    assert report.passed, report.verdict()


@pytest.mark.parametrize("target", TARGETS)
def test_fashion_cli_min_sqnr_plain_int8_misses(tmp_path, target):
    """models/fashion_mobilenet.onnx, per-tensor weights without equalization: plain int8 reaches
    about 17-18 dB; --min-sqnr 30 keeps the fewest layers float (measured: one depthwise conv,
    33.5 dB) and the budget holds on the held-back samples the report evaluates. The artifact that
    selection gives, built for x86 and for aarch64 (run under qemu-aarch64), matches its QDQ export
    in ONNX Runtime within 1 LSB on every int8 layer (``qcompile verify``'s check)."""
    if not (ROOT / "models" / "fashion_test.npz").exists():
        pytest.skip("models/fashion_test.npz missing")
    out = tmp_path / "out"
    rep = _qcompile([str(ROOT / "models" / "fashion_mobilenet.onnx"),
                     "--dtype", "int8", "--calib", str(ROOT / "models" / "fashion_test.npz"),
                     "--calib-samples", "128", "--eval-samples", "64", "--per-tensor", "--no-equalize",
                     "--min-sqnr", "30", "--sensitivity-samples", "32", "--layer-costs", "off",
                     "--target", target], out, timeout=600)
    sel = rep["selection"]
    assert sel["baseline"] < 30 <= sel["score"] and sel["met"]             # plain int8 misses, selection meets
    assert 1 <= len(sel["float_layers"]) <= 3
    assert sel["evaluation"]["held_back"] and sel["evaluation"]["met"]
    assert rep["evaluation"]["outputs"][0]["sqnr_db"] >= 30
    for name in sel["float_layers"]:
        assert sel["float_layer_reasons"][name].startswith("budget: +")
        assert next(r for r in rep["layers"] if r["name"] == name)["precision"] == "float"
    assert rep["float_layers"] == len(sel["float_layers"])
    x = np.load(ROOT / "models" / "fashion_test.npz")["x"][-16:].astype(np.float32)
    _assert_int8_layers_within_1_lsb(out, x, min_layers=20)


def _cls_args(tmp_path, target: str) -> tuple[list[str], np.ndarray]:
    """The rapidocr classifier's CLI arguments (16 calibration lines, 32 held back for the report's
    evaluation, 32 after those for the selection) and the 80 synthetic text lines behind them."""
    from realmodels import rapidocr_models, rapidocr_text_lines
    models = [m for m in rapidocr_models() if m.name == "rapidocr-cls"]
    if not models:
        pytest.skip("rapidocr package not installed")
    lines = rapidocr_text_lines(80)
    np.savez(tmp_path / "lines.npz", x=lines)
    return [models[0].load(), "--input-shape", "x=1x3x48x192", "--dtype", "int8",
            "--calib", str(tmp_path / "lines.npz"), "--calib-samples", "16", "--eval-samples", "32",
            "--target", target], lines


@pytest.fixture(scope="module")
def cls_selection(tmp_path_factory):
    """``qcompile --min-sqnr 19`` on the rapidocr classifier for x86, run once for the module:
    (report, artifact folder, lines). The selection itself runs in numpy on the IR (with
    ``--layer-costs off`` nothing of the target enters it), so the aarch64 test builds the same
    float set with ``--keep-float`` instead of searching again (~2 min)."""
    tmp = tmp_path_factory.mktemp("cls")
    args, lines = _cls_args(tmp, "x86")
    out = tmp / "out"
    rep = _qcompile([*args, "--sensitivity-samples", "32", "--min-sqnr", "19", "--layer-costs", "off"],
                    out, timeout=900)
    return rep, out, lines


def test_rapidocr_cls_cli_min_sqnr_plain_int8_misses(cls_selection):
    """The rapidocr classifier through the CLI: plain int8 misses --min-sqnr 19 on the selection
    lines (measured 13.6 dB at the bound, 16.5 point), the selection meets it there at the 95 %
    bootstrap bound with a few float layers (measured with the float32 HardSwish epilogue: all
    int8 14.3 -> 19.0 dB with Conv@1, Conv@2, Conv@14, Conv@11 float; with the earlier integer one
    Conv@1 and Conv@2, 19.8 dB), and the x86 artifact matches its QDQ export within 1 LSB on every
    int8 layer. Not asserted: the held-back line, which with 16 calibration lines can fall short
    (measured 19.4 dB now, 18.6 dB before; see README, selective unquantization). ~2 min."""
    rep, out, lines = cls_selection
    sel = rep["selection"]
    print(f"\nrapidocr-cls --min-sqnr 19: all int8 {sel['baseline']:.2f} -> {sel['score']:.2f} dB "
          f"with {sel['float_layers']}; held back: {sel['evaluation']}")
    assert sel["baseline"] < 19 <= sel["score"] and sel["met"]
    assert 1 <= len(sel["float_layers"]) <= 8
    _assert_int8_layers_within_1_lsb(out, lines[-8:], min_layers=40)


def _ir_rows(rep: dict) -> list[tuple]:
    """What report.json's layer rows say about the quantized IR and its numpy evaluation: name,
    kind, precision, output params and range, SQNR against fp32."""
    return [(r["name"], r["kind"], r["precision"], r.get("scale"), r.get("zero_point"), r.get("range"),
             r.get("sqnr_db")) for r in rep["layers"]]


@pytest.mark.qemu
@pytest.mark.skipif(bool(_no_qemu), reason="; ".join(_no_qemu))
def test_rapidocr_cls_selected_float_layers_on_aarch64(cls_selection, tmp_path):
    """The float set the x86 selection chose, built for aarch64 by name (``--keep-float``): the
    same quantized IR as the x86 selection's build, layer by layer in the two reports (kind,
    precision, params, range, SQNR: the report evaluates the quantized IR in numpy, which the target
    does not enter, so they are equal, not close), hence the same output SQNR on the report's
    held-back lines, and the artifact (run under qemu-aarch64) matches its QDQ export within 1 LSB
    on every int8 layer. The selection floats Conv@11, the conv of a split residual block (its add,
    Conv@11_add, stays int8): before --keep-float split a block kept by name, the aarch64 build kept
    the add float too and read 17.17 dB against 19.42 (the fast check of this is
    tests/quant/test_mixed.py::test_keep_float_by_name_builds_the_selections_graph)."""
    rep, _, lines = cls_selection
    floats = rep["selection"]["float_layers"]
    args, _ = _cls_args(tmp_path, "arm")
    out = tmp_path / "out"
    arm_rep = _qcompile([*args, *(f for name in floats for f in ("--keep-float", name))], out, timeout=600)
    assert arm_rep["target"] == "arm" and rep["target"] == "x86"
    assert sorted(r["name"] for r in arm_rep["layers"] if r["precision"] == "float"
                  and r["name"] in floats) == sorted(floats)
    assert arm_rep["float_layers"] == rep["float_layers"]        # and nothing else became float
    diff = [(a, b) for a, b in zip(_ir_rows(rep), _ir_rows(arm_rep)) if a != b]
    assert len(rep["layers"]) == len(arm_rep["layers"]) and not diff, diff[:3]
    assert arm_rep["evaluation"]["outputs"] == rep["evaluation"]["outputs"]
    _assert_int8_layers_within_1_lsb(out, lines[-8:], min_layers=40)
