"""What the CPU targets' integer dot-product intrinsics share: the accumulator scope, the
description of a dot product (:class:`DotIsa`) and the pattern the intrinsics replace.

The intrinsics themselves are per target (:mod:`.x86.intrin`: vpdpbusd / vpmaddwd; :mod:`.arm.intrin`:
sdot); :mod:`.isa` says which one a target has and names its intrinsic.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm.script import tirx as T

ACC_SCOPE = "global"
"""Storage scope of the CPU kernels' register-tile accumulators (the schedules' ``cache_write``, the
intrinsics' C buffer, the sparse kernels' tiles): ``global``, as TVM's own x86 conv schedules
(topi ``cache_write(C, "global")``), not ``local``. TVM's LowerTVMBuiltin keeps a CPU allocation
on the stack only when it is ``global`` and of constant size under 1 KB (runtime::kMaxStackAlloca);
any other becomes a TVMBackendAllocWorkspace / TVMBackendFreeWorkspace pair, and inside a
parallel loop that pair runs on every iteration (a 7 x 8 int32 tile: 896 times per call of
fashion_mobilenet's 16->64 1x1 conv at batch 8). With ``local`` tiles those calls were ~14 % of
the batch-8 int8 model's samples (``perf``); ``global``: 1720 -> 1227 us (int8) and 1291 -> 976 us
(fp32) on a 2-vCPU Zen 1, 2 threads, the same outputs. An accumulator of 1 KB or more (AVX-512's
28 x 16-lane tiles) still takes the workspace path. The A word of the intrinsics below is written
inline, not bound to a name: TVMScript made such a name a 4-byte ``local`` buffer of its own."""


@dataclass(frozen=True)
class DotIsa:
    """The integer dot product a target gets: ``kind`` is "vnni" (u8 x s8, groups of 4),
    "pmaddwd" (s16 x s16, groups of 2) or, on arm, "sdot" (s8 x s8, groups of 4); ``lanes`` the
    widest int32 vector (16 or 8 on x86, 4 for sdot)."""
    kind: str
    lanes: int

    @property
    def group(self) -> int:
        return 2 if self.kind == "pmaddwd" else 4

    @property
    def a_dtype(self) -> str:
        return {"vnni": "uint8", "sdot": "int8"}.get(self.kind, "int16")

    @property
    def b_dtype(self) -> str:
        return "int8"            # pmaddwd: stored int8, sign-extended to int16 as it is loaded

    def lanes_for(self, n: int) -> int:
        """The widest lane count (lanes, lanes/2, lanes/4 >= 4) dividing ``n``, or 0."""
        lanes = self.lanes
        while lanes >= 4:
            if n % lanes == 0:
                return lanes
            lanes //= 2
        return 0

    def __str__(self):
        return f"{self.kind}x{self.lanes}"


def dot_desc(k: int, lanes: int, adt: str, bdt: str, scope: str):
    """The pattern every dot-product intrinsic of :mod:`.x86.intrin` and :mod:`.arm.intrin` replaces:
    ``C[i] += Σ_{j<k} A[j] · B[i, j]`` over ``lanes`` int32 accumulators in ``scope``."""
    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((k,), adt, offset_factor=1),
             B: T.Buffer((lanes, k), bdt, offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1, scope=scope)) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:k], B[0:lanes, 0:k])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for j in T.serial(0, k):
                    with T.sblock("update"):
                        vi, vj = T.axis.remap("SR", [i, j])
                        C[vi] = C[vi] + T.cast(A[vj], "int32") * T.cast(B[vi, vj], "int32")
    return desc
