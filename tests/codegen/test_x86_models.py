"""Real models through the x86 code generator (fp32, and fp16 for a few), against onnxruntime on
the original ONNX file: max error <= 1e-4 * max|ref| in fp32, <= 2e-2 * max|ref| in fp16 (plus
the same top-1 class for classifiers).

Which models run by default (the whole x86 codegen test set must stay under ~6 minutes on two
cores) and which are ``slow`` is set in SLOW below, from compile times measured on our 2-core
machine (lower + tvm.compile, seconds): rapidocr-cls 12-20, rapidocr-rec 15-25, rapidocr-det
(320x320) 10-35, light_squeezenet 11, light_shufflenet 7, light_bvlc_alexnet 6;
slow: light_densenet121 25-43, light_resnet50 19-23, light_inception_v1 14, light_inception_v2 30,
light_vgg19 18, light_zfnet512 9 (the big-weight models mostly spend their time in packing
weights and running: VGG19 takes ~1 s per inference).
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from qcompiler.codegen.lower import build_module
from qcompiler.codegen.target import TargetSpec
from qcompiler.frontend.onnx_import import import_onnx
from realmodels import all_models, ort_run

MODELS = {m.name: m for m in all_models() if not m.name.endswith("_qat")}
# (a pre-quantized model's float build rounds its QuantizeLinears after float sums in another order
# than ONNX Runtime's: compared in quantization steps in test_prequantized_int8.py)
SLOW = {"light_densenet121", "light_resnet50", "light_inception_v1", "light_inception_v2", "light_vgg19",
        "light_zfnet512"}
FP16 = ["rapidocr-cls", "mnistnet", "fashion_mobilenet"]


def _params(names):
    return [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in names]


def run_model(m, dtype: str):
    g = import_onnx(m.load(), m.input_shapes)
    ex = build_module(g, TargetSpec("x86", dtype=dtype))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    feeds = m.feeds()
    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in g.inputs])
    got = [o.numpy() for o in (list(out) if not isinstance(out, tvm.runtime.Tensor) else [out])]
    return got, ort_run(m.load(), feeds)


def _check(got, refs, tol, name):
    assert len(got) == len(refs)
    for g, r in zip(got, refs):
        assert g.shape == r.shape
        err = float(np.abs(g.astype(np.float64) - r).max())
        scale = max(float(np.abs(r).max()), 1e-6)
        assert err <= tol * scale, f"{name}: max error {err:.3g} vs max|ref| {scale:.3g}"
        if r.ndim == 2 and r.shape[1] > 1 and np.ptp(r) > 0:      # a classifier: same top-1
            assert (g.argmax(1) == r.argmax(1)).all(), f"{name}: top-1 differs"


@pytest.mark.parametrize("name", _params(sorted(MODELS)))
def test_model_fp32(name):
    got, refs = run_model(MODELS[name], "fp32")
    _check(got, refs, 1e-4, name)


@pytest.mark.parametrize("name", [n for n in FP16 if n in MODELS] or
                         [pytest.param("none", marks=pytest.mark.skip("no fp16 model present"))])
def test_model_fp16(name):
    got, refs = run_model(MODELS[name], "fp16")
    _check(got, refs, 2e-2, name)
