"""Winograd F(2x2, 3x3) for int8 3x3 convs on ``vpmaddwd`` (:mod:`qcompiler.codegen.x86.qwinograd`):

* the integer identity it rests on, in numpy: A^T [(G' g G'^T) ⊙ (B^T d B)] A = 4 · (d ⋆ g) for
  every 2x2 output tile, with G' = 2G;
* the x86 kernel BIT-EXACT against the numpy oracle (odd sizes, asymmetric padding, int8 and uint8
  activations, batch 2), and chosen exactly where it should be: on the pmaddwd ISAs (AVX2,
  AVX-512BW without VNNI), not on VNNI, not for strides, groups, other kernel sizes or few channels;
* the overflow guard: weights whose transformed partial sums could leave int32 keep the direct kernel.
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_x86_int8 import ACT, ISAS, X86_LEVELS, add_qconv, check_exact, isa_spec, qin, strict  # noqa: E402,F401

from qcompiler.codegen.intrin import DotIsa  # noqa: E402
from qcompiler.codegen.isa import int8_isa  # noqa: E402
from qcompiler.codegen.lower import lower  # noqa: E402
from qcompiler.codegen.target import TargetSpec  # noqa: E402
from qcompiler.codegen.x86 import qwinograd  # noqa: E402
from qcompiler.ir import Graph, TensorType  # noqa: E402

RNG = np.random.default_rng(11)


def test_integer_f2x3_is_four_times_the_correlation():
    """Every 2x2 tile of a 3x3 correlation from its 4x4 input tile, in integers only."""
    for _ in range(200):
        d = RNG.integers(-128, 256, (4, 4))
        g = RNG.integers(-128, 128, (3, 3))
        u = qwinograd.G2 @ g @ qwinograd.G2.T
        v = qwinograd.BT @ d @ qwinograd.BT.T
        y4 = qwinograd.AT @ (u * v) @ qwinograd.AT.T
        direct = np.array([[np.sum(d[a:a + 3, b:b + 3] * g) for b in range(2)] for a in range(2)])
        assert np.array_equal(y4, 4 * direct)
        assert np.abs(u).max() <= 9 * 128 and np.abs(v).max() <= 4 * 255     # int16 operands


def test_transformed_weights_layout():
    w = RNG.integers(-127, 128, (5, 3, 3, 3)).astype(np.int8)
    u = qwinograd.transformed_weights(w)
    assert u.shape == (16, 5, 3)
    k, c = 4, 2
    want = qwinograd.G2 @ w[k, c].astype(np.int64) @ qwinograd.G2.T
    assert np.array_equal(u[:, k, c].reshape(4, 4), want)


WINO_CONVS = [  # (storage, C, O, H, W, pads, activation)
    ("uint8", 32, 64, 14, 14, (1, 1, 1, 1), "Relu"),      # mnistnet's second conv: 7x7 tiles
    ("int8", 16, 24, 9, 11, (1, 1, 1, 1), ""),            # odd sizes: the last tile row/column half used
    ("uint8", 32, 32, 7, 5, (0, 2, 1, 0), "Clip"),        # asymmetric padding, output 6x7
    ("uint8", 64, 128, 8, 8, (1, 1, 1, 1), "Relu"),       # svhnnet's fifth conv: two registers of outputs
    ("int8", 18, 8, 6, 6, (0, 0, 0, 0), ""),              # no padding; C = 18 (9 pairs), one register
]


def _graph(storage, c, o, h, w, pads, act, batch=2):
    g = Graph("q")
    x = g.add_input("x", TensorType((batch, c, h, w), storage, ACT[storage]))
    g.outputs = [add_qconv(g, x, o, (3, 3), p=pads, act=act, params=(0.0, 6.0) if act == "Clip" else ())]
    return g


def _uses_winograd(g, spec) -> bool:
    mod = lower(g, spec)
    return any("wgemm" in mod[gv].script() for gv in mod.functions if "qlinearconv" in gv.name_hint)


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("storage, c, o, h, w, pads, act", WINO_CONVS)
def test_winograd_conv_bit_exact(strict, isa, storage, c, o, h, w, pads, act):
    spec = isa_spec(isa)
    g = _graph(storage, c, o, h, w, pads, act)
    assert _uses_winograd(g, spec) == (ISAS[isa][3] == "vpmaddwd")
    check_exact(g, {"x": qin(ACT[storage], (2, c, h, w))}, f"{isa} winograd {storage} {c}->{o} {h}x{w}", spec)


@pytest.mark.parametrize("cpu", X86_LEVELS)
def test_winograd_chosen_for_each_cpu(cpu):
    """Compiled for each x86 level (no such CPU needed): the pmaddwd ones (AVX2, AVX-512 without
    VNNI) take Winograd for a 3x3 conv and for both convs of a chain; the VNNI ones keep the direct
    conv (vpdpbusd multiplies 4 pairs an instruction, the transformed int16 operands only 2)."""
    spec = TargetSpec("x86", cpu=cpu)
    want = int8_isa(spec).kind == "pmaddwd"
    assert _uses_winograd(_graph("uint8", 32, 64, 14, 14, (1, 1, 1, 1), "Relu"), spec) == want
    g = Graph("q")
    x = g.add_input("x", TensorType((1, 64, 8, 8), "uint8", ACT["uint8"]))
    y = add_qconv(g, x, 128, (3, 3), p=(1, 1, 1, 1), act="Relu")
    g.outputs = [add_qconv(g, y, 128, (3, 3), p=(1, 1, 1, 1), act="Relu")]
    mod = lower(g, spec)
    convs = [mod[gv].script() for gv in mod.functions if "qlinearconv" in gv.name_hint]
    assert len(convs) == 2 and [("wgemm" in t) for t in convs] == [want, want]


@pytest.mark.parametrize("attrs, shape, why", [
    ({"strides": [2, 2]}, (32, 32, 3, 3), "stride 2"),
    ({"dilations": [2, 2]}, (32, 32, 3, 3), "dilated"),
    ({"group": 2}, (32, 16, 3, 3), "grouped"),
    ({}, (32, 32, 5, 5), "5x5"),
    ({}, (32, 8, 3, 3), "8 input channels"),
    ({}, (32, 17, 3, 3), "odd input channels"),
    ({}, (20, 32, 3, 3), "20 output channels"),
])
def test_winograd_only_where_it_applies(attrs, shape, why):
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "group": 1, **attrs}
    w = RNG.integers(-127, 128, shape).astype(np.int8)
    x = SimpleNamespace(dtype="uint8")
    assert not qwinograd.applicable(DotIsa("pmaddwd", 8), a, x, w), why
    if why == "stride 2":         # the same weights at stride 1 do qualify: the test isolates the attribute
        a["strides"] = [1, 1]
        assert qwinograd.applicable(DotIsa("pmaddwd", 8), a, x, w)
    assert not qwinograd.applicable(DotIsa("vnni", 16), {**a, "strides": [1, 1]}, x, w)


def test_winograd_overflow_guard_keeps_the_direct_kernel():
    """256 input channels of extreme weights: 9 · max Σ_c |U| · 1020 >= 2^31, so the partial sums of
    the output transform could leave int32: not applicable; with small weights it is. The guard's
    bound is attained (all-127 weights, 255 activations at the tile's corners)."""
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "group": 1}
    x = SimpleNamespace(dtype="uint8")
    isa = DotIsa("pmaddwd", 8)
    big = np.full((16, 256, 3, 3), 127, np.int8)
    assert 9 * int(np.abs(qwinograd.transformed_weights(big)).sum(axis=2).max()) * 1020 >= 2 ** 31
    assert not qwinograd.applicable(isa, a, x, big)
    assert qwinograd.applicable(isa, a, x, (big // 8).astype(np.int8))
    assert qwinograd.applicable(isa, a, x, big[:, :128])     # 128 channels: always in range


@pytest.mark.parametrize("isa", ["avx2", "pmaddwd512"])
@pytest.mark.parametrize("c, o, hw", [
    (64, 128, 8),       # svhnnet's fifth and sixth convs: K > tiles, the loop runs over channel blocks
    (16, 32, 16),       # K < tiles: over tile rows
])
def test_winograd_chain_blocked_bit_exact(strict, isa, c, o, hw):
    """Two chained Winograd convs: the first one's output is stored NCHW{b}c (an intermediate), so
    its schedule picks its parallel axis (``by_channel`` where the transformed weights outnumber the
    transformed input); the second reads the blocked layout."""
    spec = isa_spec(isa)
    g = Graph("q")
    x = g.add_input("x", TensorType((1, c, hw, hw), "uint8", ACT["uint8"]))
    y = add_qconv(g, x, o, (3, 3), p=(1, 1, 1, 1), act="Relu")
    g.outputs = [add_qconv(g, y, o, (3, 3), p=(1, 1, 1, 1), act="Relu")]
    mod = lower(g, spec)
    convs = [mod[gv].script() for gv in mod.functions if "qlinearconv" in gv.name_hint]
    assert len(convs) == 2 and all("wgemm" in t for t in convs)
    check_exact(g, {"x": qin(ACT["uint8"], (1, c, hw, hw))}, f"{isa} winograd chain {c}->{o}", spec)
