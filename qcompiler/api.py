"""The small public Python API.

    import qcompiler as qc
    g = qc.import_onnx("model.onnx")                 # ONNX -> IR
    qc.run_passes(g, "default")                      # or "fold-bn,fuse-act", or your own passes
    print(g)                                         # the IR as text
    qc.save_onnx(g, "out.onnx")                      # IR -> ONNX, runs in ONNX Runtime
    qc.compile(g, "out_dir", target="x86", dtype="fp32")   # IR -> artifact
    model = qc.load("out_dir"); y = model(x)         # run it with the TVM runtime
"""
from __future__ import annotations


def import_onnx(path, input_shapes=None, input_values=None):
    from .frontend.onnx_import import import_onnx as f
    return f(path, input_shapes, input_values)


def export_onnx(graph):
    from .frontend.onnx_export import export_onnx as f
    return f(graph)


def save_onnx(graph, path):
    from .frontend.onnx_export import save_onnx as f
    return f(graph, path)


def run_passes(graph, pipeline="default", **kw):
    from .passes import run_passes as f
    return f(graph, pipeline, **kw)


def compile(graph, out_dir, target="x86", dtype="fp32", **spec):
    from .codegen.artifact import write_artifact
    from .codegen.target import TargetSpec
    return write_artifact(graph, TargetSpec(family=target, dtype=dtype, **spec), out_dir)


def load(out_dir, device=None):
    from .runtime import load as f
    return f(out_dir, device)
