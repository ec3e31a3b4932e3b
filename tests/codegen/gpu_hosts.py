"""What the GPU tests need of the host: a CUDA device (:func:`cuda_device_present`), and on a GPU
host without TVM's compiler, artifacts built on another host (:func:`artifact`).

A GPU host without TVM's compiler (the project's lent ones: a device call carries 64 MiB, the
compiler library is 259 MB) runs the ``gpu``-marked tests on artifacts built elsewhere:

    QC_GPU_PREBUILT=DIR QC_GPU_PREBUILT_BUILD=1 pytest -m gpu $TESTS   # a host with the compiler
    QC_GPU_PREBUILT=DIR pytest -m gpu $TESTS                            # the GPU host

with ``TESTS="tests/codegen/test_cuda_gpu.py tests/codegen/test_cuda_build.py"`` (the other test
modules import TVM's compiler and do not load on a runtime-only TVM).

The first builds each test's (or module fixture's) artifact into ``DIR/<key>`` with a fingerprint
of what it was built from, then skips the test ("built"); the second runs the tests as usual, each
loading its artifact from ``DIR`` instead of building it, after checking that what it would have
built from has the same fingerprint (the same qcompiler, the same calibration). Without
``QC_GPU_PREBUILT`` :func:`artifact` just builds.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PREBUILT = os.environ.get("QC_GPU_PREBUILT")
BUILD_ONLY = bool(PREBUILT) and os.environ.get("QC_GPU_PREBUILT_BUILD") == "1"


def cuda_device_present() -> bool:
    """Whether the CUDA driver initializes and sees a device (asked in a child process: a failed
    cuInit must not poison this one)."""
    code = ("import ctypes; l = ctypes.CDLL('libcuda.so.1'); n = ctypes.c_int(0); "
            "print(int(l.cuInit(0) == 0 and l.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return r.stdout.strip() == "1"


def artifact(key: str, fingerprint: str, build, tmp_dir: Path) -> Path:
    """``build(out)``'s artifact: built into ``tmp_dir/OUT``, or with ``QC_GPU_PREBUILT`` built into /
    loaded from ``DIR/<key>`` (``fingerprint``: the text of what it is built from, e.g. the graph's)."""
    if not PREBUILT:
        build(tmp_dir / "OUT")
        return tmp_dir / "OUT"
    d = Path(PREBUILT) / re.sub(r"[^\w.-]", "_", key)
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()
    if BUILD_ONLY:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        build(d / "OUT")
        (d / "fingerprint").write_text(digest)
        pytest.skip(f"built into {d}; run the test on the GPU host with QC_GPU_PREBUILT={PREBUILT}")
    if not (d / "OUT").is_dir():
        pytest.fail(f"no prebuilt artifact {d / 'OUT'}: build it with QC_GPU_PREBUILT_BUILD=1 "
                    f"QC_GPU_PREBUILT={PREBUILT} on a host with TVM's compiler")
    assert (d / "fingerprint").read_text() == digest, \
        f"{d} was built from another input than this test's (another qcompiler, or calibration differs)"
    return d / "OUT"
