"""OUT/report.html (qcompiler.plan.report_html) and report.json for every compile.

Builds through the CLI: fashion_mobilenet int8 (--calib models/fashion_test.npz, 64 calibration and
32 held-back evaluation samples, --equalize so the equalization plot is present) and fp32; a tiny
model whose op and value names contain "<script>" and "&" (int8 on random calibration data, fp32
twice for reproducibility, once with --time-passes). The HTML is parsed with html.parser: the table
row counts must equal the report's layer and pass counts, each SVG must hold one bar per
measured layer/size; then headless Chromium renders it (screenshot non-blank, DOM has the tables
and SVGs), skipped when no chromium binary is installed (scripts/setup.sh installs it).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import timing_keys

from qcompiler.codegen.target import TargetSpec
from qcompiler.driver import BudgetOptions, CalibOptions, CompileOptions, PipelineOptions, compile
from qcompiler.plan.report_html import render
from qcompiler.plan.report_plots import SENSITIVITY_ROWS, SQNR_WARN_DB, WORST_LAYERS

sys.path.insert(0, str(Path(__file__).parent))
import realmodels  # noqa: E402

MODEL = realmodels.MODELS_DIR / "fashion_mobilenet.onnx"
DATA = realmodels.MODELS_DIR / "fashion_test.npz"
needs_fashion = pytest.mark.skipif(not (MODEL.exists() and DATA.exists()), reason="fashion model or data missing")
EVIL = '<script>alert("x")</script>&amp'



def _compile(model: Path, out: Path, **options) -> None:
    """Build ``model`` into ``out`` with the driver (quiet: no progress, no report table)."""
    compile(str(model), out, CompileOptions(quiet=True, **options))


INT8 = TargetSpec("x86", dtype="int8")


class Page(HTMLParser):
    """Tables (class -> body row count), SVGs (class -> {element class: count}), tags seen."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, int] = {}
        self.svgs: dict[str, dict[str, int]] = {}
        self.tags: dict[str, int] = {}
        self.attrs: list[tuple[str, str]] = []
        self._table = self._svg = None
        self._body = False
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.attrs += [(k, v or "") for k, v in attrs]
        if tag == "table":
            self._table = a.get("class", "")
            self.tables[self._table] = 0
        elif tag == "tbody":
            self._body = True
        elif tag == "tr" and self._table is not None and self._body:
            self.tables[self._table] += 1
        elif tag == "svg":
            self._svg = (a.get("class") or "").replace("plot ", "")
            self.svgs[self._svg] = {}
        elif self._svg is not None and a.get("class"):
            self.svgs[self._svg][a["class"]] = self.svgs[self._svg].get(a["class"], 0) + 1

    def handle_endtag(self, tag):
        if tag == "table":
            self._table, self._body = None, False
        elif tag == "tbody":
            self._body = False
        elif tag == "svg":
            self._svg = None

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> Page:
    p = Page()
    p.feed(html)
    p.close()
    return p


def _self_contained(p: Page) -> None:
    assert "script" not in p.tags and "link" not in p.tags and "img" not in p.tags
    assert not [a for a in p.attrs if a[0] in ("src", "href") or a[0].startswith("on")], p.attrs


# ---- builds -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    """(int8 OUT, fp32 OUT) of fashion_mobilenet."""
    if not (MODEL.exists() and DATA.exists()):
        pytest.skip("fashion model or data missing")
    root = tmp_path_factory.mktemp("html")
    _compile(MODEL, root / "q8", target=INT8,
             calib=CalibOptions(source=str(DATA), samples=64, eval_samples=32, equalize=True),
             budget=BudgetOptions(sensitivity=True, sensitivity_samples=8))
    _compile(MODEL, root / "f32")
    return root / "q8", root / "f32"


def _evil_model(path: Path) -> None:
    """x[1,8] -> MatMul -> Add -> Relu -> MatMul -> y[1,4], every node and value named with EVIL."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(8, 16)).astype(np.float32), "w1" + EVIL)
    b1 = numpy_helper.from_array(rng.normal(size=(16,)).astype(np.float32), "b1" + EVIL)
    w2 = numpy_helper.from_array(rng.normal(size=(16, 4)).astype(np.float32), "w2" + EVIL)
    nodes = [helper.make_node("MatMul", ["x" + EVIL, w1.name], ["h0" + EVIL], name="mm1" + EVIL),
             helper.make_node("Add", ["h0" + EVIL, b1.name], ["h1" + EVIL], name="add" + EVIL),
             helper.make_node("Relu", ["h1" + EVIL], ["h2" + EVIL], name="relu" + EVIL),
             helper.make_node("MatMul", ["h2" + EVIL, w2.name], ["y" + EVIL], name="mm2" + EVIL)]
    g = helper.make_graph(nodes, "g" + EVIL, [helper.make_tensor_value_info("x" + EVIL, TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y" + EVIL, TensorProto.FLOAT, [1, 4])], [w1, b1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    root = tmp_path_factory.mktemp("evil")
    _evil_model(root / "m.onnx")
    return root


# ---- the int8 report ---------------------------------------------------------------------------------
@needs_fashion
def test_int8_html_tables_and_plots(fashion):
    q8, _ = fashion
    rep = json.loads((q8 / "report.json").read_text())
    html = (q8 / "report.html").read_text()
    p = parse(html)
    _self_contained(p)
    assert rep["dtype"] == "int8" and len(rep["layers"]) == 31 == rep["quantized_layers"]
    assert p.tables["layers"] == len(rep["layers"])
    assert p.tables["passes"] == len(rep["passes"])
    assert [x["name"] for x in rep["passes"]][-2:] == ["quantize", "encode-sparse"]   # it decides on the int8 weights
    assert p.tables["ops"] == len(set(rep["ops"]["before"]) | set(rep["ops"]["after"]))
    assert rep["summary"]["ops_before"] == sum(rep["ops"]["before"].values()) > rep["summary"]["ops_after"]
    assert rep["ops"]["after"]["QLinearConv"] == 23 and "Conv" not in rep["ops"]["after"]
    measured = [r for r in rep["layers"] if r.get("sqnr_db") is not None]
    assert len(measured) == 31
    assert p.svgs["sqnr"] == {"bar": len(measured)}
    assert p.svgs["size"] == {"bar": 4}                    # params fp32/int8, model.so fp32 (est.)/int8
    worst = min(WORST_LAYERS, len(measured))
    assert p.svgs["ranges"]["range"] == worst and p.svgs["ranges"]["calibrated"] <= worst
    assert "equalization" in p.svgs                        # --equalize: dfq.to_svg inlined
    assert p.svgs["tradeoff"] == {"point": 2}               # no budget: int8 vs fp32, SQNR against size
    hists = sum("histogram" in r for r in rep["layers"])
    assert hists == 6 and p.svgs["histograms"] == {"hist": hists, "bins": hists}
    assert (q8 / "equalization.svg").exists()
    # --sensitivity: one ranked bar per quantizable layer; no budget, so no float layer to explain
    rows = rep["sensitivity"]["rows"]
    assert len(rows) == 29 and [r["rank"] for r in rows] == list(range(1, 30))
    assert p.svgs["sensitivity"] == {"bar": min(len(rows), SENSITIVITY_ROWS)}
    assert rep["selection"]["float_layers"] == [] and rep["selection"]["float_layer_reasons"] == {}
    # every layer's shape and SQNR is in the table as the JSON has it
    text = "".join(p.text)
    for r in rep["layers"]:
        assert "×".join(map(str, r["shape"])) in text and f"{r['sqnr_db']:.2f}" in text
    # warnings are the data's: one per layer below 20 dB, nothing invented
    low = [r["name"] for r in rep["layers"] if r["sqnr_db"] < SQNR_WARN_DB]
    assert [w for w in rep["warnings"] if w.startswith("layer ")] == \
        [w for w in rep["warnings"] if any(w.startswith(f"layer {n} ") for n in low)]
    assert timing_keys(rep) == []                           # no wall-clock timings in the reproducible files
    m = json.loads((q8 / "manifest.json").read_text())
    for name in ("report.json", "report.html"):
        assert m["files"][name]["sha256"] == hashlib.sha256((q8 / name).read_bytes()).hexdigest()
    print(f"int8: {len(rep['layers'])} layers, SQNR {min(r['sqnr_db'] for r in measured):.2f}.."
          f"{max(r['sqnr_db'] for r in measured):.2f} dB, {len(rep['warnings'])} warnings, html {len(html)} chars")


@needs_fashion
def test_fp32_report_json_and_html(fashion):
    _, f32 = fashion
    rep = json.loads((f32 / "report.json").read_text())
    assert rep["dtype"] == "fp32"
    assert not {"evaluation", "scheme", "calibration", "quantized_layers"} & set(rep)
    assert all("scale" not in r and "sqnr_db" not in r for r in rep["layers"])
    assert len(rep["layers"]) == rep["summary"]["ops_after"] == sum(rep["ops"]["after"].values())
    assert rep["size"]["library_fp32_bytes"] == (f32 / "model.so").stat().st_size
    p = parse((f32 / "report.html").read_text())
    _self_contained(p)
    assert p.tables["layers"] == len(rep["layers"]) and p.tables["passes"] == len(rep["passes"])
    assert set(p.svgs) == {"size"} and p.svgs["size"] == {"bar": 2}
    assert rep["warnings"] == []


# ---- names from the model are escaped ------------------------------------------------------------
def test_names_with_script_are_escaped(evil):
    out = evil / "q8"
    _compile(evil / "m.onnx", out, target=INT8, calib=CalibOptions(source="random", samples=16, eval_samples=8))
    html = (out / "report.html").read_text()
    rep = json.loads((out / "report.json").read_text())
    assert any(EVIL in r["name"] for r in rep["layers"])
    assert "<script" not in html and "&lt;script&gt;" in html
    assert "&amp;amp" in html                                # '&' of the name escaped too
    p = parse(html)
    _self_contained(p)
    assert p.tables["layers"] == len(rep["layers"])
    assert any(EVIL in t for t in p.text)                    # the parsed text is the name as written
    assert p.svgs["sqnr"]["bar"] == sum(r.get("sqnr_db") is not None for r in rep["layers"])


def test_render_escapes_every_model_string():
    rep = {"dtype": "int8", "model": EVIL, "target": "x86",
           "summary": {"inputs": [{"name": EVIL, "shape": [1], "dtype": "float32"}], "outputs": []},
           "passes": [{"name": EVIL, "changed": True, "ops_before": 1, "ops_after": 1}],
           "ops": {"before": {EVIL: 1}, "after": {EVIL: 1}},
           "layers": [{"name": EVIL, "kind": EVIL, "shape": [1], "precision": "uint8", "scale": 0.1,
                       "zero_point": 0, "range": [0.0, 25.5], "calibrated_range": [0.0, 20.0],
                       "range_source": EVIL, "sqnr_db": 12.5}],
           "evaluation": {"samples": 1, "source": EVIL, "first_sample": 0, "held_back": True,
                          "outputs": [{"name": EVIL, "sqnr_db": 12.5}]}}
    html = render(rep)
    assert "<script" not in html
    p = parse(html)
    assert "script" not in p.tags
    assert p.svgs["sqnr"] == {"bar": 1} and p.svgs["ranges"] == {"range": 1, "calibrated": 1}
    assert p.tables["layers"] == 1
    rep["sensitivity"] = {"samples": 4, "data": EVIL, "rows": [
        {"layer": EVIL + str(i), "kind": EVIL, "gain_db": 3.0 - i, "sqnr_only_int8_db": None if i else 20.0,
         "sqnr_only_float_db": 30.0, "rank": i + 1} for i in range(3)]}
    rep["selection"] = {"budget": 25.0, "unit": "dB", "met": True, "score": 26.0, "baseline": 20.0,
                        "evaluations": 5, "float_layers": [EVIL], "float_layer_reasons": {EVIL: "budget: +6.00 dB",
                                                                                          "sm": EVIL}}
    html = render(rep)
    assert "<script" not in html
    p = parse(html)
    assert p.svgs["sensitivity"] == {"bar": 3} and p.tables["float-reasons"] == 2


def test_fp32_report_is_reproducible_and_timings_only_on_request(evil):
    outs = [evil / f"f32_{i}" for i in range(2)]
    for o in outs:
        _compile(evil / "m.onnx", o)
    for name in ("model.so", "manifest.json", "report.json", "report.html"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    timed = evil / "f32_t"
    with contextlib.redirect_stdout(io.StringIO()):           # time_passes prints its table on stdout
        _compile(evil / "m.onnx", timed, pipeline=PipelineOptions(time_passes=True))
    rep = json.loads((timed / "report.json").read_text())
    assert rep["passes"] and all(x["seconds"] >= 0 for x in rep["passes"])
    assert "<th>seconds</th>" in (timed / "report.html").read_text()
    assert "seconds" not in (outs[0] / "report.json").read_text()


# ---- headless Chromium ---------------------------------------------------------------------------
def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _browse(html: Path, png: Path) -> str:
    """Screenshot ``html`` to ``png``; returns the DOM after rendering."""
    exe = _chromium()
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,3000"]
    url = html.absolute().as_uri()
    subprocess.run(flags + [f"--screenshot={png}", url], check=True, capture_output=True, timeout=120)
    dom = subprocess.run(flags + ["--dump-dom", url], check=True, capture_output=True, timeout=120, text=True)
    return dom.stdout


def _non_blank(png: Path) -> float:
    """Fraction of pixels that are not (near) white."""
    from PIL import Image
    a = np.asarray(Image.open(png).convert("L"), np.float32)
    assert a.shape == (3000, 1200)
    return float((a < 200).mean())


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary (apt-get install chromium; scripts/setup.sh does)")
@needs_fashion
def test_chromium_renders_int8_and_fp32_reports(fashion, tmp_path):
    for out in fashion:
        rep = json.loads((out / "report.json").read_text())
        png = tmp_path / f"{out.name}.png"
        dom = _browse(out / "report.html", png)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        ink = _non_blank(png)
        assert ink > 0.01, f"{out.name}: screenshot nearly blank ({ink:.4f} dark pixels)"
        p = parse(dom)
        assert p.tables["layers"] == len(rep["layers"]) and p.tables["passes"] == len(rep["passes"])
        assert p.tags.get("svg", 0) == len(p.svgs) >= 1
        if rep["dtype"] == "int8":
            assert {"sqnr", "size", "tradeoff", "ranges", "histograms", "equalization", "sensitivity"} <= set(p.svgs)
            assert p.svgs["sqnr"]["bar"] == len(rep["layers"])
        print(f"{out.name}: {ink:.3f} of the screenshot pixels dark, {len(p.svgs)} SVGs, "
              f"{p.tables['layers']} layer rows")


def test_tradeoff_latency_columns_and_slow_int8_warnings_from_a_budget_report():
    """A report with a latency-aware selection (the fields qcompile writes with --min-sqnr): the
    trade-off plot has one point per search step, the chosen set and all float; the layer table
    gets the int8/float µs column; an int8 layer slower than float is a warning, a float one not."""
    from qcompiler.plan import report_html as H
    from qcompiler.plan.report_plots import tradeoff_points
    layers = [{"name": n, "kind": "QLinearConv", "shape": [1, 8, 4, 4], "precision": pr, "sqnr_db": 30.0}
              for n, pr in (("a", "int8"), ("b", "float"), ("c", "int8"))]
    rep = {"dtype": "int8", "layers": layers,
           "selection": {"budget": 36.0, "unit": "dB", "baseline": 33.0, "baseline_cost_ms": 0.30,
                         "score": 36.5, "cost_ms": 0.26, "float_layers": ["b"],
                         "steps": [{"size": 1, "score": 36.5, "cost": 0.26}]},
           "latency": {"method": "measured", "target": "x86", "float_latency_ms": 0.20,
                       "layers": [{"layer": "a", "int8_ms": 0.012, "float_ms": 0.006, "precision": "int8"},
                                  {"layer": "b", "int8_ms": 0.020, "float_ms": 0.010, "precision": "float"},
                                  {"layer": "c", "int8_ms": 0.003, "float_ms": 0.009, "precision": "int8"}],
                       "slower_than_float": ["a", "b"]}}
    xlab, ylab, pts, budget = tradeoff_points(rep)
    assert "latency" in xlab and budget == 36.0
    assert pts[0] == (0.30, 33.0, "all int8") and pts[1] == (0.26, 36.5, "chosen: 1 float")
    assert pts[2][0] == 0.20 and pts[2][1] == float("inf")
    layers[2].update(levels_99_99=9, range_source="calibrated (minmax)")     # outliers set c's range
    assert [w for w in H.warnings_of(rep) if "outliers" in w] == [
        "layer c: 99.99 % of its fp32 values fall on 9 of the 256 levels of its 8-bit grid: the calibrated "
        "range is set by outliers (a clipping --calib-method, percentile or mse, would spend the levels on the values)"]
    slow = [w for w in H.warnings_of(rep) if "slower than float" in w]
    assert slow == ["layer a: its int8 kernel is slower than float (12.0 µs vs 6.0 µs, measured on x86)"]
    p = parse(H.render(rep))
    assert p.svgs["tradeoff"] == {"point": 3}
    text = "".join(p.text)
    assert "int8 / float µs" in text and "12.0 / 6.0" in text and "3.0 / 9.0" in text

