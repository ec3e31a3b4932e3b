"""Constant folding during import: evaluate ONNX nodes whose inputs are all known.

With the input shapes fixed, the shape computations exporters emit (``Shape -> Gather -> Concat ->
Reshape``, ``ConstantOfShape``, ``Range``, ``Where`` ...) and weight preprocessing depend only on
constants, so the importer replaces them by their values. The common shape ops have exact numpy
implementations below (no session start-up cost); any other foldable node is evaluated by
onnxruntime, one session for the whole connected batch of foldable nodes that follows it.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UserError
from .onnx_load import node_label

# never folded: non-deterministic, control flow, or sequence-valued
NO_FOLD = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
    "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceAt",
    "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalGetElement", "OptionalHasElement",
})


def node_attrs(n: onnx.NodeProto) -> dict:
    """The node's attributes as Python values (strings decoded, tensors kept as TensorProto).

    Each attribute's type is checked against the operator's schema: a corrupt or hand-edited model
    gets a UserError naming the node, not a crash in a converter."""
    from ..errors import UserError
    try:
        declared = onnx.defs.get_schema(n.op_type, domain=n.domain or "").attributes
    except Exception:                       # unknown ops are reported elsewhere
        declared = {}
    expected = {k: v.type for k, v in declared.items()}
    required = [k for k, v in declared.items() if v.required]
    out = {}
    where = f"node {n.op_type} '{n.name}'"
    present = {a.name for a in n.attribute}
    for k in required:
        if k not in present:
            raise UserError(f"required attribute '{k}' is missing", where, "the model is malformed; re-export it")
    for a in n.attribute:
        if a.name in expected and a.type != expected[a.name]:
            raise UserError(f"attribute '{a.name}' has type {onnx.AttributeProto.AttributeType.Name(a.type) if a.type in onnx.AttributeProto.AttributeType.values() else a.type}, "
                            f"the operator expects {onnx.AttributeProto.AttributeType.Name(expected[a.name])}",
                            where, "the model is malformed; re-export it")
        try:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [x.decode() for x in v]
        except (ValueError, UnicodeDecodeError) as e:
            raise UserError(f"attribute '{a.name}' cannot be read ({e})", where, "the model is malformed; re-export it") from None
        if v is None:
            raise UserError(f"attribute '{a.name}' has no value", where, "the model is malformed; re-export it")
        out[a.name] = v
    return out


def constant_value(n: onnx.NodeProto) -> np.ndarray:
    """The value of a Constant node."""
    a = node_attrs(n)
    if "value" in a:
        return numpy_helper.to_array(a["value"])
    if "value_float" in a:
        return np.array(a["value_float"], np.float32)
    if "value_floats" in a:
        return np.array(a["value_floats"], np.float32)
    if "value_int" in a:
        return np.array(a["value_int"], np.int64)
    if "value_ints" in a:
        return np.array(a["value_ints"], np.int64)
    raise UserError("Constant with a sparse or string value is not supported", f"node {node_label(n)}",
                    "export the constant as a dense numeric tensor")


# ---- shape helpers shared with the op converters ----------------------------------------------
def resolve_reshape(in_shape: Sequence[int], shape: Sequence[int], allowzero: int = 0) -> tuple[int, ...]:
    """ONNX Reshape's target: 0 copies the input dim (unless allowzero), -1 is inferred."""
    out = [int(d) for d in shape]
    if not allowzero:
        out = [in_shape[i] if d == 0 and i < len(in_shape) else d for i, d in enumerate(out)]
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise ValueError(f"bad Reshape target {list(shape)}")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        total = int(np.prod(in_shape))
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape {tuple(in_shape)} to {list(shape)}")
        out[out.index(-1)] = total // known
    if int(np.prod(out)) != int(np.prod(in_shape)):
        raise ValueError(f"cannot reshape {tuple(in_shape)} to {list(shape)}")
    return tuple(out)


def onnx_slice(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice bounds on one axis as a Python slice with the same elements. (ONNX clamps a
    negative-step start below -dim to 0, where Python would give an empty slice.)"""
    start, end = int(start), int(end)
    start += dim if start < 0 else 0
    end += dim if end < 0 else 0
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step) if dim else slice(0, 0, 1)


def axes_arg(n: onnx.NodeProto, ins: list, a: dict, index: int = 1) -> list[int] | None:
    """Axes given as an attribute (older opsets) or as the input at ``index`` (newer ones)."""
    if "axes" in a:
        return list(a["axes"])
    if len(ins) > index and ins[index] is not None:
        return [int(v) for v in np.asarray(ins[index]).reshape(-1)]
    return None


# ---- numpy evaluators -------------------------------------------------------------------------
# fn(node, inputs (None for an omitted optional), attrs) -> outputs, or None to leave it to onnxruntime
NumpyFn = Callable[[onnx.NodeProto, list, dict], "list[np.ndarray] | None"]
NUMPY: dict[str, NumpyFn] = {}


def _np(*kinds):
    def deco(fn):
        for k in kinds:
            NUMPY[k] = fn
        return fn
    return deco


@_np("Identity")
def _identity(n, x, a):
    return [x[0]]


@_np("Cast")
def _cast(n, x, a):
    dt = helper.tensor_dtype_to_np_dtype(a["to"])
    if dt.kind not in "biuf" or x[0].dtype.kind not in "biuf":
        return None
    return [x[0].astype(dt)]


@_np("Shape")
def _shape(n, x, a):
    s = np.array(x[0].shape, np.int64)
    return [s[a.get("start", 0):a["end"]] if "end" in a else s[a.get("start", 0):]]


@_np("Size")
def _size(n, x, a):
    return [np.array(x[0].size, np.int64)]


@_np("Gather")
def _gather(n, x, a):
    return [np.take(x[0], x[1].astype(np.int64), axis=a.get("axis", 0))]


@_np("Slice")
def _slice(n, x, a):
    data, starts, ends = x[0], x[1].reshape(-1), x[2].reshape(-1)
    axes = x[3].reshape(-1) if len(x) > 3 and x[3] is not None else range(len(starts))
    steps = x[4].reshape(-1) if len(x) > 4 and x[4] is not None else [1] * len(starts)
    idx = [slice(None)] * data.ndim
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = int(ax) % data.ndim
        idx[ax] = onnx_slice(st, en, int(sp), data.shape[ax])
    return [data[tuple(idx)]]


@_np("Concat")
def _concat(n, x, a):
    return [np.concatenate([v for v in x if v is not None], axis=a["axis"])]


@_np("Unsqueeze")
def _unsqueeze(n, x, a):
    axes = axes_arg(n, x, a)
    r = x[0].ndim + len(axes)
    return [np.expand_dims(x[0], tuple(sorted(ax % r for ax in axes)))]


@_np("Squeeze")
def _squeeze(n, x, a):
    axes = axes_arg(n, x, a)
    return [np.squeeze(x[0], axis=None if axes is None else tuple(axes))]


@_np("Reshape")
def _reshape(n, x, a):
    return [x[0].reshape(resolve_reshape(x[0].shape, x[1].reshape(-1), a.get("allowzero", 0)))]


@_np("Flatten")
def _flatten(n, x, a):
    ax = a.get("axis", 1) % (x[0].ndim + 1) if x[0].ndim else 0
    return [x[0].reshape(int(np.prod(x[0].shape[:ax])), -1)]


def _arith(fn):
    def run(n, x, a):
        if x[0].dtype != x[1].dtype:
            return None
        return [np.asarray(fn(x[0], x[1])).astype(x[0].dtype)]
    return run


def _div(p, q):
    if p.dtype.kind == "f":
        return p / q
    quo = p // q                                   # ONNX integer Div truncates toward zero
    return quo + ((quo < 0) & (quo * q != p))


_np("Add")(_arith(np.add))
_np("Sub")(_arith(np.subtract))
_np("Mul")(_arith(np.multiply))
_np("Div")(_arith(_div))
for _k, _f in (("Equal", np.equal), ("Less", np.less), ("Greater", np.greater), ("LessOrEqual", np.less_equal),
               ("GreaterOrEqual", np.greater_equal), ("And", np.logical_and), ("Or", np.logical_or),
               ("Xor", np.logical_xor)):
    _np(_k)(lambda n, x, a, f=_f: [np.asarray(f(x[0], x[1]))])
for _k, _f in (("Neg", np.negative), ("Abs", np.abs), ("Floor", np.floor), ("Ceil", np.ceil),
               ("Not", np.logical_not), ("Sqrt", np.sqrt), ("Reciprocal", np.reciprocal)):
    _np(_k)(lambda n, x, a, f=_f: [np.asarray(f(x[0])).astype(x[0].dtype)])


@_np("Max", "Min")
def _minmax(n, x, a):
    f = np.maximum if n.op_type == "Max" else np.minimum
    out = x[0]
    for v in x[1:]:
        if v.dtype != out.dtype:
            return None
        out = f(out, v)
    return [np.asarray(out)]


@_np("Where")
def _where(n, x, a):
    return [np.where(x[0], x[1], x[2])]


@_np("ConstantOfShape")
def _constant_of_shape(n, x, a):
    v = numpy_helper.to_array(a["value"]).reshape(-1) if "value" in a else np.zeros(1, np.float32)
    return [np.full(tuple(int(d) for d in x[0].reshape(-1)), v[0], v.dtype)]


@_np("Range")
def _range(n, x, a):
    start, limit, delta = (v.reshape(()) for v in x[:3])
    count = max(int(np.ceil((limit - start) / delta)), 0)
    return [(start + np.arange(count) * delta).astype(start.dtype)]


@_np("Expand")
def _expand(n, x, a):
    shape = np.broadcast_shapes(x[0].shape, tuple(int(d) for d in x[1].reshape(-1)))
    return [np.broadcast_to(x[0], shape).copy()]


@_np("Transpose")
def _transpose(n, x, a):
    return [np.transpose(x[0], a.get("perm"))]


@_np("Tile")
def _tile(n, x, a):
    return [np.tile(x[0], tuple(int(r) for r in x[1].reshape(-1)))]


@_np("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin")
def _reduce_int(n, x, a):
    if x[0].dtype.kind not in "iu":          # float reductions: leave the summation order to onnxruntime
        return None
    axes = axes_arg(n, x, a)
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            return [x[0]]
        axes = list(range(x[0].ndim))
    f = {"ReduceProd": np.prod, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[n.op_type]
    return [np.asarray(f(x[0], axis=tuple(axes), keepdims=bool(a.get("keepdims", 1)))).astype(x[0].dtype)]


def eval_numpy(n: onnx.NodeProto, inputs: list) -> "list[np.ndarray] | None":
    fn = NUMPY.get(n.op_type)
    if fn is None:
        return None
    try:
        out = fn(n, inputs, node_attrs(n))
    except Exception:        # let onnxruntime have the last word (and word the error)
        return None
    return None if out is None else [np.asarray(o) for o in out]


# ---- onnxruntime batches ----------------------------------------------------------------------
def eval_ort(nodes: list[onnx.NodeProto], consts: dict[str, np.ndarray], opset: int, where: str
             ) -> dict[str, np.ndarray]:
    """Evaluate ``nodes`` (topologically ordered, inputs constant or produced in the batch) in one
    onnxruntime session; returns every output by name."""
    import onnxruntime as ort
    produced = {o for n in nodes for o in n.output if o}
    needed = sorted({i for n in nodes for i in n.input if i and i not in produced})
    inits = [numpy_helper.from_array(consts[k], k) for k in needed]
    outs = [o for n in nodes for o in n.output if o]
    graph = helper.make_graph(list(nodes), "fold", [], [onnx.ValueInfoProto(name=o) for o in outs], inits)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, 1) for d in sorted({n.domain for n in nodes} - {"", "ai.onnx"})]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = helper.find_min_ir_version_for(opsets[:1])
    if any(t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) for t in inits):
        model.ir_version = max(model.ir_version, 10)         # a 4-bit table folded (GatherBlockQuantized)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        types = {v.name: v for v in inferred.graph.value_info}
        types.update({v.name: v for v in inferred.graph.output})
        del model.graph.output[:]
        model.graph.output.extend(types[o] if o in types and types[o].type.HasField("tensor_type")
                                  else onnx.ValueInfoProto(name=o) for o in outs)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 4       # fatal only: errors become our own messages
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        values = sess.run(outs, {})
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot evaluate constant nodes: {first}", f"{where}: node {node_label(nodes[0])}",
                        "the model is malformed; re-export it") from None
    return dict(zip(outs, values))
