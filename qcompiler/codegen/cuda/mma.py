"""float8 tensor cores (PTX ``mma.sync.aligned.m16n8k32.row.col.f32.<f8>.<f8>.f32``, sm_89+) for the
CUDA implicit-GEMM kernels of ``--dtype fp8``.

TVM 0.27 registers the float8 ``mma`` intrinsics (tvm/s_tir/tensor_intrin/cuda.py:
``mma_e4m3e4m3f32_trans_b``, ``mma_e5m2e5m2f32_trans_b``, their ``ldmatrix`` loads, the float32
fill and store), whose implementation is ``T.ptx_legacy.mma("m16n8k32", "row", "col", "e4m3",
"e4m3", "fp32", ...)``: the CUDA codegen prints it as inline PTX, ``asm volatile("mma.sync.aligned.
m16n8k32.row.col.f32.e4m3.e4m3.f32 ...")``, which nvcc passes through to the PTX (checked there by
tests/codegen/test_cuda_fp8.py) and ptxas assembles for sm_89 / sm_90. No dlight rule uses them,
so :class:`MatmulFp8MMA` is written here after TVM's own ``mma`` recipe (tvm/testing/tir.py
``mma_schedule``) in the shape of our int8 WMMA rule (:mod:`.wmma`):

* reindex to ``C[S, I, J] += f32(A[S, I, K]) * f32(B[S, J, K])`` (dlight's GEMM index maps; A the
  im2col view of the padding stage, B the weight as J x K: the ``trans_b`` form), ``pad_einsum`` to
  whole block tiles and K stages;
* a block tile of 16x16 fragments, ``wi x wj`` warps of ``fi x fj`` fragments each
  (:func:`block_tile`), K in stages of ``32 kf`` staged through dynamic shared memory, the
  producers (padding / uint8 -> float8 reinterpretation) inlined into the copy, in 16-byte
  vectors per thread where the operand is contiguous along K and the GEMM whole tiles, else 4
  (:func:`schedule_fp8`);
* per 32-wide k step: ``ldmatrix.x4`` of the 16x32 A and B fragments into registers (warp
  scope, in the fragment layout of the PTX ISA's m16n8k32 8-bit operands), two m16n8k32 mmas per
  16x16 fragment (the intrinsic), the float32 accumulators in registers;
* the accumulators stored to shared memory, and the epilogue (scale, bias, clamp: the consumer
  blocks) inlined into the write-back to global memory.

Accumulation: each mma adds 32 products to the float32 accumulator, the k steps in order along K
(ci, kh, kw). The products of float8 values are exact in float32; how the tensor core adds the 32
products and the accumulator inside one mma (alignment, truncation) is not IEEE float32 and not
specified by NVIDIA (see docs/quantization.md, Float8 on CUDA).

Known, for the GPU timing still to come: not software-pipelined (two barriers per K stage), as
TVM's recipe. TVM 0.27's LowerWarpMemory leaves the 8-bit operand fragment buffers at warp size in
the CUDA source (each thread declares the whole buffer and indexes its slice by ``threadIdx.x``;
TVM's own int8 mma recipe compiles alike) while it lowers the float32 accumulators; nvcc keeps the
fragments in registers anyway -- the PTX of these kernels has no local memory
(tests/codegen/test_cuda_fp8.py checks it; ``ptxas -v``: 0 bytes stack frame).

:func:`schedule_fp8` applies it to a PrimFunc whose one reduction reads float8 and writes float32
under :func:`mma_sized`, on CUDA sm_89+; the lowering marks the result scheduled.
"""
from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.matmul import (auto_inline_consumer_chain, auto_inline_producers, check_sm_version,
                                          get_index_map, get_reduction_blocks)
from tvm.target import Target

from ..target import FP8_MIN_SM
from .wmma import gemm_extents

FORMATS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}     # TVM dtype -> PTX type (and intrinsic) name
# (warps along I, 16x16 fragments per warp along I, warps along J, fragments per warp along J)
TILES = {"64x128": (2, 2, 4, 2), "64x64": (2, 2, 2, 2), "64x32": (2, 2, 1, 2)}
MIN_EXTENTS = (16, 8, 32)
"""I, J, K of one m16n8k32 mma: a smaller GEMM runs the direct float32 kernel (:mod:`..kernels.fp8`)."""


def mma_sized(i: int, j: int, k: int) -> bool:
    """Whether a GEMM of I x J x K takes the float8 mma rule: at least one m16n8k32 in each extent
    (depthwise convs, K = kh kw, and 1x1 convs over fewer than 32 channels do not)."""
    return i >= MIN_EXTENTS[0] and j >= MIN_EXTENTS[1] and k >= MIN_EXTENTS[2]


def block_tile(ext: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The block tile for GEMM extents (S, I, J, K): 64 rows and 128, 64 or 32 columns, the widest of
    those that pad J least (J = 10 -> 64x32, 48 and 64 -> 64x64, 96 and 160 -> 64x32, 128 and 1000
    -> 64x128; :func:`.wmma.block_tile`'s choice, with 32 columns too). Not timed on a GPU yet."""
    j = ext[2]
    padded = {name: -(-j // (16 * t[2] * t[3])) * 16 * t[2] * t[3] for name, t in TILES.items()}
    best = min(padded.values())
    return TILES[next(name for name in TILES if padded[name] == best)]


def k_stage(k: int) -> int:
    """32-wide k steps per shared-memory stage: 2 (64 of K), or 1 where that pads K less (K = 32, 96, 160)."""
    return 2 if -(-k // 64) * 64 == -(-k // 32) * 32 else 1


def whole_tiles(ext: tuple[int, ...], tile: tuple[int, int, int, int], kf: int) -> bool:
    """Whether the GEMM extents (S, I, J, K) are whole block tiles and K stages: then nothing is
    padded and a contiguous operand's copy may move 16 bytes per thread (TVM 0.27's CUDA codegen
    has no 16-lane vectors of pad_einsum's int32 bounds arithmetic: "Cannot convert type
    T.int32x16 to CUDA type"; cf. the int8 WMMA fetch, :func:`.wmma._whole_tiles`)."""
    _, i, j, k = ext
    wi, fi, wj, fj = tile
    return i % (16 * wi * fi) == 0 and j % (16 * wj * fj) == 0 and k % (32 * kf) == 0


_REGISTERED = []


def _intrinsics(fmt: str) -> dict[str, str]:
    """The tensor intrinsics for float8 ``fmt`` ("e4m3"/"e5m2"), operands loaded from dynamic shared
    memory: TVM registers the float8 ``ldmatrix`` loads for static shared memory only, so their
    ``shared.dyn`` twins (the same TIR, another scope) are registered here once."""
    from ..tensor_intrin import import_tensor_intrin
    import_tensor_intrin()
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin import cuda as intrin
    if not _REGISTERED:
        for dtype, name in FORMATS.items():
            TensorIntrin.register(f"qc_mma_ldmatrix_{name}_a_dyn",
                                  *intrin.get_ldmatrix_intrin(32, dtype, "A", False, "shared.dyn"))
            TensorIntrin.register(f"qc_mma_ldmatrix_{name}_b_trans_dyn",
                                  *intrin.get_ldmatrix_intrin(32, dtype, "B", True, "shared.dyn"))
        _REGISTERED.append(True)
    return {"load_a": f"qc_mma_ldmatrix_{fmt}_a_dyn", "load_b": f"qc_mma_ldmatrix_{fmt}_b_trans_dyn",
            "compute": f"mma_{fmt}{fmt}f32_trans_b", "init": "mma_fill_16x16_f32",
            "store": "mma_store_16x16_f32_shared_dyn_simple_"}


class MatmulFp8MMA:
    """The float8 mma schedule of a reindexed implicit GEMM (see the module docstring)."""

    def __init__(self, fmt: str, tile: tuple[int, int, int, int] = TILES["64x128"], kf: int = 2,
                 vectors: tuple[int, int] = (4, 16)):
        self.fmt, self.tile, self.kf, self.vectors = fmt, tile, kf, vectors

    def apply(self, func: tirx.PrimFunc) -> s_tir.Schedule | None:
        names = _intrinsics(self.fmt)           # imports TVM's tensor intrinsics the fast way first
        from tvm.s_tir.tensor_intrin import cuda as intrin
        sch = s_tir.Schedule(func)
        blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if blocks is None:
            return None
        main = blocks[0]
        reindex_a, reindex_b = sch.reindex(main, ("read", 0)), sch.reindex(main, ("read", 1))
        reindex_c = sch.reindex(main, ("write", 0))
        maps = get_index_map(sch.get(main))
        if maps is None:
            return None
        matmul_map, a_map, b_map, c_map = maps
        sch.transform_layout(reindex_a, ("write", 0), a_map)
        sch.transform_layout(reindex_b, ("write", 0), b_map)
        sch.transform_layout(reindex_c, ("read", 0), c_map)
        sch.transform_block_layout(main, matmul_map)
        wi, fi, wj, fj = self.tile
        sch.pad_einsum(main, [1, 16 * wi * fi, 16 * wj * fj, 32 * self.kf])

        batch, i, j, k = sch.get_loops(main)
        i, i_tc = sch.split(i, factors=[None, 16])
        j, j_tc = sch.split(j, factors=[None, 16])
        k, k_tc = sch.split(k, factors=[None, 32])
        sch.reorder(i, j, k, i_tc, j_tc, k_tc)
        block_inner = main
        block_outer = sch.blockize(i_tc)
        i0, i1, i2, i3 = sch.split(i, factors=[None, 1, wi, fi])
        j0, j1, j2, j3 = sch.split(j, factors=[1, None, wj, fj])
        k0, k1 = sch.split(k, factors=[None, self.kf])
        sch.reorder(i0, j0, i1, j1, j2, i2, k0, k1, i3, j3)
        sch.bind(batch, "blockIdx.z")
        sch.bind(sch.fuse(i0, j0), "blockIdx.x")
        sch.bind(sch.fuse(i1, j1), "blockIdx.y")
        warp = sch.fuse(j2, i2)
        sch.bind(warp, "threadIdx.y")

        def fetch_to_shared(idx):
            block_read = sch.cache_read(block_outer, idx, "shared.dyn")
            sch.compute_at(block_read, k0)
            fused = sch.fuse(*sch.get_loops(block_read)[-2:])
            _, f1, f2, f3 = sch.split(fused, factors=[None, wi * wj, 32, self.vectors[idx]])
            sch.bind(f2, "threadIdx.x")
            sch.bind(f1, "threadIdx.y")
            sch.vectorize(f3)
            sch.storage_align(block_read, 0, axis=-2, factor=32, offset=16)    # ldmatrix rows off the same banks
            return block_read
        auto_inline_producers(sch, fetch_to_shared(0))
        auto_inline_producers(sch, fetch_to_shared(1))

        a_warp = sch.cache_read(block_outer, 0, "warp")
        b_warp = sch.cache_read(block_outer, 1, "warp")
        sch.compute_at(a_warp, k1)
        sch.compute_at(b_warp, k1)
        to_global = sch.cache_write(block_outer, 0, "shared.dyn")
        sch.storage_align(to_global, 0, -2, 16, 4)
        store = sch.cache_write(block_outer, 0, "warp")
        sch.reverse_compute_at(store, warp)
        sch.reverse_compute_at(to_global, warp)

        def tile(blk, rows: int, cols: int):
            a, b = sch.get_loops(blk)[-2:]
            a0, a1 = sch.split(a, factors=[None, rows])
            b0, b1 = sch.split(b, factors=[None, cols])
            sch.reorder(a0, b0, a1, b1)
            return a1
        tile(store, 16, 16)
        init = sch.get_child_blocks(sch.decompose_reduction(block_outer, k0))[0]
        load_a, load_b = tile(a_warp, 16, 32), tile(b_warp, 16, 32)

        def operand_map(s, r, c):                 # a 16x32 float8 fragment in ldmatrix's registers
            return (s, r // 16, c // 32, *intrin.shared_16x32_to_ldmatrix_32x16_layout(r % 16, c % 32))

        def acc_map(s, r, c):                     # a 16x16 float32 accumulator fragment
            return (s, r // 16, c // 16, *intrin.shared_16x16_to_ldmatrix_32x8_layout(r % 16, c % 16))
        sch.transform_layout(a_warp, ("write", 0), operand_map)
        sch.transform_layout(b_warp, ("write", 0), operand_map)
        sch.transform_layout(store, ("read", 0), acc_map)
        try:
            sch.tensorize(load_a, names["load_a"])
            sch.tensorize(load_b, names["load_b"])
            sch.tensorize(sch.get_loops(block_inner)[-3], names["compute"])
            sch.tensorize(sch.get_loops(init)[-2], names["init"])
            sch.tensorize(sch.get_loops(store)[-2], names["store"])
        except Exception:  # noqa: BLE001 - the block does not match the intrinsic: not for this rule (as dlight)
            return None
        auto_inline_consumer_chain(sch, to_global)
        fused = sch.fuse(*sch.get_loops(to_global)[-2:])
        _, f1, f2 = sch.split(fused, factors=[None, 32, 4])
        sch.bind(f1, "threadIdx.x")
        sch.vectorize(f2)
        return sch


def mma_format(func: tirx.PrimFunc, target: Target) -> tuple[str, tuple[int, ...]] | None:
    """(PTX float8 type, GEMM extents (S, I, J, K)) of ``func`` when it takes the float8 mma rule --
    CUDA sm_89+, one reduction over float8 operands of one format into float32, static extents
    :func:`mma_sized` -- else None."""
    if target.kind.name != "cuda" or check_sm_version(str(target.attrs.get("arch", ""))) < FP8_MIN_SM:
        return None
    info = gemm_extents(func)
    if info is None:
        return None
    ext, din, dout = info[0], str(info[1]), str(info[2])
    if din not in FORMATS or dout != "float32" or min(ext) < 1 or not mma_sized(*ext[1:]):
        return None
    sch = s_tir.Schedule(func)
    (main,) = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    if {str(r.source.dtype) for r in sch.get(main).reads} - {"float32"} != {din}:
        return None                          # e4m3 x e5m2 (mixed formats): no TVM intrinsic
    return FORMATS[din], ext


def schedule_fp8(func: tirx.PrimFunc, target: Target, fetch: tuple[int, int] = (4, 4)) -> tirx.PrimFunc | None:
    """``func`` scheduled on float8 mma tensor cores, or None (then dlight's rules take it).
    ``fetch``: float8 lanes per load of the A and B copies to shared memory, 16 only where the
    kernel says that operand is contiguous along K (a gemm's rows, the weights; a conv's im2col
    gathers with a 16-lane int32 index no CUDA type holds) and :func:`whole_tiles`."""
    try:
        found = mma_format(func, target)
        if found is None:
            return None
        fmt, ext = found
        tile, kf = block_tile(ext), k_stage(ext[3])
        vectors = tuple(f if whole_tiles(ext, tile, kf) else 4 for f in fetch)
        sch = MatmulFp8MMA(fmt, tile, kf, vectors).apply(func)
    except Exception:  # noqa: BLE001 - dlight's analysis raises on shapes it cannot read: not a GEMM
        return None
    return None if sch is None else sch.mod["main"].with_attr("tirx.is_scheduled", True)
