"""Output channels padded to the vector width (qcompiler/codegen/kernels/conv.py, padded_channels):
a group-1 conv whose channel count only a narrow block divides (SSDLite's 546 = 2·273) accumulates
k rounded up to the vector width with zero weights, and stores them padded where a narrower
block than 4 lanes would divide k (codegen/channel_padding.py); the numbers are the conv's, whether
the padded accumulator is a graph output or feeds the next conv."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from qcompiler.codegen.intrin import DotIsa
from qcompiler.codegen.kernels.conv import padded_channels
from qcompiler.codegen.kernels.qdot import dot_channels
from qcompiler.codegen.lower import build_module, lower
from qcompiler.codegen.target import X86_LEVELS, TargetSpec, vector_width
from qcompiler.ir import Graph, TensorType

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("k, vw, k_red, kp", [
    (546, 16, 672, 560),   # 2-lane blocks -> 35 full vectors
    (546, 8, 672, 552),    # AVX2: the same, 8 lanes
    (42, 16, 288, 48),
    (100, 16, 480, 112),   # 4-lane blocks, long sums: 25 -> 7 vectors a tap, worth the stores
    (36, 16, 24, 36),      # 4-lane blocks, 24 terms: 144 multiply-adds saved < 360 for the stores
    (3, 16, 27, 16),       # a 3-channel head: 3 scalar chains -> one vector
    (24, 16, 288, 24),     # 8-lane blocks fill half a vector: kept (NCHW8c between convs)
    (546, 4, 672, 546),    # NEON: 2 of 4 lanes is half a vector
    (3, 4, 27, 4),
    (5, 1, 100, 5),        # CUDA: no blocked layouts
])
def test_padded_channels(k, vw, k_red, kp):
    assert padded_channels(k, vw, k_red) == kp


@pytest.mark.parametrize("isa, kg, kgp", [
    (DotIsa("vnni", 16), 546, 560),     # was 548 on 4-lane registers: 137 -> 35 instructions
    (DotIsa("vnni", 16), 10, 16),
    (DotIsa("vnni", 16), 12, 12),       # 4 lanes divide it: no padding, no copy out of a tile
    (DotIsa("vnni", 16), 24, 24),
    (DotIsa("pmaddwd", 8), 546, 552),
    (DotIsa("sdot", 4), 10, 12),
])
def test_dot_channels(isa, kg, kgp):
    assert dot_channels(kg, isa) == kgp


def head(k: int = 42, with_next: bool = False):
    """Conv(3x3, 32 -> k, bias, ReLU) on 9x9, optionally followed by Conv(1x1, k -> 16)."""
    g = Graph("head")
    x = g.add_input("x", TensorType((1, 32, 9, 9), "float32"))
    w1 = (RNG.standard_normal((k, 32, 3, 3)) / 17).astype(np.float32)
    b1 = RNG.standard_normal(k).astype(np.float32)
    y = g.create_op("FusedConv", [x, g.add_const(w1, "w1"), g.add_const(b1, "b1")],
                    {"pads": [1, 1, 1, 1], "activation": "Relu"}).result
    consts = {"w1": w1, "b1": b1}
    if with_next:
        w2 = (RNG.standard_normal((16, k, 1, 1)) / np.sqrt(k)).astype(np.float32)
        y = g.create_op("Conv", [y, g.add_const(w2, "w2")], {}).result
        consts["w2"] = w2
    g.outputs = [y]
    return g, consts


def reference(x, consts):
    w1 = consts["w1"].astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = sum(np.einsum("nchw,kc->nkhw", xp[:, :, i:i + 9, j:j + 9], w1[:, :, i, j])
            for i in range(3) for j in range(3))
    y = np.maximum(y + consts["b1"][None, :, None, None], 0)
    if "w2" in consts:
        y = np.einsum("nchw,kc->nkhw", y, consts["w2"][:, :, 0, 0].astype(np.float64))
    return y


@pytest.mark.parametrize("cpu", X86_LEVELS)
def test_accumulator_is_padded_to_full_vectors(cpu):
    spec = TargetSpec("x86", cpu=cpu)
    vw = vector_width(spec)
    graph, _ = head(42, with_next=True)
    shapes, stored = [], []
    for f in lower(graph, spec).functions.values():
        if isinstance(f, tvm.tirx.PrimFunc):
            sch = s_tir.Schedule(f)
            try:
                blk = sch.get(sch.get_sblock("conv_update"))
            except Exception:  # noqa: BLE001 - no conv block in this kernel
                continue
            shapes.append(tuple(int(d) for d in blk.writes[0].source.shape))
            stored.append(tuple(int(d) for d in f.script().split("out: T.Buffer((")[1].split(")")[0].split(", ")))
    assert shapes and shapes[0][1] * shapes[0][4] == padded_channels(42, vw, 32 * 9) == 48, shapes
    assert shapes[0][4] >= vw // 2, shapes     # whole vectors (or two per tile), not 2-lane blocks
    # the intermediate is stored as the accumulator computes it (the pad-channels rewrite of
    # codegen/channel_padding.py): 48 channels in whole vectors, not 42 in 2-lane blocks
    assert stored[0] == (1, 48 // vw, 9, 9, vw), stored


@pytest.mark.parametrize("with_next", [False, True], ids=["graph-output", "feeds-a-conv"])
def test_padded_conv_matches_numpy(with_next):
    graph, consts = head(42, with_next)
    x = RNG.standard_normal((1, 32, 9, 9)).astype(np.float32)
    vm = relax.VirtualMachine(build_module(graph, TargetSpec("x86")), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    ref = reference(x, consts)
    assert got.shape == ref.shape
    # float32 sums of <= 288 terms of unit-scale products: 1e-5 of max|ref| is ~100 ulps of margin
    assert float(np.abs(got - ref).max()) <= 1e-5 * float(np.abs(ref).max())


def test_int8_chain_stores_padded_channels_and_keeps_its_integers(monkeypatch):
    """A quantized 10-channel conv -> depthwise -> conv chain on x86: its convs store 16 channels
    in one 16-lane block (pad-channels, codegen/channel_padding.py), and the artifact's outputs
    equal the integer reference interpreter's bit for bit, as with the rewrite turned off."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "passes"))
    from test_pad_channels import quantized_chain

    from qcompiler.codegen.channel_padding import padded_graph
    from qcompiler.quant.reference import run
    graph, feed = quantized_chain()
    spec = TargetSpec("x86", cpu="znver4", dtype="int8")
    padded = padded_graph(graph, spec)
    assert sorted(op.results[0].shape[1] for op in padded.ops if op.kind == "QLinearConv") == [8, 16, 16]
    ref = run(graph, feed)
    for env in ("1", "0"):
        monkeypatch.setenv("QC_PAD_CHANNELS", env)
        vm = relax.VirtualMachine(build_module(graph, TargetSpec("x86", dtype="int8")), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(feed["x"]))
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(g.numpy(), r)
