"""qcompile's data-free quantization flags: ``--equalize/--no-equalize`` and ``--bias-correction
none|analytic|empirical`` (qcompiler/plan/dfq.py): the passes they insert, bad values as one line
with exit code 2, and the equalization report (SVG + JSON) written into the artifact."""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest

from qcompiler.cli import main
from qcompiler.errors import UserError
from qcompiler.plan import dfq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_dfq import imbalanced_block  # noqa: E402

PIPE = ["fold-bn", "fuse-act", "quantize"]


def test_recipe_inserts_the_passes_before_quantize():
    assert dfq.dfq_recipe(PIPE, equalize=True, bias_correction="analytic") == (
        ["fold-bn", "fuse-act", "relu6-to-relu", "equalize", "absorb-bias", "bias-correct", "quantize"], False)
    assert dfq.dfq_recipe(PIPE, equalize=False, bias_correction="empirical") == (PIPE, True)
    assert dfq.dfq_recipe(PIPE, equalize=False, bias_correction="none") == (PIPE, False)
    assert dfq.dfq_recipe(["fold-bn"], equalize=True, bias_correction="none") == (
        ["fold-bn", "relu6-to-relu", "equalize", "absorb-bias"], False)
    assert dfq.equalize_default(per_channel=False) and not dfq.equalize_default(per_channel=True)
    with pytest.raises(UserError, match="needs the quantize pass"):
        dfq.dfq_recipe(["fold-bn"], equalize=False, bias_correction="analytic")


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    d = tmp_path_factory.mktemp("dfq")
    onnx.save(imbalanced_block(), d / "block.onnx")
    x = np.random.default_rng(0).standard_normal((32, 3, 8, 8)).astype(np.float32)
    np.save(d / "calib.npy", x)
    return d


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,msg", [
    (["--bias-correction", "sometimes"], "invalid choice: 'sometimes'"),
    (["--equalize=yes"], "ignored explicit argument"),
    (["--bias-correction"], "expected one argument"),
])
def test_bad_values_are_one_line_and_exit_2(block, tmp_path, capsys, argv, msg):
    code, out, err = run(capsys, block / "block.onnx", "--dtype", "int8", "--calib", block / "calib.npy",
                         "-o", tmp_path / "out", *argv)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_bias_correction_without_quantize_is_refused(block, tmp_path, capsys):
    code, _, err = run(capsys, "convert", block / "block.onnx", "-o", tmp_path / "o.onnx",
                       "--bias-correction", "analytic")
    assert code == 2 and "analytic bias correction needs the quantize pass" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o.onnx").exists()


def test_convert_equalize_runs_the_passes(block, tmp_path, capsys):
    code, _, err = run(capsys, "convert", block / "block.onnx", "-o", tmp_path / "o.onnx", "--equalize")
    assert code == 0 and "relu6-to-relu, equalize" in err


def test_per_tensor_compile_writes_the_equalization_report(block, tmp_path, capsys):
    """--per-tensor turns equalize on (the default); the artifact holds equalization.json (the
    ranges the pass recorded, most imbalanced first) and an SVG with one bar per channel before and
    after for the 4 most imbalanced layers; the manifest lists both."""
    out = tmp_path / "out"
    code, _, err = run(capsys, block / "block.onnx", "--dtype", "int8", "--per-tensor", "--calib",
                       block / "calib.npy", "--bias-correction", "analytic", "--eval-samples", "0", "-o", out, "-q")
    assert code == 0, err
    rep = json.loads((out / "equalization.json").read_text())
    layers = rep["layers"]
    assert layers[0]["name"] == "dw"                          # the block's 100x-imbalanced depthwise conv
    assert layers[0]["ratio_before"] > 50 and layers[0]["ratio_after"] < layers[0]["ratio_before"] / 10
    ratios = [ly["ratio_before"] for ly in layers]
    assert ratios == sorted(ratios, reverse=True)
    for ly in layers:
        np.testing.assert_allclose(max(ly["before"]) / min(ly["before"]), ly["ratio_before"], rtol=1e-3)
    svg = ET.fromstring((out / "equalization.svg").read_bytes())
    bars = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect") if e.get("fill") in ("#b0b0b0", "#2a6fdb")]
    shown = layers[:4]
    assert len(bars) == 2 * sum(ly["channels"] for ly in shown) + 2          # + the two legend swatches
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert {"equalization.json", "equalization.svg"} <= set(files)


def test_per_channel_compile_has_no_equalization_by_default(block, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run(capsys, block / "block.onnx", "--dtype", "int8", "--calib", block / "calib.npy",
                       "--eval-samples", "0", "-o", out, "-q")
    assert code == 0, err
    assert not (out / "equalization.svg").exists()
