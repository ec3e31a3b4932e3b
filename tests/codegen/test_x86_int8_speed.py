"""The x86 int8 speed changes (issue #5, "our int8 faster than our fp32") keep the kernels BIT-EXACT
with the numpy oracle, and do what they claim in the generated code:

* QuantizeLinear rounds with ``llvm.nearbyint`` and tests NaN on the bits, so TVM vectorizes it
  (``tirx.nearbyint``/``tirx.isnan`` made its loop scalar): ties, NaN, ±inf, huge values exact;
* QLinearMul computes a broadcast operand built in the kernel (the squeeze-excite gate
  Q(HardSigmoid(DQ(s))), a table lookup) once, in a "hoist" stage, not per output element;
* conv/gemm epilogues add the folded bias to the int32 accumulator as a wrapping int32 add (an
  int64 add truncated), so the requantization product stays one ``vpmuldq`` (no ``vpmullq`` in
  the code): exact on accumulators at the extremes, with large folded biases, where the int32 sum
  wraps, and with an immediate negative fold (one output channel; a uint32 add was ``nuw``);
* the x86 schedules launch threads only for kernels whose estimated serial time pays for it.

The tests that assert the structure of generated code compile for every CPU of ``X86_LEVELS`` (an
AVX2 core, the portable x86-64-v3, AVX-512 with and without VNNI), whatever the host; those that
run kernels run them on this host's CPU.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import te

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_x86_int8 import ACT, RNG, SPEC, X86_LEVELS, add_qconv, check_exact, conv_script, qin  # noqa: E402

from qcompiler.codegen.kernels import requant as krequant  # noqa: E402
from qcompiler.codegen.lower import build_module, lower, tvm_compile  # noqa: E402
from qcompiler.codegen.target import TargetSpec  # noqa: E402
from qcompiler.codegen.x86 import schedules as sched  # noqa: E402
from qcompiler.codegen.x86 import threads  # noqa: E402
from qcompiler.ir import Graph, QuantParams, TensorType  # noqa: E402
from qcompiler.quant.requant import conv_multipliers, quantize_multiplier  # noqa: E402


def _quantize_linear_graph(storage):
    g = Graph("q")
    qp = QuantParams(storage, (0.0069,), (110,) if storage == "uint8" else (-7,))
    shape = (1, 3, 48, 64)
    x = g.add_input("x", TensorType(shape, "float32"))
    g.outputs = [g.create_op("QuantizeLinear", [x], result_types=[TensorType(shape, storage, qp)]).result]
    return g


@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_quantize_linear_exact_with_nan_inf_and_ties(storage):
    shape = (1, 3, 48, 64)
    xv = RNG.normal(0, 0.6, shape).astype(np.float32)
    flat = xv.reshape(-1)
    flat[:8] = [np.nan, -np.nan, np.inf, -np.inf, 3e38, -3e38, 0.0, -0.0]
    ties = (np.arange(-40, 40) + 0.5).astype(np.float32) * np.float32(0.0069)      # k + 1/2 steps
    flat[100:100 + ties.size] = ties
    flat[1000:1016] = np.float32(np.nan)                                            # a whole vector of NaN
    check_exact(_quantize_linear_graph(storage), {"x": xv}, f"QuantizeLinear {storage}")


@pytest.mark.parametrize("cpu", X86_LEVELS)
@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_quantize_linear_vectorized(storage, cpu):
    text = lower(_quantize_linear_graph(storage), TargetSpec("x86", cpu=cpu)).script()
    assert "llvm.nearbyint" in text and "T.vectorized" in text


def _se_gate_graph(storage):
    """x -> depthwise conv (blocked) -> GAP -> 1x1 conv -> DQ -> HardSigmoid -> Q -> QLinearMul(x, gate)."""
    g = Graph("q")
    qx = ACT[storage]
    zq = -128 if storage == "int8" else 0
    x = g.add_input("x", TensorType((1, 24, 5, 12), storage, qx))
    a = add_qconv(g, x, 24, (3, 3), group=24, p=(1, 1, 1, 1), act="Relu", out_qp=QuantParams(storage, (0.03,), (zq,)))
    qg = QuantParams(storage, (0.01,), (zq,))
    m1, s1 = quantize_multiplier(0.03 / (0.01 * 60))
    gp = g.create_op("QLinearGlobalAveragePool", [a], {"multiplier": [m1], "shift": [s1]},
                     result_types=[TensorType((1, 24, 1, 1), storage, qg)]).result
    s = add_qconv(g, gp, 24, (1, 1), out_qp=QuantParams(storage, (0.02,), (zq + 5,)))
    d = g.create_op("DequantizeLinear", [s]).result
    h = g.create_op("HardSigmoid", [d], {"alpha": 0.2, "beta": 0.5}).result
    gate = g.create_op("QuantizeLinear", [h], result_types=[
        TensorType((1, 24, 1, 1), storage, QuantParams(storage, (1 / 255,), (zq,)))]).result
    qm = QuantParams(storage, (0.02,), (zq + 3,))
    m, sh = quantize_multiplier(0.03 * (1 / 255) / 0.02)
    y = g.create_op("QLinearMul", [a, gate], {"multiplier": [m], "shift": [sh]},
                    result_types=[TensorType(a.type.shape, storage, qm)]).result
    g.outputs = [add_qconv(g, y, 16, (1, 1)), y]
    return g


@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_squeeze_excite_gate_exact(storage):
    check_exact(_se_gate_graph(storage), {"x": qin(ACT[storage], (1, 24, 5, 12))}, f"SE gate {storage}")


@pytest.mark.parametrize("cpu", X86_LEVELS)
@pytest.mark.parametrize("storage", ["uint8", "int8"])
def test_squeeze_excite_gate_hoisted(storage, cpu):
    mod = lower(_se_gate_graph(storage), TargetSpec("x86", cpu=cpu))
    mul = [mod[gv] for gv in mod.functions if "qlinearmul" in gv.name_hint]
    assert mul, "the gate multiply has its own kernel"
    text = mul[0].script()
    assert 'sblock("hoist_ghl")' in text        # the gate's split multiplier: once per channel (x86/se_mul.py)
    assert "lut" in text                        # ... from the HardSigmoid table


def _extreme_gemm(storage, act):
    """QLinearGemm with K = 64 and weights of ±127 so that Σ x·w reaches ±2 M, int32 biases of up to
    ±2^28, and per-channel multipliers; and inputs at 0/255 or -128/127."""
    m, k, n = 64, 64, 32
    qa = ACT[storage]
    g = Graph("q")
    a = g.add_input("a", TensorType((m, k), storage, qa))
    ws = tuple(float(v) for v in RNG.uniform(0.0005, 0.01, n))
    wq = np.where(RNG.random((n, k)) < 0.5, -127, 127).astype(np.int8)
    wq[: n // 2] = 127                                 # all-positive rows: the accumulator's extremes
    w = g.add_const(wq, "w", QuantParams("int8", ws, (0,) * n, axis=0))
    bias = RNG.integers(-2 ** 28, 2 ** 28, n).astype(np.int32)
    b = g.add_const(bias, "b", QuantParams("int32", tuple(float(np.float32(qa.scale[0]) * np.float32(v)) for v in ws),
                                           (0,) * n, axis=0))
    qo = QuantParams(storage, (40.0,), (10,) if storage == "uint8" else (-3,))
    ms, ss = conv_multipliers(qa.scale[0], ws, qo.scale[0])
    attrs = {"multiplier": ms, "shift": ss, "activation": act, "activation_params": []}
    if act == "HardSwish":
        from qcompiler.quant import hardswish
        attrs.update(hardswish.epilogue_attrs(qa.scale[0], ws, qo, [], n))
    g.outputs = [g.create_op("QLinearGemm", [a, w, b], attrs, result_types=[TensorType((m, n), storage, qo)]).result]
    lo, hi = (0, 255) if storage == "uint8" else (-128, 127)
    av = np.where(RNG.random((m, k)) < 0.5, lo, hi).astype(storage)
    av[: m // 4] = hi
    av[m // 4: m // 2] = lo
    return g, {"a": av}


@pytest.mark.parametrize("storage", ["uint8", "int8"])
@pytest.mark.parametrize("act", ["", "Relu", "HardSwish"])
def test_bias_epilogue_exact_at_the_extremes(storage, act):
    """The epilogue of ``requantized`` on :func:`_extreme_gemm` against the oracle."""
    check_exact(*_extreme_gemm(storage, act), f"bias epilogue {storage} {act or 'none'}")


@pytest.mark.parametrize("cpu", X86_LEVELS)
@pytest.mark.parametrize("act", ["", "Relu"])
def test_bias_epilogue_multiplies_on_vpmuldq(act, cpu):
    """Without HardSwish (whose p·u·m2 is a true 64-bit product) the compiled epilogue multiplies
    with ``vpmuldq`` only, no ``vpmullq`` (an AVX-512DQ instruction the wrapping bias add avoids)."""
    g, _ = _extreme_gemm("uint8", act)
    asm = "".join(m.inspect_source("asm") for m in build_module(g, TargetSpec("x86", cpu=cpu)).mod.imports)
    assert "vpmuldq" in asm and "vpmullq" not in asm


def test_wrapping_add_is_int32_modular():
    """``wrapping_add`` = (x + y) mod 2^32 as int32, also where the sum leaves int32 (a partial
    sum may; the true accumulator + bias does not)."""
    xs = np.array([2 ** 31 - 1, -2 ** 31, 5, -7, 2 ** 30, -1], np.int32)
    ys = np.array([1, -1, -9, 7, 2 ** 30, -2 ** 31], np.int32)
    a, b = te.placeholder((6,), "int32", name="a"), te.placeholder((6,), "int32", name="b")
    out = te.compute((6,), lambda i: krequant.wrapping_add(a[i], b[i]), name="out")
    lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([a, b, out])}), target="llvm")
    got = tvm.runtime.empty((6,), "int32")
    lib["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ys), got)
    want = ((xs.astype(np.int64) + ys) + 2 ** 31) % 2 ** 32 - 2 ** 31
    np.testing.assert_array_equal(got.numpy(), want.astype(np.int32))


@pytest.mark.parametrize("fold", [-428, -4244, 3662, -2 ** 31])
def test_wrapping_add_of_an_immediate_then_requantized(fold):
    """One output channel: the folded bias, multiplier and shift are immediates (``channel_vec``)
    and the narrow (high word) requantization follows the add, vectorized as the kernels are. With
    the bias added as ``reinterpret(int32, uint32(acc) + uint32(fold))`` TVM emitted ``add nuw``,
    and for a negative fold LLVM concluded from it that the sum is negative (poison otherwise):
    every result with acc + fold >= 0 came out as if 2^32 lower (a 1-channel QLinearConv head
    returned its clamp floor). fold = -2^31 where the sum wraps: the form ``int32(int64(acc) +
    fold)`` was bounded by TVM to [-2^31, -1], and the simplifier dropped the upper clamp."""
    qp = QuantParams("int8", (0.05,), (3,))
    m, s = 1154613154, 38
    ctx = _Ctx()
    rq = krequant.requant_fn(ctx, {"multiplier": [m], "shift": [s], "activation": "", "activation_params": []},
                           TensorType((1, 1), "int8", qp), 1)
    fb = krequant.channel_vec(ctx, [fold], "int32", "qbias")
    assert not ctx.params                              # all immediates: the case that failed
    accs = np.concatenate([np.arange(-70000, 70000, 7, dtype=np.int64), [2 ** 31 - 1, -2 ** 31, -fold]])
    accs = accs[(accs >= -2 ** 31) & (accs < 2 ** 31)].astype(np.int32)
    n = accs.size
    acc = te.placeholder((n,), "int32", name="acc")
    out = te.compute((n,), lambda i: rq(krequant.wrapping_add(acc[i], fb(0)), 0), name="out")
    sch = sched.s_tir.Schedule(te.create_prim_func([acc, out]))
    (i,) = sch.get_loops(sch.get_sblock("out"))
    sch.vectorize(sch.split(i, [None, 16])[1])
    lib = tvm.compile(sch.mod, target=TargetSpec("x86").host_tvm)
    got = tvm.runtime.empty((n,), "int32")
    lib["main"](tvm.runtime.tensor(accs), got)
    v = (accs.astype(np.int64) + fold + 2 ** 31) % 2 ** 32 - 2 ** 31           # the int32 sum, wrapped
    want = np.clip(((v.astype(object) * m + (1 << (s - 1))) >> s).astype(np.int64) + 3, -128, 127)
    np.testing.assert_array_equal(got.numpy(), want)


def _elementwise(n):
    x = te.placeholder((n, 16), "float32", name="x")
    y = te.compute((n, 16), lambda i, j: x[i, j] * 2.0, name="out")
    return te.create_prim_func([x, y])


def _conv_like(c, hw):
    """A reduction of c*9 multiply-accumulates per output over (c, hw, hw) outputs."""
    x = te.placeholder((c, hw + 2, hw + 2), "float32", name="x")
    r, i, j = te.reduce_axis((0, c), "r"), te.reduce_axis((0, 3), "i"), te.reduce_axis((0, 3), "j")
    y = te.compute((c, hw, hw), lambda o, a, b: te.sum(x[r, a + i, b + j], axis=[r, i, j]), name="conv")
    return te.create_prim_func([x, y])


def test_threads_only_for_kernels_that_pay_for_them():
    small = sched.apply(_elementwise(256), "generic", {}, 16).script()         # 4 K elements: ~1 us serial
    assert "T.parallel" not in small
    large = sched.apply(_elementwise(65536), "generic", {}, 16).script()       # 1 M elements: ~260 us
    assert "T.parallel" in large
    assert threads._serial is False                    # reset after apply: the helpers keep threads elsewhere
    s_small = sched.s_tir.Schedule(_conv_like(8, 6))
    s_large = sched.s_tir.Schedule(_conv_like(64, 56))
    assert threads.serial_ns(s_small) < threads.PAR_MIN_NS < threads.serial_ns(s_large)


def test_threaded_and_serial_kernels_compute_the_same():
    """The same kernel scheduled serial and parallel (threshold moved) gives identical results."""
    func = _elementwise(4096)
    xs = np.random.default_rng(0).standard_normal((4096, 16)).astype(np.float32)
    outs = []
    for thr in (1e12, 0.0):
        old = threads.PAR_MIN_NS
        threads.PAR_MIN_NS = thr
        try:
            f = sched.apply(func, "generic", {}, 16)
        finally:
            threads.PAR_MIN_NS = old
        assert ("T.parallel" in f.script()) == (thr == 0.0)
        lib = tvm.compile(tvm.IRModule({"main": f}), target="llvm")
        o = tvm.runtime.empty((4096, 16), "float32")
        lib["main"](tvm.runtime.tensor(xs), o)
        outs.append(o.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], xs * 2)


class _Ctx:
    """The part of lower.KernelCtx that requant_fn uses: compile-time params as placeholders."""

    def __init__(self):
        self.spec = SPEC
        self.params = []

    def param(self, arr, name, keep_dtype=False):
        arr = np.ascontiguousarray(np.asarray(arr).reshape(np.shape(arr) or (1,)))
        ph = te.placeholder(arr.shape, str(arr.dtype), name=f"{name}{len(self.params)}")
        self.params.append((ph, arr))
        return ph


@pytest.mark.parametrize("act", ["", "Relu"])
def test_bias_requant_every_accumulator_including_ties(act):
    """requant_fn after the wrapping bias add of ``requantized`` against the int64 formula
    clamp(z + ((acc + fold)·m + 2^(s-1)) >> s) on EVERY accumulator of a range, with small shifts
    so that exact ties (acc + fold)·m ≡ 2^(s-1) (mod 2^s) occur, and per-channel m, s, fold."""
    qp = QuantParams("uint8", (0.1,), (37,))
    ms, ss, fold = [3001, 1023, 2 ** 30 + 1, 4096], [12, 10, 40, 0], [17, -300, 5, -1]
    ctx = _Ctx()
    rq = krequant.requant_fn(ctx, {"multiplier": ms, "shift": ss, "activation": act, "activation_params": []},
                           TensorType((1, 4), "uint8", qp), 4)
    fb = ctx.param(np.array(fold, np.int32), "fold")
    accs = np.arange(-3000, 3000, dtype=np.int32)
    acc = te.placeholder((accs.size, 4), "int32", name="acc")
    out = te.compute((accs.size, 4), lambda i, c: rq(krequant.wrapping_add(acc[i, c], fb[c]), c).astype("int32"),
                     name="out")
    params = [p for p, _ in ctx.params]
    lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([acc, *params, out])}), target="llvm")
    av = np.repeat(accs[:, None], 4, axis=1)
    got = tvm.runtime.empty((accs.size, 4), "int32")
    lib["main"](tvm.runtime.tensor(av), *[tvm.runtime.tensor(a) for _, a in ctx.params], got)
    v = (av.astype(object) + np.array(fold, dtype=object)) * np.array(ms, dtype=object)
    r = np.array([(1 << (s - 1)) if s else 0 for s in ss], dtype=object)
    want = np.array([[int(x) >> s for x, s in zip(row, ss)] for row in (v + r)], dtype=np.int64) + 37
    lo = 37 if act == "Relu" else 0
    want = np.clip(want, lo, 255)
    ties = sum(int(((int(a) + f) * m) % (1 << s) == (1 << (s - 1))) for a in accs for m, s, f in zip(ms, ss, fold) if s)
    assert ties > 0                                    # the range does hit exact ties
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("n, k, m", [(8, 8, 2304), (24, 8, 1152), (8, 24, 576), (32, 8, 576), (8, 32, 576)])
def test_unpruned_layers_stay_dense_for_time(n, k, m):
    """The encode-sparse time choice (qcompiler/sparse/cost.py ``choose``) on the unpruned 1x1 convs
    of rapidocr-cls that it used to give BSR 1x4 / 4x1 (predicted 0.85-0.94 of dense, measured
    3.5-6x slower): a format that stores every multiply-accumulate skips nothing and is no
    candidate, with or without a stray zero weight; the time of every format is still reported."""
    from qcompiler.sparse.cost import LayerShape, choose, stored_entries
    w = RNG.integers(1, 128, (1, n, k)).astype(np.int8) * RNG.choice(np.array([-1, 1], np.int8), (1, n, k))
    for zeros in (0, 1):
        if zeros:
            w[0, 0, 0] = 0
        s = LayerShape.of(w, m, conv=True)
        c = choose(s)
        assert c.format_time == "dense", c.time
        assert {"bsr1x4", "bsr4x1", "csr"} <= set(c.time)
        assert stored_entries(s, "bsr1x4") == stored_entries(s, "dense") == n * k
    w = np.zeros((1, 64, 256), np.int8)
    w[:, :, :4] = 7                                    # 98 % zero blocks: BSR skips work and may win
    s = LayerShape.of(w, 3136, conv=True)
    assert stored_entries(s, "bsr1x4") < stored_entries(s, "dense")
    assert choose(s).format_time != "dense"


def test_int8_dot_conv_estimated_at_the_vnni_rate_and_exact_either_way(monkeypatch):
    """rapidocr-cls's stem conv (3 -> 8 channels, 3x3 stride 2, HardSwish, 1x3x48x192): its int8
    kernel (input channels padded to 4) is estimated at INT8_MAC_NS and, for a Zen 3 core, runs
    serial, as the fp32 kernel of the same layer does; at MAC_NS it would launch threads (measured
    26 us serial against 39 us parallel at 2 threads there). For a Zen 1 core (SLOW_CORE_SCALE) the
    doubled estimate launches threads (rapidocr-cls int8 1853 -> 1603 us at 2 threads on one). The
    estimator recognises the dot-product block (an exception there would silently make every kernel
    parallel), and the serial and the parallel kernel compute the same integers as the oracle."""
    g = Graph("q")
    x = g.add_input("x", TensorType((1, 3, 48, 192), "uint8", ACT["uint8"]))
    g.outputs = [add_qconv(g, x, 8, (3, 3), s=(2, 2), p=(1, 1, 1, 1), act="HardSwish")]
    seen, apply = [], sched.apply

    def record(func, kind, params, vw, cpu=None):
        seen.append((kind, func))
        return apply(func, kind, params, vw, cpu)
    with monkeypatch.context() as m:
        m.setattr(sched, "apply", record)
        zen3 = conv_script(g, TargetSpec("x86", cpu="znver3"))
    kind, func = seen[-1]
    s = sched.s_tir.Schedule(func)
    blocks = [s.get(b) for b in s.get_child_blocks(s.get_sblock("root"))]
    assert kind == "conv2d_dot" and [b.name_hint for b in blocks if threads.is_int8_dot(b)] == ["conv"]
    assert threads.serial_ns(s) < threads.PAR_MIN_NS < 2 * threads.serial_ns(s)
    assert "T.parallel" not in zen3
    assert "T.parallel" in conv_script(g, TargetSpec("x86", cpu="znver1"))
    with monkeypatch.context() as m:
        m.setattr(threads, "INT8_MAC_NS", threads.MAC_NS)
        assert "T.parallel" in conv_script(g, TargetSpec("x86", cpu="znver3"))
    feeds = {"x": qin(ACT["uint8"], (1, 3, 48, 192))}
    for threshold, what in ((1e12, "serial"), (0.0, "parallel")):      # on this host's CPU
        monkeypatch.setattr(threads, "PAR_MIN_NS", threshold)
        assert ("T.parallel" in conv_script(g, SPEC)) == (what == "parallel")
        check_exact(g, feeds, f"stem conv {what}")


@pytest.mark.parametrize("c, o, hw, parallel", [
    (32, 64, 8, False),     # uspsnet's second conv: 1.2 M MACs, 19 us serial on one Zen 3 core
    (32, 32, 32, True),     # svhnnet's second conv: 9.4 M MACs, ~145 us serial
    (32, 64, 14, True),     # mnistnet's: 3.6 M MACs direct, 1.6 M gemm MACs as a Winograd conv (AVX2)
    (3, 32, 32, False),     # svhnnet's stem: 0.9 M MACs (1.2 M with the channels padded to 4)
])
def test_int8_dot_conv_threads_only_where_the_work_pays(c, o, hw, parallel):
    """The thread rule at INT8_MAC_NS (60 MAC/ns, the measured AVX2 vpmaddwd rate) on a Zen 3 core:
    a 1.2 M-MAC conv stays serial (at 30 MAC/ns it launched threads and uspsnet took 35.3 against
    30.2 us at 2 threads), a 9.4 M-MAC conv runs on the thread pool, in one launch: its packing
    stage (34x34x32 int16) is split across the same launch rather than waking the workers a second
    time (with a launch of its own svhnnet took 400 against 371 us with it serial, 2 threads). On
    AVX2 the first three are Winograd convs (gemm MACs at WINO_MAC_NS; the transform ahead of the
    main loop in its launch): the same answers. On a Zen 1 core (256-bit AVX2 in two 128-bit
    halves: SLOW_CORE_SCALE) every estimate doubles, and the two small convs, which take 2x their
    Zen 3 time there (the stem 92 us serial, estimated 20), use both cores."""
    g = Graph("q")
    x = g.add_input("x", TensorType((1, c, hw, hw), "uint8", ACT["uint8"]))
    g.outputs = [add_qconv(g, x, o, (3, 3), p=(1, 1, 1, 1), act="Relu")]
    for cpu, want in (("znver3", parallel), ("znver1", True)):
        text = conv_script(g, TargetSpec("x86", cpu=cpu))
        assert launches(text) == (1 if want else 0), (cpu, text)
        assert (text.count("T.parallel") == 2) == want         # the packing stage or transform too


def launches(script: str) -> int:
    """Thread-pool launches in a kernel's TVMScript: a top-level parallel loop is one, a
    ``pragma_parallel_launch_point`` loop one with every parallel loop inside it."""
    n, inside = 0, None
    for line in script.splitlines():
        indent = len(line) - len(line.lstrip())
        if inside is not None and line.strip() and indent <= inside:
            inside = None
        if "pragma_parallel_launch_point" in line:
            n, inside = n + 1, indent
        elif "T.parallel" in line and inside is None:
            n += 1
    return n


ONE_LAUNCH_CONVS = [
    (3, 32, 12),      # a stem: direct conv, its packing stage ahead of the conv loop
    (32, 32, 16),     # AVX2: Winograd over tile rows, the weight transform ahead
    (32, 64, 6),      # AVX2: Winograd over channel blocks (K > tiles), the input transform ahead
]


def _one_launch_conv(c, o, hw):
    g = Graph("q")
    x = g.add_input("x", TensorType((2, c, hw, hw), "uint8", ACT["uint8"]))
    g.outputs = [add_qconv(g, x, o, (3, 3), p=(1, 1, 1, 1), act="Relu")]
    return g


@pytest.mark.parametrize("cpu", X86_LEVELS)
@pytest.mark.parametrize("c, o, hw", ONE_LAUNCH_CONVS)
def test_stage_and_main_loop_share_one_launch(monkeypatch, c, o, hw, cpu):
    """Every kernel forced onto the thread pool (PAR_MIN_NS = 0): the stage ahead of a conv's main
    loop is split across the same launch (``parallel_launch_point``, barrier after it), one launch
    per kernel (batch 2: the batch is part of the split loops)."""
    monkeypatch.setattr(threads, "PAR_MIN_NS", 0.0)
    text = conv_script(_one_launch_conv(c, o, hw), TargetSpec("x86", cpu=cpu))
    assert launches(text) == 1 and text.count("T.parallel") == 2, text
    assert "pragma_parallel_barrier_when_finish" in text


@pytest.mark.parametrize("c, o, hw", ONE_LAUNCH_CONVS)
def test_one_launch_kernels_bit_exact(monkeypatch, c, o, hw):
    """The same kernels on this host's CPU compute the oracle's integers."""
    monkeypatch.setattr(threads, "PAR_MIN_NS", 0.0)
    check_exact(_one_launch_conv(c, o, hw), {"x": qin(ACT["uint8"], (2, c, hw, hw))}, f"one launch {c}->{o} {hw}x{hw}")


def lambda_workspace_calls(mod: tvm.IRModule, spec: TargetSpec) -> dict:
    """``{kernel: TVMBackendAllocWorkspace calls inside its parallel lambdas}`` of every TIR kernel
    of ``mod`` built for ``spec`` as artifacts are (:func:`tvm_compile`, the project's CPU TIR
    pipeline; LLVM IR: a lambda is TVM's ``__tvm_parallel_lambda`` function, whose body runs per
    thread and, for an allocation inside the parallel loop, per iteration)."""
    out = {}
    for gv in mod.functions:
        f = mod[gv]
        if not isinstance(f, tvm.tirx.PrimFunc):
            continue
        lib = tvm_compile(tvm.IRModule({gv.name_hint: f.with_attr("global_symbol", gv.name_hint)}), spec)
        lib = lib.mod if hasattr(lib, "mod") else lib
        ll = "".join(m.inspect_source("ll") for m in lib.imports) if lib.imports else lib.inspect_source("ll")
        lambdas = [part for part in ll.split("\ndefine ")[1:]
                   if "parallel_lambda" in re.match(r"[^@]*@([\w.$]+)", part).group(1)]
        out[gv.name_hint] = sum(p.count("@__TVMBackendAllocWorkspace") for p in lambdas)
    return out


def _pointwise_then_depthwise():
    g = Graph("q")
    x = g.add_input("x", TensorType((2, 16, 14, 14), "uint8", ACT["uint8"]))
    y = add_qconv(g, x, 64, (1, 1), act="Relu")
    g.outputs = [add_qconv(g, y, 64, (3, 3), group=64, p=(1, 1, 1, 1), act="Relu")]
    return g


@pytest.mark.parametrize("cpu", X86_LEVELS)
def test_register_tiles_live_on_the_stack_not_in_a_workspace_per_iteration(monkeypatch, cpu):
    """Every kernel on the thread pool (PAR_MIN_NS = 0), batch 2: a 1x1 int8 conv (dot-product
    tiles), a depthwise one and the fp32 conv of the same shapes keep their register tiles on the
    stack: no TVMBackendAllocWorkspace in any parallel lambda, for AVX2's tiles (ACC_SCOPE "global",
    under TVM's 1 KB stack bound) and AVX-512's (28 zmm = 1,792 bytes: :mod:`qcompiler.codegen.x86.stack_tiles`). With a
    workspace tile every iteration of the parallel loop called the allocator (and FreeWorkspace):
    fashion_mobilenet int8 at batch 8 took 1720 us against 1227 us (2 threads, Zen 1)."""
    monkeypatch.setattr(threads, "PAR_MIN_NS", 0.0)
    spec = TargetSpec("x86", cpu=cpu)
    calls = lambda_workspace_calls(lower(_pointwise_then_depthwise(), spec), spec)
    assert len([k for k in calls if "qlinearconv" in k]) == 2 and not any(calls.values()), calls

    gf = Graph("f")
    xf = gf.add_input("x", TensorType((2, 16, 14, 14), "float32"))
    w = RNG.standard_normal((64, 16, 1, 1)).astype(np.float32)
    op = gf.create_op("FusedConv", [xf, gf.add_const(w, "w"), gf.add_const(np.zeros(64, np.float32), "b")],
                      {"pads": [0, 0, 0, 0], "strides": [1, 1], "dilations": [1, 1], "group": 1,
                       "activation": "Relu", "activation_params": []})
    gf.outputs = [op.result]
    spec = TargetSpec("x86", dtype="fp32", cpu=cpu)
    calls = lambda_workspace_calls(lower(gf, spec), spec)
    assert calls and not any(calls.values()), calls


def test_stack_tile_kernels_bit_exact(monkeypatch):
    """The kernels of the test above, on this host's CPU, compute the oracle's integers."""
    monkeypatch.setattr(threads, "PAR_MIN_NS", 0.0)
    check_exact(_pointwise_then_depthwise(), {"x": qin(ACT["uint8"], (2, 16, 14, 14))}, "stack tiles")


def _stem():
    g = Graph("q")
    x = g.add_input("x", TensorType((1, 1, 28, 28), "uint8", ACT["uint8"]))
    g.outputs = [add_qconv(g, x, 32, (3, 3), p=(1, 1, 1, 1), act="Relu")]
    return g


@pytest.mark.parametrize("cpu", X86_LEVELS)
def test_folded_stem_packs_without_a_branch_per_element(cpu):
    """A one-channel stem (mnistnet's 1->32 3x3) folds its kernel taps into the dot product's groups
    (qdot.fold_taps: 2 taps a vpmaddwd, 4 a vpdpbusd) and packs its input as q shifted copies whose
    column bound depends on the vector lane: written as an if_then_else, TVM scalarized the packing
    into a branch per element (a third of fashion_mobilenet's int8 stem kernel in ``perf``;
    mnistnet int8 149 -> 140 us at 2 threads on the Zen 1 with a Select of a clamped load). The
    stage keeps its lane-dependent choice a Select on every ISA; its one if_then_else is the rows'
    padding, the same for every lane."""
    pad = [ln for ln in conv_script(_stem(), TargetSpec("x86", cpu=cpu)).splitlines() if ln.strip().startswith("pad[")]
    assert len(pad) == 1 and "T.Select(" in pad[0] and pad[0].count("T.if_then_else(") == 1, pad


@pytest.mark.parametrize("cpu", X86_LEVELS)
def test_padded_input_channels_pack_with_a_select(cpu):
    """An RGB stem (3 input channels padded to the dot product's group of 4, or 2 for pmaddwd: 4)
    packs its padding channel, which is a choice by vector lane, with a Select too."""
    g = Graph("q")
    x = g.add_input("x", TensorType((1, 3, 16, 16), "uint8", ACT["uint8"]))
    g.outputs = [add_qconv(g, x, 16, (3, 3), p=(1, 1, 1, 1), act="Relu")]
    pad = [ln for ln in conv_script(g, TargetSpec("x86", cpu=cpu)).splitlines() if ln.strip().startswith("pad[")]
    assert len(pad) == 1 and "T.Select(" in pad[0] and pad[0].count("T.if_then_else(") == 1, pad


def test_folded_stem_bit_exact():
    check_exact(_stem(), {"x": qin(ACT["uint8"], (1, 1, 28, 28))}, "folded stem")
