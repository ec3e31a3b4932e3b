"""The TIR pipeline of ``tvm.compile`` on CPU targets (x86 and arm): TVM's default one, then
:func:`.stack_tiles.stack_tiles` (register tiles stay on the stack) and, unless
``QC_WORK_CLAIMING=0``, :func:`.work_claiming.work_claiming` (threads claim their iterations)."""
from __future__ import annotations

import tvm

from . import work_claiming
from .stack_tiles import stack_tiles

PIPELINE = "qcompiler-cpu"


def _pipeline():
    """TVM's default TIR pipeline, then :func:`.stack_tiles.stack_tiles` and (unless
    ``QC_WORK_CLAIMING=0``) :func:`.work_claiming.work_claiming`."""
    from tvm.s_tir.pipeline import default_s_tir_pipeline
    pipe, finalize_host, finalize_device = default_s_tir_pipeline()
    ours = [stack_tiles, work_claiming.work_claiming] if work_claiming.ENABLED else [stack_tiles]
    return tvm.transform.Sequential([pipe, *ours]), finalize_host, finalize_device


def tir_pipeline() -> str:
    """The name of the TIR pipeline for ``tvm.compile`` on CPU targets (registered on first use)."""
    from tvm.tirx.compilation_pipeline import PIPELINE_MAP, register_tir_pipeline
    if PIPELINE not in PIPELINE_MAP:
        register_tir_pipeline(PIPELINE, _pipeline)
    if work_claiming.ENABLED:
        work_claiming.load_in_process()
    return PIPELINE
