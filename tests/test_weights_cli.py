"""``qcompile --weights int4`` (weight-only 4-bit, a float ``--dtype``): a build of the project
model from the command line, and the flags that cannot go with it, each one error line (what, where,
how to fix), exit code 2, nothing written."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from qcompiler.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realmodels as rm  # noqa: E402
from cli_errors import assert_refused  # noqa: E402

FASHION = str(rm.MODELS_DIR / "fashion_mobilenet.onnx")
DATA = str(rm.MODELS_DIR / "fashion_test.npz")

BAD = {
    "int8 dtype": (["--dtype", "int8", "--calib", DATA, "--weights", "int4"], "--weights int4 keeps the activations float"),
    "fp8 dtype": (["--dtype", "fp8", "--calib", DATA, "--weights", "int4"], "--dtype fp8 quantizes them"),
    "cuda": (["--target", "cuda", "--weights", "int4"], "no CUDA int4 kernels"),
    "block 48": (["--weights", "int4", "--weight-block", "48"], "--weight-block 48: blocks are"),
    "block alone": (["--weight-block", "32"], "--weight-block sets the weight-only quantization, and there is none"),
    "symmetric alone": (["--weight-symmetric"], "--weight-symmetric sets the weight-only quantization"),
    "scale dtype alone": (["--weight-scale-dtype", "fp16"], "--weight-scale-dtype sets the weight-only"),
    "gptq without calib": (["--weights", "int4", "--weight-rounding", "gptq"], "--weight-rounding gptq fits the rounding"),
    "gptq random": (["--weights", "int4", "--weight-rounding", "gptq", "--calib", "random"], "--calib random is not"),
    "sparsity": (["--weights", "int4", "--sparsity", "0.5"], "--sparsity prunes dense weights"),
    "int8 weights": (["--weights", "int8"], "invalid choice"),
    "scale bf16": (["--weights", "int4", "--weight-scale-dtype", "bf16"], "invalid choice"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_weights_flags(tmp_path, capsys, case):
    assert_refused(tmp_path, capsys, FASHION, *BAD[case])


def test_compile_int4_weights(tmp_path):
    """fashion_mobilenet: its pointwise convs and classifier Gemm 4-bit, its depthwise and first
    convs float (one input channel a group): the artifact runs, the report records each layer."""
    out = tmp_path / "fm4"
    assert main(["compile", FASHION, "--weights", "int4", "--weight-block", "32", "-o", str(out), "-q"]) == 0
    rep = json.loads((out / "report.json").read_text())
    import numpy as np

    import qcompiler as qc
    x = np.load(DATA)["x"][:2].astype(np.float32)
    y = qc.load(out)(x[:1])[0]
    assert y.shape[-1] == 10 and np.all(np.isfinite(y))
    assert rep["weights"]["scheme"]["weights"].startswith("uint4 asymmetric, blocks of 32")
    kinds = [v["kind"] for v in rep["weights"]["layers"].values()]
    assert "MatMulNBits" in kinds and kinds.count("ConvNBits") >= 10
    assert rep["size"]["params_bytes"] < 0.3 * rep["size"]["params_fp32_bytes"]


def test_keep_float_by_kind(tmp_path):
    """--keep-float op:TYPE (and names) as for int8: op:Gemm leaves the classifier float."""
    out = tmp_path / "fm4"
    assert main(["compile", FASHION, "--weights", "int4", "--keep-float", "op:Gemm", "-o", str(out), "-q"]) == 0
    layers = json.loads((out / "report.json").read_text())["weights"]["layers"]
    assert [v for v in layers.values() if v["kind"] in ("Gemm", "FusedGemm")][0]["reason"] == "kept float (--keep-float)"
    assert not any(v["kind"] == "MatMulNBits" for v in layers.values())
