"""Which integer dot product a target has, and the name of its tensor intrinsic.

:func:`int8_isa` asks the target's own module (:mod:`.x86.intrin`, :mod:`.arm.intrin`), which asks
LLVM about the CPU and features; :func:`dot_intrin` registers (once) and names the intrinsic the
schedules tensorize with.
"""
from __future__ import annotations

from .arm import intrin as arm_intrin
from .intrin import ACC_SCOPE, DotIsa
from .target import Family, TargetSpec
from .x86 import intrin as x86_intrin


def int8_isa(spec: TargetSpec) -> DotIsa | None:
    """The dot-product formulation for ``spec`` (None: plain loops).

    arm: ``sdot`` when the CPU/features have ``dotprod`` (:func:`.arm.intrin.arm_isa`).
    x86: vpdpbusd (VNNI) or vpmaddwd by the CPU's features (:func:`.x86.intrin.x86_isa`)."""
    if spec.family is Family.ARM:
        return arm_intrin.arm_isa(spec)
    return x86_intrin.x86_isa(spec)


def dot_intrin(isa: DotIsa, lanes: int, scope: str = ACC_SCOPE) -> str:
    """The name of ``isa``'s intrinsic over ``lanes`` int32 accumulators in ``scope``."""
    if isa.kind == "sdot":
        return arm_intrin.register(lanes, scope)
    return x86_intrin.intrin(isa.kind, lanes, scope)
