"""Calibration and evaluation data as a stream of feeds: ``{input_name: array}`` one batch at a time.

    ds = open_dataset("calib/", [("input", (1, 3, 224, 224), "float32")],
                      preprocess=Preprocess.parse("imagenet"), samples=500)
    for feed in ds:                       # feed["input"].shape == (1, 3, 224, 224)
        ...
    for feed, labels in ds.with_labels(): # labels: the npz 'y'/'labels' array, or class folders
        ...

Sources (memory does not grow with the number of samples; a Dataset can be iterated again):

* a folder of PNG/JPEG/BMP images (searched recursively, sorted by path) for a single image input.
  Decoded with Pillow, then :class:`Preprocess`: resize, center-crop to the model's HxW, scale,
  mean/std, RGB/BGR/grayscale, NCHW/NHWC. If every image sits in a subfolder of the folder, the
  subfolders (sorted) are classes and give the labels, as torchvision's ImageFolder.
* ``.npy``: one array with a leading sample dimension, for a single-input model; memory-mapped.
* ``.npz``: arrays named like the inputs (or a single array for a single-input model), each with a
  leading sample dimension, read member by member as a stream; an optional ``y`` or ``labels``
  array holds the labels.

A sample of input ``(B, *S)`` has shape ``S``; arrays of shape ``(N, *S)`` or ``(N, B, *S)`` are
accepted. Feeds hold ``batch`` samples (the last one may hold fewer). An input whose leading
dimension is not the model's batch (the first input's leading dimension), such as a recurrent
state ``(2, B, 128)`` or an LSTM's ``(layers, B, hidden)``, has no sample axis of its own: each feed
takes it whole, so its array holds one ``(N, *shape)`` row per feed (N feeds = N x batch samples).
Every problem with the data is a :class:`~qcompiler.errors.UserError` naming the file: wrong shape or dtype, NaN/Inf, an empty
folder, an unreadable image, no samples, a missing input.
"""
from __future__ import annotations

import os
import sys
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..errors import UserError

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp")
LABEL_KEYS = ("y", "labels")


# ---- input specs -------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputSpec:
    """A model input: name, static shape (leading dimension = batch) and numpy dtype name."""
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    def per_feed(self, batch: int) -> bool:
        """True when the leading dimension is not the model's ``batch``: the input is fed whole,
        one row of its data per feed (a recurrent state, an LSTM's h/c)."""
        return bool(self.shape) and self.shape[0] != batch


def model_batch(specs: Sequence[InputSpec]) -> int:
    """The batch the model was compiled for: the first input's leading dimension (1 without one)."""
    return specs[0].shape[0] if specs and specs[0].shape else 1


def as_specs(specs: Iterable[Any]) -> list[InputSpec]:
    """Accept (name, shape, dtype) tuples or objects with .name/.shape/.dtype (IR values,
    runtime TensorSpecs)."""
    out = []
    for s in specs:
        name, shape, dtype = (s if isinstance(s, tuple) else (s.name, s.shape, s.dtype))
        out.append(InputSpec(str(name), tuple(int(d) for d in shape), np.dtype(dtype).name))
    return out


# ---- preprocessing -----------------------------------------------------------------------------
class Color(str, Enum):
    RGB = "rgb"
    BGR = "bgr"
    GRAY = "gray"


class Layout(str, Enum):
    NCHW = "nchw"
    NHWC = "nhwc"


@dataclass(frozen=True)
class Preprocess:
    """Image to array: ``resize`` (int: the short side, keeping the aspect ratio; (h, w): exactly;
    None: straight to the model's HxW), center-crop to the model's HxW, ``x * scale``,
    ``(x - mean) / std`` per channel (in the model's channel order), channel order ``color`` and
    ``layout`` (None: inferred from the model input's shape)."""
    resize: int | tuple[int, int] | None = None
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    scale: float = 1.0 / 255.0
    color: Color | None = None
    layout: Layout | None = None

    PRESETS = {"imagenet": dict(resize=256, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
               "raw": dict(scale=1.0)}

    @classmethod
    def parse(cls, text: str) -> "Preprocess":
        """From a CLI string: comma-separated ``imagenet`` | ``raw`` | ``rgb`` | ``bgr`` | ``gray`` |
        ``nchw`` | ``nhwc`` | ``resize=256`` | ``resize=224x224`` | ``mean=0.485:0.456:0.406`` |
        ``std=...`` | ``scale=1/255``; later items override earlier ones."""
        kw: dict[str, Any] = {}
        for item in (t.strip() for t in text.split(",") if t.strip()):
            key, _, val = item.partition("=")
            key = key.lower()
            try:
                if not val and key in cls.PRESETS:
                    kw.update(cls.PRESETS[key])
                elif not val and key in Color._value2member_map_:
                    kw["color"] = Color(key)
                elif not val and key in Layout._value2member_map_:
                    kw["layout"] = Layout(key)
                elif key == "resize":
                    hw = [int(v) for v in val.lower().split("x")]
                    kw["resize"] = hw[0] if len(hw) == 1 else (hw[0], hw[1])
                elif key in ("mean", "std"):
                    kw[key] = tuple(float(v) for v in val.split(":"))
                elif key == "scale":
                    num, _, den = val.partition("/")
                    kw["scale"] = float(num) / (float(den) if den else 1.0)
                else:
                    raise ValueError
            except (ValueError, ZeroDivisionError, IndexError):
                raise UserError(f"cannot read preprocessing item '{item}'", "--preprocess",
                                "use e.g. 'imagenet,bgr' or 'resize=256,mean=0.5,std=0.5,scale=1/255,nhwc'") from None
        return cls(**kw)


def _image_geometry(spec: InputSpec, pre: Preprocess, where: str) -> tuple[Layout | None, int, int, int]:
    """(layout or None for (H, W) samples, channels, H, W) of an image input."""
    s = spec.sample_shape
    if len(s) == 2:
        return None, 1, s[0], s[1]
    if len(s) == 3:
        layout = pre.layout
        if layout is None:
            if s[0] in (1, 3) and s[2] not in (1, 3):
                layout = Layout.NCHW
            elif s[2] in (1, 3) and s[0] not in (1, 3):
                layout = Layout.NHWC
            else:
                layout = Layout.NCHW if s[0] in (1, 3) else None
        if layout is not None:
            c, h, w = s if layout is Layout.NCHW else (s[2], s[0], s[1])
            if c in (1, 3):
                return layout, c, h, w
    raise UserError(f"model input '{spec.name}' of shape {list(spec.shape)} does not look like an image batch "
                    "(B, C, H, W) or (B, H, W, C) with 1 or 3 channels", where,
                    "give .npy/.npz data instead, or set the layout (nchw/nhwc) in the preprocessing")


def load_image(path: str, spec: InputSpec, pre: Preprocess) -> np.ndarray:
    """Decode and preprocess one image into a sample of ``spec``."""
    try:
        from PIL import Image
    except ImportError:
        raise UserError("reading images needs Pillow", path, "pip install Pillow") from None
    layout, c, h, w = _image_geometry(spec, pre, path)
    color = pre.color or (Color.GRAY if c == 1 else Color.RGB)
    if (color is Color.GRAY) != (c == 1):
        raise UserError(f"{color.value} images have {3 if c == 1 else 1} channel(s) but model input "
                        f"'{spec.name}' takes {c}", path, "drop the color option or pick one that matches")
    try:
        with Image.open(path) as im:
            im.load()
            im = im.convert("L" if c == 1 else "RGB")
    except Exception as e:   # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError...
        raise UserError(f"cannot read the image ({type(e).__name__}: {e})", path,
                        "remove or replace the file") from None
    if pre.resize is None:
        im = im.resize((w, h), Image.BILINEAR)
    elif isinstance(pre.resize, int):
        f = pre.resize / min(im.size)
        im = im.resize((max(1, round(im.width * f)), max(1, round(im.height * f))), Image.BILINEAR)
    else:
        im = im.resize((pre.resize[1], pre.resize[0]), Image.BILINEAR)
    if im.width < w or im.height < h:
        raise UserError(f"the image is {im.width}x{im.height} after resizing, smaller than the model's "
                        f"{w}x{h}", path, f"resize to at least {max(h, w)}")
    left, top = (im.width - w) // 2, (im.height - h) // 2
    im = im.crop((left, top, left + w, top + h))
    a = np.asarray(im, np.float32).reshape(h, w, c) * np.float32(pre.scale)
    if color is Color.BGR:
        a = a[..., ::-1]
    mean, std = np.asarray(pre.mean, np.float32), np.asarray(pre.std, np.float32)
    if mean.size not in (1, c) or std.size not in (1, c):
        raise UserError(f"mean/std have {mean.size}/{std.size} values for {c} channel(s)", path,
                        f"give 1 or {c} values")
    a = (a - mean) / std
    if layout is None:
        a = a[..., 0]
    elif layout is Layout.NCHW:
        a = a.transpose(2, 0, 1)
    return _cast(np.ascontiguousarray(a), spec.dtype)


def _cast(a: np.ndarray, dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu" and a.dtype.kind == "f":
        info = np.iinfo(dt)
        return np.clip(np.rint(a), info.min, info.max).astype(dt)
    return a.astype(dt, copy=False)


# ---- sources -----------------------------------------------------------------------------------
class _Source:
    """Yields chunks {name: (n, *sample)} (and labels or None) of at most ``size`` samples."""
    num_samples: int
    has_labels = False

    def chunks(self, size: int, limit: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None]]:
        raise NotImplementedError


class _ImageSource(_Source):
    def __init__(self, root: str, spec: InputSpec, pre: Preprocess):
        self.root, self.spec, self.pre = root, spec, pre
        if os.path.isfile(root):
            self.files, self.labels, self.classes = [root], None, []
        else:
            self.files = sorted(str(p) for p in Path(root).rglob("*")
                                if p.suffix.lower() in IMAGE_EXTS and p.is_file())
            if not self.files:
                raise UserError("the folder holds no PNG/JPEG/BMP images", root,
                                "point to a folder of images, or give .npy/.npz data")
            rel = [Path(f).relative_to(root).parts for f in self.files]
            if all(len(r) == 2 for r in rel):
                self.classes = sorted({r[0] for r in rel})
                index = {c: i for i, c in enumerate(self.classes)}
                self.labels = np.array([index[r[0]] for r in rel], np.int64)
            else:
                self.labels, self.classes = None, []
        _image_geometry(spec, pre, root)       # fail early on a non-image input
        self.num_samples = len(self.files)
        self.has_labels = self.labels is not None

    def chunks(self, size, limit):
        for start in range(0, limit, size):
            stop = min(start + size, limit)
            arrays = [load_image(f, self.spec, self.pre) for f in self.files[start:stop]]
            labels = self.labels[start:stop] if self.labels is not None else None
            yield {self.spec.name: np.stack(arrays)}, labels


def _check_array_header(name: str, shape: tuple[int, ...], dtype: np.dtype, spec: InputSpec | None,
                        where: str, batch: int = 0) -> tuple[int, tuple[int, ...]]:
    """Validate one array's header against its input (or as labels, spec None).
    Returns (number of samples, shape to reshape to: (N, *sample)); for an input fed whole
    (:meth:`InputSpec.per_feed` of ``batch``): (feeds x batch, (feeds, *shape))."""
    what = f"array '{name}'" if name else "the array"
    if dtype.kind not in "biuf":
        raise UserError(f"{what} holds {dtype} data, not numbers", where,
                        "save numeric arrays (e.g. float32) with numpy.save/numpy.savez")
    if len(shape) == 0:
        raise UserError(f"{what} is a scalar; it needs a leading sample dimension", where,
                        "save an array of shape (N, ...) with one sample per row")
    if spec is None:
        return shape[0], (shape[0],) + tuple(shape[1:])
    want = spec.sample_shape
    if batch and spec.per_feed(batch):
        if tuple(shape[1:]) != spec.shape:
            raise UserError(f"{what} has shape {list(shape)} but model input '{spec.name}' takes {list(spec.shape)} "
                            f"whole in each feed (its leading dimension is not the batch, {batch})", where,
                            f"save one row per feed: an array of shape (N, {', '.join(map(str, spec.shape))})")
        n, rows, want = shape[0] * batch, shape[0], spec.shape
    elif spec.shape and tuple(shape[1:]) == want:
        n = rows = shape[0]
    elif spec.shape and tuple(shape[1:]) == spec.shape:
        n = rows = shape[0] * spec.shape[0]
    else:
        raise UserError(f"{what} has shape {list(shape)} but model input '{spec.name}' takes {list(spec.shape)}, "
                        f"so one sample is {list(want)}", where,
                        f"save the samples as an array of shape (N, {', '.join(map(str, want))})")
    target = np.dtype(spec.dtype)
    if dtype.kind == "f" and target.kind in "iub" or dtype.kind == "b" and target.kind != "b":
        raise UserError(f"{what} holds {dtype} data but model input '{spec.name}' takes {target}", where,
                        f"save the data as {target}")
    return n, (rows,) + want


def _check_finite(a: np.ndarray, name: str, offset: int, where: str) -> None:
    if a.dtype.kind == "f" and a.size and not np.isfinite(a.min() + a.max()):
        bad = int(np.argmax(~np.isfinite(a).reshape(len(a), -1).all(axis=1)))
        kind = "NaN" if np.isnan(a[bad]).any() else "Inf"
        what = f"array '{name}'" if name else "the array"
        raise UserError(f"{what} holds {kind} in sample {offset + bad}", where,
                        "clean the data: calibration needs finite values")


def _match_names(arrays: Sequence[str], specs: list[InputSpec], where: str) -> tuple[dict[str, str], str | None]:
    """Map input name -> array name; also the labels array name, if any."""
    names = [s.name for s in specs]
    label = next((k for k in LABEL_KEYS if k in arrays and k not in names), None)
    data = [a for a in arrays if a != label]
    if len(specs) == 1 and names[0] not in data and len(data) == 1:
        return {names[0]: data[0]}, label
    missing = [n for n in names if n not in data]
    if missing:
        raise UserError(f"no array for model input(s) {', '.join(missing)} (the file holds "
                        f"{', '.join(arrays) or 'nothing'})", where,
                        "save one array per input: numpy.savez(path, **{input_name: samples})")
    return {n: n for n in names}, label


class _NpySource(_Source):
    def __init__(self, path: str, specs: list[InputSpec]):
        self.where = path
        if len(specs) != 1:
            raise UserError(f"a .npy file holds one array but the model has {len(specs)} inputs "
                            f"({', '.join(s.name for s in specs)})", path,
                            "save an .npz with one array per input name")
        self.spec = specs[0]
        fix = "save the data with numpy.save"
        with open(path, "rb") as f:
            if f.read(6) != np.lib.format.MAGIC_PREFIX:
                raise UserError("not an .npy file (no NumPy header)", path, fix)
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            if "object" in str(e):
                raise UserError("the array holds Python objects, not numbers", path,
                                "save a numeric array with numpy.save") from None
            raise UserError(f"not a readable .npy file ({e})", path, fix) from None
        except (OSError, EOFError) as e:
            raise UserError(f"not a readable .npy file ({e})", path, fix) from None
        n, shape = _check_array_header("", a.shape, a.dtype, self.spec, path)
        self.array = a.reshape(shape)
        self.num_samples = n

    def chunks(self, size, limit):
        for start in range(0, limit, size):
            a = np.asarray(self.array[start:min(start + size, limit)])
            _check_finite(a, "", start, self.where)
            yield {self.spec.name: _cast(a, self.spec.dtype)}, None


def _npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    fmt = np.lib.format
    version = fmt.read_magic(f)
    if version == (1, 0):
        return fmt.read_array_header_1_0(f)
    if version == (2, 0):
        return fmt.read_array_header_2_0(f)
    return fmt._read_array_header(f, version)     # (3, 0): no public reader


class _NpzSource(_Source):
    """Streams each member row block by row block through zipfile (compressed or not)."""

    def __init__(self, path: str, specs: list[InputSpec]):
        self.where, self.specs = path, specs
        try:
            with zipfile.ZipFile(path) as zf:
                members = [m for m in zf.namelist() if m.endswith(".npy")]
                self.headers = {}
                for m in members:
                    with zf.open(m) as f:
                        self.headers[m[:-4]] = _npy_header(f)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise UserError(f"not a readable .npz file ({e})", path, "save the data with numpy.savez") from None
        self.names, self.label_key = _match_names(list(self.headers), specs, path)
        self.batch = model_batch(specs)
        counts = {}
        self.shapes = {}
        for s in specs:
            arr = self.names[s.name]
            shape, _, dtype = self.headers[arr]
            counts[arr], self.shapes[arr] = _check_array_header(arr, shape, dtype, s, path, self.batch)
        if self.label_key:
            shape, _, dtype = self.headers[self.label_key]
            counts[self.label_key], self.shapes[self.label_key] = _check_array_header(
                self.label_key, shape, dtype, None, path)
        if len(set(counts.values())) > 1:
            raise UserError("the arrays hold different numbers of samples ("
                            + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ")", path,
                            "give every input (and the labels) the same number of samples")
        self.num_samples = next(iter(counts.values()))
        self.has_labels = self.label_key is not None

    def _rows(self, zf: zipfile.ZipFile, arr: str, size: int, limit: int) -> Iterator[np.ndarray]:
        shape, fortran, dtype = self.headers[arr]
        target = self.shapes[arr]
        with zf.open(arr + ".npy") as f:
            _npy_header(f)
            if fortran:                                # rare: no row streaming, read it whole
                whole = np.asarray(np.lib.format.read_array(f)).reshape(target)
                for start in range(0, limit, size):
                    yield whole[start:min(start + size, limit)]
                return
            row = int(np.prod(target[1:], dtype=np.int64)) * dtype.itemsize
            for start in range(0, limit, size):
                n = min(start + size, limit) - start
                buf = f.read(n * row)
                if len(buf) != n * row:
                    raise UserError(f"array '{arr}' is truncated", self.where, "re-save the file")
                yield np.frombuffer(buf, dtype).reshape((n,) + target[1:])

    def _whole(self, zf: zipfile.ZipFile, arr: str, size: int, limit: int) -> Iterator[np.ndarray]:
        """An input fed whole: one row of its array per feed of ``batch`` samples."""
        if size != self.batch:
            raise UserError(f"array '{arr}' is fed whole, one row per feed of {self.batch} samples, but the "
                            f"feeds hold {size}", self.where, f"compile and feed at the model's batch, {self.batch}")
        for rows in self._rows(zf, arr, 1, -(-limit // size)):
            yield rows[0]

    def chunks(self, size, limit):
        with zipfile.ZipFile(self.where) as zf:
            streams = {s.name: (self._whole if s.per_feed(self.batch) else self._rows)(zf, self.names[s.name], size, limit)
                       for s in self.specs}
            labels = self._rows(zf, self.label_key, size, limit) if self.label_key else None
            for start in range(0, limit, size):
                feed = {}
                for s in self.specs:
                    a = next(streams[s.name])
                    _check_finite(a, self.names[s.name], start, self.where)
                    feed[s.name] = _cast(a, s.dtype)
                yield feed, (next(labels) if labels is not None else None)


class _RandomSource(_Source):
    def __init__(self, specs: list[InputSpec], n: int, seed: int):
        self.specs, self.num_samples, self.seed = specs, n, seed

    def chunks(self, size, limit):
        rng = np.random.default_rng(self.seed)
        batch = model_batch(self.specs)
        for start in range(0, limit, size):
            n = min(start + size, limit) - start
            feed = {}
            for s in self.specs:
                shape, dt = s.shape if s.per_feed(batch) else (n,) + s.sample_shape, np.dtype(s.dtype)
                if dt.kind == "f":
                    feed[s.name] = rng.standard_normal(shape, np.float32).astype(dt)
                elif dt.kind == "b":
                    feed[s.name] = rng.integers(0, 2, shape).astype(bool)
                else:
                    feed[s.name] = rng.integers(0, 10, shape).astype(dt)
            yield feed, None


# ---- the dataset -------------------------------------------------------------------------------
@dataclass
class Dataset:
    """A re-iterable stream of feeds ``{input_name: (batch, *sample) array}``."""
    source: _Source
    specs: list[InputSpec]
    batch: int
    num_samples: int
    where: str
    classes: list[str] = field(default_factory=list)

    @property
    def has_labels(self) -> bool:
        return self.source.has_labels

    def __len__(self) -> int:
        """Number of feeds (batches)."""
        return -(-self.num_samples // self.batch)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for feed, _ in self.source.chunks(self.batch, self.num_samples):
            yield feed

    def with_labels(self) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None]]:
        """(feed, labels) pairs; labels is None when the data has none."""
        return self.source.chunks(self.batch, self.num_samples)


def _finish(source: _Source, specs, samples: int | None, batch: int, where: str) -> Dataset:
    if batch < 1:
        raise UserError(f"batch must be at least 1, got {batch}", where)
    n = source.num_samples
    if n == 0:
        raise UserError("the data holds no samples", where, "give at least one sample")
    if samples is not None:
        if samples < 1:
            raise UserError(f"asked for {samples} samples", where, "ask for at least 1")
        if samples > n:
            warnings.warn(f"{where}: asked for {samples} samples but the data holds {n}; using {n}",
                          stacklevel=3)
        n = min(n, samples)
    return Dataset(source, specs, batch, n, where, getattr(source, "classes", []))


def open_dataset(path: str | os.PathLike, input_specs: Iterable[Any], *, samples: int | None = None,
                 preprocess: Preprocess | None = None, batch: int = 1) -> Dataset:
    """Open calibration/evaluation data: an image folder (or one image), ``.npy`` or ``.npz``.

    ``input_specs``: the model inputs as (name, shape, dtype) with the batch dimension first.
    ``samples``: use at most this many (the first ones). Raises UserError for bad data; NaN/Inf
    are found while iterating (the error names the sample)."""
    specs = as_specs(input_specs)
    where = os.fspath(path)
    if not specs:
        raise UserError("the model has no inputs to feed", where)
    if not os.path.exists(where):
        raise UserError("no such file or folder", where, "check the path of the calibration data")
    suffix = Path(where).suffix.lower()
    if os.path.isdir(where) or suffix in IMAGE_EXTS:
        if len(specs) != 1:
            raise UserError(f"images can feed a single-input model, but this one has {len(specs)} inputs", where,
                            "give an .npz with one array per input name")
        source: _Source = _ImageSource(where, specs[0], preprocess or Preprocess())
    elif suffix == ".npy":
        source = _NpySource(where, specs)
    elif suffix == ".npz":
        source = _NpzSource(where, specs)
    else:
        raise UserError(f"unsupported data file type '{suffix}'", where,
                        "give a folder of images, an .npy or an .npz file")
    return _finish(source, specs, samples, batch, where)


def random_dataset(input_specs: Iterable[Any], n: int = 32, seed: int = 0, *, batch: int = 1) -> Dataset:
    """``--calib random``: n samples of standard normal floats (integers in [0, 10)). Warns:
    ranges from random data are not representative of real inputs."""
    specs = as_specs(input_specs)
    warnings.warn("calibrating on random data: the activation ranges are not representative of real "
                  "inputs and the quantized model may be inaccurate; give real samples for production",
                  stacklevel=2)
    return _finish(_RandomSource(specs, n, seed), specs, None, batch, "<random>")


# ---- progress ----------------------------------------------------------------------------------
class Progress:
    """A one-line progress bar on stderr: ``calibrate 120/500 [####                ] 35.2/s``.

    Only on a terminal: it redraws the line in place (``\\r``) at most every ``interval`` seconds
    and leaves the final count on it. Elsewhere (pipes, logs, CI) and with ``quiet`` it prints
    nothing."""

    def __init__(self, total: int | None, desc: str = "", *, quiet: bool = False, stream=None,
                 interval: float = 0.2):
        self.total, self.desc = total, desc
        self.stream = stream if stream is not None else sys.stderr
        self.interval, self.done = interval, 0
        self._start = self._last = time.monotonic()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.quiet = quiet or not self._tty

    def _line(self) -> str:
        rate = self.done / max(time.monotonic() - self._start, 1e-9)
        if self.total:
            filled = int(20 * min(self.done, self.total) / self.total)
            return f"{self.desc} {self.done}/{self.total} [{'#' * filled}{' ' * (20 - filled)}] {rate:.1f}/s"
        return f"{self.desc} {self.done} {rate:.1f}/s"

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if not self.quiet and now - self._last >= self.interval:
            self._last = now
            self.stream.write("\r" + self._line())
            self.stream.flush()

    def close(self) -> None:
        if not self.quiet:
            self.stream.write("\r" + self._line() + "\n")
            self.stream.flush()
        self.quiet = True

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(items: Iterable, total: int | None = None, desc: str = "", *, quiet: bool = False,
             count: Callable[[Any], int] | None = None) -> Iterator:
    """Iterate ``items`` with a :class:`Progress`; ``count(item)`` says how much each item advances
    the bar (default 1)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)   # type: ignore[arg-type]
    with Progress(total, desc, quiet=quiet) as bar:
        for item in items:
            yield item
            bar.update(count(item) if count else 1)
