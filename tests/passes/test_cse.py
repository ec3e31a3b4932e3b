"""cse: equal constants (dtype, shape, bytes) and equal ops (kind, attributes, operands) merge."""
from ir_check import assert_ir, run_ir, unchanged


def test_constants_and_commutative_ops_merge():
    g = run_ir("""
    graph @g(%x: tensor<4xf32>) {
      %a = const dense<1.0> : tensor<4xf32>
      %b = const dense<1.0> : tensor<4xf32>
      %y1 = Add(%x, %a) : tensor<4xf32>
      %y2 = Add(%b, %x) : tensor<4xf32>
      %t1 = Tanh(%y1) : tensor<4xf32>
      %t2 = Tanh(%y2) : tensor<4xf32>
      %z = Sub(%t1, %t2) : tensor<4xf32>
      return %z
    }""", "cse")
    assert_ir(g, """
    graph @g(%x: tensor<4xf32>) {
      %a = const dense<1.0> : tensor<4xf32>
      %y1 = Add(%x, %a) : tensor<4xf32>
      %t1 = Tanh(%y1) : tensor<4xf32>
      %z = Sub(%t1, %t1) : tensor<4xf32>
      return %z
    }""")


def test_output_twin_takes_over_output_name():
    g = run_ir("""
    graph @g(%x: tensor<4xf32>) {
      %a = Relu(%x) : tensor<4xf32>
      %b = Relu(%x) : tensor<4xf32>
      %y = Mul(%a, %a) : tensor<4xf32>
      return %y, %b
    }""", "cse")
    assert_ir(g, """
    graph @g(%x: tensor<4xf32>) {
      %b = Relu(%x) : tensor<4xf32>
      %y = Mul(%b, %b) : tensor<4xf32>
      return %y, %b
    }""")


def test_not_merged_different_attrs_values_dtypes_order_or_two_outputs():
    unchanged("""graph @g(%x: tensor<2x2xf32>, %i: tensor<4xi32>) {
  %a = const dense<0.0> : tensor<4xf32>
  %b = const dense<0> : tensor<4xi32>
  %c = const dense<[1.0, 2.0, 3.0, 4.0]> : tensor<2x2xf32>
  %d = const dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %t1 = Transpose(%x) {perm = [1, 0]} : tensor<2x2xf32>
  %t2 = Transpose(%x) {perm = [0, 1]} : tensor<2x2xf32>
  %s1 = Sub(%t1, %c) : tensor<2x2xf32>
  %s2 = Sub(%c, %t1) : tensor<2x2xf32>
  %r1 = Relu(%x) : tensor<2x2xf32>
  %r2 = Relu(%x) : tensor<2x2xf32>
  %j = Add(%i, %b) : tensor<4xi32>
  return %t2, %s1, %s2, %r1, %r2, %a, %d, %j
}
""", "cse")


def test_quantized_constants_with_other_params_stay_apart():
    """The same stored integers with another scale are another value (a QDQ model's per-layer
    constants: rapidocr-det's ORT QDQ file has dozens of [255] uint8 scalars, each its own scale)."""
    text = """graph @g(%x: tensor<4xf32>) {
      %a = const dense<[255]> : tensor<1x!quant.uniform<u8:f32, 0.0037:0>>
      %b = const dense<[255]> : tensor<1x!quant.uniform<u8:f32, 0.0021:0>>
      %c = const dense<[255]> : tensor<1x!quant.uniform<u8:f32, 0.0037:0>>
      %da = DequantizeLinear(%a) : tensor<1xf32>
      %db = DequantizeLinear(%b) : tensor<1xf32>
      %dc = DequantizeLinear(%c) : tensor<1xf32>
      %y1 = Mul(%x, %da) : tensor<4xf32>
      %y2 = Mul(%x, %db) : tensor<4xf32>
      %y3 = Mul(%x, %dc) : tensor<4xf32>
      %s = Add(%y1, %y2) : tensor<4xf32>
      %z = Add(%s, %y3) : tensor<4xf32>
      return %z
    }"""
    g = run_ir(text, "cse")
    assert sorted(g.consts) == ["a", "b"]
    assert sum(op.kind == "Mul" for op in g.ops) == 2
