"""TVM's tensor intrinsics (``tvm.s_tir.tensor_intrin``), imported in seconds instead of a minute.

Importing ``tvm.s_tir.tensor_intrin`` parses 248 TVMScript functions (the description and the
implementation of 124 intrinsics, every target's), and TVM 0.27's ``T.prim_func`` calls
``inspect.stack()`` twice for each. ``inspect.stack`` reads
the source line of every frame on the stack, and during an import the stack holds importlib's frozen
frames, for which ``inspect.getmodule`` walks all of ``sys.modules``: 46,000 such walks, 46.7 s for
the import alone on the project's 2-vCPU Zen 1 host -- more than the rest of lowering an int8
ResNet-18 for CUDA. Both the int8 WMMA schedule (:mod:`.cuda.wmma`) and dlight's fp16
tensor-core rule import it, and MetaSchedule's tuning context does too.

The parser reads the frames' locals (closure variables) and the source line of one frame, the
decorated function's caller's caller (``is_defined_in_class`` looks for ``@I.ir_module`` there).
:func:`import_tensor_intrin` imports the package with ``inspect.stack`` answering with every frame
but reading source lines only for the nearest ones: 7.8 s on the same host, the same intrinsics
registered.
"""
from __future__ import annotations

import inspect
import sys
import threading

_SOURCE_FRAMES = 3          # source lines for stack()[1:3]: prim_func's caller and the scope around it
_lock = threading.Lock()


def _stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack(context)`` with ``code_context`` read for frames 1 and 2 only."""
    out, frame = [], sys._getframe(1)
    while frame is not None:
        if 1 <= len(out) < _SOURCE_FRAMES:
            out.append(inspect.FrameInfo(frame, *inspect.getframeinfo(frame, context)))
        else:
            out.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name,
                                         None, None))
        frame = frame.f_back
    return out


def import_tensor_intrin() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (registering TVM's tensor intrinsics) if not yet imported."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    with _lock:
        stack, inspect.stack = inspect.stack, _stack
        try:
            import tvm.s_tir.tensor_intrin  # noqa: F401
        finally:
            inspect.stack = stack
