"""ONNX -> IR importer.

    g = import_onnx("model.onnx", input_shapes={"x": (1, 3, 48, 192)})

Steps: load and validate the file (:mod:`.onnx_load`); drop nodes no output depends on; fix every
input shape (a dynamic batch defaults to 1 with a warning, other dynamic dims need
``input_shapes``); run ONNX's strict shape inference; walk the nodes in topological order, folding
every node whose inputs are constant (:mod:`.onnx_fold`: Constant, the Shape sub-graphs exporters
emit, ConstantOfShape weights, ...) and converting the rest with the table in :mod:`.onnx_registry`.
Result types come from the IR's own type inference and are cross-checked against ONNX's: a
disagreement is an importer bug and raises :class:`ImportMismatch`. Value names are the ONNX
tensor names and op names the ONNX node names (a node without a name takes its first output's
name). Problems with the model raise :class:`~qcompiler.errors.UserError` naming the node, tensor
or input.
"""
from __future__ import annotations

import os
import warnings
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UserError
from ..ir import Graph, Value
from ..ir.ops import InferError


def dtype_name(code: int) -> str:
    """ONNX's name for an element type code, also for codes it does not define."""
    try:
        return onnx.TensorProto.DataType.Name(code)
    except ValueError:
        return f"code {code} (not an ONNX type)"
from ..ir.types import DTYPES, TensorType
from .onnx_fold import NO_FOLD, constant_value, eval_numpy, eval_ort, node_attrs
from .onnx_load import check_graph, default_opset, live_nodes, load_model, node_inputs, node_label
from . import onnx_control, onnx_nbits, onnx_ops, onnx_qdq, onnx_qlinear, onnx_rnn, onnx_shape_ops  # noqa: F401  (register their converters)
from .onnx_control import bind_inputs
from .onnx_registry import CONVERTERS

KEEP_QUANT = frozenset({"QuantizeLinear", "DequantizeLinear"})
"""Not folded at import even on constants: a QDQ model's int8 weights and int32 biases stay quantized
constants behind a DequantizeLinear, their scales visible in the IR (see :mod:`.onnx_qdq`)."""


class ImportMismatch(UserError):
    """The IR's type inference and ONNX's disagree on a value: a malformed model, or a bug in the
    importer. Reported like bad input (one line, exit 2), asking for a report if ORT runs the model."""

    def __init__(self, what: str):
        super().__init__(what, "ONNX shape inference cross-check",
                         "the model may be malformed; if ONNX Runtime runs it, please report this qcompiler bug")


def supported_ops() -> list[str]:
    """ONNX operators the importer converts (besides anything that folds to a constant)."""
    return sorted(set(CONVERTERS) | {"Constant", "Shape", "Size"})


def import_onnx(src: "str | os.PathLike | onnx.ModelProto",
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                input_values: Mapping[str, "np.ndarray | int | float | Sequence"] | None = None) -> Graph:
    """Import an ONNX model (a path or a ModelProto) into a verified IR graph with static shapes.

    ``input_values`` binds inputs to constants (cast to their declared type): they fold into the
    graph and are no longer inputs, e.g. ``{"sr": 16000}`` for a model that branches on it."""
    model, where = load_model(src)
    model = bind_inputs(model, input_values, input_shapes, where)
    nodes = _live(check_graph(model, where), [o.name for o in model.graph.output])
    inits = {t.name for t in model.graph.initializer}
    inputs = _input_types(model, inits, input_shapes, where)
    onnx_types = _onnx_shape_inference(model, nodes, inputs, where)
    b = _Builder(model, nodes, where, onnx_types)
    for name, t in inputs:
        b.values[name] = b.g.add_input(name, t)
    for t in model.graph.initializer:
        b.consts[t.name] = _initializer_array(t, where)
    b.run(nodes)
    b.g.outputs = [b.val(o.name) for o in model.graph.output]
    b.g.meta["opset"] = b.opset
    b.g.meta["producer"] = model.producer_name
    b.g.meta["producer_version"] = model.producer_version
    if any(onnx_qdq.quantizes(n) for n in nodes):
        b.g.meta["prequantized"] = True          # the quantize pass refuses it (see onnx_qdq)
    b.g.verify()
    _check_sizes(b.g, where)
    return b.g


MAX_ELEMENTS = 2 ** 31 - 1
"""The most elements a tensor may have: the kernels index tensors with int32 (TVM's default index
type), and a larger one failed deep in TVM ("Literal value 40000000000 exceeds range of int32")."""


def _check_sizes(g: Graph, where: str) -> None:
    """One UserError line for the first tensor of ``g`` past :data:`MAX_ELEMENTS` (an
    ``--input-shape`` too large for the model, or a model whose own static shapes are)."""
    for v in g.values():
        n = int(np.prod(v.type.shape, dtype=object))
        if n > MAX_ELEMENTS:
            made = (f"made by {v.producer.kind} '{v.producer.name}'" if v.producer is not None
                    else "a model input" if v in g.inputs else "a constant")
            raise UserError(f"tensor '{v.name}' ({made}) would have shape {_fmt_shape(v.type.shape)}: {n:,} elements, "
                            f"more than the {MAX_ELEMENTS:,} a kernel can index", where,
                            "give smaller --input-shape dimensions")


def _live(nodes: list[onnx.NodeProto], outputs: list[str]) -> list[onnx.NodeProto]:
    """The nodes the graph outputs depend on (dead nodes are dropped before conversion)."""
    return live_nodes(nodes, outputs)


# ---- inputs -----------------------------------------------------------------------------------
def _np_dtype_name(elem_type: int) -> str | None:
    try:
        name = helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, ValueError, TypeError):
        return None
    return name if name in DTYPES else None


def _fmt_shape(dims) -> str:
    return "x".join(str(d) for d in dims)


def _input_types(model, inits, input_shapes, where) -> list[tuple[str, TensorType]]:
    real = [v for v in model.graph.input if v.name not in inits]
    names = [v.name for v in real]
    given = dict(input_shapes or {})
    for k in given:
        if k not in names:
            raise UserError(f"--input-shape names '{k}', which is not an input of the model", where,
                            f"the model's inputs are: {', '.join(names) or '(none)'}")
    out = []
    for v in real:
        w = f"{where}: input '{v.name}'"
        if not v.type.HasField("tensor_type"):
            raise UserError("is not a tensor", w, "qcompiler imports models with tensor inputs only")
        tt = v.type.tensor_type
        dtype = _np_dtype_name(tt.elem_type)
        if dtype is None:
            raise UserError(f"has unsupported element type {dtype_name(tt.elem_type)}", w,
                            "use a numeric input type")
        declared = None
        if tt.HasField("shape"):
            declared = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tt.shape.dim]
        if v.name in given:
            shape = given[v.name]
            shape = tuple(shape) if isinstance(shape, (tuple, list, np.ndarray)) else (shape,)
            if not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape):
                raise UserError(f"bad --input-shape {_fmt_shape(shape)}: dims must be positive integers", w,
                                "e.g. --input-shape x=1x3x224x224")
            if declared is not None:
                if len(shape) != len(declared):
                    raise UserError(f"--input-shape {_fmt_shape(shape)} has rank {len(shape)}, the input has rank "
                                    f"{len(declared)}", w, f"give {len(declared)} dims")
                for i, (g, d) in enumerate(zip(shape, declared)):
                    if d is not None and d != g:
                        raise UserError(f"--input-shape {_fmt_shape(shape)} sets dim {i} to {g}, the model fixes it at {d}",
                                        w, f"use {d} for dim {i}")
        else:
            if declared is None:
                raise UserError("has no shape in the model", w,
                                f"pass --input-shape {v.name}=<dims>, e.g. {v.name}=1x3x224x224")
            dynamic = [i for i, d in enumerate(declared) if d is None]
            if dynamic and dynamic != [0]:
                example = _fmt_shape([d if d is not None else (1 if i == 0 else f"<d{i}>")
                                      for i, d in enumerate(declared)])
                raise UserError(f"has dynamic dims {[i for i in dynamic]} and no --input-shape", w,
                                f"pass --input-shape {v.name}={example} with the sizes you will run")
            if dynamic:
                warnings.warn(f"input '{v.name}' has a dynamic batch dimension; using 1 "
                              f"(pass --input-shape {v.name}={_fmt_shape([1] + declared[1:])} to choose)",
                              stacklevel=3)
            shape = [1 if d is None else d for d in declared]
        if any(d == 0 for d in shape):
            raise UserError(f"has a zero-size dimension ({_fmt_shape(shape)})", w, "give every dim a size >= 1")
        out.append((v.name, TensorType(tuple(int(d) for d in shape), dtype)))
    return out


def _initializer_array(t: onnx.TensorProto, where: str) -> np.ndarray:
    try:
        return numpy_helper.to_array(t)
    except Exception as e:
        raise UserError(f"cannot read initializer data: {e}", f"{where}: initializer '{t.name}'",
                        "the file is corrupt or truncated; re-export it") from None


# ---- ONNX shape inference (cross-check) -------------------------------------------------------
def _onnx_shape_inference(model, nodes, inputs, where) -> dict[str, tuple[str, tuple | None]]:
    """Strict ONNX shape inference with the input shapes substituted, on the topologically sorted
    nodes: name -> (dtype, static shape or None where ONNX could not tell)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    m.ir_version = max(m.ir_version, 4)   # initializers need not be listed as inputs
    del m.graph.value_info[:]
    shapes = dict(inputs)
    for v in m.graph.input:
        if v.name in shapes:
            tt = v.type.tensor_type
            tt.ClearField("shape")
            for d in shapes[v.name].shape:
                tt.shape.dim.add().dim_value = d
    for o in m.graph.output:
        if o.type.HasField("tensor_type"):
            o.type.tensor_type.ClearField("shape")
    try:
        m = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in nodes for a in n.attribute) \
                or any(n.domain not in ("", "ai.onnx") for n in nodes):
            # (com.microsoft QOperator ops: ONNX has no schema to infer their outputs from)
            # ONNX's strict inference rejects If branches of different ranks (silero_vad's squeeze-or-not),
            # which the importer resolves by inlining the taken branch: cross-check what it can tell
            return _lenient_shape_inference(m)
        msg = " ".join(str(e).split())
        raise UserError(f"ONNX shape inference failed: {msg}", where,
                        "check --input-shape against the sizes the model accepts") from None
    return _inferred_types(m)


def _lenient_shape_inference(m: onnx.ModelProto) -> dict[str, tuple[str, tuple | None]]:
    """Non-strict inference (nothing where even that fails): the types of a model with subgraphs."""
    try:
        return _inferred_types(onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False))
    except Exception:
        return {}


def _inferred_types(m: onnx.ModelProto) -> dict[str, tuple[str, tuple | None]]:
    out = {}
    for v in list(m.graph.value_info) + list(m.graph.output):
        if not v.type.HasField("tensor_type"):
            continue
        tt = v.type.tensor_type
        shape = None
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shape = tuple(d.dim_value for d in tt.shape.dim)
        out[v.name] = (_np_dtype_name(tt.elem_type), shape)
    return out


# ---- the builder ------------------------------------------------------------------------------
class _ShapeOnly:
    """Stands in for a tensor when folding Shape/Size of a non-constant value."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.ndim = len(self.shape)


class _Builder:
    def __init__(self, model: onnx.ModelProto, nodes, where: str, onnx_types):
        self.g = Graph(model.graph.name or "main")
        self.where = where
        self.opset = default_opset(model)
        self.onnx_types = onnx_types
        self.inits = {t.name for t in model.graph.initializer}
        self.consts: dict[str, np.ndarray] = {}     # ONNX name -> constant value (not yet an IR value)
        self.values: dict[str, Value] = {}          # ONNX name -> IR value
        self.names = {t.name for t in model.graph.initializer} | {v.name for v in model.graph.input}
        self.names |= {o for n in model.graph.node for o in n.output}
        self.uses = {x for n in nodes for x in node_inputs(n)} | {o.name for o in model.graph.output}
        self._fresh = 0

    # -- the walk -------------------------------------------------------------------------------
    def run(self, nodes: list[onnx.NodeProto]) -> None:
        done: set[int] = set()
        for i, n in enumerate(nodes):
            if i in done:
                continue
            if n.op_type == "Constant":
                self.consts[n.output[0]] = constant_value(n)
            elif n.op_type in ("Shape", "Size") and n.input[0] in self.values:
                self._store(n, eval_numpy(n, [_ShapeOnly(self.values[n.input[0]].shape)]))
            elif self._foldable(n, self.consts):
                out = eval_numpy(n, [self.consts[x] if x else None for x in n.input])
                if out is None:
                    done |= self._fold_batch(nodes, i)
                else:
                    self._store(n, out)
            else:
                self._convert(n)

    def _foldable(self, n, known) -> bool:
        return n.op_type not in NO_FOLD and n.op_type not in KEEP_QUANT and all(not x or x in known for x in n.input)

    def _store(self, n, outs) -> None:
        for o, v in zip(n.output, outs):
            if o:
                self.consts[o] = v

    def _fold_batch(self, nodes, start: int) -> set[int]:
        """Fold ``nodes[start]`` and every later node that only needs constants or its results,
        in one onnxruntime session."""
        pending = dict.fromkeys(self.consts)
        batch, idx = [], set()
        for j in range(start, len(nodes)):
            n = nodes[j]
            if n.op_type != "Constant" and self._foldable(n, pending):
                batch.append(n)
                idx.add(j)
                pending.update(dict.fromkeys(o for o in n.output if o))
        self.consts.update(eval_ort(batch, self.consts, self.opset, self.where))
        return idx

    def _convert(self, n) -> None:
        fn = CONVERTERS.get(n.op_type)
        if fn is None:
            raise UserError(f"unsupported operator '{n.op_type}'", f"{self.where}: node {node_label(n)}",
                            "qcompiler.frontend.supported_ops() lists what imports; replace the operator "
                            "or simplify the model before import")
        fn(self, n, node_attrs(n))

    # -- the API the converters use ---------------------------------------------------------------
    def node_name(self, n) -> str:
        return n.name or n.output[0]

    def fail(self, n, what: str, fix: str) -> UserError:
        return UserError(what, f"{self.where}: node {node_label(n)}", fix)

    def used(self, name: str) -> bool:
        return name in self.uses

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name)

    def is_empty(self, name: str) -> bool:
        v = self.consts.get(name)
        return v is not None and v.size == 0

    def need_const(self, n, i: int, what: str) -> np.ndarray:
        v = self.consts.get(n.input[i]) if len(n.input) > i else None
        if v is None:
            raise self.fail(n, f"{what} ('{n.input[i] if len(n.input) > i else ''}') is not a constant",
                            "qcompiler needs it constant: fix the input sizes with --input-shape so it folds")
        return v

    def set_const(self, name: str, value: np.ndarray) -> None:
        self.consts[name] = value

    def onnx_shape(self, name: str) -> tuple | None:
        return self.onnx_types.get(name, (None, None))[1]

    def val(self, name: str) -> Value:
        v = self.values.get(name)
        if v is not None:
            return v
        data = self.consts.get(name)
        if data is None:
            raise ImportMismatch(f"tensor '{name}' has no IR value")
        what = f"initializer '{name}'" if name in self.inits else f"constant '{name}'"
        if data.dtype.name not in DTYPES:
            raise UserError(f"has unsupported element type {data.dtype.name}", f"{self.where}: {what}",
                            "use numeric tensors")
        if data.size == 0:
            raise UserError(f"is an empty tensor (shape {list(data.shape)}) used as an operand",
                            f"{self.where}: {what}", "the model is malformed; re-export it")
        if data.dtype.kind == "f" and not np.isfinite(data).all():
            bad = int((~np.isfinite(data)).sum())
            raise UserError(f"holds {bad} NaN/Inf value{'s' if bad > 1 else ''}", f"{self.where}: {what}",
                            "the weights are corrupt: re-export or retrain the model")
        v = self.values[name] = self.g.add_const(data, name)
        return v

    def fresh(self, hint: str) -> str:
        while True:
            self._fresh += 1
            cand = f"{hint}/{self._fresh}"
            if cand not in self.names and not self.g.has_value(cand):
                return cand

    def aux(self, n, kind, operands, attrs, suffix, op_name=None) -> Value:
        """An extra op for node ``n`` (e.g. the Reshapes around an old-style Softmax)."""
        out = self.fresh(f"{n.output[0]}/{suffix}")
        return self.emit(n, kind, operands, attrs, outputs=[out],
                         op_name=op_name or f"{self.node_name(n)}/{suffix}", check=False)[0]

    def emit(self, n, kind, operands, attrs, outputs=None, op_name=None, check=True,
             result_types=None) -> list[Value]:
        outputs = [n.output[0]] if outputs is None else outputs
        try:
            op = self.g.create_op(kind, operands, attrs, name=op_name or self.node_name(n), result_names=outputs,
                                  result_types=result_types)
        except InferError as e:
            raise self.fail(n, str(e), "the model's shapes do not fit this operator; check --input-shape") from None
        for r, o in zip(op.results, outputs):
            if r.name != o:
                raise ImportMismatch(f"IR renamed '{o}' to '{r.name}'")
            self.values[o] = r
            if r.type.size == 0:
                raise self.fail(n, f"produces an empty tensor '{o}' (shape {list(r.shape)})",
                                "check --input-shape: the sizes are too small for this model")
            ref = self.onnx_types.get(o) if check else None
            if ref is not None and ref[1] is not None and (ref[1] != r.shape or ref[0] != r.dtype):
                if kind in ("MaxPool", "AveragePool") and attrs.get("ceil_mode"):
                    # ONNX's inference keeps a last ceil-mode window that starts past the input;
                    # onnxruntime (and the IR) drop it. Trust ours; ONNX's shapes after this are off.
                    self.onnx_types = {}
                    continue
                raise ImportMismatch(f"node {node_label(n)}: IR infers {r.type} for '{o}', ONNX infers "
                                     f"{ref[0]}{list(ref[1])}")
        return op.results
