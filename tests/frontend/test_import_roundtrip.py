"""Every real model: import -> export -> onnxruntime agrees with onnxruntime on the original, on
the outputs and on a few intermediate tensors (names survive import); the imported graph verifies
and its text form is a print -> parse -> print fixed point.

Inputs are real where they exist (see tests/realmodels.py: fashion_test.npz, MNIST; rapidocr gets a
synthetic text-like image), seeded random otherwise. Tolerance: max|diff| <= 1e-5 * max|ref|.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import realmodels as rm
from qcompiler.frontend import export_onnx, import_onnx
from qcompiler.ir import parse_graph, print_graph

MODELS = rm.all_models()
BIG = {"light_vgg19", "light_bvlc_alexnet", "light_zfnet512"}      # 240-575 MB of (fake) weights
N_PROBES = 6


def _params():
    return [pytest.param(m, id=m.name, marks=[pytest.mark.slow] if m.name in BIG else []) for m in MODELS]


def _import(m: rm.RealModel):
    g = import_onnx(m.load(), m.input_shapes)
    g.verify()
    return g


def _probes(g, original: onnx.ModelProto) -> list[str]:
    """Up to N_PROBES op results spread over the graph that are also tensors of the original."""
    onnx_names = {o for n in original.graph.node for o in n.output}
    outs = {v.name for v in g.outputs}
    cands = [op.result.name for op in g.ops if len(op.results) == 1 and op.result.name in onnx_names
             and op.result.name not in outs and op.kind not in ("Identity", "Dropout")]
    if len(cands) <= N_PROBES:
        return cands
    return [cands[int(i)] for i in np.linspace(0, len(cands) - 1, N_PROBES)]


def test_there_are_real_models():
    names = {m.name for m in MODELS}
    assert {"rapidocr-cls", "rapidocr-det", "rapidocr-rec"} <= names
    assert sum(n.startswith("light_") for n in names) >= 9


@pytest.mark.parametrize("m", _params())
def test_export_runs_like_the_original(m):
    original = m.proto()
    g = _import(m)
    inits = {t.name for t in original.graph.initializer}
    assert [v.name for v in g.inputs] == [v.name for v in original.graph.input if v.name not in inits]
    assert [v.name for v in g.outputs] == [v.name for v in original.graph.output]

    exported = export_onnx(g)
    probes = _probes(g, original)
    typed = {v.name: v for v in exported.graph.value_info}
    exported.graph.output.extend(typed[p] for p in probes)
    data = exported.SerializeToString()
    onnx.checker.check_model(data)

    feeds = m.feeds()
    names = [o.name for o in original.graph.output] + probes
    ref = rm.ort_run(rm.with_outputs(original, probes), feeds, names)
    out = rm.ort_run(data, feeds, names)
    for name, r, o in zip(names, ref, out):
        assert r.shape == o.shape and r.dtype == o.dtype, name
        scale = float(np.abs(r).max()) if r.size else 0.0
        err = float(np.abs(r.astype(np.float64) - o).max()) if r.size else 0.0
        assert err <= 1e-5 * scale or err == 0.0, f"{m.name}: '{name}' differs by {err:.3g} (max|ref| {scale:.3g})"


@pytest.mark.parametrize("m", _params())
def test_text_round_trip_and_verifier(m):
    g = _import(m)
    text = print_graph(g)
    g2 = parse_graph(text)
    g2.verify()
    assert print_graph(g2) == text
    assert g.meta["opset"] >= 11
