"""One-node (or few-node) ONNX models for the import tests of the zoo ops: built with onnx.helper,
imported, run by the IR interpreter (qcompiler.quant.reference.run) and by an x86 build, each
compared with onnxruntime on the same model (bool and integer results exactly, floats within
``tol`` * max|ref|)."""
from __future__ import annotations

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

NP2ONNX = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("int64"): TensorProto.INT64,
           np.dtype("int32"): TensorProto.INT32, np.dtype("bool"): TensorProto.BOOL}


class Case:
    """``nodes``: (op, inputs, outputs, attrs) tuples, or one op name for a single node over all
    ``inputs`` and ``consts`` (in that order) to output ``y``. ``inputs`` are fed at run time,
    ``consts`` become initializers."""

    def __init__(self, name, nodes, inputs, consts=None, attrs=None, outputs=("y",), opset=17, tol=1e-5,
                 ref=None):
        self.name, self.inputs, self.consts, self.ref = name, inputs, consts or {}, ref
        if isinstance(nodes, str):
            nodes = [(nodes, list(inputs) + list(self.consts), list(outputs), attrs or {})]
        self.nodes, self.outputs, self.opset, self.tol = nodes, list(outputs), opset, tol

    @property
    def op(self) -> str:
        return self.nodes[-1][0]

    def model(self) -> onnx.ModelProto:
        nodes = [helper.make_node(op, ins, outs, **attrs) for op, ins, outs, attrs in self.nodes]
        g = helper.make_graph(
            nodes, self.name,
            [helper.make_tensor_value_info(k, NP2ONNX[v.dtype], v.shape) for k, v in self.inputs.items()],
            [onnx.ValueInfoProto(name=o) for o in self.outputs],
            [numpy_helper.from_array(v, k) for k, v in self.consts.items()])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8
        return m

    def __repr__(self):
        return self.name


def ort_ref(model, feeds):
    import onnxruntime as ort
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def run_x86(graph, feeds):
    from qcompiler.codegen.lower import build_module
    from qcompiler.codegen.target import TargetSpec
    ex = build_module(graph, TargetSpec("x86"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in graph.inputs])
    return [o.numpy() for o in (list(out) if not isinstance(out, tvm.runtime.Tensor) else [out])]


def check(got, refs, tol, what):
    assert len(got) == len(refs), what
    for g, ref in zip(got, refs):
        g = np.asarray(g)
        assert g.shape == ref.shape, f"{what}: shape {g.shape} != {ref.shape}"
        assert g.dtype == ref.dtype, f"{what}: dtype {g.dtype} != {ref.dtype}"
        if ref.dtype.kind != "f":
            np.testing.assert_array_equal(g, ref, err_msg=what)
            continue
        odd = ~np.isfinite(ref)                    # NaN and +-inf must match exactly
        np.testing.assert_array_equal(g[odd], ref[odd], err_msg=f"{what}: NaN/inf differ")
        ok = ~odd
        err = float(np.abs(g[ok].astype(np.float64) - ref[ok]).max(initial=0))
        assert err <= tol * max(float(np.abs(ref[ok]).max(initial=0)), 1e-6), f"{what}: max error {err}"


def check_case(case: Case, passes: bool = True) -> None:
    """Import, then the interpreter, the ONNX export run in onnxruntime and (after the default
    passes) the x86 build, each against onnxruntime on the original model."""
    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.passes import run_passes
    from qcompiler.quant.reference import run
    m = case.model()
    refs = case.ref(case.inputs) if case.ref else ort_ref(m, case.inputs)
    g = import_onnx(m)
    g.verify()
    check(run(g, case.inputs), refs, case.tol, f"{case.name} (interpreter)")
    if case.ref is None:                    # the exporter (calibration runs the export in ORT)
        from qcompiler.frontend.onnx_export import export_onnx
        check(ort_ref(export_onnx(g), case.inputs), refs, case.tol, f"{case.name} (export)")
    if passes:
        g = run_passes(g)
        g.verify()
    check(run_x86(g, case.inputs), refs, case.tol, f"{case.name} (x86)")


def covered_kinds() -> set[str]:
    """The op kinds the Case lists of tests/frontend/test_import_*.py run through the x86 build
    (tests/codegen/test_x86_ops.py's registry check counts them)."""
    import importlib.util
    from pathlib import Path
    kinds: set[str] = set()
    for path in sorted((Path(__file__).parent / "frontend").glob("test_import_*.py")):
        spec = importlib.util.spec_from_file_location(f"_cases_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for v in vars(mod).values():
            if isinstance(v, list):
                kinds |= {op for c in v if isinstance(c, Case) for op, *_ in c.nodes}
    return kinds
