"""Register tiles stay on the stack, whatever the vector width: no workspace call per iteration.

TVM's ``LowerTVMBuiltin`` keeps a CPU allocation on the stack (an LLVM ``alloca`` in the entry block
of its function, which LLVM then promotes to registers) only when it is ``global``, of constant
size and *under 1 KB* (``runtime::kMaxStackAlloca``); any other becomes a
``TVMBackendAllocWorkspace`` / ``TVMBackendFreeWorkspace`` pair, and inside a parallel loop that
pair runs on every iteration. The kernels' register-tile accumulators (:data:`..intrin.ACC_SCOPE`)
fit under 1 KB with AVX2's ymm tiles (at most 16 registers x 32 bytes), but AVX-512's are up to 28
zmm registers x 64 bytes = 1,792 bytes: on an AVX-512 host every int8 and fp32 conv called the
workspace allocator twice per iteration of its parallel loop (the cost ``ACC_SCOPE`` was chosen to
remove: fashion_mobilenet int8 at batch 8, 1720 against 1227 us on a Zen 1).

The bound that decides it here is the register file, not a size picked for one model: an
allocation of constant size no larger than :data:`REGISTER_FILE_BYTES` (32 vector registers of 64
bytes, AVX-512's; NEON's and AVX2's files are smaller) is a register tile (or a small scratch of
the same order), which a stack frame holds at no risk, and gets TVM's ``disable_lower_builtin``
annotation, which ``LowerTVMBuiltin`` leaves as a plain stack allocation::

    for i in parallel(n):                        for i in parallel(n):
        acc = alloc_buffer((28, 16), int32)          acc = alloc_buffer((28, 16), int32,
        ...                                  ->                   {disable_lower_builtin: True})
                                                     ...

Larger buffers (packed activations, transformed tiles) keep the workspace. The pass runs in the
CPU TIR pipeline (:func:`.pipeline.tir_pipeline`) after TVM's lowering and before the host
finalization; it changes where memory lives, not what is computed.
"""
from __future__ import annotations

import tvm
from tvm import tirx

from .work_claiming import transform_stmts

KMAX_STACK_ALLOCA = 1024          # runtime::kMaxStackAlloca: below it TVM keeps the stack itself
REGISTER_FILE_BYTES = 32 * 64     # AVX-512: 32 zmm registers of 64 bytes
DISABLE = "disable_lower_builtin"


def _bytes(buf: tirx.Buffer) -> int | None:
    """The constant size of ``buf`` in bytes (None: not constant)."""
    n = 1
    for d in buf.shape:
        if not isinstance(d, tirx.IntImm):
            return None
        n *= int(d)
    return n * buf.dtype.bits * buf.dtype.lanes // 8


def is_register_tile(alloc: tirx.AllocBuffer) -> bool:
    """A ``global`` allocation of constant size from 1 KB up to the register file's size."""
    size = _bytes(alloc.buffer)
    return (alloc.buffer.scope() == "global" and size is not None
            and KMAX_STACK_ALLOCA <= size <= REGISTER_FILE_BYTES)


def rewrite(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every register tile (:func:`is_register_tile`) marked to stay on the stack."""
    def post(s):
        if isinstance(s, tirx.AllocBuffer) and is_register_tile(s) and DISABLE not in s.annotations:
            return tirx.AllocBuffer(s.buffer, {**s.annotations, DISABLE: tirx.IntImm("bool", 1)}, s.span)
        return None
    return func.with_body(transform_stmts(func.body, None, post))


@tvm.transform.module_pass(opt_level=0, name="StackTiles")
def stack_tiles(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """:func:`rewrite` every PrimFunc of ``mod``."""
    out = {gv: rewrite(f) if isinstance(f, tirx.PrimFunc) else f for gv, f in mod.functions.items()}
    return tvm.IRModule(out, attrs=mod.attrs) if mod.attrs is not None else tvm.IRModule(out)
