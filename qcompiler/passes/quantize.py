"""``quantize``: post-training static quantization to integer-only ops.

Runs after the default pipeline (BatchNorm folded, activations fused into FusedConv/FusedGemm);
not part of it. Activations become asymmetric uint8 (or int8, or symmetric int8 for TensorRT),
weights symmetric int8 per output channel (or per tensor), biases int32. A real value r is stored as q with r = s (q - z), so a conv

    y[o] = Σ x * w[o] + b[o]  ≈  s_x s_w[o] (Σ (x_q - z_x) w_q[o] + b_q[o]) = s_x s_w[o] acc[o]
    y_q[o] = z_y + M[o] acc[o],   M[o] = s_x s_w[o] / s_y   (fixed point: qcompiler.quant.requant)

with b_q = round(b' / (s_x s_w[o])) in int32, where b' is the bias corrected for the mean error of the
int8 weights (``bias_correction``, on by default with calibration data; Nagel et al., *Data-Free
Quantization Through Weight Equalization and Bias Correction*, ICCV 2019, §5, the empirical variant)::

    b'[o] = b[o] - mean over output positions of (ε ⊛ x̄)[o],   ε = dequant(W_q) - W,  x̄ = E[x]

x̄ is the layer input averaged over the calibration data (spatial positions kept, so taps reading the
zero padding count as 0). Rounding the weights shifts each output channel's mean by that amount,
and the later layers amplify the shift; the correction removes it in expectation. It is kept only
where it lowers the error of the graph outputs on the calibration data (both versions run by
onnxruntime as their QDQ export; :func:`~.quantize_bias.bias_correction_helps`: it cost uspsnet 0.11 dB), recorded in
``graph.meta["quant"]["scheme"]["bias_correction"]``. The float graph itself is not changed (unlike the ``bias-correct`` pass, whose helpers this reuses). Steps:

1. prepare: what an integer kernel cannot fuse is split off: FusedConv(X, W, B, Z) becomes
   FusedConv(X, W, B) -> Add(., Z) -> activation, and activations other than Relu/Clip/HardSwish
   (Sigmoid, LeakyRelu, ...) become standalone ops that stay float; a transformer's linear layer
   (MatMul of a (B, S, K) activation by a constant matrix, and its bias Add) becomes one GEMM over
   the B·S rows between two Reshapes.
2. plan, in topological order (``keep_float`` names or kinds stay float):

   ===============================================  =========================================
   float op                                         becomes
   ===============================================  =========================================
   Conv, FusedConv (act "", Relu, Clip), const W/B  QLinearConv (rank-4 input); with a float32
                                                    result when no integer op reads it (a PRelu's
                                                    input, a detector head)
   FusedConv/FusedGemm act HardSwish, or a          QLinearConv/QLinearGemm with activation
   Conv/Gemm whose output z feeds only              "HardSwish": a float32 epilogue with ONE
   z·HardSigmoid(S·z) (equalize's form, S > 0)      quantization point (qcompiler.quant.hardswish)
   HardSwish after a QLinear conv/gemm (one use)    the same epilogue
   Gemm, FusedGemm, MatMul with const W             QLinearGemm (2-D input, transA = 0, bias
                                                    with N elements; W stored N x K); with a
                                                    float32 result when no integer op reads it
   MatMul of a rank-3+ activation by a const        Reshape to rows -> QLinearGemm (+ the bias
   matrix (+ a bias Add)                            Add) -> Reshape (step 1)
   Add                                              QLinearAdd, when an operand is quantized and an
                                                    integer op reads the sum (else float: no
                                                    quantization point that only float ops read)
   Mul of two activations                           QLinearMul, when an operand is quantized (the
                                                    other, e.g. a squeeze-excite gate from
                                                    HardSigmoid, gets a QuantizeLinear);
                                                    y_q = z_y + rrs((a_q-z_a)(b_q-z_b) m, s)
   Relu, Clip after a QLinear op (single use)       folded into its output clamp
   GlobalAveragePool / AveragePool                  QLinear... (input quantized; constant count),
                                                    float when no integer op reads the result
   MaxPool, GlobalMaxPool, Reshape, Flatten,        the same op on the quantized value, with the
   Transpose, Squeeze, Unsqueeze, Slice, Pad,       input's params (Pad pads with the zero point)
   Relu, Clip
   Concat                                           Concat of quantized values sharing the output's
                                                    params (Requantize where an input differs and
                                                    its producer cannot emit them directly); float
                                                    when no integer op reads the result
   anything else (Softmax, Sigmoid, ...)            float, DequantizeLinear before it and
                                                    QuantizeLinear after it where needed (an
                                                    element-wise one between a DequantizeLinear and
                                                    a QuantizeLinear: a table on the stored values,
                                                    an integer reader of a conv, pool or Concat)
   ===============================================  =========================================

3. calibrate: one :func:`~qcompiler.quant.calibrate.collect_ranges` pass of the float graph over
   the data, for every value whose range sets params (QLinear outputs, Concat outputs, float values
   entering quantized ops); ``ranges`` given in the options take precedence. With calibration data
   and ``bias_correction``, a second pass over it averages the inputs of the Conv/Gemm layers (its
   outputs kept as the fp32 reference), and
   a third runs the quantized graph with and without the correction to decide whether to keep it.
4. rewrite, recording per layer in ``graph.meta["quant"]`` (JSON): kind, precision, params, range,
   and in ``graph.meta["quant"]["float_values"]`` which float value each quantized value stands for
   (``{"conv_out": "conv_out", "x_q": "x", "a_rq": "a"}``), named as in the float graph after step 1.
   That float graph is kept in ``ctx.data["quantize.float_graph"]`` (a clone sharing the constant
   arrays): the build report (:mod:`qcompiler.plan.report`) evaluates it as the fp32 reference, in
   which every split-off value (``y_acc`` of a fused residual block) has its fp32 counterpart.

Float8 (``fp8="e4m3"`` or ``"e5m2"``, ``--dtype fp8``; :mod:`qcompiler.quant.fp8`): only Conv, Gemm
and MatMul by a constant become QLinearConv/QLinearGemm, on float8 operands (scale only, zero point
0): the activation per tensor with s = amax / max from calibration (448 for E4M3, 57344 for E5M2),
the weights per output channel (or per tensor), the bias float32, and always a float32 result
``clamp(f32(Σ x_q w_q) * f32(s_x s_w[c]) + b[c])`` (a Relu/Clip folded into the clamp). Every
other op stays float32 (the issue asks fp16 for them; on the CPU fp32 is what the kernels run
fastest and it costs nothing in size, the weights being in the convs/gemms). The docstring example
with ``fp8="e4m3"`` (ranges x: (-1, 1)) gives::

    %w_q = const dense<[...]> : tensor<2x4x!quant.uniform<f8E4M3FN:f32:0, {0.002232143, 0.002232143}>>
    %x_q = QuantizeLinear(%x) : tensor<1x4x!quant.uniform<f8E4M3FN:f32, 0.002232143>>
    %y = QLinearGemm(%x_q, %w_q) {activation = "Relu", activation_params = [], multiplier = [], shift = []} : tensor<1x2xf32>
    %y_q = QuantizeLinear(%y) : ...      (and so on: every conv/gemm input gets its own QuantizeLinear)

This module holds the options and the pass; steps 1 to 3 are :mod:`.quantize_plan`, step 4
:mod:`.quantize_rewrite`, and the bias-correction check :mod:`.quantize_bias`.

Before (with ``ranges={"x": (-1, 1), "y": (0, 3)}`` in the options instead of calibration data)::

    graph @g(%x: tensor<1x4xf32>) {
      %w = const dense<[0.5, -1.0, 0.25, 0.0, 1.0, 0.5, -0.5, 0.25]> : tensor<2x4xf32>
      %y = FusedGemm(%x, %w) {activation = "Relu", activation_params = [], alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<1x2xf32>
      %v = const dense<[1.0, -0.5]> : tensor<1x2xf32>
      %z = Gemm(%y, %v) {alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<1x1xf32>
      return %z
    }

After (x: 2/255 per step around 127; y: 3/255 from 0; M = s_x s_w / s_y = 1442928868 * 2^-38; z: f32)::

    graph @g(%x: tensor<1x4xf32>) {
      %w_q = const dense<[63, -127, 32, 0, 127, 63, -63, 32]> : tensor<2x4x!quant.uniform<i8:f32:0, {0.007874017:0, 0.007874017:0}>>
      %v_q = const dense<[127, -63]> : tensor<1x2x!quant.uniform<i8:f32:0, {0.007874017:0}>>
      %x_q = QuantizeLinear(%x) : tensor<1x4x!quant.uniform<u8:f32, 0.007843138:127>>
      %y = QLinearGemm(%x_q, %w_q) {activation = "Relu", activation_params = [], multiplier = [1442928868, 1442928868], shift = [38, 38]} : tensor<1x2x!quant.uniform<u8:f32, 0.011764706:0>>
      %z = QLinearGemm(%y, %v_q) {activation = "", activation_params = [], multiplier = [], shift = []} : tensor<1x1xf32>
      return %z
    }
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError
from ..ir.graph import Graph
from ..quant.fp8 import FORMATS, Fp8Format
from ..quant.gptq import GptqRounding, WeightRounding
from ..quant.observers import Method
from ._common import pass_options
from .manager import PassContext, register_pass
from .quantize_bias import choose_corrections, layer_input_means
from .quantize_plan import CONVS, GEMMS, QUANT_KINDS, activation_qparams, plan, prepare
from .quantize_rewrite import Rewriter


@dataclass
class QuantizeOptions:
    method: str = "minmax"                 # range observer: minmax, percentile, entropy, mse
    percentile: float = 99.99              # for method = percentile
    per_channel: bool = True               # int8 weights: one scale per output channel, else per tensor
    calib: Any = None                      # calibration feeds (a quant.data.Dataset); None: random, warned
    activation_dtype: str = "uint8"        # uint8 or int8
    symmetric_activations: bool = False    # zero point 0, int8 (what TensorRT's explicit quantization takes)
    keep_float: frozenset = frozenset()    # op names or op kinds that stay float
    ranges: dict = field(default_factory=dict)   # value name -> (lo, hi): given ranges win over calibration
    random_samples: int = 16               # feeds of random data when calib is None
    progress: bool = False                 # a one-line progress bar on stderr while calibrating (TTY only)
    bias_correction: bool = True           # b -= ε·E[x] from the calibration data (not with calib None)
    fp8: str | None = None                 # "e4m3" | "e5m2": float8 convs/gemms instead of int8 (see below)
    weight_rounding: WeightRounding = WeightRounding.NEAREST   # gptq: error-compensating, from calib (see below)

    def __post_init__(self):
        known = [m.value for m in Method]
        if str(getattr(self.method, "value", self.method)) not in known:
            _bad("method", self.method, known)
        self.method = Method(self.method).value
        if self.activation_dtype not in ("uint8", "int8"):
            _bad("activation_dtype", self.activation_dtype, ["uint8", "int8"])
        if self.symmetric_activations and self.activation_dtype != "int8":
            raise UserError("symmetric activations need activation_dtype int8", "quantize options",
                            "set activation_dtype='int8' or symmetric_activations=False")
        if not 0 < self.percentile <= 100:
            raise UserError(f"percentile {self.percentile} outside (0, 100]", "quantize options",
                            "give e.g. 99.99")
        self.keep_float = frozenset(self.keep_float)
        if str(getattr(self.weight_rounding, "value", self.weight_rounding)) not in [r.value for r in WeightRounding]:
            _bad("weight_rounding", self.weight_rounding, [r.value for r in WeightRounding])
        self.weight_rounding = WeightRounding(self.weight_rounding)
        if self.fp8 is not None:
            if str(getattr(self.fp8, "value", self.fp8)) not in FORMATS:
                _bad("fp8", self.fp8, list(FORMATS))
            self.fp8 = Fp8Format(self.fp8).value

    @property
    def fp8_storage(self) -> str | None:
        """The float8 storage dtype of an fp8 build (None: int8)."""
        return Fp8Format(self.fp8).storage if self.fp8 is not None else None

    @property
    def precision(self) -> str:
        """What the report calls a quantized layer: "int8" or "fp8"."""
        return "int8" if self.fp8 is None else "fp8"


def _bad(name, got, known):
    raise UserError(f"unknown {name} '{got}'", "quantize options", f"known: {', '.join(known)}")


# ctx.data key: {"calib", "means", "float_outputs"} of a float run over the calibration data made
# before the pass (qcompiler.plan.mixed's sensitivity), re-used when it is the same data
CALIB_RUN = "quantize.calib_run"


def gptq_rounding(graph: Graph, pl, opts: QuantizeOptions, pre: dict | None = None) -> GptqRounding | None:
    """``weight_rounding`` gptq: the Gram matrices of the convs/gemms to quantize over the
    calibration data (the float graph after step 1), or those of the run ``pre`` made on the same
    data; None for round-to-nearest (:meth:`~qcompiler.quant.gptq.GptqRounding.asked`)."""
    if pre is not None and pre["calib"] is opts.calib and pre.get("rounding") is not None \
            and opts.weight_rounding is WeightRounding.GPTQ:
        return pre["rounding"]
    layers = [op for op, role in pl.role.items() if role == "compute" and op.kind in CONVS + GEMMS]
    return GptqRounding.asked(opts.weight_rounding, graph, opts.calib, layers, "quantize")


@register_pass("quantize", options=QuantizeOptions)
def quantize(graph: Graph, ctx: PassContext) -> bool:
    """Post-training static int8 quantization: calibrate activation ranges, quantize weights
    (per-channel int8) and biases (int32), rewrite Conv/Gemm/Add/pooling into integer-only QLinear
    ops with fixed-point requantization, and keep the rest float between Dequantize/QuantizeLinear."""
    opts = pass_options(ctx, "quantize", QuantizeOptions)
    if graph.meta.get("prequantized"):
        raise UserError("the model is already quantized (it has its own QuantizeLinear/DequantizeLinear, "
                        "ConvInteger or MatMulInteger); the quantize pass calibrates float models",
                        "quantize", "run fold-qdq instead (what `qcompile MODEL --dtype int8` does with a "
                        "pre-quantized model: its own scales on the integer kernels), or --dtype fp32 for a "
                        "float build of its quantization")
    if any(op.kind in QUANT_KINDS for op in graph.ops):
        ctx.log("quantize: the graph is already quantized; nothing to do")
        return False
    prepare(graph, opts)
    ctx.data["quantize.float_graph"] = graph.clone()
    pl = plan(graph, opts)
    if not pl.role:
        graph.meta["quant"] = {"layers": {}, "note": "nothing to quantize"}
        return False
    info: dict[str, Any] = {}
    P, ranges = activation_qparams(graph, pl, opts, info)
    float_outputs: list = []
    pre = ctx.data.get(CALIB_RUN)
    rounding = gptq_rounding(graph, pl, opts, pre)
    if pre is not None and pre["calib"] is opts.calib and opts.bias_correction:
        # the sensitivity ran the same float graph (prepared the same way) on the same calibration data
        names = {op.name for op, role in pl.role.items() if role == "compute" and op.kind in CONVS + GEMMS}
        means = {k: v for k, v in pre["means"].items() if k in names}
        float_outputs = list(pre["float_outputs"])
    else:
        means = layer_input_means(graph, pl, opts, float_outputs)
    means, rounding, checked = choose_corrections(ctx.data["quantize.float_graph"], opts, ranges, means,
                                                  float_outputs, rounding)
    info.update(checked)
    rw = Rewriter(graph, pl, P, ranges, opts, means, rounding=rounding)
    rw.run()
    per = "per channel" if opts.per_channel else "per tensor"
    scheme = {"activations": f"{opts.activation_dtype} "
                             f"{'symmetric' if opts.symmetric_activations else 'asymmetric'} per tensor",
              "weights": "int8 symmetric " + per, "bias": "int32"} if opts.fp8 is None else \
        {"activations": f"{opts.fp8_storage} per tensor (scale amax / {Fp8Format(opts.fp8).max:g})",
         "weights": f"{opts.fp8_storage} {per}", "bias": "float32",
         "compute": "Conv/Gemm/MatMul on float8 operands, float32 sums; every other op float32"}
    graph.meta["quant"] = {
        "scheme": {**scheme, "method": opts.method, **info},
        "layers": rw.layers,
        "float_values": {q.name: f for q, f in rw.stands_for.items() if q.producer is not None
                         and q.producer.graph is graph},
    }
    n_int = sum(1 for v in rw.layers.values() if v["precision"] != "float")
    ctx.log(f"quantize: {n_int} ops {'integer' if opts.fp8 is None else 'float8'}, {len(rw.layers) - n_int} float; "
            f"calibration: {info['calibration']}")
    return True
