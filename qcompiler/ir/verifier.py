"""The IR verifier: cheap structural and type checks, run after every pass in tests.

Checks: every operand is defined before use (SSA, topological order), use lists match operands,
names are unique, constants agree with their types, quant params fit their shapes, and each op of a
registered kind has the result types its operands and attributes imply. Every message names the op.
"""
from __future__ import annotations

import numpy as np

from .graph import Graph, IRError
from .ops import REGISTRY, InferError, infer_types
from .types import INT4, INT_RANGES, np_dtype


class _Where:
    """``op <describe>``, built when an error message formats it (most ops have none)."""
    __slots__ = ("op",)

    def __init__(self, op):
        self.op = op

    def __format__(self, spec: str) -> str:
        return format(f"op {self.op.describe()}", spec)

    def __str__(self) -> str:
        return format(self, "")


def verify(g: Graph) -> None:
    errors = collect_errors(g, first_only=True)
    if errors:
        raise IRError(errors[0])


def collect_errors(g: Graph, first_only: bool = False) -> list[str]:
    errs: list[str] = []

    def err(msg: str) -> bool:
        errs.append(msg)
        return first_only

    defined: set[int] = set()
    names: set[str] = set()
    for v in g.inputs:
        if v.is_const or v.producer is not None:
            if err(f"graph input %{v.name} is not a plain input"):
                return errs
        defined.add(id(v))
        names.add(v.name)
    for v in g.consts.values():
        if v.data is None:
            if err(f"constant %{v.name} has no data"):
                return errs
            continue
        if tuple(v.data.shape) != v.type.shape or v.data.dtype != np_dtype(v.type.dtype):
            if err(f"constant %{v.name}: data {v.data.dtype}{list(v.data.shape)} does not match type {v.type}"):
                return errs
        elif v.type.dtype in INT4 and v.data.size and not (
                INT_RANGES[v.type.dtype][0] <= int(v.data.min()) and int(v.data.max()) <= INT_RANGES[v.type.dtype][1]):
            if err(f"constant %{v.name}: {v.type.dtype} data outside {list(INT_RANGES[v.type.dtype])}"):
                return errs
        if v.name in names and err(f"value name %{v.name} defined twice"):
            return errs
        names.add(v.name)
        defined.add(id(v))
    for op in g.ops:
        where = _Where(op)                # formatted only when a message is
        d = REGISTRY.get(op.kind)
        if op.graph is not g and err(f"{where} does not belong to graph '{g.name}'"):
            return errs
        for i, v in enumerate(op._operands):
            if id(v) not in defined:
                state = "erased" if v.graph is None else "defined later (not in topological order)"
                if err(f"{where}: operand {i} %{v.name} is not defined before use ({state})"):
                    return errs
            # O(1): uses is a UseList (a scan of a list was O(n^2) over a constant shared by n ops)
            if (op, i) not in v.uses and err(f"{where}: operand {i} %{v.name} is missing from its use list"):
                return errs
        if not op.results and err(f"{where} has no results"):
            return errs
        for r in op.results:
            if r.producer is not op and err(f"{where}: result %{r.name} names another producer"):
                return errs
            if r.name in names and err(f"{where}: value name %{r.name} defined twice"):
                return errs
            names.add(r.name)
            qr = d is not None and (d.quantized_result({**d.defaults, **op.attrs}) if callable(d.quantized_result)
                                    else d.quantized_result)
            if qr and r.type.quant is None and err(
                    f"{where}: result %{r.name} must have a quantized type, got {r.type}"):
                return errs
            if r.type.quant is not None:
                msg = r.type.quant.check_shape(r.type.shape)
                if msg and err(f"{where}: result %{r.name}: {msg}"):
                    return errs
        if d is not None and d.infer is not None:
            try:
                expect = infer_types(op.kind, [v.type for v in op._operands], op.attrs)
            except (InferError, KeyError, TypeError, IndexError, ValueError) as e:
                if err(f"{where}: {e}"):
                    return errs
            else:
                if len(expect) != len(op.results):
                    if err(f"{where}: has {len(op.results)} results, expected {len(expect)}"):
                        return errs
                for r, t in zip(op.results, expect):
                    if r.type.shape != t.shape and err(
                            f"{where}: result %{r.name} has shape {list(r.type.shape)}, operands imply {list(t.shape)}"):
                        return errs
                    if r.type.quant is None and r.type.dtype != t.dtype and err(
                            f"{where}: result %{r.name} has dtype {r.type.dtype}, operands imply {t.dtype}"):
                        return errs
        for r in op.results:
            defined.add(id(r))
    for v in list(g.values()):
        for op, i in v.uses:
            if op.graph is not g or i >= len(op._operands) or op._operands[i] is not v:
                if err(f"value %{v.name}: dangling use by {op.describe()} (operand {i})"):
                    return errs
    for v in g.outputs:
        if id(v) not in defined and err(f"graph output %{v.name} is not defined"):
            return errs
    if len({v.name for v in g.outputs}) != len(g.outputs):
        err("duplicate graph output names")
    return errs


def check_finite_consts(g: Graph) -> list[str]:
    """Names of float constants holding NaN or Inf."""
    bad = []
    for v in g.consts.values():
        if v.data.dtype.kind == "f" and not np.isfinite(v.data).all():
            bad.append(v.name)
    return bad
