"""int8 tensor cores (WMMA m16n16k16, s8 x s8 -> s32) for the CUDA implicit-GEMM kernels.

TVM 0.27's dlight ``gpu.Matmul`` hands an s8 x s8 -> s32 reduction with I, J, K > 64 to
``MatmulInt8Tensorization`` (tvm/s_tir/dlight/gpu/matmul.py). That rule tiles K as
``[None, 1]`` x 16: the inner k loop it annotates for software pipelining has extent 1, and
``tvm.compile`` then fails in InjectSoftwarePipeline (``GetWmmaFragmentSize``: "Check failed:
(it != fragment_info_.end())") -- on a plain 256x256x256 int8 matmul built from ``te`` too, so
it is TVM's, not our kernels'. Its float16 sibling ``MatmulTensorization`` tiles K as
``[None, 4]`` and builds. :class:`MatmulInt8WMMA` is dlight's int8 rule with K tiled 4 x 16 = 64
per shared-memory stage (padded by ``pad_einsum``; the int8 rule's shared-memory alignment and
intrinsics kept) and a block tile chosen per GEMM (:func:`block_tile`: 64x128 or 64x64, where
dlight always takes 128x128): the same schedule otherwise -- reindex to
``C[S, I, J] += A[S, I, K] * B[S, J, K]``, warps of 2x2 16x16 fragments,
A/B staged through dynamic shared memory with the producers (our padding/shift stage) inlined
into the fetch, WMMA fragment loads/mma_sync/stores, the requantization epilogue inlined after
the accumulator's store. For ``QC_CUDA_INT8_LAYOUT=blocked-copy``
(NCHW16c, kernels/quant.py) the global -> shared copies load 16-byte vectors (``fetch_vector``;
where the GEMM is whole tiles) and a producer stage named ``pad_mat`` (padding and the uint8 ->
int8 shift) is kept as a kernel of its own instead of being inlined into the fetch.

:func:`schedule_int8` applies it to a PrimFunc under the conditions of :func:`wmma_extents` (CUDA
sm_70+, static I >= 32, J >= 64, K >= 64 -- 256 where J <= 64 --, the reduction reading int8 and
writing int32); the lowering (:mod:`..lower`) marks the result scheduled, so dlight's default
rules leave it alone, and everything else still goes to dlight.
"""
from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import (auto_inline_consumer_chain, auto_inline_producers, check_sm_version,
                                          get_in_out_dtypes, get_index_map, get_reduction_blocks)
from tvm.target import Target

# (warps along I, 16x16 fragments per warp along I, warps along J, fragments per warp along J):
# the block tile is 16*wi*fi x 16*wj*fj; dlight's int8 rule uses (4, 2, 4, 2) = 128 x 128, 16 warps
TILES = {"64x128": (2, 2, 4, 2), "64x64": (2, 2, 2, 2)}


def block_tile(ext: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The block tile for the GEMM extents (S, I, J, K): 64 rows, and 128 or 64 columns, whichever
    pads J less (128 on a tie). Measured on an H100 (2026-11-24; ResNet-18's 3x3 convs alone, int8,
    outputs equal to the integer reference; 64-row tiles of 128 and 64 columns, 128x128, 128x64 and
    dlight's SIMT rule side by side): 64x128 beat dlight's 128x128 on every shape with J > 64
    (I x J x K = 49x512x4608 0.124 against 0.130 ms, 196x256x2304 0.089 / 0.102, 784x128x1152
    0.037 / 0.060, 3136x512x4608 0.230 / 0.265) -- twice the thread blocks on 132 SMs; 64x64 was
    best for J = 64 (3136x64x576 0.029 ms against 0.043 on the SIMT rule, 200704x64x576 0.376 /
    0.471). Tiles of 32 rows do not build (TVM's shared-memory merge fails in LowerIntrin)."""
    j = ext[2]
    return TILES["64x64"] if -(-j // 64) * 64 < -(-j // 128) * 128 else TILES["64x128"]


def gemm_extents(func: tirx.PrimFunc) -> tuple[tuple[int, ...], str, str] | None:
    """((S, I, J, K), in dtype, out dtype) of ``func``'s reduction read as dlight's implicit GEMM,
    or None when dlight's Matmul would not take it (no single reduction block / no GEMM index map)."""
    sch = s_tir.Schedule(func)
    blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    if not blocks or not get_index_map(sch.get(blocks[0])):
        return None
    main = blocks[0]
    for rw in (("read", 0), ("read", 1), ("write", 0)):
        sch.reindex(main, rw)
    sch.transform_block_layout(main, get_index_map(sch.get(main))[0])
    stmt = sch.get(main)
    ext = tuple(int(v.dom.extent) if isinstance(v.dom.extent, tirx.IntImm) else -1 for v in stmt.iter_vars)
    return (ext, *get_in_out_dtypes(stmt))


class MatmulInt8WMMA(GPUScheduleRule):
    """dlight's ``MatmulInt8Tensorization`` with K tiled [None, 4] x 16 (see the module docstring)."""

    def __init__(self, tile: tuple[int, int, int, int] = TILES["64x128"], vector: int = 4):
        self.tile = tile
        self.vector = vector

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:  # noqa: C901
        from ..tensor_intrin import import_tensor_intrin
        import_tensor_intrin()
        from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        reduction_blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if reduction_blocks is None:
            return None
        micro = 16
        warp_size, vector_size = 32, self.vector
        wi, fi, wj, fj = self.tile
        i_factors, j_factors, k_factors = [None, 1, wi, fi], [1, None, wj, fj], [None, 4]
        num_ty = i_factors[2] * j_factors[2]

        main_block = reduction_blocks[0]
        reindex_a = sch.reindex(main_block, ("read", 0))
        reindex_b = sch.reindex(main_block, ("read", 1))
        reindex_c = sch.reindex(main_block, ("write", 0))
        index_maps = get_index_map(sch.get(main_block))
        if index_maps is None:
            return None
        matmul_map, a_map, b_map, c_map = index_maps
        sch.transform_layout(reindex_a, ("write", 0), a_map)
        sch.transform_layout(reindex_b, ("write", 0), b_map)
        sch.transform_layout(reindex_c, ("read", 0), c_map)
        sch.transform_block_layout(main_block, matmul_map)
        sch.pad_einsum(main_block, [1, micro * i_factors[2] * i_factors[3], micro * j_factors[2] * j_factors[3],
                                    micro * k_factors[1]])

        block = main_block
        batch, i, j, k = sch.get_loops(block)
        i, i_inner = sch.split(i, factors=[None, micro])
        j, j_inner = sch.split(j, factors=[None, micro])
        k, k_inner = sch.split(k, factors=[None, micro])
        sch.reorder(i, j, k, i_inner, j_inner, k_inner)
        block_inner = block
        block_outer = sch.blockize(i_inner)

        i0, i1, i2, i3 = sch.split(i, factors=i_factors)
        j0, j1, j2, j3 = sch.split(j, factors=j_factors)
        k0, k1 = sch.split(k, k_factors)
        sch.annotate(k0, "software_pipeline_order", [0, 3, 1, 4, 5, 2, 6])
        sch.annotate(k0, "software_pipeline_stage", [0, 0, 0, 0, 0, 1, 1])
        sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
        sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
        sch.reorder(i0, j0, i1, j1, j2, i2, k0, k1, i3, j3)
        sch.bind(batch, "blockIdx.z")
        sch.bind(sch.fuse(i0, j0), "blockIdx.x")
        sch.bind(sch.fuse(i1, j1), "blockIdx.y")
        thread_idy = sch.fuse(j2, i2)
        sch.bind(thread_idy, "threadIdx.y")

        def fetch_to_shared(idx):
            block_read = sch.cache_read(block_outer, idx, "shared.dyn")
            sch.compute_at(block_read, k0)
            fused = sch.fuse(*sch.get_loops(block_read)[-2:])
            _, f_1, f_2, f_3 = sch.split(fused, factors=[None, num_ty, warp_size, vector_size])
            sch.bind(f_2, "threadIdx.x")
            sch.bind(f_1, "threadIdx.y")
            sch.vectorize(f_3)
            sch.storage_align(block_read, 0, axis=-2, factor=32, offset=16)
            sch.annotate(block_read, "tirx.manifest_shared_memory_local_stage", 1)
            sch.annotate(block_read, "double_buffer_scope", 0)
            return block_read

        mat = [b for b in sch.get_child_blocks(get_root_block(sch)) if sch.get(b).name_hint == "pad_mat"]
        fetch_a = fetch_to_shared(0)
        if mat:
            _inline_producers_up_to(sch, fetch_a, "pad_mat")     # the im2col reindex (and pad_einsum's) stages
            _materialize(sch, mat[0])
        else:
            auto_inline_producers(sch, fetch_a)
        auto_inline_producers(sch, fetch_to_shared(1))

        a_mat = sch.cache_read(block_outer, 0, "wmma.matrix_a")
        b_mat = sch.cache_read(block_outer, 1, "wmma.matrix_b")
        sch.compute_at(a_mat, k1)
        sch.compute_at(b_mat, k1)
        to_global = sch.cache_write(block_outer, 0, "shared.dyn")
        sch.storage_align(to_global, 0, -2, 16, 4)
        store = sch.cache_write(block_outer, 0, "wmma.accumulator")
        sch.reverse_compute_at(store, thread_idy)
        sch.reverse_compute_at(to_global, thread_idy)

        def tile16(blk):
            a, b = sch.get_loops(blk)[-2:]
            a0, a1 = sch.split(a, factors=[None, micro])
            b0, b1 = sch.split(b, factors=[None, micro])
            sch.reorder(a0, b0, a1, b1)
            return a0, b0, a1
        tile16(store)
        init = sch.get_child_blocks(sch.decompose_reduction(block_outer, k0))[0]
        intrins = get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared.dyn", in_dtype="int8",
                                        out_dtype="int32", trans_b=True)
        try:
            for mat, name in ((a_mat, "load_a"), (b_mat, "load_b")):
                a0, b0, a1 = tile16(mat)
                sch.unroll(a0)
                sch.unroll(b0)
                sch.tensorize(a1, intrins[name])
            sch.tensorize(sch.get_loops(init)[-2], intrins["init"])
            sch.tensorize(sch.get_loops(store)[-2], intrins["store"])
            sch.tensorize(sch.get_loops(block_inner)[-3], intrins["compute"])
        except Exception:  # noqa: BLE001 - the block does not match the intrinsic: not for this rule (as dlight)
            return None
        auto_inline_consumer_chain(sch, to_global)
        fused = sch.fuse(*sch.get_loops(to_global)[-2:])
        _, f1, f2 = sch.split(fused, factors=[None, warp_size, 4])
        sch.bind(f1, "threadIdx.x")
        sch.vectorize(f2)
        return sch


def _inline_producers_up_to(sch: s_tir.Schedule, block, keep: str) -> None:
    """Inline every producer stage of ``block``, transitively, up to the stage named ``keep``."""
    for producer in sch.get_producers(block):
        if sch.get(producer).name_hint != keep:
            _inline_producers_up_to(sch, producer, keep)
            sch.compute_inline(producer)


def _materialize(sch: s_tir.Schedule, block) -> None:
    """A producer stage kept as its own kernel: one thread per element, 256 threads a block (not
    vectorized: TVM 0.27's simplifier fails on the cast of a vectorized lane-invariant condition)."""
    fused = sch.fuse(*sch.get_loops(block))
    bx, tx = sch.split(fused, factors=[None, 256])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def tensor_core_sized(ext: tuple[int, ...]) -> bool:
    """The GEMM extents (S, I, J, K) worth WMMA tiles: I >= 32, J >= 64, K >= 64, and K >= 256
    where J <= 64 (the tile pads I to 64, J to 64/128 and K to 64). dlight's own threshold, every
    extent > 64, left ResNet-18's layer-1 convs (J = 64, K = 576) and its layer-4 convs at batch 1
    (I = 49) on the SIMT rule, 1.5x and 2.3x slower there; its 7x7 stem (J = 64, K = 3*7*7 = 147)
    stays there: on 64x64 WMMA tiles it took 0.865 ms at batch 64 against 0.646 on the SIMT rule
    (0.031 / 0.022 at batch 1; H100, 2026-11-24): its K pads to 192, and the tile's im2col gather
    reads three input channels over a 7x7 window."""
    _, i, j, k = ext
    return i >= 32 and j >= 64 and k >= (256 if j <= 64 else 64)


def wmma_extents(func: tirx.PrimFunc, target: Target) -> tuple[int, ...] | None:
    """The GEMM extents (S, I, J, K) of ``func`` when it takes the int8 WMMA rule -- CUDA sm_70+, an
    s8 -> s32 implicit GEMM of static extents that :func:`tensor_core_sized` -- else None."""
    if target.kind.name != "cuda" or check_sm_version(str(target.attrs.get("arch", ""))) < 70:
        return None
    info = gemm_extents(func)
    if info is None:
        return None
    ext, din, dout = info
    return ext if din == "int8" and dout == "int32" and tensor_core_sized(ext) else None


def _whole_tiles(ext: tuple[int, ...], tile: tuple[int, int, int, int]) -> bool:
    """Whether the GEMM extents (S, I, J, K) are whole block tiles (I, J) and K stages of 64: then
    the schedule pads nothing. TVM 0.27's CUDA codegen prints a 16-lane int8 broadcast (the padding's
    zero fill, vectorized with the fetch) as ``make_int4`` of 16 arguments, which nvcc rejects."""
    _, i, j, k = ext
    wi, fi, wj, fj = tile
    return i % (16 * wi * fi) == 0 and j % (16 * wj * fj) == 0 and k % 64 == 0


def schedule_int8(func: tirx.PrimFunc, target: Target, fetch_vector: int = 4) -> tirx.PrimFunc | None:
    """``func`` scheduled on int8 WMMA tensor cores, or None (then dlight's rules take it).
    ``fetch_vector``: int8 lanes per load of the global -> shared copies (16 only where the kernel
    asks for it, its operands' producers being plain loads, and :func:`_whole_tiles`)."""
    try:
        ext = wmma_extents(func, target)
        if ext is None:
            return None
        tile = block_tile(ext)
        if fetch_vector > 4 and not _whole_tiles(ext, tile):
            fetch_vector = 4      # pad_einsum's zero fill would be a 16-lane int8 broadcast: no CUDA codegen
        sch = MatmulInt8WMMA(tile, fetch_vector).apply(func, target, False)
    except Exception:  # noqa: BLE001 - dlight's analysis raises on shapes it cannot read: not a GEMM
        return None
    return None if sch is None else sch.mod["main"].with_attr("tirx.is_scheduled", True)
