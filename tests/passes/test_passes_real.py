"""Every pass of the default pipeline, the pipeline itself and its expansion back to standard ONNX
preserve the outputs of real models: exported to ONNX before and after, run by onnxruntime,
max|diff| <= 1e-5 * max|ref| (real or realistic inputs from tests/realmodels.py).

rapidocr-det is compared on its logits (the input of its final Sigmoid): its probability map
saturates, and onnxruntime's own graph optimizations already move it by 1.8e-5 (its logits, up
to |134|, agree to 1e-6 relative after the default pipeline).
"""
from __future__ import annotations

import functools

import pytest
from ir_check import assert_close, ort_outputs
from realmodels import light_models, project_models, rapidocr_models

from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.passes import run_passes

LIGHT = {"light_squeezenet", "light_shufflenet", "light_inception_v1"}   # small model-zoo structures
MODELS = {m.name: m for m in rapidocr_models() + project_models() + [m for m in light_models() if m.name in LIGHT]}
PIPELINES = ["const-fold", "simplify", "dce", "cse", "fold-bn", "fuse-act", "default", "default,expand-fused"]


@functools.lru_cache(maxsize=None)
def reference(name: str):
    """(imported graph, feeds, ORT outputs of the exported graph before any pass)."""
    m = MODELS[name]
    g = import_onnx(m.load(), m.input_shapes)
    if name == "rapidocr-det":
        (sig,) = [op for op in g.ops if op.kind == "Sigmoid" and op.result is g.outputs[0]]
        g.outputs = [sig.operands[0]]
        run_passes(g, "dce")
    feeds = m.feeds()
    return g, feeds, ort_outputs(g, feeds)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_pass_preserves_outputs(name, pipeline):
    g, feeds, ref = reference(name)
    after = run_passes(g.clone(), pipeline)
    worst = assert_close(ref, ort_outputs(after, feeds))
    print(f"{name} [{MODELS[name].data}] {pipeline}: {len(g)} -> {len(after)} ops, max rel diff {worst:.2g}")


@pytest.mark.parametrize("name", ["rapidocr-cls", "svhnnet"])
def test_default_pipeline_removes_every_batchnorm(name):
    if name not in MODELS:
        pytest.skip(f"{name} is not available")
    g, _, _ = reference(name)
    after = run_passes(g.clone(), "default")
    assert g.op_histogram().get("BatchNormalization", 0) > 0
    assert "BatchNormalization" not in after.op_histogram()
    assert len(after) < len(g)
    ops = {op.name: op for op in after.ops}
    assert after.meta["bn_stats"] and set(after.meta["bn_stats"]) <= set(ops)     # keys name live ops
    for name, st in after.meta["bn_stats"].items():
        assert len(st["gamma"]) == len(st["var"]) == ops[name].result.shape[1]
    print(f"{name}: {len(g)} -> {len(after)} ops; before {g.op_histogram()}; after {after.op_histogram()}")
