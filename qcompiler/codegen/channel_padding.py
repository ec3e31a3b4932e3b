"""Which convs store padded output channels (the ``pad-channels`` pass, run by :func:`.lower.lower`
on a copy of the graph it lowers for a CPU).

A conv's output is stored NCHW{b}c with ``b`` the widest power of two <= the vector width that
divides its channel count ``K`` (:mod:`.lower`). Where that block is narrower than 4 lanes (the
narrowest SIMD register, and one int8 dot-product group) and the conv's kernel computes a padded
accumulator anyway (:func:`.kernels.conv.padded_channels` for float, :func:`.kernels.qdot.dot_channels`
for int8), the graph stores the padded channels (:mod:`qcompiler.passes.pad_channels`): the write
back is a plain vector store and the readers run on whole vectors. Measured on ShuffleNetV2 x1.0
int8 (58-channel branches, NCHW2c before), see docs/performance.md.

Not for CUDA (plain layouts), and not for a ``--debug-layers`` build, whose stored values are the
IR's own, one for one (``qcompile verify`` reads them by name). ``QC_PAD_CHANNELS=0`` turns it off
(for A/B timings).
"""
from __future__ import annotations

import os
from typing import Callable

from ..ir.graph import Graph, Op
from ..passes import PassContext
from ..passes.pad_channels import PadChannelsOptions, pad_channels, padded_convs
from .isa import int8_isa
from .kernels.conv import padded_channels, pick_block
from .kernels.qdot import dot_channels
from .target import Family, TargetSpec, vector_width

MIN_BLOCK = 4
"""The narrowest block a stored image tensor is worth: one 128-bit float vector, one int8
dot-product group of 4 channels (VNNI, sdot)."""


def stored_channels(spec: TargetSpec) -> Callable[[Op], int]:
    """``channels(op)`` for the pad-channels pass on ``spec``: the padded accumulator's channel
    count where the kernel computes one and the stored block would be narrower than
    :data:`MIN_BLOCK`, else the conv's own ``K``."""
    vw = vector_width(spec)
    isa = int8_isa(spec)

    def channels(op: Op) -> int:
        k = op.results[0].shape[1]
        if pick_block(k, vw) >= MIN_BLOCK:
            return k
        w = op.operands[1]
        if op.kind == "QLinearConv":
            if isa is None or w.dtype != "int8" or op.operands[0].dtype not in ("uint8", "int8"):
                return k
            kp = dot_channels(k, isa)
        else:
            kp = padded_channels(k, vw, w.shape[1] * w.shape[2] * w.shape[3])
        return kp if kp > k and pick_block(kp, vw) >= MIN_BLOCK else k
    return channels


def padded_graph(graph: Graph, spec: TargetSpec) -> Graph:
    """``graph``, or a copy of it whose convs store padded channels (see the module docstring)."""
    if (spec.family is Family.CUDA or spec.debug_layers or vector_width(spec) < MIN_BLOCK
            or os.environ.get("QC_PAD_CHANNELS") == "0"):
        return graph
    channels = stored_channels(spec)
    if not padded_convs(graph, channels):
        return graph
    graph = graph.clone()
    pad_channels(graph, PassContext(options={"pad-channels": PadChannelsOptions(channels)}))
    return graph
