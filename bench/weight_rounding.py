"""Round-to-nearest beside GPTQ weight rounding (``--weight-rounding nearest|gptq``) on zoo models:
output SQNR of the quantized model against ONNX Runtime fp32 on held-back feeds (issue #38: int8
with gptq >= nearest on every trained CNN and +1 dB on average; fp8 E4M3 >= 25 dB).

    python bench/weight_rounding.py --models mnistnet rapidocr-cls --dtypes int8 --calib 32 --eval 16
    python bench/weight_rounding.py --models resnet18 --dtypes fp8 --calib 16 --eval 8 --ceiling

Each build runs the compile driver's passes (what ``qcompile M.onnx --dtype D --calib C
[--weight-rounding gptq]`` runs: x86 defaults, per-channel weights, empirical bias correction where
it helps) on the ``--calib`` feeds (``m.feeds(n, seed=0)``), and the quantized graph is run on the
``--eval`` feeds (seed 1) by ONNX Runtime as its QDQ export, op by op (the integer network to within
one step at a rounding tie; :func:`qcompiler.passes.quantize_bias.variant_runner`); SQNR = 10
log10(Σ ref² / Σ (ref - ours)²) over every output element of every feed, ref = ONNX Runtime fp32 on
the model as given. No artifact is built (the kernels are checked against the same graph by
``qcompile verify`` and the test suite). ``--ceiling``: also the float graph with only the conv/gemm
inputs rounded on the build's own params (weights float), the most any weight rounding reaches.
One JSON line per build on stderr, the table on stdout.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import zoo  # noqa: E402
from zoo.harness import options, save_calib  # noqa: E402
from zoo.loader import ort_run, sqnr_db  # noqa: E402

CNNS = ("rapidocr-det", "rapidocr-rec", "rapidocr-cls", "fashion_mobilenet", "mnistnet", "uspsnet", "svhnnet")
ROUNDINGS = ("nearest", "gptq")


class ProjectModel:
    """A model of models/ with its own test data (fashion_mobilenet: Fashion-MNIST test images),
    seen through the zoo's interface: feeds of seed 0 from the front of the data, seed 1 from
    the back (the calibration and evaluation feeds never overlap)."""

    def __init__(self, name: str, data: str, input_name: str):
        root = Path(__file__).resolve().parent.parent / "models"
        self.name, self._path, self._data, self._input = name, root / f"{name}.onnx", root / data, input_name
        self.input_values: dict = {}

    def path(self) -> Path:
        return self._path

    @property
    def input_shapes(self) -> dict:
        import numpy as np
        with np.load(self._data) as z:
            return {self._input: (1, *z["x"].shape[1:])}

    def feeds(self, n: int, seed: int = 0) -> list[dict]:
        import numpy as np
        with np.load(self._data) as z:
            x = z["x"].astype(np.float32)
        idx = range(n) if seed == 0 else range(len(x) - n * seed, len(x) - n * (seed - 1))
        return [{self._input: x[i:i + 1]} for i in idx]

    def ort_feeds(self, feeds: dict) -> dict:
        return feeds


def get(name: str):
    if name == "fashion_mobilenet":
        return ProjectModel(name, "fashion_test.npz", "input")
    return zoo.get(name)


def quantized_graph(m, dtype: str, npz: Path, rounding: str, float_graph: list | None = None):
    """The graph the driver's passes make of ``m`` (``dtype`` int8 or fp8[-e5m2]); ``float_graph``
    receives the float graph the quantize pass started from."""
    from qcompiler.driver import CalibSource, load_model, run_pipeline
    from qcompiler.driver.options import WeightRounding
    base, _, fmt = dtype.partition("-")
    src, opts = options(m, base, npz, weight_rounding=WeightRounding(rounding))
    if fmt:
        opts = dataclasses.replace(opts, target=dataclasses.replace(opts.target, fp8_format=fmt))
    g = load_model(src)
    calib = CalibSource.open(opts.calib, g.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = run_pipeline(g, opts, lambda msg: None, calib=calib)
    if float_graph is not None:
        float_graph.append(pm.ctx.data["quantize.float_graph"])
    return g


def activations_only(g, float_graph):
    """``float_graph`` with only the inputs of the convs/gemms ``g`` quantized rounded, on ``g``'s
    own params (a QuantizeLinear/DequantizeLinear pair before each), weights and biases float: the
    most any weight rounding can reach."""
    f = float_graph.clone()
    params = {op.name: op.operands[0].type.quant for op in g.ops if op.kind in ("QLinearConv", "QLinearGemm")}
    for i, op in enumerate(list(f.ops)):
        if op.name not in params:
            continue
        x = op.operands[0]
        q = f.create_op("QuantizeLinear", [x], result_types=[x.type.with_quant(params[op.name])],
                        name=f"ceiling_q{i}", result_names=[f"ceiling_q{i}"], before=op).result
        op.set_operand(0, f.create_op("DequantizeLinear", [q], name=f"ceiling_dq{i}", result_names=[f"ceiling_dq{i}"],
                                      before=op).result)
    return f


def measure(name: str, dtypes: list[str], n_calib: int, n_eval: int, out: Path, ceiling: bool = False) -> dict:
    from qcompiler.passes.quantize_bias import variant_runner
    m = get(name)
    calib, evals = m.feeds(n_calib, seed=0), m.feeds(n_eval, seed=1)
    flat = [o for f in evals for o in ort_run(m.path(), m.ort_feeds(f))]
    npz = save_calib(calib, out / f"{name}.calib.npz")
    row: dict = {"model": name, "calib": n_calib, "eval": n_eval}
    for d in dtypes:
        for r in ROUNDINGS:
            t = time.perf_counter()
            fg: list = []
            g = quantized_graph(m, d, npz, r, fg)
            build_s = time.perf_counter() - t
            names = [v.name for v in g.inputs]
            got = variant_runner(g)([{k: f[k] for k in names} for f in evals])
            scheme = g.meta.get("quant", {}).get("scheme", {})
            res = {"sqnr_db": round(float(sqnr_db(flat, [o for y in got for o in y])), 2),
                   "passes_s": round(build_s, 1),
                   "bias_correction": scheme.get("bias_correction", {}).get("applied"),
                   **({"layers": scheme["weight_rounding"]} if "weight_rounding" in scheme else {})}
            if ceiling and r == "nearest":
                got = variant_runner(activations_only(g, fg[0]))([{k: f[k] for k in names} for f in evals])
                res["activations_only_db"] = round(float(sqnr_db(flat, [o for y in got for o in y])), 2)
            row[f"{d}/{r}"] = res
            print(json.dumps({"model": name, f"{d}/{r}": res}), file=sys.stderr, flush=True)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(CNNS))
    p.add_argument("--dtypes", default="int8")
    p.add_argument("--calib", type=int, default=32)
    p.add_argument("--eval", type=int, default=16)
    p.add_argument("--ceiling", action="store_true",
                   help="also the activations-only SQNR: only the conv/gemm inputs rounded (weights float)")
    a = p.parse_args(argv)
    dtypes = a.dtypes.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models:
            rows.append(measure(name, dtypes, a.calib, a.eval, Path(tmp), a.ceiling))
    cols = [f"{d}/{r}" for d in dtypes for r in ROUNDINGS]
    print(f"\noutput SQNR vs ONNX Runtime fp32, dB ({a.calib} calibration / {a.eval} held-back feeds); "
          "gptq: layers GPTQ / all")
    print(f"{'model':<18}" + "".join(f"{c:>18}" for c in cols) + "".join(f"{d + ' gain':>12}" for d in dtypes))
    for row in rows:
        cells = []
        for c in cols:
            v = row[c]
            lay = v.get("layers")
            cells.append(f"{v['sqnr_db']:.2f}" + (f" ({lay['gptq']}/{lay['layers']})" if lay else ""))
        gains = [row[f"{d}/gptq"]["sqnr_db"] - row[f"{d}/nearest"]["sqnr_db"] for d in dtypes]
        ceil = "".join(f"  {d} activations only {row[f'{d}/nearest']['activations_only_db']:.2f}" for d in dtypes
                       if "activations_only_db" in row[f"{d}/nearest"])
        print(f"{row['model']:<18}" + "".join(f"{c:>18}" for c in cells) + "".join(f"{x:>+12.2f}" for x in gains) + ceil)
    for d in dtypes:
        gains = [r[f"{d}/gptq"]["sqnr_db"] - r[f"{d}/nearest"]["sqnr_db"] for r in rows]
        print(f"{d}: mean gain {sum(gains) / len(gains):+.2f} dB, worst {min(gains):+.2f} dB over {len(gains)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
