"""x86 integer dot-product tensor intrinsics for the int8 kernels, and which of them an x86 target has.

Two exact formulations of ``C[i] += Σ_k A[k] · B[i, k]`` (int32 accumulators, ``L`` lanes):

* **VNNI** (``vpdpbusd``, AVX512-VNNI or AVX-VNNI): A is 4 uint8, B is L x 4 int8; one
  instruction adds the 4 products of each lane to its int32 accumulator. The products
  (|u8·s8| <= 255·128) and their sum of four are exact; the accumulation wraps modulo 2^32 (it
  does not saturate: that is ``vpdpbusds``), which is exact for sums that fit int32 and, since
  the kernels fold the zero point as ``Σ x w − z_x Σ w``, exact modulo 2^32 for the true result.
  Intel SDM vol. 2, VPDPBUSD; the LLVM >= 21 intrinsic takes <4L x i8> operands (TVM 0.27's own
  ``dot_16x4_vnni`` still passes <16 x i32> and fails LLVM 22's verifier).
* **pmaddwd** (AVX2 without VNNI, e.g. AMD Zen 3; or AVX-512BW without VNNI): A is 2 int16 (the
  uint8/int8 activations widened at packing time), B is L x 2 int8 weights, stored as int8 in the
  artifact and sign-extended to int16 as they are loaded (``vpmovsxbw`` with a memory operand;
  stored as int16 they doubled the weight bytes of an AVX2 artifact); ``vpmaddwd`` forms the two
  products in int32 and adds them, exactly (|2·255·128| < 2^31), then ``vpaddd``. The 8-bit
  ``vpmaddubsw`` route is not used: it saturates the pair sum to int16 (255·127·2 > 32767), which
  would change results unless weights were limited to 7 bits.

The A operand is one 32-bit word (4 x u8 or 2 x s16) broadcast to all lanes, the B operand one
vector register of packed weights. Each intrinsic is registered once per accumulator scope
(tensorize matches buffer scopes; the CPU kernels use :data:`ACC_SCOPE`) and lane count (4, 8,
16: xmm, ymm, zmm). Names: ``qc_x86_{vnni|pmaddwd}_{L}_{scope}``; :func:`wide_intrin` is pmaddwd with int16
weights as well (``qc_x86_pmaddwd16_...``), for the Winograd-transformed operands.

:class:`..intrin.DotIsa` also describes ARM's ``sdot`` (s8 x s8, groups of 4, 4 lanes), whose intrinsic
and target test live in :mod:`..arm.intrin`; :func:`..isa.int8_isa` answers for both families.
"""
from __future__ import annotations

import os

from functools import lru_cache

from tvm import s_tir
from tvm.script import tirx as T

from ..intrin import ACC_SCOPE, DotIsa, dot_desc
from ..target import Family, TargetSpec


def x86_isa(spec: TargetSpec) -> DotIsa | None:
    """The dot-product formulation of an x86 ``spec`` (None: plain loops, or not x86): asks LLVM
    whether the target's CPU (``spec.cpu`` or the host) with ``spec.features`` (``-avx512vnni``
    etc. switch features off) has AVX512-VNNI (512-bit lanes when AVX-512F is on), AVX-VNNI
    (256-bit), AVX-512BW or AVX2."""
    if spec.family is not Family.X86:
        return None
    host = spec.host_tvm
    return _isa(host.get("mcpu", ""), tuple(host.get("mattr", ())))


@lru_cache(maxsize=None)
def _has(cpu: str, mattr: tuple, feature: str) -> bool:
    """Whether LLVM's CPU ``cpu`` (the host's if empty) with ``mattr`` has ``feature``."""
    import tvm
    from tvm.target import codegen
    t = {"kind": "llvm", **({"mcpu": cpu} if cpu else {}), **({"mattr": list(mattr)} if mattr else {})}
    return bool(codegen.llvm_cpu_has_features([feature], tvm.target.Target(t)))


@lru_cache(maxsize=None)
def _isa(cpu: str, mattr: tuple) -> DotIsa | None:
    def has(f):
        return _has(cpu, mattr, f)
    wide = has("avx512f") and has("avx512bw") and has("avx512vl")
    if wide and has("avx512vnni"):
        return DotIsa("vnni", 16)
    if has("avxvnni") or (has("avx512vnni") and has("avx512vl")):
        return DotIsa("vnni", 8)
    if wide:
        return DotIsa("pmaddwd", 16)
    if has("avx2"):
        return DotIsa("pmaddwd", 8)
    return None


def has_amx_int8(spec: TargetSpec) -> bool:
    """Whether an x86 ``spec``'s CPU has AMX-INT8 tiles (Sapphire Rapids and later; ``-amx-int8``
    in ``spec.features`` switches them off), and ``QC_X86_AMX`` is not ``0``."""
    if spec.family is not Family.X86 or os.environ.get("QC_X86_AMX", "1") == "0":
        return False
    host = spec.host_tvm
    cpu, mattr = host.get("mcpu", ""), tuple(host.get("mattr", ()))
    return _has(cpu, mattr, "amx-tile") and _has(cpu, mattr, "amx-int8")


# ---- the intrinsics --------------------------------------------------------------------------------
VNNI_LLVM = {16: "llvm.x86.avx512.vpdpbusd.512", 8: "llvm.x86.avx512.vpdpbusd.256",
              4: "llvm.x86.avx512.vpdpbusd.128"}
_PMADDWD_LLVM = {16: "llvm.x86.avx512.pmaddw.d.512", 8: "llvm.x86.avx2.pmadd.wd", 4: "llvm.x86.sse2.pmadd.wd"}


def _make(kind: str, lanes: int, scope: str):
    k = 4 if kind == "vnni" else 2
    adt, bdt = {"vnni": ("uint8", "int8"), "pmaddwd": ("int16", "int8"), "pmaddwd16": ("int16", "int16")}[kind]
    word = lanes * k                       # elements in one B register
    a_vec, b_vec, c_vec = f"{adt}x{k}", f"{bdt}x{word}", f"int32x{lanes}"
    w_vec = f"int16x{word}"                # pmaddwd's B register: the int8 weights sign-extended
    desc = dot_desc(k, lanes, adt, bdt, scope)

    if kind == "vnni":
        @T.prim_func(s_tir=True)
        def impl(A: T.Buffer((k,), adt, offset_factor=1),
                 B: T.Buffer((lanes, k), bdt, offset_factor=1),
                 C: T.Buffer((lanes,), "int32", offset_factor=1, scope=scope)) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:k], B[0:lanes, 0:k])
                T.writes(C[0:lanes])
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(VNNI_LLVM[lanes]), C.vload([0], c_vec),
                    T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], a_vec), dtype="int32"), lanes),
                                  dtype=f"int8x{word}"),
                    B.vload([0, 0], dtype=b_vec), dtype=c_vec)
    else:                                  # pmaddwd (int8 B: sign-extended) and pmaddwd16 (the cast a no-op)
        @T.prim_func(s_tir=True)
        def impl(A: T.Buffer((k,), adt, offset_factor=1),
                 B: T.Buffer((lanes, k), bdt, offset_factor=1),
                 C: T.Buffer((lanes,), "int32", offset_factor=1, scope=scope)) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:k], B[0:lanes, 0:k])
                T.writes(C[0:lanes])
                C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], c_vec) + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(_PMADDWD_LLVM[lanes]),
                    T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], a_vec), dtype="int32"), lanes),
                                  dtype=w_vec),
                    T.cast(B.vload([0, 0], dtype=b_vec), w_vec), dtype=c_vec)
    return desc, impl


def intrin(kind: str, lanes: int, scope: str = ACC_SCOPE) -> str:
    """The name of the ``kind`` ("vnni" or "pmaddwd") intrinsic over ``lanes`` int32 accumulators."""
    return _register(kind, lanes, scope)


def wide_intrin(lanes: int, scope: str = ACC_SCOPE) -> str:
    """``vpmaddwd`` on int16 A *and* B operands (``qc_x86_pmaddwd16_{L}_{scope}``): for operands
    that need more than 8 bits, the transformed tiles of :mod:`.qwinograd`."""
    return _register("pmaddwd16", lanes, scope)


@lru_cache(maxsize=None)
def _register(kind: str, lanes: int, scope: str) -> str:
    name = f"qc_x86_{kind}_{lanes}_{scope}"
    try:
        s_tir.TensorIntrin.get(name, allow_missing=False)
    except Exception:  # noqa: BLE001 - not registered yet in this process
        s_tir.TensorIntrin.register(name, *_make(kind, lanes, scope))
    return name
