"""``qcompile verify OUT --data X.npy|X.npz [--qdq FILE.onnx] [--samples N] [--json]``: parity of
a compiled int8 (or fp8) artifact with ONNX Runtime running the QDQ export of the same quantized model.

Both sides run the same inputs, and every quantized value that the artifact's kernels store is
compared layer by layer, in quantization steps (LSB)::

    ours   q_k  = the integer tensor value k as the compiled kernels stored it
    ORT    r_k  = the same value in ONNX Runtime (the QDQ model's QuantizeLinear of that name)
    LSB_k  = max |q_k - r_k|             (integers; a float r_k: |(q_k - z_k) s_k - r_k| / s_k)

Where our values come from: an int8 artifact compiled with ``--debug-layers``
(:mod:`qcompiler.codegen.artifact`) holds ``model.qir`` (the quantized IR text: names, quantization parameters, weights) and its
``model.so`` has, next to ``main``, a Relax function ``debug`` that makes the *same* kernel calls
as ``main`` (same compiled PrimFuncs, same constants) and returns every stored integer value in
its stored layout (NCHW{b}c blocks are undone here). So the per-layer numbers are those of the
compiled kernels, never of a numpy model; the final outputs are those of ``main``. An ARM artifact
runs under ``qemu-aarch64`` (a small C++ host, ``verify_probe.cc``, cross-built once and cached).

Two numbers per layer, because 1-LSB differences propagate: *alone* is the kernel run by
``debug_alone`` (same PrimFuncs again) on ORT's values of its inputs, so it measures that layer
only, and is what the acceptance bounds; *chained* is the value after the whole network from the
same model input (``debug``), informational: a depthwise conv can turn one upstream LSB into several.

ORT side: the QDQ ONNX exported from ``model.qir`` (:func:`qcompiler.frontend.qdq_export.export_qdq`;
``--qdq`` gives another file, e.g. the one ``--export-qdq`` wrote), each compared value made a
graph output, on the CPU execution provider with ORT's default graph optimization level
(ORT_ENABLE_ALL: ORT fuses DQ -> op -> Q into its own integer kernels with a float requantization
scale, which is what a user deploying the QDQ model gets; they may round a value that sits near .5
the other way, hence 1 LSB). The export writes conv/gemm weights as uint8 ``w + 128`` (the same
reals): ORT's U8S8 kernels on x86 CPUs without VNNI (AVX2 only, e.g. AMD Zen 3) saturate pairs of
products in int16 and were measured 53 LSB off the exact result; its U8U8 kernels are exact
(``export_qdq(uint8_weights=True)``). A ``--qdq`` file is run as given.

An fp8 artifact is compared alike, its steps float8 ulps (:func:`lsb_diff`): the stored float8
values by their codes, float outputs in the spacing of the float8 grid at ORT's value; ORT's float8
values are fetched through a Cast to float32. Its kernels' float32 sums differ from ORT's in their
rounding only, so a layer alone is off where a value lands next to a float8 rounding boundary; two
values within 2^-16 of the tensor's largest magnitude count as equal (both zero to float32
precision: near 0 the float8 grid is finer than a sum's float32 rounding, :data:`qcompiler.quant.fp8.NOISE_FLOOR`).

Acceptance (:data:`MAX_LAYER_LSB`, :data:`MIN_LAYER_EXACT`, :data:`MIN_OUTPUT_SHARE`), every figure
measured with our kernels *alone* on ONNX Runtime's inputs, so that it measures our kernels and not
ORT's rounding carried through the network:

* every compared layer within 1 LSB, and at least 99 % of its elements exact (ORT's float
  requantization disagrees near .5 on about 1e-5 of the values; a kernel with a wrong rounding,
  zero point or bias is off on far more);
* every final output, made by its kernel alone, at least 99.9 % of its elements within 1 LSB (a
  float output made by DequantizeLinear in the steps of its quantized operand; one made by a float
  layer, a mixed-precision build whose last layers are kept float, in the steps of the nearest
  quantized value it is computed from);
* ``main``'s outputs equal, bit for bit, the values of the same kernels chained by ``debug``: the
  deployed function computes what was checked layer by layer.

The end-to-end difference of each output (``main`` against ORT from the same model input) is the
row's chained figure and the verdict's last clause, informational like the layers' chained column:
where ORT rounds a value the wrong way (fashion_mobilenet per tensor, 744 images: 22 values of one
QLinearAdd whose exact requantized value is 119.4999976, which ORT's float32 arithmetic rounds up
to 120, and 6 of a conv, 3.1e-6 from the .5 boundary; the artifact's are the correctly rounded
ones), the layers after it carry the difference on, and depthwise convs and squeeze-excite gates
widen it: there 3 LSB at the logits, 99.87 % within 1 LSB. An output that is no stored value of
the debug functions is measured end to end only. An int8 artifact whose kernels store no statically
quantized value (a dynamic-int8 model: every scale computed at run time) has no debug functions
even with ``--debug-layers``: nothing to compare layer by layer, and verify says so. Exit code 0
when it passes, 1 when it does not, 2 on bad input.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .codegen.target import QUANTIZED_DTYPES
from .errors import UserError
from .ir.types import is_fp8
from .runtime.batches import batch_plan, load_inputs, name_inputs
from .runtime.manifest import TensorSpec, read_manifest, sha256_file

MAX_LAYER_LSB = 1
MIN_LAYER_EXACT = 0.99
MIN_OUTPUT_SHARE = 0.999
PROBE_SOURCE = Path(__file__).with_name("verify_probe.cc")


@dataclass
class Row:
    """One compared tensor: a stored layer (kernel alone, and chained) or a final output of ``main``."""
    name: str
    kind: str                     # producer op kind in the quantized IR
    scale: float                  # the quantization step (first one of a per-axis scale)
    max_lsb: float | None         # alone (outputs without a debug value: end to end); None: not in the QDQ model
    exact: float = 0.0            # share of elements with no difference
    within1: float = 0.0          # share of elements within 1 LSB
    chain_max_lsb: float | None = None   # the same value after the whole chain (drift; outputs: main's)
    elements: int = 0
    chain_within1: float | None = None   # outputs: share within 1 LSB end to end (informational)
    main_is_chain: bool | None = None    # outputs: main's output equals debug's chained value bit for bit


@dataclass
class Report:
    artifact: str
    family: str
    runner: str                   # "host" or "qemu-aarch64"
    samples: int
    qdq: str
    ort: str                      # onnxruntime version, EP and optimization level
    layers: list[Row] = field(default_factory=list)
    outputs: list[Row] = field(default_factory=list)
    dtype: str = "int8"           # int8 or fp8 (steps: float8 ulps, :func:`lsb_diff`)
    main_outputs: dict[str, np.ndarray] = field(default_factory=dict, repr=False)   # ours, per output name

    @property
    def compared(self) -> list[Row]:
        return [r for r in self.layers if r.max_lsb is not None]

    @property
    def passed(self) -> bool:
        return (all(r.max_lsb <= MAX_LAYER_LSB and r.exact >= MIN_LAYER_EXACT for r in self.compared)
                and all(r.within1 >= MIN_OUTPUT_SHARE and r.main_is_chain is not False for r in self.outputs))

    def verdict(self) -> str:
        worst = max((r.max_lsb for r in self.compared), default=0.0)
        exact = min((r.exact for r in self.compared), default=1.0)
        share = min((r.within1 for r in self.outputs), default=1.0)
        e2e = [r.chain_within1 for r in self.outputs if r.chain_within1 is not None]
        differ = [r.name for r in self.outputs if r.main_is_chain is False]
        missing = len(self.layers) - len(self.compared)
        return (f"{'PASS' if self.passed else 'FAIL'}: {len(self.compared)} layers alone within {_num(worst)} LSB "
                f"(need <= {MAX_LAYER_LSB}), >= {math.floor(1e5 * exact) / 1e3:.3f} % exact "
                f"(need >= {100 * MIN_LAYER_EXACT:g} %); "
                f"{100 * share:.3f} % of output elements within 1 LSB (need >= {100 * MIN_OUTPUT_SHARE:.1f} %)"
                + (f"; main differs from its kernels chained: {', '.join(differ)}" if differ else "")
                + (f"; {missing} layers not in the QDQ model" if missing else "")
                + (f"; end to end (drift, informational): {100 * min(e2e):.3f} % within 1 LSB" if e2e else ""))

    def table(self) -> str:
        w = max([24] + [len(r.name) for r in self.layers + self.outputs])
        head = (f"{'layer':<{w}} {'kind':<24} {'scale':>9} {'max LSB':>7} {'exact %':>8} {'<=1 LSB %':>9} "
                f"{'chained':>7}")
        lines = [f"artifact {self.artifact} ({self.family}, {self.dtype}) run on {self.runner}; {self.samples} samples",
                 f"ONNX Runtime {self.ort}; QDQ model: {self.qdq}",
                 "layers and outputs: each kernel alone on ONNX Runtime's inputs (max LSB, exact, <=1 LSB) and "
                 "chained end to end (max LSB)", head, "-" * len(head)]
        for r in self.layers + [None] + self.outputs:
            if r is None:
                lines.append("-" * len(head))
                continue
            lsb = "missing" if r.max_lsb is None else _num(r.max_lsb)
            chained = "" if r.chain_max_lsb is None else _num(r.chain_max_lsb)
            lines.append(f"{r.name:<{w}} {r.kind:<24} {r.scale:>9.4g} {lsb:>7} {100 * r.exact:>8.2f} "
                         f"{100 * r.within1:>9.3f} {chained:>7}")
        return "\n".join(lines + [self.verdict()])

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("main_outputs")
        d.update(passed=self.passed, verdict=self.verdict(),
                 acceptance={"max_layer_lsb": MAX_LAYER_LSB, "min_layer_share_exact": MIN_LAYER_EXACT,
                             "min_output_share_within_1_lsb": MIN_OUTPUT_SHARE})
        return d


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.3g}"


# ---- the artifact ---------------------------------------------------------------------------------
def read_quantized(out_dir: str | Path):
    """The manifest and the quantized IR graph of an int8 or fp8 artifact (UserError for anything else)."""
    from .ir.parser import ParseError, parse_graph
    out = Path(out_dir)
    m = read_manifest(out)
    debug = m.get("debug")
    if m["target"]["family"] == "cuda":
        raise UserError("verify runs x86 and arm artifacts; cuda artifacts have no debug functions yet", str(out),
                        "compile the same model for --target x86 or arm and verify that")
    if m["target"].get("dtype") in QUANTIZED_DTYPES and debug is None:
        if _static_layers(out, m) == 0:
            raise UserError("artifact has no per-layer functions to verify: no kernel stores a statically quantized "
                            "value (report.json lists no layer with a fixed scale: activations quantized at run "
                            "time, e.g. by DynamicQuantizeLinear, or none), so --debug-layers adds none", str(out),
                            "compare its outputs with ONNX Runtime running the same model instead, e.g. from "
                            "qcompile run OUT --input X.npz --output Y.npz; its integer ops compute what ONNX "
                            "Runtime's do")
        raise UserError("artifact was compiled without --debug-layers: it has no per-layer functions and no "
                        "quantized IR to verify against", str(out),
                        "compile the model again with --debug-layers (the deployed kernels are the same)")
    if not isinstance(debug, dict) or "ir" not in debug:
        dtype = m["target"].get("dtype", "?")
        raise UserError(f"artifact is not a quantized int8/fp8 artifact (dtype {dtype}, no quantized IR in its "
                        "manifest)", str(out), "compile the model with --dtype int8 (or fp8) --calib DATA "
                        "--debug-layers using this qcompiler, then verify that folder")
    path = out / Path(debug["ir"]["file"]).name
    if not path.is_file() or sha256_file(path) != debug["ir"]["sha256"]:
        raise UserError(f"artifact corrupted or modified: {path.name} is missing or its sha256 does not match "
                        "the manifest", str(out), "compile the model again")
    try:
        graph = parse_graph(path.read_text())
    except ParseError as e:
        raise UserError(f"cannot parse {path.name}: {e}", str(path), "compile the model again") from None
    return m, graph


def _static_layers(out: Path, manifest: dict) -> int | None:
    """How many layers of the artifact's report.json store a statically quantized value (a row
    with a fixed ``scale``: :func:`qcompiler.plan.report.layer_rows`; a report without quantized
    ops lists float rows only); None when the artifact has no readable report."""
    from .plan.report import REPORT
    path = out / REPORT
    if REPORT not in manifest.get("files", {}) or not path.is_file():
        return None
    try:
        layers = json.loads(path.read_text()).get("layers", [])
    except (OSError, ValueError):
        return None
    return sum("scale" in r for r in layers if isinstance(r, dict))


def sample_runs(data, inputs: list[TensorSpec], samples: int | None) -> list[dict[str, np.ndarray]]:
    """Split data (a .npy/.npz path, an array, or arrays by input name) into runs of the compiled
    input shapes, as ``qcompile run`` does, checking dtype and finiteness; with ``samples``, only
    the runs that hold the first ``samples`` samples (at least one run)."""
    if isinstance(data, (str, Path)):
        where = str(data)
        arrays = load_inputs(data, inputs)
    else:
        where = "--data"
        arrays = name_inputs({"": data} if isinstance(data, np.ndarray) else data, inputs, where)
    plans = {s.name: batch_plan(s, arrays[s.name], where) for s in inputs}
    counts = {n for _, n in plans.values()}
    if len(counts) != 1:
        raise UserError("inputs hold different numbers of samples", where, "give every input the same number")
    for s in inputs:
        a = arrays[s.name]
        if a.dtype != np.dtype(s.dtype):
            raise UserError(f"input '{s.name}' data has dtype {a.dtype}, but the model takes {s.dtype}", where,
                            f"convert it first, e.g. x.astype(np.{s.dtype})")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise UserError(f"input '{s.name}' data holds {int((~np.isfinite(a)).sum())} NaN/inf values", where,
                            "give finite input data")
    n = counts.pop()
    if samples is not None:
        if samples <= 0:
            raise UserError(f"--samples must be positive, got {samples}", "--samples")
        per_run = inputs[0].shape[0] if inputs[0].shape else 1
        n = min(n, max(1, samples // per_run))          # whole runs of the compiled batch
    runs = []
    for i in range(n):
        runs.append({s.name: np.ascontiguousarray(arrays[s.name][i] if plans[s.name][0] == "sample" else
                                                  arrays[s.name][i * s.shape[0]:(i + 1) * s.shape[0]])
                     for s in inputs})
    return runs


def unblock(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A stored tensor in its logical layout: NCHW{b}c (N, C/b, H, W, b) -> NCHW; plain as is."""
    if a.ndim == len(shape) + 1 and len(shape) == 4:
        a = a.transpose(0, 1, 4, 2, 3)
    return a.reshape(shape)


def block(a: np.ndarray, stored_shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The inverse of :func:`unblock`: a logical tensor in the stored layout and dtype."""
    if len(stored_shape) == 5 and a.ndim == 4:
        n, c, h, w = a.shape
        a = a.reshape(n, c // stored_shape[4], stored_shape[4], h, w).transpose(0, 1, 3, 4, 2)
    return np.ascontiguousarray(a.reshape(stored_shape).astype(dtype, copy=False))


def open_runner(out: Path, manifest: dict):
    """Something that calls the artifact's functions here: natively, or under qemu-aarch64."""
    from .runtime.device import artifact_machine, host_machine
    want = artifact_machine(manifest["target"])
    if want == host_machine():
        return HostRunner(out)
    if want == "aarch64":
        return QemuRunner(out, manifest)
    raise UserError(f"artifact was built for {want}; verify runs it on this machine ({host_machine()}) or, "
                    "for aarch64, under qemu-aarch64", str(out), "verify it on a machine of that kind")


class HostRunner:
    name = "host"

    def __init__(self, out: Path):
        from .runtime import load
        self.model = load(out)              # checks the sha256, the machine and its CPU features

    def call(self, funcs: list[str], runs: list[list[np.ndarray]]) -> dict[str, list[list[np.ndarray]]]:
        """``{func: [outputs of run i]}`` for every function called on every run's arguments."""
        import tvm
        got: dict[str, list[list[np.ndarray]]] = {f: [] for f in funcs}
        for args in runs:
            ts = [tvm.runtime.tensor(a, self.model.device) for a in args]
            for f in funcs:
                ys = self.model._vm[f](*ts)
                got[f].append([y.numpy() for y in ([ys] if hasattr(ys, "numpy") else ys)])
        return got


class QemuRunner:
    name = "qemu-aarch64"

    def __init__(self, out: Path, manifest: dict):
        from .codegen.arm import toolchain as arm
        problems = arm.emulation_problems()
        if problems:
            raise UserError("cannot run the aarch64 artifact under emulation here: " + "; ".join(problems),
                            str(out), "install what is named, or run verify on an aarch64 machine")
        self.lib = manifest["library_path"]
        self.exe = probe_binary()

    def call(self, funcs: list[str], runs: list[list[np.ndarray]]) -> dict[str, list[list[np.ndarray]]]:
        from .codegen.arm import toolchain as arm
        with tempfile.TemporaryDirectory(prefix="qc-verify-") as tmp:
            t = Path(tmp)
            specs = []
            for k, a in enumerate(runs[0]):
                path = t / f"in{k}.bin"
                path.write_bytes(b"".join(args[k].tobytes() for args in runs))
                specs.append(f"{a.dtype}:{'x'.join(map(str, a.shape))}:{path}")
            r = subprocess.run(arm.qemu_command(self.exe, self.lib, ",".join(funcs), len(runs), t / "y", *specs),
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"the artifact failed under qemu-aarch64: {(r.stderr or r.stdout).strip()[-500:]}")
            got: dict[str, list[np.ndarray]] = {f: [] for f in funcs}
            for line in r.stdout.splitlines():
                f, j, dtype, shape = (line.split(" ") + [""])[:4]
                dims = tuple(int(d) for d in shape.split("x") if d)
                got[f].append(np.fromfile(t / f"y.{f}.{j}.bin", dtype=dtype).reshape((len(runs), *dims)))
        return {f: [[a[i] for a in arrays] for i in range(len(runs))] for f, arrays in got.items()}


def probe_binary() -> Path:
    """verify_probe.cc cross-built for aarch64 against the fetched TVM runtime (cached by source hash)."""
    from .codegen.arm import toolchain as arm
    from .codegen.cache import cache_dir
    rt = arm.runtime_dir()
    key = hashlib.sha256(PROBE_SOURCE.read_bytes() + str(rt).encode()).hexdigest()[:16]
    exe = cache_dir() / f"verify-probe-{key}" / "verify_probe"
    if exe.is_file():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    tmp = exe.with_name(f".verify_probe.{os.getpid()}")
    cmd = [arm.cross_cxx(), "-O2", "-std=c++17", f"-I{rt / 'include'}", "-o", str(tmp), str(PROBE_SOURCE),
           f"-L{rt / 'lib'}", f"-Wl,-rpath,{rt / 'lib'}", "-Wl,--no-as-needed", "-ltvm_ffi", "-ltvm_runtime",
           "-Wl,--as-needed", "-lpthread", "-ldl"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {PROBE_SOURCE.name} for aarch64 failed: {r.stderr.strip()[-500:]}")
    os.replace(tmp, exe)
    return exe


# ---- ONNX Runtime ----------------------------------------------------------------------------------
VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")


def file_name(v, produced) -> str | None:
    """The name under which a QDQ file holds value ``v``'s elements, in the same order: ``v``'s own;
    or, for a value made by a fold (fold-qdq's row GEMM of a rank-3 MatMul, stored (B·S, N); a
    conv1d run as a 4-d conv; the GEMM's (B·S, K) input rows), the name at the end of a chain of
    reshapes that carries its quantization unchanged: forward, when the chain is ``v``'s only use,
    or back through its producers. None: the file does not have it."""
    def same(a, b):
        return a.type.quant == b.type.quant

    w = v
    while w.name not in produced:                         # forward: v -> Reshape -> ... -> file value
        users = w.users
        if len(users) != 1 or users[0].kind not in VIEW_OPS or not users[0].results or \
                not same(w, users[0].results[0]):
            break
        w = users[0].results[0]
    else:
        return w.name
    w = v
    while w.name not in produced:                         # back: file value -> Reshape -> ... -> v
        op = w.producer
        if op is None or op.kind not in VIEW_OPS or not op.operands or not same(w, op.operands[0]):
            return None
        w = op.operands[0]
    return w.name


def qdq_model(graph, qdq: str | Path | None, wanted: list):
    """The QDQ ONNX model (exported from ``graph`` or read from ``qdq``) with the values ``wanted``
    (of ``graph``) as extra outputs where it has them; returns (model, {value name: its name in the
    file}) (:func:`file_name`)."""
    import onnx
    if qdq is None:
        from .frontend.qdq_export import export_qdq
        model = export_qdq(graph, uint8_weights=True)      # ORT's exact U8U8 kernels on every CPU
    else:
        try:
            model = onnx.load(str(qdq))
        except FileNotFoundError:
            raise UserError("no such file", str(qdq), "give the QDQ .onnx written by --export-qdq") from None
        except Exception as e:  # protobuf DecodeError, OSError
            raise UserError(f"cannot read it as ONNX ({type(e).__name__})", str(qdq),
                            "give the QDQ .onnx written by --export-qdq") from None
        from .frontend.qdq_export import fp8_clamps_as_max_min
        fp8_clamps_as_max_min(model)         # the same model, past ONNX Runtime's float8 Relu/Clip fusions
    produced = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    have = {v.name: f for v in wanted if (f := file_name(v, produced))}
    for v in wanted:               # float8 values: fetched as float32 (ORT has no numpy type for float8e5m2)
        if v.name in have and is_fp8(v.dtype):
            f = have[v.name]
            model.graph.node.append(onnx.helper.make_node("Cast", [f], [f + "/as_float"], to=onnx.TensorProto.FLOAT,
                                                          name=f + "/as_float"))
            have[v.name] = f + "/as_float"
    outs = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=f) for f in dict.fromkeys(have.values()) if f not in outs)
    return model, have


def run_ort(model, runs: list[dict], fetch: list[str], where: str) -> tuple[str, list[list[np.ndarray]]]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL     # ORT's default, stated
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"ONNX Runtime cannot load the QDQ model: {msg}", where,
                        "give a QDQ model of this artifact's quantized graph (--export-qdq)") from None
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in runs[0]]
    if missing:
        raise UserError(f"the QDQ model takes input(s) {', '.join(missing)} that the artifact does not have",
                        where, "give a QDQ model of this artifact's quantized graph (--export-qdq)")
    info = f"{ort.__version__}, CPUExecutionProvider, ORT_ENABLE_ALL"
    return info, [sess.run(fetch, {n: feed[n] for n in names}) for feed in runs]


# ---- comparison -----------------------------------------------------------------------------------
def lsb_diff(ours: np.ndarray, theirs: np.ndarray, qp) -> np.ndarray:
    """|ours - theirs| in quantization steps; ``ours`` stored integers with params ``qp``, ``theirs``
    integers with the same params or floats (dequantized values). Float8 (:mod:`.quant.fp8`): a
    stored value (its bits) in float8 steps of the codes; a float value (an output) in steps of the
    float8 grid s·q at ``theirs`` (the spacing of float8 values at |theirs| / s)."""
    if is_fp8(qp.storage):
        from .quant.fp8 import noise_floor, step, ulps
        if ours.dtype == np.uint8 or ours.dtype.name == qp.storage:
            return ulps(ours, theirs, qp.storage, noise_floor(theirs, qp.storage)).astype(np.float64)
        scale, _ = _broadcast_params(qp, ours.ndim)
        t = theirs.astype(np.float64)
        return np.abs(ours.astype(np.float64) - t) / (scale * step(np.abs(t) / scale, qp.storage))
    if ours.dtype.kind in "iu" and theirs.dtype.kind in "iu":
        return np.abs(ours.astype(np.int64) - theirs.astype(np.int64)).astype(np.float64)
    scale, zp = _broadcast_params(qp, ours.ndim)
    real = (ours.astype(np.float64) - zp) * scale if ours.dtype.kind in "iu" else ours.astype(np.float64)
    return np.abs(real - theirs.astype(np.float64)) / scale


def _as_stored(a: np.ndarray, v) -> np.ndarray:
    """ORT's value of ``v`` as the artifact stores it: float8 values (fetched as float32) as their bits."""
    if is_fp8(v.dtype):
        from .quant.fp8 import codes
        return codes(a, v.dtype)
    return a


def _broadcast_params(qp, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    scale, zp = np.asarray(qp.scale, np.float64), np.asarray(qp.zero_point, np.float64)
    if qp.axis is not None and scale.size > 1:
        shape = [1] * ndim
        shape[qp.axis] = scale.size
        return scale.reshape(shape), zp.reshape(shape)
    return scale.reshape(-1)[:1], zp.reshape(-1)[:1]


def output_quant(v):
    """The quantization params that measure output value ``v``: its own, or those of the nearest
    quantized value it is computed from (the operand of its DequantizeLinear); None if none."""
    stack, seen = [v], set()
    while stack:
        v = stack.pop(0)
        if v.type.quant is not None:
            return v.type.quant
        if v.producer is not None and id(v) not in seen:
            seen.add(id(v))
            stack.extend(v.producer.operands)
    return None


def _float_tail(v) -> bool:
    """Is output ``v`` made by a float op (a layer kept float), not by DequantizeLinear of an int8 one?"""
    p = v.producer
    return p is not None and v.type.quant is None and p.kind not in ("DequantizeLinear", "QuantizeLinear") \
        and not p.kind.startswith("QLinear")


def _stats(d: np.ndarray) -> tuple[float, float, float]:
    """(max, share exact, share within 1) of LSB differences; float differences get 1e-3 LSB of
    slack for float32 rounding of dequantized values."""
    if not d.size:
        return 0.0, 1.0, 1.0
    tol = 1e-3
    return float(np.round(d.max(), 3)), float(np.mean(d <= tol)), float(np.mean(d <= 1 + tol))


def _scale(qp) -> float:
    return float(np.asarray(qp.scale).reshape(-1)[0])


def verify(out_dir: str | Path, data, *, qdq: str | Path | None = None,
           samples: int | None = None) -> Report:
    """Run the artifact and the QDQ model on ``data`` and compare them (see the module docstring)."""
    out = Path(out_dir)
    manifest, graph = read_quantized(out)
    runs = sample_runs(data, manifest["inputs"], samples)
    runner = open_runner(out, manifest)
    dbg = manifest["debug"]["outputs"]
    values = {v.name: v for v in list(graph.inputs) + [r for op in graph.ops for r in op.results]}
    model, have = qdq_model(graph, qdq, [values[d["name"]] for d in dbg])
    out_names = [s.name for s in manifest["outputs"]]
    produced = {o for n in model.graph.node for o in n.output}
    layer_names = [d["name"] for d in dbg if values[d["name"]].type.quant is not None and d["name"] not in out_names]
    if not set(have).intersection(layer_names) or any(n not in produced for n in out_names):
        raise UserError("the QDQ model does not compute this artifact's values (no matching tensor names)",
                        str(qdq or out), "give the QDQ .onnx written by --export-qdq when this artifact was compiled")
    fetch = list(dict.fromkeys(out_names + [have[d["name"]] for d in dbg
                                            if d["name"] in have and d["name"] not in out_names]))
    ort_info, ort_outs = run_ort(model, runs, fetch, str(qdq or out))
    in_file = {n: np.stack([r[k] for r in ort_outs]) for k, n in enumerate(fetch)}
    theirs = {n: in_file[n] for n in out_names}
    theirs.update({d["name"]: in_file[have[d["name"]]].reshape((len(runs),) + tuple(d["shape"]))
                   for d in dbg if d["name"] in have and d["name"] not in out_names})

    # ours: main and debug on the inputs; then debug_alone on ORT's value of every stored tensor
    inputs = [[feed[s.name] for s in manifest["inputs"]] for feed in runs]
    got = runner.call(["main", "debug"], inputs)
    chained = [np.stack([unblock(r[k], tuple(d["shape"])) for r in got["debug"]]) for k, d in enumerate(dbg)]
    given = [_as_stored(theirs[d["name"]], values[d["name"]]) if d["name"] in theirs else chained[k]
             for k, d in enumerate(dbg)]
    alone_args = [args + [block(g[i], tuple(d["stored_shape"]), d["stored_dtype"]) for g, d in zip(given, dbg)]
                  for i, args in enumerate(inputs)]
    got_alone = runner.call(["debug_alone"], alone_args)["debug_alone"]
    alone = [np.stack([unblock(r[k], tuple(d["shape"])) for r in got_alone]) for k, d in enumerate(dbg)]

    samples_run = len(runs) * (manifest["inputs"][0].shape[0] if manifest["inputs"][0].shape else 1)
    report = Report(str(out), manifest["target"]["family"], runner.name, samples_run,
                    str(qdq) if qdq else f"exported from {out.name}/{manifest['debug']['ir']['file']}", ort_info,
                    dtype=manifest["target"].get("dtype", "int8"))
    for k, d in enumerate(dbg):
        v = values[d["name"]]
        if v.type.quant is None or d["name"] in out_names:
            continue                                   # float values are not measured in steps
        kind = v.producer.kind if v.producer is not None else "input"
        if d["name"] not in theirs:
            report.layers.append(Row(d["name"], kind, _scale(v.type.quant), None))
            continue
        mx, exact, within = _stats(lsb_diff(alone[k], theirs[d["name"]], v.type.quant))
        chain_max = _stats(lsb_diff(chained[k], theirs[d["name"]], v.type.quant))[0]
        report.layers.append(Row(d["name"], kind, _scale(v.type.quant), mx, exact, within, chain_max,
                                 int(alone[k].size)))
    for k, s in enumerate(manifest["outputs"]):
        v = values[s.name]
        qp = output_quant(v)
        if qp is None:
            raise UserError(f"output '{s.name}' is not computed from a quantized value; verify measures outputs "
                            "in quantization steps", str(out), "verify a model whose outputs are quantized")
        ours = np.stack([r[k] for r in got["main"]])
        report.main_outputs[s.name] = ours
        e2e = lsb_diff(ours, theirs[s.name].reshape(ours.shape), qp)
        j = next((j for j, d in enumerate(dbg) if d["name"] == s.name), None)
        if j is None:                                  # no stored value to run alone: end to end only
            mx, exact, within = _stats(e2e)
            report.outputs.append(Row(f"output {s.name}", v.producer.kind if v.producer else "input", _scale(qp),
                                      mx, exact, within, None, int(ours.size)))
            continue
        # the kernel that makes the output, alone on ORT's inputs, as the layers are measured; end to end
        # (upstream 1-LSB differences carried on and widened by the layers after them): the chained figures
        mx, exact, within = _stats(lsb_diff(alone[j].reshape(ours.shape), theirs[s.name].reshape(ours.shape), qp))
        e2e_max, _, e2e_within = _stats(e2e)
        label = f"output {s.name} (float layer alone)" if _float_tail(v) else f"output {s.name}"
        report.outputs.append(Row(label, v.producer.kind if v.producer else "input", _scale(qp), mx, exact, within,
                                  e2e_max, int(ours.size), chain_within1=e2e_within,
                                  main_is_chain=bool(np.array_equal(chained[j].reshape(ours.shape), ours))))
    return report


def main(args, log) -> int:
    """The CLI command (qcompiler.cli): prints the table (or JSON), returns 0 pass / 1 fail."""
    report = verify(args.artifact, args.data, qdq=args.qdq, samples=args.samples)
    print(json.dumps(report.to_json(), indent=2) if args.json else report.table())
    return 0 if report.passed else 1
