"""``quantize-dynamic``: dynamic int8 quantization of the linear layers (``--activations dynamic``).

ONNX Runtime's ``quantize_dynamic`` mode, the default for BERT-class encoders: the weights of every
Gemm/MatMul with a constant weight become int8 at compile time (symmetric, per output channel or per
tensor), and its float32 input is quantized *at run time*, from its own range, per row (a
transformer's token: ``granularity`` "token", the default) or per tensor; int32 accumulation, float32
result (the op and its arithmetic: :mod:`qcompiler.quant.dynamic`). Nothing is calibrated, so no data
is needed, and an outlier token or input costs only its own scale. Everything else (LayerNorm,
Softmax, GELU, attention's activation-by-activation MatMuls, convolutions) stays float.

Steps: the quantize pass's ``prepare`` (a MatMul of a (B, S, K) activation by a constant matrix,
and its bias Add, becomes one GEMM over the B·S rows between Reshapes; residual adds and
activations other than Relu/Clip split off FusedGemm), then each such GEMM becomes one
``DynamicQLinearGemm``, its weight stored N x K, with one ``DynamicQuantParams`` per activation (the
Q and K projections below share theirs). A Relu/Clip fused into a FusedGemm folds into the op's
float clamp. The layers are recorded in ``graph.meta["quant"]`` as the quantize pass records them
(precision "int8", ``"dynamic": true``), and the float graph after ``prepare`` in
``ctx.data["quantize.float_graph"]`` for the build report.

Before::

    graph @g(%x: tensor<1x3x4xf32>) {
      %wq = const dense<[0.5, -1.0, 0.25, 0.0, 1.0, 0.5, -0.5, 0.25]> : tensor<4x2xf32>
      %wk = const dense<[1.0, 0.5, -0.25, 0.75, -1.0, 0.5, 0.5, 0.125]> : tensor<4x2xf32>
      %bq = const dense<[0.1, -0.2]> : tensor<2xf32>
      %q = MatMul(%x, %wq) : tensor<1x3x2xf32> loc("q")
      %qb = Add(%q, %bq) : tensor<1x3x2xf32>
      %k = MatMul(%x, %wk) : tensor<1x3x2xf32> loc("k")
      %kt = Transpose(%k) {perm = [0, 2, 1]} : tensor<1x2x3xf32>
      %s = MatMul(%qb, %kt) : tensor<1x3x3xf32> loc("scores")
      return %s
    }

Weights per output channel (s_w = max|w| / 127); the attention scores stay float.

After::

    graph @g(%x: tensor<1x3x4xf32>) {
      %wq_q = const dense<[63, 32, 127, -63, -127, 0, 63, 32]> : tensor<2x4x!quant.uniform<i8:f32:0, {0.007874017:0, 0.007874017:0}>>
      %bq_f = const dense<[0.1, -0.2]> : tensor<2xf32>
      %wk_q = const dense<[127, -32, -127, 63, 85, 127, 85, 21]> : tensor<2x4x!quant.uniform<i8:f32:0, {0.007874017:0, 0.0059055123:0}>>
      %x_rows = Reshape(%x) {shape = [3, 4]} : tensor<3x4xf32>
      %x_rows_qparams = DynamicQuantParams(%x_rows) {granularity = "token"} : tensor<3x3xf32>
      %q_rows = DynamicQLinearGemm(%x_rows, %x_rows_qparams, %wq_q, %bq_f) {activation = "", activation_params = []} : tensor<3x2xf32>
      %qb = Reshape(%q_rows) {shape = [1, 3, 2]} : tensor<1x3x2xf32>
      %k_rows = DynamicQLinearGemm(%x_rows, %x_rows_qparams, %wk_q) {activation = "", activation_params = []} : tensor<3x2xf32>
      %k = Reshape(%k_rows) {shape = [1, 3, 2]} : tensor<1x3x2xf32>
      %kt = Transpose(%k) {perm = [0, 2, 1]} : tensor<1x2x3xf32>
      %s = MatMul(%qb, %kt) : tensor<1x3x3xf32>
      return %s
    }
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from ..ir.graph import Graph, Op
from ..ir.quant_ops import DYNAMIC_GRANULARITIES
from ..ir.types import quantize
from ..quant import qparams as qpm
from ._common import pass_options
from .manager import PassContext, register_pass
from .quantize_plan import GEMMS, QUANT_KINDS, _decline, _kept_float, gemm_weight_bias, prepare


@dataclass
class QuantizeDynamicOptions:
    granularity: str = "token"               # activation scales: one per row ("token") or per tensor
    per_channel: bool = True                 # int8 weights: one scale per output channel, else per tensor
    keep_float: frozenset = frozenset()      # op names or op kinds that stay float

    def __post_init__(self):
        if self.granularity not in DYNAMIC_GRANULARITIES:
            raise UserError(f"unknown granularity '{self.granularity}'", "quantize-dynamic options",
                            f"known: {', '.join(DYNAMIC_GRANULARITIES)}")
        self.keep_float = frozenset(self.keep_float)


def _why_float(op: Op, opts: QuantizeDynamicOptions) -> str | None:
    """Why a Gemm/MatMul stays float in a dynamic build (None: it becomes DynamicQLinearGemm)."""
    if _kept_float(op, opts):
        return "kept float (--keep-float)"
    why = _decline(op)
    if why is not None:
        return why
    if op.attrs.get("activation", "") not in ("", "Relu", "Clip") or len(op.operands) > 3:
        return f"activation {op.attrs.get('activation')} (or a residual operand) is not split off"
    return None


def rewrite(graph: Graph, op: Op, opts: QuantizeDynamicOptions, params: dict) -> Op:
    """Replace the GEMM ``op`` by a DynamicQLinearGemm of its int8 weight; returns the new op.
    ``params``: the DynamicQuantParams made so far, by activation (GEMMs of one input share one)."""
    w, b = gemm_weight_bias(op)
    wqp = qpm.per_channel_symmetric(w, 0) if opts.per_channel else qpm.symmetric(float(w.min()), float(w.max()))
    x = op.operands[0]
    p = params.get(x)
    if p is None:
        at = {"after": x.producer} if x.producer is not None else {"before": op}
        p = params[x] = graph.create_op("DynamicQuantParams", [x], {"granularity": opts.granularity},
                                        name=x.name + "/qparams", result_names=[x.name + "_qparams"], **at).result
    operands = [x, p, graph.add_const(quantize(w, wqp), op.operands[1].name + "_q", quant=wqp)]
    if b is not None:
        operands.append(graph.add_const(b, (op.operands[2].name if len(op.operands) >= 3 else op.name) + "_f"))
    act = op.attrs.get("activation", "")
    attrs = {"activation": act,
             "activation_params": list(op.attrs.get("activation_params") or []) if act == "Clip" else []}
    name, out = op.name, op.result
    new = graph.create_op("DynamicQLinearGemm", operands, attrs, result_types=[out.type], name=name + "_dq",
                          result_names=[out.name + "_dq"], before=op)
    out_name = out.name
    out.replace_all_uses_with(new.result)
    graph.erase_op(op)
    graph.rename_op(new, name)
    graph.rename(new.result, out_name)
    return new


@register_pass("quantize-dynamic", options=QuantizeDynamicOptions)
def quantize_dynamic(graph: Graph, ctx: PassContext) -> bool:
    """Dynamic int8: Gemm/MatMul layers with constant weights become DynamicQLinearGemm (int8
    weights, activations quantized at run time per token or per tensor); the rest stays float."""
    opts = pass_options(ctx, "quantize-dynamic", QuantizeDynamicOptions)
    if graph.meta.get("prequantized"):
        raise UserError("the model is already quantized (it has its own QuantizeLinear/DequantizeLinear or "
                        "integer ops)", "--activations dynamic",
                        "compile it as it is (its own scales), or compile the float model it came from")
    if any(op.kind in QUANT_KINDS or op.kind == "DynamicQLinearGemm" for op in graph.ops):
        ctx.log("quantize-dynamic: the graph is already quantized; nothing to do")
        return False
    from .quantize import QuantizeOptions
    # HardSwish "kept float" only so that prepare splits it off a FusedGemm (every activation is float here)
    prepare(graph, QuantizeOptions(keep_float=opts.keep_float | {"HardSwish"}))
    ctx.data["quantize.float_graph"] = graph.clone()
    layers: dict[str, dict] = {}
    params: dict = {}
    for op in list(graph.ops):
        if op.kind not in GEMMS:
            continue
        why = _why_float(op, opts)
        if why is not None:
            layers[op.name] = {"kind": op.kind, "precision": "float", "reason": why}
            continue
        new = rewrite(graph, op, opts, params)
        wq = new.operands[2].type.quant
        layers[new.name] = {"kind": "DynamicQLinearGemm", "precision": "int8", "from": op.kind, "dynamic": True,
                            "input": {"dtype": "uint8", "granularity": opts.granularity, "at": "run time"},
                            "weight": {"per_channel": wq.per_channel, "channels": int(new.operands[2].shape[0]),
                                       "scale_min": min(wq.scale), "scale_max": max(wq.scale)},
                            "output": {"dtype": "float32"}}
    graph.remove_unused_consts()
    graph.meta["quant"] = {
        "scheme": {"mode": "dynamic",
                   "activations": f"uint8 asymmetric per {opts.granularity}, quantized at run time",
                   "weights": "int8 symmetric " + ("per channel" if opts.per_channel else "per tensor"),
                   "bias": "float32", "method": "run-time min/max"},
        "layers": layers,
        "float_values": {},
    }
    n_int = sum(1 for v in layers.values() if v["precision"] == "int8")
    ctx.log(f"quantize-dynamic: {n_int} linear layers int8 (activations per {opts.granularity} at run time), "
            f"{len(layers) - n_int} float")
    return n_int > 0
