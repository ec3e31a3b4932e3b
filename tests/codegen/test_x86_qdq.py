"""Pre-quantized ONNX models through the x86 fp32 build, against ONNX Runtime.

Small models (tests/qdq_models.py): integer results (ConvInteger, MatMulInteger, DynamicQuantizeLinear's
outputs) bit-exact; a QDQ conv within one output quantization step (the float conv sums in another
order than ORT's, which can flip a rounding at a half step). Real models (slow): ddddocr's
dynamic-int8 conv stack (cut before its com.microsoft DynamicQuantizeLSTM) and the Whisper-tiny
QDQ turn detector of pipecat's smart-turn v3.2."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

from qcompiler.codegen.lower import build_module
from qcompiler.codegen.target import TargetSpec
from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.passes import run_passes
from qdq_models import cases, ort_plain

CASES = cases()
SITE = os.path.dirname(os.path.dirname(onnx.__file__))


def run_x86(g, feeds, spec=None):
    vm = relax.VirtualMachine(build_module(g, spec or TargetSpec("x86", dtype="fp32")), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in g.inputs])
    return [o.numpy() for o in (list(out) if not isinstance(out, tvm.runtime.Tensor) else [out])]


@pytest.mark.parametrize("name", ["qdq_conv_per_channel_u8", "dynamic_conv_integer_u8", "static_conv_integer",
                                  "dynamic_conv_integer_i8_strided", "dynamic_conv_integer_grouped",
                                  "dynamic_conv_integer_grouped_u8", "dynamic_conv_integer_depthwise",
                                  "dynamic_conv_integer_one_channel",
                                  "dynamic_matmul_integer_per_column", "dynamic_matmul_integer_scalar_zp",
                                  "dynamic_matmul_integer_int8_weight", "static_matmul_integer_int8",
                                  "uint8_input_dequantize"])
def test_small_models_match_ort(name):
    m, feeds = CASES[name]
    g = import_onnx(m)
    run_passes(g)
    got = run_x86(g, feeds)
    for r, o in zip(ort_plain(m, feeds), got):
        assert o.shape == r.shape
        if name.startswith("qdq_conv"):
            assert np.abs(o - r).max() <= 0.1 + 1e-6          # one step of the output scale 0.1
        else:
            np.testing.assert_array_equal(o.astype(r.dtype), r)


INTEGER_CASES = ["dynamic_conv_integer_u8", "dynamic_conv_integer_i8_strided", "dynamic_conv_integer_grouped_u8",
                 "dynamic_conv_integer_one_channel", "static_conv_integer", "dynamic_matmul_integer_per_column",
                 "static_matmul_integer_int8"]


@pytest.mark.parametrize("isa", ["vnni256", "pmaddwd512", "avx2", "plain"])
@pytest.mark.parametrize("name", INTEGER_CASES)
def test_integer_ops_on_every_x86_isa(name, isa):
    """ConvInteger / MatMulInteger on each x86 int8 formulation (the host's VNNI-512 is the test
    above): vpdpbusd on ymm, vpmaddwd on zmm and ymm, plain loops; integer results bit-exact."""
    from test_x86_int8 import isa_spec
    m, feeds = CASES[name]
    g = import_onnx(m)
    run_passes(g)
    got = run_x86(g, feeds, isa_spec(isa))
    for r, o in zip(ort_plain(m, feeds), got):
        np.testing.assert_array_equal(o.astype(r.dtype), r)


def _site_file(*parts):
    p = os.path.join(SITE, *parts)
    if not os.path.exists(p):
        pytest.skip(f"{p} not installed")
    return p


def test_ddddocr_conv_integer_stack(tmp_path):
    """21 DynamicQuantizeLinear + ConvInteger layers up to the LSTM's input: measured 1.7e-4 max error
    on max|ref| 9.2 (float rounding of the Mul/Sigmoid epilogues)."""
    src = _site_file("ddddocr", "common_old.onnx")
    cut = str(tmp_path / "conv.onnx")
    onnx.utils.extract_model(src, cut, ["input1"], ["209"])
    rng = np.random.default_rng(0)
    x = np.full((1, 1, 64, 128), 0.9, np.float32)               # a light page with dark strokes
    for k in range(6):
        x[0, 0, 15:50, 10 + k * 19:14 + k * 19] = 0.1
        x[0, 0, 15 + k * 5:19 + k * 5, 8 + k * 19:22 + k * 19] = 0.15
    x += rng.normal(0, 0.02, x.shape).astype(np.float32)
    g = import_onnx(cut, {"input1": x.shape})
    run_passes(g)
    assert sum(op.kind == "ConvInteger" for op in g.ops) == 21
    (ref,) = ort_plain(onnx.load(cut), {"input1": x})
    (got,) = run_x86(g, {"input1": x})
    assert np.abs(got - ref).max() <= 1e-3 * np.abs(ref).max()


def whisper_features():
    """Log-mel features of a synthetic voiced signal (gliding pitch, two formants, syllable envelope,
    1.5 s of trailing silence), by pipecat's own numpy feature extractor."""
    path = _site_file("pipecat", "audio", "turn", "smart_turn", "_whisper_features.py")
    spec = importlib.util.spec_from_file_location("_whisper_features", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sr = 16000
    t = np.arange(8 * sr) / sr
    f0 = 120 + 20 * np.sin(2 * np.pi * 0.7 * t)
    ph = 2 * np.pi * np.cumsum(f0) / sr
    sig = sum((1 / k) * np.sin(k * ph) * (1 + 3 * np.exp(-((k * f0 - 700) / 200) ** 2)
                                          + 2 * np.exp(-((k * f0 - 1200) / 300) ** 2)) for k in range(1, 25))
    env = (0.5 + 0.5 * np.sin(2 * np.pi * 3.5 * t)) ** 2 * (t < 6.5)
    audio = (0.1 * sig * env + 0.003 * np.random.default_rng(1).standard_normal(t.size)).astype(np.float32)
    return mod.compute_whisper_log_mel_features(audio, do_normalize=True)[None].astype(np.float32)


def test_whisper_qdq_turn_detector():
    """78 Q / 114 DQ. Each QuantizeLinear and float op recomputed from ORT's own operands agrees with it
    (Q bit-exact, floats within 1e-5); through 4 transformer layers, float-sum-order rounding flips at
    half steps cascade (ORT's own ORT_ENABLE_ALL build differs from its ORT_DISABLE_ALL one by as much),
    so the final logit is compared in steps of its quantization: measured 5 (x86), 2 (numpy reference)."""
    path = _site_file("pipecat", "audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")
    feat = whisper_features()
    g = import_onnx(path, {"input_features": feat.shape})
    run_passes(g)
    (ref,) = ort_plain(onnx.load(path), {"input_features": feat})
    (got,) = run_x86(g, {"input_features": feat})
    sig = g.outputs[0].producer
    dq = sig.operands[0].producer
    assert sig.kind == "Sigmoid" and dq.kind == "DequantizeLinear"
    step = dq.operands[0].type.quant.scale[0]

    def logit(p):
        return np.log(p / (1 - p))
    assert abs(float(logit(got.ravel()[0]) - logit(ref.ravel()[0]))) <= 10 * step
