"""``qcompile run OUT --input X.npy|X.npz [--output Y.npy]``: run a data set through an artifact.

An artifact has a fixed input shape, usually with batch 1. Data arrays carry a leading *sample*
dimension and are sliced to fit:

* same rank as the input (``X: (N, 3, 224, 224)`` for input ``(B, 3, 224, 224)``, N a multiple of
  B): N/B runs on consecutive slices; outputs are concatenated along axis 0 → ``(N, ...)``.
* one more dimension (``X: (N, B, 3, 224, 224)``): N runs, one per sample; outputs are stacked →
  ``(N, *output_shape)``.

A single-input model takes an ``.npy`` (or an ``.npz`` with one array); a multi-input model an
``.npz`` whose array names are the input names.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from ..errors import UserError
from .manifest import TensorSpec
from .shapes import shape_matches

if TYPE_CHECKING:
    from . import CompiledModel


def load_inputs(path: str | Path, inputs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """Read ``.npy``/``.npz`` data for a model with the given inputs, keyed by input name.

    Anything that is not such a file (missing, a directory, empty, truncated, a corrupt zip,
    pickled objects, text) is a :class:`UserError`, as is an array that is not numeric."""
    p = Path(path)
    where = str(p)
    fix = "save the input with numpy.save (one array) or numpy.savez (arrays named after the inputs)"
    try:
        data = np.load(p, allow_pickle=False)
        if isinstance(data, np.ndarray):
            arrays = {"": data}
        else:
            with data:
                arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise UserError("no such file", where, "give an existing .npy or .npz file") from None
    except IsADirectoryError:
        raise UserError("is a directory, not a .npy/.npz file", where, fix) from None
    except EOFError:
        raise UserError("the file is empty or ends early: not a .npy/.npz file", where, fix) from None
    except Exception as e:      # ValueError, OSError, zipfile.BadZipFile, UnpicklingError, ...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot read it as .npy/.npz ({msg})", where, fix) from None
    if not arrays:
        raise UserError("the .npz file holds no arrays", where, fix)
    for k, a in arrays.items():
        if a.dtype.kind not in "biuf":                     # bool, ints, floats
            raise UserError(f"array {k + ' ' if k else ''}has dtype {a.dtype}, not numbers", where,
                            "save numeric arrays (e.g. float32) as model input")
    return name_inputs(arrays, inputs, where)


def name_inputs(arrays: Mapping[str, np.ndarray], inputs: list[TensorSpec], where: str) -> dict[str, np.ndarray]:
    names = [s.name for s in inputs]
    if len(arrays) == 1 and len(inputs) == 1:
        return {names[0]: next(iter(arrays.values()))}
    if set(arrays) != set(names):
        raise UserError(f"the model's inputs are {', '.join(names)} but the data holds "
                        f"{', '.join(a or '<one unnamed array>' for a in arrays)}", where,
                        "save one array per input with numpy.savez(path, **{input_name: array})")
    return dict(arrays)


def batch_plan(spec: TensorSpec, a: np.ndarray, where: str) -> tuple[str, int]:
    """('slice', runs) or ('sample', runs) for one input array. A dynamic dim (an artifact built
    with ``--dynamic``) matches any size; a dynamic batch takes the whole array in one run."""
    shape, want = tuple(a.shape), spec.shape
    if len(want) > 0 and shape_matches(shape, want) and shape[0] > 0 and isinstance(want[0], str):
        return "slice", 1
    if len(want) > 0 and len(shape) == len(want) and shape_matches(shape[1:], want[1:]) \
            and isinstance(want[0], int) and want[0] > 0 and shape[0] % want[0] == 0 and shape[0] > 0:
        return "slice", shape[0] // want[0]
    if len(shape) == len(want) + 1 and shape_matches(shape[1:], want) and shape[0] > 0:
        return "sample", shape[0]
    raise UserError(f"input '{spec.name}' data has shape {list(shape)}, which does not split into "
                    f"runs of the compiled shape {list(want)}", where,
                    f"give (N*{want[0] if want else 1}, ...{list(want[1:])}) slices or (N, *{list(want)}) samples")


def run_batches(model: "CompiledModel", data: str | Path | np.ndarray | Mapping[str, np.ndarray],
                *, progress: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray]:
    """Run every sample of ``data`` (a path, one array, or arrays by input name) through ``model``.

    Returns ``{output name: array}`` in manifest order, the per-run results concatenated along
    axis 0 (slice mode) or stacked on a new leading sample axis (sample mode).
    ``progress(done, total)`` is called after each run."""
    where = str(data) if isinstance(data, (str, Path)) else str(model.out_dir)
    if isinstance(data, (str, Path)):
        arrays = load_inputs(data, model.inputs)
    elif isinstance(data, np.ndarray):
        arrays = name_inputs({"": data}, model.inputs, where)
    else:
        arrays = name_inputs(data, model.inputs, where)
    plans = {s.name: batch_plan(s, arrays[s.name], where) for s in model.inputs}
    counts = {runs for _, runs in plans.values()}
    if len(counts) != 1:
        raise UserError("inputs hold different numbers of samples: " +
                        ", ".join(f"{n}: {r}" for n, (_, r) in plans.items()), where,
                        "give every input the same number of samples")
    runs = counts.pop()
    per_run: list[list[np.ndarray]] = []
    for i in range(runs):
        feed: dict[str, Any] = {}
        for s in model.inputs:
            mode, _ = plans[s.name]
            a = arrays[s.name]
            step = a.shape[0] if runs == 1 else s.shape[0]
            feed[s.name] = a[i] if mode == "sample" else a[i * step:(i + 1) * step]
        per_run.append(model(**feed))
        if progress:
            progress(i + 1, runs)
    sliced = all(mode == "slice" for mode, _ in plans.values())
    results: dict[str, np.ndarray] = {}
    for k, spec in enumerate(model.outputs):
        parts = [r[k] for r in per_run]
        batch = model.inputs[0].shape[0] if model.inputs and model.inputs[0].shape else None
        if sliced and spec.shape and spec.shape[0] == batch:
            results[spec.name] = np.concatenate(parts, axis=0)
        else:
            results[spec.name] = np.stack(parts, axis=0)
    return results


def save_outputs(outputs: Mapping[str, np.ndarray], path: str | Path) -> Path:
    """Write results: ``.npy`` for a single output, ``.npz`` (arrays named like the outputs)
    otherwise. The suffix of ``path`` decides; ``.npy`` with several outputs is refused."""
    p = Path(path)
    if p.suffix == ".npz":
        np.savez(p, **dict(outputs))
    elif p.suffix == ".npy":
        if len(outputs) != 1:
            raise UserError(f"the model has {len(outputs)} outputs; a .npy file holds one", str(p),
                            "give an --output path ending in .npz")
        np.save(p, next(iter(outputs.values())))
    else:
        raise UserError("output file must end in .npy or .npz", str(p))
    return p
