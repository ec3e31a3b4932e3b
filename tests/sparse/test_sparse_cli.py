"""qcompile --sparsity: bad values are one UserError line with exit code 2 and nothing written; on the
trained fashion_mobilenet with its real labelled test data, pruning 50 % + int8 reports per-layer
sparsity, formats, sizes and the measured accuracy drop (no fine-tuning: the drop is reported, and
asserted only loosely), and 2:4 reports what the encoded weights would save in model.so."""
from __future__ import annotations

import json
import os
import sys

import pytest

from qcompiler.cli import main

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cli_errors import assert_refused  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION = os.path.join(ROOT, "models", "fashion_mobilenet.onnx")
DATA = os.path.join(ROOT, "models", "fashion_test.npz")

BAD = {
    "above one": (["--sparsity", "1.5"], "--sparsity: the fraction of zeros must be between 0 and 1"),
    "zero": (["--sparsity", "0"], "--sparsity: the fraction of zeros must be between 0 and 1"),
    "not a number": (["--sparsity", "half"], "invalid float value"),
    "unknown pattern": (["--sparsity", "0.5", "--sparsity-pattern", "3:4"], "invalid choice"),
    "2:4 with 0.7": (["--sparsity", "0.7", "--sparsity-pattern", "2:4"], "2:4 pattern zeroes exactly half"),
    "2:4 global": (["--sparsity-pattern", "2:4", "--sparsity-global"], "no meaning for 2:4"),
    "pattern alone": (["--sparsity-pattern", "block4"], "--sparsity-pattern needs --sparsity"),
    "global alone": (["--sparsity-global"], "--sparsity-global needs --sparsity"),
    "no-prune alone": (["--no-prune", "Conv"], "--no-prune needs --sparsity"),
    "no-prune unknown": (["--sparsity", "0.5", "--no-prune", "/nope/Conv"], "names no conv/gemm layer"),
    "objective": (["--sparse-objective", "fast"], "invalid choice"),
    "obc without calib": (["--sparsity", "0.5", "--prune-method", "obc"],
                          "--prune-method obc re-fits the kept weights on calibration data, and none is given"),
    "obc and global": (["--sparsity", "0.5", "--prune-method", "obc", "--sparsity-global", "--calib", DATA],
                       "--sparsity-global ranks magnitudes across layers"),
    "method alone": (["--prune-method", "magnitude"], "--prune-method needs --sparsity"),
    "unknown method": (["--sparsity", "0.5", "--prune-method", "obs"], "invalid choice"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sparsity_flags(tmp_path, capsys, case):
    assert_refused(tmp_path, capsys, FASHION, *BAD[case])


def compile_json(capsys, tmp_path, *flags):
    code = main(["compile", FASHION, "--dtype", "int8", "--calib", DATA, "--calib-samples", "256",
                 "-o", str(tmp_path / "out"), "--json", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)["report"]


def test_prune_50_int8_fashion_accuracy_reported(tmp_path, capsys):
    rep = compile_json(capsys, tmp_path, "--sparsity", "0.5", "--eval", DATA, "--eval-samples", "300")
    sec = rep["sparsity"]
    assert sec["target"] == 0.5 and sec["pattern"] == "unstructured"
    pruned = [r for r in sec["layers"] if r["pruned"]]
    dense = [r for r in sec["layers"] if not r["pruned"]]     # 7 depthwise and the grayscale stem
    assert len(pruned) == 16 and len(dense) == 8
    assert sorted(r["skipped"].split(" (")[0] for r in dense) == ["depthwise"] * 7 + ["one input channel"]
    # int8 rounding can only add zeros to the float pruning's exact 50 %
    assert all(r["sparsity"] >= 0.5 - 1 / r["params"] for r in pruned)
    assert all(r["format_time"] in ("dense", "csr", "bsr1x4", "bsr4x1") for r in sec["layers"])
    assert sec["weights_encoded_bytes"] <= sec["weights_dense_bytes"]
    lib = sec["library"]
    assert lib["sparse_encoded_bytes_estimated"] == lib["bytes"] - sec["weights_stored_bytes"] + sec["weights_encoded_bytes"]
    assert all(r["format"] == r["format_time"] for r in sec["layers"])        # the default objective: time
    assert 0 < lib["text_bytes"] < lib["bytes"] and 0 < lib["library_bin_bytes"] < lib["bytes"]
    acc_dense = sec["pruning_effect"]["accuracy"]["fp32_dense"]
    acc_pruned = sec["pruning_effect"]["accuracy"]["fp32_pruned"]
    acc_int8 = rep["evaluation"]["accuracy"]["int8"]
    print(f"\nfashion_mobilenet, 300 test images: fp32 dense {acc_dense:.3f}, fp32 pruned 50 % per layer "
          f"{acc_pruned:.3f}, pruned + int8 {acc_int8:.3f} (drop {acc_dense - acc_int8:+.3f}, no fine-tuning); "
          f"output SQNR of the pruning alone {sec['pruning_effect']['outputs'][0]['sqnr_db']} dB")
    assert acc_dense >= 0.9                                    # the trained model, unpruned
    assert 0.0 <= acc_int8 <= acc_dense + 0.02                 # reported, not a goal
    assert all(r.get("pruning_sqnr_db") is not None for r in sec["layers"])   # residual convs included


def test_24_int8_fashion_sizes(tmp_path, capsys):
    """2:4 with --sparse-objective size: the artifact stores (and runs) every pruned weight as 2:4."""
    rep = compile_json(capsys, tmp_path, "--sparsity-pattern", "2:4", "--sparse-objective", "size",
                       "--eval-samples", "0")
    sec = rep["sparsity"]
    assert sec["target"] == 0.5 and sec["pattern"] == "2:4" and sec["objective"] == "size"
    assert all(r["format"] == r["format_size"] for r in sec["layers"])
    assert sec["weights_stored_bytes"] == sec["weights_encoded_bytes"] == sum(r["stored_bytes"] for r in sec["layers"])
    pruned = [r for r in sec["layers"] if r["pruned"]]
    assert pruned and all(r["nm_2_4"] for r in pruned)
    # int8 2:4: half the values plus 2 bits per kept value = 0.625 of dense (K padded to 4 on the first conv)
    for r in pruned:
        if r["format_size"] == "2:4":
            n, k = r["matrix"]
            assert r["encoded_bytes"] == r["groups"] * n * (-(-k // 4) * 2 + -(-k // 8))
    # the size objective counts kernel code too: a 1x1 conv stored as CSR runs the shared sparse kernel
    # (no code of its own), so small pointwise layers go CSR when CSR bytes < 2:4 bytes + a kernel's code
    from qcompiler.sparse.cost import KERNEL_CODE_BYTES
    csr = [r for r in pruned if r["format_size"] == "csr"]
    assert all(r["kernel_code_bytes"] == 0 and r["encoded_bytes"] < r["dense_bytes"] * 0.625 + KERNEL_CODE_BYTES
               for r in csr), csr
    assert sum(r["format_size"] in ("2:4", "csr") for r in pruned) >= len(pruned) - 1
    assert csr and sum(r["format_size"] == "2:4" for r in pruned) >= 5      # the large layers stay 2:4
    lib = sec["library"]
    print(f"\n2:4 int8: conv/gemm weights {sec['weights_dense_bytes']} -> {sec['weights_encoded_bytes']} B; "
          f"model.so {lib['bytes']} B (.text {lib['text_bytes']} B, VM+constants {lib['library_bin_bytes']} B) "
          f"-> ~{lib['sparse_encoded_bytes_estimated']} B with encoded weights ({lib['sparse_ratio_estimated']}x)")


def test_90_global_int8_fashion_artifact_at_most_06_of_dense(tmp_path, capsys):
    """Issue #8's size point on the trained model: 90 % global unstructured pruning, int8, the size
    objective: model.so <= 0.6 x the dense int8 model.so (same host, same calibration). Sizes are
    what the build writes (not a timing); 0.55 measured on an AVX2 host, 2026-11-23."""
    sizes = {}
    for name, flags in (("dense", ()), ("sparse", ("--sparsity", "0.9", "--sparsity-global",
                                                   "--sparse-objective", "size"))):
        out = tmp_path / name
        out.mkdir()
        rep = compile_json(capsys, out, "--eval-samples", "0", *flags)
        sizes[name] = os.path.getsize(out / "out" / "model.so")
    sec = rep["sparsity"]
    assert sec["objective"] == "size" and 0.899 <= sec["pruned_sparsity"] <= 0.901   # depthwise convs are not pruned
    print(f"\nfashion int8 model.so: dense {sizes['dense']:,} B, 90 % global size {sizes['sparse']:,} B "
          f"({sizes['sparse'] / sizes['dense']:.3f})")
    assert sizes["sparse"] <= 0.6 * sizes["dense"]


def test_convert_writes_the_pruned_model(tmp_path, capsys):
    """qcompile convert --sparsity-pattern 2:4: the ONNX written holds 2:4 weights (depthwise dense) and
    ONNX Runtime runs it."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    import realmodels as rm
    from qcompiler.sparse.format import conv_matrices, is_24
    out = tmp_path / "pruned.onnx"
    assert main(["convert", FASHION, "-o", str(out), "--sparsity-pattern", "2:4", "-q"]) == 0
    m = onnx.load(str(out))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    seen = 0
    for node in m.graph.node:
        if node.op_type in ("Conv", "Gemm") and node.input[1] in inits:
            w = inits[node.input[1]]
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if w.ndim == 4 and w.shape[1] == 1:      # depthwise, or the grayscale stem: not pruned
                assert (w != 0).mean() > 0.9
                continue
            mats = conv_matrices(w, group) if w.ndim == 4 else (w if any(
                a.name == "transB" and a.i for a in node.attribute) else w.T)[None]
            assert all(is_24(x) for x in mats), node.name
            seen += 1
    assert seen == 16
    x = rm.fashion_test()[0][:1]
    y = rm.ort_run(str(out), {m.graph.input[0].name: x})[0]
    assert y.shape == (1, 10) and np.isfinite(y).all()
