"""qcompiler: an open quantizing graph compiler for neural networks.

ONNX -> importer -> typed dataflow IR (``qcompiler.ir``) -> passes (``qcompiler.passes``) ->
TVM codegen (``qcompiler.codegen``) -> an artifact that runs with the TVM runtime alone
(``qcompiler.runtime``). See :mod:`qcompiler.api` for the Python API.
"""
from .version import __version__
from .api import compile, export_onnx, import_onnx, load, run_passes, save_onnx  # noqa: E402
from .errors import UserError  # noqa: E402
from .passes.manager import register_pass  # noqa: E402

__all__ = ["import_onnx", "export_onnx", "save_onnx", "run_passes", "compile", "load",
           "register_pass", "UserError", "__version__"]
