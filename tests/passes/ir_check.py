"""Helpers for pass tests: IR text in -> passes -> IR text out, and ORT equivalence of two graphs.

    assert_ir(run_ir(BEFORE, "fold-bn"), AFTER)       # golden text, compared after parse -> print
    assert_same_outputs(before_graph, after_graph)    # both exported to ONNX and run by onnxruntime
"""
from __future__ import annotations

import numpy as np

from qcompiler.ir import Graph, parse_graph, print_graph
from qcompiler.passes import PassContext, PassManager

RTOL = 1e-5          # max|diff| <= RTOL * max|ref|


def run_ir(text: str | Graph, passes: str | list[str], ctx: PassContext | None = None) -> Graph:
    """Parse (or take) a graph, verify it, run ``passes`` with verification after each."""
    g = parse_graph(text) if isinstance(text, str) else text
    g.verify()
    PassManager(passes, ctx=ctx).run(g)
    return g


def assert_ir(g: Graph, expected: str) -> None:
    """``g`` prints (without locations) as ``expected`` does after parsing, so hand-written text
    may use splat constants (``dense<0.5>``)."""
    want = print_graph(parse_graph(expected), locs=False)
    got = print_graph(g, locs=False)
    assert got == want, f"got:\n{got}\nexpected:\n{want}"


def unchanged(text: str, passes: str) -> None:
    """The passes leave ``text`` as it is (negative tests: a pattern must not fire)."""
    assert_ir(run_ir(text, passes), text)


def random_consts(g: Graph, seed: int = 0) -> Graph:
    """Give every float constant random values (BN variances positive), keeping shapes and dtypes."""
    rng = np.random.default_rng(seed)
    for v in g.consts.values():
        if v.data.dtype.kind == "f":
            a = rng.standard_normal(v.data.shape)
            if any(k in v.name for k in ("var", "gamma")):
                a = np.abs(a) + 0.1
            v.data = a.astype(v.data.dtype)
    return g


def random_feeds(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in g.inputs}


def ort_session(g: Graph):
    """An onnxruntime session (CPU, one thread, no graph optimizations) for ``g`` exported to ONNX
    (fused ops expanded on a copy first)."""
    import onnxruntime as ort
    from qcompiler.frontend.onnx_export import export_onnx
    from qcompiler.passes.expand_fused import expand_fused
    g = g.clone()
    expand_fused(g)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(export_onnx(g).SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_outputs(g: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort_session(g).run(None, feeds)


def assert_close(ref: list[np.ndarray], got: list[np.ndarray], rtol: float = RTOL) -> float:
    """max|diff| <= rtol * max|ref| for each output; returns the worst relative difference."""
    worst = 0.0
    assert len(ref) == len(got)
    for r, o in zip(ref, got):
        assert r.shape == o.shape, (r.shape, o.shape)
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        diff = float(np.max(np.abs(r.astype(np.float64) - o))) if r.size else 0.0
        assert diff <= rtol * max(scale, 1e-30), f"max|diff| {diff:.3g} > {rtol:g} * max|ref| {scale:.3g}"
        worst = max(worst, diff / max(scale, 1e-30))
    return worst


def assert_same_outputs(before: Graph, after: Graph, feeds: dict | None = None, rtol: float = RTOL) -> float:
    feeds = feeds if feeds is not None else random_feeds(before)
    return assert_close(ort_outputs(before, feeds), ort_outputs(after, feeds), rtol)


def check_pass_numerics(text: str | Graph, passes: str, seed: int = 0) -> Graph:
    """Randomize the constants of ``text``, run ``passes`` on a copy, compare ORT outputs."""
    g = random_consts(parse_graph(text) if isinstance(text, str) else text, seed)
    after = run_ir(g.clone(), passes)
    assert_same_outputs(g, after, random_feeds(g, seed + 1))
    return after
