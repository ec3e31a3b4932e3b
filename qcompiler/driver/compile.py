"""``compile(model, output, options) -> Artifact``: the one compile driver behind ``qcompile``
and ``qcompiler.compile``.

    art = compile("model.onnx", "out", CompileOptions(target=TargetSpec("x86", dtype="int8"),
                                                      calib=CalibOptions(source="calib.npz")))
    art.path, art.report["sqnr"]...

Steps: check the options and the paths (before any work) → import → open the calibration source
once → run the pipeline → (QDQ export) → the build report → lower, build, link and write the
artifact folder atomically (nothing half-written on error).
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..codegen.target import Family
from ..errors import UserError
from ..ir.graph import Graph
from .calib import CalibSource
from .options import CompileOptions, ModelSource
from .pipeline import prune_options, run_pipeline
from .report import ReportFiles

Log = Callable[[str], None]


@dataclass
class Artifact:
    """A compiled artifact folder and what the compilation knows about it."""
    path: Path
    graph: Graph                              # the IR as compiled (after the passes)
    report: dict = field(default_factory=dict)    # OUT/report.json's content
    seconds: float = 0.0

    def __fspath__(self) -> str:             # qcompiler.load(artifact) and os.path functions take it
        return str(self.path)


# ---- paths --------------------------------------------------------------------------------------
def check_output_path(path: str, is_dir: bool) -> None:
    """Fail early, before any work, if ``path`` cannot be written."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise UserError(f"output folder {parent} does not exist", path, "create it or choose another -o")
    if not os.access(parent, os.W_OK):
        raise UserError(f"cannot write in {parent} (permission denied)", path, "choose a writable -o")
    if os.path.exists(path) and is_dir and not os.path.isdir(path):
        raise UserError("output exists and is not a directory", path, "remove it or choose another -o")
    if os.path.isdir(path) and not is_dir:
        raise UserError("output is a directory", path, "give a file name such as out.onnx")


def check_model_path(path: str) -> None:
    if not os.path.exists(path):
        raise UserError("model file not found", path, "check the path")
    if os.path.isdir(path):
        raise UserError("model path is a directory", path, "give the .onnx file")


def load_model(src: ModelSource) -> Graph:
    """Import ``src.path`` (plugins loaded first: they may register ops' passes)."""
    from ..frontend.onnx_import import import_onnx
    check_model_path(src.path)
    if src.dynamic:
        raise UserError("--dynamic builds an artifact for a range of sizes; this command reads the model at one "
                        "shape", "--dynamic", "give --input-shape sizes instead (or use it with `qcompile compile`)")
    named = next(((k, d) for k, s in src.input_shapes.items() for d in s if isinstance(d, str)), None)
    if named is not None:
        k, d = named
        raise UserError(f"bad --input-shape for '{k}': '{d}' is not a size, and only a compile with --dynamic {d}=LO..HI "
                        "keeps a dim dynamic", "--input-shape", f"give a size for {d}, or add --dynamic {d}=LO..HI")
    for plugin in src.plugins:
        from ..passes import load_plugin
        load_plugin(plugin)
    return import_onnx(src.path, dict(src.input_shapes) or None, dict(src.input_values) or None)


# ---- the driver -----------------------------------------------------------------------------------
def _check_before_work(model, output: str, opts: CompileOptions) -> None:
    if isinstance(model, ModelSource):
        check_model_path(model.path)
    opts.check()
    spec = opts.target
    if spec.family is Family.CUDA:
        from ..codegen.cuda.aot import check_archs
        check_archs(spec.arch)              # an --arch this nvcc cannot build: refused before any work
    if spec.family is Family.CUDA and spec.dtype == "int8":
        from ..codegen.cuda.int8 import cuda_int8_layout
        cuda_int8_layout()                  # a bad QC_CUDA_INT8_LAYOUT: refused before any work
    check_output_path(output, is_dir=True)
    if opts.export_qdq:
        check_output_path(opts.export_qdq, is_dir=False)


def _dequantized_model(g: Graph) -> Graph:
    """``--requantize``: the float model a QDQ model stands for (each activation Q/DQ pair a Clip to
    its grid's range, weights dequantized: :func:`qcompiler.passes.fold_qdq.float_reference`),
    to be calibrated afresh."""
    from ..passes.fold_qdq import float_reference
    if not g.meta.get("prequantized"):
        raise UserError("the model is float: there is no quantization to re-calibrate", "--requantize",
                        "drop --requantize: --dtype int8 --calib DATA quantizes a float model")
    f = float_reference(g)
    left = sorted({op.kind for op in f.ops if op.kind in ("QuantizeLinear", "DequantizeLinear", "ConvInteger",
                                                          "MatMulInteger")})
    if left:
        raise UserError(f"only QDQ models can be re-calibrated; this one keeps {', '.join(left)} once its Q/DQ pairs "
                        "are removed (dynamic int8 or integer ops)", "--requantize", "compile it as it is, without --requantize")
    f.meta["prequantized"] = False
    return f


def compile(model: ModelSource | Graph | str | os.PathLike, output: str | os.PathLike,
            options: CompileOptions | None = None, *, log: Log | None = None) -> Artifact:
    """Compile ``model`` (an ONNX path, a :class:`ModelSource` or an IR graph, which is changed in
    place) to the artifact folder ``output``. Raises UserError for bad input before any work."""
    opts = options or CompileOptions()
    log = log or (lambda msg: None)
    output = os.fspath(output)
    if isinstance(model, (str, os.PathLike)):
        model = ModelSource(os.fspath(model))
    _check_before_work(model, output, opts)
    if isinstance(model, ModelSource) and model.dynamic:
        return _compile_buckets(model, output, opts, log)
    spec = opts.target
    tune_opts = None
    if opts.tune is not None:
        from ..codegen.tune import check_options
        tune_opts = check_options(opts.tune.trials, opts.tune.db, spec)
    board = None
    if opts.remote is not None:
        from ..runtime import remote
        board = remote.connect(opts.remote.tracker, opts.remote.key, opts.remote.timeout)
        log(f"connected to {board}")
    t0 = time.perf_counter()
    g = load_model(model) if isinstance(model, ModelSource) else model
    name = os.path.basename(model.path) if isinstance(model, ModelSource) else g.name
    if opts.calib.requantize:
        g = _dequantized_model(g)
    calib = evaluation = None
    prequantized = opts.quantizing and bool(g.meta.get("prequantized"))
    pruning = prune_options(opts.sparsity) is not None
    if opts.quantizing and not ((prequantized or opts.calib.dynamic) and opts.calib.source is None) \
            or pruning and opts.calib.source is not None:
        # opened once; held-back data for the report; bad data fails early (a QDQ model needs none)
        calib = CalibSource.open(opts.calib, g.inputs, sensitivity_samples=opts.budget.sensitivity_samples)
        evaluation = calib.evaluation()
    if pruning and not opts.quantizing and opts.budget.budget is not None and evaluation is None:
        raise UserError("a float build's --min-sqnr/--max-accuracy-drop checks the pruning on held-back samples, "
                        "and there are none", "--min-sqnr/--max-accuracy-drop",
                        "add --calib DATA (the samples after --calib-samples are held back) or --eval DATA")
    ops_before, params_before = g.op_histogram(), g.param_count()
    # the model as given, for the report's output figures: the float passes need not preserve
    # results (relu6-to-relu under --equalize/--per-tensor, pruning, analytic bias correction)
    # (a pre-quantized model's outputs are measured against the float model its Q/DQ stand for)
    given = g.clone() if evaluation is not None and not prequantized else None
    pm = run_pipeline(g, opts, log, calib=calib, evaluation=evaluation, board=board)
    if opts.export_qdq:
        from ..frontend.qdq_export import save_qdq
        save_qdq(g, opts.export_qdq, uint8_weights=opts.qdq_weights == "uint8")
        log(f"wrote {opts.export_qdq} (QDQ ONNX of the quantized model)")
    files = ReportFiles.of(g, pm, opts, name=name, ops_before=ops_before, params_before=params_before,
                           evaluation=evaluation, given=given, output=output)
    check = files.rep.get("sparsity", {}).get("pruning_effect", {}).get("budget") or {}
    if check.get("met") is False:                  # pruning alone spent the budget: say so, with the figure
        warnings.warn(check["warning"], stacklevel=2)
    from ..codegen.artifact import write_artifact
    from ..codegen.tune import build_fn as tuned_build
    out = write_artifact(g, spec, output, extra_files=files.extra,
                         build=tuned_build(tune_opts, log) if tune_opts else None)
    return Artifact(Path(out), g, files.final(), time.perf_counter() - t0)


def _compile_buckets(model: ModelSource, output: str, opts: CompileOptions, log: Log) -> Artifact:
    """``--dynamic``: the padding check on ONNX Runtime, then the model imported and passed once
    per bucket, one artifact with a function per bucket (:mod:`.shapes`). The report is the
    largest bucket's."""
    from ..codegen.artifact import ShapeBuckets, write_artifact
    from ..frontend.onnx_control import bind_inputs
    from ..frontend.onnx_load import load_model as load_onnx
    from ..frontend.onnx_qdq import is_prequantized
    from ..runtime.manifest import TensorSpec
    from . import shapes
    opts.check_dynamic_shapes(prequantized=is_prequantized(model.path))
    t0 = time.perf_counter()
    proto, where = load_onnx(model.path)
    given = {k: v for k, v in model.input_shapes.items() if not any(isinstance(d, str) for d in v)}
    sym = shapes.symbolic_shapes(proto, model.input_shapes, model.dynamic, where)
    combos = shapes.assignments(model.dynamic)
    out_shapes = shapes.check_padding(bind_inputs(proto, dict(model.input_values) or None, given, where), sym,
                                      model.dynamic, where, fixed=given)
    log(f"dynamic {', '.join(map(str, model.dynamic))}: padding leaves the outputs unchanged (ONNX Runtime); "
        f"{len(combos)} bucket(s)")
    buckets = ShapeBuckets(opts.target, {d.name: (d.lo, d.hi) for d in model.dynamic})
    for i, sizes in enumerate(combos):
        log(f"bucket {i + 1}/{len(combos)}: {', '.join(f'{k}={v}' for k, v in sizes.items())}")
        g = pm = None               # the previous bucket is lowered: let its graph go before the next import
        g = load_model(replace(model, input_shapes={**given, **shapes.concrete(sym, sizes)}, dynamic=()))
        ops_before, params_before = g.op_histogram(), g.param_count()
        pm = run_pipeline(g, opts, log)
        buckets.add(sizes, g)
    buckets.inputs = [TensorSpec(v.name, sym.get(v.name, tuple(v.shape)), v.dtype) for v in g.inputs]
    buckets.outputs = [TensorSpec(v.name, s, v.dtype) for v, s in zip(g.outputs, out_shapes)]
    files = ReportFiles.of(g, pm, opts, name=os.path.basename(model.path), ops_before=ops_before,
                           params_before=params_before, evaluation=None, given=None, output=output)
    out = write_artifact(g, opts.target, output, extra_files=files.extra, buckets=buckets)
    return Artifact(Path(out), g, files.final(), time.perf_counter() - t0)
