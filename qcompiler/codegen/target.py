"""Compilation targets: what ``--target``, ``--cpu``, ``--arch`` and ``--dtype`` select.

A :class:`TargetSpec` names the family (:class:`Family`: x86, arm, cuda) and turns into the TVM
target JSON dict (TVM 0.27 accepts dicts only). It is validated once, when it is made.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field

from ..errors import UserError


class Family(str, enum.Enum):
    """A target family. A ``str``: it compares, hashes, formats and serializes (JSON, manifests)
    as its value, so ``Family.X86 == "x86"``."""
    X86 = "x86"
    ARM = "arm"
    CUDA = "cuda"

    def __str__(self) -> str:
        return self.value


FAMILIES = tuple(f.value for f in Family)

# LLVM's own full-unroll budget at O3 (300) doubled the code of the loops our schedules leave
# rolled on purpose (epilogue write-backs, padding fills, depthwise taps), for no measured speed:
# the O2 budget (150) keeps O3's other passes. The kernels' hot loops are unrolled explicitly in
# TIR by the schedules (:mod:`.x86.schedules`), which this budget does not touch. rapidocr-det int8
# model.so -37 KB, rapidocr-cls -28 KB; rapidocr-cls int8 latency within the noise (0.999 vs
# 1.046 ms, interleaved medians; 2026-11-23).
LLVM_OPTIONS = ("-unroll-threshold-aggressive:uint=150",)
DTYPES = ("fp32", "fp16", "bf16", "int8", "fp8")
QUANTIZED_DTYPES = ("int8", "fp8")
"""The ``--dtype`` values that quantize (the quantize pass, or fold-qdq for a pre-quantized model);
what a build report or a layer record calls a quantized precision."""
FP8_FORMATS = ("e4m3", "e5m2")
FP8_MIN_SM = 89
"""The oldest CUDA SM with float8 tensor cores (PTX ``mma.sync...m16n8k32...e4m3/e5m2``: sm_89+)."""
X86_LEVELS = ("znver3", "x86-64-v3", "x86-64-v4", "znver4", "icelake-server")
"""The x86 CPUs (``--cpu``) whose generated code the test suite checks on any host, one per int8
dot-product path: an AVX2-only core and the portable AVX2 level (vpmaddwd on ymm), AVX-512
without VNNI (vpmaddwd on zmm), and AMD's and Intel's AVX-512 VNNI cores (vpdpbusd on zmm)."""


@dataclass(frozen=True)
class TargetSpec:
    family: Family = Family.X86              # x86 | arm | cuda (a str is taken and normalised)
    dtype: str = "fp32"                      # fp32 | fp16 | bf16 | int8 | fp8
    cpu: str | None = None                   # LLVM -mcpu: "znver3", "cortex-a76"; None = host (x86) / generic (arm)
    arch: tuple[str, ...] = ("sm_90",)       # CUDA SM architectures to embed device code for
    features: tuple[str, ...] = field(default_factory=tuple)   # LLVM mattr, e.g. ("+dotprod", "+fullfp16")
    num_threads: int | None = None
    float_dtype: str = "fp32"                # storage of the float layers of an int8 build: fp32 | fp16
    debug_layers: bool = False               # int8 x86/arm: add the per-layer functions of `qcompile verify`
    fp8_format: str = "e4m3"                 # dtype fp8: e4m3 (OCP E4M3FN) | e5m2 (qcompiler.quant.fp8)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise UserError(f"unknown target '{self.family}'", "--target", f"use one of {', '.join(FAMILIES)}")
        object.__setattr__(self, "family", Family(self.family))
        if self.dtype not in DTYPES:
            raise UserError(f"unknown dtype '{self.dtype}'", "--dtype", f"use one of {', '.join(DTYPES)}")
        if self.dtype == "bf16" and self.family is not Family.CUDA:
            raise UserError("bf16 is supported on CUDA only", "--dtype", "use fp16 or fp32 on CPU targets")
        if self.fp8_format not in FP8_FORMATS:
            raise UserError(f"unknown fp8 format '{self.fp8_format}'", "--fp8-format", f"use one of {', '.join(FP8_FORMATS)}")
        if self.float_dtype not in ("fp32", "fp16"):
            raise UserError(f"unknown float dtype '{self.float_dtype}'", "--float-dtype", "use fp32 or fp16")
        for a in self.arch:
            if not (a.startswith("sm_") and a[3:].isdigit()):
                raise UserError(f"bad CUDA arch '{a}'", "--arch", "write it like sm_87 or sm_90")
        if self.dtype == "fp8" and self.family is Family.CUDA:
            old = [a for a in self.arch if int(a[3:]) < FP8_MIN_SM]
            if old:
                raise UserError(f"--dtype fp8 on cuda runs on float8 tensor cores (mma .e4m3/.e5m2), which {old[0]} "
                                f"lacks", "--arch", f"use sm_{FP8_MIN_SM} or newer (sm_89 Ada, sm_90 Hopper), or "
                                "--dtype int8/fp16 for older GPUs")

    @property
    def host_tvm(self) -> dict:
        """The LLVM target of the machine that runs the host code."""
        if self.family is Family.ARM:
            d = {"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                 "mattr": ["+neon", *[f for f in self.features if f != "+neon"]], "cl-opt": list(LLVM_OPTIONS)}
            if self.cpu:
                d["mcpu"] = self.cpu
            return d
        d = {"kind": "llvm", "cl-opt": list(LLVM_OPTIONS)}
        if self.cpu:
            d["mcpu"] = self.cpu
        elif self.family is Family.X86:
            d["mcpu"] = host_cpu()
        if self.family is Family.X86 and self.features:
            d["mattr"] = list(self.features)
        return d

    @property
    def tvm(self) -> dict:
        """The TVM target dict for kernels."""
        if self.family is Family.CUDA:
            # generate code for the oldest SM asked for: nvcc then builds it for every SM in arch
            oldest = min(self.arch, key=lambda a: int(a[3:]))
            # limits every sm_70+ part has: dlight sizes its tiles from these (48 KB is the static
            # shared memory a block gets without the dynamic opt-in)
            return {"kind": "cuda", "arch": oldest, "max_shared_memory_per_block": 49152,
                    "max_threads_per_block": 1024, "thread_warp_size": 32, "host": self.host_tvm}
        return self.host_tvm


def vector_width(spec: TargetSpec) -> int:
    """float32 lanes of the widest vector unit of the target CPU."""
    cpu = (spec.cpu or spec.host_tvm.get("mcpu", "") or "").lower()
    feats = " ".join(spec.features).lower()
    if spec.family is Family.CUDA:
        return 1                  # plain NCHW (blocks of 1): GPU threads map to elements, not lanes
    if spec.family is not Family.X86:
        return 4
    if "-avx512f" in feats:
        return 8
    if "+avx512f" in feats:
        return 16
    avx512 = ("skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake", "tigerlake",
              "rocketlake", "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5",
              "alderlake-avx512", "x86-64-v4", "knl", "knm")
    return 16 if any(cpu.startswith(p) for p in avx512) else 8


def host_cpu() -> str:
    """LLVM's name for this machine's CPU (e.g. znver3), what a build without ``--cpu`` targets.
    ``QCOMPILER_HOST_CPU`` names another (a CPU whose code this machine runs): the test suite run
    with ``QCOMPILER_HOST_CPU=x86-64-v3`` on an AVX-512 host builds and runs as an AVX2 host would."""
    override = os.environ.get("QCOMPILER_HOST_CPU", "").strip()
    if override:
        return override
    import tvm
    f = tvm.get_global_func("codegen.llvm_get_system_cpu", allow_missing=True) if hasattr(tvm, "get_global_func") else None
    if f is not None:
        return str(f())
    import tvm_ffi
    f = tvm_ffi.get_global_func("target.llvm_get_system_cpu", allow_missing=True)
    return str(f()) if f is not None else "generic"
