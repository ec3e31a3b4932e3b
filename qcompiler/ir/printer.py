"""Deterministic textual form of a graph: one op per line with its types and quant params.

    graph @mnist(%input: tensor<1x1x28x28xf32>) {
      %b = const dense<[0.5, -1]> : tensor<2xf32>
      %w = const blob<w> : tensor<2x1x3x3xf32>
      %y = Conv(%input, %w, %b) {dilations = [1, 1], group = 1, pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<1x2x28x28xf32> loc("conv1")
      %z = Relu(%y) : tensor<1x2x28x28xf32> loc("relu1")
      return %z
    }
    blobs {
      w = "base64 of the little-endian bytes"
    }

Constants with at most ``INLINE_MAX`` elements are printed inline; larger ones go to the ``blobs``
section (or are elided with ``elide=True``, which prints ``blob<w>`` without a blobs section: for
reading, not for parsing). Attributes print sorted by name. The parser in :mod:`.parser` reads this
form back; print -> parse -> print is a fixed point.
"""
from __future__ import annotations

import base64
import json
import math
import re

import numpy as np

from .graph import Graph, Op, Value
from .types import TensorType

INLINE_MAX = 16
_BARE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.$]*$")


def name_ref(name: str) -> str:
    return name if _BARE.match(name) else json.dumps(name)


def fmt_scalar(x, dtype: str | None = None) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "1" if x else "0"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if dtype in ("float32", "float16", "bfloat16"):
        import ml_dtypes  # noqa: F401  (bfloat16 numpy type)
        from .types import np_dtype
        y = np_dtype(dtype).type(x)
        s = np.format_float_positional(y, unique=True, trim="0") if 1e-4 <= abs(x) < 1e7 or x == 0 \
            else np.format_float_scientific(y, unique=True, trim="0")
        if dtype == "bfloat16":            # numpy's shortest repr is float32's: keep full precision
            s = repr(float(y))
    else:
        s = repr(x)
    if not any(c in s for c in ".en"):
        s += ".0"
    return s


def fmt_dense(a: np.ndarray) -> str:
    dt = a.dtype.name
    flat = a.reshape(-1)
    if flat.size == 1 and a.ndim == 0:
        return f"dense<{fmt_scalar(flat[0].item() if dt != 'bfloat16' else float(flat[0]), dt)}>"
    return "dense<[" + ", ".join(fmt_scalar(v.item() if dt != "bfloat16" else float(v), dt) for v in flat) + "]>"


def fmt_attr(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, np.ndarray):
        return f"{fmt_dense(v)} : {TensorType.of(v)}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt_attr(x) for x in v) + "]"
    return fmt_scalar(v)


def fmt_op(op: Op, locs: bool = True) -> str:
    res = ", ".join("%" + name_ref(r.name) for r in op.results)
    args = ", ".join("%" + name_ref(v.name) for v in op.operands)
    attrs = ""
    if op.attrs:
        attrs = " {" + ", ".join(f"{k} = {fmt_attr(op.attrs[k])}" for k in sorted(op.attrs)) + "}"
    types = ", ".join(str(r.type) for r in op.results)
    loc = f" loc({json.dumps(op.name)})" if locs and op.name else ""
    kind = op.kind if _BARE.match(op.kind) else json.dumps(op.kind)
    return f"{res} = {kind}({args}){attrs} : {types}{loc}"


def print_graph(g: Graph, *, locs: bool = True, elide: bool = False) -> str:
    args = ", ".join(f"%{name_ref(v.name)}: {v.type}" for v in g.inputs)
    lines = [f"graph @{name_ref(g.name)}({args}) {{"]
    blobs = []
    for v in g.consts.values():
        if v.data.size <= INLINE_MAX:
            body = fmt_dense(v.data)
        else:
            body = f"blob<{name_ref(v.name)}>"
            blobs.append(v)
        lines.append(f"  %{name_ref(v.name)} = const {body} : {v.type}")
    for op in g.ops:
        lines.append("  " + fmt_op(op, locs))
    lines.append("  return " + ", ".join("%" + name_ref(v.name) for v in g.outputs))
    lines.append("}")
    if blobs and not elide:
        lines.append("blobs {")
        for v in blobs:
            b64 = base64.b64encode(np.ascontiguousarray(v.data).astype(v.data.dtype.newbyteorder("<")).tobytes()).decode()
            lines.append(f"  {name_ref(v.name)} = \"{b64}\"")
        lines.append("}")
    return "\n".join(lines) + "\n"


_SCALARS = (int, float, str, bool, type(None))


def _copy_attr(a):
    """A copy of an attribute value as deep as ``copy.deepcopy`` makes it (lists, dicts and arrays
    copied, scalars shared), without its memo: attributes are trees (per-channel multiplier lists
    of hundreds of ints), and deepcopy took most of a clone's time."""
    if isinstance(a, _SCALARS):
        return a
    if isinstance(a, list):
        return [x if isinstance(x, _SCALARS) else _copy_attr(x) for x in a]
    if isinstance(a, tuple):
        return a if all(isinstance(x, _SCALARS) for x in a) else tuple(_copy_attr(x) for x in a)
    if isinstance(a, dict):
        return {k: _copy_attr(x) for k, x in a.items()}
    import copy
    return copy.deepcopy(a)


def clone_graph(g: Graph) -> Graph:
    """Copy the structure of ``g`` (constant arrays shared, attributes copied)."""
    import copy
    out = Graph(g.name)
    out.meta = copy.deepcopy(g.meta)
    m: dict[int, Value] = {}
    for v in g.inputs:
        m[id(v)] = out.add_input(v.name, v.type)
    for v in g.consts.values():
        c = Value(v.name, v.type, data=v.data)
        out._register(c)
        out.consts[c.name] = c
        m[id(v)] = c
    for op in g.ops:
        new = out.create_op(op.kind, [m[id(v)] for v in op.operands], {k: _copy_attr(a) for k, a in op.attrs.items()},
                            result_types=[r.type for r in op.results], name=op.name,
                            result_names=[r.name for r in op.results])
        for r, nr in zip(op.results, new.results):
            m[id(r)] = nr
    out.outputs = [m[id(v)] for v in g.outputs]
    return out
