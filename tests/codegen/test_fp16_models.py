"""fp16 on x86 for every real model: max error <= 1e-2 * max|ref| against ONNX Runtime fp32 on the
original ONNX file, and the same top-1 class as ONNX Runtime on real labelled data
(Fashion-MNIST test images for fashion_mobilenet, MNIST digits for mnistnet/uspsnet/svhnnet:
four batch-1 samples each; the rapidocr models on their synthetic text image, the detector at
320x320). The graph goes through the default pass pipeline first, as the CLI does.

Known misses (xfail, not strict): rapidocr-det and rapidocr-rec store every activation and weight
in fp16 and land at ~6.6e-2 and ~2.0e-2 * max|ref| (after the default passes); no storage rule
tried so far brings the detector under 1e-2 (see qcompiler/codegen/lower.py, "Precision").
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import qcompiler
from qcompiler.codegen.lower import build_module
from qcompiler.codegen.target import TargetSpec
from realmodels import assert_close_to_ort, ort_run, project_models, rapidocr_models

MODELS = {m.name: m for m in rapidocr_models() + project_models()}
LABELLED = {"fashion_mobilenet", "mnistnet", "uspsnet", "svhnnet"}
KNOWN_MISS = {"rapidocr-det": "fp16 storage everywhere: ~6.6e-2 * max|ref| on the synthetic page",
              "rapidocr-rec": "fp16 storage everywhere: ~2e-2 * max|ref|"}
TOL = 1e-2


def _params():
    out = []
    for n in sorted(MODELS):
        marks = [pytest.mark.xfail(reason=KNOWN_MISS[n], strict=False)] if n in KNOWN_MISS else []
        out.append(pytest.param(n, marks=marks))
    return out or [pytest.param("none", marks=pytest.mark.skip("no real model present"))]


@pytest.mark.parametrize("name", _params())
def test_fp16_matches_onnxruntime_fp32(name):
    m = MODELS[name]
    g = qcompiler.import_onnx(m.load(), m.input_shapes)
    qcompiler.run_passes(g, "default")
    vm = relax.VirtualMachine(build_module(g, TargetSpec("x86", dtype="fp16")), tvm.cpu())
    for seed in range(4 if name in LABELLED else 1):
        feeds = m.feeds(seed)
        out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in g.inputs])
        got = [o.numpy() for o in (list(out) if not isinstance(out, tvm.runtime.Tensor) else [out])]
        assert_close_to_ort(f"{name} sample {seed}", got, ort_run(m.load(), feeds), TOL, name in LABELLED)
