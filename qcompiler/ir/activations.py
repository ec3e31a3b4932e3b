"""The activation vocabulary of the fused ops, shared by fuse-act, expand-fused, relu6-to-relu, the
quantize pass and the QDQ export: :func:`activation_of` reads a standalone activation op as
``(name, params)`` in the form of the FusedConv/FusedGemm ``activation``/``activation_params``
attributes (see :mod:`.ops`), and :func:`make_activation` builds the standalone op back.

    activation_of(op)                                   # ("Clip", [0.0, 6.0]) for Clip{min=0, max=6}
    make_activation(graph, "Clip", [0.0, 6.0], x, before=op)
"""
from __future__ import annotations

from .graph import Graph, Op, Value
from .ops import ACTIVATIONS, full_attrs

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
