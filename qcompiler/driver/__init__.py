"""The compile driver: ``compile(model, output, CompileOptions) -> Artifact``, what ``qcompile``
and ``qcompiler.compile`` both call.

    from qcompiler.driver import CalibOptions, CompileOptions, compile
    from qcompiler.codegen.target import TargetSpec
    art = compile("model.onnx", "out", CompileOptions(target=TargetSpec("x86", dtype="int8"),
                                                      calib=CalibOptions(source="calib.npz")))
"""
from .options import (RANDOM, BiasCorrection, BudgetOptions, CalibOptions, CompileOptions, ModelSource,  # noqa: I001
                      PipelineOptions, RemoteOptions, SparsityOptions, TuneOptions, WeightOptions, WeightRounding)
from .calib import CalibSource
from .compile import Artifact, check_model_path, check_output_path, compile, load_model
from .pipeline import run_pipeline
from .report import format_text, is_quantized

__all__ = ["compile", "Artifact", "CompileOptions", "ModelSource", "PipelineOptions", "CalibOptions",
           "BudgetOptions", "SparsityOptions", "TuneOptions", "WeightOptions", "RemoteOptions", "BiasCorrection", "WeightRounding", "RANDOM",
           "CalibSource", "run_pipeline", "load_model", "check_model_path", "check_output_path", "is_quantized",
           "format_text"]
