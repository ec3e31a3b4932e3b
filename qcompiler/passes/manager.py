"""Pass registration, pipelines and the pass manager.

A pass is registered under a kebab-case name and runs as ``run(graph, ctx) -> bool`` (True when it
changed the graph)::

    from qcompiler.passes import register_pass

    @register_pass("drop-identity")
    def drop_identity(graph, ctx):
        \"\"\"Remove Identity ops.\"\"\"
        changed = False
        for op in graph.ops:
            if op.kind == "Identity":
                graph.replace_op(op, [op.operands[0]])
                changed = True
        return changed

A pipeline is a comma-separated string of names (``"fold-bn,fuse-act"``), ``default`` (the
documented default pipeline) or ``none``. The :class:`PassManager` owns the tooling: it verifies the
IR after every pass (on by default), times passes, prints the IR after a pass with a fixed banner,
and names the failing pass and the passes before it.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from ..errors import UserError
from ..ir.graph import Graph, IRError
from ..progress import report

PassFn = Callable[[Graph, "PassContext"], bool]


@dataclass
class PassInfo:
    name: str
    fn: PassFn
    doc: str
    options: type | None = None        # a dataclass of typed options, if the pass takes any


REGISTRY: dict[str, PassInfo] = {}

# The default pipeline of `qcompile`. Passes not registered (yet) are skipped silently only here:
# a user's explicit --passes must name registered passes. Every step preserves results (to float
# rounding); each pass's docstring gives its math and a before/after example.
#   const-fold  evaluate ops on constants (weight transposes, bias reshapes, shape arithmetic)
#   simplify    drop Identity/Dropout/no-op reshapes and transposes, x*1, x+0; merge reshape and
#               transpose chains; recognize the decomposed HardSwish
#   dce         remove what the two above left unused
#   cse         merge equal constants and equal ops
#   fold-pad    fold constant spatial Pad ops (TF exporters' SAME padding) into the padding of the
#               Conv/FusedConv, MaxPool or AveragePool consuming them (before fold-bn and fuse-act,
#               so the convs they fold and fuse already carry the padding)
#   crop-dead-taps  drop the kernel rows/columns of a conv that read only padding for every output
#               (dilated convs on small maps: DeepLabV3's ASPP at dilation 36 on 32x32 is a 1x1 conv)
#   fold-bn     fold BatchNormalization and per-channel Mul/Add constants into Conv/Gemm weights
#               (recording the BN statistics in graph.meta["bn_stats"]), lower the rest to Mul+Add
#   fuse-act    MatMul+bias -> Gemm; fuse residual adds and activations into FusedConv/FusedGemm
#   split-conv-bands  a conv whose taps read padding on many outputs computed region by region with
#               its live taps only (Slice -> Conv -> Concat), where that saves more than it copies
#   dce         final clean-up
DEFAULT_PIPELINE: list[str] = ["const-fold", "simplify", "dce", "cse", "fold-pad", "crop-dead-taps", "fold-bn",
                               "fuse-act", "split-conv-bands", "dce"]


def register_pass(name: str, options: type | None = None) -> Callable[[PassFn], PassFn]:
    """Decorator registering ``fn(graph, ctx) -> bool`` as a pass named ``name`` (kebab-case)."""
    if not name or name != name.lower() or " " in name or "_" in name:
        raise ValueError(f"pass names are kebab-case, got '{name}'")

    def deco(fn: PassFn) -> PassFn:
        REGISTRY[name] = PassInfo(name, fn, (fn.__doc__ or "").strip(), options)
        return fn
    return deco


@dataclass
class PassContext:
    """What a pass may read besides the graph: options by pass name, and a shared scratch space
    (e.g. BatchNorm statistics recorded by fold-bn for bias absorption later)."""
    options: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    log: Callable[[str], None] = lambda msg: None

    def option(self, pass_name: str, default: Any = None) -> Any:
        return self.options.get(pass_name, default)


class PassFailed(Exception):
    """A pass raised or left invalid IR; the message names the pass and the passes before it."""


def _load_builtin_passes() -> None:
    from . import _builtin  # noqa: F401  (registers the built-in passes)


def available_passes() -> dict[str, PassInfo]:
    _load_builtin_passes()
    return dict(sorted(REGISTRY.items()))


def parse_pipeline(spec: str | None) -> list[str]:
    """``"a,b"`` -> ["a", "b"]; ``"default"`` or None -> the default pipeline; ``"none"`` -> []."""
    _load_builtin_passes()
    if spec is None or spec.strip() == "default":
        return [p for p in DEFAULT_PIPELINE if p in REGISTRY]
    if spec.strip() in ("none", ""):
        return []
    names = []
    for part in spec.split(","):
        part = part.strip()
        if part == "default":
            names += [p for p in DEFAULT_PIPELINE if p in REGISTRY]
            continue
        if part not in REGISTRY:
            known = ", ".join(sorted(REGISTRY))
            raise UserError(f"unknown pass '{part}'", "--passes", f"known passes: {known}")
        names.append(part)
    return names


@dataclass
class PassTiming:
    name: str
    seconds: float
    changed: bool
    ops_before: int
    ops_after: int


class PassManager:
    """Runs a pipeline over a graph with verification and instrumentation."""

    BANNER = "// -----// IR Dump After {name} //----- //"

    def __init__(self, pipeline: list[str] | str | None = None, *, verify: bool = True,
                 print_ir_after: set[str] | str | None = None, time_passes: bool = False,
                 ctx: PassContext | None = None, out: TextIO | None = None):
        self.pipeline = parse_pipeline(pipeline) if not isinstance(pipeline, list) else pipeline
        self.verify = verify
        if isinstance(print_ir_after, str):
            print_ir_after = {p.strip() for p in print_ir_after.split(",")}
        self.print_ir_after = print_ir_after or set()
        self.time_passes = time_passes
        self.ctx = ctx or PassContext()
        self.out = out or sys.stderr
        self.timings: list[PassTiming] = []

    def run(self, graph: Graph) -> Graph:
        _load_builtin_passes()
        done: list[str] = []
        for i, name in enumerate(self.pipeline):
            info = REGISTRY[name]
            report(f"pass {name}", i, len(self.pipeline))
            n0 = len(graph)
            t0 = time.perf_counter()
            try:
                changed = bool(info.fn(graph, self.ctx))
                if self.verify:
                    graph.verify()
            except UserError:
                raise
            except (IRError, Exception) as e:   # noqa: B014 - name the pass for any failure
                before = ", ".join(done) or "none"
                raise PassFailed(f"pass '{name}' failed (passes before it: {before}): "
                                 f"{type(e).__name__}: {e}") from e
            dt = time.perf_counter() - t0
            self.timings.append(PassTiming(name, dt, changed, n0, len(graph)))
            done.append(name)
            if name in self.print_ir_after or "all" in self.print_ir_after:
                from ..ir.printer import print_graph
                self.out.write(self.BANNER.format(name=name) + "\n")
                self.out.write(print_graph(graph, elide=True))
        if self.time_passes:
            self.out.write(self.timing_report())
        return graph

    def timing_report(self) -> str:
        total = sum(t.seconds for t in self.timings) or 1e-12
        lines = ["===-------------------------------------------------------------------------===",
                 "                         ... Pass execution timing report ...",
                 "===-------------------------------------------------------------------------===",
                 f"  Total Execution Time: {total:.4f} seconds", "",
                 "   Wall Time      %    ops before -> after   Name"]
        for t in self.timings:
            lines.append(f"  {t.seconds:9.4f}  {100 * t.seconds / total:5.1f}%   {t.ops_before:6d} -> {t.ops_after:<6d}    {t.name}")
        return "\n".join(lines) + "\n"


def run_passes(graph: Graph, pipeline: list[str] | str | None = "default", **kw) -> Graph:
    """Run a pipeline over ``graph`` in place and return it."""
    return PassManager(pipeline, **kw).run(graph)


def load_plugin(path: str) -> None:
    """Import a user's Python file so its ``@register_pass`` decorators run (``--plugin FILE.py``)."""
    import importlib.util
    import os
    if not os.path.isfile(path):
        raise UserError(f"plugin file not found: {path}", "--plugin", "give the path of a .py file")
    spec = importlib.util.spec_from_file_location(f"qcompiler_plugin_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # a user's file: report it in one line
        raise UserError(f"plugin {path} failed to load: {type(e).__name__}: {e}", "--plugin",
                        "fix the plugin file") from e
