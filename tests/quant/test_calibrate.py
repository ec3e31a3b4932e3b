"""collect_ranges: one onnxruntime session over a stream, against numpy brute force."""
import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.errors import UserError
from qcompiler.ir import Graph, TensorType
from qcompiler.quant.calibrate import collect_ranges, observe
from qcompiler.quant.data import open_dataset
from qcompiler.quant.observers import Percentile

F = "float32"
CONV = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1}


def conv_relu_graph(batch=1, cin=3, cout=4, hw=8):
    rng = np.random.default_rng(0)
    g = Graph("g")
    x = g.add_input("x", TensorType((batch, cin, hw, hw), F))
    w = g.add_const(rng.standard_normal((cout, cin, 3, 3)).astype(F) * 0.3, "w")
    b = g.add_const(rng.standard_normal(cout).astype(F), "b")
    conv = g.create_op("Conv", [x, w, b], CONV)
    relu = g.create_op("Relu", [conv.result])
    g.outputs = [relu.result]
    return g


def numpy_conv(x, w, b):
    """3x3 conv, pad 1, stride 1, by brute force."""
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, i:i + h, j:j + wd] for i in range(3) for j in range(3)], axis=2)   # n,c,9,h,w
    return np.einsum("nckhw,ock->nohw", cols, w.reshape(w.shape[0], c, 9)) + b[None, :, None, None]


@pytest.fixture
def data(tmp_path):
    a = (np.random.default_rng(1).standard_normal((40, 3, 8, 8)) * 2).astype(np.float32)
    np.save(tmp_path / "x.npy", a)
    return tmp_path / "x.npy", a


def test_collect_ranges_matches_numpy(data):
    path, a = data
    g = conv_relu_graph()
    names = ["x", "w", "conv_out", "relu_out"]
    r = collect_ranges(g, open_dataset(path, g.inputs), names)
    w, b = g.value("w").data, g.value("b").data
    y = numpy_conv(a.astype(np.float64), w, b)
    assert r["x"] == (float(a.min()), float(a.max())) and r["w"] == (float(w.min()), float(w.max()))
    assert r["conv_out"] == pytest.approx((y.min(), y.max()), abs=1e-4)
    assert r["relu_out"] == pytest.approx((0.0, y.max()), abs=1e-4)
    # percentile through the same path, against numpy on the brute-force activations
    p = collect_ranges(g, open_dataset(path, g.inputs, batch=8), ["conv_out"], "percentile", p=99.0)["conv_out"]
    obs = observe(g, open_dataset(path, g.inputs), ["conv_out"], lambda n: Percentile(99.0))["conv_out"]
    tol = obs.hist.width + 1e-3
    assert p[1] == pytest.approx(np.percentile(y, 99.0), abs=tol)
    assert p[0] == pytest.approx(np.percentile(y, 1.0), abs=tol)
    for m in ("entropy", "mse"):
        lo, hi = collect_ranges(g, open_dataset(path, g.inputs), ["relu_out"], m)["relu_out"]
        assert lo == 0.0 and 0 < hi <= y.max() + 1e-4


def test_batches_are_split_to_the_model_batch(data):
    path, a = data
    g2 = conv_relu_graph(batch=2)
    r1 = collect_ranges(conv_relu_graph(), open_dataset(path, [("x", (1, 3, 8, 8), F)], batch=8), ["conv_out"])
    r2 = collect_ranges(g2, open_dataset(path, g2.inputs, batch=8), ["conv_out"])
    assert r1["conv_out"] == pytest.approx(r2["conv_out"], abs=1e-5)
    with pytest.warns(UserWarning, match="skipping 1 sample"):
        collect_ranges(g2, open_dataset(path, g2.inputs, samples=5, batch=5), ["conv_out"])


def test_onnx_model_input_and_errors(data):
    path, a = data
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Tanh", ["t"], ["y"]),
             helper.make_node("Shape", ["x"], ["shp"])]
    shp = helper.make_tensor_value_info("shp", TensorProto.INT64, [4])
    m = helper.make_model(helper.make_graph(nodes, "m", [x], [y, shp],
                                            [numpy_helper.from_array(np.float32(2.0), "two")]),
                          opset_imports=[helper.make_opsetid("", 17)])
    ds = open_dataset(path, [("x", (1, 3, 8, 8), F)])
    r = collect_ranges(m, ds, ["t", "y"])
    assert r["t"] == pytest.approx((2 * a.min(), 2 * a.max()))
    assert r["y"] == pytest.approx((np.tanh(2 * a.min()), np.tanh(2 * a.max())), abs=1e-6)
    assert len(m.graph.output) == 2                                   # the caller's model is untouched
    with pytest.raises(ValueError, match="no value named %nope"):
        collect_ranges(m, ds, ["nope"])
    with pytest.raises(ValueError, match="INT64, not floating point"):
        collect_ranges(m, ds, ["shp"])
    with pytest.raises(ValueError, match="unknown calibration method"):
        collect_ranges(m, ds, ["t"], "kl")
    with pytest.raises(UserError, match="no values for model input"):
        collect_ranges(m, [{"z": a[:1]}], ["t"])


def peak_bytes(path, n):
    g = conv_relu_graph(cout=8, hw=32)
    values = ["x", "conv_out", "relu_out"]
    ds = open_dataset(path, g.inputs, samples=n)
    collect_ranges(g, open_dataset(path, g.inputs, samples=2), values, "percentile")   # warm up ORT
    tracemalloc.start()
    try:
        collect_ranges(g, ds, values, "percentile")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_samples(tmp_path):
    a = np.random.default_rng(3).standard_normal((500, 3, 32, 32)).astype(np.float32)   # 6 MB on disk
    np.save(tmp_path / "x.npy", a)
    small, large = peak_bytes(tmp_path / "x.npy", 50), peak_bytes(tmp_path / "x.npy", 500)
    one_activation_set = 500 * 8 * 32 * 32 * 4                        # what storing would take: 16 MB
    assert large < small * 1.5 + 256 * 1024, (small, large)
    assert large < one_activation_set / 10


def test_a_generator_stream_is_held_one_batch_at_a_time():
    """Streaming, counted directly: every feed a generator yields is freed before the next one is
    asked for (at most one batch alive while calibrating), and the ranges are those of all of them."""
    import gc
    import weakref
    g = conv_relu_graph(cout=8, hw=16)
    alive, peak, made = set(), [0], []

    def feeds(n=60):
        rng = np.random.default_rng(5)
        for i in range(n):
            gc.collect()
            peak[0] = max(peak[0], len(alive))
            x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32) * (1 + i % 7)
            made.append((float(x.min()), float(x.max())))
            alive.add(i)
            weakref.finalize(x, alive.discard, i)
            yield {"x": x}

    ranges = collect_ranges(g, feeds(), ["x", "relu_out" if g.has_value("relu_out") else g.outputs[0].name])
    assert peak[0] <= 1, peak                          # the previous batch was gone when the next was made
    assert ranges["x"] == (min(m[0] for m in made), max(m[1] for m in made))
