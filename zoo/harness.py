"""Build a zoo model with qcompiler as a user would (the CLI), run it, compare it with ONNX Runtime.

    art = build(m, "fp32", out_dir)                  # qcompile M.onnx --dtype fp32 -o OUT (in process)
    ys = run(art, m.feeds(4, seed=1))                # one output list per feed
    art8 = build(m, "int8", out_dir8, calib=m.feeds(32))
"""
from __future__ import annotations

import contextlib
import io
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


def cli_args(m: ZooModel, dtype: str, out: Path, calib_npz: Path | None = None) -> list[str]:
    """The qcompile command line for ``m`` (after ``qcompile``)."""
    args = [str(m.path()), "--target", "x86", "--dtype", dtype, "-o", str(out), "-q"]
    for k, (_, shape) in m.inputs.items():
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


def build(m: ZooModel, dtype: str, out: Path, calib: list[dict] | None = None) -> Build:
    """``qcompile`` in this process; raises RuntimeError with its message if it does not exit 0."""
    from qcompiler.cli import main
    out = Path(out)
    npz = save_calib(calib, out.with_name(out.name + ".calib.npz")) if calib else None
    t = time.perf_counter()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            rc = main(cli_args(m, dtype, out, npz))
    except SystemExit as e:
        rc = e.code
    seconds = time.perf_counter() - t
    if rc not in (0, None):
        raise RuntimeError(f"qcompile {' '.join(cli_args(m, dtype, out, npz))} exited {rc}: "
                           f"{err.getvalue().strip()[-2000:]}")
    return Build(out, seconds)


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
