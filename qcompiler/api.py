"""The small public Python API.

    import qcompiler as qc
    g = qc.import_onnx("model.onnx")                 # ONNX -> IR
    qc.run_passes(g, "default")                      # or "fold-bn,fuse-act", or your own passes
    print(g)                                         # the IR as text
    qc.save_onnx(g, "out.onnx")                      # IR -> ONNX, runs in ONNX Runtime
    art = qc.compile(g, "out_dir")                   # IR -> artifact (x86 fp32; options: qcompiler.driver)
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


def compile(model, out_dir, options=None):
    """Compile ``model`` (an ONNX path or an IR graph) to the artifact folder ``out_dir`` with the
    driver behind ``qcompile``: ``options`` a :class:`qcompiler.driver.CompileOptions` (default: the
    default passes, x86 fp32 for this CPU). Returns the :class:`qcompiler.driver.Artifact`."""
    from .driver import compile as f
    return f(model, out_dir, options)


def load(out_dir, device=None):
    from .runtime import load as f
    return f(out_dir, device)
