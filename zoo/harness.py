"""Build a zoo model with qcompiler's compile driver (what ``qcompile`` runs), run it, compare it
with ONNX Runtime.

    art = build(m, "fp32", out_dir)                  # = qcompile M.onnx --dtype fp32 -o OUT
    ys = run(art, m.feeds(4, seed=1))                # one output list per feed
    art8 = build(m, "int8", out_dir8, calib=m.feeds(32))
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .loader import ZooModel


@dataclass
class Build:
    out: Path
    seconds: float
    model: object = None        # the loaded CompiledModel

    def __call__(self, feed: dict) -> list[np.ndarray]:
        if self.model is None:
            from qcompiler.runtime import load
            self.model = load(self.out)
        return self.model(**feed)


def cli_args(m: ZooModel, dtype: str, out: Path, calib_npz: Path | None = None,
             path: Path | None = None) -> list[str]:
    """The qcompile command line for ``m`` (after ``qcompile``); ``path``: another file of the same
    model (its QDQ form) in place of ``m.path()``."""
    args = [str(path or m.path()), "--target", "x86", "--dtype", dtype, "-o", str(out), "-q"]
    for k, shape in m.input_shapes.items():
        args += ["--input-shape", f"{k}={'x'.join(map(str, shape))}"]
    for k, v in m.values.items():
        vals = v if isinstance(v, list) else [v]
        args += ["--input-value", f"{k}={','.join(map(str, vals))}"]
    if calib_npz is not None:
        args += ["--calib", str(calib_npz), "--eval-samples", "0"]
    return args


def save_calib(feeds: list[dict], path: Path) -> Path:
    """The feeds as one .npz, one array per input with a leading sample dimension."""
    np.savez(path, **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    return path


def save_runs(feeds: list[dict], path: Path) -> Path:
    """The feeds as one .npz that ``qcompile verify --data`` splits back into the same runs: each
    input's feeds joined along their batch axis."""
    np.savez(path, **{k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]})
    return path


def options(m: ZooModel, dtype: str, calib_npz: Path | None = None, path: Path | None = None, **calib_opts):
    """(ModelSource, CompileOptions) of ``m`` (or of ``path``, another file of it): x86, the CLI's
    defaults, calibration without a report evaluation (``cli_args`` gives the same build as a
    command line)."""
    from qcompiler.codegen.target import TargetSpec
    from qcompiler.driver import CalibOptions, CompileOptions, ModelSource
    from qcompiler.plan.mixed import BudgetOptions
    budget = BudgetOptions(keep_float=tuple(calib_opts.pop("keep_float", ())))
    src = ModelSource(str(path or m.path()), m.input_shapes, m.input_values)
    calib = CalibOptions(source=str(calib_npz), eval_samples=0, **calib_opts) if calib_npz is not None \
        else CalibOptions(**calib_opts)
    return src, CompileOptions(target=TargetSpec("x86", dtype=dtype), calib=calib, budget=budget, quiet=True)


def build(m: ZooModel, dtype: str, out: Path, calib: list[dict] | None = None, path: Path | None = None,
          **calib_opts) -> Build:
    """Compile ``m`` (``path``: another file of it, e.g. its QDQ form) with
    :func:`qcompiler.driver.compile`; raises RuntimeError with the error's message (and the
    equivalent command line) if it fails. A pre-quantized file needs no ``calib`` for int8.
    ``calib_opts``: further :class:`~qcompiler.driver.CalibOptions` fields (``smooth_quant="auto"``),
    and ``keep_float`` (names or ``op:KIND``, as ``--keep-float``)."""
    import warnings

    from qcompiler.driver import compile
    out = Path(out)
    npz = save_calib(calib, out.with_name(out.name + ".calib.npz")) if calib else None
    src, opts = options(m, dtype, npz, path, **calib_opts)
    t = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(src, out, opts)
    except Exception as e:                       # noqa: BLE001 - the stage and message, as the CLI says it
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise RuntimeError(f"qcompile {' '.join(cli_args(m, dtype, out, npz, path))}: {type(e).__name__}: {msg}") from e
    return Build(out, time.perf_counter() - t)


def max_rel_error(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """max |got - ref| / max |ref| over all outputs (each output scaled by its own max)."""
    worst = 0.0
    for r, g in zip(ref, got):
        r64 = np.asarray(r, np.float64)
        if r64.shape != np.shape(g):
            return float("inf")
        scale = max(float(np.abs(r64).max()) if r64.size else 0.0, 1e-12)
        worst = max(worst, float(np.abs(np.asarray(g, np.float64) - r64).max()) / scale if r64.size else 0.0)
    return worst
