"""split-conv-bands: a conv whose taps read padding on many outputs becomes one conv per region of
outputs that read the same taps (Slice -> Conv -> Concat); ONNX Runtime gives the same outputs
before and after; ordinary padded convs, and splits whose copies cost more than they save, are left
as they are; DeepLabV3's dilation-12 and -24 ASPP convs split."""
import importlib
import re
import textwrap

import pytest
from ir_check import assert_ir, check_pass_numerics, run_ir, unchanged

from qcompiler.passes import PassContext
from qcompiler.passes.split_conv_bands import SplitConvBandsOptions, bands

ALWAYS = PassContext(options={"split-conv-bands": SplitConvBandsOptions(macs_per_byte=0)})
CONV = "{{dilations = [{d}, {d}], group = {g}, pads = {p}, strides = [{s}, {s}]}}"
FUSED = ("{{activation = \"Relu\", activation_params = [], dilations = [{d}, {d}], group = {g}, pads = {p}, "
         "strides = [{s}, {s}]}}")


def g1(body: str, consts: str, x: str, out: str = "") -> str:
    """A graph of ``body`` whose ``%y`` feeds a Relu of type ``out`` (the graph output), or is the
    output itself (``out`` empty)."""
    tail = f"\n  %z = Relu(%y) : tensor<{out}xf32>\n  return %z" if out else "\n  return %y"
    return f"graph @g(%x: {x}) {{\n{consts}{body}{tail}\n}}\n"


@pytest.mark.parametrize("size, out, kernel, stride, dilation, pad, expected", [
    (4, 4, 3, 1, 3, 3, [(0, 1, 1, 2), (1, 3, 1, 1), (3, 4, 0, 1)]),
    (32, 32, 3, 1, 12, 12, [(0, 12, 1, 2), (12, 20, 0, 2), (20, 32, 0, 1)]),   # DeepLabV3's ASPP
    (8, 8, 3, 1, 1, 1, [(0, 1, 1, 2), (1, 7, 0, 2), (7, 8, 0, 1)]),            # an ordinary 3x3
    (8, 8, 1, 1, 1, 0, [(0, 8, 0, 0)]),
    (2, 1, 1, 8, 1, 3, None),                                                   # its output reads padding only
])
def test_bands(size, out, kernel, stride, dilation, pad, expected):
    assert bands(size, out, kernel, stride, dilation, pad) == expected


def test_docstring_example():
    doc = importlib.import_module("qcompiler.passes.split_conv_bands").__doc__
    block = lambda label: textwrap.dedent(re.search(label + r".*::\n\n((?:    .*\n|\n)+?)(?:\n\S|\Z)", doc).group(1))  # noqa: E731
    assert_ir(run_ir(block("Before"), "split-conv-bands", ALWAYS), block("After"))


@pytest.mark.parametrize("x, w, attrs, y", [
    ("1x3x6x6", "4x3x3x3", CONV.format(d=3, g=1, p="[3, 3, 3, 3]", s=1), "1x4x6x6"),      # 3x3 regions
    ("1x3x7x7", "4x3x3x3", CONV.format(d=2, g=1, p="[2, 2, 2, 2]", s=2), "1x4x4x4"),      # strided
    ("1x3x6x5", "4x3x3x3", CONV.format(d=4, g=1, p="[4, 4, 4, 4]", s=1), "1x4x6x5"),      # unequal axes
])
def test_regions_equal_the_conv(x, w, attrs, y):
    text = g1(f"  %y = Conv(%x, %w) {attrs} : tensor<{y}xf32>", f"  %w = const dense<0.5> : tensor<{w}xf32>\n",
              f"tensor<{x}xf32>", y)
    g = check_pass_numerics(text, "split-conv-bands")      # default options: these small convs do not pay
    assert [op.kind for op in g.ops] == ["Conv", "Relu"]
    from ir_check import assert_same_outputs, random_consts, random_feeds
    from qcompiler.ir import parse_graph
    before = random_consts(parse_graph(text))
    after = run_ir(before.clone(), "split-conv-bands", ALWAYS)
    kinds = [op.kind for op in after.ops]
    assert kinds.count("Conv") > 1 and kinds[-2:] == ["Concat", "Relu"], kinds
    assert_same_outputs(before, after, random_feeds(before, 1))


def test_fused_depthwise_conv_keeps_bias_and_activation():
    from ir_check import assert_same_outputs, random_consts, random_feeds
    from qcompiler.ir import parse_graph
    text = g1(f"  %y = FusedConv(%x, %w, %b) {FUSED.format(d=3, g=3, p='[3, 3, 3, 3]', s=1)} : tensor<1x3x5x5xf32>",
              "  %w = const dense<0.5> : tensor<3x1x3x3xf32>\n  %b = const dense<-0.25> : tensor<3xf32>\n",
              "tensor<1x3x5x5xf32>", "1x3x5x5")
    before = random_consts(parse_graph(text))
    after = run_ir(before.clone(), "split-conv-bands", ALWAYS)
    convs = [op for op in after.ops if op.kind == "FusedConv"]
    assert len(convs) == 9 and all(op.attrs["activation"] == "Relu" and len(op.operands) == 3 for op in convs)
    assert_same_outputs(before, after, random_feeds(before, 1))


def test_graph_output_and_plain_convs_are_unchanged():
    w = "  %w = const dense<0.5> : tensor<4x3x3x3xf32>\n"
    # the conv's result is the graph output (its name is the artifact's): kept even when forced
    text = g1(f"  %y = Conv(%x, %w) {CONV.format(d=3, g=1, p='[3, 3, 3, 3]', s=1)} : tensor<1x4x6x6xf32>", w,
              "tensor<1x3x6x6xf32>")
    assert_ir(run_ir(text, "split-conv-bands", ALWAYS), text)
    # an ordinary 3x3 with pads 1 on 56x56: 7 % saved, not worth 49 taps of weights
    unchanged(g1(f"  %y = Conv(%x, %w) {CONV.format(d=1, g=1, p='[1, 1, 1, 1]', s=1)} : tensor<1x4x56x56xf32>", w,
                 "tensor<1x3x56x56xf32>", "1x4x56x56"), "split-conv-bands")


def test_deeplabv3_aspp_convs_split_and_resnet50_does_not():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import zoo
    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.passes import PassManager
    pre = ["const-fold", "simplify", "dce", "cse", "fold-pad", "crop-dead-taps", "fold-bn", "fuse-act"]
    split = {}
    for name in ("deeplabv3_mobilenet_v3_large", "resnet50"):
        m = zoo.get(name)
        g = import_onnx(str(m.path()), m.input_shapes, m.input_values)
        PassManager(pre).run(g)
        n = sum(op.kind in ("Conv", "FusedConv") for op in g.ops)
        logs = []
        PassManager(["split-conv-bands"], ctx=PassContext(log=logs.append)).run(g)
        split[name] = (sorted(logs), sum(op.kind in ("Conv", "FusedConv") for op in g.ops) - n)
    logs, extra = split["deeplabv3_mobilenet_v3_large"]
    assert len(logs) == 2 and all("into 3x3 regions" in line for line in logs) and extra == 2 * 8, logs
    assert split["resnet50"] == ([], 0)
