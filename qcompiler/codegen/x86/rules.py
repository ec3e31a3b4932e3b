"""The CPU schedule rules (x86, and arm, which shares them: :mod:`..arm.rules`), in order.

* ``sparse``: a sparse kernel's sparse stage is scheduled by construction (its loops are written
  by :mod:`..kernels.sparse`); its X stage and epilogue ("xcol", "out") get a parallel outer /
  vectorized inner loop nest. Nothing is inlined: the extern stage declares no reads.
* ``hand``: every other kernel gets the hand schedule its builder named
  (:func:`.schedules.apply`; an unknown or failing one falls back to ``generic``).
"""
from __future__ import annotations


from ..schedule import Kernel, Rule, sparse_stages
from ..target import TargetSpec
from . import schedules


def _sparse(k: Kernel, spec: TargetSpec):
    staged = sparse_stages(k)
    if staged is None:
        return None
    sch, blocks = staged
    for blk in blocks:
        schedules._spatial_nest(sch, blk, k.vw)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _hand(k: Kernel, spec: TargetSpec):
    return schedules.apply(k.func, k.kind, k.params, k.vw, spec.host_tvm.get("mcpu"))


SPARSE = Rule("sparse", _sparse)
RULES = (SPARSE, Rule("hand", _hand))
