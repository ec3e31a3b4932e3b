"""ARM (aarch64 Linux) cross-compilation: the cross compiler, the device runtime, emulation.

Building an ARM artifact needs only the cross compiler (it links ``model.so``). Running one on this
machine (tests, examples/deploy_cpp) also needs the aarch64 TVM runtime libraries, fetched by
``scripts/fetch_aarch64_runtime.sh``, and qemu-user with the aarch64 sysroot.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...errors import UserError
from ..cache import cache_dir

CROSS_CXX = "aarch64-linux-gnu-g++"
SYSROOT = Path("/usr/aarch64-linux-gnu")
APT_INSTALL = "apt-get install -y gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user"
FETCH_RUNTIME = "scripts/fetch_aarch64_runtime.sh"


def cross_cxx() -> str:
    """The aarch64 C++ compiler/linker (``$QCOMPILER_AARCH64_CXX`` overrides), or a UserError."""
    cxx = os.environ.get("QCOMPILER_AARCH64_CXX", CROSS_CXX)
    if shutil.which(cxx) is None:
        raise UserError(f"the aarch64 cross compiler '{cxx}' is not installed", "--target arm",
                        f"install it ({APT_INSTALL}) or set QCOMPILER_AARCH64_CXX")
    return cxx


def runtime_dir() -> Path:
    """Where fetch_aarch64_runtime.sh puts lib/libtvm_runtime.so, lib/libtvm_ffi.so, include/."""
    env = os.environ.get("QCOMPILER_AARCH64_RUNTIME")
    return Path(env) if env else cache_dir() / "aarch64-runtime"


def emulation_problems() -> list[str]:
    """What is missing to build and run aarch64 programs here, each with its fix (empty: ready)."""
    problems = []
    if shutil.which(os.environ.get("QCOMPILER_AARCH64_CXX", CROSS_CXX)) is None:
        problems.append(f"no {CROSS_CXX} ({APT_INSTALL})")
    if shutil.which("qemu-aarch64") is None:
        problems.append(f"no qemu-aarch64 ({APT_INSTALL})")
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        problems.append(f"no aarch64 sysroot in {SYSROOT} ({APT_INSTALL})")
    rt = runtime_dir()
    if not ((rt / "lib" / "libtvm_runtime.so").is_file() and (rt / "include" / "tvm" / "ffi").is_dir()):
        problems.append(f"no aarch64 TVM runtime in {rt} (run {FETCH_RUNTIME})")
    return problems


def qemu_command(program: str | Path, *args: str | Path) -> list[str]:
    """Run an aarch64 program under user-mode emulation with the cross sysroot."""
    return ["qemu-aarch64", "-L", str(SYSROOT), str(program), *map(str, args)]
