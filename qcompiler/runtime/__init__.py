"""Run a compiled artifact (``OUT/model.so`` + ``OUT/manifest.json``) with the TVM runtime alone.

    from qcompiler.runtime import load
    model = load("OUT")                 # checks format version, sha256, machine, device
    (logits,) = model(x)                # or model(input_name=x); inputs checked against the manifest

An artifact with dynamic input dims (``--dynamic``) takes any size in its range: the call pads to
the bucket compiled for it and slices the outputs back (:mod:`.shapes`).

Nothing here imports the compiler (``tvm.relax``, ``qcompiler.codegen``): with
``TVM_USE_RUNTIME_LIB=1`` in the environment, ``import tvm`` loads only ``libtvm_runtime.so`` and
``libtvm_ffi.so``, which is all a deployment machine needs. For CUDA artifacts
``libtvm_runtime_cuda.so`` is loaded here (TVM does not load it in runtime-only mode).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from .batches import load_inputs, run_batches, save_outputs
from .manifest import FORMAT_VERSION, LIBRARY, MANIFEST, TensorSpec, read_manifest
from .shapes import shape_matches

__all__ = ["load", "CompiledModel", "run_batches", "load_inputs", "save_outputs", "read_manifest",
           "TensorSpec", "FORMAT_VERSION", "MANIFEST", "LIBRARY"]


class CompiledModel:
    """A loaded artifact. Call it with arrays (positional, in manifest order, or by input name);
    it returns the outputs as a list of numpy arrays in manifest order."""

    def __init__(self, out_dir: Path, manifest: dict[str, Any], device, vm):
        self.out_dir = out_dir
        self.manifest = manifest
        self.device = device
        self._vm = vm
        self.buckets = manifest.get("dynamic")           # a runtime.shapes.Buckets, or None
        self._fns = {} if self.buckets is not None else {"main": vm["main"]}
        self._main = self._fns.get("main")              # a static artifact's function (the benchmarks time it)

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.manifest["inputs"]

    @property
    def outputs(self) -> list[TensorSpec]:
        return self.manifest["outputs"]

    @property
    def family(self) -> str:
        return self.manifest["target"]["family"]

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        dyn = f", {self.buckets}" if self.buckets is not None else ""
        return f"CompiledModel({str(self.out_dir)!r}, {self.family} on {self.device}: ({ins}) -> ({outs}){dyn})"

    def bind(self, *arrays, **named) -> list[np.ndarray]:
        """Match positional and named arguments to the manifest's inputs and check them."""
        specs = self.inputs
        where = str(self.out_dir)
        if len(arrays) > len(specs):
            raise UserError(f"model takes {len(specs)} input(s), got {len(arrays)}", where,
                            f"inputs are: {', '.join(map(str, specs))}")
        values: dict[str, Any] = {s.name: a for s, a in zip(specs, arrays)}
        for name, a in named.items():
            if name not in {s.name for s in specs}:
                raise UserError(f"model has no input named '{name}'", where,
                                f"inputs are: {', '.join(map(str, specs))}")
            if name in values:
                raise UserError(f"input '{name}' given twice (by position and by name)", where)
            values[name] = a
        missing = [s.name for s in specs if s.name not in values]
        if missing:
            raise UserError(f"missing input(s) {', '.join(missing)}", where,
                            f"inputs are: {', '.join(map(str, specs))}")
        return [check_input(s, values[s.name], where) for s in specs]

    def plan(self, arrays: list[np.ndarray]) -> tuple[str, list[np.ndarray], dict[str, int] | None]:
        """For bound ``arrays``: the VM function to call, its inputs and the dynamic dims' sizes
        (None for a static artifact). With dynamic dims (``--dynamic``): the function of the
        smallest bucket that holds the sizes, on the inputs zero-padded to it."""
        b = self.buckets
        if b is None:
            return "main", arrays, None
        sizes = b.sizes(self.inputs, arrays, str(self.out_dir))
        bucket, name = b.pick(sizes)
        return name, [b.pad(s.shape, a, bucket) for s, a in zip(self.inputs, arrays)], sizes

    def unpad(self, outs: list[np.ndarray], sizes: dict[str, int] | None) -> list[np.ndarray]:
        """The outputs of a :meth:`plan`'s call with the padded positions sliced off."""
        if sizes is None:
            return outs
        return [self.buckets.unpad(s.shape, o, sizes) for s, o in zip(self.outputs, outs)]

    def __call__(self, *arrays, **named) -> list[np.ndarray]:
        import tvm
        name, arrays, sizes = self.plan(self.bind(*arrays, **named))
        fn = self._fns.get(name) or self._fns.setdefault(name, self._vm[name])
        result = fn(*[tvm.runtime.tensor(a, self.device) for a in arrays])
        return self.unpad([o.numpy() for o in ([result] if hasattr(result, "numpy") else list(result))], sizes)


def check_input(spec: TensorSpec, a: Any, where: str) -> np.ndarray:
    """The array for one input, or a UserError saying how it differs from the manifest."""
    if not isinstance(a, np.ndarray):
        raise UserError(f"input '{spec.name}' must be a numpy array, got {type(a).__name__}", where,
                        f"pass np.asarray(value, dtype=np.{spec.dtype}) of shape {list(spec.shape)}")
    if not shape_matches(a.shape, spec.shape):
        raise UserError(f"input '{spec.name}' has shape {list(a.shape)}, but the model was compiled "
                        f"for {list(spec.shape)}", where,
                        "reshape the input, or compile the model again for this shape (or with --dynamic)")
    if a.dtype != np.dtype(spec.dtype):
        raise UserError(f"input '{spec.name}' has dtype {a.dtype}, but the model takes {spec.dtype}", where,
                        f"convert it first, e.g. x.astype(np.{spec.dtype})")
    return np.ascontiguousarray(a)


def load(out_dir: str | Path, device: str | None = None) -> CompiledModel:
    """Load an artifact folder. ``device``: "cpu", "cuda" or "cuda:N" (default: the artifact's).

    Raises UserError when the manifest's format version is unknown, the library's sha256 does not
    match ("artifact corrupted or modified"), or this machine cannot run it."""
    from .device import no_cuda_jit, open_device
    out = Path(out_dir)
    manifest = read_manifest(out)
    where = str(out)
    dev = open_device(manifest, device, where)
    import tvm
    from tvm.runtime.vm import VirtualMachine
    try:
        with no_cuda_jit():
            lib = tvm.runtime.load_module(str(manifest["library_path"]))
        vm = VirtualMachine(lib, dev)
    except Exception as e:  # TVM reports load failures as RuntimeError/TVMError
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(f"TVM could not load {LIBRARY}: {msg}", where,
                        "compile the model again with this qcompiler and TVM version") from None
    return CompiledModel(out, manifest, dev, vm)
