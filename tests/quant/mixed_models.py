"""Small float models with weight outliers, for the sensitivity and selection tests.

``outlier_mlp(severity)``: x (1x16) -> six Gemm layers (Relu after g1..g5) with two residual Adds;
eight layers the quantize plan makes integer (g1..g6, add1, add2). In layer ``name`` one weight is
``severity[name]`` times the largest other one, on input channel 3, which is 0 in every layer
(dead: Relu(-1)), so the float model does not see it; with per-tensor int8 weights the rest of the
layer rounds to few levels, so that layer alone loses many dB and keeping it float buys them back.
"""
import numpy as np

from qcompiler.ir import parse_graph

N = 16


def _dense(a: np.ndarray) -> str:
    return "dense<[" + ", ".join(f"{float(v):.6g}" for v in a.ravel()) + "]>"


def outlier_mlp(severity: dict[str, float], seed: int = 0):
    rng = np.random.default_rng(seed)
    lines, consts = [], []

    def gemm(name, x, out, relu=True, n_out=N):
        w = rng.normal(0, 1 / np.sqrt(N), (N, n_out)).astype(np.float32)
        b = rng.normal(0, 0.1, n_out).astype(np.float32)
        w[:, 3], b[3] = 0.0, -1.0                 # channel 3 is dead (Relu(-1) = 0) in every layer ...
        if name in severity:                        # ... so an outlier weight on it changes no float output
            w[3, 2] = severity[name] * np.abs(w).max()
        consts.append(f"  %{name}_w = const {_dense(w)} : tensor<{N}x{n_out}xf32>")
        consts.append(f"  %{name}_b = const {_dense(b)} : tensor<{n_out}xf32>")
        y = f"{out}_pre" if relu else out
        lines.append(f"  %{y} = Gemm(%{x}, %{name}_w, %{name}_b) {{alpha = 1.0, beta = 1.0, transA = 0, transB = 0}} "
                     f": tensor<1x{n_out}xf32> loc(\"{name}\")")
        if relu:
            lines.append(f"  %{out} = Relu(%{y}) : tensor<1x{n_out}xf32> loc(\"{name}_relu\")")

    gemm("g1", "x", "h1")
    gemm("g2", "h1", "h2")
    lines.append(f"  %a1 = Add(%h2, %h1) : tensor<1x{N}xf32> loc(\"add1\")")
    gemm("g3", "a1", "h3")
    gemm("g4", "h3", "h4")
    lines.append(f"  %a2 = Add(%h4, %a1) : tensor<1x{N}xf32> loc(\"add2\")")
    gemm("g5", "a2", "h5")
    gemm("g6", "h5", "y", relu=False, n_out=10)
    text = "graph @mlp(%x: tensor<1x16xf32>) {\n" + "\n".join(consts + lines) + "\n  return %y\n}"
    g = parse_graph(text)
    g.verify()
    return g


def feeds(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, N)).astype(np.float32)


def residual_convnet(seed: int = 0):
    """x (1x4x6x6) -> c0 FusedConv{Relu} -> c1 FusedConv(., W, B, Z = c0's output) (a residual
    block without activation, as rapidocr-cls's Conv@11) -> c2 FusedConv(., W, B, Z = c1's
    output){HardSwish} -> c3 FusedConv{Sigmoid} -> c4 Conv -> y (1x4x6x6): every form the quantize
    pass splits (c1: c1 + c1_add; c2: c2 + c2_add + c2_hardswish; c3: c3 + c3_sigmoid) between
    plain layers."""
    rng = np.random.default_rng(seed)
    C, S = 4, 6
    t = f"tensor<1x{C}x{S}x{S}xf32>"
    consts, lines = [], []
    attrs = "dilations = [1, 1], group = 1, pads = [1, 1, 1, 1], strides = [1, 1]"

    def conv(name, x, out, act=None, z=None):
        w = rng.normal(0, 1 / np.sqrt(9 * C), (C, C, 3, 3)).astype(np.float32)
        b = rng.normal(0, 0.2, C).astype(np.float32)
        consts.append(f"  %{name}_w = const {_dense(w)} : tensor<{C}x{C}x3x3xf32>")
        consts.append(f"  %{name}_b = const {_dense(b)} : tensor<{C}xf32>")
        ins = f"%{x}, %{name}_w, %{name}_b" + (f", %{z}" if z else "")
        if act is None:
            lines.append(f"  %{out} = Conv({ins}) {{{attrs}}} : {t} loc(\"{name}\")")
        else:
            lines.append(f"  %{out} = FusedConv({ins}) {{activation = \"{act}\", activation_params = [], {attrs}}} "
                         f": {t} loc(\"{name}\")")

    conv("c0", "x", "h0", "Relu")
    conv("c1", "h0", "h1", "", z="h0")
    conv("c2", "h1", "h2", "HardSwish", z="h1")
    conv("c3", "h2", "h3", "Sigmoid")
    conv("c4", "h3", "y")
    g = parse_graph(f"graph @resnet(%x: {t}) {{\n" + "\n".join(consts + lines) + "\n  return %y\n}")
    g.verify()
    return g


def conv_feeds(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, 4, 6, 6)).astype(np.float32)
