"""Can this machine run an artifact? Machine, CPU-feature and CUDA checks made before loading.

Only standard-library imports at module level; TVM is imported (runtime library only, when the
caller set ``TVM_USE_RUNTIME_LIB=1``) inside :func:`open_device`.
"""
from __future__ import annotations

import contextlib
import ctypes
import platform
from pathlib import Path
from typing import Any

from ..errors import UserError

# LLVM -mcpu names -> /proc/cpuinfo flags their code may use (the ones whose absence is fatal).
_AVX2 = ("avx2", "fma")
_AVX512 = _AVX2 + ("avx512f", "avx512bw", "avx512vl")
_X86_CPU_FLAGS = {
    **{c: _AVX2 for c in ("haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
                          "znver1", "znver2", "znver3", "x86-64-v3")},
    **{c: _AVX512 for c in ("skylake-avx512", "cannonlake", "x86-64-v4")},
    **{c: _AVX512 + ("avx512_vnni",) for c in ("cascadelake", "cooperlake", "icelake-client",
                                                "icelake-server", "tigerlake", "rocketlake", "sapphirerapids",
                                                "emeraldrapids", "graniterapids", "znver4", "znver5")},
}
_ARM_CPU_FLAGS = {c: ("asimd", "asimddp", "asimdhp") for c in (
    "cortex-a55", "cortex-a75", "cortex-a76", "cortex-a77", "cortex-a78", "cortex-x1", "neoverse-n1")}
# LLVM -mattr feature -> /proc/cpuinfo flag
_FEATURE_FLAGS = {"+avx2": "avx2", "+fma": "fma", "+avx512f": "avx512f", "+avx512bw": "avx512bw",
                  "+avx512vnni": "avx512_vnni", "+avxvnni": "avx_vnni", "+neon": "asimd",
                  "+dotprod": "asimddp", "+fullfp16": "asimdhp", "+i8mm": "i8mm", "+bf16": "bf16"}
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def host_machine() -> str:
    m = platform.machine().lower()
    return _MACHINES.get(m, m)


def _host_target(target: dict[str, Any]) -> dict[str, Any]:
    """The LLVM target dict of the host code (the target itself, or a device target's host)."""
    tvm_target = target.get("tvm", {})
    return tvm_target if tvm_target.get("kind") == "llvm" else tvm_target.get("host", {})


def artifact_machine(target: dict[str, Any]) -> str:
    """The machine the artifact's host code was compiled for (from its TVM target dict)."""
    host = _host_target(target)
    triple = str(host.get("mtriple", ""))
    if triple.startswith(("aarch64", "arm64")):
        return "aarch64"
    return "x86_64" if not triple or triple.startswith("x86_64") else triple.split("-")[0]


def cpu_flags() -> set[str] | None:
    """CPU feature flags of this machine from /proc/cpuinfo, None where unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return None


def check_machine(target: dict[str, Any], where: str) -> None:
    """Refuse an artifact built for another machine or for CPU features this one lacks."""
    want, have = artifact_machine(target), host_machine()
    if want != have:
        hint = ("copy OUT to an aarch64 device and run it there (examples/deploy_cpp shows a C++ host; "
                "qemu-aarch64 can emulate one)" if want == "aarch64" else
                f"compile the model again with a target for {have}")
        raise UserError(f"artifact was built for {want}, but this machine is {have}", where, hint)
    flags = cpu_flags()
    if flags is None:
        return
    host = _host_target(target)
    table = _ARM_CPU_FLAGS if want == "aarch64" else _X86_CPU_FLAGS
    need = set(table.get(str(host.get("mcpu", "")), ()))
    need |= {_FEATURE_FLAGS[f] for f in host.get("mattr", []) if f in _FEATURE_FLAGS}
    missing = sorted(need - flags)
    if missing:
        raise UserError(f"artifact was built for CPU '{host.get('mcpu', 'generic')}' "
                        f"{' '.join(host.get('mattr', []))}".rstrip() +
                        f", but this CPU lacks {', '.join(missing)}", where,
                        "compile the model again with --cpu naming this machine's CPU (or leave --cpu out "
                        "to compile for the machine you compile on)")


def _load_cuda_runtime(where: str) -> None:
    """In runtime-only mode TVM does not load its CUDA runtime library: load it (RTLD_GLOBAL)."""
    from tvm.base import _LOADED_LIBS
    if "tvm_runtime_cuda" in _LOADED_LIBS:
        return
    libdir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    try:
        _LOADED_LIBS["tvm_runtime_cuda"] = ctypes.CDLL(str(libdir / "libtvm_runtime_cuda.so"),
                                                       mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise UserError(f"cannot load TVM's CUDA runtime ({e})", where,
                        "this machine needs the NVIDIA driver (libcuda.so.1) and the CUDA 13 runtime "
                        "(libcudart.so.13) to run a cuda artifact") from None


@contextlib.contextmanager
def no_cuda_jit():
    """While loading, make an artifact holding CUDA *source* fail instead of being compiled.

    ``import tvm`` registers ``tvm_callback_cuda_compile`` (NVRTC) even in runtime-only mode; a
    qcompiler artifact carries compiled device code and must never need it."""
    import tvm_ffi
    name = "tvm_callback_cuda_compile"
    old = tvm_ffi.get_global_func(name, allow_missing=True)

    def _no_jit(*args):
        raise RuntimeError(JIT_REFUSED)
    tvm_ffi.register_global_func(name, _no_jit, override=True)
    try:
        yield
    finally:
        if old is not None:
            tvm_ffi.register_global_func(name, old, override=True)


JIT_REFUSED = "CUDA source would have to be compiled at load time"


def open_device(manifest: dict[str, Any], device: str | None, where: str):
    """Check that this machine can run the artifact and return the TVM device to run it on."""
    family = manifest["target"]["family"]
    device = device or ("cuda" if family == "cuda" else "cpu")
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise UserError(f"unknown device '{device}'", where, "use cpu, cuda or cuda:N")
    if (kind == "cuda") != (family == "cuda"):
        raise UserError(f"a {family} artifact cannot run on device '{device}'", where,
                        "compile the model again for that device (--target cuda or a CPU target)")
    check_machine(manifest["target"], where)
    import tvm
    if kind == "cpu":
        return tvm.cpu(int(index or 0))
    _load_cuda_runtime(where)
    dev = tvm.cuda(int(index or 0))
    if not dev.exist:
        raise UserError(f"this machine has no CUDA device ({kind}:{index or 0})", where,
                        "run the cuda artifact on a machine with an NVIDIA GPU and driver, "
                        "or compile for a CPU target")
    sm = "sm_" + dev.compute_version.replace(".", "")
    archs = manifest["target"].get("arch", [])
    ptx = manifest.get("cuda", {}).get("ptx")
    if sm not in archs and not (ptx and int(sm[3:]) >= int(ptx.split("_")[1])):
        raise UserError(f"artifact holds device code for {', '.join(archs)}, but this GPU is {sm}", where,
                        f"compile the model again with --arch {sm}")
    return dev


__all__ = ["check_machine", "open_device", "no_cuda_jit", "host_machine", "artifact_machine", "cpu_flags"]
