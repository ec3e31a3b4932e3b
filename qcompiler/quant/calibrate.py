"""Calibration: run the float model over the data once and observe the ranges of chosen values.

    ranges = collect_ranges(graph, open_dataset("calib/", graph.inputs), ["conv1_out", "relu_out"],
                            method="percentile", p=99.99)
    # {"conv1_out": (-3.2, 4.1), "relu_out": (0.0, 4.0)}

The graph is exported to ONNX (:func:`qcompiler.frontend.onnx_export.export_onnx`), the values
asked for become extra graph outputs (typed from the IR), and ONE onnxruntime session runs the
stream batch by batch; each batch of each value goes to its observer and is dropped, so memory does
not grow with the number of samples. Graph inputs are observed from the feeds, constants (weights)
from their data, once.

Feeds whose leading dimension differs from the model's batch B are split into runs of B samples
(a remainder that does not fill a run is skipped, with a warning).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UserError
from .data import progress
from .observers import Method, Observer, make_observer

Feed = Mapping[str, np.ndarray]


def collect_ranges(graph: Any, dataset: Iterable[Feed], values: list[str],
                   method: Method | str = Method.MINMAX, *, quiet: bool = True,
                   **method_opts) -> dict[str, tuple[float, float]]:
    """The range of each value in ``values`` over ``dataset`` (an iterable of feeds
    ``{input_name: array}``, e.g. :func:`~qcompiler.quant.data.open_dataset`), by ``method``
    (``minmax``, ``percentile``, ``entropy``, ``mse``; options such as ``p=99.99`` go to the
    observer). ``graph``: an IR :class:`~qcompiler.ir.Graph` or an ``onnx.ModelProto``."""
    make_observer(method, **method_opts)                     # bad method/options fail before running
    obs = observe(graph, dataset, values, lambda name: make_observer(method, **method_opts), quiet=quiet)
    out = {}
    for name, o in obs.items():
        if o.count == 0:
            raise UserError("the value held no finite numbers on the calibration data", f"value %{name}",
                            "check the data and the model: the activation is all NaN/Inf")
        out[name] = o.range()
    return out


def observe(graph: Any, dataset: Iterable[Feed], values: list[str],
            make: Callable[[str], Observer], *, quiet: bool = True) -> dict[str, Observer]:
    """Like :func:`collect_ranges`, but with an observer per value from ``make(name)``; returns
    the observers (histograms and all)."""
    model, types, consts = _model_and_types(graph)
    observers = {name: make(name) for name in dict.fromkeys(values)}
    run_names = []
    for name in observers:
        if name in consts:
            observers[name].update(consts[name]())
        else:
            run_names.append(name)
    for _, vals in _runs(model, types, dataset, run_names, quiet, "calibrate"):
        for name, a in vals.items():
            observers[name].update(a)
    return observers


def float_runs(graph: Any, dataset: Iterable[Feed], values: list[str], *, quiet: bool = True,
               desc: str = "calibrate") -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """The values named (non-constant floating-point values of ``graph``, or its inputs) on each
    run of the float model over ``dataset``: ``(i, {name: array})`` per run, ``i`` the index of
    the dataset item (a feed is cut into runs of the model's static batch). One onnxruntime
    session (``graph`` exported to ONNX, every op as written: see :func:`ort_session`) serves all."""
    model, types, _ = _model_and_types(graph)
    return _runs(model, types, dataset, values, quiet, desc)


def value_runs(graph: Any, dataset: Iterable[Feed], values: list[str]) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """As :func:`float_runs`, for values of any element type (e.g. the integers of a quantized
    value in a QDQ model: ``value_runs(export_qdq(g), ...)``)."""
    model, types, _ = _model_and_types(graph)
    return _runs(model, types, dataset, values, True, "run", floats_only=False)


def float_runner(graph: Any, values: list[str], floats_only: bool = True) -> Callable[[Feed], dict[str, np.ndarray]]:
    """One onnxruntime session for ``graph`` (as :func:`float_runs`) as a function: feed -> the
    named float values (any values with ``floats_only=False``) over all its samples (the runs it is
    cut into at the model's batch joined). The session is made here: a graph onnxruntime cannot hold
    or run fails now, not at the first feed."""
    model, types, _ = _model_and_types(graph)
    sess, fetch, from_feed, inputs, batch = _session(model, types, values, floats_only)
    names = fetch + from_feed

    def run(feed: Feed) -> dict[str, np.ndarray]:
        parts = [{**dict(zip(fetch, sess.run(fetch, r) if fetch else [])), **{n: r[n] for n in from_feed}}
                 for r in batch_runs(feed, inputs, batch)]
        return parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in names}
    return run


def _session(model: onnx.ModelProto, types: dict, values: list[str], floats_only: bool):
    """(session, fetched names, names taken from the feed, input names, batch) for ``values``,
    each made an output of ``model`` (modified in place)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in inits]
    outputs = {o.name for o in g.output}
    fetch: list[str] = []
    from_feed: list[str] = []
    for name in dict.fromkeys(values):
        elem = types.get(name)
        if elem is None or name in inits:
            raise ValueError(f"no value named %{name} in the graph" if elem is None else
                             f"%{name} is a constant, not a value a run computes")
        if floats_only and elem[0] not in _FLOAT_TYPES:
            raise ValueError(f"value %{name} is {onnx.TensorProto.DataType.Name(elem[0])}, not floating point: "
                             "only float values have ranges to calibrate")
        if any(i.name == name for i in inputs):
            from_feed.append(name)
            continue
        if name not in outputs:
            g.output.append(helper.make_tensor_value_info(name, elem[0], elem[1]))
        fetch.append(name)
    return ort_session(model), fetch, from_feed, [x.name for x in inputs], model_batch(inputs)


def _runs(model: onnx.ModelProto, types: dict, dataset: Iterable[Feed], values: list[str], quiet: bool,
          desc: str, floats_only: bool = True) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    sess, fetch, from_feed, inputs, batch = _session(model, types, values, floats_only)
    total = len(dataset) if hasattr(dataset, "__len__") else None   # type: ignore[arg-type]
    for i, feed in enumerate(progress(dataset, total, desc, quiet=quiet)):
        for run in batch_runs(feed, inputs, batch):
            outs = sess.run(fetch, run) if fetch else []
            yield i, {**dict(zip(fetch, outs)), **{name: run[name] for name in from_feed}}


def ort_session(model: onnx.ModelProto):
    """An onnxruntime CPU session that runs ``model`` as written, op by op: ORT's fusions
    (Conv+Add, ...) change the float rounding, and which of them apply depends on the values
    fetched, so the ranges would depend on which values a build asks for (a --keep-float build and
    the selection that scored it differed by an ulp). On a QDQ model no integer fusion applies
    either: each DequantizeLinear -> float op -> QuantizeLinear runs as written."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 4       # fatal only
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                onnx.TensorProto.BFLOAT16)


def _model_and_types(graph: Any):
    """An ONNX model we may modify; name -> (elem_type, shape or None) for every tensor; and
    name -> a function giving the array of every constant."""
    types: dict[str, tuple[int, list | None]] = {}
    if isinstance(graph, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(graph)
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:                                    # inference is a help, not a must
            inferred = model
        g = inferred.graph
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            t = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] \
                if t.HasField("shape") else None
            types[vi.name] = (t.elem_type, dims)
        consts = {t.name: (lambda t=t: numpy_helper.to_array(t)) for t in model.graph.initializer}
        return model, types, consts
    from ..frontend.onnx_export import export_onnx
    model = export_onnx(graph)
    for v in graph.values():
        types[v.name] = (_ELEM.get(v.dtype) or helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype)), list(v.shape))
    consts = {v.name: (lambda v=v: v.data) for v in graph.values() if v.is_const}
    return model, types, consts


_ELEM = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
         "float64": onnx.TensorProto.DOUBLE, "bfloat16": onnx.TensorProto.BFLOAT16}


def model_batch(inputs) -> int | None:
    """The static leading dimension shared by the model inputs, or None (dynamic/none)."""
    dims = set()
    for i in inputs:
        shape = i.type.tensor_type.shape.dim
        dims.add(shape[0].dim_value if shape and shape[0].HasField("dim_value") else None)
    return dims.pop() if len(dims) == 1 else None


def batch_runs(feed: Feed, names: list[str], batch: int | None) -> Iterable[dict[str, np.ndarray]]:
    """The feed cut into runs of ``batch`` samples (the model's static batch)."""
    missing = [n for n in names if n not in feed]
    if missing:
        raise UserError(f"the data gives no values for model input(s) {', '.join(missing)} "
                        f"(it has {', '.join(feed) or 'nothing'})", "calibration data",
                        "name the arrays after the model inputs")
    run = {n: np.asarray(feed[n]) for n in names}
    n = run[names[0]].shape[0] if names and run[names[0]].ndim else None
    if batch is None or n is None or n == batch:
        yield run
        return
    whole = n // batch * batch
    if whole < n:
        warnings.warn(f"calibration: a feed of {n} samples does not fill runs of the model's batch {batch}; "
                      f"skipping {n - whole} sample(s)", stacklevel=3)
    for s in range(0, whole, batch):
        yield {k: a[s:s + batch] for k, a in run.items()}
