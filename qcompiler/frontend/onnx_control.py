"""Control flow resolved at import: ``If`` nodes with a known condition, and graph inputs bound to
constants.

An ``If`` whose condition is constant once the importer has folded what it can (constants, the
shapes of the now static tensors, inputs bound with ``input_values``) is replaced by the nodes of
the branch it takes::

    c = Equal(sr, 16000)            sr bound to 16000: c folds to True
    y = If(c, then={... a ...}, else={... b ...})    ->    the then-branch's nodes, writing y

Branch nodes may read outer-scope tensors; the names a branch defines are kept where they are free
and renamed ``<If node>/<name>`` where they would collide, and the branch outputs take the If's
output names. Nested Ifs are inlined the same way when the walk reaches them. An If whose
condition depends on run-time data is a UserError naming the node and the graph inputs it comes
from, with the fix: bind them (``--input-value NAME=VALUE``, ``import_onnx(..., input_values=)``).

:func:`bind_inputs` turns such bound inputs into initializers of a copy of the model, so that all
of the importer treats them as the constants they are (and they are no longer inputs of the
compiled artifact).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UserError
from .onnx_load import live_nodes, node_inputs, toposort
from .onnx_registry import converter


# ---- If -----------------------------------------------------------------------------------------
@converter("If")
def _if(b, n, a):
    cond = b.const(n.input[0])
    if cond is None:
        raise b.fail(n, f"its condition '{n.input[0]}' is computed at run time{_from_inputs(b, n.input[0])}",
                     "qcompiler inlines only Ifs it can decide at import: bind the input(s) the condition depends "
                     "on to constants with --input-value NAME=VALUE (Python: import_onnx(..., input_values=...))")
    if cond.size != 1:
        raise b.fail(n, f"its condition has {cond.size} elements, not 1", "the model is malformed; re-export it")
    branch = a["then_branch"] if bool(cond.reshape(-1)[0]) else a["else_branch"]
    if len(branch.output) != len(n.output):
        raise b.fail(n, f"the taken branch has {len(branch.output)} outputs, the If {len(n.output)}",
                     "the model is malformed; re-export it")
    inline_graph(b, n, branch, list(n.output))


def _from_inputs(b, name: str) -> str:
    """' (from graph input(s) 'a', 'b')' for the inputs the IR value ``name`` is computed from."""
    v = b.values.get(name)
    if v is None:
        return ""
    seen, stack, found = set(), [v], []
    inputs = {id(x) for x in b.g.inputs}
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if id(x) in inputs:
            found.append(x.name)
        elif x.producer is not None:
            stack.extend(x.producer.operands)
    return f" (from graph input{'s' if len(found) > 1 else ''} {', '.join(repr(f) for f in sorted(found))})" \
        if found else ""


def inline_graph(b, n, sub: onnx.GraphProto, outs: list[str]) -> None:
    """Convert the nodes of subgraph ``sub`` in place of node ``n``; its outputs become ``outs``."""
    defined = [t.name for t in sub.initializer] + [o for x in sub.node for o in x.output if o]
    taken = set(b.values) | set(b.consts) | b.names
    rename: dict[str, str] = {}
    produced = {o for x in sub.node for o in x.output if o}
    for o, target in zip(sub.output, outs):
        if target and o.name in produced and o.name not in rename:
            rename[o.name] = target
    for name in defined:
        if name not in rename and (name in taken or b.g.has_value(name)):
            rename[name] = b.fresh(f"{b.node_name(n)}/{name}")
    for name, arr in ((rename.get(t.name, t.name), t) for t in sub.initializer):
        b.set_const(name, numpy_helper.to_array(arr))
    nodes = [_renamed(x, rename) for x in sub.node]
    sub_outs = [rename.get(o.name, o.name) for o in sub.output]
    nodes = live_nodes(toposort(nodes, {o: i for i, x in enumerate(nodes) for o in x.output if o}, b.where),
                       sub_outs)
    for x in nodes:
        b.uses.update(node_inputs(x))
        b.names.update(o for o in x.output if o)
    for target in outs:
        b.onnx_types.pop(target, None)          # ONNX's type for an If output merges both branches
    b.run(nodes)
    for src, target in zip(sub_outs, outs):
        if target and src != target:            # a branch output defined outside the branch's nodes
            if src in b.consts:
                b.set_const(target, b.consts[src])
            else:
                b.emit(n, "Identity", [b.val(src)], {}, outputs=[target], check=False)


def _renamed(node: onnx.NodeProto, rename: dict[str, str]) -> onnx.NodeProto:
    """A copy of ``node`` with ``rename`` applied to its inputs and outputs and, for names read
    from outer scopes, inside its own subgraphs."""
    x = onnx.NodeProto()
    x.CopyFrom(node)
    if not rename:
        return x
    x.input[:] = [rename.get(i, i) for i in x.input]
    x.output[:] = [rename.get(o, o) for o in x.output]
    for a in x.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            _rename_graph(g, rename)
    return x


def _rename_graph(g: onnx.GraphProto, rename: dict[str, str]) -> None:
    local = {t.name for t in g.initializer} | {v.name for v in g.input} | {o for x in g.node for o in x.output}
    outer = {k: v for k, v in rename.items() if k not in local}
    for x in g.node:
        x.input[:] = [outer.get(i, i) for i in x.input]
        for a in x.attribute:
            for s in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _rename_graph(s, outer)
    for o in g.output:
        o.name = outer.get(o.name, o.name)


# ---- bound inputs ----------------------------------------------------------------------------------
def parse_input_value(spec: str) -> tuple[str, np.ndarray]:
    """``NAME=V`` or ``NAME=V1,V2,...`` (the --input-value flag) -> (name, array); the dtype is the
    model's, applied by :func:`bind_inputs`."""
    name, eq, text = spec.partition("=")
    try:
        if not eq or not name or not text:
            raise ValueError
        items = [float(t) if any(c in t.lower() for c in ".en") else int(t) for t in text.split(",")]
    except ValueError:
        raise UserError(f"bad --input-value '{spec}'", "--input-value",
                        "write NAME=VALUE or NAME=V1,V2,... with numbers, e.g. sr=16000") from None
    return name, np.array(items[0] if len(items) == 1 and "," not in text else items)


def bind_inputs(model: onnx.ModelProto, values: Mapping[str, object] | None, input_shapes, where: str
                ) -> onnx.ModelProto:
    """A copy of ``model`` whose inputs named in ``values`` are initializers holding those values
    (cast to the input's declared element type; a value the type cannot hold exactly is an error)."""
    if not values:
        return model
    inits = {t.name for t in model.graph.initializer}
    real = {v.name: v for v in model.graph.input if v.name not in inits}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for name, value in values.items():
        w = f"{where}: input '{name}'"
        if name not in real:
            raise UserError(f"--input-value names '{name}', which is not an input of the model", where,
                            f"the model's inputs are: {', '.join(real) or '(none)'}")
        if input_shapes and name in input_shapes:
            raise UserError("has both --input-shape and --input-value", w, "drop --input-shape: the value fixes the shape")
        tt = real[name].type.tensor_type
        try:
            dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        except (KeyError, ValueError, TypeError):
            raise UserError(f"has element type {tt.elem_type}, which cannot be bound", w, "bind a numeric input") from None
        raw = np.asarray(value)
        arr = raw.astype(dt)
        if raw.dtype.kind in "biuf" and not np.array_equal(arr.astype(raw.dtype), raw):
            raise UserError(f"--input-value {raw.tolist()} does not fit the input's type {dt.name}", w,
                            f"give {dt.name} values")
        if tt.HasField("shape"):
            declared = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if None not in declared and arr.shape != tuple(declared) and arr.size == int(np.prod(declared)):
                arr = arr.reshape(declared)
            if len(declared) != arr.ndim or any(d is not None and d != s for d, s in zip(declared, arr.shape)):
                raise UserError(f"--input-value has shape {list(arr.shape)}, the input is declared "
                                f"{['?' if d is None else d for d in declared]}", w,
                                "give one value per element of the declared shape")
        m.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
    keep = [v for v in m.graph.input if v.name not in values]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.ir_version = max(m.ir_version, 4)        # initializers need not be listed as inputs
    return m
