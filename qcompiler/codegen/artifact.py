"""Write a deployable artifact: ``OUT/model.so`` (Relax VM bytecode, kernels, weights, device code)
and ``OUT/manifest.json`` (see :mod:`qcompiler.runtime.manifest`).

The write is atomic: everything is built in a hidden folder next to OUT (same filesystem), which
is renamed to OUT only after it is complete. A failure or a KeyboardInterrupt leaves neither OUT
nor the temporary folder behind, and an existing OUT is replaced only after success. The output
is deterministic: the same graph, target and toolchain give a byte-identical ``model.so`` and
``manifest.json`` (no timestamps; nvcc runs on a fixed file name).

Per target family the library is exported with:

* x86: the host C++ compiler (TVM's default, ``g++``);
* arm: the cross compiler ``aarch64-linux-gnu-g++`` (``$QCOMPILER_AARCH64_CXX`` overrides, see :mod:`.arm`);
* cuda: the host compiler, with the fatbin compiled by :mod:`.cuda.aot` embedded.

A quantized graph built with ``spec.debug_layers`` (``--debug-layers``) also gets ``OUT/model.qir``
(its IR text) and a ``debug`` entry in the manifest naming the values that the library's ``debug``
function returns (see :func:`write_debug_ir`); without it the folder holds only what a device needs.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence, Union

from ..errors import UserError
from ..progress import report
from ..runtime.manifest import (DYNAMIC_FORMAT_VERSION, FORMAT_VERSION, LIBRARY, MANIFEST, TensorSpec, dumps,
                                sha256_file)
from ..version import __version__
from .target import Family, TargetSpec


BuildFn = Callable[[Any, TargetSpec], Any]      # (graph, spec) -> tvm.runtime.Executable
ExtraFile = Union[bytes, Callable[[dict], bytes]]   # contents, or manifest -> contents


class ShapeBuckets:
    """What an artifact with dynamic input dims (``--dynamic``) holds: one function per bucket, the
    model compiled at the bucket's sizes (see :mod:`qcompiler.runtime.shapes`). Each bucket is
    lowered into the one module when it is added, so only one bucket's graph need be alive, and
    the module holds each weight packed alike for every bucket once (:meth:`Lowering.constant`):
    eleven BERT-base buckets peak at 6.9 GB (11.4 GB when every graph and every copy was held until
    tvm.compile; one build: 3.4 GB)."""

    def __init__(self, spec: TargetSpec, dims: dict[str, tuple[int, int]]):
        from tvm import relax
        self.spec, self.dims = spec, dims
        self.sizes: list[dict[str, int]] = []
        self.inputs: list[TensorSpec] = []            # shapes with dim names where dynamic
        self.outputs: list[TensorSpec] = []
        self._bb, self._first = relax.BlockBuilder(), None

    @staticmethod
    def function(sizes: dict[str, int]) -> str:
        return "main_" + "_".join("".join(c if c.isalnum() else "_" for c in k) + str(v) for k, v in sizes.items())

    def add(self, sizes: dict[str, int], graph) -> None:
        """Lower ``graph`` (the model compiled at ``sizes``) as the function of that bucket."""
        import contextlib

        import tvm

        from .lower import lower_shape
        cuda = self.spec.family is Family.CUDA
        with tvm.target.Target(self.spec.tvm) if cuda else contextlib.nullcontext():
            low = lower_shape(self._bb, self.function(sizes), graph, self.spec, self._first)
        self._first = self._first or low
        self.sizes.append(dict(sizes))

    def build(self, graph, spec: TargetSpec):
        from .lower import tvm_compile
        report("tvm.compile")
        return tvm_compile(self._bb.get(), spec)

    def manifest(self) -> dict[str, Any]:
        return {"dims": {k: list(v) for k, v in self.dims.items()},
                "buckets": [{"sizes": dict(sizes), "function": self.function(sizes)} for sizes in self.sizes]}


def write_artifact(graph, spec: TargetSpec, out_dir: str | Path, *, build: BuildFn | None = None,
                   command: Sequence[str] | None = None,
                   extra_files: dict[str, ExtraFile] | None = None, buckets: ShapeBuckets | None = None) -> Path:
    """Compile ``graph`` for ``spec`` and write the artifact folder ``out_dir``; returns its path.

    ``build`` replaces :func:`qcompiler.codegen.lower.build_module` (tests, custom pipelines).
    ``command`` (e.g. ``sys.argv``) is recorded in the manifest as ``created_by``.
    ``extra_files``: more files for the folder (e.g. ``report.json``), written before the folder
    is renamed into place, each as bytes or as ``fn(manifest) -> bytes`` (called once the library
    exists, e.g. to report its size); the manifest lists them under ``files`` (sha256, bytes).
    ``buckets``: build one function per bucket instead of ``graph``'s ``main`` (``graph`` is then
    the largest bucket's, for the report); the manifest (format 2) records them."""
    out = Path(out_dir).absolute()
    check_destination(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        ex, cuda_info = _compile(graph, spec, buckets.build if buckets is not None else build)
        lib = tmp / LIBRARY
        report("link")
        export_library(ex, lib, spec, workspace=tmp / "work")
        if spec.family is Family.CUDA:
            _check_device_code(lib, cuda_info)
        manifest = make_manifest(graph, spec, lib, cuda_info, command)
        if buckets is not None:
            manifest.update(format_version=DYNAMIC_FORMAT_VERSION, dynamic=buckets.manifest(),
                            inputs=[t.to_json() for t in buckets.inputs], outputs=[t.to_json() for t in buckets.outputs])
        if graph.meta.get("debug_outputs"):
            manifest["debug"] = write_debug_ir(graph, tmp)
        if extra_files:
            report("write")
            manifest["files"] = write_extra_files(extra_files, tmp, manifest)
        (tmp / MANIFEST).write_text(dumps(manifest))
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def write_extra_files(files: dict[str, ExtraFile], folder: Path, manifest: dict) -> dict[str, dict]:
    """Write ``files`` into ``folder``; returns the manifest's ``files`` entry."""
    listed = {}
    for name, content in sorted(files.items()):
        if Path(name).name != name or name in (LIBRARY, MANIFEST):
            raise ValueError(f"extra artifact file '{name}' must be a plain file name other than "
                             f"{LIBRARY} and {MANIFEST}")
        data = content(manifest) if callable(content) else content
        (folder / name).write_bytes(data)
        listed[name] = {"sha256": sha256_file(folder / name), "bytes": len(data)}
    return listed


def check_destination(out: Path) -> None:
    """Refuse (UserError) an OUT that is a file or a non-empty folder that is not an artifact; the
    CLI may call this before compiling to fail early."""
    if out.exists() and not out.is_dir():
        raise UserError("output path exists and is not a folder", str(out), "choose another --output path")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise UserError("output folder exists and is not a qcompiler artifact; refusing to replace it",
                        str(out), "choose a new or empty folder, or remove this one")


def _sweep_stale(out: Path) -> None:
    """Remove temporary folders next to OUT left by a writer that was killed (SIGKILL, power loss)."""
    for p in out.parent.glob(f".{out.name}.*-*-*"):
        kind, _, rest = p.name[len(out.name) + 2:].partition("-")
        pid = rest.split("-")[0]
        if kind not in ("tmp", "old") or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass                                 # alive (another user's process): leave it


def _replace(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` to ``out``; an existing ``out`` is moved aside first and
    deleted only after the new one is in place (restored if that rename fails)."""
    if not out.exists():
        os.rename(tmp, out)
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _compile(graph, spec: TargetSpec, build: BuildFn | None):
    if build is None:
        from .lower import build_module as build
    if spec.family is not Family.CUDA:
        return build(graph, spec), None
    import tvm
    from .cuda import aot as cuda_aot
    with cuda_aot.device_compile(spec.arch) as info, tvm.target.Target(spec.tvm):
        ex = build(graph, spec)
    return ex, info


def export_cc(spec: TargetSpec) -> str | None:
    """The C++ compiler/linker for ``export_library`` (None: TVM's default host compiler)."""
    if spec.family is not Family.ARM:
        return None
    from .arm.toolchain import cross_cxx
    return cross_cxx()


def export_library(ex, path: Path, spec: TargetSpec, workspace: Path) -> None:
    """``ex.export_library`` with the right linker for the target family; intermediate files go
    to ``workspace`` (inside the temporary folder, so an interrupted export leaves nothing).

    The library is linked as a release build, as deployed native libraries are:

    * ``--strip-all``: no debug sections (DWARF of the generated kernels: 10-25 % of an int8
      model.so) and no static symbol table; the dynamic symbols the TVM runtime looks up stay;
    * on x86 and arm, the unwind tables (``.eh_frame``) of the LLVM-generated objects are removed
      before linking. The kernels are C-ABI functions that return error codes and are only called
      by the TVM runtime, so nothing ever unwinds through them; the tables were 13 KB (0.9 %) of
      rapidocr-det's int8 model.so. A debugger or ``perf --call-graph dwarf`` cannot unwind
      through a kernel frame of such a library."""
    from tvm.support import cc as tvm_cc
    from .x86 import work_claiming
    cc = export_cc(spec)
    objcopy = _objcopy(spec, cc)
    workspace.mkdir()
    # the atomics the parallel loops of CPU kernels call (x86/work_claiming.py): linked in, so the
    # artifact still needs nothing but the TVM runtime
    extra = [str(work_claiming.object_file(cc, workspace))] if spec.family is not Family.CUDA else []

    def fcompile(output, objects, **kwargs):
        for obj in objects:
            if objcopy and str(obj).endswith(".o"):
                subprocess.run([objcopy, "--remove-section=.eh_frame", "--remove-section=.rela.eh_frame", str(obj)],
                               check=True, capture_output=True)
        return tvm_cc.create_shared(output, [*objects, *extra], **kwargs)
    kwargs = {"cc": cc} if cc else {}
    strip = [] if os.environ.get("QCOMPILER_KEEP_SYMBOLS") == "1" else ["-Wl,--strip-all"]   # bench_arm.py
    ex.export_library(str(path), fcompile=fcompile, workspace_dir=str(workspace), options=strip, **kwargs)
    shutil.rmtree(workspace)


def _objcopy(spec: TargetSpec, cc: str | None) -> str | None:
    """The objcopy of the binutils beside ``cc`` (:func:`export_cc`; None: the host's), or None:
    leave the objects as they are (CUDA artifacts, or no such objcopy)."""
    if spec.family is Family.CUDA:
        return None
    if cc is None:
        name = "objcopy"
    else:
        name = cc[:-len("g++")] + "objcopy" if cc.endswith("g++") else ""
    return shutil.which(name) if name else None


def _check_device_code(lib: Path, info: dict) -> None:
    """A CUDA artifact must carry compiled device code, never CUDA source to JIT at load time."""
    from .cuda.aot import fatbin_contents
    data = lib.read_bytes()
    if b"extern \"C\" __global__" in data or b"#include <cuda" in data:
        raise RuntimeError(f"{lib.name} holds CUDA source instead of compiled device code "
                           "(TVM's CUDA module factory was not used)")
    if info["kernels"] == 0:
        return                                   # no kernel ran on the device (all-host graph)
    found = {arch for kind, arch in fatbin_contents(data) if kind == "sass"}
    if set(info["sass"]) - found:
        raise RuntimeError(f"{lib.name}: nvcc compiled {info['kernels']} CUDA module(s) but the library "
                           f"lacks device code for {sorted(set(info['sass']) - found)}")


DEBUG_IR = "model.qir"


def write_debug_ir(graph, folder: Path) -> dict[str, Any]:
    """For a quantized graph: write its IR text (quantization parameters, weights) to
    ``folder/model.qir`` and return the manifest's ``debug`` entry: that file, and the values the
    library's ``debug`` function returns (name, logical shape, dtype, stored shape), in order.
    ``qcompile verify`` reads both (:mod:`qcompiler.verify`)."""
    from ..ir.printer import print_graph
    path = folder / DEBUG_IR
    path.write_text(print_graph(graph))
    return {"function": "debug", "ir": {"file": DEBUG_IR, "sha256": sha256_file(path)},
            "outputs": [dict(d) for d in graph.meta["debug_outputs"]]}


def io_specs(values) -> list[dict[str, Any]]:
    return [TensorSpec(v.name, tuple(v.shape), v.dtype).to_json() for v in values]


def make_manifest(graph, spec: TargetSpec, lib: Path, cuda_info: dict | None,
                  command: Sequence[str] | None) -> dict[str, Any]:
    import tvm
    tvm_target = spec.tvm
    host = tvm_target.get("host", tvm_target)
    m: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "qcompiler_version": __version__,
        "tvm_version": tvm.__version__,
        "target": {
            "family": spec.family.value,
            "dtype": spec.dtype,
            **({"float_dtype": spec.float_dtype} if spec.float_dtype != "fp32" else {}),
            **({"fp8_format": spec.fp8_format} if spec.dtype == "fp8" else {}),
            "cpu": host.get("mcpu"),
            "arch": list(spec.arch) if spec.family is Family.CUDA else [],
            "features": list(spec.features),
            "num_threads": spec.num_threads,
            "tvm": tvm_target,
        },
        "inputs": io_specs(graph.inputs),
        "outputs": io_specs(graph.outputs),
        "library": {"file": LIBRARY, "sha256": sha256_file(lib), "bytes": lib.stat().st_size},
    }
    if cuda_info is not None:
        m["cuda"] = {"device_code": "fatbin", **cuda_info}
    if command is not None:
        m["created_by"] = [str(c) for c in command]
    return m
