"""pad-channels: a conv whose kernel computes padded output channels stores them (zero weights);
the next group-1 conv takes them with zero weights, a depthwise conv grows as many groups, any
other reader reads a channel Slice; ONNX Runtime gives the same outputs before and after, an int8
model's integers are unchanged, and ShuffleNetV2's 58-channel branches run on 64-channel blocks."""
import numpy as np
import pytest
from ir_check import assert_ir, check_pass_numerics, run_ir, unchanged

from qcompiler.ir import parse_graph, print_graph
from qcompiler.passes import PassContext
from qcompiler.passes.pad_channels import PadChannelsOptions, vector_channels

CONV = "{{dilations = [1, 1], group = {g}, pads = [{p}, {p}, {p}, {p}], strides = [1, 1]}}"


def chain(k: int = 6, reader: str = "Concat") -> str:
    """1x1 conv 4 -> k, depthwise 3x3 on k, then a 1x1 conv k -> 8, or a Concat with the input."""
    tail = (f"  %o = Concat(%z, %x) {{axis = 1}} : tensor<1x{k + 4}x8x8xf32>\n" if reader == "Concat" else
            f"  %o = Conv(%z, %w2) {CONV.format(g=1, p=0)} : tensor<1x8x8x8xf32>\n")
    return ("graph @g(%x: tensor<1x4x8x8xf32>) {\n"
            f"  %w = const dense<0.5> : tensor<{k}x4x1x1xf32>\n"
            f"  %b = const dense<0.125> : tensor<{k}xf32>\n"
            f"  %wd = const dense<0.25> : tensor<{k}x1x3x3xf32>\n"
            f"  %w2 = const dense<0.5> : tensor<8x{k}x1x1xf32>\n"
            f"  %y = FusedConv(%x, %w, %b) {{activation = \"Relu\", activation_params = [], dilations = [1, 1], "
            f"group = 1, pads = [0, 0, 0, 0], strides = [1, 1]}} : tensor<1x{k}x8x8xf32>\n"
            f"  %z = Conv(%y, %wd) {CONV.format(g=k, p=1)} : tensor<1x{k}x8x8xf32>\n"
            + tail + "  return %o\n}\n")


def shapes(g) -> dict[str, tuple]:
    return {op.results[0].name: (op.kind, op.results[0].shape, op.attrs.get("group")) for op in g.ops}


def test_default_rule_rounds_channels_no_4_lanes_divide():
    g = parse_graph(chain(6, "Conv"))
    k = {op.results[0].shape[1]: vector_channels(op) for op in g.ops if op.kind in ("Conv", "FusedConv")}
    assert k == {6: 16, 8: 8}


def test_conv_depthwise_concat_chain_is_padded_and_sliced_before_the_concat():
    g = check_pass_numerics(chain(6, "Concat"), "pad-channels")
    assert shapes(g) == {
        "y_padded": ("FusedConv", (1, 16, 8, 8), 1),
        "z_padded": ("Conv", (1, 16, 8, 8), 16),
        "z": ("Slice", (1, 6, 8, 8), None),        # the Concat reads the real channels, by their name
        "o": ("Concat", (1, 10, 8, 8), None),
    }
    w, wd = g.value("y_padded").producer.operands[1].data, g.value("z_padded").producer.operands[1].data
    assert np.all(w[6:] == 0) and np.all(wd[6:] == 0) and np.all(w[:6] != 0)
    assert np.all(g.value("y_padded").producer.operands[2].data[6:] == 0)


def test_a_group1_reader_takes_the_padded_channels_with_zero_weights():
    g = check_pass_numerics(chain(6, "Conv"), "pad-channels")
    o = g.value("o").producer
    assert o.operands[0].name == "z_padded" and o.operands[1].shape == (8, 16, 1, 1)
    assert np.all(o.operands[1].data[:, 6:] == 0)
    assert "Slice" not in {op.kind for op in g.ops}


def test_a_padded_graph_output_keeps_its_name_and_shape():
    text = ("graph @g(%x: tensor<1x4x8x8xf32>) {\n  %w = const dense<0.5> : tensor<10x4x1x1xf32>\n"
            f"  %y = Conv(%x, %w) {CONV.format(g=1, p=0)} : tensor<1x10x8x8xf32>\n  return %y\n}}\n")
    g = check_pass_numerics(text, "pad-channels")
    assert [(v.name, v.shape) for v in g.outputs] == [("y", (1, 10, 8, 8))]
    assert g.outputs[0].producer.kind == "Slice"


@pytest.mark.parametrize("k", [4, 8, 12, 16])
def test_channel_counts_a_4_lane_block_divides_are_unchanged(k):
    unchanged(chain(k, "Concat"), "pad-channels")


def test_the_code_generators_rule_decides():
    """The codegen passes its kernels' rule: here one that never pads."""
    ctx = PassContext(options={"pad-channels": PadChannelsOptions(channels=lambda op: op.results[0].shape[1])})
    g = run_ir(chain(6), "pad-channels", ctx)
    assert_ir(g, print_graph(parse_graph(chain(6)), locs=False))


QCHAIN = ("graph @g(%x: tensor<1x4x8x8xf32>) {\n"
          "  %w = const dense<0.5> : tensor<10x4x1x1xf32>\n  %wd = const dense<0.25> : tensor<10x1x3x3xf32>\n"
          "  %w2 = const dense<0.5> : tensor<8x10x1x1xf32>\n"
          f"  %y = Conv(%x, %w) {CONV.format(g=1, p=0)} : tensor<1x10x8x8xf32>\n"
          f"  %z = Conv(%y, %wd) {CONV.format(g=10, p=1)} : tensor<1x10x8x8xf32>\n"
          f"  %o = Conv(%z, %w2) {CONV.format(g=1, p=0)} : tensor<1x8x8x8xf32>\n  return %o, %z\n}}\n")


def quantized_chain(seed: int = 0):
    """QCHAIN with random weights through qcompile's own quantize pass (4 calibration inputs)."""
    from qcompiler.passes import PassManager
    from qcompiler.passes.quantize import QuantizeOptions
    rng = np.random.default_rng(seed)
    g = parse_graph(QCHAIN)
    for v in g.consts.values():
        v.data = rng.standard_normal(v.shape).astype(np.float32)
    calib = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(calib=calib)})).run(g)
    return g, {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)}


def test_int8_conv_chain_keeps_its_integers():
    """The quantized conv -> depthwise -> conv chain, run by the integer reference interpreter
    before and after the pass: the same numbers, bit for bit (padded channels hold the zero point
    and weigh nothing)."""
    from qcompiler.quant.reference import run
    g, feed = quantized_chain()
    assert [op.kind for op in g.ops].count("QLinearConv") == 3
    padded = run_ir(g.clone(), "pad-channels")
    assert sorted(op.results[0].shape[1] for op in padded.ops if op.kind == "QLinearConv") == [8, 16, 16]
    for a, b in zip(run(padded, feed), run(g, feed)):
        np.testing.assert_array_equal(a, b)


def test_prelu_and_maxpool_carry_the_padded_channels_to_the_next_conv():
    """MTCNN-PNet's Conv -> PRelu -> MaxPool -> Conv on 10 channels: the PRelu (its slopes
    extended) and the pool run on 16 channels, so the PRelu stays in the conv's epilogue, and the
    next conv reads them with zero weights: no Slice at all."""
    text = ("graph @g(%x: tensor<1x3x8x8xf32>) {\n"
            "  %w = const dense<0.5> : tensor<10x3x3x3xf32>\n  %a = const dense<0.25> : tensor<10x1x1xf32>\n"
            "  %w2 = const dense<0.5> : tensor<16x10x3x3xf32>\n"
            f"  %y = Conv(%x, %w) {CONV.format(g=1, p=1)} : tensor<1x10x8x8xf32>\n"
            "  %p = PRelu(%y, %a) : tensor<1x10x8x8xf32>\n"
            "  %m = MaxPool(%p) {kernel_shape = [2, 2], strides = [2, 2]} : tensor<1x10x4x4xf32>\n"
            f"  %o = Conv(%m, %w2) {CONV.format(g=1, p=0).replace('pads = [0, 0, 0, 0]', 'pads = [1, 1, 1, 1]')}"
            " : tensor<1x16x4x4xf32>\n  return %o\n}\n")
    g = check_pass_numerics(text, "pad-channels")
    assert {k: v[:2] for k, v in shapes(g).items()} == {
        "y_padded": ("Conv", (1, 16, 8, 8)), "p_padded": ("PRelu", (1, 16, 8, 8)),
        "m_padded": ("MaxPool", (1, 16, 4, 4)), "o": ("Conv", (1, 16, 4, 4))}
    slopes = g.value("p_padded").producer.operands[1]
    assert slopes.shape == (16, 1, 1) and np.all(slopes.data[10:] == slopes.data[9])
