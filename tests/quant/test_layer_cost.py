"""layer_cost: T(F) of a hand-built chain equals the hand sum; the boundaries it counts are the
Q/DQ ops the quantize pass really inserts (islands, merged islands, the model's own input Q and
output DQ); on fashion_mobilenet the measured per-layer costs are positive and cover every
quantized layer, and splitting fused kernels over layers accounts for all of their time."""
import numpy as np
import pytest

from qcompiler.codegen.target import TargetSpec
from qcompiler.ir import parse_graph
from qcompiler.passes import PassContext, PassManager, run_passes
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.plan.layer_cost import LayerCosts, analytic_times, measure_layer_costs, ANALYTIC

T8 = "tensor<1x8x6x6xf32>"
CHAIN = f"""graph @g(%x: tensor<1x4x6x6xf32>) {{
  %w1 = const dense<0.25> : tensor<8x4x3x3xf32>
  %w2 = const dense<-0.125> : tensor<8x8x3x3xf32>
  %w3 = const dense<0.5> : tensor<8x8x1x1xf32>
  %c1 = Conv(%x, %w1) {{pads = [1, 1, 1, 1]}} : {T8} loc("conv1")
  %r1 = Relu(%c1) : {T8} loc("relu1")
  %c2 = Conv(%r1, %w2) {{pads = [1, 1, 1, 1]}} : {T8} loc("conv2")
  %r2 = Relu(%c2) : {T8} loc("relu2")
  %c3 = Conv(%r2, %w3) : {T8} loc("conv3")
  %r3 = Relu(%c3) : {T8} loc("relu3")
  %p = GlobalAveragePool(%r3) : tensor<1x8x1x1xf32> loc("gap")
  %f = Flatten(%p) {{axis = 1}} : tensor<1x8xf32> loc("flatten")
  %fw = const dense<0.5> : tensor<8x3xf32>
  %o = Gemm(%f, %fw) : tensor<1x3xf32> loc("fc")
  %sm = Softmax(%o) {{axis = 1}} : tensor<1x3xf32> loc("softmax")
  return %sm
}}"""
LAYERS = ["conv1", "relu1", "conv2", "relu2", "conv3", "relu3", "gap", "flatten", "fc", "softmax"]
# made-up per-layer times (ms): int8 cheaper on the convs, dearer on the pool; softmax is float only
INT8 = dict(conv1=1.0, relu1=0.0, conv2=2.0, relu2=0.0, conv3=0.5, relu3=0.0, gap=0.3, flatten=0.0, fc=0.1)
FLOAT = dict(conv1=1.5, relu1=0.05, conv2=3.5, relu2=0.05, conv3=0.9, relu3=0.05, gap=0.2, flatten=0.0,
             fc=0.15, softmax=0.07)
A, B = 0.01, 1e-4          # one conversion of n elements: A + B n ms
N_X, N_ACT, N_F, N_O = 4 * 36, 8 * 36, 8, 3


def hand_costs() -> LayerCosts:
    return LayerCosts(parse_graph(CHAIN), dict(INT8), dict(FLOAT), (A, B), frozenset({"Softmax"}))


def conv(n: int) -> float:
    return A + B * n


# float set -> (layers float in the build, conversions as element counts), worked out by hand; fc
# returns its logits in float32 (only the float softmax reads them): no DQ(o); likewise a conv that
# only a float layer reads returns float32 (its Relu the float clamp): no DQ before an island
CASES = {
    "all int8": (frozenset(), {"softmax"}, [N_X]),                     # Q(x)
    "island conv2": (frozenset({"conv2"}), {"conv2", "relu2", "softmax"},
                     [N_X, N_ACT]),                                     # + Q(r2); conv1 -> f32
    "merged conv2+conv3": (frozenset({"conv2", "conv3"}),               # relu3, gap, flatten follow conv3
                           {"conv2", "relu2", "conv3", "relu3", "gap", "flatten", "softmax"},
                           [N_X, N_F]),                                 # Q(x), Q(f); conv1 -> f32
    "two islands conv1, conv3": (frozenset({"conv1", "conv3"}),
                                 {"conv1", "relu1", "conv3", "relu3", "gap", "flatten", "softmax"},
                                 [N_ACT, N_F]),                         # Q(r1), Q(f); conv2 -> f32
}


@pytest.mark.parametrize("case", list(CASES))
def test_latency_is_the_hand_sum(case):
    F, floats, conversions = CASES[case]
    c = hand_costs()
    want = sum(FLOAT[n] if n in floats else INT8[n] for n in LAYERS) + sum(conv(n) for n in conversions)
    assert c.latency(F) == pytest.approx(want, rel=1e-12)
    assert {n for n, p in c.precisions(F).items() if p == "float"} == floats
    assert sorted(x.elements for x in c.conversions(F)) == sorted(conversions)
    assert c.boundaries(F) == len(conversions)


def test_merging_islands_saves_boundaries():
    """conv2 alone and conv3 alone each cost 1 conversion more than all-int8 (the Q after the island;
    the conv before it returns float32); together they are one island (relu2 between them turns
    float), which costs the same 1 and not 2."""
    c = hand_costs()
    base = c.boundaries(frozenset())
    assert c.boundaries({"conv2"}) == base + 1
    assert c.boundaries({"conv3"}) == base + 1
    assert c.boundaries({"conv2", "conv3"}) == base + 1
    assert c.boundaries({"conv1", "conv3"}) == base + 1        # conv1 float drops the input's Q
    assert c.latency({"conv2", "conv3"}) - c.latency({"conv2"}) == pytest.approx(
        FLOAT["conv3"] + FLOAT["relu3"] + FLOAT["gap"] - INT8["conv3"] - INT8["gap"]
        + conv(N_F) - conv(N_ACT) - 0.0, rel=1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_boundaries_are_the_quantize_pass_conversions(case):
    """What boundaries() counts is what the quantize pass emits: its QuantizeLinear and
    DequantizeLinear ops, on the same values."""
    F = CASES[case][0]
    c = hand_costs()
    g = parse_graph(CHAIN)
    ranges = {v: (-4.0, 4.0) for v in ("x", "c1", "r1", "c2", "r2", "c3", "r3", "p", "f", "o")}
    opts = QuantizeOptions(keep_float=frozenset({"Softmax"}) | F, ranges=ranges, bias_correction=False)
    PassManager("quantize", ctx=PassContext(options={"quantize": opts})).run(g)
    emitted = sorted(op.operands[0].name if op.kind == "QuantizeLinear" else g.meta["quant"]["float_values"].get(
        op.operands[0].name, op.operands[0].name) for op in g.ops if op.kind in ("QuantizeLinear", "DequantizeLinear"))
    assert sorted(x.value for x in c.conversions(F)) == emitted
    assert c.boundaries(F) == len(emitted)


def test_analytic_model_prefers_int8_convs():
    """The analytic fallback (no host measurement): a conv costs MACs / rate + bytes / BW + overhead."""
    g = parse_graph(CHAIN)
    k = ANALYTIC["arm"]
    (ops, t), = [(o, t) for o, t in analytic_times(g, k, "fp32") if o[0].name == "conv2"]
    macs = 8 * 36 * 8 * 9
    assert t == pytest.approx(macs / k.mac_per_ms["fp32"] + 2 * 8 * 36 * 4 / k.bytes_per_ms + k.kernel_ms)


def test_analytic_costs_for_arm():
    g = parse_graph(CHAIN)
    c = measure_layer_costs(g, TargetSpec("arm", dtype="int8"), keep_float={"Softmax"})
    assert c.method == "analytic"
    assert set(c.int8_ms) == {"conv1", "relu1", "conv2", "relu2", "conv3", "relu3", "gap", "flatten", "fc"}
    assert all(c.int8_ms[n] < c.float_ms[n] for n in ("conv1", "conv2", "conv3"))
    assert c.latency({"conv2"}) > c.latency()


# ---- measured on fashion_mobilenet -----------------------------------------------------------------
@pytest.fixture(scope="module")
def fashion():
    import realmodels as rm
    path = rm.MODELS_DIR / "fashion_mobilenet.onnx"
    if not path.exists():
        pytest.skip("models/fashion_mobilenet.onnx is not present")
    from qcompiler.frontend import import_onnx
    g = import_onnx(str(path))
    run_passes(g)
    q = g.clone()
    x = rm.fashion_test()[0][:16].astype(np.float32)
    calib = [{q.inputs[0].name: x[i:i + 1]} for i in range(16)]
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(calib=calib)})).run(q)
    return g, q, measure_layer_costs(g, TargetSpec("x86", dtype="int8"), int8_graph=q)


def test_measured_costs_cover_every_quantized_layer(fashion):
    g, q, c = fashion
    assert c.method == "measured"
    quantized = {n for n, layer in q.meta["quant"]["layers"].items() if layer["precision"] == "int8"}
    assert quantized == set(c.int8_ms)
    views = {n for n in quantized if q.meta["quant"]["layers"][n]["kind"] in ("Flatten", "Reshape")}
    for n in quantized - views:
        assert c.int8_ms[n] > 0 and c.float_ms[n] > 0, n
    print("\nlayer int8_ms float_ms")
    for n in c.int8_ms:
        print(f"{n} {c.int8_ms[n]:.4f} {c.float_ms[n]:.4f}")
    print(f"all int8 {c.latency():.3f} ms, all float {c.float_latency():.3f} ms, "
          f"conversion {c.conversion_ms[0] * 1e3:.2f} us + {c.conversion_ms[1] * 1e6:.3f} ns/element")
    a, b = c.conversion_ms
    assert a >= 0 and b > 0


def test_kernel_time_is_conserved(fashion):
    """Splitting kernels over layers loses nothing: per build, the layers' shares plus the Q/DQ
    shares (priced separately by the conversion fit) add up to the sum of the kernel times, and
    every kernel holds at least one layer or conversion."""
    from qcompiler.plan.layer_cost import CONVERSIONS, attribute, kernel_times, work
    g, q, c = fashion
    names = {op.name for op in c.graph.ops}
    ks = kernel_times(q, TargetSpec("x86", dtype="int8"), repeats=1, min_repeat_ms=1)
    conv_share = sum(ms * sum(work(o) for o in ops if o.kind in CONVERSIONS and o.name not in names)
                     / sum(work(o) for o in ops) for ops, ms in ks)
    att = attribute(ks, names)
    assert sum(att.values()) + conv_share == pytest.approx(sum(ms for _, ms in ks), rel=1e-9)
    assert set(att) <= names and all(any(o.name in names or o.kind in CONVERSIONS for o in ops) for ops, _ in ks)
    print(f"\nint8 build: {len(ks)} kernels, {sum(ms for _, ms in ks):.3f} ms, of which conversions {conv_share:.3f} ms")


# ---- the command line -------------------------------------------------------------------------------
def _cli(capsys, *argv):
    from qcompiler.cli import main
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_float_dtype_needs_int8(capsys, tmp_path):
    model = str(pytest.importorskip("realmodels").MODELS_DIR / "mnistnet.onnx")
    code, out, err = _cli(capsys, "compile", model, "--dtype", "fp32", "--float-dtype", "fp16", "-o",
                          str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1 and "--float-dtype" in err and "--dtype int8" in err
    code, out, err = _cli(capsys, "compile", model, "--dtype", "int8", "--layer-costs", "fast", "-o",
                          str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1 and "--layer-costs" in err
    assert not (tmp_path / "o").exists()


def test_cli_budget_reports_latency(capsys, tmp_path):
    """--min-sqnr above plain int8 on mnistnet with the analytic model (fast): report.json carries
    per-layer int8/float ms, the boundaries of the chosen set, and the predicted latency; the same
    numbers LayerCosts gives for the chosen set; --float-dtype fp16 recorded in the manifest."""
    import json
    import realmodels as rm
    path = rm.MODELS_DIR / "mnistnet.onnx"
    digits = rm.mnist_inputs(48)
    if not path.exists() or digits is None:
        pytest.skip("mnistnet or the MNIST digits are not present")
    data = tmp_path / "x.npy"
    np.save(data, digits[0].astype(np.float32))
    out = tmp_path / "OUT"
    code, text, err = _cli(capsys, "compile", str(path), "--dtype", "int8", "--calib", str(data),
                           "--calib-samples", "32", "--eval-samples", "16", "--sensitivity-samples", "16",
                           "--min-sqnr", "45", "--layer-costs", "model", "--float-dtype", "fp16", "-o", str(out))
    assert code == 0, err
    rep = json.loads((out / "report.json").read_text())
    lat, sel = rep["latency"], rep["selection"]
    assert lat["method"] == "analytic" and lat["float_dtype"] == "fp16"
    assert {r["layer"] for r in lat["layers"]} >= set(sel["float_layers"])
    assert all(r["int8_ms"] > 0 and r["float_ms"] > 0 for r in lat["layers"] if r["layer"] in sel["float_layers"])
    assert {r["layer"] for r in lat["layers"] if r["precision"] == "float"} >= set(sel["float_layers"])
    assert lat["boundaries"] >= 1 and "latency (analytic, x86)" in text     # the input Q (float32 logits)
    assert sel["cost_ms"] == pytest.approx(lat["latency_ms"], rel=1e-3)
    target = json.loads((out / "manifest.json").read_text())["target"]
    assert target["float_dtype"] == "fp16"
