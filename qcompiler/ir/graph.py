"""The typed SSA dataflow graph.

A :class:`Graph` holds graph inputs, constants (weights: values over numpy arrays), operations in
topological order, and outputs. Every :class:`Value` is defined once (by a graph input, a constant or
an op result) and knows its uses; the links are kept current by the IR itself (as in torch.fx), so a
pass never patches use lists: it calls :meth:`Op.set_operand`, :meth:`Value.replace_all_uses_with`,
:meth:`Graph.create_op` and :meth:`Graph.erase_op`.

Op kinds are ONNX operator names with normalized attributes (every attribute spelled out,
``auto_pad`` resolved into ``pads``), plus qcompiler extensions documented in :mod:`qcompiler.ir.ops`.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .types import QuantParams, TensorType, np_dtype


class IRError(Exception):
    """Misuse of the IR API or an IR that fails verification; the message names the op."""


class UseList:
    """A value's uses, ``(op, operand index)`` pairs in the order they were made, with the list
    operations passes and tests use (iteration, ``len``, indexing, ``in``, ``append``, ``remove``,
    ``clear``, ``==`` with a list). Backed by an insertion-ordered dict, so ``remove`` and ``in``
    cost O(1) instead of a scan of the list: rewiring or erasing the n users of a constant shared
    by n ops stays linear."""

    __slots__ = ("_d",)

    def __init__(self, items: Iterable[tuple["Op", int]] = ()):
        self._d: dict[tuple[Op, int], None] = dict.fromkeys(items)

    def append(self, use: tuple["Op", int]) -> None:
        self._d.pop(use, None)           # a list would hold it twice; a use is one operand slot
        self._d[use] = None

    def remove(self, use: tuple["Op", int]) -> None:
        try:
            del self._d[use]
        except KeyError:
            raise ValueError(f"{use!r} is not in the use list") from None

    def clear(self) -> None:
        self._d.clear()

    def __contains__(self, use) -> bool:
        try:
            return use in self._d
        except TypeError:
            return False

    def __iter__(self):
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __bool__(self) -> bool:
        return bool(self._d)

    def __getitem__(self, i):
        if i == 0 and self._d and not isinstance(i, slice):
            return next(iter(self._d))
        return list(self._d)[i]

    def __eq__(self, other) -> bool:
        if isinstance(other, UseList):
            return list(self._d) == list(other._d)
        if isinstance(other, (list, tuple)):
            return list(self._d) == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return repr(list(self._d))


class Value:
    """An SSA value: a graph input, a constant (``data`` set) or an op result."""

    __slots__ = ("name", "type", "producer", "data", "uses", "graph", "__weakref__")

    def __init__(self, name: str, type: TensorType, producer: "Op | None" = None,
                 data: np.ndarray | None = None):
        self.name = name
        self.type = type
        self.producer = producer          # the Op defining it, None for inputs and constants
        self.data = data                  # numpy array for constants
        self.uses: UseList = UseList()
        self.graph: Graph | None = None

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def is_input(self) -> bool:
        return self.producer is None and self.data is None

    @property
    def users(self) -> list["Op"]:
        """Distinct ops that use this value, in use order."""
        seen: dict[Op, None] = {}
        for op, _ in self.uses:
            seen.setdefault(op, None)
        return list(seen)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def replace_all_uses_with(self, new: "Value") -> None:
        """Make every use of this value (op operands and graph outputs) use ``new`` instead.

        When this value is a graph output, ``new`` takes over its name, so the model's interface
        keeps its output names."""
        if new is self:
            return
        for op, i in list(self.uses):
            op.set_operand(i, new)
        g = self.graph
        if g is not None and any(o is self for o in g.outputs):
            g.outputs = [new if o is self else o for o in g.outputs]
            if new.producer is not None and sum(o is new for o in g.outputs) == 1:
                # the model's interface keeps its output name: swap names
                old_name = self.name
                g.rename(self, g.unique_name(old_name + "_replaced"))
                g.rename(new, old_name)

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Op:
    """An operation: a kind (ONNX op name or qcompiler extension), attributes, operands, results."""

    __slots__ = ("kind", "attrs", "_operands", "results", "name", "graph", "__weakref__")

    def __init__(self, kind: str, operands: Sequence[Value], attrs: dict[str, Any] | None = None,
                 results: Sequence[Value] = (), name: str = ""):
        self.kind = kind
        self.attrs: dict[str, Any] = dict(attrs or {})
        self._operands: list[Value] = []
        self.results: list[Value] = list(results)
        self.name = name
        self.graph: Graph | None = None
        for v in operands:
            self._append_operand(v)
        for r in self.results:
            r.producer = self

    # -- operands -------------------------------------------------------------------------------
    @property
    def operands(self) -> tuple[Value, ...]:
        return tuple(self._operands)

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise IRError(f"{self.describe()} has {len(self.results)} results, not one")
        return self.results[0]

    def _append_operand(self, v: Value) -> None:
        if not isinstance(v, Value):
            raise IRError(f"operand of {self.kind} must be a Value, got {type(v).__name__}")
        v.uses.append((self, len(self._operands)))
        self._operands.append(v)

    def set_operand(self, i: int, v: Value) -> None:
        old = self._operands[i]
        old.uses.remove((self, i))
        self._operands[i] = v
        v.uses.append((self, i))

    def set_operands(self, operands: Sequence[Value]) -> None:
        self._drop_operands()
        for v in operands:
            self._append_operand(v)

    def _drop_operands(self) -> None:
        for i, v in enumerate(self._operands):
            v.uses.remove((self, i))
        self._operands = []

    def describe(self) -> str:
        return f"{self.kind} '{self.name}'" if self.name else self.kind

    def __repr__(self) -> str:
        res = ", ".join(f"%{r.name}" for r in self.results)
        args = ", ".join(f"%{v.name}" for v in self._operands)
        return f"<{res} = {self.kind}({args})>"


class Graph:
    """A dataflow graph. ``ops`` is kept in topological order."""

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.consts: dict[str, Value] = {}        # name -> constant value, in insertion order
        # The ops in topological order, kept so that an edit costs O(1) and a full read O(n) once
        # after any number of edits (a list.index / list.remove scan per edit made a pass that
        # edits every op O(n^2)): erase_op leaves a tombstone (the op, its graph cleared) and
        # create_op(before=A / after=A) files the op under its anchor; _live() rebuilds the list,
        # each pending op immediately before / after its anchor exactly as list.insert would have.
        self._op_list: list[Op] = []
        self._before: dict[Op, list[Op]] = {}
        self._after: dict[Op, list[Op]] = {}
        self._pending = 0
        self._dead = 0
        self._names: dict[str, Value] = {}
        self._op_names: set[str] = set()
        self._counter = itertools.count()
        self.meta: dict[str, Any] = {}            # e.g. opset, producer, recorded statistics

    # -- names ----------------------------------------------------------------------------------
    def unique_name(self, hint: str) -> str:
        hint = hint or "v"
        if hint not in self._names:
            return hint
        while True:
            cand = f"{hint}_{next(self._counter)}"
            if cand not in self._names:
                return cand

    def unique_op_name(self, hint: str) -> str:
        if hint and hint not in self._op_names:
            return hint
        while True:
            cand = f"{hint or 'op'}_{next(self._counter)}"
            if cand not in self._op_names:
                return cand

    def _register(self, v: Value) -> Value:
        if v.name in self._names:
            raise IRError(f"value name '%{v.name}' defined twice")
        self._names[v.name] = v
        v.graph = self
        return v

    def rename(self, v: Value, new_name: str) -> None:
        if self._names.get(new_name) not in (None, v):
            raise IRError(f"cannot rename %{v.name} to %{new_name}: name taken")
        old = v.name
        del self._names[old]
        v.name = new_name
        self._names[new_name] = v
        if v.is_const:
            self.consts = {(new_name if k == old else k): c for k, c in self.consts.items()}

    def rename_op(self, op: "Op", new_name: str) -> None:
        """Give ``op`` the (unused) name ``new_name``; e.g. a replacement op keeps the name of the op
        it replaced."""
        if new_name != op.name and new_name in self._op_names:
            raise IRError(f"cannot rename {op.describe()} to '{new_name}': name taken")
        self._op_names.discard(op.name)
        op.name = new_name
        self._op_names.add(new_name)

    def value(self, name: str) -> Value:
        try:
            return self._names[name]
        except KeyError:
            raise IRError(f"no value named %{name}") from None

    def has_value(self, name: str) -> bool:
        return name in self._names

    # -- building -------------------------------------------------------------------------------
    def add_input(self, name: str, type: TensorType) -> Value:
        v = self._register(Value(name, type))
        self.inputs.append(v)
        return v

    def add_const(self, data: np.ndarray, name: str = "const", quant: "QuantParams | None" = None) -> Value:
        """Add a constant (weight). ``name`` is a hint; a unique name is chosen. With ``quant``
        the constant has a quantized type (``data`` holds the stored integers, dtype = storage)."""
        data = np.asarray(data, order="C")     # (np.ascontiguousarray would make a 0-d array 1-d)
        t = TensorType.of(data)
        if quant is not None:
            if data.dtype != np_dtype(quant.storage):
                raise IRError(f"constant '{name}': data is {data.dtype}, its quantized type stores {quant.storage}")
            t = t.with_quant(quant)
        v = self._register(Value(self.unique_name(name), t, data=data))
        self.consts[v.name] = v
        return v

    def create_op(self, kind: str, operands: Sequence[Value], attrs: dict[str, Any] | None = None,
                  *, result_types: Sequence[TensorType] | None = None, name: str = "",
                  result_names: Sequence[str] | None = None, before: Op | None = None,
                  after: Op | None = None) -> Op:
        """Create an op and insert it: at the end, or just before/after an anchor op.

        Result types are inferred from the op registry unless given."""
        from .ops import infer_types
        attrs = dict(attrs or {})
        if result_types is None:
            result_types = infer_types(kind, [v.type for v in operands], attrs, [v.data for v in operands])
        hints = result_names or [f"{name or kind.lower()}_out{i if i else ''}" for i in range(len(result_types))]
        results = [self._register(Value(self.unique_name(h), t)) for h, t in zip(hints, result_types)]
        op = Op(kind, operands, attrs, results, self.unique_op_name(name or kind.lower()))
        self._op_names.add(op.name)
        op.graph = self
        if before is not None:
            self._check_anchor(before)
            self._before.setdefault(before, []).append(op)
            self._pending += 1
        elif after is not None:
            self._check_anchor(after)
            self._after.setdefault(after, []).append(op)
            self._pending += 1
        else:
            self._op_list.append(op)
        return op

    def _check_anchor(self, op: Op) -> None:
        if op.graph is not self:
            raise IRError(f"{op.describe()} is not in graph '{self.name}'")

    @property
    def _ops(self) -> list[Op]:
        """The op list itself, pending edits applied (mutating it edits the graph's order)."""
        return self._live()

    @_ops.setter
    def _ops(self, ops: list[Op]) -> None:
        self._op_list = list(ops)
        self._before, self._after = {}, {}
        self._pending = self._dead = 0

    def _live(self) -> list[Op]:
        """Apply the pending edits to the op list (O(n + edits)) and return it."""
        if not (self._pending or self._dead):
            return self._op_list
        before, after, out = self._before, self._after, []
        for base in self._op_list:
            # expand base: [ops before it (in creation order, each expanded), base,
            # ops after it (the latest first, as repeated list.insert(i + 1) leaves them)]
            stack = [(True, base)]
            while stack:
                expand, op = stack.pop()
                if not expand:
                    if op.graph is self:
                        out.append(op)
                    continue
                stack.extend((True, o) for o in after.get(op, ()))
                stack.append((False, op))
                stack.extend((True, o) for o in reversed(before.get(op, ())))
        self._ops = out
        return self._op_list

    # -- mutation -------------------------------------------------------------------------------
    def erase_op(self, op: Op) -> None:
        """Remove an op whose results are no longer used."""
        for r in op.results:
            if r.uses or any(o is r for o in self.outputs):
                users = ", ".join(u.describe() for u in r.users) or "a graph output"
                raise IRError(f"cannot erase {op.describe()}: its result %{r.name} is still used by {users}")
        if op.graph is not self:
            raise IRError(f"{op.describe()} is not in graph '{self.name}'")
        op._drop_operands()
        self._dead += 1                   # its tombstone stays in the list until the next _live()
        for r in op.results:
            del self._names[r.name]
            r.graph = None
        self._op_names.discard(op.name)
        op.graph = None

    def erase_const(self, v: Value) -> None:
        if v.uses or any(o is v for o in self.outputs):
            raise IRError(f"cannot erase constant %{v.name}: still used")
        del self.consts[v.name]
        del self._names[v.name]
        v.graph = None

    def replace_op(self, op: Op, new_values: Sequence[Value]) -> None:
        """Replace each result of ``op`` by the corresponding value, then erase ``op``."""
        for r, n in zip(op.results, new_values, strict=True):
            r.replace_all_uses_with(n)
        self.erase_op(op)

    def remove_unused_consts(self) -> int:
        dead = [v for v in self.consts.values() if not v.uses and not any(o is v for o in self.outputs)]
        for v in dead:
            self.erase_const(v)
        return len(dead)

    # -- traversal ------------------------------------------------------------------------------
    @property
    def ops(self) -> list[Op]:
        """The ops in topological order (a copy: safe to mutate the graph while iterating)."""
        return list(self._live())

    def __iter__(self) -> Iterator[Op]:
        return iter(list(self._live()))

    def __len__(self) -> int:
        return len(self._op_list) + self._pending - self._dead

    def values(self) -> Iterable[Value]:
        return self._names.values()

    def find_ops(self, kind: str) -> list[Op]:
        return [op for op in self._live() if op.kind == kind]

    def toposort(self) -> None:
        """Re-establish topological order (stable: keeps the current order where it is legal).

        Raises IRError naming an op on a cycle."""
        import networkx as nx
        pos = {op: i for i, op in enumerate(self._ops)}
        g = nx.DiGraph()
        g.add_nodes_from(self._ops)
        for op in self._ops:
            for v in op._operands:
                if v.producer is not None and v.producer in pos:
                    g.add_edge(v.producer, op)
        try:
            self._ops = list(nx.lexicographical_topological_sort(g, key=pos.__getitem__))
        except nx.NetworkXUnfeasible:
            cyc = nx.find_cycle(g)
            raise IRError(f"graph has a cycle through {cyc[0][0].describe()}") from None

    def to_networkx(self):
        """A networkx DiGraph of ops (nodes) with an edge per producer -> consumer value."""
        import networkx as nx
        g = nx.MultiDiGraph()
        g.add_nodes_from(self._live())
        for op in self._ops:
            for v in op._operands:
                if v.producer is not None:
                    g.add_edge(v.producer, op, value=v)
        return g

    # -- summaries ------------------------------------------------------------------------------
    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for op in self._live():
            hist[op.kind] = hist.get(op.kind, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    def param_count(self) -> tuple[int, int]:
        """(number of constant elements, bytes) over all constants (as stored: 4-bit values two per
        byte, with their blocks' scales and zero points: :attr:`TensorType.stored_bytes`)."""
        n = sum(v.data.size for v in self.consts.values())
        b = sum(v.type.stored_bytes for v in self.consts.values())
        return int(n), int(b)

    def clone(self) -> "Graph":
        """A deep copy of the structure; constant arrays are shared (treat them as immutable)."""
        from .printer import clone_graph
        return clone_graph(self)

    def verify(self) -> None:
        from .verifier import verify
        verify(self)

    def __str__(self) -> str:
        from .printer import print_graph
        return print_graph(self)
