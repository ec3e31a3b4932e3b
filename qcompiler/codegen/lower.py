"""Lower an IR graph to a TVM Relax module of scheduled TIR kernels, and build it.

``lower(graph, spec)`` returns an IRModule whose ``main`` takes the graph inputs and returns its
outputs (a tuple when there are several), calling one TIR PrimFunc per kernel group
(:mod:`.fusion`) through ``relax.call_tir``; weights are ``relax.const`` arguments, re-laid out
at compile time. ``build_module(graph, spec)`` compiles that module with ``tvm.compile``.

Layout decision (x86): image tensors between convolutions are stored blocked, NCHW{b}c, with
``b`` the target's vector width in floats (16 with AVX-512, 8 with AVX2) or the largest power of
two dividing the channel count. A conv writes NCHW{b}c; elementwise ops, pooling, resize, pad and
concat keep the layout of their image input; every other op reads blocked tensors through index
arithmetic and writes plain row-major. So a conv–BN–activation–pool chain never re-lays out
activations, the only packing happens where a plain tensor enters a conv (the model input, with
its small channel count, is packed with ``b = C``), and graph outputs are always plain. Weights
are packed once, at compile time (see :mod:`.kernels.conv`, :mod:`.kernels.linalg`).

ARM (aarch64): the same kernels and hand schedules with 4-lane (128-bit NEON) vectors, so blocks
of 4 channels; ``spec.cpu``/``spec.features`` (e.g. cortex-a76, +dotprod,+fullfp16) go to LLVM's
mcpu/mattr. Every real model lowers and compiles; fashion_mobilenet and rapidocr-cls run under
qemu-aarch64 within 1e-4·max|ref| of ONNX Runtime (tests/codegen/test_arm_qemu.py).

CUDA: plain NCHW (opt-in blocked int8 activations), our tensor-core and direct schedules marked at
lowering, dlight's rules for the rest: see :mod:`.cuda`.

Float8 graphs (``--dtype fp8``): float8 values are stored and carried as their uint8 bits and
decoded/encoded in the kernels (:mod:`.kernels.fp8`; CUDA's float8 tensor-core GEMMs reinterpret
them, :mod:`.cuda.fp8`); never a graph input or output.

Quantized graphs (made by the quantize pass; any ``spec.dtype``, "int8" included): every integer op
kind lowers through :mod:`.kernels.quant` (QuantizeLinear, DequantizeLinear, QLinearConv incl.
depthwise/groups, QLinearGemm, QLinearAdd, QLinearGlobalAveragePool, QLinearAveragePool, Requantize;
MaxPool/GlobalMaxPool/Relu/Clip/Pad on stored integers; the data-movement ops as for floats).
uint8/int8 activations use the same NCHW{b}c layouts and hand schedules as fp32; conv/gemm
accumulate u8/s8 x s8 products (formed in int16) in int32 with the zero point folded into a
per-channel int32 bias, and the fixed-point requantization (int64, per-channel m/shift, fused
Relu/Clip clamp) is the kernel's fused epilogue, as is a following QLinearAdd (residual) or
DequantizeLinear. Bit-exact with qcompiler.quant.reference (tests/codegen/test_x86_int8.py).
x86 is tested; arm builds the same computes (x86 schedules with 4-lane blocks) and runs bit-exact
under qemu (tests/codegen/test_arm_int8.py); cuda: see CUDA above. On x86, QLinearConv
(not depthwise) and QLinearGemm are tensorized on dot-product instructions picked from the target's
LLVM features (kernels/qdot.py, x86/intrin.py): VNNI vpdpbusd where available, else exact int16
vpmaddwd (AVX2). On arm, where the CPU/features have dotprod (``--cpu cortex-a76``, neoverse-n1,
or ``--features +dotprod``), they run on ``sdot`` (arm/intrin.py; s8 x s8, a uint8 activation
stored as x ^ 0x80 with zero point z - 128): 8-channel output blocks, the indexed form
``sdot Vd.4s, Vn.16b, Vm.4b[lane]`` over the input-channel block, a register tile sized for 32
NEON registers (gemms: up to 4 rows x 4 registers of columns); llvm-mca (cortex-a76) puts the
conv inner loop at 0.55-0.56 cycles per sdot against 1.1-1.5 for the x86 blocking, the gemm's
at 0.8-1.4 against 1.8-3.0 (scripts/arm_sdot_mca.py; no ARM hardware timed). Without
dotprod (cortex-a53, generic) arm keeps the plain int16-product loops, and its depthwise convs stay
on them either way; both paths bit-exact under qemu (tests/codegen/test_arm_sdot.py). cuda keeps
its own s8 x s8 GEMMs. On x86 and arm a quantized module built with
``spec.debug_layers`` (``qcompile --debug-layers``) also has functions ``debug`` and ``debug_alone``: the same kernel
calls as ``main`` (same PrimFuncs and constants) returning every stored value, chained or each kernel on given
operands, for ``qcompile verify``. They are opt-in, like TensorRT's debug tensors: their VM bytecode is
~5 % of an int8 model.so (rapidocr-det: 86 KB of 1.67 MB) and the IR file that verify reads beside
them holds every weight again as text.

Precision: with ``spec.dtype == "fp16"`` every float activation and weight is stored as float16;
all arithmetic (conv/gemm accumulation, softmax, reductions, normalization, activations) is done
in float32, each kernel casting on load and store; model inputs and outputs stay float32.
An int8 build with ``spec.float_dtype == "fp16"`` (``--float-dtype fp16``) stores its float
layers' activations and weights the same way (DequantizeLinear writes fp16, QuantizeLinear reads
it) and leaves the integer kernels as they are (tests/quant/test_mixed_precision.py).
bf16 (CUDA only): bfloat16 storage alike. Measured errors: docs/targets.md "Float precision, measured".
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Callable

import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype: bf16 weight constants)
import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te

from ..ir import REGISTRY, Graph, Op, Value
from ..ir.types import INT4, is_fp8
from ..progress import report
from .arm import rules as arm_rules
from .cuda import rules as cuda_rules
from .fusion import ANCHORS, Group, plan
from .kernels import conv as kconv
from .kernels import elementwise as kelem
from .kernels import integer as kint
from .kernels import linalg as klin
from .kernels import nbits as knbits
from .kernels import quant as kquant
from .kernels import reduce as kred
from .kernels import shape as kshape
from .kernels import sparse as ksparse
from .kernels import sparse_shared as kshared
from .kernels.tensor import FLOATS, Buf, Lazy, LTensor, materialize, phys_shape, scalar
from .schedule import Kernel, apply_rules
from .target import Family, TargetSpec, vector_width
from .x86 import rules as x86_rules


class LoweringError(NotImplementedError):
    """An op (or attribute combination) this code generator cannot lower; names the op."""


ANCHOR_BUILDERS = {
    "Conv": kconv.conv2d, "FusedConv": kconv.conv2d, "ConvTranspose": kconv.conv_transpose,
    "MaxPool": lambda c, a, i, o: kconv.pool(c, a, i, o, "MaxPool"),
    "AveragePool": lambda c, a, i, o: kconv.pool(c, a, i, o, "AveragePool"),
    "GlobalAveragePool": lambda c, a, i, o: kconv.global_pool(c, a, i, o, "GlobalAveragePool"),
    "GlobalMaxPool": lambda c, a, i, o: kconv.global_pool(c, a, i, o, "GlobalMaxPool"),
    "Gemm": klin.gemm, "FusedGemm": klin.gemm, "MatMul": klin.matmul,
    "Softmax": kred.softmax, "LogSoftmax": lambda c, a, i, o: kred.softmax(c, a, i, o, log=True),
    "LayerNormalization": kred.layernorm,
    **{k: (lambda kind: lambda c, a, i, o: kred.reduce(c, a, i, o, kind))(k) for k in kred.REDUCERS},
}
# quantized ops (integer kernels, kernels/quant.py) and the plain ops that may take stored integers
ANCHOR_BUILDERS.update(kquant.ANCHOR_BUILDERS)
ANCHOR_BUILDERS.update(kint.ANCHOR_BUILDERS)          # ConvInteger, MatMulInteger (pre-quantized models)
ANCHOR_BUILDERS.update(knbits.ANCHOR_BUILDERS)        # MatMulNBits (weight-only 4-bit)
ANCHOR_BUILDERS["MaxPool"] = lambda c, a, i, o, f=ANCHOR_BUILDERS["MaxPool"]: kquant.maxpool(c, a, i, o, f)
ANCHOR_BUILDERS["GlobalMaxPool"] = (lambda c, a, i, o, f=ANCHOR_BUILDERS["GlobalMaxPool"]:
                                    kquant.global_maxpool(c, a, i, o, f))
LAZY_BUILDERS = {**kelem.BUILDERS, **kshape.BUILDERS, **kquant.LAZY_BUILDERS, **knbits.LAZY_BUILDERS}
for _k in ("Relu", "Clip"):
    LAZY_BUILDERS[_k] = lambda c, a, i, o, f=LAZY_BUILDERS[_k]: kquant.relu_clip(c, a, i, o, f)
LAZY_BUILDERS["Pad"] = lambda c, a, i, o, f=LAZY_BUILDERS["Pad"]: kquant.pad(c, a, i, o, f)


SCHEDULE_RULES = {Family.X86: x86_rules.RULES, Family.ARM: arm_rules.RULES, Family.CUDA: cuda_rules.RULES}
"""Each family's schedule rules, first match wins (:mod:`.schedule`)."""


@dataclass
class Stored:
    """A value stored in a Relax tensor: its expression, physical shape, storage dtype and block."""
    expr: relax.Expr
    phys: tuple[int, ...]
    dtype: str
    block: int = 0


class KernelCtx:
    """What a kernel builder may ask for while building one group's PrimFunc."""

    def __init__(self, lowering: "Lowering", op: Op | None = None):
        self.low = lowering
        self.spec: TargetSpec = lowering.spec
        self.vw = lowering.vw
        self.op = op
        self.params: list[tuple[te.Tensor, relax.Expr]] = []
        self.sched: tuple[str, dict] = ("generic", {})
        self.block = 0

    # -- for builders ----------------------------------------------------------------------------
    def const_data(self, i: int) -> np.ndarray | None:
        ops = self.op.operands
        return ops[i].data if i < len(ops) and ops[i].is_const else None

    def scalar_value(self, i: int):
        d = self.const_data(i)
        return d.reshape(-1)[0].item() if d is not None and d.size == 1 else None

    def param(self, arr: np.ndarray, name: str, keep_dtype: bool = False) -> te.Tensor:
        """A compile-time tensor argument of the kernel (a relax.const)."""
        arr = np.asarray(arr)
        if arr.dtype.kind == "f":
            arr = arr.astype(self.low.float_storage(arr, keep_dtype))
        arr = np.ascontiguousarray(arr.reshape(arr.shape or (1,)))
        ph = te.placeholder(arr.shape, str(arr.dtype), name=f"{name}{len(self.params)}")
        self.params.append((ph, self.low.constant(arr)))
        return ph

    def vector(self, arr: np.ndarray) -> Buf:
        return Buf(self.param(arr, "vec"), arr.shape, "float32")

    def schedule(self, kind: str, **params):
        block = params.pop("block", None)
        self.sched = (kind, params)
        if block:
            self.block = block

    # -- used by the lowering ----------------------------------------------------------------------
    def operand(self, v: Value) -> LTensor:
        if v.is_const and v.dtype in INT4:        # 4-bit weights: read packed by their kernel (kernels/nbits.py)
            return Lazy(v.shape, v.dtype, lambda idx: _unpacked(v))
        if v.is_const:
            if v.data.size == 1 and v.data.dtype.kind in "fiub":
                return scalar(v.data.reshape(-1)[0].item(), v.dtype, v.shape)
            return self.low.const_buf(self, v)
        s = self.low.stored[v]
        ph = te.placeholder(s.phys, s.dtype, name=f"in{len(self.params)}")
        self.params.append((ph, s.expr))
        return Buf(ph, v.shape, v.dtype, s.block)


class Lowering:
    def __init__(self, graph: Graph, spec: TargetSpec, gpu_schedules: bool = True):
        self.graph, self.spec = graph, spec
        self.vw = vector_width(spec)
        self.gpu_schedules = gpu_schedules
        # without GPU schedules (a CUDA module that also compiles for a CPU) only the sparse
        # kernels keep theirs, which their loops are written for
        self.rules = SCHEDULE_RULES[spec.family] if gpu_schedules or spec.family is not Family.CUDA \
            else cuda_rules.BY_CONSTRUCTION
        self.fdtype = ("bfloat16" if spec.dtype == "bf16" else
                       "float16" if "fp16" in (spec.dtype, spec.float_dtype) else "float32")
        self.stored: dict[Value, Stored] = {}
        self.outputs = {id(v) for v in graph.outputs}
        self.consts: dict[tuple[int, str], relax.Expr] = {}
        self.kernels: list[str] = []
        self.cache: dict[int, list] = {}
        self.shared: dict = {}
        # (root, var, call, emit) in emission order: call is main's call_tir; emit(bb, sub) emits it
        # again in bb with its inputs mapped by sub (the debug functions replay main's calls, with any
        # views around them) and returns (the stored value, the call_tir)
        self.calls: list[tuple[Value, relax.Var, relax.Call, Callable]] = []
        self.sources: dict[str, tuple] = {}    # kernel name -> (unscheduled PrimFunc, schedule kind): --tune
        self.pool: dict | None = None          # constants by content, when several shapes share a module

    def share_kernels(self, other: "Lowering") -> "Lowering":
        """Build into ``other``'s module (the model at another shape), reusing its kernels and constants."""
        self.kernels, self.cache, self.shared, self.sources = other.kernels, other.cache, other.shared, other.sources
        self.pool = other.pool
        return self

    def constant(self, arr: np.ndarray) -> relax.Expr:
        """``relax.const(arr)``; with a pool (several shapes in one module), one object per content."""
        if self.pool is None:
            return relax.const(arr, str(arr.dtype))
        key = (arr.shape, arr.dtype.str, hashlib.blake2b(arr.tobytes(), digest_size=16).digest())
        if key not in self.pool:
            self.pool[key] = relax.const(arr, str(arr.dtype))
        return self.pool[key]

    def storage_dtype(self, v: Value) -> str:
        if v.dtype in FLOATS and id(v) not in self.outputs:
            return self.fdtype
        if is_fp8(v.dtype) and (id(v) in self.outputs or v in self.graph.inputs):
            raise LoweringError(f"%{v.name} is a float8 graph {'output' if id(v) in self.outputs else 'input'}: "
                                "artifacts take and return float32 (or integer) tensors; dequantize it")
        return "uint8" if is_fp8(v.dtype) else v.dtype     # float8 values are stored as their bits

    def float_storage(self, arr: np.ndarray, keep_fp32: bool = False) -> str:
        """fp16 for weights (when compiling for fp16) unless they do not fit its range; bf16
        (float32's exponent range) always."""
        if self.fdtype == "float32" or keep_fp32 or arr.size == 0:
            return "float32"
        if self.fdtype == "bfloat16":
            return "bfloat16"
        return "float16" if float(np.abs(arr).max()) < 60000.0 else "float32"

    def const_buf(self, ctx: KernelCtx, v: Value) -> Buf:
        dt = self.float_storage(v.data) if v.dtype in FLOATS else "uint8" if is_fp8(v.dtype) else v.dtype
        key = (id(v), dt)
        if key not in self.consts:
            data = v.data.view(np.uint8) if is_fp8(v.dtype) else v.data        # float8: its bits
            arr = np.ascontiguousarray(data.astype(dt).reshape(v.shape or (1,)))
            self.consts[key] = self.constant(arr)
        ph = te.placeholder(v.shape or (1,), dt, name=f"c{len(ctx.params)}")
        ctx.params.append((ph, self.consts[key]))
        return Buf(ph, v.shape, v.dtype)

    # -- one group -> one PrimFunc ------------------------------------------------------------------
    def emit_group(self, bb: relax.BlockBuilder, g: Group, order: dict[Op, int]) -> None:
        members = g.members_in_order(order)
        root = g.root
        sdt = self.storage_dtype(root)
        alias = self._alias(members, root, sdt)
        if alias is not None:
            self.stored[root] = alias
            return
        shared = kshared.plan(self, g, members, self.stored, self.storage_dtype,
                              lambda: self._root_block(g, KernelCtx(self), root))
        if shared is not None:
            self._emit_shared(bb, root, shared)
            return
        env: dict[Value, LTensor] = {}
        ctx = KernelCtx(self)
        member_set = set(members)
        for op in members:
            ctx.op = op
            ins = []
            for v in op.operands:
                if v not in env:
                    env[v] = ctx.operand(v) if (v.producer not in member_set) else None
                if env[v] is None:
                    raise LoweringError(f"internal: operand %{v.name} of {op.describe()} not built yet")
                ins.append(env[v])
            attrs = {**REGISTRY[op.kind].defaults, **op.attrs} if op.kind in REGISTRY else dict(op.attrs)
            builder = ANCHOR_BUILDERS.get(op.kind) if op.kind in ANCHORS else LAZY_BUILDERS.get(op.kind)
            if builder is None:
                raise LoweringError(f"x86 codegen cannot lower op kind '{op.kind}' ({op.describe()})")
            try:
                fmt = ksparse.layer_format(self.graph, op)     # graph.meta["sparsity"]: a sparse kernel
                outs = ksparse.build(ctx, fmt, attrs, ins, [r.type for r in op.results]) if fmt else None
                if outs is None:
                    outs = builder(ctx, attrs, ins, [r.type for r in op.results])
            except NotImplementedError as e:
                raise LoweringError(f"{op.describe()}: {e}") from None
            for r, t in zip(op.results, outs):
                env[r] = t
            if op.kind in ANCHORS:
                acc = outs[0]
                ctx.block = ctx.block or getattr(acc, "block", 0)    # the block its schedule stores
                ctx.anchor_acc = acc
        val = env[root]
        block = self._root_block(g, ctx, root)
        acc = getattr(ctx, "anchor_acc", None)
        if (isinstance(val, Buf) and val is acc and val.block == block and val.tensor.dtype == sdt
                and not isinstance(val.tensor.op, te.PlaceholderOp)):
            out = val.tensor
            phys = val.phys_shape
        else:
            use_acc_shape = (isinstance(acc, Buf) and acc.block == 0 and block == 0 and acc.shape == root.shape
                             and not isinstance(acc.tensor.op, te.PlaceholderOp))
            if use_acc_shape:
                phys = acc.phys_shape
                view = Buf(te.placeholder(phys, sdt), root.shape, root.dtype)  # only for index mapping
                out = te.compute(phys, _phys_body(val, view, sdt), name="out")
            else:
                out = materialize(val, block, sdt, "out")
                phys = tuple(int(d) for d in out.shape)
        ctx.params = _read_params(ctx.params, out)
        func = te.create_prim_func([p for p, _ in ctx.params] + [out])
        kind, params = ctx.sched
        gv = self._add_kernel(bb, func, ctx.sched, (g.anchor or root.producer).kind.lower())
        args, ty = [e for _, e in ctx.params], relax.TensorType(phys, sdt)

        def emit(bb, sub, name=_hint(root.name)):
            call = relax.call_tir(gv, [sub(a) for a in args], ty)
            return bb.emit(call, name_hint=name), call
        var, call = emit(bb, lambda a: a)
        self.stored[root] = Stored(var, phys, sdt, block)
        self.calls.append((root, var, call, emit))

    def _emit_shared(self, bb: relax.BlockBuilder, root: Value, p) -> None:
        """A call of the shape-generic sparse kernel (:mod:`.kernels.sparse_shared`) for ``p``'s
        key, built once per key and shared by every layer of that key."""
        gv = self.shared.get(p.key)
        if gv is None:
            name = f"k{len(self.kernels)}_sparse_shared"
            self.kernels.append(name)
            gv = bb.add_func(kshared.build(p.key).without_attr("global_symbol"), name)
            self.shared[p.key] = gv
        sdt = p.key.out_dtype
        blk = p.out_block
        phys = phys_shape(root.shape, blk)
        args = kshared.relax_args(p, self.stored)

        def emit(bb, sub, name=_hint(root.name)):
            # the kernel takes every tensor as NCHW{b}c: a plain NCHW one as a (N, C, H, W, 1) view
            ins = [bb.emit(relax.op.reshape(sub(a), kshared.rank5(a.ty.shape))) if len(a.ty.shape) == 4 else sub(a)
                   for a in args]
            call = relax.call_tir(gv, ins, relax.TensorType(kshared.rank5(phys), sdt))
            out = bb.emit(call, name_hint=name)
            return (out if len(phys) == 5 else bb.emit(relax.op.reshape(out, phys), name_hint=name)), call
        var, call = emit(bb, lambda a: a)
        self.stored[root] = Stored(var, phys, sdt, blk)
        self.calls.append((root, var, call, emit))

    def _add_kernel(self, bb: relax.BlockBuilder, func, sched, hint: str) -> relax.GlobalVar:
        """Schedule ``func`` and add it to the module, reusing an identical kernel (same
        computation and shapes: weights are arguments) scheduled before."""
        key = tvm_ffi.structural_hash(func)
        for other, gv in self.cache.get(key, []):
            if tvm_ffi.structural_equal(other, func):
                return gv
        kind, params = sched
        scheduled = apply_rules(self.rules, Kernel(func, kind, params, self.vw), self.spec)
        name = f"k{len(self.kernels)}_{hint}"
        self.kernels.append(name)
        self.sources[name] = (func, kind)
        gv = bb.add_func(scheduled.without_attr("global_symbol"), name)
        self.cache.setdefault(key, []).append((func, gv))
        return gv

    def _alias(self, members, root: Value, sdt: str) -> Stored | None:
        """A chain of reshapes over a stored plain tensor of the same dtype is that tensor."""
        if not members or any(op.kind not in kshape.RESHAPES for op in members):
            return None
        src = members[0].operands[0]
        if src not in self.stored or id(root) in self.outputs:
            return None
        s = self.stored[src]
        if s.block or s.dtype != sdt:
            return None
        chain = src
        for op in members:
            if op.operands[0] is not chain:
                return None
            chain = op.result
        return s if chain is root else None

    def _root_block(self, g: Group, ctx: KernelCtx, root: Value) -> int:
        if id(root) in self.outputs or len(root.shape) != 4:
            return 0
        if g.anchor is not None and ctx.block and root.shape[1] % ctx.block == 0 \
                and g.anchor.results[0].shape == root.shape:
            return ctx.block
        for op in g.ops:
            for v in op.operands:
                s = self.stored.get(v)
                if s is not None and s.block and len(v.shape) == 4 and root.shape[1] % s.block == 0:
                    return s.block
        return 0

    # -- the whole graph ------------------------------------------------------------------------------
    def run(self, bb: relax.BlockBuilder | None = None, name: str = "main") -> tvm.IRModule:
        """Add the function ``name`` (and the debug functions) to ``bb``'s module (default: a new one)."""
        graph = self.graph
        order = {op: i for i, op in enumerate(graph.ops)}
        groups = plan(graph)
        bb = bb or relax.BlockBuilder()
        params = [relax.Var(_hint(v.name), relax.TensorType(v.shape, v.dtype)) for v in graph.inputs]
        for v, p in zip(graph.inputs, params):
            self.stored[v] = Stored(p, v.shape or (1,), v.dtype) if v.shape else Stored(p, (), v.dtype)
        with bb.function(name, params):
            with bb.dataflow():
                for i, g in enumerate(groups):
                    self.emit_group(bb, g, order)
                    report("lower", i + 1, len(groups))
                outs = [self._output(bb, v) for v in graph.outputs]
                res = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
            bb.emit_func_output(res)
        self._debug_function(bb)
        return bb.get()

    def _debug_function(self, bb: relax.BlockBuilder) -> None:
        """Two more functions for ``qcompile verify``, both making ``main``'s kernel calls (same
        PrimFuncs, same constants, same order) and returning every value a kernel stores, in its
        stored layout (NCHW{b}c or plain):

        * ``debug(inputs...)``: chained as in ``main``;
        * ``debug_alone(inputs..., stored...)``: each kernel reads the *given* stored values instead
          of its producers' results, so a layer can be checked alone on another engine's inputs.

        The stored values' names, logical/stored shapes and dtypes go to
        ``graph.meta["debug_outputs"]`` (the artifact's manifest lists them)."""
        graph = self.graph
        graph.meta.pop("debug_outputs", None)
        if not self.spec.debug_layers:
            return
        if self.spec.family is Family.CUDA:
            return        # tvm.compile's CUDA pipeline fuses call_tirs: debug could differ from main
        if not any(root.type.quant is not None and root.dtype not in FLOATS for root, *_ in self.calls):
            return
        stored = [(root, var, relax.TensorType(self.stored[root].phys, self.stored[root].dtype))
                  for root, var, *_ in self.calls]
        for name, alone in (("debug", False), ("debug_alone", True)):
            params = [relax.Var(_hint(v.name), relax.TensorType(v.shape, v.dtype)) for v in graph.inputs]
            subst = {self.stored[v].expr: p for v, p in zip(graph.inputs, params)}
            if alone:
                given = [relax.Var(_hint(root.name) + "_in", t) for root, _, t in stored]
                subst.update({var: p for (_, var, _), p in zip(stored, given)})
                params += given
            results = []
            with bb.function(name, params):
                with bb.dataflow():
                    for root, var, _, emit in self.calls:
                        out, _ = emit(bb, lambda a: subst.get(a, a))
                        results.append(out)
                        if not alone:
                            subst[var] = out
                    res = bb.emit_output(relax.Tuple(results))
                bb.emit_func_output(res)
        graph.meta["debug_outputs"] = [
            {"name": root.name, "shape": list(root.shape), "dtype": root.dtype,
             "stored_shape": list(self.stored[root].phys), "stored_dtype": self.stored[root].dtype}
            for root, _, _ in stored]

    def _output(self, bb, v: Value) -> relax.Expr:
        if v.is_const:
            return relax.const(np.ascontiguousarray(v.data), str(v.data.dtype))
        s = self.stored[v]
        e = s.expr
        if s.dtype != v.dtype:
            e = bb.emit(relax.op.astype(e, v.dtype))
        if tuple(s.phys) != tuple(v.shape):
            e = bb.emit(relax.op.reshape(e, v.shape))
        return e


def _unpacked(v: Value):
    raise LoweringError(f"%{v.name}: a 4-bit constant is read only by a kernel that unpacks it (MatMulNBits, "
                        "GatherBlockQuantized)")


def _read_params(params: list[tuple[te.Tensor, relax.Expr]], out: te.Tensor) -> list:
    """The kernel arguments that ``out`` reads. A builder gets every constant operand as an argument
    but may read only a re-laid-out copy of it (packed dense/conv weights, made with ctx.param); an
    argument left unread would still put the original into the artifact's constant pool, storing
    those weights twice (an fp32 model.so twice the size of its weights)."""
    seen, stack = set(), [out.op]
    while stack:
        op = stack.pop()
        for t in getattr(op, "input_tensors", ()):
            if t.op not in seen:
                seen.add(t.op)
                stack.append(t.op)
    return [(p, e) for p, e in params if p.op in seen]


def _phys_body(val: LTensor, view: Buf, sdt: str):
    from .kernels.tensor import cast, simplified
    return simplified(view.phys_shape, lambda *p: cast(val.at(_logical(view, p)), sdt))


def _logical(view: Buf, p) -> tuple:
    from .kernels.tensor import linearize, unravel
    return unravel(linearize(p, view.phys_shape), view.shape)


def _hint(name: str) -> str:
    s = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return s if s and not s[0].isdigit() else "v" + s


def lower(graph: Graph, spec: TargetSpec, sources: dict | None = None, gpu_schedules: bool = True) -> tvm.IRModule:
    """The Relax module for ``graph`` on ``spec`` (CPU: scheduled TIR kernels; CUDA: plain-layout
    TIR kernels, the int8 GEMMs and small-window reductions scheduled, the rest left for
    tvm.compile's CUDA pipeline to schedule with dlight). ``sources``, if given, receives each
    kernel's name -> (unscheduled PrimFunc, schedule kind) (codegen/tune.py).
    ``gpu_schedules=False`` leaves every CUDA kernel unscheduled: the module also compiles for a CPU
    then (tests check the CUDA computes there)."""
    low = Lowering(_codegen_graph(graph, spec), spec, gpu_schedules)
    mod = low.run()
    if sources is not None:
        sources.update(low.sources)
    return mod


def lower_shape(bb: relax.BlockBuilder, name: str, graph: Graph, spec: TargetSpec,
                share: Lowering | None = None) -> Lowering:
    """Add ``graph``'s function ``name`` to ``bb``'s module, reusing the identical kernels and
    constants of ``share``: the same model at another input shape (``--dynamic``'s buckets)."""
    low = Lowering(_codegen_graph(graph, spec), spec)
    low.pool = {}
    if share is not None:
        low.share_kernels(share)
    low.run(bb, name)
    low.graph, low.stored, low.calls = None, {}, []      # the module holds what it needs: let the graph go
    return low


def _codegen_graph(graph: Graph, spec: TargetSpec) -> Graph:
    """``graph`` as the kernels take it (a copy where anything changes): a QDQ model's int8 weights
    behind DequantizeLinear as float constants (``dequantize-weights``; activations' Q/DQ stay),
    then the padded channels its convs compute stored (:mod:`.channel_padding`)."""
    from ..passes import PassContext
    from ..passes.dequantize_weights import constant_quant_ops, dequantize_weights
    from .channel_padding import padded_graph
    if constant_quant_ops(graph):
        graph = graph.clone()
        dequantize_weights(graph, PassContext())
    return padded_graph(graph, spec)


def tvm_compile(mod: tvm.IRModule, spec: TargetSpec) -> tvm.runtime.Executable:
    """``tvm.compile`` for ``spec.tvm`` without the TIR argument asserts.

    Every kernel is called only by the Relax VM's own ``main`` (and ``debug``), with buffers whose
    shapes and dtypes the VM has already checked against the function signature (the VM's
    ``check_tensor_info``/``match_shape`` builtins are bytecode, not TIR asserts, and stay), so the
    per-kernel checks of MakePackedAPI (shape, stride, dtype, device of every argument, with their
    message strings) only cost code: measured 444 -> 296 KB of model.so on the Fashion-MNIST
    MobileNet int8 (.text 176 -> 52 KB)."""
    config = {"tirx.disable_assert": True}
    if spec.family is Family.CUDA:
        from .tensor_intrin import import_tensor_intrin
        import_tensor_intrin()              # dlight's fp16 tensor-core rule imports it (46 s -> 8 s)
        if os.environ.get("QC_CUDA_GRAPH") == "1":     # experiment (bench_cuda)
            config["relax.backend.use_cuda_graph"] = True
    from .x86 import pipeline as cpu_pipeline
    pipeline = cpu_pipeline.tir_pipeline() if spec.family is not Family.CUDA else "default"
    with tvm.transform.PassContext(opt_level=3, config=config):
        return tvm.compile(mod, target=tvm.target.Target(spec.tvm), tir_pipeline=pipeline)


def build_module(graph: Graph, spec: TargetSpec) -> tvm.runtime.Executable:
    """lower() + tvm.compile for ``spec.tvm``: the executable the artifact writer exports."""
    mod = lower(graph, spec)
    report("tvm.compile")
    return tvm_compile(mod, spec)


def compile_timed(graph: Graph, spec: TargetSpec) -> tuple[tvm.runtime.Executable, dict]:
    """build_module with the time spent lowering+scheduling and in tvm.compile (seconds)."""
    t0 = time.perf_counter()
    mod = lower(graph, spec)
    t1 = time.perf_counter()
    report("tvm.compile")
    ex = tvm_compile(mod, spec)
    t2 = time.perf_counter()
    return ex, {"lower_s": t1 - t0, "compile_s": t2 - t1, "kernels": sum(
        1 for gv in mod.functions if isinstance(mod[gv], tvm.tirx.PrimFunc))}
