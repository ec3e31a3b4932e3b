"""Blocked summation in the NCHWc conv schedule (qcompiler/codegen/x86/blocked_sum.py): a float conv
whose reduction is longer than BLOCK terms sums it in partial tiles of at most BLOCK terms, and is
closer to a float64 result than the same kernel summing in one chain; short and integer sums keep
one chain."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, s_tir

from qcompiler.codegen.lower import Lowering, build_module
from qcompiler.codegen.target import TargetSpec
from qcompiler.codegen.x86 import blocked_sum
from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.passes import run_passes


def conv_graph(tmp_path, c_in: int, c_out: int, hw: int, seed: int = 0):
    """One 1x1 Conv of ``c_in`` -> ``c_out`` channels on hw x hw, weights N(0, 1/c_in), imported."""
    w = (np.random.default_rng(seed).standard_normal((c_out, c_in, 1, 1)) / np.sqrt(c_in)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    g = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, hw, hw])],
                          [onnx.ValueInfoProto(name="y")], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / f"conv{c_in}x{c_out}.onnx"
    onnx.save(m, path)
    graph = import_onnx(str(path))
    run_passes(graph, "default")
    return graph, w[:, :, 0, 0]


def reduced_terms(graph) -> dict[str, int]:
    """{block: terms it reduces (its reduction iterators' extents multiplied)} of the conv kernel's
    update blocks, as scheduled for x86."""
    out = {}
    for f in Lowering(graph, TargetSpec("x86")).run().functions.values():
        if isinstance(f, tvm.tirx.PrimFunc):
            sch = s_tir.Schedule(f)
            for name in ("conv_update", "conv_rf_update"):
                try:
                    blk = sch.get(sch.get_sblock(name))
                except Exception:  # noqa: BLE001 - no such block in this kernel
                    continue
                out[name] = int(np.prod([int(iv.dom.extent) for iv in blk.iter_vars if int(iv.iter_type) == 2]))
    return out


@pytest.mark.parametrize("blocks, per_block, expected", [
    (72, 16, 12),      # 1152 channels of a 1x1 conv in 16-channel blocks: 6 partial sums of 192 terms
    (16, 16, 16),      # 256 terms: one chain
    (72, 144, 1),      # 3x3 over 16 channels = 144 terms: each channel block a partial sum
    (7, 48, 1),        # 336 terms, 7 blocks of 48 (prime): one block each
])
def test_block_channels(blocks, per_block, expected):
    assert blocked_sum.block_channels(blocks, per_block) == expected


def test_long_float_sum_is_split_into_partial_tiles(tmp_path):
    """1152 terms: partial sums of 192 (12 channel blocks of 16), 6 of them added per output; 192
    terms: one chain, as before."""
    long, _ = conv_graph(tmp_path, 1152, 192, 7)
    assert reduced_terms(long) == {"conv_rf_update": 192, "conv_update": 6}
    short, _ = conv_graph(tmp_path, 192, 1152, 7)
    assert reduced_terms(short) == {"conv_update": 192}


def run(graph, x):
    vm = relax.VirtualMachine(build_module(graph, TargetSpec("x86")), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_blocked_sum_is_closer_to_float64_than_one_chain(tmp_path, monkeypatch):
    """Post-activation inputs (non-negative, large) against zero-mean weights: the sums cancel, so
    a chain's rounding error is large next to the result. Blocks of <= 256 terms: (b + K/b) u
    against K u in the worst case (Higham 2002, §4.2); the measured RMS error halves or better."""
    graph, w = conv_graph(tmp_path, 1152, 64, 7)
    x = (np.abs(np.random.default_rng(1).standard_normal((1, 1152, 7, 7))) * 100).astype(np.float32)
    truth = np.einsum("nchw,oc->nohw", x.astype(np.float64), w.astype(np.float64))
    blocked = run(graph, x)
    monkeypatch.setattr(blocked_sum, "BLOCK", 1 << 30)
    chain = run(graph, x)
    rms = lambda y: float(np.sqrt(np.mean((y - truth) ** 2)))  # noqa: E731
    scale = float(np.abs(truth).max())
    assert rms(chain) / scale < 1e-5 and rms(blocked) / scale < 1e-5      # both correct float32 sums
    assert rms(blocked) <= 0.5 * rms(chain), (rms(blocked), rms(chain))
