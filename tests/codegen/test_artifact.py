"""write_artifact: folder contents, manifest, determinism, atomic replacement, failures."""
from __future__ import annotations

import json
import shutil

import pytest

import qcompiler
from qcompiler.codegen import artifact
from qcompiler.codegen.arm import toolchain as arm
from qcompiler.codegen.artifact import write_artifact
from qcompiler.codegen.target import LLVM_OPTIONS, TargetSpec
from qcompiler.errors import UserError
from qcompiler.runtime.manifest import FORMAT_VERSION, sha256_file


def test_writes_library_and_manifest(tmp_path, tiny):
    out = write_artifact(tiny.graph(), TargetSpec("x86"), tmp_path / "OUT", build=tiny.build,
                         command=["qcompile", "tiny.onnx", "-o", "OUT"])
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.so"]
    assert [p.name for p in tmp_path.iterdir()] == ["OUT"]            # no temp folder left
    m = json.loads((out / "manifest.json").read_text())
    assert m["format_version"] == FORMAT_VERSION
    assert m["qcompiler_version"] == qcompiler.__version__
    assert m["target"]["family"] == "x86" and m["target"]["tvm"]["kind"] == "llvm"
    assert m["target"]["cpu"] == m["target"]["tvm"]["mcpu"]
    assert m["inputs"] == [{"name": "x", "shape": [1, 16], "dtype": "float32"}]
    assert m["outputs"] == [{"name": "y", "shape": [1, 8], "dtype": "float32"}]
    assert m["library"]["sha256"] == sha256_file(out / "model.so")
    assert m["created_by"] == ["qcompile", "tiny.onnx", "-o", "OUT"]
    assert "time" not in json.dumps(m).lower()


def test_same_inputs_give_identical_bytes(tmp_path, tiny):
    a = write_artifact(tiny.graph(), TargetSpec("x86"), tmp_path / "a", build=tiny.build)
    b = write_artifact(tiny.graph(), TargetSpec("x86"), tmp_path / "b", build=tiny.build)
    for name in ("model.so", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _fail_export(exc):
    def export(ex, path, spec, workspace):
        path.write_bytes(b"half-written")
        raise exc
    return export


@pytest.mark.parametrize("exc", [RuntimeError("linker died"), KeyboardInterrupt()])
def test_failure_leaves_no_output_and_no_temp(tmp_path, tiny, monkeypatch, exc):
    monkeypatch.setattr(artifact, "export_library", _fail_export(exc))
    with pytest.raises(type(exc)):
        write_artifact(tiny.graph(), TargetSpec("x86"), tmp_path / "OUT", build=tiny.build)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_replaced_only_after_success(tmp_path, tiny, monkeypatch):
    out = write_artifact(tiny.graph(seed=0), TargetSpec("x86"), tmp_path / "OUT", build=tiny.build)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    with monkeypatch.context() as mp:
        mp.setattr(artifact, "export_library", _fail_export(RuntimeError("boom")))
        with pytest.raises(RuntimeError):
            write_artifact(tiny.graph(seed=1), TargetSpec("x86"), out, build=tiny.build)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before   # old artifact intact

    write_artifact(tiny.graph(seed=1), TargetSpec("x86"), out, build=tiny.build)
    assert (out / "model.so").read_bytes() != before["model.so"]        # new weights
    assert [p.name for p in tmp_path.iterdir()] == ["OUT"]


def test_refuses_to_replace_a_folder_that_is_not_an_artifact(tmp_path, tiny):
    out = tmp_path / "OUT"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a qcompiler artifact"):
        write_artifact(tiny.graph(), TargetSpec("x86"), out, build=tiny.build)
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["OUT"]


def test_refuses_a_file_as_output(tmp_path, tiny):
    (tmp_path / "OUT").write_text("x")
    with pytest.raises(UserError, match="not a folder"):
        write_artifact(tiny.graph(), TargetSpec("x86"), tmp_path / "OUT", build=tiny.build)


def test_missing_cross_compiler_is_a_user_error(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("QCOMPILER_AARCH64_CXX", "no-such-aarch64-g++")
    with pytest.raises(UserError, match="apt-get install"):
        write_artifact(tiny.graph(), TargetSpec("arm"), tmp_path / "OUT", build=tiny.build)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which(arm.CROSS_CXX) is None, reason=f"no {arm.CROSS_CXX} (install: {arm.APT_INSTALL})")
def test_arm_artifact_is_an_aarch64_library(tmp_path, tiny):
    spec = TargetSpec("arm", cpu="cortex-a76", features=("+dotprod", "+fullfp16"))
    out = write_artifact(tiny.graph(), spec, tmp_path / "OUT", build=tiny.build)
    again = write_artifact(tiny.graph(), spec, tmp_path / "again", build=tiny.build)
    assert (out / "model.so").read_bytes() == (again / "model.so").read_bytes()     # deterministic
    elf = (out / "model.so").read_bytes()[:20]
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183     # EM_AARCH64
    t = json.loads((out / "manifest.json").read_text())["target"]
    assert t["tvm"] == {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76",
                        "mattr": ["+neon", "+dotprod", "+fullfp16"], "cl-opt": list(LLVM_OPTIONS)}
    assert t["cpu"] == "cortex-a76" and t["features"] == ["+dotprod", "+fullfp16"]


def test_real_lowering_end_to_end(tmp_path, tiny):
    """The default build (qcompiler.codegen.lower.build_module) gives a loadable, correct artifact."""
    pytest.importorskip("qcompiler.codegen.lower", reason="the lowering (codegen/lower.py) is not there yet")
    import numpy as np
    from qcompiler.runtime import load
    g = tiny.graph()
    out = write_artifact(g, TargetSpec("x86"), tmp_path / "OUT")
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    (y,) = load(out)(x)
    np.testing.assert_allclose(y, tiny.reference(g, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_vm_checks_inputs_although_kernels_have_no_asserts(tmp_path, tiny, bad):
    """Kernels are built without TIR argument asserts (lower.tvm_compile): a host that calls the
    library's ``main`` directly (C++ deploy, no qcompiler.runtime checks in front) with a wrong shape
    or dtype must still get the Relax VM's error, not a kernel reading past a buffer."""
    import numpy as np
    import tvm
    from tvm import relax
    out = write_artifact(tiny.graph(), TargetSpec("x86"), tmp_path / "OUT")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out / "model.so")), tvm.cpu())
    good = np.zeros((1, 16), np.float32)
    assert vm["main"](tvm.runtime.tensor(good)).numpy().shape == (1, 8)
    x = np.zeros((2, 16), np.float32) if bad == "shape" else np.zeros((1, 16), np.float64)
    with pytest.raises(Exception, match="match_cast|dtype"):
        vm["main"](tvm.runtime.tensor(x))


def test_stale_temp_folders_of_dead_writers_are_swept(tmp_path, tiny):
    dead = tmp_path / ".OUT.tmp-999999999-abcd1234"       # no such pid
    dead.mkdir()
    (dead / "model.so").write_bytes(b"partial")
    mine = tmp_path / ".OTHER.tmp-999999999-abcd1234"     # another artifact's: not touched
    mine.mkdir()
    write_artifact(tiny.graph(), TargetSpec("x86"), tmp_path / "OUT", build=tiny.build)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".OTHER.tmp-999999999-abcd1234", "OUT"]
