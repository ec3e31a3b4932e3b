"""Per-layer int8 and float latency on the target, for latency-aware selective unquantization.

Selective unquantization (issue #7) keeps a set F of layers in float. Accuracy-only tools pick F by
damage alone and can make a model *slower than plain float*: every float island costs its float
kernels plus a QuantizeLinear/DequantizeLinear conversion at each of its boundaries, and on some
layers the int8 kernel is not faster than the float one in the first place. This module predicts
the latency of a mixed-precision build for any F, so that the selection
(:func:`qcompiler.plan.select.select_float_layers`, ``cost=costs.latency``) can prefer, among the
sets that meet the accuracy budget, the fastest one::

    T(F) = Σ_{l int8 under F} t8[l]  +  Σ_{l float under F} tf[l]  +  Σ_{c in conv(F)} (a + b · n_c)

* "int8/float under F" is the quantize pass's own plan (:func:`qcompiler.passes.quantize_plan.plan`)
  with ``keep_float ∪ F``: a MaxPool or Relu after a float conv turns float too, exactly as in the
  build, so T sees what the compiler will emit;
* conv(F) are the conversions that plan inserts: a QuantizeLinear for every float value entering
  an int8 op and a DequantizeLinear for every int8 value read by a float op or returned by the
  graph (both once per value, as the rewrite shares them), with n_c elements each. The input's Q
  and the output's DQ of an all-int8 model are counted too, so :meth:`LayerCosts.boundaries` of
  the empty set is 2 for a one-input one-output CNN, and an island of k float layers in a chain
  adds 2 (merging two islands that are one int8 layer apart removes 2);
* t8[l], tf[l]: measured on the host (``measure=True``, the default for x86 targets on an x86
  host): the model is lowered and compiled once all-int8 and once all-float with the real code
  generator (:mod:`qcompiler.codegen.lower`), every kernel (one TIR PrimFunc per fused group) is
  timed alone with TVM's ``time_evaluator`` (median of ``repeats`` rounds of at least
  ``min_repeat_ms``; its constants are the real weights, its activations seeded random data), and
  a kernel's time is split over the IR layers fused into it in proportion to their work (MACs for
  conv/gemm, elements otherwise: a fused bias/residual/activation epilogue gets a small share);
  time attributed to a Q/DQ inside a kernel is left to the conversion term. Layer names are the
  op names of the float graph after the quantize pass's prepare step, which are the names the
  quantized ops keep (``graph.meta["quant"]["layers"]``);
* a, b: a standalone QuantizeLinear and DequantizeLinear kernel timed at two sizes (4,096 and
  262,144 elements) and fit with a line (the average of Q and DQ; a conversion fused into a conv's
  epilogue costs less, so this errs on the side of merging islands).

With ``remote`` (a :class:`qcompiler.runtime.remote.RemoteBoard`, from ``qcompile --rpc-tracker
HOST:PORT --rpc-key KEY``) the same kernels are timed on a board of a device farm instead: the
kernel library is exported (cross-linked for ``--target arm``), uploaded over TVM RPC and loaded
there, and ``time_evaluator`` runs on the board's CPU, so only the kernel, not the network, is
timed; the constants and random activations are copied to the board once per kernel.

Without a measurement (``--target arm`` or ``cuda`` from this x86 machine, and no board) an analytic model
gives t = MACs / R[precision] + bytes / BW with the per-family constants in :data:`ANALYTIC`
(MAC rates: x86 from the 3x3 conv of /work/shared/tvm-notes (115.6 MMAC: TVM fp32 1.57 ms, int8
0.73 ms on 2 cores); cuda from ResNet-18 on an H100; arm a stated assumption, not a measurement; only
their ratios matter to the choice).
"""
from __future__ import annotations

import dataclasses
import platform
import warnings
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from ..codegen.target import Family
from ..ir.graph import Graph, Op, Value
from ..ir.types import QuantParams, TensorType
from ..passes import PassContext, PassManager, quantize_plan
from ..passes.quantize import QuantizeOptions

CONV_KINDS = ("Conv", "FusedConv", "QLinearConv", "ConvTranspose")
GEMM_KINDS = ("Gemm", "FusedGemm", "QLinearGemm", "MatMul")
POOL_KINDS = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "QLinearGlobalAveragePool",
              "QLinearAveragePool")
CONVERSIONS = ("QuantizeLinear", "DequantizeLinear")


@dataclass(frozen=True)
class Analytic:
    """Throughput constants of the analytic cost model: MACs per ms by precision, bytes per ms,
    and a fixed per-kernel overhead (ms)."""
    mac_per_ms: dict
    bytes_per_ms: float
    kernel_ms: float


ANALYTIC = {
    # x86: tvm-notes, 1x64x56x56 3x3 conv, 115.6 MMAC: fp32 1.57 ms, int8 (AVX2 u8 x s8) 0.73 ms
    "x86": Analytic({"int8": 158e6, "fp32": 74e6, "fp16": 74e6}, 10e6, 0.002),
    # arm (assumed, cortex-a76 class, 128-bit NEON; the plain int8 loops ~1.5x fp32; the sdot kernels of a
    # +dotprod build are faster still -- llvm-mca 0.55 cycles per sdot in the conv loop -- not timed on a board)
    "arm": Analytic({"int8": 30e6, "fp32": 20e6, "fp16": 20e6}, 5e6, 0.004),
    # cuda: H100, ResNet-18 at batch 64 (README "CUDA on an H100"): int8 on WMMA 116.5 GMAC in 4.34 ms
    # (2026-11-24, 64-row tiles; 4.97 before), fp16 17.7 ms; fp32 (not timed) taken as fp16's SIMT figure, 25.8 ms
    "cuda": Analytic({"int8": 26.8e9, "fp32": 4.5e9, "fp16": 6.6e9}, 2e9, 0.005),
}
BYTES = {"int8": 1, "fp32": 4, "fp16": 2}


# ---- work of one op ---------------------------------------------------------------------------------
def _numel(v: Value) -> int:
    return int(np.prod(v.shape)) if v.shape else 1


def macs(op: Op) -> int:
    """Multiply-accumulates of a conv/gemm op (0 for others)."""
    if op.kind in CONV_KINDS:
        w = op.operands[1]
        return _numel(op.result) * int(np.prod(w.shape[1:]))
    if op.kind in GEMM_KINDS:
        a = op.operands[0]
        k = a.shape[0] if op.attrs.get("transA", 0) else a.shape[-1]
        return _numel(op.result) * int(k)
    return 0


def work(op: Op) -> float:
    """Relative work of an op for splitting a fused kernel's time: MACs for conv/gemm, the input
    size for pooling, else the largest operand/result size."""
    m = macs(op)
    if m:
        return float(m)
    acts = [v for v in op.operands if v is not None and not v.is_const]
    if op.kind in POOL_KINDS and acts:
        return float(_numel(acts[0]))
    return float(max([_numel(r) for r in op.results] + [_numel(v) for v in acts] + [1]))


# ---- the cost table -------------------------------------------------------------------------------
@dataclass
class Conversion:
    value: str              # the float value converted
    kind: str               # "Q" (float -> int8) or "DQ" (int8 -> float)
    elements: int


@dataclass
class LayerCosts:
    """Per-layer costs (ms) of one model on one target; see the module docstring for T(F)."""
    graph: Graph                                  # the float graph after the quantize pass's prepare
    int8_ms: dict[str, float]                     # layer -> its int8 kernel time (layers int8 in the all-int8 plan)
    float_ms: dict[str, float]                    # layer -> its float kernel time (every layer)
    conversion_ms: tuple[float, float]            # (a, b): one conversion of n elements costs a + b n
    keep_float: frozenset = frozenset()           # base keep_float (default rules, --keep-float)
    method: str = "measured"                      # "measured" on the host, or "analytic"
    target: str = "x86"
    float_dtype: str = "fp32"
    measured_on: str = "host"                     # "host", or the RPC board ("board HOST:PORT (key K)")
    _plans: dict = field(default_factory=dict, repr=False)

    # -- plan under a float set -------------------------------------------------------------------
    def plan(self, float_set: Iterable[str] = frozenset()):
        """The quantize pass's plan for ``keep_float ∪ float_set`` (cached)."""
        key = frozenset(float_set)
        if key not in self._plans:
            self._plans[key] = quantize_plan.plan(self.graph, QuantizeOptions(keep_float=self.keep_float | key))
        return self._plans[key]

    def precisions(self, float_set: Iterable[str] = frozenset()) -> dict[str, str]:
        """layer -> "int8" or "float" in the build with ``float_set`` kept float."""
        p = self.plan(float_set)
        return {op.name: "int8" if op in p.role else "float" for op in self.graph.ops}

    def conversions(self, float_set: Iterable[str] = frozenset()) -> list[Conversion]:
        """The Q/DQ conversions the quantize pass inserts for ``float_set`` (once per value)."""
        p = self.plan(float_set)
        out = [Conversion(v.name, "Q", _numel(v)) for v in sorted(p.boundary, key=lambda v: v.name)
               if not v.is_const]
        outputs = {id(v) for v in self.graph.outputs}
        for op, role in p.role.items():
            if role == "fold" or op in p.float_out:        # a float32 result: dequantized in the epilogue
                continue
            v = p.out.get(op, op.result)
            if id(v) in outputs or any(u not in p.role for u in v.users):
                out.append(Conversion(v.name, "DQ", _numel(v)))
        return out

    def boundaries(self, float_set: Iterable[str] = frozenset()) -> int:
        """Number of QuantizeLinear/DequantizeLinear conversions in the build with ``float_set``."""
        return len(self.conversions(float_set))

    def conversion_cost(self, elements: int) -> float:
        a, b = self.conversion_ms
        return a + b * elements

    def latency(self, float_set: Iterable[str] = frozenset()) -> float:
        """Predicted latency (ms) of the build with ``float_set`` kept float: T(F) above."""
        prec = self.precisions(float_set)
        t = sum(self.int8_ms.get(n, self.float_ms.get(n, 0.0)) if p == "int8" else self.float_ms.get(n, 0.0)
                for n, p in prec.items())
        return t + sum(self.conversion_cost(c.elements) for c in self.conversions(float_set))

    def float_latency(self) -> float:
        """Every layer float, no conversions: the plain float model."""
        return sum(self.float_ms.get(op.name, 0.0) for op in self.graph.ops)

    def slower_than_float(self) -> list[str]:
        """int8 layers whose int8 time exceeds their float time."""
        return [n for n, t in self.int8_ms.items() if t > self.float_ms.get(n, float("inf"))]

    def to_json(self, float_set: Iterable[str] = frozenset()) -> dict:
        """For report.json: per-layer ms in both precisions, the precision chosen, boundaries."""
        prec = self.precisions(float_set)
        names = [op.name for op in self.graph.ops if op.name in self.int8_ms]
        return {
            "method": self.method, "target": self.target, "float_dtype": self.float_dtype,
            "measured_on": self.measured_on if self.method == "measured" else None,
            "conversion_ms": {"fixed": self.conversion_ms[0], "per_element": self.conversion_ms[1]},
            "layers": [{"layer": n, "int8_ms": round(self.int8_ms[n], 5),
                        "float_ms": round(self.float_ms.get(n, 0.0), 5), "precision": prec.get(n, "float")}
                       for n in names],
            "boundaries": self.boundaries(float_set),
            "latency_ms": round(self.latency(float_set), 4),
            "all_int8_latency_ms": round(self.latency(frozenset()), 4),
            "float_latency_ms": round(self.float_latency(), 4),
            "slower_than_float": self.slower_than_float(),
        }


# ---- building it ----------------------------------------------------------------------------------
def prepared_float_graph(graph: Graph, keep_float: Iterable[str] = frozenset()) -> Graph:
    """A clone of ``graph`` (after the default passes, not quantized) after the quantize pass's
    prepare step: the graph whose op names the selection and the quantized layers use."""
    g = graph.clone()
    quantize_plan.prepare(g, QuantizeOptions(keep_float=frozenset(keep_float)))
    return g


def quantize_for_timing(prepared: Graph, keep_float: Iterable[str] = frozenset()) -> Graph:
    """An all-int8 clone of ``prepared`` for timing only: ranges from two random samples (kernel
    times do not depend on the scales), no bias correction."""
    g = prepared.clone()
    opts = QuantizeOptions(keep_float=frozenset(keep_float), random_samples=2, bias_correction=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PassManager("quantize", ctx=PassContext(options={"quantize": opts})).run(g)
    return g


def host_can_measure(spec) -> bool:
    return spec.family is Family.X86 and platform.machine().lower() in ("x86_64", "amd64")


def measure_layer_costs(graph: Graph, spec, *, keep_float: Iterable[str] = frozenset(),
                        int8_graph: Graph | None = None, float_dtype: str = "fp32",
                        measure: bool | None = None, repeats: int = 5,
                        min_repeat_ms: float = 5.0, remote=None) -> LayerCosts:
    """Per-layer int8 and float costs of ``graph`` (after the default passes, before quantize; not
    modified) on ``spec`` (a :class:`~qcompiler.codegen.target.TargetSpec`; its dtype is ignored).

    ``int8_graph``: the quantized graph if the caller has one (else one is made for timing);
    ``float_dtype``: "fp16" times the float build with fp16 storage; ``measure``: time kernels on
    this host (default: when the target is x86 and so is the host), else the analytic model;
    ``remote``: a :class:`~qcompiler.runtime.remote.RemoteBoard` to time the kernels on instead of
    this host (CPU targets: x86, arm)."""
    keep_float = frozenset(keep_float)
    prepared = prepared_float_graph(graph, keep_float)
    names = {op.name for op in prepared.ops}
    if measure is None:
        measure = remote is not None or host_can_measure(spec)
    if int8_graph is None:
        int8_graph = quantize_for_timing(prepared, keep_float)
    fspec = dataclasses.replace(spec, dtype=float_dtype)
    if measure:
        int8_k = kernel_times(int8_graph, dataclasses.replace(spec, dtype="int8"), repeats, min_repeat_ms, remote)
        float_k = kernel_times(prepared, fspec, repeats, min_repeat_ms, remote)
        conv = conversion_fit(fspec, repeats, min_repeat_ms, remote)
        method = "measured"
    else:
        consts = ANALYTIC[spec.family]
        int8_k = analytic_times(int8_graph, consts, "int8")
        float_k = analytic_times(prepared, consts, float_dtype)
        conv = (consts.kernel_ms, (BYTES["int8"] + BYTES[float_dtype]) / consts.bytes_per_ms)
        method = "analytic"
    int8_ms = attribute(int8_k, names)
    float_ms = attribute(float_k, names)
    # layers int8 in the all-int8 plan; a layer with no kernel of its own (a reshape aliasing its
    # input) costs 0 in both precisions
    costs = LayerCosts(prepared, {}, float_ms, conv, keep_float, method, spec.family, float_dtype,
                       str(remote) if remote is not None and measure else "host")
    for n, p in costs.precisions().items():
        if p == "int8":
            costs.int8_ms[n] = int8_ms.get(n, 0.0)
            costs.float_ms.setdefault(n, 0.0)
    return costs


def attribute(kernels: list[tuple[list[Op], float]], names: set[str]) -> dict[str, float]:
    """Split each kernel's time over its member layers by :func:`work`. Members that are not
    layers of the float graph (Requantize) count for the kernel's main layer (its anchor or last
    layer); Q/DQ members take their share away (the conversion term prices them)."""
    out: dict[str, float] = {}
    for members, ms in kernels:
        layers = [op for op in members if op.name in names and op.kind not in CONVERSIONS]
        main = next((op for op in layers if macs(op) or op.kind in POOL_KINDS), layers[-1] if layers else None)
        shares: dict[str, float] = {}
        for op in members:
            w = work(op)
            if op.kind in CONVERSIONS and op.name not in names:
                shares["<conversion>"] = shares.get("<conversion>", 0.0) + w
            elif op.name in names:
                shares[op.name] = shares.get(op.name, 0.0) + w
            elif main is not None:
                shares[main.name] = shares.get(main.name, 0.0) + w
        total = sum(shares.values()) or 1.0
        for n, w in shares.items():
            if n != "<conversion>":
                out[n] = out.get(n, 0.0) + ms * w / total
    return out


def analytic_times(graph: Graph, consts: Analytic, precision: str) -> list[tuple[list[Op], float]]:
    """One 'kernel' per op: MACs at the precision's rate plus its bytes moved, plus an overhead."""
    res = []
    for op in graph.ops:
        if op.kind in CONVERSIONS:
            continue
        quant = any(v.type.quant is not None for v in list(op.operands) + list(op.results) if v is not None)
        p = "int8" if quant else precision
        nbytes = sum(_numel(v) for v in list(op.operands) + list(op.results) if v is not None and not v.is_const)
        t = macs(op) / consts.mac_per_ms[p] + nbytes * BYTES[p] / consts.bytes_per_ms + consts.kernel_ms
        res.append(([op], t))
    return res


def kernel_times(graph: Graph, spec, repeats: int = 5, min_repeat_ms: float = 5.0,
                 remote=None) -> list[tuple[list[Op], float]]:
    """Lower and compile ``graph`` for ``spec`` and time every kernel alone on this host (or on
    the RPC board ``remote``): [(the IR ops fused into it, median ms)] in emission order."""
    return [(members, ms) for members, _, _, ms in time_each_kernel(graph, spec, repeats, min_repeat_ms, remote)]


def time_each_kernel(graph: Graph, spec, repeats: int = 5, min_repeat_ms: float = 5.0,
                     remote=None) -> list[tuple]:
    """[(the IR ops fused into the kernel, its name, its scheduled PrimFunc, median ms)] for every
    kernel call of ``graph`` built for ``spec``, in emission order, each timed alone on this host
    (or, with ``remote``, a :class:`~qcompiler.runtime.remote.RemoteBoard`, on that board's CPU)
    on its compile-time constants and random activations; identical calls (same kernel and shapes)
    are timed once."""
    import tvm
    from ..codegen.fusion import plan
    from ..codegen.lower import Lowering, tvm_compile
    low = Lowering(graph, spec)
    mod = low.run()
    ex = tvm_compile(mod, spec)
    lib = ex.mod.imports[0] if ex.mod.imports else ex.mod
    dev = tvm.cpu()
    if remote is not None:
        lib, dev = _on_board(lib, spec, remote)
    order = {op: i for i, op in enumerate(graph.ops)}
    groups = {id(g.root): g for g in plan(graph)}
    rng = np.random.default_rng(0)
    out, seen = [], {}
    for root, _, call, _ in low.calls:
        gv = call.args[0]
        name = gv.name_hint
        args = [_arg(a, dev, rng, remote is not None) for a in call.args[1].fields]
        ty = call.ty_args[0]
        args.append(tvm.runtime.empty(tuple(int(d) for d in ty.shape), ty.dtype, dev))
        key = (name, tuple(tuple(a.shape) for a in args))
        if key not in seen:
            f = lib.time_evaluator(name, dev, number=1, repeat=repeats, min_repeat_ms=int(min_repeat_ms))
            seen[key] = float(np.median(f(*args).results)) * 1e3
        out.append((groups[id(root)].members_in_order(order), name, mod[gv], seen[key]))
    return out


def _on_board(lib, spec, remote):
    """Export the kernel library ``lib`` (linked for ``spec``'s family), upload it to the RPC
    board ``remote`` and load it there: (the remote module, the board's CPU device)."""
    import hashlib
    import tempfile
    from pathlib import Path
    from ..codegen.artifact import export_library
    if spec.family is Family.CUDA:
        raise ValueError("remote kernel timing covers CPU targets (x86, arm), not cuda")
    with tempfile.TemporaryDirectory(prefix="qcompiler-kernels-") as tmp:
        path = Path(tmp) / "kernels.so"
        export_library(lib, path, spec, Path(tmp) / "work")     # linked as an artifact's model.so
        name = f"qcompiler-kernels-{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}.so"
        remote.session.upload(str(path), target=name)
    return remote.session.load_module(name), remote.session.cpu(0)


def _arg(a, dev, rng, copy_constants: bool = False):
    import tvm
    if isinstance(a, tvm.ir.expr.Constant):
        return tvm.runtime.tensor(a.value.numpy(), dev) if copy_constants else a.value
    shape = tuple(int(d) for d in a.ty.shape)
    dt = str(a.ty.dtype)
    if dt.startswith("float"):
        arr = rng.uniform(-1, 1, shape).astype(dt)
    elif dt in ("uint8", "int8"):
        arr = rng.integers(0, 128, shape).astype(dt)
    else:
        arr = np.zeros(shape, dt)             # possibly indices: zeros are always in range
    return tvm.runtime.tensor(arr, dev)


CONVERSION_SIZES = (4096, 262144)


def conversion_fit(fspec, repeats: int = 5, min_repeat_ms: float = 5.0, remote=None) -> tuple[float, float]:
    """(a, b) of a + b·n ms for one Q or DQ conversion of n elements: standalone QuantizeLinear and
    DequantizeLinear kernels of the real code generator timed at two sizes, averaged."""
    pts = []
    for n in CONVERSION_SIZES:
        g = Graph("conversion")
        shape = (1, n // 64, 8, 8)
        x = g.add_input("x", TensorType(shape, "float32"))
        qp = QuantParams("uint8", (0.02,), (128,))
        q = g.create_op("QuantizeLinear", [x], result_types=[TensorType(shape, "uint8", qp)], name="q",
                        result_names=["xq"]).result
        y = g.create_op("DequantizeLinear", [q], name="dq", result_names=["y"]).result
        g.outputs = [q, y]
        ks = kernel_times(g, dataclasses.replace(fspec, dtype=fspec.dtype), repeats, min_repeat_ms, remote)
        pts.append(float(np.mean([ms for _, ms in ks])))
    (n0, n1), (t0, t1) = CONVERSION_SIZES, pts
    b = max((t1 - t0) / (n1 - n0), 0.0)
    return max(t0 - b * n0, 0.0), b


# ---- the command line ------------------------------------------------------------------------------
LAYER_COSTS_MODES = ("measure", "model", "off")


def for_budget(graph: Graph, spec, keep_float: Iterable[str], mode: str = "measure",
               log=lambda m: None, remote=None) -> LayerCosts | None:
    """The costs the budgeted selection uses (``qcompile --min-sqnr/--max-accuracy-drop``):
    ``mode`` "measure" times the kernels on this host when it can run the target (else falls back
    to the model, said in the log), or on the RPC board ``remote`` when given (``--rpc-tracker``;
    CPU targets), "model" the analytic model, "off" none (accuracy only)."""
    if mode == "off":
        return None
    if remote is not None and spec.family is Family.CUDA:
        log("layer costs: remote timing covers CPU targets; using the analytic cost model for cuda")
        remote = None
    measure = mode == "measure" and (remote is not None or host_can_measure(spec))
    if mode == "measure" and not measure:
        log(f"layer costs: cannot time {spec.family} kernels on this host; using the analytic cost model")
    where = f" on {remote}" if remote is not None and measure else ""
    log("layer costs: " + (f"building the model all-int8 and all-float and timing every kernel{where}"
                           if measure else "analytic model (MACs and bytes per layer)"))
    return measure_layer_costs(graph, spec, keep_float=keep_float, float_dtype=spec.float_dtype, measure=measure,
                               remote=remote if measure else None)


def format_text(latency: dict) -> str:
    """Lines for stdout after the build table: predicted latency, boundaries, and one warning line
    per int8 layer that is slower than its float version."""
    if not latency:
        return ""
    ms = {r["layer"]: r for r in latency["layers"]}
    on = latency.get("measured_on")
    method = latency["method"] + (f" on {on}" if on and on != "host" else "")
    lines = [f"latency ({method}, {latency['target']}): {latency['latency_ms']:.3f} ms predicted "
             f"with {latency['boundaries']} Q/DQ conversions (all int8 {latency['all_int8_latency_ms']:.3f} ms, "
             f"all float {latency['float_latency_ms']:.3f} ms)"]
    for n in latency["slower_than_float"]:
        r = ms.get(n)
        if r is not None:
            lines.append(f"warning: int8 slower than float: {n}: int8 {r['int8_ms']:.4f} ms > float "
                         f"{r['float_ms']:.4f} ms" + (" (kept float)" if r["precision"] == "float" else ""))
    return "\n".join(lines) + "\n"
