"""Mutation fuzzing of the ONNX importer: every input gives an IR or a clean ``UserError``.

A seed model is mutated either as bytes (flips, truncation, splices) or as a protobuf (op types,
attributes, inputs, shapes, dtypes, initializer dims, opsets, node order); the importer must then
either import it (and the IR must verify) or raise :class:`~qcompiler.errors.UserError`. Anything
else — another exception, a verifier failure after a successful import — is a crash.

    python -m qcompiler.frontend.fuzz --count 20000 --seed 1       # the long run (README figures)

The test suite runs a bounded, seeded run (tests/frontend/test_fuzz.py).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import UserError

OP_TYPES = ["Conv", "Relu", "Add", "Mul", "MaxPool", "Gemm", "Reshape", "Concat", "Softmax", "Clip",
            "BatchNormalization", "Transpose", "Flatten", "Identity", "TopK", "FooBar", "Resize", "Pad",
            "Slice", "Gather", "Shape", "ConstantOfShape", "Squeeze", "Unsqueeze", "GlobalAveragePool"]
DTYPES = [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT8, TensorProto.STRING,
          TensorProto.BOOL, TensorProto.DOUBLE, 0, 99]
INTS = [-(2 ** 40), -7, -1, 0, 1, 2, 3, 5, 1000, 2 ** 31]


@dataclass
class FuzzStats:
    total: int = 0
    imported: int = 0
    user_errors: int = 0
    crashes: list = field(default_factory=list)     # (mutation, exception text)
    by_mutation: dict = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        return (f"{self.total} mutated models in {self.seconds:.1f} s: {self.imported} imported, "
                f"{self.user_errors} clean errors, {len(self.crashes)} crashes")


# ---- byte-level mutations -----------------------------------------------------------------------
def _flip(rng, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 16)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def _truncate(rng, data: bytes) -> bytes:
    return data[:rng.randrange(len(data))]


def _splice(rng, data: bytes) -> bytes:
    i, j = sorted(rng.randrange(len(data)) for _ in range(2))
    k = rng.randrange(len(data))
    return data[:k] + data[i:j] + data[k:]


# ---- protobuf-level mutations --------------------------------------------------------------------
def _node(rng, m):
    return rng.choice(m.graph.node) if m.graph.node else None


def _op_type(rng, m):
    n = _node(rng, m)
    if n is not None:
        n.op_type = rng.choice(OP_TYPES)


def _attribute(rng, m):
    n = _node(rng, m)
    if n is None or not n.attribute:
        return
    a = rng.choice(n.attribute)
    if a.type == onnx.AttributeProto.INT:
        a.i = rng.choice(INTS)
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e30])
    elif a.type == onnx.AttributeProto.INTS:
        vals = list(a.ints)
        if vals and rng.random() < 0.5:
            vals[rng.randrange(len(vals))] = rng.choice(INTS)
        else:
            vals = vals[:rng.randrange(len(vals) + 1)] + [rng.choice(INTS)] * rng.randint(0, 2)
        del a.ints[:]
        a.ints.extend(vals)
    elif a.type == onnx.AttributeProto.STRING:
        a.s = rng.choice([b"", b"SAME_UPPER", b"VALID", b"bogus", b"\xff\xfe"])
    else:
        n.attribute.remove(a)


def _inputs(rng, m):
    n = _node(rng, m)
    if n is None:
        return
    choice = rng.random()
    if choice < 0.3 and n.input:
        del n.input[rng.randrange(len(n.input))]
    elif choice < 0.6:
        n.input.append(rng.choice(["ghost", "", n.output[0] if n.output else "x"]))
    elif n.input:
        names = [i.name for i in m.graph.input] + [t.name for t in m.graph.initializer] + \
                [o for k in m.graph.node for o in k.output]
        n.input[rng.randrange(len(n.input))] = rng.choice(names)


def _outputs(rng, m):
    choice = rng.random()
    if choice < 0.4 and m.graph.output:
        del m.graph.output[rng.randrange(len(m.graph.output))]
    elif choice < 0.7:
        m.graph.output.append(helper.make_tensor_value_info(rng.choice(["ghost", m.graph.output[0].name if m.graph.output else "y"]),
                                                            TensorProto.FLOAT, None))
    else:
        n = _node(rng, m)
        if n is not None and n.output:
            n.output[0] = rng.choice(["", "dup", m.graph.input[0].name if m.graph.input else "x"])


def _input_shape(rng, m):
    if not m.graph.input:
        return
    t = rng.choice(m.graph.input).type.tensor_type
    if rng.random() < 0.2:
        t.elem_type = rng.choice(DTYPES)
        return
    dims = t.shape.dim
    if not dims or rng.random() < 0.2:
        t.shape.dim.add().dim_value = rng.choice([0, 1, 3])
        return
    d = rng.choice(dims)
    r = rng.random()
    if r < 0.4:
        d.dim_value = rng.choice([0, 1, 2, 7, 10 ** 6])
    elif r < 0.7:
        d.dim_param = rng.choice(["N", "H", ""])
    else:
        t.shape.ClearField("dim")


def _initializer(rng, m):
    if not m.graph.initializer:
        return
    t = rng.choice(m.graph.initializer)
    r = rng.random()
    if r < 0.3 and t.dims:
        t.dims[rng.randrange(len(t.dims))] = rng.choice([0, 1, 2, 10 ** 9, -1])
    elif r < 0.5:
        t.data_type = rng.choice(DTYPES)
    elif r < 0.7:
        try:
            a = numpy_helper.to_array(t).copy()
        except Exception:           # an earlier mutation already broke this tensor
            return
        if a.dtype.kind == "f" and a.size:
            a.reshape(-1)[rng.randrange(a.size)] = rng.choice([np.nan, np.inf, 1e38])
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    elif r < 0.85:
        t.raw_data = t.raw_data[:rng.randrange(len(t.raw_data) + 1)]
    else:
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=rng.choice(["../x.bin", "/etc/passwd", "w.bin"]))


def _opset(rng, m):
    m.opset_import[0].version = rng.choice([1, 7, 9, 10, 11, 13, 17, 21, 22, 1000])


def _order(rng, m):
    nodes = list(m.graph.node)
    rng.shuffle(nodes)
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def _duplicate(rng, m):
    n = _node(rng, m)
    if n is not None:
        m.graph.node.append(onnx.NodeProto.FromString(n.SerializeToString()))


BYTE_MUTATIONS = {"flip": _flip, "truncate": _truncate, "splice": _splice}
PROTO_MUTATIONS = {"op_type": _op_type, "attribute": _attribute, "inputs": _inputs, "outputs": _outputs,
                   "input_shape": _input_shape, "initializer": _initializer, "opset": _opset,
                   "order": _order, "duplicate": _duplicate}


def mutate(rng: random.Random, seed_bytes: bytes) -> tuple[str, bytes]:
    """One mutated model: (description of the mutation, bytes)."""
    if rng.random() < 0.3:
        name = rng.choice(sorted(BYTE_MUTATIONS))
        return name, BYTE_MUTATIONS[name](rng, seed_bytes)
    m = onnx.ModelProto.FromString(seed_bytes)
    names = []
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(sorted(PROTO_MUTATIONS))
        PROTO_MUTATIONS[name](rng, m)
        names.append(name)
    return "+".join(names), m.SerializeToString()


def check_one(path: str, input_shapes=None) -> str:
    """'imported' or 'user-error'; raises on a crash."""
    from .onnx_import import import_onnx
    try:
        g = import_onnx(path, input_shapes)
    except UserError as e:
        if "\n" in str(e):
            raise AssertionError(f"multi-line UserError: {e!r}") from None
        return "user-error"
    g.verify()
    return "imported"


def fuzz(seeds: list[bytes], count: int, seed: int = 0, seconds: float | None = None,
         workdir: str | None = None, trace: str | None = None) -> FuzzStats:
    import warnings
    rng = random.Random(seed)
    stats = FuzzStats()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        path = os.path.join(d, "m.onnx")
        for i in range(count):
            if seconds is not None and time.perf_counter() - t0 > seconds:
                break
            what, data = mutate(rng, seeds[i % len(seeds)])
            with open(path, "wb") as f:
                f.write(data)
            if trace:                       # survives a kill: the model being imported now
                with open(trace, "wb") as f:
                    f.write(data)
            stats.total += 1
            stats.by_mutation[what.split("+")[0]] = stats.by_mutation.get(what.split("+")[0], 0) + 1
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = check_one(path)
            except Exception as e:  # a crash: record it with the mutated model for reproduction
                stats.crashes.append((what, f"{type(e).__name__}: {e}"[:300], data,
                                      traceback.format_exc(limit=-3)))
                continue
            if r == "imported":
                stats.imported += 1
            else:
                stats.user_errors += 1
    stats.seconds = time.perf_counter() - t0
    return stats


def default_seeds() -> list[bytes]:
    """The project's small real models (models/*.onnx beside the package, when present) and a
    synthetic conv net that uses attributes, padding and a shape sub-graph."""
    seeds = [synthetic_seed()]
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "models")
    for name in ("fashion_mobilenet.onnx", "uspsnet.onnx"):
        p = os.path.join(here, name)
        if os.path.exists(p):
            with open(p, "rb") as f:
                seeds.append(f.read())
    return seeds


def synthetic_seed() -> bytes:
    F = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([0, -1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Clip", ["c"], ["r"], name="clip", min=0.0, max=6.0),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Shape", ["p"], ["s"], name="shp"),
             helper.make_node("Reshape", ["p", "shape"], ["f"], name="flat"),
             helper.make_node("Softmax", ["f"], ["y"], name="sm", axis=1)]
    g = helper.make_graph(nodes, "seed", [helper.make_tensor_value_info("x", F, [1, 2, 8, 8])],
                          [helper.make_tensor_value_info("y", F, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    return m.SerializeToString()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Fuzz the ONNX importer with mutated models.")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=None, help="stop after this long")
    ap.add_argument("--trace", default=None, metavar="FILE", help="write each model here before importing it")
    ap.add_argument("--save-crashes", default=None, metavar="DIR", help="write crashing models here")
    a = ap.parse_args(argv)
    stats = fuzz(default_seeds(), a.count, a.seed, a.seconds, trace=a.trace)
    print(stats.summary())
    print("mutations:", ", ".join(f"{k} {v}" for k, v in sorted(stats.by_mutation.items())))
    for i, (what, msg, data, tb) in enumerate(stats.crashes[:20]):
        at = [l.strip() for l in tb.splitlines() if "qcompiler" in l][-1:] or ["?"]
        print(f"crash {i}: [{what}] {msg.splitlines()[0]}  at {at[0]}")
        if a.save_crashes:
            os.makedirs(a.save_crashes, exist_ok=True)
            with open(os.path.join(a.save_crashes, f"crash_{i}.onnx"), "wb") as f:
                f.write(data)
    return 1 if stats.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
