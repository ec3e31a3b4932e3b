"""MetaSchedule tuning of the float kernels on the host (``qcompile --tune TRIALS [--tune-db DIR]``).

The hand schedules of :mod:`.x86.schedules` are one fixed recipe per kernel family. ``--tune``
searches, per float kernel, TVM's MetaSchedule space (Shao et al., "Tensor Program Optimization with
Probabilistic Programs", NeurIPS 2022: multi-level tiling, parallel/vectorize/unroll, inlining and
compute-location decisions as random variables of a schedule trace) on *this* machine, keeps the
measured traces in a JSON database, and puts in the artifact whichever schedule is faster.

Candidates: kernels whose buffers are all float (fp32/fp16 conv, depthwise, pool, dense, matmul,
row-wise reductions, elementwise/packing). The int8 dot-product kernels (``conv2d_dot``, ``conv2d_winograd``,
``dense_dot``: VNNI / AVX2 ``pmaddwd`` tensor intrinsics that MetaSchedule's rules would not find)
and the sparse kernels keep their hand schedules, as do integer kernels in general.

Trials. ``TRIALS`` measured schedules in all are shared among the candidates in proportion to
their estimated single-thread time ``w_i`` (:func:`.x86.threads.serial_ns`: MACs and element
counts) by largest remainder: ``s_i = floor(T w_i / W)`` plus one for the ``T - sum s_i`` largest
remainders ``T w_i / W - s_i``; so ``sum s_i = T`` exactly and a kernel whose share is 0 is not
tuned. Search: one MetaSchedule task per kernel with ``s_i`` trials over the post-order-apply
space of the LLVM target, sampled by ``replay-trace`` (``QC_TUNE_STRATEGY=evolutionary`` for the
evolutionary search; either with a random cost model, as xgboost is not a dependency), each
candidate compiled and timed in this process (:func:`_in_process`).

Keep-faster rule. For every kernel with records, the best traced schedule (database
``query_schedule``) and the hand schedule are compiled together and timed alone on random
operands (TVM ``time_evaluator``, median of 5 repeats of >= 10 ms); the tuned one replaces the hand
one only if its median is lower, so ``sum_i min(hand_i, tuned_i) <= sum_i hand_i``: tuning never
makes the kernels slower than without ``--tune`` (as measured on this host, alone).

Reuse. The database (``DIR/database_workload.json``, ``database_tuning_record.json``; default
``cache_dir()/tune/<target>``) is keyed by MetaSchedule's workload hash (structural hash of the
unscheduled PrimFunc: shapes and computation, not weights), and ``DIR/qcompiler_tune.json`` counts the
trials run per workload and keeps the last timing decision with the hand schedule's hash. A later
compile with the same DIR runs no trials for a kernel already tuned with at least its share, and
reuses the decision (no timing) while the hand schedule is unchanged: "reused N records".
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UserError
from .target import Family, TargetSpec

INDEX = "qcompiler_tune.json"
HAND_ONLY = ("sparse", "conv2d_dot", "conv2d_winograd", "dense_dot", "dense_amx")     # tensor intrinsics / sparse formats: hand schedules
FLOATS = ("float32", "float16")
# a tuned schedule only reorders float sums: max|tuned - hand| / max|hand| allowed, by output dtype
# (fp32: ~300-term sums differ by a few ulp; fp16 storage: one rounding step, 2^-10)
MAX_REL_DIFF = {"float32": 1e-5, "float16": 1e-3}
STRATEGY = os.environ.get("QC_TUNE_STRATEGY", "replay-trace")    # or "evolutionary" (see module doc)


@dataclass(frozen=True)
class TuneOptions:
    trials: int
    db_dir: Path
    seed: int = 0
    prefer_tuned: bool = False     # tests: take every tuned schedule that passes the numerics check


@dataclass
class KernelTune:
    """What tuning did for one kernel (times in ms, measured alone on this host)."""
    name: str
    kind: str
    share: int
    trials_run: int = 0            # new trials this compile
    reused: bool = False           # records (and the decision) found in the database
    hand_ms: float | None = None
    tuned_ms: float | None = None
    rel_diff: float | None = None  # max|tuned - hand| / max|hand| on the timing operands
    choice: str = "hand"           # "hand" | "tuned"

    @property
    def ms(self) -> float | None:
        return self.tuned_ms if self.choice == "tuned" else self.hand_ms


@dataclass
class TuneSummary:
    db_dir: Path
    kernels: list[KernelTune] = field(default_factory=list)

    @property
    def trials_run(self) -> int:
        return sum(k.trials_run for k in self.kernels)

    @property
    def reused(self) -> int:
        return sum(k.reused for k in self.kernels)

    @property
    def tuned(self) -> list[KernelTune]:
        return [k for k in self.kernels if k.choice == "tuned"]

    def totals(self) -> tuple[float, float]:
        """(summed ms of the timed kernels with hand schedules, the same with the chosen ones)."""
        timed = [k for k in self.kernels if k.hand_ms is not None]
        return sum(k.hand_ms for k in timed), sum(k.ms for k in timed)

    def lines(self) -> list[str]:
        before, after = self.totals()
        out = [f"tune: {self.trials_run} new trials, reused {self.reused} records ({self.db_dir})"]
        for k in self.kernels:
            if k.hand_ms is None:
                continue
            out.append(f"tune:   {k.name:<24} {k.kind:<10} share {k.share:>3}  hand {k.hand_ms:8.4f} ms  "
                       f"tuned {k.tuned_ms:8.4f} ms  -> {k.choice}" + ("  (reused)" if k.reused else ""))
        out.append(f"tune: {len(self.tuned)} of {len(self.kernels)} kernels took the tuned schedule; "
                   f"summed kernel time {before:.4f} -> {after:.4f} ms")
        return out

    def to_json(self) -> dict:
        before, after = self.totals()
        return {"db": str(self.db_dir), "trials_run": self.trials_run, "reused_records": self.reused,
                "tuned_kernels": [k.name for k in self.tuned], "before_ms": before, "after_ms": after,
                "kernels": [vars(k) for k in self.kernels]}


# ---- options -------------------------------------------------------------------------------------
def target_key(spec: TargetSpec) -> str:
    """A folder name for the target: its TVM target dict, made file-name safe."""
    t = spec.tvm
    parts = [t.get("kind", "llvm"), t.get("mtriple", ""), t.get("mcpu", ""), *t.get("mattr", [])]
    return "-".join(p.replace("+", "").replace("/", "_") for p in parts if p) or "llvm"


def tune_target(spec: TargetSpec):
    """The host target with the physical core count MetaSchedule's rules need ("num-cores")."""
    import tvm
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return tvm.target.Target({**spec.tvm, "num-cores": cores})


def default_db_dir(spec: TargetSpec) -> Path:
    from .cache import cache_dir
    return cache_dir() / "tune" / target_key(spec)


def check_options(trials: int, db_dir: str | None, spec: TargetSpec) -> TuneOptions:
    """Validate ``--tune``/``--tune-db`` before any work; UserError on bad input."""
    if trials <= 0:
        raise UserError(f"--tune needs a positive number of trials, got {trials}", "--tune",
                        "give the total number of measured schedules, e.g. --tune 64")
    if spec.family is not Family.X86:
        raise UserError(f"tuning measures kernels on the host, so it runs for --target x86 only, not "
                        f"{spec.family}", "--tune", "drop --tune, or compile with --target x86")
    path = Path(db_dir) if db_dir else default_db_dir(spec)
    if path.exists() and not path.is_dir():
        raise UserError("the tuning database path is not a folder", str(path), "give a folder for --tune-db")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as e:
        raise UserError(f"cannot write the tuning database ({e.strerror or e})", str(path),
                        "give a writable folder with --tune-db") from None
    return TuneOptions(trials=trials, db_dir=path)


# ---- trial shares ------------------------------------------------------------------------------------
def allocate(trials: int, weights: list[float]) -> list[int]:
    """Largest-remainder split of ``trials`` in proportion to ``weights`` (sums to ``trials``)."""
    if not weights:
        return []
    total = float(sum(weights))
    exact = [trials * w / total if total > 0 else trials / len(weights) for w in weights]
    shares = [int(np.floor(x)) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[:trials - sum(shares)]:
        shares[i] += 1
    return shares


def candidates(sources: dict) -> dict:
    """The kernels MetaSchedule may schedule: {name: (unscheduled PrimFunc, kind)}."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    return {name: (func, kind) for name, (func, kind) in sources.items()
            if kind not in HAND_ONLY and all(str(a.dtype) in FLOATS for a in ArgInfo.from_prim_func(func))}


def _out_dtype(func) -> str:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    return str(ArgInfo.from_prim_func(func)[-1].dtype)


def _weight(func) -> float:
    from tvm import s_tir
    from .x86 import threads
    try:
        return max(threads.serial_ns(s_tir.Schedule(func)), 1.0)
    except Exception:  # noqa: BLE001 - no estimate: the smallest weight
        return 1.0


# ---- the database ------------------------------------------------------------------------------------
class _Store:
    """The JSONDatabase of DIR plus qcompiler's index of trials and decisions per workload."""

    def __init__(self, opts: TuneOptions, target):
        from tvm.s_tir import meta_schedule as ms
        self.dir, self.target = opts.db_dir, target
        self.db = ms.database.JSONDatabase(work_dir=str(opts.db_dir), module_equality="structural")
        p = opts.db_dir / INDEX
        try:
            self.index = json.loads(p.read_text()) if p.is_file() else {}
        except (OSError, ValueError):
            self.index = {}

    @staticmethod
    def key(func) -> str:
        import tvm_ffi
        return f"{tvm_ffi.structural_hash(func) & 0xFFFFFFFFFFFFFFFF:016x}"

    def entry(self, func) -> dict:
        return self.index.setdefault(self.key(func), {"trials": 0})

    def best(self, func):
        """The best recorded schedule of ``func`` (a PrimFunc), or None."""
        sch = self.db.query_schedule(_normalize(func), self.target, workload_name="main")
        return None if sch is None else sch.mod["main"]

    def save(self) -> None:
        p = self.dir / INDEX
        tmp = p.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.index, indent=1, sort_keys=True))
        os.replace(tmp, p)


def _cpu_count_without_psutil() -> None:
    """MetaSchedule asks ``s_tir.meta_schedule.cpu_count`` (C++ -> Python) for thread counts and
    implements it with psutil, which is not a dependency of qcompiler: answer with os.cpu_count()."""
    try:
        import psutil  # noqa: F401
    except ImportError:
        import tvm_ffi
        import tvm.s_tir.meta_schedule.utils  # noqa: F401  (registers psutil's version first)
        tvm_ffi.register_global_func("s_tir.meta_schedule.cpu_count",
                                     lambda logical=True: os.cpu_count() or 1, override=True)


def _in_process(number: int = 3, min_repeat_ms: int = 20):
    """(builder, runner) that compile and time candidates in this process.

    MetaSchedule's LocalBuilder/LocalRunner start worker processes (a new one per build batch), each
    importing TVM: ~20-50 s per task on the shared 2-core host, more than the trials themselves. The
    candidates are verified TIR built by LLVM, so a crash is not expected; a build or run error is
    reported as the trial's error, as the local ones do. Modules stay in memory (no export/tar)."""
    import tvm
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.runner import LocalRunnerFuture, PyRunner
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common
    from tvm.s_tir.meta_schedule.runner.config import EvaluatorConfig
    from tvm.ir.utils import derived_object

    built: dict[str, object] = {}

    @derived_object
    class InProcessBuilder(PyBuilder):
        def build(self, build_inputs):
            results = []
            for bi in build_inputs:
                try:
                    with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_assert": True}):
                        rt = tvm.compile(bi.mod, target=bi.target, tir_pipeline=_cpu_pipeline(bi.target))
                    key = f"qcompiler-inprocess-{len(built)}"
                    built[key] = rt.mod if hasattr(rt, "mod") else rt
                    results.append(BuilderResult(key, None))
                except Exception as e:  # noqa: BLE001 - the trial's error, as LocalBuilder reports it
                    results.append(BuilderResult(None, f"in-process build: {type(e).__name__}: {e}"))
            return results

    @derived_object
    class InProcessRunner(PyRunner):
        def run(self, runner_inputs):
            cfg = EvaluatorConfig(number=number, repeat=1, min_repeat_ms=min_repeat_ms)
            futures = []
            for ri in runner_inputs:
                try:
                    rt = built.pop(str(ri.artifact_path))
                    dev = tvm.cpu()
                    rng = np.random.default_rng(len(built))
                    args = [tvm.runtime.tensor(rng.uniform(-1, 1, tuple(int(d) for d in a.shape))
                                               .astype(str(a.dtype)), dev) for a in ri.args_info]
                    futures.append(LocalRunnerFuture(res=run_evaluator_common(rt, dev, cfg, [args])))
                except Exception as e:  # noqa: BLE001
                    futures.append(LocalRunnerFuture(error_message=f"in-process run: {type(e).__name__}: {e}"))
            return futures

    return InProcessBuilder(), InProcessRunner()


def _task_logger(folder: Path, name: str) -> logging.Logger:
    """A file-only logger for one task (MetaSchedule's own loggers also print to stdout)."""
    lg = logging.getLogger(f"qcompiler.tune.{folder.name}.{name}")
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    if not lg.handlers:
        folder.mkdir(parents=True, exist_ok=True)
        h = logging.FileHandler(folder / f"{name}.log")
        h.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
        lg.addHandler(h)
    return lg


def _search(store: _Store, work: list[tuple[str, object, int]], opts: TuneOptions, log) -> None:
    """Run MetaSchedule on each (name, func, trials), building and timing in this process
    (:func:`_in_process`)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.tune import tune_tasks

    from .tensor_intrin import import_tensor_intrin
    import_tensor_intrin()                  # TuneContext imports it: 46 s -> 8 s (tensor_intrin.py)
    _cpu_count_without_psutil()
    builder, runner = _in_process()
    logs = store.dir / "logs"
    for i, (name, func, trials) in enumerate(work):
        t0 = time.perf_counter()
        task = ms.TuneContext(mod=_normalize(func), target=store.target, space_generator="post-order-apply",
                              search_strategy=STRATEGY, task_name=name, rand_state=opts.seed + i,
                              num_threads=1, logger=_task_logger(logs, name)).clone()
        tune_tasks(tasks=[task], task_weights=[1.0], work_dir=str(logs), max_trials_global=trials,
                   max_trials_per_task=trials, num_trials_per_iter=min(trials, 64), builder=builder,
                   runner=runner, database=store.db, cost_model="random", measure_callbacks=[
                       ms.measure_callback.AddToDatabase(), ms.measure_callback.UpdateCostModel()],
                   task_scheduler="round-robin")
        store.entry(func)["trials"] += trials
        store.save()
        log(f"tune:   {name}: {trials} trials in {time.perf_counter() - t0:.1f} s")


def _normalize(func):
    from tvm import IRModule
    return IRModule({"main": func})


# ---- timing ------------------------------------------------------------------------------------------
def _cpu_pipeline(target) -> str:
    """The TIR pipeline artifacts are built with (:func:`.lower.tvm_compile`): candidates and hand
    kernels are timed as they would run (stack register tiles, claimed parallel chunks)."""
    import tvm
    from .x86 import pipeline
    kind = tvm.target.Target(target).kind.name
    return pipeline.tir_pipeline() if kind == "llvm" else "default"


def time_pairs(pairs: dict, target, repeats: int = 5, min_repeat_ms: int = 10) -> dict[str, tuple]:
    """{name: (hand PrimFunc, tuned PrimFunc)} -> {name: (hand ms, tuned ms, relative difference)}.

    All functions are compiled in one module; each pair runs on the same random operands, alone
    (TVM time_evaluator, median of ``repeats`` rounds of >= ``min_repeat_ms``); the relative
    difference is max|tuned - hand| / max|hand| over the output (the last argument)."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    funcs = {f"{n}__{w}": f.with_attr("global_symbol", f"{n}__{w}")
             for n, pair in pairs.items() for w, f in zip(("hand", "tuned"), pair)}
    with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_assert": True}):
        lib = tvm.compile(tvm.IRModule(funcs), target=target, tir_pipeline=_cpu_pipeline(target))
    lib = lib.mod if hasattr(lib, "mod") else lib
    dev, rng, out = tvm.cpu(), np.random.default_rng(0), {}
    for name, (hand, _) in pairs.items():
        args = [tvm.runtime.tensor(rng.uniform(-1, 1, tuple(int(d) for d in a.shape)).astype(str(a.dtype)), dev)
                for a in ArgInfo.from_prim_func(hand)]
        res = []
        for w in ("hand", "tuned"):
            lib[f"{name}__{w}"](*args)
            y = args[-1].numpy().astype(np.float64)
            ev = lib.time_evaluator(f"{name}__{w}", dev, number=1, repeat=repeats, min_repeat_ms=min_repeat_ms)
            res.append((float(np.median(ev(*args).results)) * 1e3, y))
        (h_ms, h), (t_ms, t) = res
        out[name] = (h_ms, t_ms, float(np.abs(t - h).max() / max(np.abs(h).max(), 1e-30)))
    return out


# ---- the whole module -----------------------------------------------------------------------------------
def tune_module(mod, sources: dict, spec: TargetSpec, opts: TuneOptions, log=lambda m: None):
    """Tune the candidate kernels of ``mod`` (built by ``lower(graph, spec, sources)``) and return
    (the module with the faster schedule per kernel, a TuneSummary)."""
    import tvm
    target = tune_target(spec)
    store = _Store(opts, target)
    cands = candidates(sources)
    names = list(cands)
    shares = allocate(opts.trials, [_weight(cands[n][0]) for n in names])
    summary = TuneSummary(opts.db_dir)
    work = []
    for name, share in zip(names, shares):
        func, kind = cands[name]
        k = KernelTune(name, kind, share)
        summary.kernels.append(k)
        done = store.entry(func)["trials"]
        if share and done < share:
            work.append((name, func, share - done))
            k.trials_run = share - done
    if work:
        log(f"tune: {sum(t for _, _, t in work)} trials over {len(work)} kernels (MetaSchedule, {opts.db_dir})")
        _search(store, work, opts, log)
    hand = {gv.name_hint: mod[gv] for gv in mod.functions if gv.name_hint in cands}
    gvs = {gv.name_hint: gv for gv in mod.functions}
    to_time, best_of = {}, {}
    for k in summary.kernels:
        func = cands[k.name][0]
        e = store.entry(func)
        best = store.best(func) if e["trials"] else None
        if best is None:                  # not tuned (share 0), or every trial failed to build or run
            continue
        best_of[k.name] = best = best.with_attr("tirx.is_scheduled", True).without_attr("global_symbol")
        hand_key, best_key = store.key(hand[k.name]), store.key(best)
        k.reused = not k.trials_run
        d = e.get("decision")
        if k.reused and d and d.get("hand") == hand_key and d.get("tuned") == best_key and not opts.prefer_tuned:
            k.hand_ms, k.tuned_ms, k.rel_diff, k.choice = d["hand_ms"], d["tuned_ms"], d["rel_diff"], d["choice"]
        else:
            to_time[k.name] = (hand[k.name], best, hand_key, best_key)
    if to_time:
        timed = time_pairs({n: (h, b) for n, (h, b, _, _) in to_time.items()}, target)
        for k in summary.kernels:
            if k.name in to_time:
                _, _, hk, bk = to_time[k.name]
                k.hand_ms, k.tuned_ms, k.rel_diff = timed[k.name]
                ok = k.rel_diff <= MAX_REL_DIFF[_out_dtype(cands[k.name][0])]
                k.choice = "tuned" if ok and (opts.prefer_tuned or k.tuned_ms < k.hand_ms) else "hand"
                store.entry(cands[k.name][0])["decision"] = {
                    "hand": hk, "tuned": bk, "hand_ms": k.hand_ms, "tuned_ms": k.tuned_ms,
                    "rel_diff": k.rel_diff, "choice": "tuned" if ok and k.tuned_ms < k.hand_ms else "hand"}
        store.save()
    for k in summary.kernels:
        if k.choice == "tuned":
            mod[gvs[k.name]] = best_of[k.name]
    return mod, summary


def build_fn(opts: TuneOptions, log=lambda m: None, summaries: list | None = None):
    """A ``write_artifact(build=...)`` function: lower, tune, tvm.compile. Each build's
    TuneSummary is appended to ``summaries`` and its lines go to ``log``."""
    def build(graph, spec: TargetSpec):
        from ..progress import report
        from .lower import lower, tvm_compile
        sources: dict = {}
        mod = lower(graph, spec, sources)
        report("tune")
        mod, summary = tune_module(mod, sources, spec, opts, log)
        for line in summary.lines():
            log(line)
        if summaries is not None:
            summaries.append(summary)
        report("tvm.compile")
        return tvm_compile(mod, spec)
    return build
