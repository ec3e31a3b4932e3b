"""The pass pipeline of a compilation: the float passes, the choice of the layers that stay
float, then quantization and the sparse weight encoding.

    pm = run_pipeline(graph, opts, log, calib=src, evaluation=src.evaluation())

Order (each step only where the options ask for it):
``<passes>`` → prune (or prune-reconstruct: ``--prune-method obc``, the default with calibration
data) → (DFQ: relu6-to-relu, equalize, absorb-bias, bias-correct) → [layer costs, sensitivity,
mixed-precision plan] → quantize → encode-sparse; ``--weights int4`` (a float ``--dtype``) appends
``quantize-weights`` after the float passes (with ``--weight-rounding gptq`` on the calibration data).

A pre-quantized model (QDQ; ``graph.meta["prequantized"]``) built as int8 runs ``fold-qdq`` in
place of quantize, with its own scales: no DFQ, no calibration, no budget. ``--activations
dynamic`` runs ``quantize-dynamic`` in its place: no DFQ, no calibration (but for ``--smooth-quant``),
no budget (:meth:`CompileOptions.check` refused the options that need them).
"""
from __future__ import annotations

import sys
from dataclasses import replace

from ..errors import UserError
from ..passes import PassContext, PassManager, parse_pipeline
from ..passes.encode_sparse import EncodeSparseOptions
from ..passes.prune import PruneOptions
from ..passes.prune_reconstruct import PruneReconstructOptions
from ..passes.quantize import CALIB_RUN, QuantizeOptions
from ..passes.quantize_dynamic import QuantizeDynamicOptions
from ..passes.quantize_weights import QuantizeWeightsOptions
from ..passes.smooth_quant import SmoothQuantOptions
from ..plan import mixed
from ..plan.dfq import dfq_recipe, equalize_default
from .calib import CalibSource
from .options import BiasCorrection, CompileOptions, SparsityOptions, WeightRounding


def prune_options(sp: SparsityOptions) -> PruneOptions | None:
    """PruneOptions of the sparsity options (None: no pruning), contradictions refused."""
    f, pattern = sp.fraction, sp.pattern
    if not sp.prunes:
        for flag, given in (("--sparsity-pattern", pattern), ("--sparsity-global", sp.global_ranking),
                            ("--no-prune", sp.skip), ("--prune-method", sp.method)):
            if given:
                raise UserError(f"{flag} needs --sparsity", flag, "add --sparsity F (e.g. 0.5)")
        return None
    f = 0.5 if f is None else f                         # 2:4 alone: half
    if not 0.0 < f < 1.0:
        raise UserError(f"the fraction of zeros must be between 0 and 1 (exclusive), got {f:g}", "--sparsity",
                        "give the fraction of weights to zero, e.g. 0.5")
    if pattern == "2:4" and f != 0.5:
        raise UserError(f"the 2:4 pattern zeroes exactly half of the weights, --sparsity {f:g} contradicts it",
                        "--sparsity", "drop --sparsity or give 0.5")
    if pattern == "2:4" and sp.global_ranking:
        raise UserError("--sparsity-global has no meaning for 2:4 (every group of 4 keeps 2)",
                        "--sparsity-global", "drop it, or use --sparsity-pattern unstructured|block4")
    return PruneOptions(sparsity=f, pattern=pattern or "unstructured", global_=sp.global_ranking,
                        skip=frozenset(sp.skip))


def prune_method(opts: CompileOptions) -> str:
    """``--prune-method``, or its default: obc where calibration data is given (not random) and no
    global magnitude ranking is asked for, else magnitude. obc without data is refused (and with
    ``--sparsity-global`` by :class:`PruneReconstructOptions`)."""
    sp, c = opts.sparsity, opts.calib
    method = sp.method or ("obc" if c.source is not None and not c.is_random and not sp.global_ranking
                           else "magnitude")
    if method == "obc" and c.source is None:
        raise UserError("--prune-method obc re-fits the kept weights on calibration data, and none is given",
                        "--prune-method", "add --calib DATA, or use --prune-method magnitude")
    return method


def pass_list(opts: CompileOptions) -> str | None:
    """The ``passes`` option with 'quantize' added for an int8 (or fp8) build."""
    passes = opts.pipeline.passes
    if not opts.quantizing:
        return passes
    if passes in (None, "default"):
        return "default,quantize"
    return passes if "quantize" in passes.split(",") else passes + ",quantize"


def _check_prequantized(opts: CompileOptions) -> None:
    """The options an int8 build of a pre-quantized model cannot honour, refused with one line."""
    c, b = opts.calib, opts.budget
    given = [flag for flag, on in (("--min-sqnr/--max-accuracy-drop", b.budget is not None),
                                   ("--keep-float", bool(b.keep_float)), ("--force-int8", bool(b.force_int8)),
                                   ("--sensitivity", bool(b.sensitivity)), ("--equalize", bool(c.equalize)),
                                   ("--bias-correction", c.bias_correction is not None),
                                   ("--per-tensor", c.per_tensor), ("--sparsity", opts.sparsity.fraction is not None),
                                   ("--smooth-quant", c.smooth_quant is not None),
                                   ("--weight-rounding gptq", c.weight_rounding.value == "gptq"))
             if on]
    if given:
        raise UserError(f"{given[0]} changes how a model is quantized, but this model arrives quantized (its own "
                        "QuantizeLinear/DequantizeLinear) and is compiled with its own scales", given[0],
                        "drop it, or compile the float model it came from")


def _check_prequantized_dtype(graph, opts: CompileOptions) -> None:
    """A pre-quantized model builds in the precision of its own Q/DQ: float8 (of the format its zero
    points give) as fp8, integers as int8; another ``--dtype``/``--fp8-format`` is refused (the
    artifact and its manifest would say one thing and hold another), ``--requantize`` re-calibrates."""
    from ..ir.types import is_fp8
    from ..quant.fp8 import Fp8Format
    stored = {v.type.quant.storage for op in graph.ops for v in list(op.operands) + list(op.results)
              if v.type.quant is not None}
    fp8 = sorted(s for s in stored if is_fp8(s))
    spec = opts.target
    fix = "compile it without --dtype (it builds as it is quantized), or re-calibrate it: --requantize --calib DATA"
    if spec.dtype == "int8" and fp8:
        raise UserError(f"--dtype int8, but this model arrives quantized to {'/'.join(fp8)} (its own float8 "
                        "QuantizeLinear/DequantizeLinear)", "--dtype", fix)
    if spec.dtype == "fp8" and not fp8:
        raise UserError(f"--dtype fp8, but this model arrives quantized to integers ({'/'.join(sorted(stored))}: its "
                        "own QuantizeLinear/DequantizeLinear)", "--dtype", fix)
    if spec.dtype == "fp8" and Fp8Format(spec.fp8_format).storage not in fp8:
        raise UserError(f"--fp8-format {spec.fp8_format}, but this model arrives quantized to {'/'.join(fp8)} (its own "
                        "float8 QuantizeLinear/DequantizeLinear)", "--fp8-format",
                        f"use --fp8-format {Fp8Format.of_storage(fp8[0]).value} (or leave it out), or re-calibrate: "
                        "--requantize --calib DATA")


def quantize_options(opts: CompileOptions, calib: CalibSource) -> QuantizeOptions:
    c = opts.calib
    return QuantizeOptions(method=c.method, percentile=c.percentile, per_channel=not c.per_tensor,
                           calib=calib.calibration(), keep_float=frozenset(opts.budget.keep_float),
                           progress=not opts.quiet, random_samples=c.random_samples,
                           bias_correction=c.bias_correction in (None, BiasCorrection.EMPIRICAL),
                           fp8=opts.target.fp8_format if opts.target.dtype == "fp8" else None,
                           weight_rounding=c.weight_rounding)


def run_pipeline(graph, opts: CompileOptions, log, *, calib: CalibSource | None = None, evaluation=None,
                 board=None) -> PassManager:
    """Run the passes of ``opts`` on ``graph`` in place; returns the PassManager (timings, ctx).
    ``calib``: the opened calibration source (opened here when quantizing without one);
    ``evaluation``: the report's held-back data; ``board``: a connected RPC board for layer costs."""
    pipeline = parse_pipeline(pass_list(opts))
    c = opts.calib
    prequantized = "quantize" in pipeline and bool(graph.meta.get("prequantized"))
    dynamic = "quantize" in pipeline and c.dynamic           # quantize-dynamic: no ranges, no DFQ, no selection
    if prequantized and dynamic:
        raise UserError("--activations dynamic quantizes a float model, but this one arrives quantized (its own "
                        "QuantizeLinear/DequantizeLinear or integer ops)", "--activations",
                        "drop --activations dynamic: the model compiles with its own quantization")
    if prequantized:
        _check_prequantized(opts)
        _check_prequantized_dtype(graph, opts)
        pipeline = ["fold-qdq" if p == "quantize" else p for p in pipeline]
    if dynamic:
        pipeline = ["quantize-dynamic" if p == "quantize" else p for p in pipeline]
    stage = next((p for p in ("quantize", "quantize-dynamic") if p in pipeline), None)   # what quantizes
    prune_opts = prune_options(opts.sparsity)
    prune_pass = None
    if prune_opts is not None:
        prune_pass = "prune-reconstruct" if prune_method(opts) == "obc" else "prune"
        if "prune" not in pipeline and "prune-reconstruct" not in pipeline:   # the float weights, before quantize
            pipeline.insert(pipeline.index(stage) if stage else len(pipeline), prune_pass)
    quantizing = "quantize" in pipeline
    w = opts.weights
    if w.active and "quantize-weights" not in pipeline:     # weight-only: after the float passes
        pipeline.append("quantize-weights")
    if (stage or prequantized or prune_opts is not None) and "encode-sparse" not in pipeline:
        pipeline.append("encode-sparse")     # last: it decides on the weights the artifact stores
    equalize = c.equalize if c.equalize is not None else quantizing and equalize_default(not c.per_tensor)
    bias = (c.bias_correction or (BiasCorrection.EMPIRICAL if quantizing else BiasCorrection.NONE)).value
    pipeline, _ = dfq_recipe(pipeline, equalize=equalize, bias_correction=bias)
    ctx = PassContext(log=log)
    if dynamic:
        ctx.options["quantize-dynamic"] = QuantizeDynamicOptions(granularity=c.dynamic_granularity,
                                                                 per_channel=not c.per_tensor,
                                                                 keep_float=frozenset(opts.budget.keep_float))
    if c.smooth_quant is not None:
        if stage is None:
            raise UserError("--smooth-quant prepares a model for int8 quantization", "--smooth-quant",
                            "add --dtype int8 (and --calib DATA)")
        if "smooth-quant" not in pipeline:         # after the float passes, before the layer choice and quantize
            pipeline.insert(pipeline.index(stage), "smooth-quant")
        sq = SmoothQuantOptions(alpha=None if c.smooth_quant == "auto" else c.smooth_quant)
        if dynamic:                 # the one use of calibration data in a dynamic build; no quantize options to share
            calib = calib or CalibSource.open(c, graph.inputs)
            sq = replace(sq, calib=calib.calibration(), per_channel=not c.per_tensor, granularity=c.dynamic_granularity,
                         keep_float=frozenset(opts.budget.keep_float))
        ctx.options["smooth-quant"] = sq
    if prune_opts is not None:
        ctx.options["prune"] = prune_opts
        if prune_pass == "prune-reconstruct":
            calib = calib or CalibSource.open(c, graph.inputs, sensitivity_samples=opts.budget.sensitivity_samples)
            ctx.options["prune-reconstruct"] = PruneReconstructOptions(prune=prune_opts, calib=calib.reconstruction())
    if "quantize-weights" in pipeline:
        gptq = c.weight_rounding == WeightRounding.GPTQ
        if gptq:
            calib = calib or CalibSource.open(c, graph.inputs)
        ctx.options["quantize-weights"] = QuantizeWeightsOptions(
            block_size=w.block, symmetric=bool(w.symmetric), scale_dtype="float16" if w.scale_dtype == "fp16" else "float32",
            rounding=c.weight_rounding, calib=calib.calibration() if gptq else None,
            keep_float=mixed.resolve_keep_float(graph, opts.budget.keep_float))     # names, op:TYPE
    ctx.options["encode-sparse"] = EncodeSparseOptions(objective=opts.sparsity.objective,
                                                       target=opts.target.family)
    b = opts.budget
    pruning_budget = prune_opts is not None and b.budget is not None and not (b.force_int8 or b.sensitivity)
    if b.active and not quantizing and not pruning_budget:      # a float build's budget checks pruning alone
        raise UserError("--min-sqnr/--max-accuracy-drop/--force-int8/--sensitivity need quantization",
                        "--dtype", "add --dtype int8 (or the quantize pass), or --sparsity for a pruning budget")
    b.check()
    p = opts.pipeline
    pm = PassManager(pipeline, print_ir_after=p.print_ir_after, time_passes=p.time_passes, out=sys.stdout, ctx=ctx)
    if prequantized:
        ctx.options["quantize"] = quantize_options(opts, calib) if calib is not None else QuantizeOptions()
    if quantizing:                  # float passes, then which layers stay float, then quantize
        if calib is None:
            calib = CalibSource.open(c, graph.inputs, sensitivity_samples=b.sensitivity_samples)
        ctx.options["quantize"] = quantize_options(opts, calib)
        at = pipeline.index("quantize")
        pre = PassManager(pipeline[:at], print_ir_after=p.print_ir_after, out=sys.stdout, ctx=ctx)
        pre.run(graph)
        costs = None
        if b.budget is not None and b.layer_costs != "off" and opts.target.dtype == "fp8":
            log("fp8: layers selected by accuracy only (the layer costs time int8 kernels, not float8 ones)")
        elif b.budget is not None and b.layer_costs != "off":
            from ..plan import layer_cost          # loads TVM: only for a budget with layer costs
            keep = mixed.resolve_keep_float(graph, b.keep_float, b.force_int8) - set(b.force_int8)
            costs = ctx.data["layer_costs"] = layer_cost.for_budget(graph, replace(opts.target, dtype="int8"),
                                                                    keep, b.layer_costs, log, remote=board)
        sel_data = calib.selection(evaluation) if b.min_sqnr is not None or b.sensitivity else None
        ctx.options["quantize"], ctx.data["mixed"] = mixed.plan(graph, ctx.options["quantize"], b,
                                                                eval_data=evaluation, select_data=sel_data, log=log,
                                                                cost=costs.latency if costs else None)
        ctx.data[CALIB_RUN] = ctx.data["mixed"].pop("_calib_run", None)
        pm.pipeline, pm.timings = pipeline[at:], list(pre.timings)
    pm.run(graph)
    return pm
