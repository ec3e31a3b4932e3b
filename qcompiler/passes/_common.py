"""Helpers shared by the built-in passes (this module registers no pass).

* use checks: :func:`is_output`, :func:`single_use`, :func:`can_forward`;
* :func:`pass_options`: a pass's typed options from the :class:`PassContext`; :func:`quantize_option`
  and :func:`quantize_calib`: the quantize pass's, for the passes that prepare a model for it;
* :func:`both_orders`: the two rewrite rules for a commutative op, ``kind(a, b)`` and ``kind(b, a)``;
* :data:`CONVS`: the convolution kinds (ONNX ``Conv`` and our ``FusedConv``) the passes rewrite alike.

A new op's attributes spelled out from the registry's defaults: :func:`qcompiler.ir.ops.full_attrs`;
the activation vocabulary (``activation_of``, ``make_activation``): :mod:`qcompiler.ir.activations`.
"""
from __future__ import annotations

from dataclasses import fields
from typing import TypeVar

from ..ir.graph import Value

T = TypeVar("T")

CONVS = ("Conv", "FusedConv")


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


def quantize_option(ctx, name: str, default):
    """Option ``name`` of the quantize pass in ``ctx`` (a QuantizeOptions or a dict), else ``default``."""
    q = ctx.option("quantize") if ctx is not None else None
    return q.get(name, default) if isinstance(q, dict) else getattr(q, name, default)


def quantize_calib(ctx):
    """The quantize pass's calibration feeds, when the pipeline quantizes and they can be read
    twice (a one-shot iterator is left to the quantize pass)."""
    calib = quantize_option(ctx, "calib", None)
    return None if calib is None or iter(calib) is calib else calib
