"""CUDA: ahead-of-time device code (nvcc, the driver stub), the int8 and float8 tensor-core and
direct schedules, and the CUDA-only int8 kernels (s8 x s8 GEMMs) and float8 ones (float8 GEMMs).

How :mod:`qcompiler.codegen.lower` lowers for CUDA: no blocked layouts (vector width 1, so NCHW1c == plain NCHW), except, opt-in, the int8 convs'
activations: ``QC_CUDA_INT8_LAYOUT=blocked|blocked-copy`` stores them NCHW16c so the implicit
GEMM's K = (ci/16, kh, kw, ci%16) loads 16 contiguous bytes per run (cuda/int8.py
``_conv_s8s8_blocked``; built and checked on the CPU, not yet timed on a GPU). Two hand schedules are applied
at lowering (the CUDA rules of :mod:`qcompiler.codegen.schedule`) and mark their kernels scheduled: int8 implicit GEMMs on tensor cores
(:mod:`.wmma`, below) and reductions over a small window -- depthwise convs, pooling
-- one thread per output element (:mod:`.direct`; dlight's GeneralReduction spent
a thread block per output element on them: MobileNetV2 int8 took 130 ms at batch 64 on an H100,
2.5 ms with the direct schedule). Every other PrimFunc is left unmarked and ``tvm.compile``'s CUDA
pipeline (LegalizeOps, FuseOps/FuseTIR, then dlight's Matmul/GEMV/Reduction/GeneralReduction/
Fallback rules) binds it to GPU threads: non-depthwise convs get dlight's ``gpu.Matmul`` (an
implicit GEMM, I = n·oh·ow, J = co, K = ci·kh·kw, 2-D block tiles through shared memory),
small-batch gemms GEMV/Reduction. Tensor cores (WMMA m16n16k16, sm_70+): fp16 (``--dtype fp16``)
by dlight's ``MatmulTensorization`` where I, J, K > 64 (dlight's threshold) -- the conv's padding
stage keeps the float16 storage (kernels/conv.py ``_StoredF16``) so the reduction reads
``f32(A_f16) * f32(B_f16)``; int8 by :mod:`.wmma` (dlight's int8 rule with K tiled
4x16 -- dlight's own does not build in TVM 0.27 -- and 64-row block tiles) where I >= 32,
J >= 64, K >= 64 (K >= 256 where J = 64), over the s8 x s8 -> s32 form of QLinearConv/QLinearGemm (cuda/int8.py
``conv_s8s8``: uint8 activations shifted to int8 in the padding stage, zero point z - 128).
ResNet-18 (224x224) on tensor cores: int8 19 of 20 convs at batch 1, all but the 7x7 stem (9
with dlight's threshold: layer 1's J = 64 and layer 4's I = 49 missed it); fp16 7 / 11 of 15 at batch 1 / 8. On an H100
the sm_90 int8 artifacts of ResNet-18 and MobileNetV2 (batch 1, 2026-11-24), of single convs
and depthwise convs, and of fashion_mobilenet (2026-11-23, before the direct schedule) are
bit-exact with qcompiler.quant.reference;
on CPU the CUDA int8 computes equal the x86 int8 build (tests/codegen/test_cuda_build.py).
``--dtype fp8`` (sm_89+; an older ``--arch`` is refused): group-1 float8 convs and gemms of at least
one m16n8k32 (I >= 16, J >= 8, K >= 32) are float8 GEMMs (:mod:`.fp8`: the stored bytes
reinterpreted as float8) on TVM's float8 ``mma`` intrinsic, ``mma.sync.aligned.m16n8k32.row.col.f32.
e4m3.e4m3.f32`` (or e5m2) in the PTX, float32 accumulators, the epilogue fused (:mod:`.mma`); the
rest -- depthwise convs, K < 32 -- the CPUs' direct float8-storage kernels. Built and checked on the
CPU only (tests/codegen/test_cuda_fp8.py), not yet run or timed on a GPU.
``--dtype bf16`` (CUDA only) is the fp16 scheme with bfloat16 storage (see :mod:`qcompiler.codegen.lower`, Precision).
"""
