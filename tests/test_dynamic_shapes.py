"""``--dynamic``: one artifact for every size of a dynamic dim, compiled as shape buckets.

The artifact of a masked attention layer (tests/dynamic_models.py) runs every length of its range
with ONNX Runtime's outputs at that length, and equal to a build for that one length; a model that
reads its padding is refused before any work; the runtime checks the sizes it is given."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import qcompiler as qc
from qcompiler.cli import main
from qcompiler.driver.shapes import (MAX_BUCKETS, DynamicDim, assignments, check_padding, default_buckets,
                                     parse_dynamic, probe_sizes, symbolic_shapes)
from qcompiler.errors import UserError

import dynamic_models as dm  # tests/ (conftest puts it on sys.path)

LENGTHS = (1, 5, 8, 9, 23, 40)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> str:
    return dm.masked_attention(tmp_path_factory.mktemp("m") / "enc.onnx")


@pytest.fixture(scope="module")
def dynamic_fp32(encoder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("a") / "dyn"
    assert main([encoder, "--dynamic", "S=1..40:8,16,40", "-o", str(out), "-q"]) == 0
    return out


def ort_outputs(path: str, feed: dict) -> list[np.ndarray]:
    import onnxruntime as ort
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feed)


# ---- options -------------------------------------------------------------------------------------
def test_default_buckets_grow_by_at_most_one_and_a_half():
    assert default_buckets(1, 512) == (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    assert default_buckets(100, 300) == (128, 192, 256, 300)
    assert default_buckets(1, 8) == (8,)
    b = default_buckets(1, 4096)
    assert all(hi / lo <= 1.5 for lo, hi in zip(b, b[1:]))


def test_parse_dynamic():
    assert parse_dynamic("S=1..512") == DynamicDim("S", 1, 512)
    assert parse_dynamic("sequence=8..77:32,77").sizes == (32, 77)
    assert parse_dynamic("S=1..512").bucket_for(17) == 24
    for bad, msg in (("S=1-512", "bad --dynamic"), ("S=5..5", "empty or fixed"), ("S=1..64:32,16,64", "increase"),
                     ("S=1..64:16,32", "end at 64")):
        with pytest.raises(UserError, match=msg):
            parse_dynamic(bad)


def test_too_many_bucket_combinations_are_refused():
    with pytest.raises(UserError, match=f"more than the {MAX_BUCKETS}"):
        assignments([DynamicDim("B", 1, 8, (1, 2, 4, 8)), DynamicDim("S", 1, 512)])
    assert assignments([DynamicDim("B", 1, 2, (1, 2)), DynamicDim("S", 1, 16, (8, 16))]) == [
        {"B": 1, "S": 8}, {"B": 1, "S": 16}, {"B": 2, "S": 8}, {"B": 2, "S": 16}]


def test_probe_sizes_pad_and_tell_the_dims_apart():
    small, big = probe_sizes([DynamicDim("B", 1, 64), DynamicDim("S", 1, 64)])
    assert all(small[k] < big[k] for k in "BS") and (small["B"], big["B"]) != (small["S"], big["S"])


def test_dims_come_from_the_model_or_from_input_shape(encoder):
    import onnx
    m = onnx.load(encoder)
    dims = [DynamicDim("S", 1, 40)]
    assert symbolic_shapes(m, {}, dims, "m") == {"x": (1, "S", 8), "mask": (1, "S")}
    given = {"x": (1, "L", 8), "mask": (1, "L")}
    assert symbolic_shapes(m, given, [DynamicDim("L", 1, 40)], "m") == given
    with pytest.raises(UserError, match="'T', which no input's shape uses"):
        symbolic_shapes(m, {}, [DynamicDim("T", 1, 40)], "m")
    with pytest.raises(UserError, match="uses 'L', which has no --dynamic range"):
        symbolic_shapes(m, given, dims, "m")
    with pytest.raises(UserError, match="names 'y', which is not an input of the model"):
        symbolic_shapes(m, {"y": (1, "S")}, dims, "m")
    with pytest.raises(UserError, match="input 'x' dim 2 is fixed at 8 by the model"):
        symbolic_shapes(m, {"x": (1, "S", "S")}, dims, "m")


def test_the_padding_check_finds_the_sliced_dims(encoder):
    import onnx
    m = onnx.load(encoder)
    assert check_padding(m, {"x": (1, "S", 8), "mask": (1, "S")}, [DynamicDim("S", 1, 40)], "m") == [
        (1, "S", 8), (1, 8)]


def test_a_model_that_reads_its_padding_is_refused_before_any_work(tmp_path, capsys):
    path = dm.unmasked_mean(tmp_path / "mean.onnx")
    assert main([path, "--dynamic", "S=1..40", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "changes output 'pooled' at the real positions" in err[0], err
    assert "reads its padding" in err[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, msg", [
    (["--dtype", "int8", "--calib", "random"], "static int8 ranges are calibrated at one input shape"),
    (["--dtype", "int8", "--activations", "dynamic", "--dynamic-granularity", "tensor"],
     "--dynamic-granularity tensor is not available with --dynamic"),
    (["--tune", "4"], "--tune is not available with --dynamic"),
])
def test_options_that_depend_on_one_shape_are_refused(encoder, tmp_path, capsys, flags, msg):
    assert main([encoder, "--dynamic", "S=1..40", *flags, "-o", str(tmp_path / "out")]) == 2
    assert msg in capsys.readouterr().err


# ---- the artifact --------------------------------------------------------------------------------
def test_manifest_names_the_dims_and_one_function_per_bucket(dynamic_fp32):
    m = json.loads((dynamic_fp32 / "manifest.json").read_text())
    assert m["format_version"] == 2
    assert m["dynamic"] == {"dims": {"S": [1, 40]}, "buckets": [
        {"sizes": {"S": s}, "function": f"main_S{s}"} for s in (8, 16, 40)]}
    assert [i["shape"] for i in m["inputs"]] == [[1, "S", 8], [1, "S"]]
    assert [o["shape"] for o in m["outputs"]] == [[1, "S", 8], [1, 8]]


@pytest.mark.parametrize("length", LENGTHS)
def test_every_length_matches_onnxruntime(dynamic_fp32, encoder, length):
    f = dm.feed(length, seed=length)
    got, ref = qc.load(dynamic_fp32)(**f), ort_outputs(encoder, f)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=0, atol=1e-5 * np.abs(r).max())


def test_equal_to_the_build_for_that_length(dynamic_fp32, encoder, tmp_path):
    """The acceptance bound: 1e-5 of the outputs' range against a static build (measured: equal)."""
    assert main([encoder, "--input-shape", "x=1x23x8", "--input-shape", "mask=1x23", "-o", str(tmp_path / "s"),
                 "-q"]) == 0
    f = dm.feed(23, seed=7)
    for a, b in zip(qc.load(dynamic_fp32)(**f), qc.load(tmp_path / "s")(**f)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())


def test_dynamic_int8_buckets_equal_the_build_for_that_length(encoder, tmp_path):
    """Per-token run-time scales: a padded row changes no other row's scale, so the bucket gives
    the per-length build's integers."""
    q = ["--dtype", "int8", "--activations", "dynamic"]
    assert main([encoder, "--dynamic", "S=1..40:16,40", *q, "-o", str(tmp_path / "d"), "-q"]) == 0
    assert main([encoder, "--input-shape", "x=1x11x8", "--input-shape", "mask=1x11", *q, "-o", str(tmp_path / "s"),
                 "-q"]) == 0
    f = dm.feed(11, seed=3)
    for a, b in zip(qc.load(tmp_path / "d")(**f), qc.load(tmp_path / "s")(**f)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())


def test_the_runtime_checks_the_sizes(dynamic_fp32):
    model = qc.load(dynamic_fp32)
    assert "S=1..40" in repr(model)
    f = dm.feed(41)
    with pytest.raises(UserError, match=r"'x' has S = 41 \(dim 1\), outside the compiled range 1..40"):
        model(**f)
    with pytest.raises(UserError, match="inputs disagree on S: 'x' has 12, 'mask' has 13"):
        model(x=dm.feed(12)["x"], mask=np.ones((1, 13), np.int64))
    with pytest.raises(UserError, match=r"has shape \[1, 12, 9\], but the model was compiled for \[1, 'S', 8\]"):
        model(x=np.zeros((1, 12, 9), np.float32), mask=np.ones((1, 12), np.int64))


def test_qcompile_run_takes_samples_of_any_length_in_the_range(dynamic_fp32, encoder, tmp_path):
    f = dm.feed(6, seed=2)
    np.savez(tmp_path / "in.npz", x=np.stack([f["x"]] * 3), mask=np.stack([f["mask"]] * 3))
    assert main(["run", str(dynamic_fp32), "--input", str(tmp_path / "in.npz"), "--output",
                 str(tmp_path / "out.npz"), "-q"]) == 0
    y = np.load(tmp_path / "out.npz")["y"]
    assert y.shape == (3, 1, 6, 8)
    np.testing.assert_allclose(y[1], ort_outputs(encoder, f)[0], rtol=0, atol=1e-5 * np.abs(y).max())


@pytest.mark.skipif(not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")), reason="nvcc not found")
def test_a_cuda_artifact_holds_compiled_device_code_for_every_bucket(encoder, tmp_path):
    """Built without a GPU: the fatbin is checked by the artifact writer; here every bucket's
    function is in the VM and its kernels' names are in the device code."""
    assert main([encoder, "--target", "cuda", "--dynamic", "S=1..40:16,40", "-o", str(tmp_path / "cu"), "-q"]) == 0
    m = json.loads((tmp_path / "cu" / "manifest.json").read_text())
    assert m["format_version"] == 2 and m["cuda"]["kernels"] > 0
    assert [b["function"] for b in m["dynamic"]["buckets"]] == ["main_S16", "main_S40"]
    lib = (tmp_path / "cu" / "model.so").read_bytes()
    assert b"main_S16" in lib and b"main_S40" in lib


def test_a_named_dim_without_a_range_is_one_line(encoder, tmp_path, capsys):
    assert main([encoder, "--input-shape", "x=1xSx8", "--input-shape", "mask=1xS", "-o", str(tmp_path / "o")]) == 2
    assert "only a compile with --dynamic S=LO..HI keeps a dim dynamic" in capsys.readouterr().err
    assert main(["inspect", encoder, "--input-shape", "x=1xSx8"]) == 2
    capsys.readouterr()
    assert main(["inspect", encoder, "--dynamic", "S=1..40"]) == 2
    assert "this command reads the model at one shape" in capsys.readouterr().err


def test_the_runtime_picks_the_least_padded_bucket_over_several_dims():
    from qcompiler.runtime.shapes import Buckets
    b = Buckets.from_json({"dims": {"B": [1, 4], "S": [1, 64]}, "buckets": [
        {"sizes": {"B": nb, "S": ns}, "function": f"main_B{nb}_S{ns}"} for nb in (2, 4) for ns in (16, 64)]})
    assert b.pick({"B": 1, "S": 9}) == ({"B": 2, "S": 16}, "main_B2_S16")
    assert b.pick({"B": 3, "S": 17})[1] == "main_B4_S64"
    a = np.arange(6, dtype=np.float32).reshape(1, 3, 2)
    padded = b.pad(("B", "S", 2), a, {"B": 2, "S": 16})
    assert padded.shape == (2, 16, 2) and padded[:1, :3].tolist() == a.tolist() and not padded[1:].any()
    np.testing.assert_array_equal(b.unpad(("B", "S", 2), padded, {"B": 1, "S": 3}), a)
    assert Buckets.from_json(b.to_json()) == b
