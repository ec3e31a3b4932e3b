"""The CUDA schedule rules, in order. The kernels none of them takes are left unscheduled, and
``tvm.compile``'s CUDA pipeline (dlight's Matmul/GEMV/Reduction/GeneralReduction/Fallback rules)
binds them to GPU threads.

* ``sparse``: a sparse kernel's sparse stage binds its own threads (:mod:`..kernels.sparse`); its
  X stage and epilogue ("xcol", "out") get one thread per element.
* ``wmma-int8``: int8 implicit GEMMs on tensor cores (:mod:`.wmma`; dlight's own int8 rule does
  not build in TVM 0.27).
* ``mma-fp8``: float8 implicit GEMMs on float8 tensor cores, sm_89+ (:mod:`.mma`).
* ``direct``: reductions over a small window (depthwise convs, pooling), one thread per output
  (:mod:`.direct`).

:data:`BY_CONSTRUCTION` is the table of a lowering without GPU schedules (``lower(...,
gpu_schedules=False)``: the module also compiles for a CPU), whose sparse kernels keep theirs.
"""
from __future__ import annotations

import functools

import tvm

from ..kernels.sparse import CUDA_THREADS
from ..schedule import Kernel, Rule, sparse_stages
from ..target import TargetSpec
from . import direct, mma, wmma


@functools.lru_cache(maxsize=None)
def _target(spec: TargetSpec) -> tvm.target.Target:
    return tvm.target.Target(spec.tvm)


def _sparse(k: Kernel, spec: TargetSpec):
    staged = sparse_stages(k)
    if staged is None:
        return None
    sch, blocks = staged
    for blk in blocks:
        loops = sch.get_loops(blk)
        f = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        bx, tx = sch.split(f, [None, CUDA_THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _wmma_int8(k: Kernel, spec: TargetSpec):
    return wmma.schedule_int8(k.func, _target(spec), k.params.get("fetch_vector", 4))


def _mma_fp8(k: Kernel, spec: TargetSpec):
    return mma.schedule_fp8(k.func, _target(spec), k.params.get("fetch", (4, 4)))


def _direct(k: Kernel, spec: TargetSpec):
    return direct.schedule(k.func, _target(spec))


SPARSE = Rule("sparse", _sparse)
RULES = (SPARSE, Rule("wmma-int8", _wmma_int8), Rule("mma-fp8", _mma_fp8), Rule("direct", _direct))
BY_CONSTRUCTION = (SPARSE,)
