"""CUDA: qcompiler int8 and fp16 beside PyTorch fp16 (eager and ``torch.compile``), in one run.

    python bench/bench_cuda.py                                   # resnet18, mobilenet_v2 at batch 1 and 64
    python bench/bench_cuda.py --models resnet18 --batches 64 --iters 50

Needs a CUDA GPU, nvcc, PyTorch and torchvision (none of them is a qcompiler dependency: this
script is run on a GPU host, e.g. the project's lent H100). For each model and batch:

* the model: torchvision's ``resnet18`` / ``mobilenet_v2`` with random weights (``torch.manual_seed(0)``),
  eval mode; exported to ONNX (fp32, opset 17, static batch);
* PyTorch: the model in fp16 on the GPU, eager and ``torch.compile`` (default mode), under
  ``torch.inference_mode``: the median of 5 CUDA-event timings of ``--iters`` calls, after
  ``--warmup`` calls and at least 1 s of calls (the GPU's clock ramps up from idle);
* qcompiler: the ONNX file through the CLI, ``qcompile M.onnx --target cuda --arch sm_90 --dtype fp16``
  and ``--dtype int8 --calib C.npz`` (64 random-normal calibration samples; ranges, not accuracy,
  matter for speed), compile time of each; the artifact loaded with ``qcompiler.load`` and its VM
  ``main`` timed with TVM's ``time_evaluator`` (CUDA events, input already on the GPU; the same
  warm-up and median of 5 rounds);
* agreement: qcompiler fp16 against torch fp32 (max error / max|ref|) and int8's top-1 agreement
  with torch fp32 over the batch (random weights and inputs: a sanity check, not an accuracy claim;
  MobileNetV2's BatchNorm statistics are re-estimated on random-normal batches first, see
  :func:`reestimate_bn`: as initialized it ends in logits of ~1e-9, which float16 flushes to 0).

Then the largest convolution of ResNet-18 (by multiply-accumulates; and the largest one whose
GEMM sizes allow tensor cores) compiled alone as int8 and fp16 at batch 64, with the achieved
fraction of the H100 SXM's dense peak (int8 1979 TOPS, fp16 989 TFLOPS; NVIDIA H100 datasheet).

Prints one table: milliseconds per batch and the ratio to ``torch.compile`` fp16 (issue #10's
goal: int8 <= 1.0x at batch 64 and <= 1.5x at batch 1).

A GPU host without TVM's compiler (the project's lent H100 carries at most 64 MiB; the compiler
library alone is 259 MB) takes the builds from a GPU-less host:

    python bench/bench_cuda.py --build-only B --keep W      # GPU-less host: export, calibrate, build into B
    python bench/bench_cuda.py --prebuilt B                 # GPU host: torch timings beside B's artifacts

``--build-only`` needs torch and torchvision (CPU), ``--prebuilt`` a runtime-only TVM
(``TVM_USE_RUNTIME_LIB=1``, see ``qcompiler.runtime``). Both rebuild the torch models from
``torch.manual_seed(0)``; ``B/builds.json`` records each build's compile time and a fingerprint
of the weights it was built from, and the agreement columns are printed only where the GPU host's
torch model has the same fingerprint.

``--int8-layouts nchw,blocked,blocked-copy`` builds the int8 models once per activation layout of
the int8 convs (``QC_CUDA_INT8_LAYOUT`` in each build's environment; see
``qcompiler.codegen.cuda.int8.cuda_int8_layout``) and times them side by side, labelled
``int8`` (nchw), ``int8+blocked``, ``int8+blocked-copy``; every layout computes the same integers,
so each row also says whether their outputs are bit-identical. The default is the layout that
``QC_CUDA_INT8_LAYOUT`` names in the bench's own environment (nchw when unset).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEAK = {"int8": 1979e12, "fp16": 989e12}     # H100 SXM5 dense tensor-core peaks (ops/s)
LAYOUTS = ("nchw", "blocked", "blocked-copy")   # qcompiler.codegen.cuda.int8.cuda_int8_layout's choices


def torch_model(name: str):
    import torch
    try:
        import torchvision
    except RuntimeError:
        # torchvision's compiled operators (nms, ...) do not register against a torch they were not
        # built for (torchvision 0.28 beside the CPU torch 2.13); the model definitions need none of them
        import types
        for mod in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[mod]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    if name in REESTIMATE_BN:
        reestimate_bn(model)
    return model.eval()


REESTIMATE_BN = {"mobilenet_v2"}     # models whose untouched BatchNorm statistics leave a degenerate output


def reestimate_bn(model, batches: int = 4, batch: int = 16) -> None:
    """Replace the BatchNorm running statistics (mean 0, variance 1 at initialisation) by those of
    ``batches`` random-normal batches, as training would have measured them. With torchvision's
    initialization MobileNetV2's activations shrink layer by layer under the untouched statistics
    (its logits ~1e-9, below float16's smallest subnormal: the fp16 builds output 0); measured
    statistics renormalize every layer (logits O(1)), so the fp16 error column means something.
    ResNet-18's logits are O(1) as initialized (max ~6): its model is left as it was."""
    import torch
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None                   # a cumulative average over the batches
    gen = torch.Generator().manual_seed(1)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, 3, 224, 224, generator=gen))
    for m, momentum in zip(bns, momenta):
        m.momentum = momentum


def export_onnx(model, batch: int, path: Path) -> None:
    import torch
    x = torch.randn(batch, 3, 224, 224)
    kw = dict(input_names=["x"], output_names=["y"], opset_version=17)
    try:
        torch.onnx.export(model, (x,), str(path), dynamo=False, **kw)
    except TypeError:                      # a torch without the dynamo switch
        torch.onnx.export(model, (x,), str(path), **kw)


WARM_S = 1.0     # warm-up of at least this long before timing: the H100 idles at 345 MHz and
                 # takes a while to reach its 1980 MHz boost (one-shot timings of torch.compile's
                 # ResNet-18 at batch 64 ranged 1.27-2.79 ms over three runs on 2026-11-24)


def warm_up(call, sync, warmup: int) -> None:
    """``call()`` at least ``warmup`` times and for at least :data:`WARM_S` seconds, ``sync()``
    every 10 calls (so the queue stays short) and at the end."""
    t0, n = time.perf_counter(), 0
    while n < warmup or time.perf_counter() - t0 < WARM_S:
        call()
        n += 1
        if n % 10 == 0:
            sync()
    sync()


def time_torch(fn, x, warmup: int, iters: int, repeats: int = 5) -> float:
    """ms per call: the median of ``repeats`` CUDA-event timings of ``iters`` calls each, after
    :func:`warm_up`."""
    import torch
    with torch.inference_mode():
        warm_up(lambda: fn(x), torch.cuda.synchronize, warmup)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn(x)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / iters)
    return float(np.median(times))


def qcompile(onnx_path: Path, out: Path, dtype: str, calib: Path | None, graph: bool = False,
             layout: str = "nchw") -> float:
    """``qcompile`` in a child process (so builds run side by side), its int8 convs in activation
    ``layout``; returns its wall time."""
    argv = [str(onnx_path), "--target", "cuda", "--arch", "sm_90", "--dtype", dtype, "-o", str(out), "-q"]
    if calib is not None:
        argv += ["--calib", str(calib), "--calib-samples", "64", "--eval-samples", "0"]
    env = {**os.environ, "QC_CUDA_GRAPH": "1" if graph else "0", "QC_CUDA_INT8_LAYOUT": layout}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "qcompiler.cli", *argv], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"qcompile {' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return time.perf_counter() - t0


def fingerprint(model) -> float:
    """The sum of |w| over the torch model's parameters and buffers (BatchNorm statistics): equal
    on two hosts when both drew the same random weights."""
    return float(sum(t.detach().abs().double().sum() for t in [*model.parameters(), *model.buffers()]))


def time_artifact(out: Path, x: np.ndarray, warmup: int, iters: int, repeats: int = 5) -> tuple[float, np.ndarray]:
    """(ms per call: the median of ``repeats`` time_evaluator rounds of ``iters`` calls, after
    :func:`warm_up`; the output for ``x``)."""
    import tvm
    from qcompiler.runtime import load
    model = load(out)
    y = model(x)[0]
    arg = tvm.runtime.tensor(x, model.device)
    f = model._vm.time_evaluator("main", model.device, number=iters, repeat=repeats)
    warm_up(lambda: model._vm["main"](arg), model.device.sync, warmup)
    return float(np.median(f(arg).results)) * 1e3, y


def profile_artifact(out: Path, x: np.ndarray, top: int = 8, reps: int = 20) -> str:
    """Where the time goes: every call the VM makes (kernels and builtins), each re-run ``reps``
    times between device syncs from a VM instrument hook (so launch cost is included), summed
    per function; the ``top`` largest as 'name ms (share)', with the kernel-call count."""
    import collections
    import tvm
    from qcompiler.runtime import load
    model = load(out)
    arg = tvm.runtime.tensor(x, model.device)
    per, calls = collections.Counter(), collections.Counter()

    def instrument(func, symbol, before, ret, *args):
        if before:
            model.device.sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                func(*args)
            model.device.sync()
            per[str(symbol)] += (time.perf_counter() - t0) / reps * 1e3
            calls[str(symbol)] += 1
        return 0
    model._vm.set_instrument(instrument)
    model._vm["main"](arg)
    total = sum(per.values())
    kernels = sum(n for s, n in calls.items() if not s.startswith("vm."))
    head = ", ".join(f"{s} {t:.3f} ({t / total:.0%})" for s, t in per.most_common(top))
    kinds = collections.Counter()
    for s, t in per.items():
        kinds[s.split("_", 1)[-1].rstrip("0123456789_")] += t
    by_kind = ", ".join(f"{k} {t:.3f}" for k, t in kinds.most_common())
    return f"{kernels} kernel calls, sum {total:.3f} ms; by kind: {by_kind}; top: {head}"


def conv_macs(n: int, c: int, k: int, hw: int, r: int, stride: int) -> float:
    """Multiply-accumulates of an r x r conv (padding r // 2) of n x c x hw x hw to k channels."""
    oh = (hw + 2 * (r // 2) - r) // stride + 1
    return float(n * k * oh * oh * c * r * r)


def conv_onnx(path: Path, n: int, c: int, k: int, hw: int, r: int, stride: int) -> float:
    """One conv + ReLU as ONNX (random weights); returns its multiply-accumulates."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    pad = r // 2
    oh = (hw + 2 * pad - r) // stride + 1
    w = numpy_helper.from_array((rng.standard_normal((k, c, r, r)) * (2 / (c * r * r)) ** 0.5).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(k, np.float32), "b")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[r, r], pads=[pad] * 4, strides=[stride] * 2),
         helper.make_node("Relu", ["c"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, k, oh, oh])], [w, b])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return conv_macs(n, c, k, hw, r, stride)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="resnet18,mobilenet_v2")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--dtypes", default="fp16,int8", help="qcompiler builds to time (fp16, int8, fp32)")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--jobs", type=int, default=4, help="qcompile builds run side by side (default 4; an int8 ResNet-18 build took 97 s alone on a 2-vCPU Zen 1)")
    p.add_argument("--no-conv", action="store_true", help="skip the single-conv peak-fraction measurement")
    p.add_argument("--keep", default=None, help="folder to keep the ONNX files and artifacts in")
    p.add_argument("--profile", action="store_true", help="print where each qcompiler build spends its time")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also time each build made with Relax's CUDA-graph capture (relax.backend.use_cuda_graph)")
    p.add_argument("--int8-layouts", default=os.environ.get("QC_CUDA_INT8_LAYOUT") or "nchw",
                   help="comma-separated activation layouts of the int8 convs to build and time side by side "
                        "(nchw, blocked, blocked-copy; default: $QC_CUDA_INT8_LAYOUT or nchw)")
    p.add_argument("--build-only", metavar="DIR", default=None,
                   help="only export and build, into DIR (a GPU-less host; time them later with --prebuilt DIR)")
    p.add_argument("--prebuilt", metavar="DIR", default=None,
                   help="time the artifacts that --build-only DIR made instead of building (a GPU host without TVM's compiler)")
    args = p.parse_args(argv)
    layouts = [v for v in args.int8_layouts.split(",") if v]
    bad = [v for v in layouts if v not in LAYOUTS]
    if bad or not layouts:
        print(f"bench_cuda: --int8-layouts {args.int8_layouts!r}: each must be one of {', '.join(LAYOUTS)}",
              file=sys.stderr)
        return 2
    import torch
    if args.build_only is None and not torch.cuda.is_available():
        print("bench_cuda: no CUDA device (this benchmark runs on a GPU host)", file=sys.stderr)
        return 2
    if args.build_only is None:
        print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}")
    work = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="bench_cuda_"))
    work.mkdir(parents=True, exist_ok=True)
    dtypes = [d for d in args.dtypes.split(",") if d]
    # (dtype, CUDA graph, int8 layout); the layouts multiply the int8 builds only
    plain = [(d, lay) for d in dtypes for lay in (layouts if d == "int8" else ["nchw"])]
    variants = [(d, False, lay) for d, lay in plain] + ([(d, True, lay) for d, lay in plain] if args.cuda_graph else [])

    def label(dt, graph, layout="nchw"):
        return dt + (f"+{layout}" if layout != "nchw" else "") + ("+graph" if graph else "")

    # 1. models, inputs and every build (side by side)
    built = Path(args.build_only or args.prebuilt or work).resolve()
    cases, jobs, prints = [], {}, {}
    for name in args.models.split(","):
        tm = torch_model(name)
        prints[name] = fingerprint(tm)
        for batch in map(int, args.batches.split(",")):
            onnx_path = work / f"{name}_b{batch}.onnx"
            calib = work / f"calib_b{batch}.npz"
            if args.prebuilt is None:
                export_onnx(tm, batch, onnx_path)
                if not calib.exists():
                    np.savez(calib, x=np.random.default_rng(2).standard_normal((64, 3, 224, 224)).astype(np.float32))
            cases.append((name, batch, tm))
            for dt, graph, lay in variants:
                lab = label(dt, graph, lay)
                jobs[(name, batch, lab)] = (onnx_path, built / f"{name}_b{batch}_{lab}", dt,
                                            calib if dt == "int8" else None, graph, lay)
    convs = {}
    if not args.no_conv:
        # ResNet-18's conv1 (7x7/2, 3->64 at 224: the most MACs, 118 M per image; GEMM J = 64) and its
        # layer4 3x3 512->512 at 7x7 (116 M per image; I, J, K all > 64: tensor-core sized)
        for lab, (c, k, hw, r, st) in {"conv1 7x7/2 3->64 @224": (3, 64, 224, 7, 2),
                                       "layer4 3x3 512->512 @7": (512, 512, 7, 3, 1)}.items():
            path = work / f"conv_{c}_{k}_{hw}.onnx"
            macs = conv_macs(64, c, k, hw, r, st)
            calib = work / f"calib_conv_{c}_{hw}.npz"
            if args.prebuilt is None:
                conv_onnx(path, 64, c, k, hw, r, st)
                np.savez(calib, x=np.random.default_rng(3).standard_normal((64, c, hw, hw)).astype(np.float32))
            convs[lab] = (macs, (64, c, hw, hw))
            for dt in ("int8", "fp16"):
                jobs[("conv", lab, dt)] = (path, built / f"conv_{c}_{k}_{hw}_{dt}", dt,
                                           calib if dt == "int8" else None, False, layouts[0])
    if args.prebuilt is not None:
        record = json.loads((built / "builds.json").read_text())
        missing = ["/".join(map(str, key)) for key in jobs if "/".join(map(str, key)) not in record["seconds"]]
        if missing:
            print(f"bench_cuda: {built} has no build of {', '.join(missing)}; build them with --build-only "
                  f"and the same --models/--batches/--dtypes/--int8-layouts", file=sys.stderr)
            return 2
        build_s = {key: record["seconds"]["/".join(map(str, key))] for key in jobs}
        same = {name: abs(record["fingerprint"][name] - prints[name]) <= 1e-6 * prints[name] for name in prints}
        print(f"# builds from {built} ({record['host']}; int8 layouts {record.get('int8_layouts', ['nchw'])}); "
              f"weights as built: {same}", flush=True)
    else:
        built.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = {key: pool.submit(qcompile, *job) for key, job in jobs.items()}
            build_s = {key: f.result() for key, f in futures.items()}
        print(f"# {len(jobs)} builds, {args.jobs} side by side: {sum(build_s.values()):.0f} s of compile in all", flush=True)
        same = {name: True for name in prints}
    if args.build_only is not None:
        import platform
        (built / "builds.json").write_text(json.dumps({
            "host": f"{platform.node()} {platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d %H:%M')}",
            "int8_layouts": layouts, "fingerprint": prints, "seconds": {"/".join(map(str, k)): v for k, v in build_s.items()}}, indent=1))
        print(f"# built into {built}; time them on a GPU host: python bench/bench_cuda.py --prebuilt {built} "
              f"--models {args.models} --batches {args.batches} --dtypes {args.dtypes} --int8-layouts {','.join(layouts)}"
              + (" --no-conv" if args.no_conv else "") + (" --cuda-graph" if args.cuda_graph else ""))
        return 0

    # 2. timings, one engine at a time
    rows = []
    for name, batch, tm in cases:
        x = np.random.default_rng(1).standard_normal((batch, 3, 224, 224)).astype(np.float32)
        with torch.inference_mode():
            ref = tm.cuda()(torch.from_numpy(x).cuda()).float().cpu().numpy()
        m16 = tm.cuda().half()
        xt = torch.from_numpy(x).cuda().half()
        eager = time_torch(m16, xt, args.warmup, args.iters)
        tcomp = time_torch(torch.compile(m16), xt, args.warmup, args.iters)
        tm.float().cpu()
        torch._dynamo.reset()
        row = {"model": name, "batch": batch, "torch eager fp16": eager, "torch.compile fp16": tcomp}
        first_int8 = {}                 # graph -> the first int8 layout's output
        for dt, graph, lay in variants:
            lab = label(dt, graph, lay)
            out = jobs[(name, batch, lab)][1]
            ms, y = time_artifact(out, x, args.warmup, args.iters)
            row[f"qcompiler {lab}"] = ms
            row[f"compile {lab} s"] = build_s[(name, batch, lab)]
            if dt == "int8" and len(layouts) > 1:
                y0 = first_int8.setdefault(graph, y)
                if y0 is not y:
                    row[f"{lab} bit-identical to {label(dt, graph, layouts[0])}"] = bool(np.array_equal(y, y0))
            if args.profile and not graph:
                print(f"  profile {name} b{batch} {lab}: {profile_artifact(out, x)}", flush=True)
            if not same[name]:
                pass                    # built from other random weights: no agreement to report
            elif dt == "int8":
                row[f"{lab} top-1 agree"] = float(np.mean(y.argmax(1) == ref.argmax(1)))
            else:
                row[f"{lab} err"] = float(np.abs(y - ref).max() / np.abs(ref).max())
        rows.append(row)
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    labels = [label(*v) for v in variants]
    print("\n| model | batch | torch eager fp16 ms | torch.compile fp16 ms | "
          + " | ".join(f"qcompiler {v} ms | {v}/compile" for v in labels) + " |")
    print("|---|---|---|---|" + "---|---|" * len(labels))
    for r in rows:
        cells = [r["model"], str(r["batch"]), f"{r['torch eager fp16']:.3f}", f"{r['torch.compile fp16']:.3f}"]
        for v in labels:
            cells += [f"{r[f'qcompiler {v}']:.3f}", f"{r[f'qcompiler {v}'] / r['torch.compile fp16']:.2f}"]
        print("| " + " | ".join(cells) + " |")
    if convs:
        print("\n| conv (batch 64) | dtype | ms | TOPS | fraction of dense peak |")
        print("|---|---|---|---|---|")
        for lab, (macs, shape) in convs.items():
            xin = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
            for dt in ("int8", "fp16"):
                ms, _ = time_artifact(jobs[("conv", lab, dt)][1], xin, args.warmup, args.iters)
                ops = 2 * macs / (ms * 1e-3)
                print(f"| {lab} | {dt} | {ms:.3f} | {ops / 1e12:.1f} | {ops / PEAK[dt]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
