"""The artifact format: a folder holding ``model.so`` and ``manifest.json``.

``manifest.json`` (format_version 1), keys sorted, no timestamps, so that the same compilation
gives a byte-identical file::

    {
      "format_version": 1,
      "qcompiler_version": "0.1.0",
      "tvm_version": "0.27.0.post1",
      "target": {"family": "x86", "dtype": "int8", "cpu": "znver3", "arch": [], "features": [],
                 "tvm": {"kind": "llvm", "mcpu": "znver3"}},
      "inputs":  [{"name": "x", "shape": [1, 1, 28, 28], "dtype": "float32"}],
      "outputs": [{"name": "logits", "shape": [1, 10], "dtype": "float32"}],
      "library": {"file": "model.so", "sha256": "...", "bytes": 123456},
      "created_by": ["qcompile", "compile", "..."]      (optional)
    }

An artifact compiled with dynamic input dims (``--dynamic``) is format_version 2: its inputs'
and outputs' shapes name those dims (``[1, "S"]``) and a ``dynamic`` entry lists their ranges and
the function compiled for each bucket (see :mod:`.shapes`)::

      "dynamic": {"dims": {"S": [1, 512]},
                  "buckets": [{"sizes": {"S": 16}, "function": "main_S16"}, ...]}

This module imports neither TVM nor the compiler: the runtime and deploy tools read it.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError

FORMAT_VERSION = 1
DYNAMIC_FORMAT_VERSION = 2          # dynamic input dims: shapes name dims, a "dynamic" entry
MANIFEST = "manifest.json"
LIBRARY = "model.so"


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and numpy dtype name of one model input or output; a dynamic dim (format 2)
    is its name instead of a size."""
    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "TensorSpec":
        return TensorSpec(str(d["name"]), tuple(s if isinstance(s, str) else int(s) for s in d["shape"]),
                          str(d["dtype"]))

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dumps(manifest: dict[str, Any]) -> str:
    """The canonical text of a manifest (sorted keys, 2-space indent, lists of numbers or short
    strings on one line, trailing newline)."""
    text = json.dumps(manifest, indent=2, sort_keys=True)
    return re.sub(r"\[\n\s*((?:-?\d+|\"[^\"\n]{0,40}\")(?:,\n\s*(?:-?\d+|\"[^\"\n]{0,40}\"))*)\n\s*\]",
                  lambda m: "[" + ", ".join(p.strip() for p in m.group(1).split(",\n")) + "]", text) + "\n"


def read_manifest(out_dir: str | Path, *, verify_hash: bool = True) -> dict[str, Any]:
    """Read and check ``OUT/manifest.json``; with ``verify_hash`` also the library's sha256."""
    out = Path(out_dir)
    where = str(out)
    if not out.is_dir():
        raise UserError("not an artifact folder (no such directory)", where,
                        "give the OUT folder written by `qcompile compile`")
    path = out / MANIFEST
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no {MANIFEST} in this folder", where,
                        "give the OUT folder written by `qcompile compile`") from None
    except (OSError, ValueError) as e:
        raise UserError(f"unreadable {MANIFEST}: {e}", where,
                        "the artifact is corrupted or modified; compile it again") from None
    version = m.get("format_version") if isinstance(m, dict) else None
    if version not in (FORMAT_VERSION, DYNAMIC_FORMAT_VERSION):
        raise UserError(f"artifact format version {version!r} is not supported (this qcompiler reads "
                        f"versions {FORMAT_VERSION} and {DYNAMIC_FORMAT_VERSION})", str(path),
                        "compile the model again with this qcompiler version")
    try:
        lib = out / m["library"]["file"]
        expected = str(m["library"]["sha256"])
        for key in ("inputs", "outputs"):
            m[key] = [TensorSpec.from_json(d) for d in m[key]]
        m["target"]["family"]
        if version == DYNAMIC_FORMAT_VERSION:
            from .shapes import Buckets
            m["dynamic"] = Buckets.from_json(m["dynamic"])
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"malformed {MANIFEST} (missing or bad field {e})", str(path),
                        "the artifact is corrupted or modified; compile it again") from None
    if Path(m["library"]["file"]).name != m["library"]["file"]:
        raise UserError("manifest names a library outside the artifact folder", str(path),
                        "the artifact is corrupted or modified; compile it again")
    if not lib.is_file():
        raise UserError(f"library {lib.name} is missing", where,
                        "the artifact is incomplete; compile it again")
    if verify_hash and sha256_file(lib) != expected:
        raise UserError("artifact corrupted or modified: the sha256 of "
                        f"{lib.name} does not match the manifest", where,
                        "compile the model again (or copy the whole OUT folder again)")
    m["library_path"] = lib
    return m
