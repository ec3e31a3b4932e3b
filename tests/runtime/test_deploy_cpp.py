"""examples/deploy_cpp built natively runs an x86 artifact with libtvm_runtime + libtvm_ffi only."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("make") is None, reason="needs g++ and make")
def test_native_deploy_host_runs_artifact(x86_artifact, tmp_path, tiny):
    r = subprocess.run(["make", "-s", "-C", str(REPO / "examples" / "deploy_cpp"), f"BUILD={tmp_path}",
                        f"PYTHON={sys.executable}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    x = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    r = subprocess.run([str(tmp_path / "run_model"), str(x86_artifact), str(tmp_path / "x.bin"),
                        "-o", str(tmp_path / "y")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "output 0 y float32[1, 8]" in r.stdout
    y = np.fromfile(tmp_path / "y0.bin", np.float32).reshape(1, 8)
    np.testing.assert_allclose(y, tiny.reference(tiny.graph(), x), rtol=1e-5, atol=1e-6)
    maps_check = subprocess.run(["ldd", str(tmp_path / "run_model")], capture_output=True, text=True).stdout
    assert "libtvm_runtime.so" in maps_check and "libtvm_compiler" not in maps_check

    (tmp_path / "short.bin").write_bytes(b"\0" * 12)
    r = subprocess.run([str(tmp_path / "run_model"), str(x86_artifact), str(tmp_path / "short.bin")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "12 bytes, but input x float32[1, 16] needs 64" in r.stderr


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("make") is None, reason="needs g++ and make")
def test_native_deploy_host_runs_a_dynamic_artifact(tmp_path):
    """--dynamic (format 2): the host reads the length from the input files, pads to the bucket,
    runs its function and cuts the outputs back: the Python runtime's outputs."""
    import dynamic_models as dm

    from qcompiler.cli import main
    from qcompiler.runtime import load
    enc = dm.masked_attention(tmp_path / "enc.onnx")
    assert main([enc, "--dynamic", "S=1..40:8,16,40", "-o", str(tmp_path / "dyn"), "-q"]) == 0
    r = subprocess.run(["make", "-s", "-C", str(REPO / "examples" / "deploy_cpp"), f"BUILD={tmp_path}",
                        f"PYTHON={sys.executable}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    f = dm.feed(11, seed=5)
    f["x"].tofile(tmp_path / "x.bin")
    f["mask"].tofile(tmp_path / "mask.bin")
    r = subprocess.run([str(tmp_path / "run_model"), str(tmp_path / "dyn"), str(tmp_path / "x.bin"),
                        str(tmp_path / "mask.bin"), "-o", str(tmp_path / "y")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "output 0 y float32[1, 11, 8]" in r.stdout and "output 1 pooled float32[1, 8]" in r.stdout
    ref = load(tmp_path / "dyn")(**f)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "y0.bin", np.float32).reshape(1, 11, 8), ref[0])
    np.testing.assert_array_equal(np.fromfile(tmp_path / "y1.bin", np.float32).reshape(1, 8), ref[1])
    np.ones(41 * 8, np.float32).tofile(tmp_path / "long.bin")
    np.ones(41, np.int64).tofile(tmp_path / "mask41.bin")
    r = subprocess.run([str(tmp_path / "run_model"), str(tmp_path / "dyn"), str(tmp_path / "long.bin"),
                        str(tmp_path / "mask41.bin")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "with S in 1..40" in r.stderr
