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
