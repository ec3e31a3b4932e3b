"""The shape-generic sparse kernel (qcompiler/codegen/kernels/sparse_shared.py): pointwise int8 convs
(with and without a fused residual QLinearAdd) that ``encode-sparse`` encodes as CSR under the size
objective are computed by ONE PrimFunc per storage-dtype key (any layout), shared by all such layers, and
their outputs are bit-exact with the dense kernels and the integer reference interpreter.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_sparse_kernels import ARM_SPEC, arm_runner, prune, run

from qcompiler.codegen.lower import lower
from qcompiler.codegen.target import TargetSpec
from qcompiler.ir import Graph, QuantParams, TensorType
from qcompiler.quant import reference
from qcompiler.quant.requant import conv_multipliers, quantize_multipliers

SPEC = TargetSpec("x86")


def _conv(g, x, w, qo, name, rng, activation=""):
    qx = x.type.quant
    o = w.shape[0]
    ws = tuple(float(v) for v in rng.uniform(0.002, 0.01, o))
    wv = g.add_const(w, f"{name}_w", QuantParams("int8", ws, (0,) * o, axis=0))
    bq = g.add_const(rng.integers(-3000, 3000, o).astype(np.int32), f"{name}_b",
                     QuantParams("int32", tuple(float(np.float32(qx.scale[0]) * np.float32(v)) for v in ws), (0,) * o, axis=0))
    ms, ss = conv_multipliers(qx.scale[0], ws, qo.scale[0])
    attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1, "activation": activation,
             "activation_params": [], "multiplier": ms, "shift": ss}
    shape = (x.shape[0], o, *x.shape[2:])
    return g.create_op("QLinearConv", [x, wv, bq], attrs, result_types=[TensorType(shape, qo.storage, qo)],
                       name=name).result


def block_graph(shape, mid, storage, rng, sparsity=0.8):
    """x -> 1x1 expand (Relu) -> 1x1 project -> + x (QLinearAdd, the residual) -> 1x1 conv: a
    MobileNetV2 block's pointwise convs, all pruned."""
    lo, hi = (0, 256) if storage == "uint8" else (-128, 128)
    q = {"uint8": lambda s, z: QuantParams("uint8", (s,), (z,)), "int8": lambda s, z: QuantParams("int8", (s,), (z - 128,))}[storage]
    g = Graph("block")
    c = shape[1]
    x = g.add_input("x", TensorType(shape, storage, q(0.02, 117)))
    w1 = prune(rng.integers(-127, 128, (mid, c, 1, 1)).astype(np.int8), sparsity, "unstructured", rng)
    w2 = prune(rng.integers(-127, 128, (c, mid, 1, 1)).astype(np.int8), sparsity, "unstructured", rng)
    w3 = prune(rng.integers(-127, 128, (mid, c, 1, 1)).astype(np.int8), sparsity, "unstructured", rng)
    h = _conv(g, x, w1, q(0.05, 10), "expand", rng, activation="Relu")
    p = _conv(g, h, w2, q(0.04, 120), "project", rng)
    qo = q(0.05, 125)
    ms, s = quantize_multipliers([p.type.quant.scale[0] / qo.scale[0], x.type.quant.scale[0] / qo.scale[0]])
    add = g.create_op("QLinearAdd", [p, x], {"activation": "", "activation_params": [], "multiplier": ms,
                                             "shift": [s]}, result_types=[TensorType(shape, storage, qo)], name="add")
    y = _conv(g, add.result, w3, q(0.03, 100), "tail", rng)
    g.outputs = [y]
    g.meta["sparsity"] = {"layers": {n: {"encoding": {"format": "csr", "objective": "size"}}
                                     for n in ("expand", "project", "tail")}}
    return g, {"x": rng.integers(lo, hi, shape).astype(storage)}


def shared_functions(g) -> list[str]:
    mod = lower(g, SPEC)
    return sorted(gv.name_hint for gv in mod.get_global_vars() if "sparse_shared" in gv.name_hint)


@pytest.mark.parametrize("shape, mid, storage, sparsity", [
    ((1, 16, 7, 7), 48, "uint8", 0.8),        # blocked layouts, P = 49 (a tail tile)
    ((2, 24, 5, 3), 40, "int8", 0.8),          # batch 2, int8 activations, plain/blocked mix
    ((1, 8, 1, 1), 20, "uint8", 0.8),          # one pixel
    ((1, 296, 2, 3), 264, "uint8", 0.1),       # uint16 columns (K > 256), int32 row pointers (nnz > 65535)
])
def test_shared_kernel_bit_exact_and_shared(shape, mid, storage, sparsity):
    rng = np.random.default_rng(sum(shape) + mid)
    g, feeds = block_graph(shape, mid, storage, rng, sparsity)
    names = shared_functions(g)
    # three sparse layers; the project conv carries the residual add: at most one function per key
    assert 1 <= len(names) <= 3, names
    want = reference.run(g, feeds)[0]
    got = run(g, feeds)
    record = g.meta.pop("sparsity")
    dense = run(g, feeds)
    g.meta["sparsity"] = record
    assert np.array_equal(dense, want), "the dense kernels are not the reference"
    assert np.array_equal(got, dense), f"{int((got != dense).sum())} of {dense.size} differ"


def test_layers_of_one_key_share_one_function():
    """The same block twice in a row: six sparse layers, no more functions than for one block."""
    rng = np.random.default_rng(3)
    g1, _ = block_graph((1, 16, 6, 6), 32, "uint8", rng)
    one = len(shared_functions(g1))
    g, feeds = block_graph((1, 16, 6, 6), 32, "uint8", rng)
    # chain a second pointwise conv pair on the output: tail (32 ch) -> conv back to 16 -> conv to 32
    w = prune(rng.integers(-127, 128, (16, 32, 1, 1)).astype(np.int8), 0.8, "unstructured", rng)
    y = _conv(g, g.outputs[0], w, QuantParams("uint8", (0.04,), (110,)), "more", rng, activation="Relu")
    w2 = prune(rng.integers(-127, 128, (32, 16, 1, 1)).astype(np.int8), 0.8, "unstructured", rng)
    y = _conv(g, y, w2, QuantParams("uint8", (0.04,), (90,)), "more2", rng)
    g.outputs = [y]
    g.meta["sparsity"]["layers"].update({n: {"encoding": {"format": "csr", "objective": "size"}} for n in ("more", "more2")})
    assert len(shared_functions(g)) <= one + 1
    got = run(g, feeds)
    assert np.array_equal(got, reference.run(g, feeds)[0])


def test_time_objective_keeps_per_layer_kernels():
    rng = np.random.default_rng(4)
    g, _ = block_graph((1, 16, 7, 7), 48, "uint8", rng)
    for e in g.meta["sparsity"]["layers"].values():
        e["encoding"]["objective"] = "time"
    assert shared_functions(g) == []


@pytest.mark.qemu
def test_shared_kernel_on_arm_under_qemu(tmp_path):
    """The block cross-built for aarch64 (cortex-a76) and run under qemu-aarch64 with the TVM runtime
    only (examples/deploy_cpp): bit-exact with the x86 dense kernels."""
    from qcompiler.codegen.artifact import write_artifact
    run_arm = arm_runner(tmp_path)
    g, feeds = block_graph((1, 16, 7, 7), 48, "uint8", np.random.default_rng(7))
    record = g.meta.pop("sparsity")
    dense = run(g, feeds)
    g.meta["sparsity"] = record
    got = run_arm(write_artifact(g, ARM_SPEC, tmp_path / "OUT"), feeds["x"], dense)
    assert np.array_equal(got, dense), f"{int((got != dense).sum())} of {dense.size} differ"


def test_debug_functions_replay_the_shared_kernel():
    """--debug-layers: ``debug`` and ``debug_alone`` replay main's calls, the shared kernel's included
    (plain tensors pass through it as (N, C, H, W, 1) views): every stored value has its stored
    shape, ``debug_alone`` fed ``debug``'s values gives them back, and the last one is main's output."""
    import tvm

    from test_sparse_kernels import build_module
    g, feeds = block_graph((2, 24, 5, 3), 40, "int8", np.random.default_rng(11))
    spec = TargetSpec("x86", debug_layers=True)
    vm = tvm.runtime.vm.VirtualMachine(build_module(g, spec), tvm.cpu())
    x = tvm.runtime.tensor(feeds["x"])
    want = vm["main"](x).numpy()
    chained = [t.numpy() for t in vm["debug"](x)]
    info = g.meta["debug_outputs"]
    assert [list(v.shape) for v in chained] == [d["stored_shape"] for d in info]
    alone = [t.numpy() for t in vm["debug_alone"](x, *[tvm.runtime.tensor(v) for v in chained])]
    assert all(np.array_equal(a, c) for a, c in zip(alone, chained))
    assert np.array_equal(chained[-1].reshape(want.shape), want) and np.array_equal(want, reference.run(g, feeds)[0])
