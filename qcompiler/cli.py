"""The ``qcompile`` command line.

    qcompile MODEL.onnx --target x86|arm|cuda --dtype fp32|fp16|int8 -o OUT     compile to an artifact
    qcompile inspect MODEL.onnx [--passes P]                                      IR, op histogram, parameters
    qcompile convert MODEL.onnx -o OUT.onnx [--passes P]                          IR after passes, as ONNX
    qcompile run OUT --input X.npy|X.npz [--output Y.npy]                         run an artifact
             [--rpc-tracker HOST:PORT --rpc-key KEY]                              ... on a remote board
    qcompile verify OUT --data X.npy|X.npz [--qdq F.onnx] [--samples N] [--json]  int8 parity with ONNX Runtime
                                                        (OUT compiled with --debug-layers)

Bad input of any kind is one line on stderr and exit code 2; nothing the user gave is modified and no
half-written output is left behind.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import __version__
from .errors import UserError

COMMANDS = ("compile", "inspect", "convert", "run", "verify")
EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str):
        raise UserError(message, self.prog, f"see '{self.prog} --help'")


def _common_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="the ONNX model file")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=DxDxD",
                   help="static shape for an input with dynamic dimensions, e.g. x=1x3x224x224 "
                        "(repeatable; a dynamic batch alone defaults to 1 with a warning)")
    p.add_argument("--input-value", action="append", default=[], metavar="NAME=V[,V...]",
                   help="bind an input to a constant, e.g. sr=16000 (scalar or comma list, cast to the input's "
                        "declared type; repeatable): it folds into the model and is no longer an input. "
                        "Resolves If branches chosen by such an input")
    p.add_argument("--passes", default=None, metavar="PIPELINE",
                   help="comma-separated passes to run, 'default' or 'none' (see --list-passes)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                   help="load custom passes registered with @register_pass from a Python file")
    p.add_argument("--print-ir-after", default=None, metavar="PASS|all",
                   help="print the IR after the named passes (comma-separated) or after all")
    p.add_argument("--time-passes", action="store_true", help="print the time spent in each pass")
    p.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    q = p.add_argument_group("quantization (with the 'quantize' pass or --dtype int8)")
    q.add_argument("--calib", default=None, metavar="PATH|random",
                   help="calibration data: a folder of images, a .npy/.npz with a leading sample "
                        "dimension, or 'random' (not representative; warns)")
    q.add_argument("--calib-samples", type=int, default=256, metavar="N", help="samples to calibrate on (default 256)")
    q.add_argument("--calib-method", default="minmax", choices=("minmax", "percentile", "entropy", "mse"),
                   help="activation range method (default minmax)")
    q.add_argument("--percentile", type=float, default=99.99, help="for --calib-method percentile (default 99.99)")
    q.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor (default: per channel)")
    q.add_argument("--preprocess", default=None, metavar="ITEMS",
                   help="for image folders: e.g. 'imagenet,bgr' or 'resize=256,mean=0.5,std=0.5,scale=1/255,nhwc'")
    q.add_argument("--eval-samples", type=int, default=64, metavar="N",
                   help="int8 build report (OUT/report.json): evaluate per-layer SQNR and top-1 agreement "
                        "vs fp32 on N samples held back from calibration (default 64; 0: no evaluation)")
    q.add_argument("--eval", default=None, metavar="PATH",
                   help="evaluate the report on this data (.npy/.npz or image folder, same preprocessing) "
                        "instead of the calibration source's next samples")
    q.add_argument("--keep-float", action="append", default=[], metavar="NAME|op:TYPE",
                   help="keep this op (by name) or every op of a type (op:Conv; a bare type works too) "
                        "in float (repeatable)")
    q.add_argument("--force-int8", action="append", default=[], metavar="NAME",
                   help="make this op integer even if --keep-float names its type or the budget would "
                        "keep it float (repeatable; an op with no integer kernel is an error)")
    q.add_argument("--min-sqnr", type=float, default=None, metavar="DB",
                   help="budget: keep the fewest layers float so that the output SQNR vs fp32 is at least "
                        "DB at the --budget-confidence bootstrap lower bound over --sensitivity-samples "
                        "samples of the --calib source after the calibration and --eval-samples ones (the "
                        "first calibration samples if it has no more; greedy with re-evaluation, then pruned)")
    q.add_argument("--max-accuracy-drop", type=float, default=None, metavar="POINTS",
                   help="budget: keep the fewest layers float so that top-1 accuracy on the labelled "
                        "--eval data drops at most POINTS percentage points vs fp32 (bootstrap upper bound)")
    q.add_argument("--sensitivity", action="store_true",
                   help="measure and report the per-layer sensitivity table (only-this-int8 / "
                        "only-this-float SQNR, KL, RMSE) even without a budget")
    q.add_argument("--sensitivity-samples", type=int, default=64, metavar="N",
                   help="samples the sensitivity and the SQNR budget are measured on (default 64)")
    q.add_argument("--budget-confidence", type=float, default=0.95, metavar="C",
                   help="the budget must hold with confidence C for data like the selection samples: "
                        "percentile bootstrap over the samples (1000 resamples, fixed seed) of the dataset "
                        "SQNR 10 log10(sum signal / sum noise) or of the accuracy drop (default 0.95; "
                        "0: the point estimate on the selection samples, which held-back data often misses)")
    q.add_argument("--equalize", action=argparse.BooleanOptionalAction, default=None,
                   help="cross-layer range equalization before quantizing (Nagel et al. 2019; runs "
                        "relu6-to-relu, equalize and absorb-bias, writes OUT/equalization.svg and .json); "
                        "default: on with --per-tensor, off with per-channel weights")
    q.add_argument("--bias-correction", default=None, choices=("none", "analytic", "empirical"),
                   help="correct the mean output shift of the int8 weights: 'analytic' from the "
                        "BatchNorm statistics (bias-correct pass, no data), 'empirical' from the "
                        "calibration data (default when quantizing), or 'none'")
    sp = p.add_argument_group("sparsity (prune pass; qcompiler/sparse)")
    sp.add_argument("--sparsity", type=float, default=None, metavar="F",
                    help="magnitude-prune conv/gemm weights to this fraction of zeros (0 < F < 1); without it, "
                         "sparsity already in the weights is only detected and reported")
    sp.add_argument("--sparsity-pattern", default=None, choices=("unstructured", "2:4", "block4"),
                    help="unstructured (default), 2:4 (2 of every 4 along the reduction axis; implies F = 0.5) "
                         "or block4 (1x4 blocks along the reduction axis)")
    sp.add_argument("--sparsity-global", action="store_true",
                    help="one magnitude ranking over all layers instead of F per layer (unstructured, block4)")
    sp.add_argument("--no-prune", action="append", default=[], metavar="NAME|KIND",
                    help="leave this layer (op name) or kind (Conv, Gemm, MatMul) dense (repeatable); "
                         "depthwise convs are never pruned")
    sp.add_argument("--sparse-objective", default="time", choices=("time", "size"),
                    help="per conv/gemm weight, the encoding the artifact stores and its kernel: 'time' "
                         "(default) the fastest by the cost model (dense unless sparse is predicted faster), "
                         "'size' the fewest bytes, kernel code counted (CSR pointwise convs share one kernel)")


def _rpc_args(p: argparse.ArgumentParser, what: str) -> None:
    g = p.add_argument_group("remote boards (TVM RPC tracker; see README 'Remote boards')")
    g.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT",
                   help=f"{what} on a board registered with the TVM RPC tracker at HOST:PORT "
                        "(python -m tvm.exec.rpc_tracker) instead of this machine; needs --rpc-key")
    g.add_argument("--rpc-key", default=None, metavar="KEY",
                   help="device key the boards' RPC servers registered with (rpc_server --key KEY)")
    g.add_argument("--rpc-timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for a free board of that key (default 60)")


def _rpc_board(args, log):
    """The board of --rpc-tracker/--rpc-key (connected), or None without them."""
    if args.rpc_tracker is None and args.rpc_key is None:
        return None
    if args.rpc_tracker is None or args.rpc_key is None:
        given, missing = ("--rpc-tracker", "--rpc-key") if args.rpc_key is None else ("--rpc-key", "--rpc-tracker")
        raise UserError(f"{given} needs {missing}", given, "give both --rpc-tracker HOST:PORT and --rpc-key KEY")
    from .runtime import remote
    board = remote.connect(args.rpc_tracker, args.rpc_key, args.rpc_timeout)
    log(f"connected to {board}")
    return board


def build_parser() -> argparse.ArgumentParser:
    top = _Parser(prog="qcompile", formatter_class=argparse.RawDescriptionHelpFormatter,
                  description="qcompiler: a quantizing graph compiler for neural networks.\n\n"
                  "  qcompile MODEL.onnx --target x86 --dtype fp32 -o OUT   compile (the default command)\n"
                  "  qcompile inspect MODEL.onnx [--passes P]              IR text, op histogram, parameters\n"
                  "  qcompile convert MODEL.onnx -o OUT.onnx [--passes P]  the IR after passes, as ONNX\n"
                  "  qcompile run OUT --input X.npz [--output Y.npy]       run a compiled artifact\n"
                  "      [--rpc-tracker HOST:PORT --rpc-key KEY]           ... on a board of a TVM RPC device farm\n"
                  "  qcompile verify OUT --data X.npz [--qdq F.onnx]       int8 artifact (--debug-layers) vs its QDQ in ORT\n",
                  epilog="Run 'qcompile COMMAND --help' for a command's options.")
    top.add_argument("--version", action="version", version=f"qcompiler {__version__}")
    top.add_argument("--list-passes", action="store_true", help="list the registered passes and exit")
    sub = top.add_subparsers(dest="command", parser_class=_Parser)

    c = sub.add_parser("compile", help="compile a model to an artifact (the default command)",
                       description="Compile an ONNX model to an artifact directory: model.so (Relax VM + "
                       "kernels + weights) and manifest.json, runnable with the TVM runtime alone.")
    _common_model_args(c)
    c.add_argument("--target", default="x86", choices=("x86", "arm", "cuda"), help="target family (default x86)")
    c.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16", "int8"),
                   help="precision of weights and activations (default fp32); fp16/bf16 store 16 bits and "
                        "compute in fp32 (bf16: --target cuda only); int8 runs the 'quantize' "
                        "pass after the pipeline and needs --calib")
    c.add_argument("--cpu", default=None, help="LLVM CPU name (x86: default the host's; arm: e.g. cortex-a76)")
    c.add_argument("--arch", default="sm_90", help="CUDA architectures, comma-separated (default sm_90)")
    c.add_argument("--features", default="", help="extra LLVM features, e.g. +dotprod,+fullfp16")
    c.add_argument("-o", "--output", required=True, metavar="OUT", help="artifact directory to write")
    c.add_argument("--json", action="store_true",
                   help="print the build report (OUT/report.json, plus the artifact path) as JSON on stdout "
                        "instead of the table")
    c.add_argument("--float-dtype", default="fp32", choices=("fp32", "fp16"),
                   help="with --dtype int8: storage of the layers kept float (fp16: activations and "
                        "weights stored in fp16, arithmetic in fp32; default fp32)")
    c.add_argument("--layer-costs", default="measure", choices=("measure", "model", "off"),
                   help="with a budget (--min-sqnr/--max-accuracy-drop): per-layer int8/float latency for "
                        "choosing among sets that meet it: 'measure' times every kernel on this host (x86; "
                        "else the model), 'model' an analytic MAC/byte model, 'off' accuracy only")
    c.add_argument("--debug-layers", action="store_true",
                   help="with --dtype int8 (x86, arm): also build the per-layer functions and write the "
                        "quantized IR (OUT/model.qir) that `qcompile verify` needs; off by default, as they "
                        "make the artifact larger (model.qir holds every weight again)")
    _rpc_args(c, "with a budget and --layer-costs measure: time the per-layer int8/float kernels")
    c.add_argument("--export-qdq", default=None, metavar="FILE.onnx",
                   help="with --dtype int8: also write the quantized model as QDQ ONNX (ONNX Runtime, TensorRT)")
    _qdq_weights_arg(c)
    c.add_argument("--tune", type=int, default=None, metavar="TRIALS",
                   help="x86: tune the float kernels (fp32/fp16 conv, pool, gemm, elementwise; not the int8 "
                        "dot-product or sparse ones) with MetaSchedule on this host: TRIALS measured schedules "
                        "in all, shared among the kernels in proportion to their estimated work (a kernel "
                        "whose share rounds to 0 is not tuned); each kernel keeps the faster of its best "
                        "tuned and its hand schedule, timed alone here. Records are kept in --tune-db and "
                        "reused: a kernel already tuned with its share runs no new trials")
    c.add_argument("--tune-db", default=None, metavar="DIR",
                   help="MetaSchedule database folder of --tune (default: a per-target folder under the "
                        "qcompiler cache, $QCOMPILER_CACHE_DIR or ~/.cache/qcompiler/tune/TARGET)")

    i = sub.add_parser("inspect", help="print the IR, op histogram and parameter count of a model",
                       description="Import a model (optionally run passes) and print its IR, an op "
                       "histogram (before/after the passes) and the parameter count and bytes.")
    _common_model_args(i)
    i.add_argument("--no-ir", action="store_true", help="do not print the IR text")
    i.add_argument("--json", action="store_true", help="print a JSON summary instead of text")

    v = sub.add_parser("convert", help="write the IR after passes back as ONNX",
                       description="Import a model, run passes (--passes none: import and export only) "
                       "and write the result as ONNX that ONNX Runtime can run.")
    _common_model_args(v)
    v.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="ONNX file to write")
    _qdq_weights_arg(v)

    r = sub.add_parser("run", help="run a compiled artifact on inputs from .npy/.npz",
                       description="Run every sample of an input with a leading sample dimension through "
                       "a compiled artifact and print a short summary.")
    r.add_argument("artifact", help="artifact directory written by 'qcompile'")
    r.add_argument("--input", required=True, metavar="X.npy|X.npz",
                   help=".npy (the single input) or .npz (arrays named like the inputs, or 'x')")
    r.add_argument("--output", default=None, metavar="Y.npy|Y.npz", help="write the outputs here")
    r.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    _rpc_args(r, "run the artifact (and time it: median ms of one run)")

    f = sub.add_parser("verify", help="compare an int8 artifact with its QDQ model in ONNX Runtime",
                       description="Run an int8 artifact (ARM ones under qemu-aarch64) and the QDQ export of "
                       "the same quantized model in ONNX Runtime on the same inputs; print, layer by layer, "
                       "the largest difference in quantization steps (LSB) with each kernel alone on ONNX "
                       "Runtime's inputs and chained end to end, and the share of final-output elements "
                       "within 1 LSB. Exit code 0: PASS (every layer alone within 1 LSB and >= 99 % exact, "
                       ">= 99.9 % of output elements within 1 LSB alone, main = its kernels chained; the end-"
                       "to-end drift is informational), 1: FAIL, 2: bad input.")
    f.add_argument("artifact", help="int8 artifact directory written by 'qcompile --dtype int8 --debug-layers'")
    f.add_argument("--data", required=True, metavar="X.npy|X.npz",
                   help="inputs with a leading sample dimension (as for 'qcompile run')")
    f.add_argument("--qdq", default=None, metavar="FILE.onnx",
                   help="the QDQ model to compare with (default: exported from the artifact's model.qir)")
    f.add_argument("--samples", type=int, default=None, metavar="N", help="use the first N samples (default all)")
    f.add_argument("--json", action="store_true", help="print the report as JSON")
    return top


# ---- helpers ----------------------------------------------------------------------------------
def parse_input_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for s in specs:
        name, eq, dims = s.rpartition("=")
        try:
            if not eq or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.lower().split("x"))
            if any(d <= 0 for d in shape):
                raise ValueError
        except ValueError:
            raise UserError(f"bad --input-shape '{s}'", "--input-shape",
                            "write NAME=1x3x224x224 with positive dimensions") from None
        shapes[name] = shape
    return shapes


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


def load_model(args):
    from .frontend.onnx_import import import_onnx
    check_model_path(args.model)
    for plugin in args.plugin:
        from .passes import load_plugin
        load_plugin(plugin)
    return import_onnx(args.model, parse_input_shapes(args.input_shape) or None,
                       parse_input_values(args.input_value) or None)


def parse_input_values(specs: list[str]) -> dict:
    from .frontend.onnx_control import parse_input_value
    return dict(parse_input_value(s) for s in specs)


def _qdq_weights_arg(p) -> None:
    p.add_argument("--qdq-weights", choices=("int8", "uint8"), default="int8",
                   help="conv/gemm weights of a QDQ model written by this command: int8 (default; TensorRT "
                        "takes only these) or uint8 w+128 with zero point 128, the same real weights, for "
                        "ONNX Runtime on x86 CPUs without VNNI (AVX2 only): its int8-weight kernels there "
                        "add pairs of u8*s8 products in saturating int16 (ORT's 'reduce_range' issue), its "
                        "uint8 ones are exact")


def quantize_options(graph, args):
    """QuantizeOptions from the calibration flags; calibration data is required (or 'random')."""
    from .passes.quantize import QuantizeOptions
    from .quant.data import open_dataset
    if args.calib is None:
        raise UserError("quantization needs calibration data", "--calib",
                        "give --calib DATA.npz|IMAGE_FOLDER, or --calib random to calibrate on noise")
    if args.calib_samples <= 0:
        raise UserError(f"--calib-samples must be positive, got {args.calib_samples}", "--calib-samples")
    calib = None
    if args.calib != "random":
        calib = open_dataset(args.calib, graph.inputs, samples=args.calib_samples, preprocess=_preprocess(args),
                             batch=_batch(graph.inputs))
    return QuantizeOptions(method=args.calib_method, percentile=args.percentile, per_channel=not args.per_tensor,
                           calib=calib, keep_float=frozenset(args.keep_float), progress=not args.quiet,
                           random_samples=min(args.calib_samples, 64),
                           bias_correction=args.bias_correction in (None, "empirical"))


def prune_options(args):
    """PruneOptions from --sparsity/--sparsity-pattern/--sparsity-global/--no-prune (None: no pruning)."""
    from .passes.prune import PruneOptions
    f, pattern = getattr(args, "sparsity", None), getattr(args, "sparsity_pattern", None)
    if f is None and pattern == "2:4":
        f = 0.5
    if f is None:
        for flag, given in (("--sparsity-pattern", pattern), ("--sparsity-global", args.sparsity_global),
                            ("--no-prune", args.no_prune)):
            if given:
                raise UserError(f"{flag} needs --sparsity", flag, "add --sparsity F (e.g. 0.5)")
        return None
    if not 0.0 < f < 1.0:
        raise UserError(f"the fraction of zeros must be between 0 and 1 (exclusive), got {f:g}", "--sparsity",
                        "give the fraction of weights to zero, e.g. 0.5")
    if pattern == "2:4" and f != 0.5:
        raise UserError(f"the 2:4 pattern zeroes exactly half of the weights, --sparsity {f:g} contradicts it",
                        "--sparsity", "drop --sparsity or give 0.5")
    if pattern == "2:4" and args.sparsity_global:
        raise UserError("--sparsity-global has no meaning for 2:4 (every group of 4 keeps 2)",
                        "--sparsity-global", "drop it, or use --sparsity-pattern unstructured|block4")
    return PruneOptions(sparsity=f, pattern=pattern or "unstructured", global_=args.sparsity_global,
                        skip=frozenset(args.no_prune))


def _preprocess(args):
    """--preprocess as a Preprocess (None: not given), for every dataset the compile opens."""
    from .quant.data import Preprocess
    return Preprocess.parse(args.preprocess) if args.preprocess else None


def _batch(inputs) -> int:
    """The batch the model was compiled for: the first input's leading dimension (1 without one)."""
    return inputs[0].shape[0] if inputs and inputs[0].shape else 1


def run_pipeline(graph, args, log, evaluation=None):
    from .passes import PassContext, PassManager, parse_pipeline
    from .plan.dfq import dfq_recipe, equalize_default
    pipeline = parse_pipeline(args.passes)
    prune_opts = prune_options(args)
    if prune_opts is not None and "prune" not in pipeline:       # prune the float weights, before quantize
        pipeline.insert(pipeline.index("quantize") if "quantize" in pipeline else len(pipeline), "prune")
    quantizing = "quantize" in pipeline
    if (quantizing or prune_opts is not None) and "encode-sparse" not in pipeline:
        pipeline.append("encode-sparse")     # last: it decides on the weights the artifact stores
    equalize = args.equalize if args.equalize is not None else quantizing and equalize_default(not args.per_tensor)
    bias = args.bias_correction or ("empirical" if quantizing else "none")
    pipeline, _ = dfq_recipe(pipeline, equalize=equalize, bias_correction=bias)
    ctx = PassContext(log=log)
    if prune_opts is not None:
        ctx.options["prune"] = prune_opts
    from .passes.encode_sparse import EncodeSparseOptions
    ctx.options["encode-sparse"] = EncodeSparseOptions(objective=getattr(args, "sparse_objective", "time"),
                                                       target=getattr(args, "target", "x86"))
    from .plan import mixed
    req = mixed.Request(tuple(args.keep_float), tuple(args.force_int8), args.min_sqnr, args.max_accuracy_drop,
                        args.sensitivity, args.sensitivity_samples, confidence=args.budget_confidence)
    if req.active and "quantize" not in pipeline:
        raise UserError("--min-sqnr/--max-accuracy-drop/--force-int8/--sensitivity need quantization",
                        "--dtype", "add --dtype int8 (or the quantize pass)")
    req.check()
    pm = PassManager(pipeline, print_ir_after=args.print_ir_after, time_passes=args.time_passes,
                     out=sys.stdout, ctx=ctx)
    if "quantize" in pipeline:                  # float passes, then which layers stay float, then quantize
        ctx.options["quantize"] = quantize_options(graph, args)
        at = pipeline.index("quantize")
        pre = PassManager(pipeline[:at], print_ir_after=args.print_ir_after, out=sys.stdout, ctx=ctx)
        pre.run(graph)
        costs = None
        if req.budget is not None and getattr(args, "layer_costs", "off") != "off":
            from .plan import layer_cost
            keep = mixed.resolve_keep_float(graph, req.keep_float, req.force_int8) - set(req.force_int8)
            costs = ctx.data["layer_costs"] = layer_cost.for_budget(graph, _target_spec(args), keep,
                                                                    args.layer_costs, log,
                                                                    remote=getattr(args, "rpc_board", None))
        sel_data = None
        if req.min_sqnr is not None or req.sensitivity:       # measured past calibration and evaluation samples
            sel_data = mixed.selection_data(graph.inputs, evaluation, calib=args.calib,
                                            samples=args.sensitivity_samples, preprocess=_preprocess(args),
                                            batch=_batch(graph.inputs))
        ctx.options["quantize"], ctx.data["mixed"] = mixed.plan(graph, ctx.options["quantize"], req,
                                                                eval_data=evaluation, select_data=sel_data, log=log,
                                                                cost=costs.latency if costs else None)
        from .passes.quantize import CALIB_RUN
        ctx.data[CALIB_RUN] = ctx.data["mixed"].pop("_calib_run", None)
        pm.pipeline, pm.timings = pipeline[at:], list(pre.timings)
    pm.run(graph)
    return pm


def _runs_passes(args) -> bool:
    """inspect/convert run passes when given --passes, or a DFQ or pruning flag (then after the default ones)."""
    return args.passes not in (None, "none") or bool(args.equalize) or args.bias_correction is not None \
        or args.sparsity is not None or args.sparsity_pattern is not None


def is_quantized(graph) -> bool:
    return any(op.kind.startswith("QLinear") or op.kind in ("QuantizeLinear", "Requantize") for op in graph.ops)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


# ---- commands ---------------------------------------------------------------------------------
def cmd_inspect(args, log) -> int:
    from .ir.printer import print_graph
    g = load_model(args)
    n0, b0 = g.param_count()
    before = g.op_histogram()
    pm = run_pipeline(g, args, log) if _runs_passes(args) else None
    after = g.op_histogram()
    n1, b1 = g.param_count()
    if args.json:
        print(json.dumps({
            "model": args.model, "graph": g.name,
            "inputs": [{"name": v.name, "type": str(v.type)} for v in g.inputs],
            "outputs": [{"name": v.name, "type": str(v.type)} for v in g.outputs],
            "ops_before": before, "ops_after": after if pm else before,
            "num_ops": sum(after.values()), "params": n1, "param_bytes": b1,
            "passes": [t.name for t in pm.timings] if pm else [],
        }, indent=2))
        return 0
    if not args.no_ir:
        print(print_graph(g, elide=True))
    print(f"model:   {args.model}  (graph '{g.name}', opset {g.meta.get('opset', '?')})")
    for v in g.inputs:
        print(f"input:   %{v.name}: {v.type}")
    for v in g.outputs:
        print(f"output:  %{v.name}: {v.type}")
    print(f"params:  {n1:,} elements, {_fmt_bytes(b1)}" + (f"  (before passes: {n0:,}, {_fmt_bytes(b0)})" if pm else ""))
    if pm:
        print(f"passes:  {', '.join(t.name for t in pm.timings) or '(none)'}")
        kinds = sorted(set(before) | set(after), key=lambda k: (-before.get(k, 0), k))
        print(f"{'op':<24}{'before':>8}{'after':>8}")
        for k in kinds:
            print(f"  {k:<22}{before.get(k, 0):>8}{after.get(k, 0):>8}")
        print(f"  {'total':<22}{sum(before.values()):>8}{sum(after.values()):>8}")
    else:
        print(f"{'op':<24}{'count':>8}")
        for k, n in before.items():
            print(f"  {k:<22}{n:>8}")
        print(f"  {'total':<22}{sum(before.values()):>8}")
    return 0


def cmd_convert(args, log) -> int:
    from .frontend.onnx_export import save_onnx
    check_model_path(args.model)
    check_output_path(args.output, is_dir=False)
    if os.path.exists(args.output) and os.path.samefile(args.output, args.model):
        raise UserError("output would overwrite the input model", args.output, "choose another -o")
    g = load_model(args)
    pm = run_pipeline(g, args, log) if _runs_passes(args) else None
    if is_quantized(g):
        from .frontend.qdq_export import save_qdq
        save_qdq(g, args.output, uint8_weights=args.qdq_weights == "uint8")   # ONNX Runtime, TensorRT
    else:
        save_onnx(g, args.output)
    log(f"wrote {args.output}: {len(g)} ops" + (f" after {', '.join(t.name for t in pm.timings)}" if pm else ""))
    return 0


def cmd_compile(args, log) -> int:
    """compile, with one progress line on a terminal (passes, lower N kernels, tvm.compile, link)."""
    from .progress import StageLine, listening
    with StageLine("compile", quiet=args.quiet) as line, listening(line):
        return _cmd_compile(args, log)


def _target_spec(args):
    """The TargetSpec of compile's flags (x86 host defaults for inspect/convert)."""
    from .codegen.target import TargetSpec
    if getattr(args, "target", None) is None:
        return TargetSpec("x86", dtype="int8")
    return TargetSpec(family=args.target, dtype=args.dtype, cpu=args.cpu,
                      arch=tuple(a.strip() for a in args.arch.split(",") if a.strip()),
                      features=tuple(f.strip() for f in args.features.split(",") if f.strip()),
                      float_dtype=args.float_dtype, debug_layers=args.debug_layers)


def _cmd_compile(args, log) -> int:
    check_model_path(args.model)
    if args.float_dtype != "fp32" and args.dtype != "int8":
        raise UserError(f"--float-dtype {args.float_dtype} sets the float layers of an int8 build, but --dtype "
                        f"is {args.dtype}", "--float-dtype",
                        "add --dtype int8, or use --dtype fp16 for an all-fp16 build")
    spec = _target_spec(args)
    if spec.family == "cuda":
        from .codegen.cuda.aot import check_archs
        check_archs(spec.arch)              # an --arch this nvcc cannot build: refused before any work
    if spec.family == "cuda" and spec.dtype == "int8":
        from .codegen.cuda.int8 import cuda_int8_layout
        cuda_int8_layout()                  # a bad QC_CUDA_INT8_LAYOUT: refused before any work
    check_output_path(args.output, is_dir=True)
    if args.export_qdq:
        if spec.dtype != "int8":
            raise UserError("--export-qdq needs --dtype int8", "--export-qdq", "add --dtype int8")
        check_output_path(args.export_qdq, is_dir=False)
    if args.debug_layers and (spec.dtype != "int8" or spec.family == "cuda"):
        raise UserError(f"--debug-layers adds the per-layer functions of `qcompile verify` to int8 x86/arm "
                        f"builds; this one is {spec.family} {spec.dtype}", "--debug-layers",
                        "drop --debug-layers, or compile with --dtype int8 for --target x86 or arm")
    tune_opts = None
    if args.tune is not None:
        from .codegen.tune import check_options
        tune_opts = check_options(args.tune, args.tune_db, spec)
    elif args.tune_db is not None:
        raise UserError("--tune-db needs --tune", "--tune-db", "add --tune TRIALS (e.g. --tune 64)")
    if args.rpc_tracker is not None or args.rpc_key is not None:
        if args.min_sqnr is None and args.max_accuracy_drop is None or args.layer_costs != "measure":
            raise UserError("--rpc-tracker times the layer costs of a budgeted build (--min-sqnr or "
                            "--max-accuracy-drop with --layer-costs measure); this build measures nothing",
                            "--rpc-tracker", "add a budget, or run and time the artifact on the board with "
                            "`qcompile run OUT --input X --rpc-tracker HOST:PORT --rpc-key KEY`")
        args.rpc_board = _rpc_board(args, log)
    if spec.dtype != "int8" and args.eval:
        raise UserError("--eval needs --dtype int8 (it is for the int8 build report)", "--eval", "add --dtype int8")
    if spec.dtype == "int8":
        if args.eval_samples < 0:
            raise UserError(f"--eval-samples must be 0 or more, got {args.eval_samples}", "--eval-samples",
                            "give a number of samples, or 0 to skip the evaluation")
        if args.passes in (None, "default"):
            args.passes = "default,quantize"
        elif "quantize" not in args.passes.split(","):
            args.passes += ",quantize"
    from .codegen.artifact import write_artifact
    t0 = time.perf_counter()
    g = load_model(args)
    evaluation = None
    if spec.dtype == "int8":                   # held-back data for the build report; bad --eval fails early
        from .plan import report
        evaluation = report.eval_data(g.inputs, samples=args.eval_samples, calib=args.calib,
                                      calib_samples=args.calib_samples, eval_path=args.eval,
                                      preprocess=_preprocess(args), batch=_batch(g.inputs),
                                      random_calib_samples=min(args.calib_samples, 64))
    ops_before, params_before = g.op_histogram(), g.param_count()
    # the model as given, for the report's output figures: the float passes need not preserve
    # results (relu6-to-relu under --equalize/--per-tensor, pruning, analytic bias correction)
    given = g.clone() if evaluation is not None else None
    pm = run_pipeline(g, args, log, evaluation)
    if args.export_qdq:
        from .frontend.qdq_export import save_qdq
        save_qdq(g, args.export_qdq, uint8_weights=args.qdq_weights == "uint8")
        log(f"wrote {args.export_qdq} (QDQ ONNX of the quantized model)")
    from .plan import report_html
    from .plan import report
    from .plan.dfq import artifact_files
    from .plan.dfq import report as dfq_report
    data = report_html.compile_data(g, pm, model=os.path.basename(args.model), target=spec.family,
                                    dtype=spec.dtype, ops_before=ops_before, params_before=params_before,
                                    timings=args.time_passes)     # seconds only on request: not reproducible
    extra, done = {}, {}
    quantized = spec.dtype == "int8" and is_quantized(g)
    if quantized:
        calib = pm.ctx.options["quantize"].calib
        rep = report.build_report(
            pm.ctx.data.get("quantize.float_graph"), g, evaluation, percentile=args.percentile,
            model=os.path.basename(args.model), target=spec.family, given=given,
            calibration={"source": args.calib, "samples": calib.num_samples if calib is not None
                         else min(args.calib_samples, 64), "method": args.calib_method})
        rep.update(data)
        from .plan import mixed
        rep.update(mixed.report_parts(g, pm.ctx.data.get("mixed") or {}, pm.ctx.options["quantize"], rep))
        if pm.ctx.data.get("layer_costs") is not None:            # per-layer ms, boundaries, slower-than-float
            chosen = (pm.ctx.data.get("mixed") or {}).get("selection", {}).get("float_layers", [])
            rep["latency"] = pm.ctx.data["layer_costs"].to_json(frozenset(chosen))
    else:
        rep = {"format_version": report.FORMAT_VERSION, **data, "layers": report_html.float_layers(g),
               "size": {"params_fp32_bytes": g.param_count()[1]}}

    def full_report(manifest):                                 # report.json and report.html, once
        if "report" not in done:
            r = report.with_library_size(rep, manifest["library"]["bytes"]) if quantized else \
                {**rep, "size": {**rep["size"], "library_fp32_bytes": manifest["library"]["bytes"]}}
            if "sparsity" in r:
                r = {**r, "sparsity": sparse_report.with_library(
                    r["sparsity"], manifest["library"]["bytes"], sparse_report.building_library(args.output))}
            done["report"] = {**r, "warnings": report_html.warnings_of(r)}
        return done["report"]
    if "sparsity" in g.meta:                     # the encode-sparse pass ran (int8, or pruned fp32)
        from .plan import sparse_report
        rep["sparsity"] = sparse_report.sparsity_section(
            g, dense_fp32=pm.ctx.data.get("prune.dense_graph"),
            pruned_fp32=pm.ctx.data.get("quantize.float_graph"), data=evaluation)
    eq = g.meta.get("equalize")
    extra[report.REPORT] = lambda m: report.to_json(full_report(m))
    extra[report_html.HTML_NAME] = lambda m: report_html.render(
        full_report(m), equalization=dfq_report(eq) if eq and eq.get("layers") else None).encode()
    extra.update(artifact_files(eq))                           # equalization.svg/.json when equalize ran
    from .codegen.tune import build_fn as tuned_build
    out = write_artifact(g, spec, args.output, extra_files=extra,
                         build=tuned_build(tune_opts, log) if tune_opts else None)
    if args.json:
        print(json.dumps({"artifact": str(out), "files": sorted(os.listdir(out)), "report": done["report"]},
                         indent=2, sort_keys=True))
    elif quantized and not args.quiet:
        print(report.format_table(done["report"]), end="")
        from .plan import mixed
        print(mixed.format_text(done["report"]), end="")
        from .plan.layer_cost import format_text as latency_text
        print(latency_text(done["report"].get("latency")), end="")
        sec = done["report"].get("sparsity")
        if sec and sparse_report.worth_showing(sec["layers"]):                        # else: nothing to say
            print("\n".join(sparse_report.format_lines(sec)))
    log(f"wrote {out} ({spec.family}, {spec.dtype}) in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_run(args, log) -> int:
    from .runtime import load, run_batches
    if args.output:
        check_output_path(args.output, is_dir=False)
    if args.rpc_tracker is not None:          # a bad OUT fails before waiting for a board
        from .runtime import read_manifest
        read_manifest(args.artifact, verify_hash=False)
    board = _rpc_board(args, log)
    if board is None:
        model = load(args.artifact)
        outs = run_batches(model, args.input)
    else:
        from .runtime import remote
        outs, ms = remote.run_remote(board, args.artifact, args.input)
    import numpy as np
    for name, y in outs.items():
        log(f"{name}: shape {list(y.shape)} {y.dtype}, mean {float(np.mean(y)):.6g}, "
            f"min {float(np.min(y)):.6g}, max {float(np.max(y)):.6g}")
    if board is not None:
        log(f"ran on {board}: {ms:.4f} ms per run (median on the board)")
    if args.output:
        from .runtime import save_outputs
        save_outputs(outs, args.output)
        log(f"wrote {args.output}")
    return 0


def cmd_verify(args, log) -> int:
    from .verify import main as verify_main
    return verify_main(args, log)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        argv.insert(0, "compile")            # `qcompile MODEL.onnx ...` is `qcompile compile ...`
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.list_passes:
            from .passes import available_passes
            for name, info in available_passes().items():
                print(f"{name:<18} {info.doc.splitlines()[0] if info.doc else ''}")
            return 0
        if args.command is None:
            parser.print_help()
            return EXIT_USER_ERROR
        quiet = getattr(args, "quiet", False)

        def log(msg: str) -> None:
            if not quiet:
                from .progress import erase
                erase()                       # the compile progress line, if one is drawn
                print(msg, file=sys.stderr)
        import warnings
        warnings.showwarning = lambda m, c, f, l, file=None, line=None: log(f"qcompile: warning: {m}")
        return {"compile": cmd_compile, "inspect": cmd_inspect, "convert": cmd_convert,
                "run": cmd_run, "verify": cmd_verify}[args.command](args, log)
    except UserError as e:
        print(f"qcompile: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("qcompile: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug in qcompiler: one line unless QCOMPILE_DEBUG is set
        if os.environ.get("QCOMPILE_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"qcompile: internal error: {type(e).__name__}: {msg} "
              "(set QCOMPILE_DEBUG=1 for a traceback and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
