"""The textual IR: hand-written text parses, prints deterministically, and parse errors say where."""
import numpy as np
import pytest

from qcompiler.ir import ParseError, parse_graph, print_graph

TEXT = """\
graph @t(%x: tensor<1x2x4x4xf32>) {
  %b = const dense<[0.5, -1.0]> : tensor<2xf32>
  %w = const dense<0.25> : tensor<2x2x3x3xf32>
  %"onnx::Conv_1" = Conv(%x, %w, %b) {dilations = [1, 1], group = 1, pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<1x2x4x4xf32> loc("conv/1")
  %y = Clip(%"onnx::Conv_1") {max = 6.0, min = 0.0} : tensor<1x2x4x4xf32> loc("relu6")
  %q = QuantizeLinear(%y) : tensor<1x2x4x4x!quant.uniform<u8:f32, 0.0235:0>> loc("q")
  %z = DequantizeLinear(%q) : tensor<1x2x4x4xf32> loc("dq")
  return %z
}
"""


def test_parse_print_fixed_point_with_blobs_and_quoted_names():
    g = parse_graph(TEXT)
    g.verify()
    assert g.consts["w"].data.shape == (2, 2, 3, 3) and float(g.consts["w"].data[1, 1, 2, 2]) == 0.25
    text = print_graph(g)
    assert "blobs {" in text and '%"onnx::Conv_1" = Conv' in text and 'loc("conv/1")' in text
    assert print_graph(parse_graph(text)) == text


def test_float32_values_round_trip_exactly():
    vals = np.array([0.1, 1 / 3, 1e-8, -3.4e38, 6.0, np.inf, -np.inf], np.float32)
    text = f"graph @t() {{\n  %c = const dense<[{', '.join(map(str, vals.tolist()))}]> : tensor<7xf32>\n  return %c\n}}\n"
    g = parse_graph(text)
    g2 = parse_graph(print_graph(g))
    np.testing.assert_array_equal(g2.consts["c"].data, vals)


@pytest.mark.parametrize("bad, msg", [
    ("graph @t(%x: tensor<2xf32>) {\n  %y = Relu(%nope) : tensor<2xf32>\n  return %y\n}", "undefined value %nope"),
    ("graph @t(%x: tensor<2xf99>) {\n  return %x\n}", "unknown element type 'f99'"),
    ("graph @t(%x: tensor<2xf32>) {\n  %x = Relu(%x) : tensor<2xf32>\n  return %x\n}", "defined twice"),
    ("graph @t() {\n  %c = const dense<[1.0, 2.0]> : tensor<3xf32>\n  return %c\n}", "2 elements"),
    ("graph @t(%x: tensor<2x!quant.uniform<i8:f32:1, {0.1:0}>>) {\n  return %x\n}", "quant axis 1 out of range"),
])
def test_parse_errors_name_line_and_problem(bad, msg):
    with pytest.raises(ParseError, match=msg) as e:
        parse_graph(bad)
    assert "line " in str(e.value)
