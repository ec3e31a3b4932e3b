"""``--weight-rounding gptq`` in the quantize pass: on the trained fashion_mobilenet with its real
test images, GPTQ's weights lie on the same grid as round-to-nearest's (same scales, the integers
in range, only some of them moved), the layers it chose have less output error than
round-to-nearest's on held-back images, and the build records the choice; GPTQ is dropped where
the whole model loses by it (uspsnet). The flags that cannot have it: tests/test_cli.py's table."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from qcompiler.api import import_onnx
from qcompiler.ir.types import dequantize
from qcompiler.passes import PassContext, PassManager, run_passes
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.quant.gptq import layer_grams, rounding_loss

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import realmodels as rm  # noqa: E402

FASHION = str(rm.MODELS_DIR / "fashion_mobilenet.onnx")
DATA = str(rm.MODELS_DIR / "fashion_test.npz")


def quantized(x, rounding: str, fp8: str | None = None):
    """(float graph after the default passes, quantized graph) of fashion_mobilenet calibrated on
    the first 32 test images."""
    g = import_onnx(FASHION)
    run_passes(g)
    name = g.inputs[0].name
    calib = [{name: x[i:i + 1]} for i in range(32)]
    ctx = PassContext(options={"quantize": QuantizeOptions(calib=calib, weight_rounding=rounding, fp8=fp8)})
    PassManager("quantize", ctx=ctx).run(g)
    return ctx.data["quantize.float_graph"], g


@pytest.fixture(scope="module")
def builds():
    data = rm.fashion_test()
    if data is None or not Path(FASHION).exists():
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz not present")
    x = data[0]
    float_graph, nearest = quantized(x, "nearest")
    _, gptq = quantized(x, "gptq")
    return x, float_graph, nearest, gptq


def weights(g) -> dict:
    """QLinear op name -> its quantized weight constant."""
    return {op.name: op.operands[1] for op in g.ops if op.kind in ("QLinearConv", "QLinearGemm")}


def test_gptq_moves_integers_on_nearests_grid(builds):
    """Every conv/gemm keeps round-to-nearest's weight params (GPTQ changes integers, not scales);
    its integers stay in [-127, 127]; where it chose GPTQ some integers differ, elsewhere none."""
    _, _, nearest, gptq = builds
    wn, wg = weights(nearest), weights(gptq)
    assert wn.keys() == wg.keys() and len(wn) >= 10
    layers = gptq.meta["quant"]["layers"]
    chosen = [n for n in wg if layers[n]["rounding"]["rounding"] == "gptq"]
    assert chosen, "GPTQ was chosen for no layer"
    for n in wn:
        assert wn[n].type.quant == wg[n].type.quant, n
        q = wg[n].data.astype(np.int64)
        assert np.abs(q).max() <= 127, n
        moved = np.count_nonzero(q != wn[n].data)
        assert (moved > 0) == (n in chosen), (n, moved)
    scheme = gptq.meta["quant"]["scheme"]["weight_rounding"]
    db = scheme.pop("calibration_sqnr_db")
    assert scheme == {"method": "gptq", "applied": True, "layers": len(wg), "gptq": len(chosen),
                      "nearest": len(wg) - len(chosen)}
    assert db["gptq"] > db["nearest"], db          # kept because the calibration outputs say so
    assert "weight_rounding" not in nearest.meta["quant"]["scheme"]


def test_chosen_layers_have_less_output_error_on_held_back_images(builds):
    """On 32 test images the calibration never saw, Σ over the layers GPTQ chose of the output
    error energy ||X (w − ŵ)ᵀ||² (X: the layer's im2col rows in the float model) is below
    round-to-nearest's, by at least a quarter (measured: 0.49 of it)."""
    x, float_graph, nearest, gptq = builds
    name = float_graph.inputs[0].name
    layers = {op.name: op for op in float_graph.ops if op.kind in ("Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul")}
    meta = gptq.meta["quant"]["layers"]
    chosen = [n for n in weights(gptq) if meta[n]["rounding"]["rounding"] == "gptq"]
    grams = layer_grams(float_graph, [{name: x[i:i + 1]} for i in range(500, 532)], [layers[n] for n in chosen],
                        rows_per_column=None)
    err = {"nearest": 0.0, "gptq": 0.0}
    for n in chosen:
        w = layers[n].operands[1].data.astype(np.float64)
        if layers[n].kind not in ("Conv", "FusedConv"):
            w = w.T if layers[n].kind == "MatMul" or not layers[n].attrs.get("transB", 0) else w
        h = grams[n].h
        for k, g in (("nearest", nearest), ("gptq", gptq)):
            c = weights(g)[n]
            w_hat = dequantize(c.data, c.type.quant).astype(np.float64)
            err[k] += rounding_loss(w.reshape(h.shape[0], -1, h.shape[-1]), w_hat.reshape(h.shape[0], -1, h.shape[-1]),
                                    h, 0.0).sum()
    assert err["gptq"] <= 0.75 * err["nearest"], err


def test_gptq_is_dropped_where_the_whole_model_loses_by_it():
    """uspsnet on 32 MNIST digits resized to 16x16: every layer passes its own held-out check, but
    the whole model, each calibration digit run with the weights GPTQ fitted on the other half,
    is worse with GPTQ (measured 41.75 against 43.16 dB): the build keeps round-to-nearest's
    integers, and says so."""
    digits = rm._digits_resized(32, 16)
    path = rm.MODELS_DIR / "uspsnet.onnx"
    if digits is None or not path.exists():
        pytest.skip("models/uspsnet.onnx or the MNIST digits not present")
    x = ((digits - 0.2471) / 0.2994)[:, None].astype(np.float32)
    graphs = {}
    for rounding in ("nearest", "gptq"):
        g = import_onnx(str(path))
        run_passes(g)
        calib = [{g.inputs[0].name: x[i:i + 1]} for i in range(32)]
        PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(
            calib=calib, weight_rounding=rounding)})).run(g)
        graphs[rounding] = g
    scheme = graphs["gptq"].meta["quant"]["scheme"]["weight_rounding"]
    assert scheme["applied"] is False and scheme["gptq"] >= 1, scheme
    db = scheme["calibration_sqnr_db"]
    assert db["nearest"] > db["gptq"] + 0.5, db
    wn, wg = weights(graphs["nearest"]), weights(graphs["gptq"])
    for n in wn:
        np.testing.assert_array_equal(wg[n].data, wn[n].data, err_msg=n)


def test_fp8_gptq_weights_are_float8_values(builds):
    """fp8: GPTQ rounds onto the float8 grid of round-to-nearest's scales (each stored weight times
    its channel's scale dequantizes to a float8 value times that scale)."""
    x = builds[0]
    _, g = quantized(x, "gptq", fp8="e4m3")
    layers = g.meta["quant"]["layers"]
    assert any(v.get("rounding", {}).get("rounding") == "gptq" for v in layers.values())
    for c in weights(g).values():
        assert c.type.quant.storage == "float8_e4m3fn"
        assert np.all(np.isfinite(c.data.astype(np.float32)))
