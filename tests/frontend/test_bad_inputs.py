"""The importer's half of the bad-input corpus: each bad model raises UserError whose text is one
line naming the problem (the CLI prints it and exits 2)."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import realmodels as rm
from qcompiler.errors import UserError
from qcompiler.frontend import import_onnx

F = TensorProto.FLOAT


def conv_model(w=None, opset=13, x_dims=(1, 2, 4, 4), extra_nodes=(), outputs=("y",), domain_ops=()):
    """x -> Conv(w) -> Relu -> y."""
    w = np.ones((3, 2, 1, 1), np.float32) if w is None else w
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1"),
             helper.make_node("Relu", ["c"], ["y"], name="relu1"), *extra_nodes]
    g = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", F, list(x_dims))],
                          [helper.make_tensor_value_info(o, F, None) for o in outputs],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *domain_ops])
    m.ir_version = 8
    return m


def write(tmp_path, name, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def external(tmp_path, location: str, nbytes: int | None = None) -> str:
    """conv_model with its weight in external data at ``location`` (relative to the model)."""
    m = conv_model(np.arange(6, dtype=np.float32).reshape(3, 2, 1, 1))
    t = m.graph.initializer[0]
    raw = t.raw_data
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    folder = tmp_path / "model"
    folder.mkdir()
    target = folder / location
    if nbytes is not None and not os.path.isabs(location) and ".." not in location:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(raw[:nbytes])
    p = folder / "m.onnx"
    p.write_bytes(m.SerializeToString())
    return str(p)


def cls_bytes() -> bytes:
    m = next(m for m in rm.rapidocr_models() if m.name == "rapidocr-cls")
    with open(m.source, "rb") as f:
        return f.read()


def bad(tmp_path, case):
    """case -> (model source, input_shapes)."""
    if case == "empty file":
        return write(tmp_path, "e.onnx", b""), None
    if case == "truncated protobuf":
        data = cls_bytes()
        return write(tmp_path, "t.onnx", data[:len(data) // 3]), {"x": (1, 3, 48, 192)}
    if case == "png":
        png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x04\x00\x00\x00\x04\x08\x02\x00\x00\x00&\x93\t)"
        return write(tmp_path, "p.onnx", png), None
    if case == "text":
        return write(tmp_path, "t.onnx", b"graph { node: Conv }\nnot a model at all\n"), None
    if case == "tensor not model":
        return write(tmp_path, "t.onnx", numpy_helper.from_array(np.ones(3, np.float32)).SerializeToString()), None
    if case == "missing file":
        return str(tmp_path / "nope.onnx"), None
    if case == "folder":
        return str(tmp_path), None
    if case == "unsupported op":
        m = conv_model(extra_nodes=[helper.make_node("TopK", ["y", "k"], ["v", "i"], name="topk")], outputs=("v",))
        m.graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), "k"))
        return m, None
    if case == "custom domain":
        m = conv_model(extra_nodes=[helper.make_node("FusedConv", ["y"], ["z"], name="fc", domain="com.microsoft")],
                       outputs=("z",), domain_ops=[helper.make_opsetid("com.microsoft", 1)])
        return m, None
    if case == "ml domain":
        m = conv_model(extra_nodes=[helper.make_node("Normalizer", ["y"], ["z"], name="nz", domain="ai.onnx.ml")],
                       outputs=("z",), domain_ops=[helper.make_opsetid("ai.onnx.ml", 3)])
        return m, None
    if case == "unknown op":
        return conv_model(extra_nodes=[helper.make_node("FooBar", ["y"], ["z"], name="foo")], outputs=("z",)), None
    if case == "opset 9":
        return conv_model(opset=9), None
    if case == "opset 22":
        return conv_model(opset=22), None
    if case == "dynamic dims":
        return conv_model(x_dims=("N", 2, "H", "W")), None
    if case == "no input shape":
        m = conv_model()
        m.graph.input[0].type.tensor_type.ClearField("shape")
        return m, None
    if case == "input_shapes unknown name":
        return conv_model(), {"image": (1, 2, 4, 4)}
    if case == "input_shapes wrong rank":
        return conv_model(x_dims=("N", 2, "H", "W")), {"x": (1, 2, 4)}
    if case == "input_shapes conflicts":
        return conv_model(), {"x": (1, 3, 4, 4)}
    if case == "input_shapes nonpositive":
        return conv_model(x_dims=("N", 2, "H", "W")), {"x": (1, 2, 0, 4)}
    if case == "input_shapes too large":           # 2^31 elements and more: past the kernels' int32 index
        return conv_model(x_dims=("N", 2, "H", "W")), {"x": (1, 2, 200000, 200000)}
    if case == "intermediate too large":           # x fits (1.8 G elements), the conv's 3-channel output not
        return conv_model(x_dims=("N", 2, "H", "W")), {"x": (1, 2, 30000, 30000)}
    if case == "zero-size dim":
        return conv_model(x_dims=(1, 2, 0, 4)), None
    if case == "external outside folder":
        return external(tmp_path, "../w.bin"), None
    if case == "external absolute":
        return external(tmp_path, "/etc/passwd"), None
    if case == "external missing":
        return external(tmp_path, "w.bin"), None
    if case == "external truncated":
        return external(tmp_path, "data/w.bin", nbytes=10), None
    if case == "external in memory":
        m = conv_model()
        t = m.graph.initializer[0]
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value="w.bin")
        return m, None
    if case == "zero-size weight":
        return conv_model(np.zeros((0, 2, 1, 1), np.float32)), None
    if case == "NaN weight":
        w = np.ones((3, 2, 1, 1), np.float32)
        w[1, 0, 0, 0] = np.nan
        return conv_model(w), None
    if case == "Inf weight":
        w = np.ones((3, 2, 1, 1), np.float32)
        w[0, 1, 0, 0] = -np.inf
        return conv_model(w), None
    if case == "cycle":
        m = conv_model()
        m.graph.node[0].input[0] = "y"          # conv1 reads relu1's output
        m.graph.node.append(helper.make_node("Identity", ["x"], ["unused"], name="id"))
        return m, None
    if case == "duplicate outputs":
        m = conv_model()
        m.graph.output.append(helper.make_tensor_value_info("y", F, None))
        return m, None
    if case == "tensor defined twice":
        return conv_model(extra_nodes=[helper.make_node("Sigmoid", ["x"], ["c"], name="sig")]), None
    if case == "undefined tensor":
        return conv_model(extra_nodes=[helper.make_node("Add", ["y", "ghost"], ["z"], name="add")],
                          outputs=("z",)), None
    if case == "output not produced":
        return conv_model(outputs=("y", "nowhere")), None
    if case == "training batchnorm":
        m = conv_model(extra_nodes=[helper.make_node("BatchNormalization", ["y", "s", "s", "s", "s"], ["z", "rm", "rv"],
                                                     name="bn", training_mode=1)], outputs=("z",), opset=15)
        m.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "s"))
        return m, None
    if case == "shapes do not fit":
        m = conv_model(extra_nodes=[helper.make_node("Reshape", ["y", "s"], ["z"], name="rs")], outputs=("z",))
        m.graph.initializer.append(numpy_helper.from_array(np.array([5, -1], np.int64), "s"))
        return m, None
    if case == "string input":
        m = conv_model()
        m.graph.input[0].type.tensor_type.elem_type = TensorProto.STRING
        return m, None
    raise AssertionError(case)


CASES = {   # case -> what the message must say
    "empty file": r"e\.onnx: the file is empty",
    "truncated protobuf": r"not a valid ONNX protobuf \(truncated",
    "png": "not a valid ONNX protobuf",
    "text": "not a valid ONNX protobuf",
    "tensor not model": "not an ONNX model",
    "missing file": "nope.onnx: file not found",
    "folder": "is a folder, not an ONNX file",
    "unsupported op": r"node TopK 'topk': unsupported operator 'TopK'",
    "custom domain": r"node FusedConv 'fc': operator 'com\.microsoft::FusedConv' is outside the standard ONNX domain",
    "ml domain": r"'ai\.onnx\.ml::Normalizer' is outside the standard",
    "unknown op": r"node FooBar 'foo': unknown ONNX operator 'FooBar'",
    "opset 9": r"opset 9 is older than qcompiler supports \(11\.\.21\).*re-export the model with opset >= 11",
    "opset 22": r"opset 22 is newer than qcompiler supports",
    "dynamic dims": r"input 'x': has dynamic dims \[0, 2, 3\].*--input-shape x=1x2x<d2>x<d3>",
    "no input shape": r"input 'x': has no shape in the model.*--input-shape x=",
    "input_shapes unknown name": r"--input-shape names 'image', which is not an input.*inputs are: x",
    "input_shapes wrong rank": r"input 'x': --input-shape 1x2x4 has rank 3, the input has rank 4",
    "input_shapes conflicts": r"input 'x': --input-shape 1x3x4x4 sets dim 1 to 3, the model fixes it at 2",
    "input_shapes nonpositive": r"input 'x': bad --input-shape 1x2x0x4: dims must be positive",
    "zero-size dim": r"input 'x': has a zero-size dimension \(1x2x0x4\)",
    "external outside folder": r"tensor 'w': external data location '\.\./w\.bin' is not a file inside the model's folder",
    "external absolute": r"tensor 'w': external data location '/etc/passwd' is not a file inside",
    "external missing": r"tensor 'w': external data file 'w\.bin' not found",
    "external truncated": r"tensor 'w': external data in 'data/w\.bin' has 10 bytes, the tensor needs 24",
    "external in memory": r"tensor 'w': uses external data but the model was given in memory",
    "zero-size weight": r"initializer 'w': is an empty tensor \(shape \[0, 2, 1, 1\]\)",
    "NaN weight": r"initializer 'w': holds 1 NaN/Inf value.*weights are corrupt",
    "Inf weight": r"initializer 'w': holds 1 NaN/Inf value",
    "cycle": r"node Conv 'conv1': the graph has a cycle",
    "duplicate outputs": r"duplicate graph output 'y'",
    "tensor defined twice": r"tensor 'c' is defined twice \(by node Conv 'conv1' and by node Sigmoid 'sig'\)",
    "undefined tensor": r"node Add 'add': reads tensor 'ghost', which nothing defines",
    "output not produced": r"graph output 'nowhere' is not produced by anything",
    "training batchnorm": r"node BatchNormalization 'bn': training_mode=1.*eval/inference mode",
    "shapes do not fit": r"ONNX shape inference failed: .*Reshape",
    "string input": r"input 'x': has unsupported element type STRING",
    "input_shapes too large": r"tensor 'x' \(a model input\) would have shape 1x2x200000x200000: "
                              r"80,000,000,000 elements, more than the 2,147,483,647",
    "intermediate too large": r"tensor 'c' \(made by Conv 'conv1'\) would have shape 1x3x30000x30000: "
                              r"2,700,000,000 elements",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_a_one_line_user_error(tmp_path, case):
    src, shapes = bad(tmp_path, case)
    with pytest.raises(UserError) as e:
        import_onnx(src, shapes)
    msg = str(e.value)
    assert "\n" not in msg and msg.strip() == msg
    assert e.value.fix, f"{case}: no fix given"
    assert re.search(CASES[case], msg), f"{case}: {msg}"


def test_corpus_is_big_enough():
    assert len(CASES) >= 15


def test_symlink_out_of_the_folder_is_rejected(tmp_path):
    p = external(tmp_path, "w.bin", nbytes=24)
    outside = tmp_path / "secret.bin"
    outside.write_bytes(np.arange(6, dtype=np.float32).tobytes())
    link = tmp_path / "model" / "w.bin"
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(UserError, match="resolves outside the model's folder"):
        import_onnx(p)


def test_external_data_inside_the_folder_loads(tmp_path):
    p = external(tmp_path, "data/w.bin", nbytes=24)
    g = import_onnx(p)
    np.testing.assert_array_equal(g.consts["w"].data.reshape(-1), np.arange(6, dtype=np.float32))
