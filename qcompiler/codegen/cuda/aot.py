"""Compile CUDA device code *into* the artifact on a build host without a GPU.

TVM's CUDA codegen passes the generated CUDA C++ to ``ffi.Module.create.cuda`` (in
``libtvm_runtime_cuda.so``), which calls ``tvm_callback_cuda_compile`` and stores the binary. That
library links the driver ``libcuda.so.1``; on a GPU-less host it fails to load at ``import tvm``
and TVM silently stores CUDA *source* instead, which the GPU host would then have to JIT.

:func:`enable_cuda_codegen` fixes that in a running process: it loads the real driver if there is
one, otherwise a stub ``libcuda.so.1`` (built from ``cuda_stub.c`` with gcc into the cache folder
on first use), and then loads ``libtvm_runtime_cuda.so`` (glibc matches the stub by its soname).
This works after ``import tvm`` too (measured with TVM 0.27), so the CLI needs no subprocess.
:func:`device_compile` overrides the callback for the duration of a build to run
``nvcc --fatbin`` with one ``-gencode`` per requested SM plus PTX for the newest one.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from ...errors import UserError
from ..cache import cache_dir

STUB_SOURCE = Path(__file__).with_name("cuda_stub.c")
# TVM's own nvcc call passes --use_fast_math; we take its parts but -prec-div=false (and its
# approximate math functions): QuantizeLinear divides x by the scale and rounds half to even, and
# the approximate division flipped that rounding for 4 of 12.8 M inputs of a 64x64x56x56 tensor on
# an H100 (2026-11-24; exactly the elements where x * (1/scale) and x / scale round apart), so the
# int8 result left the integer reference
NVCC_FLAGS = ("-O3", "--ftz=true", "--prec-div=true", "--prec-sqrt=false", "--fmad=true", "--expt-relaxed-constexpr",
              "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__")


def stub_library() -> Path:
    """Path of the stub ``libcuda.so.1``, compiled with gcc on first use (keyed by source hash)."""
    src = STUB_SOURCE.read_bytes()
    out = cache_dir() / f"cuda-stub-{hashlib.sha256(src).hexdigest()[:12]}" / "libcuda.so.1"
    if out.is_file():
        return out
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        raise UserError("a C compiler is needed once to build the CUDA driver stub", "--target cuda",
                        "install gcc (apt-get install -y gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libcuda-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", tmp,
                            str(STUB_SOURCE)], capture_output=True, text=True)
        if r.returncode != 0:
            raise UserError(f"building the CUDA driver stub failed: {r.stderr.strip()}", str(STUB_SOURCE))
        os.replace(tmp, out)            # atomic: concurrent builders race harmlessly
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def enable_cuda_codegen() -> str:
    """Make ``ffi.Module.create.cuda`` available; returns "loaded", "driver" or "stub"."""
    import tvm  # noqa: F401  (loads libtvm_runtime, which libtvm_runtime_cuda links)
    import tvm_ffi
    from tvm.base import _LOADED_LIBS
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is not None:
        return "loaded"
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        which = "driver"
    except OSError:
        ctypes.CDLL(str(stub_library()), mode=ctypes.RTLD_GLOBAL)
        which = "stub"
    lib = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent / "libtvm_runtime_cuda.so"
    try:
        _LOADED_LIBS["tvm_runtime_cuda"] = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise UserError(f"cannot load TVM's CUDA runtime library ({e})", "--target cuda",
                        "install the CUDA 13 toolkit (it provides libcudart.so.13) and make its lib "
                        "folder visible to the dynamic loader (ldconfig or LD_LIBRARY_PATH)") from None
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        raise UserError("TVM's CUDA runtime loaded but registered no CUDA module factory", "--target cuda",
                        "reinstall apache-tvm==0.27.0.post1 (the CUDA-enabled wheel)")
    return which


def find_nvcc() -> str:
    for cand in (shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_PATH", ""), "bin", "nvcc") if os.environ.get("CUDA_PATH") else None,
                 "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise UserError("nvcc not found: it compiles the CUDA kernels into the artifact", "--target cuda",
                    "install the CUDA toolkit and put its bin folder on PATH (or set CUDA_PATH)")


def nvcc_version(nvcc: str | None = None) -> str:
    out = subprocess.run([nvcc or find_nvcc(), "--version"], capture_output=True, text=True).stdout
    for tok in out.replace(",", " ").split():
        if tok.startswith("V") and tok[1:2].isdigit():
            return tok[1:]
    return "unknown"


def nvcc_archs(nvcc: str | None = None) -> tuple[str, ...] | None:
    """The SMs this nvcc builds (``nvcc --list-gpu-arch``: compute_75 ... for CUDA 13), as sm_NN;
    None when it does not say (an nvcc before 11.0 has no such flag). Asked once per nvcc: the CLI
    checks ``--arch`` before any work and :func:`device_compile` again for API callers."""
    return _nvcc_archs(nvcc or find_nvcc())


@functools.lru_cache(maxsize=None)
def _nvcc_archs(nvcc: str) -> tuple[str, ...] | None:
    r = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True)
    archs = [f"sm_{line.strip()[len('compute_'):]}" for line in r.stdout.splitlines()
             if line.strip().startswith("compute_") and line.strip()[len("compute_"):].isdigit()]
    return tuple(archs) if r.returncode == 0 and archs else None


def check_archs(archs: Sequence[str], nvcc: str | None = None) -> None:
    """A UserError naming the first of ``archs`` this nvcc cannot build (CUDA 13 dropped sm_50-72:
    its nvcc failed on ``--arch sm_61`` after calibration, an internal error), before any work."""
    known = nvcc_archs(nvcc)
    if known is None:
        return
    for a in archs:
        if a not in known:
            raise UserError(f"nvcc {nvcc_version(nvcc)} cannot build {a}", "--arch",
                            f"it builds {', '.join(known)}: pick from those, or install a CUDA toolkit "
                            f"that still supports {a}")


def sm_number(arch: str) -> int:
    return int(arch.split("_")[1])


def gencode_flags(archs: Sequence[str]) -> list[str]:
    """``-gencode`` for SASS of every SM, plus PTX of the newest (runs on later GPUs via the driver)."""
    nums = sorted({sm_number(a) for a in archs})
    flags = []
    for n in nums:
        flags += ["-gencode", f"arch=compute_{n},code=sm_{n}"]
    flags += ["-gencode", f"arch=compute_{nums[-1]},code=compute_{nums[-1]}"]
    return flags


def nvcc_fatbin(code: str, archs: Sequence[str], nvcc: str | None = None) -> bytearray:
    """Compile CUDA C++ to a fatbin. A fixed file name keeps the output independent of temp paths."""
    with tempfile.TemporaryDirectory(prefix="qcompiler-nvcc-") as d:
        src, out = os.path.join(d, "kernels.cu"), os.path.join(d, "kernels.fatbin")
        Path(src).write_text(code)
        cmd = [nvcc or find_nvcc(), "--fatbin", *NVCC_FLAGS, *gencode_flags(archs), "-o", out, src]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=d)
        if r.returncode != 0:
            raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{r.stdout}{r.stderr}")
        return bytearray(Path(out).read_bytes())


FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)


def cuda_sources(module) -> str:
    """The CUDA source of every device module imported by ``module`` (a built executable's
    ``.mod``), concatenated: what tvm.compile generated before nvcc (tests and scripts read it)."""
    srcs = []

    def walk(m):
        if m.kind == "cuda":
            srcs.append(m.inspect_source())
        for i in m.imports:
            walk(i)
    walk(module)
    return "".join(srcs)


def fatbin_contents(data: bytes) -> list[tuple[str, str]]:
    """What the fatbins embedded in a library hold: [("sass", "sm_90"), ("ptx", "compute_90"), ...].

    TVM stores device code inside its own serialized module blob, so ``cuobjdump`` on the .so
    finds nothing; this walks the fatbin containers (header: magic, version, header size,
    payload size; entries: kind 1=PTX 2=ELF, header size, padded payload size, SM at +28)."""
    found = []
    start = data.find(FATBIN_MAGIC)
    while start >= 0:
        hdr, = struct.unpack_from("<H", data, start + 6)
        size, = struct.unpack_from("<Q", data, start + 8)
        p, end = start + hdr, start + hdr + size
        while p + 32 <= end:
            kind, _, entry_hdr = struct.unpack_from("<HHI", data, p)
            padded, = struct.unpack_from("<Q", data, p + 8)
            sm, = struct.unpack_from("<I", data, p + 28)
            found.append(("sass", f"sm_{sm}") if kind == 2 else ("ptx", f"compute_{sm}"))
            p += entry_hdr + padded
        start = data.find(FATBIN_MAGIC, end)
    return found


@contextlib.contextmanager
def device_compile(archs: Sequence[str]) -> Iterator[dict]:
    """Within this block, TVM CUDA builds embed a fatbin for ``archs`` (e.g. ("sm_87", "sm_90")).

    Yields a dict for the manifest: nvcc version, SASS archs, PTX arch, and ``kernels``, the
    number of device modules compiled (0 means the build never reached the CUDA codegen)."""
    import tvm_ffi
    nvcc = find_nvcc()
    check_archs(archs, nvcc)
    os.environ.setdefault("CUDA_PATH", str(Path(nvcc).resolve().parent.parent))
    enable_cuda_codegen()
    info = {"nvcc": nvcc_version(nvcc), "sass": sorted({f"sm_{sm_number(a)}" for a in archs}, key=sm_number),
            "ptx": f"compute_{max(sm_number(a) for a in archs)}", "kernels": 0}
    name = "tvm_callback_cuda_compile"
    old = tvm_ffi.get_global_func(name, allow_missing=True)

    def _compile(code, *rest):
        info["kernels"] += 1
        return nvcc_fatbin(code, archs, nvcc)
    tvm_ffi.register_global_func(name, _compile, override=True)
    try:
        yield info
    finally:
        if old is not None:
            tvm_ffi.register_global_func(name, old, override=True)
