"""Shared fixtures: a tiny graph and a way to build it, for artifact and runtime tests; the
real models and an onnxruntime runner (``ort_run``, also importable from ``realmodels``).

``tiny_graph()`` is y = relu(x @ W + b) with x: (1, 16) float32. ``tiny.build`` is a minimal Relax
translation of MatMul/Add/Relu with TVM's default pipeline: the artifact and runtime tests use it so
that they test packaging and loading, independently of the real lowering
(:func:`qcompiler.codegen.lower.build_module`), which has its own tests and one end-to-end test
in tests/codegen/test_artifact.py.
"""
from __future__ import annotations

import os
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from qcompiler.ir import Graph, TensorType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # tests/realmodels.py, any import mode
from realmodels import ort_run as _ort_run  # noqa: E402


def tiny_graph(batch: int = 1, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph("tiny")
    x = g.add_input("x", TensorType((batch, 16), "float32"))
    w = g.add_const(rng.standard_normal((16, 8)).astype(np.float32), "w")
    b = g.add_const(rng.standard_normal((8,)).astype(np.float32), "b")
    y = g.create_op("MatMul", [x, w]).result
    z = g.create_op("Add", [y, b]).result
    g.outputs = [g.create_op("Relu", [z], result_names=["y"]).result]
    return g


def tiny_reference(g: Graph, x: np.ndarray) -> np.ndarray:
    w, b = (v.data for v in g.consts.values())
    return np.maximum(x @ w + b, 0)


def _relax_build(graph: Graph, spec):
    """Stand-in for lower.build_module: Relax ops for MatMul/Add/Relu, default TVM pipeline."""
    import tvm
    from tvm import relax
    ops = {"MatMul": relax.op.matmul, "Add": relax.op.add, "Relu": relax.op.nn.relu}
    bb = relax.BlockBuilder()
    params = [relax.Var(v.name, relax.TensorType(v.shape, v.dtype)) for v in graph.inputs]
    env = dict(zip((v.name for v in graph.inputs), params))
    with bb.function("main", params):
        with bb.dataflow():
            for op in graph.ops:
                args = [env[v.name] if v.name in env else relax.const(v.data) for v in op.operands]
                env[op.result.name] = bb.emit(ops[op.kind](*args))
            outs = [bb.emit_output(env[v.name]) for v in graph.outputs]
        bb.emit_func_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
    return tvm.compile(bb.get(), target=tvm.target.Target(spec.tvm))


@pytest.fixture
def tiny():
    """tiny.graph(batch=1), tiny.reference(graph, x), tiny.build (graph, spec) -> Executable."""
    return SimpleNamespace(graph=tiny_graph, reference=tiny_reference, build=_relax_build)


@pytest.fixture(scope="session")
def x86_artifact(tmp_path_factory):
    """A session-wide x86 artifact of tiny_graph() (read-only: copy it before modifying)."""
    from qcompiler.codegen.artifact import write_artifact
    from qcompiler.codegen.target import TargetSpec
    out = tmp_path_factory.mktemp("art") / "tiny"
    return write_artifact(tiny_graph(), TargetSpec("x86"), out, build=_relax_build)


@pytest.fixture(scope="session")
def ort_run():
    """ort_run(model_or_path, feeds, outputs=None) -> list of arrays, via onnxruntime on CPU."""
    return _ort_run


def timing_keys(obj, path="") -> list[str]:
    """Keys that hold wall-clock measurements (seconds, milliseconds): they would make a report
    differ between two builds of the same inputs."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if re.search(r"(^|_)(s|ms|us|sec|seconds|elapsed|wall)$", str(k)):
                out.append(path + str(k))
            out += timing_keys(v, f"{path}{k}.")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += timing_keys(v, f"{path}{i}.")
    return out


def build_arm_deploy(tmp_path_factory):
    """examples/deploy_cpp cross-built for aarch64 (binary + the two runtime libraries); returns
    the program's path (the qemu tests run artifacts through it)."""
    import subprocess
    from pathlib import Path
    from qcompiler.codegen.arm import toolchain as arm
    build = tmp_path_factory.mktemp("deploy_aarch64")
    repo = Path(__file__).resolve().parent.parent
    r = subprocess.run(["make", "-s", "-C", str(repo / "examples" / "deploy_cpp"), "ARCH=aarch64",
                        f"BUILD={build}", f"TVM_RT={arm.runtime_dir()}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return build / "run_model"
