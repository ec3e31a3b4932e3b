"""Typed options of one compilation: what ``qcompile compile``'s flags and
``qcompiler.compile(model, out, options)`` both turn into.

    opts = CompileOptions(target=TargetSpec("x86", dtype="int8"),
                          calib=CalibOptions(source="calib.npz", samples=128))

Every option group is a frozen dataclass; :meth:`CompileOptions.check` validates the combination
once, before any work, and raises :class:`~qcompiler.errors.UserError` naming the flag.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from ..codegen.target import QUANTIZED_DTYPES, Family, TargetSpec
from ..errors import UserError
from ..ir.quant_ops import DYNAMIC_GRANULARITIES
from ..plan.mixed import BudgetOptions
from ..quant.gptq import WeightRounding
from .shapes import DynamicDim


RANDOM = "random"
"""``CalibOptions.source`` for calibration on seeded random normal data (not representative; warns)."""

RANDOM_SAMPLES_CAP = 64
"""Random calibration draws at most this many samples, whatever ``CalibOptions.samples`` says
(the report's held-back evaluation continues the same random stream after them)."""


class BiasCorrection(str, enum.Enum):
    """``--bias-correction``: how the mean output shift of the int8 weights is corrected."""
    NONE = "none"
    ANALYTIC = "analytic"          # from the BatchNorm statistics (bias-correct pass, no data)
    EMPIRICAL = "empirical"        # from the calibration data (the default when quantizing)


@dataclass(frozen=True)
class ModelSource:
    """How the ONNX file is read: shapes and constant values for its inputs, plugin passes, and
    the dims that stay dynamic (one artifact for a range of sizes: :mod:`.shapes`); a shape may
    name a dynamic dim instead of a size (``input_ids=(1, "S")``)."""
    path: str
    input_shapes: Mapping[str, tuple[int | str, ...]] = field(default_factory=dict)
    input_values: Mapping[str, Any] = field(default_factory=dict)
    plugins: tuple[str, ...] = ()
    dynamic: tuple[DynamicDim, ...] = ()


@dataclass(frozen=True)
class PipelineOptions:
    """Which passes run and what is printed while they do."""
    passes: str | None = None                # "default", "none" or a comma list; None: default
    print_ir_after: str | None = None        # pass names (comma list) or "all"
    time_passes: bool = False


@dataclass(frozen=True)
class CalibOptions:
    """Where the int8 ranges come from and how they are computed (static quantization)."""
    source: str | None = None                # .npy/.npz/image folder, or RANDOM; None: none given
    samples: int = 256
    method: Literal["minmax", "percentile", "entropy", "mse"] = "minmax"
    percentile: float = 99.99
    per_tensor: bool = False                 # one weight scale per tensor (default per channel)
    preprocess: str | None = None            # image folders: e.g. "imagenet,bgr"
    eval_samples: int = 64                   # build report: held-back samples (0: no evaluation)
    eval_path: str | None = None             # ... or this data instead
    equalize: bool | None = None             # None: on with per-tensor weights, off per channel
    bias_correction: BiasCorrection | None = None   # None: empirical when quantizing
    requantize: bool = False                 # a pre-quantized model: drop its Q/DQ, calibrate it afresh
    smooth_quant: float | Literal["auto"] | None = None   # SmoothQuant α (or chosen per layer); None: off
    activations: Literal["static", "dynamic"] = "static"   # dynamic: linear layers' inputs quantized at run time
    dynamic_granularity: Literal["token", "tensor"] = "token"   # dynamic: one scale per row, or per tensor
    weight_rounding: WeightRounding = WeightRounding.NEAREST   # gptq: error-compensating, fitted on the calibration data

    @property
    def dynamic(self) -> bool:
        return self.activations == "dynamic"

    @property
    def is_random(self) -> bool:
        return self.source in (None, RANDOM)

    @property
    def random_samples(self) -> int:
        """Samples of the random stream that calibration draws (``source`` RANDOM)."""
        return min(self.samples, RANDOM_SAMPLES_CAP)


@dataclass(frozen=True)
class SparsityOptions:
    """Pruning (``fraction`` None: only detect sparsity already in the weights) and the weight
    encoding the artifact stores. ``method``: ``magnitude`` zeroes the smallest |w| (``prune``),
    ``obc`` re-fits the kept weights on the calibration data (``prune-reconstruct``, SparseGPT);
    None: obc when calibration data is given (not random), else magnitude."""
    fraction: float | None = None
    pattern: Literal["unstructured", "2:4", "block4"] | None = None
    global_ranking: bool = False
    skip: tuple[str, ...] = ()
    objective: Literal["time", "size"] = "time"
    method: Literal["magnitude", "obc"] | None = None

    @property
    def prunes(self) -> bool:
        """Whether pruning is asked for: a fraction, or the 2:4 pattern (which zeroes half)."""
        return self.fraction is not None or self.pattern == "2:4"


@dataclass(frozen=True)
class WeightOptions:
    """Weight-only quantization (``--weights int4``: the ``quantize-weights`` pass): linear layers'
    weights and embedding tables stored 4-bit in blocks of ``block_size`` along K, activations in
    the float ``--dtype``. None: not given (the defaults, ONNX Runtime's MatMulNBits quantizer's:
    blocks of 128, asymmetric, float32 scales; set only with ``dtype``)."""
    dtype: Literal["int4"] | None = None
    block_size: int | None = None
    symmetric: bool | None = None
    scale_dtype: Literal["fp32", "fp16"] | None = None

    BLOCK_DEFAULT = 128

    @property
    def active(self) -> bool:
        return self.dtype is not None

    def check(self, spec: TargetSpec, sparsity: "SparsityOptions") -> None:
        """One UserError line for a combination the weight-only build cannot honour."""
        from ..quant.blockwise import BLOCK_SIZES
        if not self.active:
            given = [f for f, v in (("--weight-block", self.block_size), ("--weight-symmetric", self.symmetric),
                                    ("--weight-scale-dtype", self.scale_dtype)) if v is not None]
            if given:
                raise UserError(f"{given[0]} sets the weight-only quantization, and there is none", given[0],
                                "add --weights int4 (with a float --dtype)")
            return
        if self.dtype != "int4":
            raise UserError(f"--weights {self.dtype}: weight-only quantization stores int4", "--weights", "give --weights int4")
        if spec.dtype in QUANTIZED_DTYPES:
            raise UserError(f"--weights int4 keeps the activations float, but --dtype {spec.dtype} quantizes them "
                            "(and its weights)", "--weights", "use a float --dtype (fp32 or fp16) with --weights int4, "
                            f"or drop --weights for the {spec.dtype} build")
        if spec.family is Family.CUDA:
            raise UserError("--weights int4 has x86 and arm kernels only (no CUDA int4 kernels yet)", "--weights",
                            "use --target x86 or arm, or drop --weights for a float CUDA build")
        if self.block_size is not None and self.block_size not in BLOCK_SIZES:
            raise UserError(f"--weight-block {self.block_size}: blocks are {', '.join(map(str, BLOCK_SIZES))} inputs",
                            "--weight-block", "give --weight-block 32, 64 or 128 (ONNX Runtime's default: 128)")
        if sparsity.prunes:
            raise UserError("--sparsity prunes dense weights, and --weights int4 stores them 4-bit (no sparse 4-bit "
                            "kernels)", "--sparsity", "drop one of --sparsity and --weights")

    @property
    def block(self) -> int:
        return self.block_size or self.BLOCK_DEFAULT


@dataclass(frozen=True)
class TuneOptions:
    """MetaSchedule tuning of the float kernels (x86)."""
    trials: int
    db: str | None = None


@dataclass(frozen=True)
class RemoteOptions:
    """A board of a TVM RPC tracker (times the layer costs of a budgeted build)."""
    tracker: str
    key: str
    timeout: float = 60.0


@dataclass(frozen=True)
class CompileOptions:
    """Everything one compilation needs besides the model."""
    target: TargetSpec = field(default_factory=TargetSpec)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    calib: CalibOptions = field(default_factory=CalibOptions)
    budget: BudgetOptions = field(default_factory=BudgetOptions)
    sparsity: SparsityOptions = field(default_factory=SparsityOptions)
    weights: WeightOptions = field(default_factory=WeightOptions)
    export_qdq: str | None = None            # also write the quantized model as QDQ ONNX here
    qdq_weights: Literal["int8", "uint8"] = "int8"
    tune: TuneOptions | None = None
    remote: RemoteOptions | None = None
    quiet: bool = False                      # no progress line, no report table

    @property
    def quantizing(self) -> bool:
        return self.target.dtype in QUANTIZED_DTYPES

    def _check_dynamic(self) -> None:
        """``--activations dynamic``: int8 x86/arm, and none of the options that belong to static ranges."""
        spec, cal, b = self.target, self.calib, self.budget
        if spec.dtype != "int8":
            raise UserError(f"--activations dynamic quantizes to int8, but --dtype is {spec.dtype}", "--activations",
                            "add --dtype int8")
        if spec.family is Family.CUDA:
            raise UserError("--activations dynamic builds x86 and arm artifacts (run-time activation "
                            "quantization); CUDA int8 is static", "--activations",
                            "use --target x86|arm, or --activations static --calib DATA for CUDA")
        given = [flag for flag, on in (("--equalize", bool(cal.equalize)),
                                       ("--bias-correction", cal.bias_correction not in (None, BiasCorrection.NONE)),
                                       ("--requantize", cal.requantize),
                                       ("--weight-rounding gptq", cal.weight_rounding is WeightRounding.GPTQ),
                                       ("--min-sqnr/--max-accuracy-drop", b.budget is not None),
                                       ("--force-int8", bool(b.force_int8)), ("--sensitivity", bool(b.sensitivity)),
                                       ("--export-qdq", bool(self.export_qdq)),
                                       ("--debug-layers", bool(spec.debug_layers)))
                 if on]
        if cal.smooth_quant is not None and cal.is_random:
            raise UserError("--smooth-quant observes the activations' channels on calibration data, and this "
                            "dynamic build has none", "--smooth-quant", "add --calib DATA, or drop --smooth-quant")
        if given:
            raise UserError(f"{given[0]} works on calibrated (static) activation ranges; --activations dynamic "
                            "computes them at run time", given[0],
                            f"drop {given[0]}, or use --activations static --calib DATA")

    def check_dynamic_shapes(self, prequantized: bool) -> None:
        """``--dynamic``: no option whose result depends on one input shape (calibrated ranges, a
        per-tensor run-time scale, which would see the padding; tuning, budgets, debug functions)."""
        spec, cal = self.target, self.calib
        if self.quantizing and not cal.dynamic and not prequantized:
            raise UserError("static int8 ranges are calibrated at one input shape; --dynamic builds each bucket "
                            "alike", "--dynamic", "use --activations dynamic (no calibration), or drop --dynamic")
        given = [flag for flag, on in (("--dynamic-granularity tensor", cal.dynamic and cal.dynamic_granularity == "tensor"),
                                       ("--smooth-quant", cal.smooth_quant is not None), ("--requantize", cal.requantize),
                                       ("--export-qdq", bool(self.export_qdq)), ("--debug-layers", spec.debug_layers),
                                       ("--tune", self.tune is not None), ("--rpc-tracker", self.remote is not None),
                                       ("--weight-rounding gptq", self.weights.active
                                        and cal.weight_rounding == WeightRounding.GPTQ),
                                       ("--min-sqnr/--max-accuracy-drop", self.budget.budget is not None))
                 if on]
        if given:
            raise UserError(f"{given[0]} is not available with --dynamic: it depends on one input shape (a per-tensor "
                            "run-time scale would also see the padding)", given[0],
                            f"drop {given[0]}, or compile one shape (--input-shape without --dynamic)")

    def check(self) -> None:
        """Reject contradicting options before any work (one UserError, naming the flag)."""
        spec, cal = self.target, self.calib
        if spec.float_dtype != "fp32" and spec.dtype != "int8":
            raise UserError(f"--float-dtype {spec.float_dtype} sets the float layers of an int8 build, but "
                            f"--dtype is {spec.dtype}", "--float-dtype",
                            "add --dtype int8, or use --dtype fp16 for an all-fp16 build")
        if self.export_qdq and spec.dtype not in QUANTIZED_DTYPES:
            raise UserError("--export-qdq needs --dtype int8 or fp8", "--export-qdq", "add --dtype int8")
        if spec.debug_layers and (spec.dtype not in QUANTIZED_DTYPES or spec.family is Family.CUDA):
            raise UserError(f"--debug-layers adds the per-layer functions of `qcompile verify` to int8/fp8 x86/arm "
                            f"builds; this one is {spec.family} {spec.dtype}", "--debug-layers",
                            "drop --debug-layers, or compile with --dtype int8 for --target x86 or arm")
        if self.remote is not None and (not self.budget.budgeted or self.budget.layer_costs != "measure"):
            raise UserError("--rpc-tracker times the layer costs of a budgeted build (--min-sqnr or "
                            "--max-accuracy-drop with --layer-costs measure); this build measures nothing",
                            "--rpc-tracker", "add a budget, or run and time the artifact on the board with "
                            "`qcompile run OUT --input X --rpc-tracker HOST:PORT --rpc-key KEY`")
        if cal.requantize and (spec.dtype not in QUANTIZED_DTYPES or cal.source is None):
            raise UserError("re-calibrating a pre-quantized model needs --dtype int8 and --calib",
                            "--requantize", "add --calib DATA (and --dtype int8), or drop --requantize")
        if spec.dtype not in QUANTIZED_DTYPES and cal.eval_path and not self.sparsity.prunes:
            raise UserError("--eval needs --dtype int8 or --sparsity (it is for the build report's int8 and "
                            "pruning figures)", "--eval", "add --dtype int8")
        if cal.activations not in ("static", "dynamic") or cal.dynamic_granularity not in DYNAMIC_GRANULARITIES:
            raise UserError(f"--activations {cal.activations} / --dynamic-granularity {cal.dynamic_granularity}",
                            "--activations", "give --activations static|dynamic, --dynamic-granularity token|tensor")
        if cal.dynamic:
            self._check_dynamic()
        self.weights.check(spec, self.sparsity)
        if cal.weight_rounding is WeightRounding.GPTQ:
            if spec.dtype not in QUANTIZED_DTYPES and not self.weights.active:
                raise UserError(f"--weight-rounding gptq rounds quantized weights, but --dtype is {spec.dtype}",
                                "--weight-rounding", "add --dtype int8 or fp8, or --weights int4, or drop "
                                "--weight-rounding")
            if cal.is_random:
                raise UserError("--weight-rounding gptq fits the rounding to calibration data, and "
                                + ("none is given" if cal.source is None else "--calib random is not representative"),
                                "--weight-rounding", "add --calib DATA, or use --weight-rounding nearest")
        if spec.dtype in QUANTIZED_DTYPES and cal.eval_samples < 0:
            raise UserError(f"--eval-samples must be 0 or more, got {cal.eval_samples}", "--eval-samples",
                            "give a number of samples, or 0 to skip the evaluation")
