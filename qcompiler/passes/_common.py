"""Helpers shared by the built-in passes (this module registers no pass).

* use checks: :func:`is_output`, :func:`single_use`, :func:`can_forward`;
* :func:`full_attrs`: a new op's attributes spelled out from the op registry's defaults, as the
  importer writes them (the IR's normalized form);
* :func:`pass_options`: a pass's typed options from the :class:`PassContext`;
* :func:`both_orders`: the two rewrite rules for a commutative op, ``kind(a, b)`` and ``kind(b, a)``;
* the activation vocabulary shared by fuse-act, expand-fused and relu6-to-relu:
  :func:`activation_of` reads a standalone activation op as ``(name, params)`` in the form of the
  FusedConv/FusedGemm ``activation``/``activation_params`` attributes, and :func:`make_activation`
  builds the standalone op back.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from ..ir.graph import Graph, Op, Value
from ..ir.ops import ACTIVATIONS, REGISTRY

T = TypeVar("T")


def is_output(v: Value) -> bool:
    return v.graph is not None and any(o is v for o in v.graph.outputs)


def single_use(v: Value) -> bool:
    """``v`` feeds exactly one operand slot and is not a graph output."""
    return len(v.uses) == 1 and not is_output(v)


def can_forward(old: Value, new: Value) -> bool:
    """Whether every use of ``old`` may be redirected to the existing value ``new`` while the
    model keeps its output names: a graph output can only be taken over by an op result that is
    not an output already (graph inputs and constants cannot be renamed to the output's name)."""
    if not is_output(old):
        return True
    return new.producer is not None and not is_output(new)


def full_attrs(kind: str, **attrs: Any) -> dict[str, Any]:
    """The registry's defaults for ``kind`` overridden by ``attrs``: every attribute spelled out."""
    return {**REGISTRY[kind].defaults, **attrs}


def pass_options(ctx, name: str, cls: type[T]) -> T:
    """The options of pass ``name`` from ``ctx`` as an instance of the dataclass ``cls``: given as
    an instance, as a dict of field values, or absent (the defaults)."""
    got = ctx.option(name) if ctx is not None else None
    if got is None:
        return cls()
    if isinstance(got, cls):
        return got
    if isinstance(got, dict):
        known = {f.name for f in fields(cls)}
        bad = sorted(set(got) - known)
        if bad:
            raise ValueError(f"pass '{name}': unknown option(s) {', '.join(bad)} (known: {', '.join(sorted(known))})")
        return cls(**got)
    raise TypeError(f"pass '{name}': options must be a {cls.__name__} or a dict, got {type(got).__name__}")


def both_orders(kind: str, a, b, fn) -> list:
    """Rewrite rules matching ``kind(a, b)`` and ``kind(b, a)`` (patterns a and b) with one ``fn``."""
    from .rewrite import Op
    return [(Op(kind, a, b), fn), (Op(kind, b, a), fn)]


# ---- activations ----------------------------------------------------------------------------------
ACTIVATION_KINDS = tuple(a for a in ACTIVATIONS if a)
_PARAMS = {"Clip": ("min", "max"), "LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta")}


def activation_of(op: Op) -> tuple[str, list[float]] | None:
    """``(activation, activation_params)`` for a standalone activation op, else None."""
    if op.kind not in ACTIVATION_KINDS or len(op.operands) != 1:
        return None
    attrs = full_attrs(op.kind, **op.attrs)
    return op.kind, [float(attrs[k]) for k in _PARAMS.get(op.kind, ())]


def make_activation(graph: Graph, activation: str, params, x: Value, *, name: str = "",
                    after: Op | None = None, before: Op | None = None) -> Op:
    """Create the standalone op for a fused ``activation`` with ``params`` applied to ``x``."""
    if activation not in ACTIVATION_KINDS:
        raise ValueError(f"unknown activation '{activation}' (known: {', '.join(ACTIVATION_KINDS)})")
    keys = _PARAMS.get(activation, ())
    if len(params) != len(keys):
        raise ValueError(f"{activation} takes {len(keys)} activation_params, got {list(params)}")
    attrs = full_attrs(activation, **{k: float(p) for k, p in zip(keys, params)})
    return graph.create_op(activation, [x], attrs, name=name or activation.lower(), after=after, before=before)
