"""Schedule choice as ordered rule tables, in the shape of TVM's dlight.

Each target package has a table (:data:`.x86.rules.RULES`, :data:`.arm.rules.RULES`,
:data:`.cuda.rules.RULES`) of rules, each ``apply(kernel, spec) -> PrimFunc | None``: the scheduled
kernel, or None where the rule does not apply. :func:`apply_rules` tries them in order and the
first that applies wins; where none does, the kernel stays unscheduled (on CUDA, ``tvm.compile``'s
own dlight rules then schedule it)::

    sparse kernel?           -> its CPU / CUDA loop nests        (every target)
    x86, arm:                -> the hand schedule the builder named (``ctx.schedule(kind)``)
    cuda: int8 GEMM?         -> WMMA tensor cores
          float8 GEMM?       -> float8 mma tensor cores (sm_89+)
          small window?      -> one thread per output
          otherwise          -> None: dlight's rules in tvm.compile
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from tvm import tirx

from .target import TargetSpec


@dataclass(frozen=True)
class Kernel:
    """One kernel to schedule: its unscheduled PrimFunc and what its builder said about it."""
    func: tirx.PrimFunc
    kind: str = "generic"                            # the schedule the builder named (ctx.schedule)
    params: dict = field(default_factory=dict)       # that schedule's parameters
    vw: int = 8                                      # float32 lanes of the target's vectors


@dataclass(frozen=True)
class Rule:
    """A named schedule rule: ``fn(kernel, spec)`` returns the scheduled PrimFunc or None."""
    name: str
    fn: Callable[[Kernel, TargetSpec], "tirx.PrimFunc | None"]

    def apply(self, kernel: Kernel, spec: TargetSpec) -> tirx.PrimFunc | None:
        return self.fn(kernel, spec)


SPARSE_STAGES = ("xcol", "out")
"""The loop nests of a sparse kernel a target schedules: the gathered input columns and the output."""


def sparse_stages(kernel: Kernel):
    """(schedule, [block of each of ``SPARSE_STAGES`` the kernel has]) of a ``sparse`` kernel,
    or None for any other kernel: the first steps of every target's sparse rule."""
    if kernel.kind != "sparse":
        return None
    from tvm import s_tir
    sch = s_tir.Schedule(kernel.func)
    blocks = []
    for name in SPARSE_STAGES:
        try:
            blocks.append(sch.get_sblock(name))
        except Exception:  # noqa: BLE001 - the stage is absent (X read in place, no epilogue)
            continue
    return sch, blocks


def apply_rules(rules: Sequence[Rule], kernel: Kernel, spec: TargetSpec) -> tirx.PrimFunc:
    """``kernel`` scheduled by the first rule of ``rules`` that applies; unscheduled if none does."""
    for rule in rules:
        scheduled = rule.apply(kernel, spec)
        if scheduled is not None:
            return scheduled
    return kernel.func
