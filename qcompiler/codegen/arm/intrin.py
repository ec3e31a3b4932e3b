"""ARM (aarch64) integer dot-product tensor intrinsic for the int8 kernels, and whether a target has it.

**sdot** (Armv8.2-A dot product, FEAT_DotProd, LLVM feature ``dotprod``; Cortex-A55/A75/A76 and
later, Neoverse N1/V1): ``SDOT Vd.4S, Vn.16B, Vm.16B`` adds, to each of the 4 int32 lanes of Vd,
the 4 products of the corresponding 4 signed bytes of Vn and Vm (Arm ARM, "SDOT (vector)").
Both operands are *signed* int8. That is the 4-lane shape of x86 VNNI's ``vpdpbusd`` with an
int8 instead of a uint8 A operand, so the kernels of :mod:`..kernels.qdot` use it unchanged but
for the activation's storage: a uint8 activation ``x`` is stored as ``x ^ 0x80 = x - 128``
(int8) and its zero point becomes ``z - 128``, so that ``Σ (x - z)·w`` is unchanged; int8
activations are read in place.

Exactness: each product is at most 128·128 = 2^14 in magnitude and the sum of four 2^16, formed
exactly in the int32 lane; the accumulation wraps modulo 2^32 (sdot does not saturate), which is
exact for the true result as the kernels fold the zero point as ``Σ x w − z Σ w`` (see
:mod:`..x86.intrin`).

``C[i] += Σ_k A[k] · B[i, k]`` for 4 lanes i and k < 4: A is one 32-bit word (4 x s8) broadcast
to the 4 lanes, B one 128-bit register (4 lanes x 4 s8). A block of 8 output channels is two
such instructions (the schedule unrolls the register loop). The intrinsic is registered per
accumulator scope (tensorize matches buffer scopes; the kernels' is
:data:`..intrin.ACC_SCOPE`): ``qc_arm_sdot_4_{scope}``. TVM's own ``dot_4x4_i8i8s32_sdot``
(tvm/s_tir/tensor_intrin/arm_cpu.py) is the same computation for one scope, and has no indexed
form (:func:`register_lane`).
"""
from __future__ import annotations

from functools import lru_cache

from tvm import s_tir
from tvm.script import tirx as T

from ..intrin import ACC_SCOPE, DotIsa, dot_desc
from ..target import Family, TargetSpec

SDOT_LLVM = "llvm.aarch64.neon.sdot.v4i32.v16i8"


def arm_isa(spec: TargetSpec):
    """``DotIsa("sdot", 4)`` when LLVM says the arm target's CPU (``spec.cpu``, generic when
    unset) with ``spec.features`` (``+dotprod`` switches it on, ``-dotprod`` off) has the dot
    product; None otherwise (the plain int16-product loops)."""
    if spec.family is not Family.ARM:
        return None
    host = spec.host_tvm
    return _isa(host.get("mtriple", "aarch64-linux-gnu"), host.get("mcpu", ""), tuple(host.get("mattr", ())))


@lru_cache(maxsize=None)
def _isa(mtriple: str, cpu: str, mattr: tuple):
    import tvm
    from tvm.target import codegen
    t = {"kind": "llvm", "mtriple": mtriple}
    if cpu:
        t["mcpu"] = cpu
    if mattr:
        t["mattr"] = list(mattr)
    target = tvm.target.Target(t)
    if codegen.llvm_cpu_has_features(["dotprod"], target):
        return DotIsa("sdot", 4)
    return None


def _make(lanes: int, scope: str):
    if lanes != 4:
        raise ValueError(f"sdot has 4 int32 lanes, not {lanes}")
    k, word = 4, 16
    desc = dot_desc(k, lanes, "int8", "int8", scope)

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((k,), "int8", offset_factor=1),
             B: T.Buffer((lanes, k), "int8", offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1, scope=scope)) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:k], B[0:lanes, 0:k])
            T.writes(C[0:lanes])
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(SDOT_LLVM), C.vload([0], "int32x4"),
                T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "int8x4"), dtype="int32"), lanes),
                              dtype=f"int8x{word}"),
                B.vload([0, 0], dtype=f"int8x{word}"), dtype="int32x4")
    return desc, impl


@lru_cache(maxsize=None)
def register(lanes: int, scope: str) -> str:
    """The name of the sdot intrinsic for ``lanes`` (4) int32 accumulators in ``scope``."""
    name = f"qc_arm_sdot_{lanes}_{scope}"
    try:
        s_tir.TensorIntrin.get(name, allow_missing=False)
    except Exception:  # noqa: BLE001 - not registered yet in this process
        s_tir.TensorIntrin.register(name, *_make(lanes, scope))
    return name


def _make_lane(groups: int, scope: str):
    if not 1 <= groups <= 4:
        raise ValueError(f"indexed sdot takes 1 to 4 groups (lanes of a 128-bit register), not {groups}")
    """``C[i] += Σ_{g<G, j<4} A[4g + j] · B[g, i, j]``: G consecutive groups of 4 input channels
    (one 4G-byte load of A) on G indexed sdots, ``SDOT Vd.4S, Vn.16B, Vm.4B[g]``, each taking
    its A word from lane g of the loaded register instead of a broadcast load of its own."""
    lanes, k = 4, 4
    s0 = T.int32()

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (groups * k,), "int8", offset_factor=1)
        B = T.match_buffer(b, (groups, lanes, k), "int8", offset_factor=1, strides=[s0, k, 1])
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:groups * k], B[0:groups, 0:lanes, 0:k])
            T.writes(C[0:lanes])
            for g in T.serial(0, groups):
                for i in T.serial(0, lanes):
                    for j in T.serial(0, k):
                        with T.sblock("update"):
                            vi, vg, vj = T.axis.remap("SRR", [i, g, j])
                            C[vi] = C[vi] + T.cast(A[vg * k + vj], "int32") * T.cast(B[vg, vi, vj], "int32")

    a_vec, w_vec = f"int8x{groups * k}", f"int32x{groups}"

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (groups * k,), "int8", offset_factor=1)
        B = T.match_buffer(b, (groups, lanes, k), "int8", offset_factor=1, strides=[s0, k, 1])
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:groups * k], B[0:groups, 0:lanes, 0:k])
            T.writes(C[0:lanes])
            # the A words inline (each use one more identical load, which LLVM merges): bound to a
            # name, TVMScript made them a buffer of their own (see ..intrin.ACC_SCOPE)
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(SDOT_LLVM), C.vload([0], "int32x4"),
                B.vload([0, 0, 0], dtype="int8x16"),
                T.reinterpret(T.Shuffle([T.reinterpret(A.vload([0], a_vec), dtype=w_vec)] * 4, [0, 0, 0, 0]),
                              dtype="int8x16"), dtype="int32x4")
            if groups > 1:        # a Python constant: the parser keeps or drops the statement
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(SDOT_LLVM), C.vload([0], "int32x4"),
                    B.vload([1, 0, 0], dtype="int8x16"),
                    T.reinterpret(T.Shuffle([T.reinterpret(A.vload([0], a_vec), dtype=w_vec)] * 4, [1, 1, 1, 1]),
                              dtype="int8x16"), dtype="int32x4")
            if groups > 2:
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(SDOT_LLVM), C.vload([0], "int32x4"),
                    B.vload([2, 0, 0], dtype="int8x16"),
                    T.reinterpret(T.Shuffle([T.reinterpret(A.vload([0], a_vec), dtype=w_vec)] * 4, [2, 2, 2, 2]),
                              dtype="int8x16"), dtype="int32x4")
            if groups > 3:
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(SDOT_LLVM), C.vload([0], "int32x4"),
                    B.vload([3, 0, 0], dtype="int8x16"),
                    T.reinterpret(T.Shuffle([T.reinterpret(A.vload([0], a_vec), dtype=w_vec)] * 4, [3, 3, 3, 3]),
                              dtype="int8x16"), dtype="int32x4")
    return desc, impl


@lru_cache(maxsize=None)
def register_lane(groups: int, scope: str = ACC_SCOPE) -> str:
    """The name of the indexed-sdot intrinsic over ``groups`` groups of 4 input channels."""
    name = f"qc_arm_sdot_4x{groups}_{scope}"
    try:
        s_tir.TensorIntrin.get(name, allow_missing=False)
    except Exception:  # noqa: BLE001 - not registered yet in this process
        s_tir.TensorIntrin.register(name, *_make_lane(groups, scope))
    return name
