"""x86 integer dot-product tensor intrinsics for the int8 kernels, and which of them a target has.

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

:class:`DotIsa` also describes ARM's ``sdot`` (s8 x s8, groups of 4, 4 lanes), whose intrinsic
and target test live in :mod:`.intrin_arm`; :func:`int8_isa` answers for both families.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tvm import s_tir
from tvm.script import tirx as T

from .target import TargetSpec

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

    def intrin(self, lanes: int, scope: str = ACC_SCOPE) -> str:
        if self.kind == "sdot":
            from .intrin_arm import register
            return register(lanes, scope)
        return _register(self.kind, lanes, scope)

    def __str__(self):
        return f"{self.kind}x{self.lanes}"


def int8_isa(spec: TargetSpec) -> DotIsa | None:
    """The dot-product formulation for ``spec`` (None: plain loops).

    arm: ``sdot`` when the CPU/features have ``dotprod`` (:func:`.intrin_arm.arm_isa`).
    x86: asks LLVM whether the target's CPU (``spec.cpu`` or the host) with ``spec.features``
    (``-avx512vnni`` etc. switch features off) has AVX512-VNNI (512-bit lanes when AVX-512F is on),
    AVX-VNNI (256-bit), AVX-512BW or AVX2."""
    if spec.family == "arm":
        from .intrin_arm import arm_isa
        return arm_isa(spec)
    if spec.family != "x86":
        return None
    host = spec.host_tvm
    return _isa(host.get("mcpu", ""), tuple(host.get("mattr", ())))


@lru_cache(maxsize=None)
def _isa(cpu: str, mattr: tuple) -> DotIsa | None:
    import tvm
    from tvm.target import codegen
    t = {"kind": "llvm"}
    if cpu:
        t["mcpu"] = cpu
    if mattr:
        t["mattr"] = list(mattr)
    target = tvm.target.Target(t)

    def has(f):
        return bool(codegen.llvm_cpu_has_features([f], target))
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


# ---- the intrinsics --------------------------------------------------------------------------------
_VNNI_LLVM = {16: "llvm.x86.avx512.vpdpbusd.512", 8: "llvm.x86.avx512.vpdpbusd.256",
              4: "llvm.x86.avx512.vpdpbusd.128"}
_PMADDWD_LLVM = {16: "llvm.x86.avx512.pmaddw.d.512", 8: "llvm.x86.avx2.pmadd.wd", 4: "llvm.x86.sse2.pmadd.wd"}


def dot_desc(k: int, lanes: int, adt: str, bdt: str, scope: str):
    """The pattern every dot-product intrinsic here and in :mod:`.intrin_arm` replaces:
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
                    T.llvm_lookup_intrinsic_id(_VNNI_LLVM[lanes]), C.vload([0], c_vec),
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


def wide_intrin(lanes: int, scope: str = ACC_SCOPE) -> str:
    """``vpmaddwd`` on int16 A *and* B operands (``qc_x86_pmaddwd16_{L}_{scope}``): for operands
    that need more than 8 bits, the transformed tiles of :mod:`.kernels.qwinograd`."""
    return _register("pmaddwd16", lanes, scope)


@lru_cache(maxsize=None)
def _register(kind: str, lanes: int, scope: str) -> str:
    name = f"qc_x86_{kind}_{lanes}_{scope}"
    try:
        s_tir.TensorIntrin.get(name, allow_missing=False)
    except Exception:  # noqa: BLE001 - not registered yet in this process
        s_tir.TensorIntrin.register(name, *_make(kind, lanes, scope))
    return name
