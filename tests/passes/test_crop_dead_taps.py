"""crop-dead-taps: the kernel rows/columns of a conv that read only padding for every output are
dropped and the pads shrink by as much; every other conv is left as it is; ONNX Runtime gives the
same outputs before and after, and the ASPP convs of DeepLabV3 lose their dead taps."""
import pytest
from ir_check import assert_ir, check_pass_numerics, run_ir, unchanged

from qcompiler.passes.crop_dead_taps import live_taps

CONV = "{{dilations = [{d}, {d}], group = {g}, pads = {p}, strides = [{s}, {s}]}}"
FUSED = ("{{activation = \"Relu\", activation_params = [], dilations = [{d}, {d}], group = {g}, pads = {p}, "
         "strides = [{s}, {s}]}}")


def g1(body: str, consts: str, x: str = "tensor<1x2x4x4xf32>") -> str:
    return f"graph @g(%x: {x}) {{\n{consts}{body}\n  return %y\n}}\n"


W = "  %w = const dense<0.5> : tensor<3x2x3x3xf32>\n"


@pytest.mark.parametrize("size, out, kernel, stride, dilation, pad, expected", [
    (4, 4, 3, 1, 6, 6, (1, 1)),      # atrous 3x3 at dilation 6 on 4 rows: the centre only
    (4, 4, 3, 1, 2, 2, (0, 2)),      # dilation 2: every tap reads a real row for some output
    (4, 2, 3, 2, 3, 3, (1, 2)),      # stride 2: rows -3, -1 (dead), 0, 2 and 3, 5 (3 is real)
    (2, 1, 1, 8, 1, 3, None),        # the one output reads padding only
])
def test_live_taps(size, out, kernel, stride, dilation, pad, expected):
    assert live_taps(size, out, kernel, stride, dilation, pad) == expected


def crop(text: str):
    """The pass on ``text`` (IR out) after checking it on random constants against ONNX Runtime."""
    check_pass_numerics(text, "crop-dead-taps")
    return run_ir(text, "crop-dead-taps")


def test_atrous_conv_beyond_the_map_is_a_1x1_conv():
    g = crop(g1(f"  %y = Conv(%x, %w) {CONV.format(d=6, g=1, p='[6, 6, 6, 6]', s=1)} : "
                               "tensor<1x3x4x4xf32>", W))
    assert_ir(g, g1(f"  %y = Conv(%x, %w_cropped) {CONV.format(d=1, g=1, p='[0, 0, 0, 0]', s=1)} : "
                    "tensor<1x3x4x4xf32>", "  %w_cropped = const dense<0.5> : tensor<3x2x1x1xf32>\n"))


def test_one_sided_padding_and_stride_crop_one_side():
    """Pads only before the map: the first two rows of taps are dead, the pad before shrinks to 0;
    stride 2 with dilation 3: one dead row before, none after (rows 3 and 5 of a 4-row map)."""
    g = crop(g1(f"  %y = Conv(%x, %w) {CONV.format(d=4, g=1, p='[8, 8, 0, 0]', s=1)} : "
                               "tensor<1x3x4x4xf32>", W))
    assert_ir(g, g1(f"  %y = Conv(%x, %w_cropped) {CONV.format(d=1, g=1, p='[0, 0, 0, 0]', s=1)} : "
                    "tensor<1x3x4x4xf32>", "  %w_cropped = const dense<0.5> : tensor<3x2x1x1xf32>\n"))
    g = crop(g1(f"  %y = Conv(%x, %w) {CONV.format(d=3, g=1, p='[3, 3, 3, 3]', s=2)} : "
                               "tensor<1x3x2x2xf32>", W))
    assert_ir(g, g1(f"  %y = Conv(%x, %w_cropped) {CONV.format(d=3, g=1, p='[0, 0, 3, 3]', s=2)} : "
                    "tensor<1x3x2x2xf32>", "  %w_cropped = const dense<0.5> : tensor<3x2x2x2xf32>\n"))


def test_depthwise_fused_conv_keeps_bias_and_activation():
    consts = "  %w = const dense<0.5> : tensor<2x1x3x3xf32>\n  %b = const dense<0.25> : tensor<2xf32>\n"
    g = crop(g1(f"  %y = FusedConv(%x, %w, %b) {FUSED.format(d=5, g=2, p='[5, 5, 5, 5]', s=1)} : "
                               "tensor<1x2x4x4xf32>", consts))
    assert_ir(g, g1(f"  %y = FusedConv(%x, %w_cropped, %b) {FUSED.format(d=1, g=2, p='[0, 0, 0, 0]', s=1)} : "
                    "tensor<1x2x4x4xf32>", "  %b = const dense<0.25> : tensor<2xf32>\n"
                    "  %w_cropped = const dense<0.5> : tensor<2x1x1x1xf32>\n"))


@pytest.mark.parametrize("attrs, out", [
    (CONV.format(d=2, g=1, p="[2, 2, 2, 2]", s=1), "4x4"),    # every tap live for some output
    (CONV.format(d=1, g=1, p="[1, 1, 1, 1]", s=1), "4x4"),    # an ordinary padded 3x3
])
def test_convs_without_dead_taps_are_unchanged(attrs, out):
    unchanged(g1(f"  %y = Conv(%x, %w) {attrs} : tensor<1x3x{out}xf32>", W), "crop-dead-taps")


def test_deeplabv3_aspp_convs_lose_their_dead_taps():
    """DeepLabV3-MobileNetV3's ASPP on its 32x32 map: dilation 36 becomes 1x1 (pads 0); dilations
    12 and 24 keep all nine taps (each reads real rows for some outputs), as do the backbone's
    dilation-2 depthwise convs."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import zoo
    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.passes import PassContext, PassManager
    m = zoo.get("deeplabv3_mobilenet_v3_large")
    g = import_onnx(str(m.path()), m.input_shapes, m.input_values)
    before = {op.name: (op.operands[1].type.shape[2:], list(op.attrs.get("dilations") or [1, 1]))
              for op in g.ops if op.kind == "Conv" and op.operands[0].type.shape[2:] == (32, 32)}
    ctx = PassContext()
    PassManager(["crop-dead-taps"], ctx=ctx).run(g)
    after = {op.name: (op.operands[1].type.shape[2:], list(op.attrs.get("dilations") or [1, 1]))
             for op in g.ops if op.name in before}
    dilated = {n: k for n, k in before.items() if k[1] != [1, 1]}
    assert sorted(d[0] for _, d in dilated.values() if d[0] > 2) == [12, 24, 36]
    for name, (k, (d, _)) in dilated.items():       # also the backbone's dilation-2 depthwise convs
        assert after[name] == (((1, 1), [1, 1]) if d == 36 else (k, [d, d])), (name, after[name])
