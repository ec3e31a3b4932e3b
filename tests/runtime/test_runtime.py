"""qcompiler.runtime: load checks (hash, version, machine, device), input checks, runtime-only mode."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qcompiler.errors import UserError
from qcompiler.runtime import device as rdevice
from qcompiler.runtime import load

REPO = Path(__file__).resolve().parents[2]
X = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)


@pytest.fixture
def art(x86_artifact, tmp_path):
    """A private copy of the session's x86 artifact, free to modify."""
    return Path(shutil.copytree(x86_artifact, tmp_path / "OUT"))


def _edit_manifest(out: Path, fn) -> None:
    m = json.loads((out / "manifest.json").read_text())
    fn(m)
    (out / "manifest.json").write_text(json.dumps(m))


def test_load_and_run_matches_reference(x86_artifact, tiny):
    model = load(x86_artifact)
    ref = tiny.reference(tiny.graph(), X)
    (y,) = model(X)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    (y2,) = model(x=X)
    np.testing.assert_array_equal(y, y2)
    assert [s.name for s in model.inputs] == ["x"] and model.outputs[0].shape == (1, 8)
    assert "x86" in repr(model)


def test_flipped_byte_is_refused(art):
    lib = art / "model.so"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0x01
    lib.write_bytes(bytes(data))
    with pytest.raises(UserError, match="artifact corrupted or modified"):
        load(art)


def test_unknown_format_version_is_refused(art):
    _edit_manifest(art, lambda m: m.update(format_version=99))
    with pytest.raises(UserError, match="format version 99"):
        load(art)


@pytest.mark.parametrize("setup,match", [
    (lambda p: (p / "manifest.json").unlink(), "no manifest.json"),
    (lambda p: (p / "model.so").unlink(), "missing"),
    (lambda p: (p / "manifest.json").write_text("{not json"), "unreadable manifest.json"),
    (lambda p: shutil.rmtree(p), "no such directory"),
])
def test_broken_folder_is_refused(art, setup, match):
    setup(art)
    with pytest.raises(UserError, match=match):
        load(art)


@pytest.mark.parametrize("args,kwargs,match", [
    ((np.zeros((2, 16), np.float32),), {}, r"shape \[2, 16\].*compiled for \[1, 16\]"),
    ((np.zeros((1, 16), np.float64),), {}, "dtype float64, but the model takes float32"),
    (([0.0] * 16,), {}, "must be a numpy array"),
    ((), {}, "missing input"),
    ((X, X), {}, "takes 1 input"),
    ((), {"z": X}, "no input named 'z'"),
    ((X,), {"x": X}, "given twice"),
])
def test_bad_inputs_are_refused(x86_artifact, args, kwargs, match):
    model = load(x86_artifact)
    with pytest.raises(UserError, match=match):
        model(*args, **kwargs)


def test_wrong_device_or_machine_is_refused(art):
    with pytest.raises(UserError, match="cannot run on device 'cuda'"):
        load(art, device="cuda")
    with pytest.raises(UserError, match="unknown device"):
        load(art, device="tpu")
    _edit_manifest(art, lambda m: m["target"].update(
        family="arm", tvm={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}))
    if rdevice.host_machine() != "aarch64":
        with pytest.raises(UserError, match="built for aarch64, but this machine is x86_64"):
            load(art)


def test_missing_cpu_features_are_refused(monkeypatch):
    monkeypatch.setattr(rdevice, "cpu_flags", lambda: {"sse2", "avx"})
    monkeypatch.setattr(rdevice, "host_machine", lambda: "x86_64")
    target = {"family": "x86", "tvm": {"kind": "llvm", "mcpu": "znver3"}}
    with pytest.raises(UserError, match="lacks avx2, fma"):
        rdevice.check_machine(target, "OUT")
    rdevice.check_machine({"family": "x86", "tvm": {"kind": "llvm", "mcpu": "x86-64"}}, "OUT")
    arm = {"family": "arm", "tvm": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76",
                                    "mattr": ["+neon", "+i8mm"]}}
    monkeypatch.setattr(rdevice, "host_machine", lambda: "aarch64")
    monkeypatch.setattr(rdevice, "cpu_flags", lambda: {"fp", "asimd", "asimddp", "asimdhp"})
    with pytest.raises(UserError, match="lacks i8mm"):
        rdevice.check_machine(arm, "OUT")


def _run_isolated(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, env=env, timeout=120)


RUNTIME_ONLY_CHECK = """
    import sys, numpy as np
    from qcompiler.runtime import load
    model = load(sys.argv[1])
    (y,) = model(np.load(sys.argv[2]))
    np.save(sys.argv[3], y)
    import tvm
    maps = open("/proc/self/maps").read()
    assert tvm.base._RUNTIME_ONLY, "not in runtime-only mode"
    assert "libtvm_compiler" not in maps and "/libtvm.so" not in maps, "the compiler library was loaded"
    assert "libtvm_runtime.so" in maps and "libtvm_ffi.so" in maps
    bad = [m for m in sys.modules if m.startswith(("tvm.relax", "tvm.s_tir", "qcompiler.codegen",
                                                   "qcompiler.frontend", "onnx"))]
    assert not bad, bad
    print("RUNTIME-ONLY OK")
"""


def test_runs_in_runtime_only_mode_without_the_compiler(x86_artifact, tmp_path, tiny):
    np.save(tmp_path / "x.npy", X)
    r = _run_isolated(RUNTIME_ONLY_CHECK, str(x86_artifact), str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    assert r.returncode == 0 and "RUNTIME-ONLY OK" in r.stdout, r.stdout + r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), tiny.reference(tiny.graph(), X), rtol=1e-5, atol=1e-6)


def test_cuda_artifact_without_cuda_is_a_clear_error(art):
    """Runtime-only, in a fresh process: no driver here, or a GPU-less machine -> UserError."""
    _edit_manifest(art, lambda m: (m["target"].update(
        family="cuda", arch=["sm_90"], tvm={"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}})))
    r = _run_isolated("""
        import sys
        from qcompiler.errors import UserError
        from qcompiler.runtime import load
        try:
            load(sys.argv[1])
        except UserError as e:
            print("USERERROR", e)
    """, str(art))
    if "USERERROR" not in r.stdout and r.returncode == 0:
        pytest.skip("this machine has a CUDA device")
    assert "USERERROR" in r.stdout, r.stdout + r.stderr
    assert "CUDA" in r.stdout
