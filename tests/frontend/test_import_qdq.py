"""Pre-quantized ONNX models import: Q/DQ with their params in the IR types, DynamicQuantizeLinear,
ConvInteger, MatMulInteger; the IR's numpy reference equals ONNX Runtime bit for bit (integers)
and exactly (floats); the default passes keep the given scales; what is refused, is refused in one line."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h

from qcompiler.errors import UserError
from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.ir import parse_graph as parse
from qcompiler.passes import run_passes
from qcompiler.quant import reference
from qdq_models import X, cases, dynamic_conv_integer, model, ort_plain, qdq_conv

CASES = cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_equals_ort(name):
    m, feeds = CASES[name]
    g = import_onnx(m)
    refs = ort_plain(m, feeds)
    for passes in (False, True):
        if passes:
            run_passes(g)
            g.verify()
        got = reference.run(g, feeds)
        for r, o in zip(refs, got):
            assert o.dtype == r.dtype and o.shape == r.shape
            np.testing.assert_array_equal(o, r, err_msg=f"{name} (after default passes: {passes})")


def test_params_stay_visible_after_default_passes():
    g = import_onnx(qdq_conv())
    run_passes(g)
    kinds = [op.kind for op in g.ops]
    assert kinds.count("QuantizeLinear") == 2 and kinds.count("DequantizeLinear") == 4
    w = next(op for op in g.ops if op.kind == "DequantizeLinear" and op.operands[0].name == "w").operands[0]
    assert w.is_const and w.type.quant.axis == 0 and w.type.quant.storage == "int8"
    from qdq_models import WS
    assert w.type.quant.scale == tuple(float(s) for s in WS)
    xq = next(op for op in g.ops if op.kind == "QuantizeLinear").result
    assert str(xq.type) == "tensor<1x4x6x6x!quant.uniform<u8:f32, 0.05:128>>"
    assert str(parse(str(g))) == str(g)                     # prints and parses back


def test_dynamic_quantize_all_zero_input_scale_one():
    """ONNX Runtime's rule: an all-zero tensor gets scale 1 and zero point 0 (the spec's 0 divides by 0)."""
    m = dynamic_conv_integer()
    feeds = {"x": np.zeros(X.shape, np.float32)}
    refs = ort_plain(m, feeds)
    got = reference.run(import_onnx(m), feeds)
    assert float(refs[2]) == 1.0
    for r, o in zip(refs, got):
        np.testing.assert_array_equal(o, r)


def _one_line(err: UserError, *words):
    msg = str(err)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_block_size_refused():
    m = model([h.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1, block_size=2)],
              {"s": np.full((1, 2, 6, 6), 0.1, np.float32), "z": np.zeros((1, 2, 6, 6), np.uint8)}, X.shape, opset=21)
    with pytest.raises(UserError) as e:
        import_onnx(m)
    _one_line(e.value, "block_size", "QuantizeLinear")


def test_run_time_scale_refused():
    nodes = [h.make_node("ReduceMax", ["x"], ["s"], keepdims=0), h.make_node("QuantizeLinear", ["x", "s"], ["y"])]
    with pytest.raises(UserError) as e:
        import_onnx(model(nodes, {}, X.shape))
    _one_line(e.value, "scale", "not a constant")


def test_float8_imports_and_fnuz_refused():
    """OCP float8 (opset 19) imports as the float8 quantized type (tests/quant/test_fp8_qdq.py has
    the rest); the FNUZ variants are refused with one line."""
    m = model([h.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
              {"s": np.float32(0.1), "z": h.make_tensor("z", T.FLOAT8E4M3FN, [], [0.0])}, X.shape, opset=19)
    assert str(import_onnx(m).outputs[0].type.quant) == "!quant.uniform<f8E4M3FN:f32, 0.1>"
    m = model([h.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
              {"s": np.float32(0.1), "z": h.make_tensor("z", T.FLOAT8E4M3FNUZ, [], [0.0])}, X.shape, opset=19)
    with pytest.raises(UserError) as e:
        import_onnx(m)
    _one_line(e.value, "float8", "no FNUZ float8")


def test_int8_quantize_pass_refuses_prequantized():
    from qcompiler.passes import PassContext, PassManager, parse_pipeline
    from qcompiler.passes.quantize import QuantizeOptions
    g = import_onnx(qdq_conv())
    assert g.meta["prequantized"]
    ctx = PassContext(options={"quantize": QuantizeOptions(calib=None)})
    with pytest.raises(UserError) as e:
        PassManager(parse_pipeline("default,quantize"), ctx=ctx).run(g)
    _one_line(e.value, "already quantized", "--dtype fp32")


def _qdq_pair(s, z, s2=None, z2=None, axis=None, opset=13, x_shape=X.shape):
    """x -> QuantizeLinear(s, z) -> DequantizeLinear(s2, z2) -> y (s2/z2 default to s/z)."""
    kw = {} if axis is None else {"axis": axis}
    inits = {"s": s, "z": z, "s2": s if s2 is None else s2, "z2": z if z2 is None else z2}
    return model([h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **kw),
                  h.make_node("DequantizeLinear", ["q", "s2", "z2"], ["y"], **kw)], inits, x_shape, opset=opset)


BAD_QDQ = {
    "zero scale": (_qdq_pair(np.float32(0.0), np.uint8(0)), "scale must be finite and > 0"),
    "negative scale": (_qdq_pair(np.float32(-0.1), np.uint8(0)), "scale must be finite and > 0"),
    "NaN scale": (_qdq_pair(np.float32(np.nan), np.uint8(0)), "scale must be finite and > 0"),
    "axis out of range": (_qdq_pair(np.full(4, 0.1, np.float32), np.zeros(4, np.uint8), axis=7),
                          "do not fit axis 7"),
    "scales along the wrong axis": (_qdq_pair(np.full(4, 0.1, np.float32), np.zeros(4, np.uint8), axis=2),
                                    "do not fit axis 2"),
    "scale and zero point counts differ": (_qdq_pair(np.full(4, 0.1, np.float32), np.zeros(3, np.uint8), axis=1),
                                           "4 scales but 3 zero points"),
    "mismatched Q/DQ params": (_qdq_pair(np.float32(0.1), np.uint8(3), np.float32(0.2), np.uint8(3)),
                               "its QuantizeLinear quantized with"),
    "int4 storage": (model([h.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
                           {"s": np.float32(0.1), "z": h.make_tensor("z", T.INT4, [], [0])}, X.shape, opset=21),
                     "int4"),
}


@pytest.mark.parametrize("case", sorted(BAD_QDQ))
def test_bad_qdq_input_is_one_line(case):
    m, words = BAD_QDQ[case]
    with pytest.raises(UserError) as e:
        import_onnx(m)
    _one_line(e.value, words)


def test_bad_qdq_input_exits_2_from_the_cli(tmp_path, capsys):
    from qcompiler.cli import main
    p = tmp_path / "bad.onnx"
    onnx.save(BAD_QDQ["zero scale"][0], str(p))
    assert main([str(p), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "scale must be finite and > 0" in err and not (tmp_path / "out").exists()
