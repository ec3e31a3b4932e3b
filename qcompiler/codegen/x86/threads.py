"""When a kernel runs on the thread pool: an estimate of its single-thread time against the cost of
a thread launch, decided once per kernel (:func:`thread_rule`) and asked by the schedules of
:mod:`.schedules` for each loop they would parallelize (:func:`parallel`, :func:`pays_alone`).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

# Thread launches: a kernel runs on the thread pool only when its estimated single-thread time is
# at least PAR_MIN_NS. A parallel launch costs the wake-up of the worker threads: measured on the
# 2-core x86 host (TVM_NUM_THREADS=2, idle workers not spinning, as bench/bench_int8.py runs) a
# parallel loop of 16 elements takes 6.2 us against 0.03 us serial, and a 64 K-element elementwise
# kernel 41 us against 8.8 us serial while the other core is busy (the worker waits for it). The
# estimate (:func:`serial_ns`) is per loop iteration of each block: MAC_NS for a reduction
# (conv/gemm/pool multiply-accumulates; 1-thread rates of the real models' conv kernels are 12-30
# MAC/ns in fp32 and int8 alike, the int8 ones bound by their requantization epilogue), ELEM_NS for
# a spatial block (packing, epilogues, elementwise). The same rule holds for every precision, with
# the multiply-accumulates of an int32 sum of 8-bit products (the VNNI / pmaddwd dot-product convs
# and gemms) at INT8_MAC_NS: rapidocr-cls's stem conv (3 -> 8 channels, 3x3 s2, 24x96), whose input
# channels vpdpbusd pads to 4, summed 663 K int8 MACs in 30 us serial against 497 K fp32 MACs in
# 34 us (1.5x the rate); at MAC_NS it was estimated 47 us and ran parallel, 120 us at 2 threads
# with the other core busy, while the fp32 build kept it serial. The int8 rate is 3x MAC_NS
# (60 MAC/ns): the dot-product convs of the digit models run at 51-78 MAC/ns on one Zen 3 core
# with AVX2 vpmaddwd (their requantization epilogue counted apart at ELEM_NS per output), the VNNI
# ones at ~170; at 1.5x uspsnet's 32->64 3x3 conv at 8x8 (1.2 M MACs, 19 us serial) was
# estimated 41 us and ran parallel, the whole model 35.3 us at 2 threads against 30.2 us serial.
# The 16 int16 gemms of a Winograd conv (block "wgemm", :mod:`.qwinograd`) count at
# WINO_MAC_NS (30 MAC/ns): vpmaddwd like the direct int8 convs, but with short reductions and small
# register tiles (4-7 tile columns), and their transforms around them. mnistnet's 32->64 conv at
# 14x14 (1.6 M gemm MACs) at INT8_MAC_NS was estimated 36 us and ran serial: 195 us for the model
# at 2 threads on a 2-core AMD EPYC (Zen 1) against 150 us with it parallel; uspsnet's (0.5 M) is
# the same either way (68.8 / 69.0 us) and stays serial.
PAR_MIN_NS = float(os.environ.get("QC_PAR_MIN_NS", "40000"))
MAC_NS, ELEM_NS = 1 / 20, 0.25
INT8_MAC_NS = MAC_NS / 3
WINO_MAC_NS = MAC_NS / 1.5
# The rates above are one Zen 3 core's. A core that runs every 256-bit AVX2 instruction as two
# 128-bit halves, AMD Zen 1 / Zen+ (LLVM's -mcpu znver1; ~2 GHz in the 2-vCPU EPYC we measured),
# takes about twice as long for the same kernel (its vpmaddwd peak is 19 GMAC/s against Zen 3's
# 38, bench/x86_avx2_peak.c), while a thread launch costs no less: there the estimates are
# doubled. Measured on that host, 2 threads, interleaved A/B of the int8 artifacts (threshold 40 ->
# 20 us, which is the same decisions): svhnnet 812 -> 777 us (its 3 -> 32 stem conv, estimated 20
# us, takes 92 us serial), uspsnet 75.0 -> 64.5, rapidocr-cls 1853 -> 1603, mnistnet and
# fashion_mobilenet unchanged; fp32 builds unchanged or faster (svhnnet 1386 -> 1319 us).
SLOW_CORE_SCALE = {"znver1": 2.0}
_serial = False                # set by thread_rule() for the kernel being scheduled
_scale = 1.0                   # set by thread_rule(): SLOW_CORE_SCALE of the target CPU


def serial_ns(sch) -> float:
    """Estimated single-thread time of the kernel (ns): see PAR_MIN_NS."""
    total = 0.0
    try:
        root = sch.get_sblock("root")
    except Exception:  # noqa: BLE001
        root = None
    for blk in sch.get_child_blocks(root) if root is not None else []:
        n = 1
        for iv in sch.get(blk).iter_vars:
            n *= int(iv.dom.extent)
        if not any(int(iv.iter_type) == 2 for iv in sch.get(blk).iter_vars):      # not a reduction
            total += n * ELEM_NS
        else:
            b = sch.get(blk)
            total += n * (WINO_MAC_NS if b.name_hint == "wgemm" else INT8_MAC_NS if is_int8_dot(b) else MAC_NS)
    return total


def is_int8_dot(block) -> bool:
    """An int32 accumulation of products of uint8/int8 values (a dot-product kernel)."""
    return (any(str(w.source.dtype) == "int32" for w in block.writes)
            and any(str(r.source.dtype) in ("uint8", "int8") for r in block.reads))


@contextmanager
def thread_rule(sch, cpu: str | None):
    """Within: the thread rule of the kernel ``sch`` for LLVM CPU ``cpu`` (SLOW_CORE_SCALE) holds;
    after it, the helpers parallelize as asked (the sparse rule of :mod:`.rules` calls them outside)."""
    global _serial, _scale
    _scale = SLOW_CORE_SCALE.get(cpu or "", 1.0)
    try:
        _serial = serial_ns(sch) * _scale < PAR_MIN_NS
    except Exception:  # noqa: BLE001 - no estimate: keep the rules' own parallel loops
        _serial = False
    try:
        yield
    finally:
        _serial = False
        _scale = 1.0


def parallel(sch, loop):
    """``sch.parallel(loop)`` unless the kernel is too small to pay for a thread launch."""
    if not _serial:
        sch.parallel(loop)


def pays_alone(elements: int) -> bool:
    """A spatial stage of ``elements`` at ELEM_NS pays for a thread launch of its own."""
    return elements * ELEM_NS * _scale >= PAR_MIN_NS
