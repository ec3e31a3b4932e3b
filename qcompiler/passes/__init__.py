"""Graph passes over the IR, one module per pass, and the public API for writing your own.

    from qcompiler.passes import register_pass, run_passes
    from qcompiler.passes.rewrite import Op, Any, Const, rewrite
"""
from .manager import (DEFAULT_PIPELINE, PassContext, PassFailed, PassManager, available_passes,
                      load_plugin, parse_pipeline, register_pass, run_passes)

__all__ = ["register_pass", "run_passes", "PassManager", "PassContext", "PassFailed",
           "parse_pipeline", "available_passes", "load_plugin", "DEFAULT_PIPELINE"]
