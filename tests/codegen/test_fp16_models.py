"""fp16 on x86 for every real model: max error <= 1e-2 * max|ref| against ONNX Runtime fp32 on the
original ONNX file, and the same top-1 class as ONNX Runtime on real labelled data
(Fashion-MNIST test images for fashion_mobilenet, MNIST digits for mnistnet/uspsnet/svhnnet:
four batch-1 samples each; the rapidocr models on their synthetic text image, the detector at
320x320). The graph goes through the default pass pipeline first, as the CLI does.

Known misses (xfail, not strict): rapidocr-det and rapidocr-rec store every activation and weight
in fp16 and land at ~6.6e-2 and ~2.0e-2 * max|ref| (after the default passes); no storage rule
tried so far brings the detector under 1e-2 (see qcompiler/codegen/lower.py, "Precision"). The
last test shows that the original models with only their weights rounded to fp16, run in ONNX
Runtime with float32 activations and arithmetic, already miss 1e-2: no fp16 artifact can meet it
on these two models.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper
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


def _weights_rounded_to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose float weights (initializers and Constant tensors of more than one
    element, within fp16's range) are rounded to float16 and stored back as float32: every
    activation and all arithmetic stay float32."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    tensors = list(out.graph.initializer) + [n.attribute[0].t for n in out.graph.node
                                             if n.op_type == "Constant" and n.attribute[0].name == "value"]
    for t in tensors:
        if t.data_type != onnx.TensorProto.FLOAT:
            continue
        a = numpy_helper.to_array(t)
        if a.size > 1 and float(np.abs(a).max()) < 60000.0:
            t.CopyFrom(numpy_helper.from_array(a.astype(np.float16).astype(np.float32), t.name))
    return out


@pytest.mark.parametrize("name", sorted(KNOWN_MISS))
def test_fp16_weights_alone_already_miss_on_rapidocr_det_rec(name):
    """Why the two xfails are the models', not the kernels': in ONNX Runtime, the *original* model
    with nothing but its weights rounded to fp16 (activations, BatchNorm arithmetic and every sum
    in float32) already lands outside 1e-2 * max|ref| (det ~2.5e-2, rec ~1.7e-2 on these inputs).
    Any artifact that stores its weights in fp16 inherits that error; ours (activations fp16 too)
    is at ~6.6e-2 / ~2e-2."""
    if name not in MODELS:
        pytest.skip(f"{name} not installed")
    m = MODELS[name]
    proto = m.proto()
    feeds = m.feeds(0)
    (ref,), (y,) = ort_run(proto, feeds), ort_run(_weights_rounded_to_fp16(proto), feeds)
    err = float(np.abs(y.astype(np.float64) - ref).max()) / float(np.abs(ref).max())
    print(f"{name}: fp16 weights alone, ORT: max error {err:.2e} * max|ref|")
    assert err > TOL
