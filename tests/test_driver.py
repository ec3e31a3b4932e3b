"""The compile driver (qcompiler.driver): the library call and the CLI build the same artifact,
the calibration source hands out consecutive windows of one stream, and contradicting options
are refused before any work."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

import qcompiler as qc
from qcompiler.cli import main
from qcompiler.codegen.target import TargetSpec
from qcompiler.driver import CalibOptions, CalibSource, CompileOptions, ModelSource, compile, load_model
from qcompiler.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION = os.path.join(ROOT, "models", "fashion_mobilenet.onnx")
FASHION_DATA = os.path.join(ROOT, "models", "fashion_test.npz")


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_library_and_cli_write_the_same_int8_artifact(tmp_path, capsys):
    opts = CompileOptions(target=TargetSpec("x86", dtype="int8"),
                          calib=CalibOptions(source=FASHION_DATA, samples=16, eval_samples=8), quiet=True)
    art = compile(FASHION, tmp_path / "lib", opts)
    rc = main([FASHION, "--dtype", "int8", "--calib", FASHION_DATA, "--calib-samples", "16",
               "--eval-samples", "8", "-o", str(tmp_path / "cli"), "-q"])
    assert rc == 0
    for f in ("model.so", "report.json", "manifest.json"):
        assert _sha(art.path / f) == _sha(tmp_path / "cli" / f), f
    assert art.report["calibration"]["samples"] == 16


def test_public_compile_returns_an_artifact_that_loads_and_matches_onnxruntime(tmp_path):
    import onnxruntime as ort
    art = qc.compile(FASHION, tmp_path / "fp32")
    x = np.load(FASHION_DATA)["x"][:1].astype(np.float32)
    (name,) = [i.name for i in ort.InferenceSession(FASHION).get_inputs()]
    ref = ort.InferenceSession(FASHION).run(None, {name: x})[0]
    got = qc.load(art)(x)[0]
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_calibration_evaluation_and_selection_are_consecutive_windows_of_the_file():
    g = load_model(ModelSource(FASHION))
    xs = np.load(FASHION_DATA)["x"]
    src = CalibSource.open(CalibOptions(source=FASHION_DATA, samples=10, eval_samples=6), g.inputs,
                           sensitivity_samples=5)
    cal = np.concatenate([f[g.inputs[0].name] for f in src.calibration()])
    ev = src.evaluation()
    sel = src.selection(ev)
    assert (ev.skip, ev.take, sel.skip, sel.take) == (10, 6, 16, 5)
    np.testing.assert_array_equal(cal, xs[:10].astype(cal.dtype).reshape(cal.shape))
    seen = np.concatenate([f[g.inputs[0].name] for f in sel.dataset])
    np.testing.assert_array_equal(seen[16:21], xs[16:21].astype(seen.dtype).reshape(seen[16:21].shape))


def test_random_calibration_evaluates_on_the_continued_random_stream():
    g = load_model(ModelSource(FASHION))
    src = CalibSource.open(CalibOptions(source="random", samples=500, eval_samples=4), g.inputs)
    ev = src.evaluation()
    assert src.calibration() is None and ev.random and (ev.skip, ev.take) == (64, 4)   # 64: the random cap
    assert src.selection(ev) is None


@pytest.mark.parametrize("opts, flag", [
    (CompileOptions(target=TargetSpec("x86", dtype="fp32", float_dtype="fp16")), "--float-dtype"),
    (CompileOptions(export_qdq="q.onnx"), "--export-qdq"),
    (CompileOptions(target=TargetSpec("x86", dtype="fp32", debug_layers=True)), "--debug-layers"),
    (CompileOptions(calib=CalibOptions(eval_path="x.npz")), "--eval"),
    (CompileOptions(target=TargetSpec("x86", dtype="int8")), "--calib"),
])
def test_contradicting_options_are_refused_before_any_output(tmp_path, opts, flag):
    with pytest.raises(UserError, match=flag.lstrip("-").split("-")[0]) as e:
        compile(FASHION, tmp_path / "out", opts)
    assert flag in str(e.value)
    assert not (tmp_path / "out").exists()
