"""The graph qcompiler compiles, as an ONNX file for ONNX Runtime's ``quantize_static``.

qcompiler imports a model at its static input shapes, with the inputs the manifest fixes
(``values``, e.g. silero-vad's ``sr = 16000``) bound to constants, and replaces every ``If`` whose
condition is then constant by the branch it takes (qcompiler/frontend/onnx_control.py). ONNX
Runtime's ``quantize_static`` leaves If branches float (silero-vad-op18-ifless: the whole network
is one branch, nothing gets quantized) or fails on them (silero-vad: shape inference of the LSTM
inside a branch), and ORT's own graph optimizer, which inlines constant Ifs, fails on silero-vad's
nested ones. :func:`fixed_graph` does the same resolution on the ONNX graph, so that the peer
quantizes the graph we compile::

    c = Equal(sr, 16000)                         sr bound to 16000: c is True
    y = If(c, then={... a ...}, else={...})  ->  the then-branch's nodes, writing y

Conditions are evaluated where they are constant: initializers, Constant nodes, bound inputs,
``Shape``/``Size`` of tensors whose shape ONNX shape inference makes static, and any standard op
of those (the ONNX reference evaluator). Branch nodes keep their names where they are free in
the whole model, and are renamed ``<If node>/<name>`` where they would collide; the branch's
outputs take the If's output names; nested Ifs are resolved in turn. The bound inputs stay
declared, unread, so that the file takes the same feeds as the model.
"""
from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

_STANDARD = ("", "ai.onnx")
_RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"})
_MAX_FOLD = 1 << 16
"""Elements an op's inputs may have for it to be evaluated here: conditions come from shapes and
scalars; larger constant ops (weight transforms) are left to ORT."""


def fixed_graph(model: onnx.ModelProto, shapes: Mapping[str, tuple] | None = None,
                values: Mapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` with the inputs in ``shapes`` at those static shapes, the reads of the
    inputs in ``values`` replaced by initializers of those values (the inputs stay declared, unread),
    every ``If`` whose condition is then constant replaced by its taken branch (at any depth of
    nesting), and then the nodes nothing reads any more removed. Without ``values`` and such Ifs,
    only the input shapes change."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for v in g.input:
        if shapes and v.name in shapes:
            tt = v.type.tensor_type
            tt.ClearField("shape")
            for d in shapes[v.name]:
                tt.shape.dim.add().dim_value = int(d)
    if values:
        _bind(m, values)
    inlined: set[str] = set()
    while _inline_constant_ifs(m, inlined):
        pass
    if values or inlined:
        _prune(g)
        keep = [v for v in g.value_info if v.name not in inlined]   # an If output's type merges both branches
        del g.value_info[:]
        g.value_info.extend(keep)
        m.ir_version = max(m.ir_version, 4)      # initializers need not be graph inputs
    return m


# ---- bound inputs -------------------------------------------------------------------------------
def _bind(m: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> None:
    """Reads of each input in ``values`` become reads of an initializer holding the value (in the
    input's declared element type and shape)."""
    g = m.graph
    declared = {v.name: v for v in g.input}
    taken = _all_names(g)
    rename = {}
    for name, value in values.items():
        if name not in declared:
            raise KeyError(f"no input {name!r} to bind")
        tt = declared[name].type.tensor_type
        arr = np.asarray(value, helper.tensor_dtype_to_np_dtype(tt.elem_type))
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] \
            if tt.HasField("shape") else None
        if dims is not None and None not in dims and arr.size == int(np.prod(dims, dtype=np.int64)):
            arr = arr.reshape(dims)
        const = _fresh(f"{name}/bound", taken)
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(arr), const))
        rename[name] = const
    for n in g.node:
        _rename_node(n, rename)


# ---- If -----------------------------------------------------------------------------------------
def _inline_constant_ifs(m: onnx.ModelProto, inlined: set[str]) -> bool:
    """Inline every top-level If whose condition is constant (adding their outputs to
    ``inlined``); whether any was."""
    g = m.graph
    if not any(n.op_type == "If" and n.domain in _STANDARD for n in g.node):
        return False
    consts = _Constants(m)
    decided = []
    for i, n in enumerate(g.node):
        if n.op_type == "If" and n.domain in _STANDARD:
            c = consts.value(n.input[0])
            if c is not None and c.size == 1:
                decided.append((i, bool(c.reshape(-1)[0])))
    for i, cond in reversed(decided):            # from the end: the indices before stay valid
        n = g.node[i]
        inlined.update(o for o in n.output if o)
        branch = next(a.g for a in n.attribute if a.name == ("then_branch" if cond else "else_branch"))
        if len(branch.output) != len(n.output):
            raise ValueError(f"If {n.name!r}: the taken branch has {len(branch.output)} outputs, "
                             f"the If {len(n.output)}")
        nodes, inits = _spliced(g, i, branch)
        del g.node[i]
        for k, x in enumerate(nodes):
            g.node.insert(i + k, x)
        g.initializer.extend(inits)
    return bool(decided)


def _spliced(g: onnx.GraphProto, i: int, branch: onnx.GraphProto) -> tuple[list, list]:
    """The nodes and initializers that replace If node ``g.node[i]`` by ``branch``."""
    n = g.node[i]
    taken = set()
    for k, x in enumerate(g.node):
        if k != i:
            taken |= _node_names(x)
    taken |= {t.name for t in g.initializer} | {v.name for v in g.input} | {o.name for o in g.output}
    taken |= {x for x in list(n.input) + list(n.output) if x}
    produced = [o for x in branch.node for o in x.output if o]
    rename: dict[str, str] = {}
    for o, target in zip(branch.output, n.output):
        if target and o.name in produced and o.name not in rename:
            rename[o.name] = target
    for name in [t.name for t in branch.initializer] + produced:
        if name not in rename and name in taken:
            rename[name] = _fresh(f"{n.name or 'If'}/{name}", taken)
        taken.add(rename.get(name, name))
    nodes = []
    for x in branch.node:
        y = onnx.NodeProto()
        y.CopyFrom(x)
        _rename_node(y, rename)
        nodes.append(y)
    inits = []
    for t in branch.initializer:
        u = onnx.TensorProto()
        u.CopyFrom(t)
        u.name = rename.get(t.name, t.name)
        inits.append(u)
    for o, target in zip(branch.output, n.output):
        src = rename.get(o.name, o.name)
        if target and src != target:             # an outer-scope name or an initializer: copy it out
            name = _fresh(f"{n.name or 'If'}/{target}", taken)
            nodes.append(helper.make_node("Identity", [src], [target], name=name))
    return nodes, inits


class _Constants:
    """The values of the top-level tensors of ``m`` that are constant. Alternates ONNX shape
    inference (on a copy of the graph with what is constant so far as initializers: a Pad whose
    pads are computed from constants gets a static shape) with evaluating, in order, each node whose
    inputs are then constant or whose value is a static shape, until nothing more folds."""

    def __init__(self, m: onnx.ModelProto):
        g = m.graph
        inputs = {v.name for v in g.input}
        self.opset = next((o.version for o in m.opset_import if o.domain in _STANDARD), 13)
        self.values = {t.name: numpy_helper.to_array(t) for t in g.initializer if t.name not in inputs}
        self.shapes: dict[str, tuple] = {k: v.shape for k, v in self.values.items()}
        pending = list(g.node)
        while pending:
            self.shapes.update(_static_shapes(self._probe(m, pending)))
            rest = []
            for n in pending:
                outs = self._evaluate(n)
                if outs is None:
                    rest.append(n)
                    continue
                for o, v in zip(n.output, outs):
                    if o:
                        self.values[o] = v = np.asarray(v)
                        self.shapes[o] = v.shape
            if len(rest) == len(pending):
                break
            pending = rest

    def value(self, name: str) -> np.ndarray | None:
        return self.values.get(name)

    def _probe(self, m: onnx.ModelProto, nodes: list) -> onnx.ModelProto:
        """The graph of ``nodes`` on the constants so far (large ones as typed inputs, no data)."""
        small = {k: v for k, v in self.values.items() if v.size <= _MAX_FOLD}
        big = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
               for k, v in self.values.items() if k not in small]
        inits = []
        for k, v in small.items():
            try:
                inits.append(numpy_helper.from_array(np.ascontiguousarray(v), k))
            except Exception:                    # noqa: BLE001 - a dtype ONNX cannot store: leave it out
                pass
        g = helper.make_graph(nodes, "probe", list(m.graph.input) + big, list(m.graph.output), inits)
        return helper.make_model(g, opset_imports=list(m.opset_import), ir_version=max(m.ir_version, 4),
                                 functions=list(m.functions))

    def _evaluate(self, n: onnx.NodeProto) -> list[np.ndarray] | None:
        if n.domain not in _STANDARD or n.op_type in _RANDOM or any(
                a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in n.attribute):
            return None
        if n.op_type in ("Shape", "Size"):
            shape = self.shapes.get(n.input[0])
            if shape is None:
                return None
            if n.op_type == "Size":
                return [np.array(int(np.prod(shape, dtype=np.int64)), np.int64)]
            at = {a.name: a.i for a in n.attribute}
            return [np.array(shape[at.get("start", 0):at.get("end", len(shape))], np.int64)]
        args = {x: self.values.get(x) for x in n.input if x}
        if any(v is None for v in args.values()) or sum(v.size for v in args.values()) > _MAX_FOLD:
            return None
        from onnx.reference import ReferenceEvaluator
        try:
            return list(ReferenceEvaluator(n, opsets={"": self.opset}).run(None, args))
        except Exception:                        # noqa: BLE001 - an op the evaluator lacks: not constant here
            return None


def _static_shapes(m: onnx.ModelProto) -> dict[str, tuple]:
    """{tensor: shape} where ONNX shape inference of ``m`` gives every dim."""
    try:
        m = onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False, data_prop=True)
    except Exception:                            # noqa: BLE001 - then only the declared shapes
        pass
    out = {}
    for v in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        tt = v.type.tensor_type if v.type.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if None not in dims:
            out.setdefault(v.name, tuple(dims))
    return out


# ---- names --------------------------------------------------------------------------------------
def _subgraphs(n: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for a in n.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def _node_names(n: onnx.NodeProto) -> set[str]:
    """Every tensor name ``n`` reads or writes, its subgraphs' included."""
    out = {x for x in list(n.input) + list(n.output) if x}
    for s in _subgraphs(n):
        out |= _all_names(s)
    return out


def _all_names(g: onnx.GraphProto) -> set[str]:
    out = {t.name for t in g.initializer} | {v.name for v in g.input} | {v.name for v in g.output}
    for n in g.node:
        out |= _node_names(n)
    return out


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _rename_node(n: onnx.NodeProto, rename: Mapping[str, str]) -> None:
    """Apply ``rename`` to ``n``'s inputs and outputs and to the outer-scope reads of its subgraphs."""
    if not rename:
        return
    n.input[:] = [rename.get(x, x) for x in n.input]
    n.output[:] = [rename.get(x, x) for x in n.output]
    for s in _subgraphs(n):
        _rename_outer(s, rename)


def _rename_outer(g: onnx.GraphProto, rename: Mapping[str, str]) -> None:
    local = {t.name for t in g.initializer} | {v.name for v in g.input} | {o for x in g.node for o in x.output}
    outer = {k: v for k, v in rename.items() if k not in local}
    if not outer:
        return
    for x in g.node:
        x.input[:] = [outer.get(i, i) for i in x.input]
        for s in _subgraphs(x):
            _rename_outer(s, outer)
    for o in g.output:
        o.name = outer.get(o.name, o.name)


def _free_reads(g: onnx.GraphProto) -> set[str]:
    """The names subgraph ``g`` reads from outer scopes, at any depth."""
    local = {t.name for t in g.initializer} | {v.name for v in g.input} | {o for x in g.node for o in x.output}
    out = set()
    for x in g.node:
        out |= {i for i in x.input if i} | {r for s in _subgraphs(x) for r in _free_reads(s)}
    out |= {o.name for o in g.output}
    return out - local


# ---- liveness -----------------------------------------------------------------------------------
def _prune(g: onnx.GraphProto) -> None:
    """Drop the nodes and initializers no graph output depends on."""
    need = {o.name for o in g.output}
    keep = []
    for n in reversed(list(g.node)):
        if any(o in need for o in n.output if o):
            keep.append(n)
            need |= {x for x in n.input if x} | {r for s in _subgraphs(n) for r in _free_reads(s)}
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    inputs = {v.name for v in g.input}
    inits = [t for t in g.initializer if t.name in need or t.name in inputs]
    del g.initializer[:]
    g.initializer.extend(inits)
