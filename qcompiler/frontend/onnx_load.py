"""Load an ONNX file and check that it is a well-formed model the importer can read.

Everything that is wrong with the *file* or the *graph structure* is reported here as a
:class:`~qcompiler.errors.UserError` naming the file, node or tensor: an empty or truncated file, a
protobuf that is not an ONNX model, external data outside the model's folder or missing, an opset
outside 11..21, operators outside the standard domain, tensors defined twice or never, duplicate
graph outputs, and cycles. The result is the model plus its nodes in topological order.
"""
from __future__ import annotations

import os
from typing import Iterator

import onnx
from onnx import TensorProto

from ..errors import UserError

MICROSOFT_OPS = frozenset({"QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearSigmoid",
                           "QLinearLeakyRelu", "QLinearConcat", "QGemm", "DynamicQuantizeMatMul",
                           "DynamicQuantizeLSTM", "MatMulNBits", "GatherBlockQuantized"})
"""The com.microsoft operators the importer takes, ONNX Runtime's quantized ops
(:mod:`.onnx_qlinear`; DynamicQuantizeLSTM in :mod:`.onnx_rnn`; the weight-only 4-bit ones in
:mod:`.onnx_nbits`); every other operator must be ai.onnx."""

MIN_OPSET, MAX_OPSET = 11, 21
_UPGRADE = ("re-export the model with opset >= 11, e.g. torch.onnx.export(..., opset_version=13), "
            "or convert it with onnx.version_converter.convert_version(model, 13)")


def load_model(src: "str | os.PathLike | onnx.ModelProto") -> tuple[onnx.ModelProto, str]:
    """Read and validate ``src`` (a path or an in-memory model); returns (model, where) where
    ``where`` names the model in error messages. External data is read into the model."""
    if isinstance(src, onnx.ModelProto):
        model, where, base = src, "<model>", None
    else:
        path = os.fspath(src)
        where = path
        if not os.path.exists(path):
            raise UserError("file not found", where, "check the path")
        if os.path.isdir(path):
            raise UserError("is a folder, not an ONNX file", where, "pass the path of the .onnx file")
        with open(path, "rb") as f:
            data = f.read()
        if not data:
            raise UserError("the file is empty", where, "re-export the model")
        model = onnx.ModelProto()
        try:
            model.ParseFromString(data)
        except Exception:   # google.protobuf DecodeError and friends
            raise UserError("not a valid ONNX protobuf (truncated or not an ONNX file)", where,
                            "re-export the model or check that the download finished") from None
        base = os.path.dirname(os.path.abspath(path))
    if not model.HasField("graph") or model.ir_version <= 0 or not model.opset_import:
        raise UserError("not an ONNX model (no graph, IR version or opset)", where,
                        "pass an .onnx file written by an ONNX exporter")
    check_opset(model, where)
    _load_external_data(model, base, where)
    return model, where


def default_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


def check_opset(model: onnx.ModelProto, where: str) -> int:
    v = default_opset(model)
    if v == 0:
        raise UserError("the model imports no standard ONNX (ai.onnx) opset", where,
                        "export with a standard ai.onnx opset between 11 and 21")
    if v < MIN_OPSET:
        raise UserError(f"opset {v} is older than qcompiler supports ({MIN_OPSET}..{MAX_OPSET})", where, _UPGRADE)
    if v > MAX_OPSET:
        raise UserError(f"opset {v} is newer than qcompiler supports ({MIN_OPSET}..{MAX_OPSET})", where,
                        f"re-export with opset {MAX_OPSET} or lower, or convert it with "
                        f"onnx.version_converter.convert_version(model, {MAX_OPSET})")
    return v


# ---- external data ----------------------------------------------------------------------------
def _tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from _tensors(sub)


def _load_external_data(model: onnx.ModelProto, base: str | None, where: str) -> None:
    """Read external tensor data, only from files inside the model's own folder."""
    for t in _tensors(model.graph):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        tw = f"{where}: tensor '{t.name}'"
        if base is None:
            raise UserError("uses external data but the model was given in memory", tw,
                            "pass the model's file path so its data files can be found")
        norm = os.path.normpath(loc) if loc else ""
        if (not loc or os.path.isabs(loc) or os.path.splitdrive(loc)[0] or norm == ".."
                or norm.startswith(".." + os.sep)):
            raise UserError(f"external data location '{loc}' is not a file inside the model's folder", tw,
                            "keep external data files next to the model and reference them by relative name")
        full = os.path.realpath(os.path.join(base, norm))
        real_base = os.path.realpath(base)
        if os.path.commonpath([full, real_base]) != real_base:
            raise UserError(f"external data location '{loc}' resolves outside the model's folder", tw,
                            "keep external data files next to the model (no links out of the folder)")
        if not os.path.isfile(full):
            raise UserError(f"external data file '{loc}' not found", tw,
                            "copy the model's data file next to it")
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else -1
        except ValueError:
            raise UserError("bad external data offset/length", tw, "re-export the model") from None
        with open(full, "rb") as f:
            f.seek(offset)
            raw = f.read(length)
        if t.data_type != TensorProto.STRING:
            n = 1
            for d in t.dims:
                n *= d
            need = n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            if len(raw) != need:
                raise UserError(f"external data in '{loc}' has {len(raw)} bytes, the tensor needs {need}", tw,
                                "the data file is truncated or does not belong to this model")
        t.raw_data = raw
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT


# ---- graph structure --------------------------------------------------------------------------
def subgraph_inputs(n: onnx.NodeProto) -> list[str]:
    """Outer-scope tensors that ``n``'s subgraphs (If branches, Loop/Scan bodies) read, at any depth:
    implicit inputs of ``n`` for ordering and liveness."""
    out: list[str] = []

    def walk(g: onnx.GraphProto, outer_defined: set[str]) -> None:
        defined = outer_defined | {t.name for t in g.initializer} | {v.name for v in g.input}
        defined |= {o for x in g.node for o in x.output}
        for x in g.node:
            out.extend(i for i in x.input if i and i not in defined)
            for a in x.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    walk(sub, defined)
        out.extend(o.name for o in g.output if o.name not in defined)

    for a in n.attribute:
        for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            walk(sub, set())
    return list(dict.fromkeys(out))


def node_inputs(n: onnx.NodeProto) -> list[str]:
    """The tensors ``n`` reads: its inputs and what its subgraphs read from outside them."""
    ins = [x for x in n.input if x]
    return ins + subgraph_inputs(n) if n.attribute else ins


def live_nodes(nodes: list[onnx.NodeProto], outputs: list[str]) -> list[onnx.NodeProto]:
    """The nodes (topologically ordered) that ``outputs`` depend on."""
    need, keep = set(outputs), []
    for n in reversed(nodes):
        if any(o in need for o in n.output):
            keep.append(n)
            need.update(node_inputs(n))
    return keep[::-1]


def node_label(n: onnx.NodeProto, i: int | None = None) -> str:
    name = n.name or (f"#{i}" if i is not None else "")
    return f"{n.op_type} '{name}'" if name else n.op_type


def _check_text(gr: onnx.GraphProto, where: str) -> None:
    """Every name and op type must be text: protobuf hands back bytes for invalid UTF-8 (a corrupt file)."""
    names = [t.name for t in gr.initializer] + [v.name for v in (*gr.input, *gr.output, *gr.value_info)]
    for n in gr.node:
        names += [n.op_type, n.domain, n.name, *n.input, *n.output]
    if any(not isinstance(x, str) for x in names):
        raise UserError("a name or operator type is not valid UTF-8 text", where,
                        "the file is corrupt; re-export or re-download the model")


def check_graph(model: onnx.ModelProto, where: str) -> list[onnx.NodeProto]:
    """Check names, domains and acyclicity; return the nodes in topological order."""
    gr = model.graph
    _check_text(gr, where)
    defined: dict[str, str] = {}

    def define(name: str, what: str):
        if name in defined:
            raise UserError(f"tensor '{name}' is defined twice (by {defined[name]} and by {what})", where,
                            "the model is malformed; re-export it")
        defined[name] = what

    for t in gr.initializer:
        define(t.name, f"initializer '{t.name}'")
    init_names = set(defined)
    for v in gr.input:
        if v.name not in init_names:
            define(v.name, f"graph input '{v.name}'")
    producer: dict[str, int] = {}
    for i, n in enumerate(gr.node):
        microsoft = n.domain == "com.microsoft" and n.op_type in MICROSOFT_OPS
        if n.domain not in ("", "ai.onnx") and not microsoft:
            raise UserError(f"operator '{n.domain}::{n.op_type}' is outside the standard ONNX domain",
                            f"{where}: node {node_label(n, i)}",
                            "export with standard ai.onnx operators only, no custom or ML-domain ops "
                            f"(of com.microsoft, qcompiler imports {', '.join(sorted(MICROSOFT_OPS))})")
        if not microsoft and not onnx.defs.has(n.op_type):
            raise UserError(f"unknown ONNX operator '{n.op_type}'", f"{where}: node {node_label(n, i)}",
                            "export with standard ai.onnx operators only")
        for o in n.output:
            if o:
                define(o, f"node {node_label(n, i)}")
                producer[o] = i
    for i, n in enumerate(gr.node):
        for x in n.input:
            if x and x not in defined:
                raise UserError(f"reads tensor '{x}', which nothing defines", f"{where}: node {node_label(n, i)}",
                                "the model is malformed; re-export it")
    seen_out: set[str] = set()
    if not gr.output:
        raise UserError("the graph has no outputs", where, "re-export the model")
    for o in gr.output:
        if o.name in seen_out:
            raise UserError(f"duplicate graph output '{o.name}'", where, "give each graph output its own name")
        seen_out.add(o.name)
        if o.name not in defined:
            raise UserError(f"graph output '{o.name}' is not produced by anything", where,
                            "the model is malformed; re-export it")
    return toposort(gr.node, producer, where)


def toposort(nodes, producer: dict[str, int], where: str) -> list[onnx.NodeProto]:
    """Kahn's algorithm, stable (keeps file order where legal)."""
    import heapq
    deps = [set() for _ in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for x in node_inputs(n):
            p = producer.get(x)
            if p is not None and p not in deps[i]:
                deps[i].add(p)
                users[p].append(i)
    indeg = [len(d) for d in deps]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        left = {i for i, d in enumerate(indeg) if d > 0}
        stuck, walked = min(left), set()
        while stuck not in walked:            # walk back along unsorted inputs until we go round
            walked.add(stuck)
            stuck = min(d for d in deps[stuck] if d in left)
        raise UserError("the graph has a cycle", f"{where}: node {node_label(nodes[stuck], stuck)}",
                        "ONNX graphs must be acyclic; re-export the model")
    return [nodes[i] for i in order]
