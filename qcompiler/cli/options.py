"""``qcompile``'s parsed flags → the driver's typed :class:`~qcompiler.driver.CompileOptions`."""
from __future__ import annotations

import re

from ..codegen.target import TargetSpec
from ..driver import (BiasCorrection, BudgetOptions, CalibOptions, CompileOptions, ModelSource, PipelineOptions,
                      RemoteOptions, SparsityOptions, TuneOptions, WeightOptions, WeightRounding)
from ..errors import UserError


def parse_input_shapes(specs: list[str]) -> dict[str, tuple[int | str, ...]]:
    """``NAME=1x3x224x224``; a dim may be the name of a ``--dynamic`` dim without an x in it
    (``input_ids=1xS``)."""
    shapes = {}
    for s in specs:
        name, eq, dims = s.rpartition("=")
        try:
            if not eq or not name:
                raise ValueError
            shape = tuple(d if d.isidentifier() else int(d) for d in re.split("[xX]", dims))
            if any(isinstance(d, int) and d <= 0 for d in shape):
                raise ValueError
        except ValueError:
            raise UserError(f"bad --input-shape '{s}'", "--input-shape",
                            "write NAME=1x3x224x224 with positive dimensions (or the name of a --dynamic dim)") from None
        shapes[name] = shape
    return shapes


def model_source(args) -> ModelSource:
    from ..driver.shapes import parse_dynamic
    from ..frontend.onnx_control import parse_input_value
    return ModelSource(args.model, parse_input_shapes(args.input_shape),
                       dict(parse_input_value(s) for s in args.input_value), tuple(args.plugin),
                       tuple(parse_dynamic(d) for d in getattr(args, "dynamic", [])))


def remote_options(args) -> RemoteOptions | None:
    """--rpc-tracker/--rpc-key (both or neither)."""
    if args.rpc_tracker is None and args.rpc_key is None:
        return None
    if args.rpc_tracker is None or args.rpc_key is None:
        given, missing = ("--rpc-tracker", "--rpc-key") if args.rpc_key is None else ("--rpc-key", "--rpc-tracker")
        raise UserError(f"{given} needs {missing}", given, "give both --rpc-tracker HOST:PORT and --rpc-key KEY")
    return RemoteOptions(args.rpc_tracker, args.rpc_key, args.rpc_timeout)


def _target(args) -> TargetSpec:
    if getattr(args, "target", None) is None:          # inspect/convert: this host
        return TargetSpec("x86")
    dtype, fp8 = args.dtype, getattr(args, "fp8_format", None)
    requantize = getattr(args, "requantize", False)
    own_dtype, own_fp8 = None, []                       # a pre-quantized model compiles as it is quantized
    if not requantize and (dtype is None or dtype == "fp8" and fp8 is None):
        from ..frontend.onnx_qdq import prequantized_formats
        own_dtype, own_fp8 = prequantized_formats(args.model)
    if dtype is None:
        dtype = "int8" if requantize else (own_dtype or "fp32")
    if fp8 is not None and dtype != "fp8":
        raise UserError(f"--fp8-format {fp8} chooses the float8 format of an fp8 build, but --dtype is {dtype}",
                        "--fp8-format", "add --dtype fp8, or drop --fp8-format")
    fp8 = fp8 or next(iter(own_fp8), None)              # a float8 QDQ model: its own format
    return TargetSpec(family=args.target, dtype=dtype, cpu=args.cpu,
                      arch=tuple(a.strip() for a in args.arch.split(",") if a.strip()),
                      features=tuple(f.strip() for f in args.features.split(",") if f.strip()),
                      float_dtype=args.float_dtype, debug_layers=args.debug_layers, fp8_format=fp8 or "e4m3")


def _smooth_quant(v: str | None) -> float | str | None:
    """--smooth-quant's value: None (off), "auto", or α in [0, 1]."""
    if v is None or v == "auto":
        return v
    try:
        a = float(v)
    except ValueError:
        a = -1.0
    if not 0.0 <= a <= 1.0:
        raise UserError(f"--smooth-quant takes a strength between 0 and 1, got '{v}'", "--smooth-quant",
                        "give e.g. --smooth-quant 0.5, or --smooth-quant alone to choose it per layer")
    return a


def compile_options(args) -> CompileOptions:
    """The options of any command that runs passes (compile, inspect, convert)."""
    tune = None
    if getattr(args, "tune", None) is not None:
        tune = TuneOptions(args.tune, args.tune_db)
    elif getattr(args, "tune_db", None) is not None:
        raise UserError("--tune-db needs --tune", "--tune-db", "add --tune TRIALS (e.g. --tune 64)")
    return CompileOptions(
        target=_target(args),
        pipeline=PipelineOptions(args.passes, args.print_ir_after, args.time_passes),
        calib=CalibOptions(source=args.calib, samples=args.calib_samples, method=args.calib_method,
                           percentile=args.percentile, per_tensor=args.per_tensor, preprocess=args.preprocess,
                           eval_samples=args.eval_samples, eval_path=args.eval, equalize=args.equalize,
                           bias_correction=BiasCorrection(args.bias_correction) if args.bias_correction else None,
                           requantize=getattr(args, "requantize", False),
                           smooth_quant=_smooth_quant(getattr(args, "smooth_quant", None)),
                           activations=getattr(args, "activations", "static"),
                           dynamic_granularity=getattr(args, "dynamic_granularity", "token"),
                           weight_rounding=WeightRounding(getattr(args, "weight_rounding", "nearest"))),
        budget=BudgetOptions(tuple(args.keep_float), tuple(args.force_int8), args.min_sqnr, args.max_accuracy_drop,
                             args.sensitivity, args.sensitivity_samples, args.budget_confidence,
                             getattr(args, "layer_costs", "off")),
        weights=WeightOptions(getattr(args, "weights", None), getattr(args, "weight_block", None),
                              getattr(args, "weight_symmetric", None), getattr(args, "weight_scale_dtype", None)),
        sparsity=SparsityOptions(args.sparsity, args.sparsity_pattern, args.sparsity_global, tuple(args.no_prune),
                                 args.sparse_objective, getattr(args, "prune_method", None)),
        export_qdq=getattr(args, "export_qdq", None), qdq_weights=getattr(args, "qdq_weights", "int8"),
        tune=tune, remote=remote_options(args) if hasattr(args, "rpc_tracker") else None,
        quiet=args.quiet)
