"""Data-free quantization (Nagel et al. 2019): relu6-to-relu, equalize, absorb-bias, bias-correct
before per-tensor int8 weights, against plain per-tensor int8 (the int8 graph run by the
reference interpreter, fp32 by onnxruntime).

* synthetic MobileNetV2-like block whose depthwise BN has 100x larger γ (and β) on 1 channel in 8,
  compensated by the projection (the paper's Fig. 2 situation): plain per-tensor int8 collapses,
  equalize + bias-correct recovers (top-1 agreement with fp32 on random inputs);
* the acceptance numbers on fashion_mobilenet (calibrate x[:500], evaluate x[500:1000] of
  fashion_test.npz) and rapidocr-cls (32 / 128 synthetic text lines), measured by
  bench/bench_dfq.py exactly as ``qcompile --dtype int8 --per-tensor --no-equalize
  --bias-correction none`` vs ``--per-tensor --equalize --bias-correction analytic`` build them;
  printed with ``pytest -s``, the measured numbers in the docstrings.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.passes import PassContext, PassManager, run_passes
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.quant import sqnr_db

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_quantize_real as Q  # noqa: E402

HW = 8                        # the synthetic block's input side
CLASSES = 8
DFQ = "relu6-to-relu,equalize,absorb-bias,bias-correct"


def imbalanced_block(seed: int = 0, big: float = 100.0) -> onnx.ModelProto:
    """stem 3x3 -> expand 1x1 -> depthwise 3x3 -> project 1x1 -> Flatten -> Gemm, each conv with BN and
    ReLU6 (project: none). The depthwise BN's γ and β are ``big`` times larger on every 8th channel
    and the projection's weights for those channels ``big`` times smaller: the fp32 function is an
    ordinary one, but the folded depthwise weights and its output span 100x across channels."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def init(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
        return name

    def conv(x, cin, cout, k, g, name, act=True, gscale=None, wscale=None):
        w = rng.standard_normal((cout, cin // g, k, k)) * np.sqrt(2.0 / (cin // g * k * k))
        if wscale is not None:
            w = w * wscale.reshape(1, -1, 1, 1)
        init(name + "_w", w)
        nodes.append(helper.make_node("Conv", [x, name + "_w"], [name + "_c"], name=name, pads=[k // 2] * 4,
                                      group=g, kernel_shape=[k, k]))
        gamma, beta = rng.uniform(0.5, 1.5, cout), rng.normal(0.3, 0.3, cout)
        if gscale is not None:
            gamma, beta = gamma * gscale, beta * gscale
        stats = [init(name + "_g", gamma), init(name + "_b", beta),
                 init(name + "_m", rng.normal(0, 0.1, cout)), init(name + "_v", rng.uniform(0.5, 1.5, cout))]
        nodes.append(helper.make_node("BatchNormalization", [name + "_c"] + stats, [name + "_bn"]))
        if not act:
            return name + "_bn"
        nodes.append(helper.make_node("Relu", [name + "_bn"], [name + "_a"]))
        return name + "_a"

    c = 32
    scale = np.where(np.arange(c) % 8 == 0, big, 1.0)
    x = conv("input", 3, 16, 3, 1, "stem")
    x = conv(x, 16, c, 1, 1, "expand")
    x = conv(x, c, c, 3, c, "dw", gscale=scale)
    x = conv(x, c, 16, 1, 1, "project", act=False, wscale=1.0 / scale)
    init("fc_w", rng.standard_normal((CLASSES, 16 * HW * HW)) / HW)
    init("fc_b", np.zeros(CLASSES))
    nodes += [helper.make_node("Flatten", [x], ["flat"], axis=1),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "imbalanced", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                                  [1, 3, HW, HW])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    # centre the logits (each class's mean over random inputs to 0) so that the predicted class
    # depends on the input rather than on a constant offset
    xs = rng.standard_normal((64, 3, HW, HW)).astype(np.float32)
    sess = Q.ort_session(model)
    mean = np.mean([sess.run(None, {"input": xs[i:i + 1]})[0][0] for i in range(len(xs))], axis=0)
    (fc_b,) = [t for t in model.graph.initializer if t.name == "fc_b"]
    fc_b.CopyFrom(numpy_helper.from_array(-mean.astype(np.float32), "fc_b"))
    return model


def int8_outputs(g0, name, pipeline, calib, test, batch, per_channel=False):
    """fp32 of ``g0`` after ``pipeline`` (ORT) and the per-tensor int8 outputs (reference)."""
    g = g0.clone()
    ctx = PassContext(options={"quantize": QuantizeOptions(calib=calib, per_channel=per_channel,
                                                               bias_correction=False)})  # the passes alone
    if pipeline:
        PassManager(pipeline, ctx=ctx).run(g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PassManager("quantize", ctx=ctx).run(g)
    return Q.ref_batches(g, name, test, batch, [g.outputs[0].name])[0]


def measure(case, pipelines):
    B = case.batch
    g0, name = Q.import_batched(case.model, case.input_shape, B)
    run_passes(g0)
    fp32 = Q.ort_batches(Q.ort_session(Q._float_onnx(g0)), name, case.test, B)[0]
    calib = [{name: case.calib[s:s + B]} for s in range(0, len(case.calib), B)]
    res = {}
    for p in pipelines:
        out = int8_outputs(g0, name, p, calib, case.test, B)
        res[p] = {"sqnr": sqnr_db(fp32, out), "agree": 100 * float(np.mean(Q.top1(fp32) == Q.top1(out)))}
        if case.labels is not None:
            res[p]["top1"] = 100 * float(np.mean(Q.top1(out) == case.labels))
    res["fp32_top1"] = 100 * float(np.mean(Q.top1(fp32) == case.labels)) if case.labels is not None else None
    return res


def _report(name, res, capsys):
    with capsys.disabled():
        print(f"\n[{name}] per-tensor int8 weights" + (f", fp32 top-1 {res['fp32_top1']:.1f}%" if res["fp32_top1"] else ""))
        for p, r in res.items():
            if isinstance(r, dict):
                print(f"  {p or 'plain':<48} SQNR {r['sqnr']:6.2f} dB  agreement {r['agree']:5.1f}%"
                      + (f"  top-1 {r['top1']:.1f}%" if "top1" in r else ""))


def test_imbalanced_block_collapses_then_recovers(capsys):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((320, 3, 8, 8)).astype(np.float32)
    case = Q.Case("imbalanced", imbalanced_block(), (1, 3, 8, 8), x[:64], x[64:], None, batch=64)
    res = measure(case, ["", "relu6-to-relu,equalize", "relu6-to-relu,equalize,bias-correct", DFQ])
    _report("imbalanced block", res, capsys)
    assert res[""]["agree"] < 50
    assert res["relu6-to-relu,equalize,bias-correct"]["agree"] > 95
    assert res[DFQ]["agree"] > 95


ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import bench_dfq as BD  # noqa: E402

RECIPES = [r for r in BD.RECIPES if r[0] in (BD.BASELINE, BD.DFQ)]


@pytest.fixture(scope="module")
def measured():
    """bench_dfq's measurement of the plain and the DFQ recipe (what ``qcompile --dtype int8
    --per-tensor --no-equalize --bias-correction none`` and ``--per-tensor --equalize
    --bias-correction analytic`` make), per model, computed once."""
    cache = {}

    def get(name):
        if name not in cache:
            case = BD.CASES[name]()
            if case is None:
                pytest.skip(f"{name}: model or data not installed")
            cache[name] = BD.measure(case, RECIPES, ort=False)
        return cache[name]
    return get


def test_fashion_mobilenet_dfq_acceptance(measured, capsys):
    """Measured: SQNR 16.8 -> 28.5 dB (+11.7), top-1 94.4% -> 94.6%, fp32 95.0% (500 real test images)."""
    res = measured("fashion_mobilenet")
    with capsys.disabled():
        BD.print_table("fashion_mobilenet", res)
    assert res[BD.DFQ]["sqnr_db"] >= res[BD.BASELINE]["sqnr_db"] + 10
    assert res[BD.DFQ]["top1"] >= res["fp32"]["top1"] - 1


def test_rapidocr_cls_dfq_gain(measured, capsys):
    """Measured on 128 synthetic text lines: SQNR 10.6 -> 21.6 dB (+11.1), agreement 86% -> 98%, with
    HardSwish fused into the integer conv epilogue (before: 10.7 -> 19.6 dB, +8.9). Per-channel
    weights reach 17.3 dB, ORT's quantize_static 17.4."""
    res = measured("rapidocr-cls")
    with capsys.disabled():
        BD.print_table("rapidocr-cls", res)
    assert res[BD.DFQ]["sqnr_db"] >= res[BD.BASELINE]["sqnr_db"] + 8
    assert res[BD.DFQ]["agreement"] >= 93


def test_rapidocr_cls_10db(measured):
    """Issue #6's acceptance: +10 dB. Measured +11.1 dB (10.6 -> 21.6 dB) once HardSwish became a
    fused epilogue of the conv (qcompiler.quant.hardswish: one quantization point instead of the
    8-bit pre-activation plus the output); before it, +8.9 dB."""
    res = measured("rapidocr-cls")
    assert res[BD.DFQ]["sqnr_db"] >= res[BD.BASELINE]["sqnr_db"] + 10
