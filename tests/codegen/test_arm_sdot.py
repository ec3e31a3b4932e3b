"""ARM int8 QLinearConv / QLinearGemm on ``sdot`` (+dotprod; qcompiler/codegen/arm/intrin.py,
kernels/qdot.py) and on the plain NEON int16-product loops (no dotprod), cross-compiled for aarch64
and run under qemu-aarch64 (user mode; its default CPU model implements FEAT_DotProd), BIT-EXACT
against the numpy integer oracle (qcompiler.quant.reference).

The shape classes are those of the x86 dot-product tests (tests/codegen/test_x86_int8.py:
DOT_CONVS, HSWISH_CONVS and the QLinearGemm shapes): groups, strides, dilations, asymmetric
padding, channel counts that are not multiples of 4, channel multipliers, depthwise convs (which
stay on the plain kernel), uint8 and int8 activations, per-tensor and per-channel weights, the
HardSwish epilogue. To pay for qemu and the cross-linker once, every case is one independent op of
a single graph (its own input and output); the graph is built twice, with +dotprod (cortex-a76)
and without it (cortex-a53), the schedules in strict mode (a tensorize that fails raises instead of
falling back to plain loops). The sdot build's disassembly has ``sdot`` instructions and the
plain one's has none (aarch64-linux-gnu-objdump -d); convs whose input-channel block holds 2-4
groups of 4 use the indexed form ``sdot Vd.4s, Vn.16b, Vm.4b[lane]`` (arm/intrin.py register_lane).

Needs: apt-get install -y gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user
       scripts/fetch_aarch64_runtime.sh
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qcompiler.codegen.arm import toolchain as arm
from qcompiler.codegen.artifact import write_artifact
from qcompiler.codegen.isa import int8_isa
from qcompiler.codegen.target import TargetSpec
from qcompiler.ir import Graph, QuantParams, TensorType
from qcompiler.quant import hardswish, reference
from qcompiler.quant.requant import conv_multipliers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_x86_int8 import ACT, DOT_CONVS, HSWISH_CONVS, RNG, _gate_params, add_qconv, qin  # noqa: E402

SPECS = {
    "sdot": TargetSpec("arm", dtype="int8", cpu="cortex-a76", features=("+dotprod",)),
    "plain": TargetSpec("arm", dtype="int8", cpu="cortex-a53"),          # Armv8.0: no dot product
}
GEMMS = [("uint8", 3, 21, 10), ("int8", 4, 64, 33), ("uint8", 1, 7, 3), ("int8", 5, 130, 17),
         ("uint8", 16, 96, 48)]
HSWISH_GEMMS = [("uint8", 3, 21, 10, "standard"), ("int8", 4, 64, 33, "scaled")]
OBJDUMP = "aarch64-linux-gnu-objdump"
_missing = arm.emulation_problems()


@pytest.mark.parametrize("cpu, feats, want", [
    ("cortex-a76", ("+dotprod", "+fullfp16"), "sdotx4"),
    ("cortex-a76", (), "sdotx4"),                   # Armv8.2-A: dotprod is part of the CPU
    ("neoverse-n1", (), "sdotx4"),
    ("cortex-a76", ("-dotprod",), "None"),          # switched off
    ("cortex-a53", (), "None"),                     # Armv8.0-A
    (None, (), "None"),                             # generic aarch64
    (None, ("+dotprod",), "sdotx4"),
])
def test_arm_isa_from_llvm_features(cpu, feats, want):
    assert str(int8_isa(TargetSpec("arm", dtype="int8", cpu=cpu, features=feats))) == want


def _gemm(g: Graph, name: str, storage: str, m: int, k: int, n: int, gate: str | None):
    qa = ACT[storage]
    a = g.add_input(name, TensorType((m, k), storage, qa))
    ws = tuple(float(v) for v in RNG.uniform(0.002, 0.01, n))
    w = g.add_const(RNG.integers(-128, 128, (n, k)).astype(np.int8), "w", QuantParams("int8", ws, (0,) * n, axis=0))
    b = g.add_const(RNG.integers(-900, 900, n).astype(np.int32), "b",
                    QuantParams("int32", tuple(float(np.float32(qa.scale[0]) * np.float32(v)) for v in ws),
                                (0,) * n, axis=0))
    if gate is None:
        qo = QuantParams(storage, (0.04,), (10,))
        ms, ss = conv_multipliers(qa.scale[0], ws, 0.04)
        attrs = {"multiplier": ms, "shift": ss, "activation": "Relu"}
    else:
        qo = QuantParams(storage, (0.02,), (-100 if storage == "int8" else 20,))
        params = list(_gate_params(gate, n))
        attrs = {"activation": "HardSwish", "activation_params": params,
                 **hardswish.epilogue_attrs(qa.scale[0], ws, qo, params, n)}
    return g.create_op("QLinearGemm", [a, w, b], attrs, result_types=[TensorType((m, n), storage, qo)]).result


def shape_classes() -> tuple[Graph, dict[str, np.ndarray], list[str]]:
    """One graph holding every conv/gemm case as an independent op; its feeds; a label per output."""
    g = Graph("arm_dot_cases")
    feeds, labels, outs = {}, [], []
    for i, (storage, c, o, group, k, s, d, p, act) in enumerate(DOT_CONVS):
        x = g.add_input(f"x{i}", TensorType((2, c, 9, 11), storage, ACT[storage]))
        outs.append(add_qconv(g, x, o, k, group=group, s=s, d=d, p=p, act=act,
                              params=(0.0, 6.0) if act == "Clip" else (), bias=(o != 10), per_channel=(o != 10)))
        feeds[x.name] = qin(ACT[storage], (2, c, 9, 11))
        labels.append(f"QLinearConv {storage} {c}->{o} g{group} k{k} s{s} d{d} p{p} {act}")
    for i, (storage, c, o, group, k, p, gate) in enumerate(HSWISH_CONVS):
        x = g.add_input(f"h{i}", TensorType((2, c, 9, 11), storage, ACT[storage]))
        outs.append(add_qconv(g, x, o, k, group=group, p=p, act="HardSwish", params=_gate_params(gate, o),
                              per_channel=(o != 10), bias=(o != 10)))
        feeds[x.name] = qin(ACT[storage], (2, c, 9, 11))
        labels.append(f"QLinearConv HardSwish({gate}) {storage} {c}->{o} g{group}")
    for i, (storage, m, k, n) in enumerate(GEMMS):
        outs.append(_gemm(g, f"a{i}", storage, m, k, n, None))
        feeds[f"a{i}"] = qin(ACT[storage], (m, k))
        labels.append(f"QLinearGemm {storage} {m}x{k}x{n}")
    for i, (storage, m, k, n, gate) in enumerate(HSWISH_GEMMS):
        outs.append(_gemm(g, f"ah{i}", storage, m, k, n, gate))
        feeds[f"ah{i}"] = qin(ACT[storage], (m, k))
        labels.append(f"QLinearGemm HardSwish({gate}) {storage} {m}x{k}x{n}")
    g.outputs = outs
    g.verify()
    return g, feeds, labels


@pytest.fixture(scope="module")
def run_model(tmp_path_factory) -> Path:
    """examples/deploy_cpp cross-built for aarch64 (binary + the two runtime libraries)."""
    from conftest import build_arm_deploy
    return build_arm_deploy(tmp_path_factory)


@pytest.fixture(scope="module")
def cases():
    return shape_classes()


def _build(g: Graph, spec: TargetSpec, out: Path) -> Path:
    from qcompiler.codegen.x86 import schedules as x86
    strict, x86.STRICT = x86.STRICT, True         # a tensorize that fails raises: no silent fallback
    try:
        return write_artifact(g, spec, out)
    finally:
        x86.STRICT = strict


def _disasm(out: Path) -> str:
    r = subprocess.run([OBJDUMP, "-d", str(out / "model.so")], capture_output=True, text=True, check=True)
    return r.stdout


@pytest.mark.qemu
@pytest.mark.skipif(bool(_missing), reason="cannot run aarch64 code here: " + "; ".join(_missing))
@pytest.mark.parametrize("path", list(SPECS))
def test_arm_dot_shape_classes_bit_exact_under_qemu(run_model, cases, tmp_path, path):
    g, feeds, labels = cases
    spec = SPECS[path]
    assert str(int8_isa(spec)) == ("sdotx4" if path == "sdot" else "None")
    out = _build(g, spec, tmp_path / "OUT")
    files = []
    for v in g.inputs:
        f = tmp_path / f"{v.name}.bin"
        np.ascontiguousarray(feeds[v.name]).tofile(f)
        files.append(f)
    r = subprocess.run(arm.qemu_command(run_model, out, *files, "-o", tmp_path / "y"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    want = reference.run(g, feeds)
    bad = []
    for i, (w, label) in enumerate(zip(want, labels)):
        got = np.fromfile(tmp_path / f"y{i}.bin", w.dtype)
        assert got.size == w.size, (label, got.size, w.size)
        got = got.reshape(w.shape)
        if not np.array_equal(got, w):
            diff = np.abs(got.astype(np.int64) - w.astype(np.int64))
            bad.append(f"{label}: {int((diff > 0).sum())} of {w.size} differ, max {diff.max()}")
    assert not bad, f"{path}: " + "; ".join(bad)
    print(f"\n{path}: {len(labels)} conv/gemm cases bit-exact under qemu-aarch64")
    # the instruction is there exactly when the target has it
    sdots = [line for line in _disasm(out).splitlines() if "\tsdot\t" in line]
    n_lane = sum(1 for line in sdots if ".4b[" in line)
    print(f"{path}: {len(sdots)} sdot instructions in model.so, {n_lane} of them indexed (Vm.4B[lane])")
    assert (len(sdots) > 0) == (path == "sdot"), len(sdots)
    assert (n_lane > 0) == (path == "sdot"), n_lane       # the convs with input-channel blocks of 8-16


@pytest.mark.skipif(shutil.which(OBJDUMP) is None, reason=f"no {OBJDUMP}")
@pytest.mark.parametrize("path", list(SPECS))
def test_sdot_in_disassembly_only_with_dotprod(tmp_path, path):
    """A conv + gemm int8 artifact: ``sdot`` in its disassembly with +dotprod, none without
    (builds only: needs the cross compiler, not qemu)."""
    if shutil.which(arm.CROSS_CXX) is None:
        pytest.skip(f"no {arm.CROSS_CXX}")
    g = Graph("q")
    x = g.add_input("x", TensorType((1, 16, 6, 6), "uint8", ACT["uint8"]))
    g.outputs = [add_qconv(g, x, 32, (3, 3), p=(1, 1, 1, 1)), _gemm(g, "a", "int8", 2, 64, 16, None)]
    out = _build(g, SPECS[path], tmp_path / "OUT")
    n_sdot = sum(1 for line in _disasm(out).splitlines() if "\tsdot\t" in line)
    assert (n_sdot > 0) == (path == "sdot"), n_sdot


@pytest.mark.qemu
@pytest.mark.skipif(bool(_missing), reason="cannot run aarch64 code here: " + "; ".join(_missing))
def test_rapidocr_cls_int8_on_sdot_every_layer_bit_exact_under_qemu(tmp_path):
    """A real model with every conv class (stem with 3 input channels, pointwise convs on 8- and
    16-channel blocks, SE blocks, HardSwish epilogues, depthwise on the plain kernel): rapidocr-cls
    quantized (calibrated on 2 synthetic inputs: the integers, not the accuracy, are checked),
    built with +dotprod in strict mode and ``--debug-layers``, its ``debug`` function run under
    qemu (qcompiler.verify's probe): every integer value it stores equal to the oracle's."""
    import dataclasses

    import qcompiler
    from realmodels import rapidocr_models
    from qcompiler.passes import PassContext, PassManager
    from qcompiler.passes.quantize import QuantizeOptions
    from qcompiler.verify import QemuRunner, read_quantized, unblock
    m = {m.name: m for m in rapidocr_models()}.get("rapidocr-cls")
    if m is None:
        pytest.skip("rapidocr_onnxruntime is not installed")
    g = qcompiler.import_onnx(m.load(), m.input_shapes)
    qcompiler.run_passes(g, "default")
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(
        calib=[m.feeds(1), m.feeds(2)])})).run(g)
    out = _build(g, dataclasses.replace(SPECS["sdot"], debug_layers=True), tmp_path / "OUT")
    manifest, qg = read_quantized(out)
    feeds = m.feeds(3)
    got = QemuRunner(out, manifest).call(["debug"], [[feeds[s.name] for s in manifest["inputs"]]])["debug"][0]
    want = reference.run_values(qg, feeds)
    checked, bad = 0, []
    for d, a in zip(manifest["debug"]["outputs"], got):
        if d["dtype"] not in ("uint8", "int8"):
            continue                        # float values (the softmax tail): not integers
        ours = unblock(a, tuple(d["shape"]))
        checked += 1
        if not np.array_equal(ours, want[d["name"]]):
            bad.append(f"{d['name']}: {int((ours != want[d['name']]).sum())} of {ours.size} differ")
    assert checked >= 40 and not bad, (checked, bad)
    sdots = [line for line in _disasm(out).splitlines() if "\tsdot\t" in line]
    print(f"\nrapidocr-cls int8 on aarch64 (qemu): {checked} integer values bit-exact; {len(sdots)} sdot "
          f"instructions ({sum('.4b[' in s for s in sdots)} indexed)")
    assert sdots
