"""``qcompile verify`` and ``--export-qdq`` on an fp8 build of a trained model (fashion_mobilenet,
calibrated on 128 of its test images, checked on 128 others):

* ``qcompile M.onnx --dtype fp8 --calib C --debug-layers --export-qdq Q.onnx`` builds, and
  ``qcompile verify OUT --data X`` passes as for int8: every float8 value, each kernel alone on ONNX
  Runtime's inputs, within one float8 step; the same with ``--qdq Q.onnx`` (the file the build wrote);
* that file opens in ONNX Runtime (opset 19, float8e4m3fn zero points) and its output is the
  artifact's to within the float32 rounding of the sums carried on;
* the artifact's stored float8 values are the reference interpreter's (on the quantized IR) but
  where a float32 sum of another order lands on the other side of a rounding boundary.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import realmodels as rm
from qcompiler.cli import main
from qcompiler.ir.parser import parse_graph
from qcompiler.quant import reference, sqnr_db
from qcompiler.quant.fp8 import ulps
from qcompiler.runtime import read_manifest
from qcompiler.verify import HostRunner, unblock


@pytest.fixture(scope="module")
def fashion_fp8(tmp_path_factory):
    data = rm.fashion_test()
    model = rm.MODELS_DIR / "fashion_mobilenet.onnx"
    if data is None or not model.exists():
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz not present")
    tmp = tmp_path_factory.mktemp("fashion_fp8")
    x, _ = data
    np.save(tmp / "calib.npy", x[:128])
    np.save(tmp / "test.npy", x[256:384])
    out = tmp / "OUT"
    assert main([str(model), "--dtype", "fp8", "--calib", str(tmp / "calib.npy"), "--calib-samples", "128",
                 "--debug-layers", "--export-qdq", str(tmp / "q.onnx"), "-o", str(out), "-q"]) == 0
    return out, tmp


def _verify(capsys, *argv) -> tuple[int, dict]:
    code = main(["verify", *map(str, argv), "--json"])
    text, _ = capsys.readouterr()
    return code, json.loads(text)


def test_verify_passes_on_an_fp8_build(capsys, fashion_fp8):
    out, tmp = fashion_fp8
    assert read_manifest(out)["target"]["dtype"] == "fp8"
    for extra in ((), ("--qdq", tmp / "q.onnx")):
        code, rep = _verify(capsys, out, "--data", tmp / "test.npy", *extra)
        assert code == 0 and rep["passed"], rep["verdict"]
        assert rep["dtype"] == "fp8" and rep["samples"] == 128
        layers = rep["layers"]
        assert len(layers) >= 20 and all(r["max_lsb"] is not None and r["max_lsb"] <= 1 for r in layers)
        assert all(r["within1"] >= 0.999 for r in rep["outputs"])


def test_exported_qdq_runs_in_onnxruntime(fashion_fp8):
    import onnxruntime as ort
    out, tmp = fashion_fp8
    m = onnx.load(str(tmp / "q.onnx"))
    assert m.opset_import[0].version == 19
    assert {t.data_type for t in m.graph.initializer if t.name.endswith("zero_point")} == \
        {onnx.TensorProto.FLOAT8E4M3FN}
    sess = ort.InferenceSession(str(tmp / "q.onnx"), providers=["CPUExecutionProvider"])
    from qcompiler.runtime import load
    art = load(out)
    x = np.load(tmp / "test.npy")[:32]
    ours = np.concatenate([art(x[i:i + 1])[0] for i in range(len(x))])
    theirs = np.concatenate([sess.run(None, {sess.get_inputs()[0].name: x[i:i + 1]})[0] for i in range(len(x))])
    assert sqnr_db(theirs, ours) > 35, sqnr_db(theirs, ours)
    assert np.mean(ours.argmax(-1) == theirs.argmax(-1)) >= 0.95


def test_stored_float8_values_are_the_references(fashion_fp8):
    """debug's float8 values against the reference interpreter on the artifact's own IR (model.qir),
    chained from the same input: >= 99 % of the codes equal (the rest are float32 sums of another
    order next to a rounding boundary, and what they carry on), and the output within 35 dB."""
    out, tmp = fashion_fp8
    g = parse_graph((out / "model.qir").read_text())
    dbg = read_manifest(out)["debug"]["outputs"]
    x = np.load(tmp / "test.npy")[:4]
    got = HostRunner(out).call(["main", "debug"], [[x[i:i + 1]] for i in range(len(x))])
    equal, n = 0, 0
    for i in range(len(x)):
        ref = reference.run_values(g, {g.inputs[0].name: x[i:i + 1]})
        for k, d in enumerate(dbg):
            v = g.value(d["name"])
            if v.type.quant is None:
                continue
            ours = unblock(got["debug"][i][k], tuple(d["shape"]))
            steps = ulps(ours, ref[d["name"]], v.dtype)
            equal, n = equal + int((steps == 0).sum()), n + steps.size
        assert sqnr_db(ref[g.outputs[0].name], got["main"][i][0]) > 35
    assert equal / n >= 0.99, equal / n
