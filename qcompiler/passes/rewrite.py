"""Pattern-matching rewrites: a table of ``(pattern, fn)`` rules and one driver.

Patterns describe a tree of ops rooted at the op to replace::

    from qcompiler.passes.rewrite import Op, Any, Const, rewrite

    # HardSigmoid(x) with alpha = 1/6, beta = 0.5  ==  Clip(x / 6 + 0.5, 0, 1)
    RULES = [
        (Op("HardSigmoid", Any("x"), name="hs"), hard_sigmoid_to_clip),
    ]

    def hard_sigmoid_to_clip(g, m):
        ...build new ops before m["hs"] with g.create_op(..., before=m["hs"])...
        return new_value          # or None to decline

``fn(graph, match)`` receives the graph and the match (pattern names -> Op or Value; ``match.root``
is the root op) and returns the value(s) replacing the root's results, or None to decline. The
driver :func:`rewrite` visits ops in topological order, applies the first rule that matches and
does not decline, replaces the root, erases ops that became dead, and repeats until nothing fires.
``explain=True`` on a pattern logs, through the driver's ``trace`` list, why a candidate root did
not match (the onnx-graphsurgeon habit of saying why).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any as _Any, Callable, Sequence

from ..ir.graph import Graph, Op as IROp, Value


class Pattern:
    name: str | None = None

    def match(self, v: Value, m: "Match") -> bool:
        raise NotImplementedError


@dataclass
class Match:
    root: IROp | None = None
    bound: dict[str, _Any] = field(default_factory=dict)
    why: str = ""
    ops: list = field(default_factory=list)     # every op the pattern matched, named or not

    def __getitem__(self, k: str):
        return self.bound[k]

    def __contains__(self, k: str) -> bool:
        return k in self.bound

    def get(self, k, default=None):
        return self.bound.get(k, default)

    def bind(self, name: str | None, obj) -> bool:
        if name is None:
            return True
        if name in self.bound and self.bound[name] is not obj:
            self.why = f"'{name}' bound to two different things"
            return False
        self.bound[name] = obj
        return True


class Any(Pattern):
    """Any value."""

    def __init__(self, name: str | None = None):
        self.name = name

    def match(self, v, m):
        return m.bind(self.name, v)


class Const(Pattern):
    """A constant value (a weight); ``where(array) -> bool`` may restrict it."""

    def __init__(self, name: str | None = None, where: Callable | None = None):
        self.name, self.where = name, where

    def match(self, v, m):
        if not v.is_const:
            m.why = f"%{v.name} is not a constant"
            return False
        if self.where is not None and not self.where(v.data):
            m.why = f"constant %{v.name} fails its condition"
            return False
        return m.bind(self.name, v)


class Op(Pattern):
    """An op of ``kind`` (a name or tuple of names) whose operands match ``operands``.

    ``single_use``: the op's result feeds only this pattern (so replacing it does not duplicate
    work). ``where(op) -> bool`` adds a condition. ``variadic``: operands beyond the patterns given
    are allowed (e.g. Conv with or without bias)."""

    def __init__(self, kind: str | Sequence[str], *operands: Pattern, name: str | None = None,
                 single_use: bool = False, where: Callable[[IROp], bool] | None = None,
                 variadic: bool = False):
        self.kinds = (kind,) if isinstance(kind, str) else tuple(kind)
        self.operands, self.name = operands, name
        self.single_use, self.where, self.variadic = single_use, where, variadic

    def match(self, v, m):
        op = v.producer
        if op is None:
            m.why = f"%{v.name} has no producer"
            return False
        return self.match_op(op, m, v)

    def match_op(self, op: IROp, m: Match, via: Value | None = None) -> bool:
        if op.kind not in self.kinds:
            m.why = f"{op.describe()} is not {'/'.join(self.kinds)}"
            return False
        if self.single_use and via is not None and len(via.uses) + sum(o is via for o in (op.graph.outputs if op.graph else [])) > 1:
            m.why = f"%{via.name} has more than one use"
            return False
        n = len(self.operands)
        if len(op.operands) < n or (len(op.operands) > n and not self.variadic):
            m.why = f"{op.describe()} has {len(op.operands)} operands, pattern wants {n}"
            return False
        for p, v in zip(self.operands, op.operands):
            if not p.match(v, m):
                return False
        if self.where is not None and not self.where(op):
            m.why = f"{op.describe()} fails its condition"
            return False
        if not m.bind(self.name, op):
            return False
        m.ops.append(op)
        return True


Rule = tuple[Op, Callable[[Graph, Match], _Any]]


def match(pattern: Op, op: IROp) -> Match | None:
    """Match ``pattern`` rooted at ``op``; None when it does not match."""
    m = Match(root=op)
    return m if pattern.match_op(op, m) else None


def _erase_dead(g: Graph, ops: list[IROp]) -> None:
    """Erase ops (and, transitively, their producers among ``ops``) whose results are unused."""
    pending = [o for o in ops if o.graph is g]
    changed = True
    while changed:
        changed = False
        for o in list(pending):
            if o.graph is g and all(not r.uses and not any(r is x for x in g.outputs) for r in o.results):
                g.erase_op(o)
                pending.remove(o)
                changed = True


def rewrite(graph: Graph, rules: Sequence[Rule], *, max_iters: int = 100,
            trace: list | None = None) -> bool:
    """Apply ``rules`` until none fires; return whether the graph changed."""
    changed_any = False
    # the rules whose root pattern can match an op of each kind, in table order: a sweep tries an
    # op against those only (the others fail on the kind at once), not against the whole table
    # (a root pattern without ``kinds``, e.g. a custom Pattern, is tried on every op)
    rules = list(rules)
    by_kind: dict[str, list[Rule]] | None = None
    if all(isinstance(getattr(r[0], "kinds", None), tuple) for r in rules):
        by_kind = {k: [] for r in rules for k in r[0].kinds}
        for k, lst in by_kind.items():
            lst.extend(r for r in rules if k in r[0].kinds)
    for _ in range(max_iters):
        changed = False
        for op in graph.ops:
            if op.graph is not graph:
                continue                      # erased by an earlier rewrite in this sweep
            for pattern, fn in (rules if by_kind is None else by_kind.get(op.kind, ())):
                m = match(pattern, op)
                if m is None:
                    if trace is not None and op.kind in pattern.kinds:
                        trace.append(("no-match", op.name, m_why(pattern, op)))
                    continue
                new = fn(graph, m)
                if new is None:
                    continue
                new = [new] if isinstance(new, Value) else list(new)
                matched_ops = list(m.ops)
                graph.replace_op(op, new)
                _erase_dead(graph, [o for o in matched_ops if o is not op])
                if trace is not None:
                    trace.append(("fired", op.name, getattr(fn, "__name__", "rule")))
                changed = True
                break
        changed_any |= changed
        if not changed:
            return changed_any
    raise RuntimeError(f"rewrite did not converge after {max_iters} sweeps")


def m_why(pattern: Op, op: IROp) -> str:
    m = Match(root=op)
    pattern.match_op(op, m)
    return m.why
