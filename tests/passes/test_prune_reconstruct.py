"""prune-reconstruct (SparseGPT/OBC): the solver against numpy least squares, its loss against the
quadratic form it minimizes, masks (exact counts as ``prune`` gives, 2:4 in the format's grouping,
1x4 blocks), im2col rows against a direct convolution, the bias column, obc against magnitude on a
small model, the pass on IR text, and the CLI's warning and errors."""
from __future__ import annotations

import os

import numpy as np
import pytest
from ir_check import assert_ir, run_ir

from qcompiler.cli import main
from qcompiler.ir import Graph, TensorType, parse_graph
from qcompiler.ir.ops import full_attrs
from qcompiler.ir.printer import fmt_dense
from qcompiler.passes import PassContext, PassManager
from qcompiler.passes.prune import PruneOptions, layers, nm_mask
from qcompiler.passes.prune_reconstruct import PruneReconstructOptions
from qcompiler.quant.reference import run_values
from qcompiler.sparse.format import conv_matrices, is_24
from qcompiler.quant.gram import Gram, conv_rows, damping
from qcompiler.sparse.reconstruct import Pattern, reconstruct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION = os.path.join(ROOT, "models", "fashion_mobilenet.onnx")
DATA = os.path.join(ROOT, "models", "fashion_test.npz")


def correlated_inputs(r, k, seed=0):
    """Rows [r, K] with correlated columns and a nonzero mean (as post-ReLU activations are)."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((k, k)) / np.sqrt(k) + np.eye(k)
    return np.maximum(rng.standard_normal((r, k)) @ mix + 0.3, 0.0)


def damped_gram(x, damp=0.01):
    h = x.T @ x
    return h + damp * np.trace(h) / len(h) * np.eye(len(h))


def quad(d, hd):
    """(w − ŵ)(H + λI)(w − ŵ)ᵀ per row of ``d = w − ŵ`` [N, K]."""
    return np.einsum("nk,kl,nl->n", d, hd, d)


# ---- the solver ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [128, 8])      # 8: the lazy batch updates across blocks are exercised
def test_prefix_mask_is_the_least_squares_optimum(block):
    """Where every pruned column of a row precedes its kept ones, the sequential OBS updates reach
    the global optimum min ||X̃(w − ŵ)ᵀ|| over the kept weights, X̃ = [X; √λ I] (so X̃ᵀX̃ = H + λI)."""
    k, n = 20, 6
    x = correlated_inputs(300, k)
    w = np.random.default_rng(1).standard_normal((1, n, k))
    mask = np.zeros((1, n, k), bool)
    for row, p in enumerate([0, 3, 7, 10, 13, 19]):
        mask[0, row, :p] = True
    w_hat, pruned, loss = reconstruct(w, (x.T @ x)[None], Pattern("unstructured"), mask=mask, block=block)
    assert np.array_equal(pruned, mask) and np.all(w_hat[mask] == 0)
    lam = damping((x.T @ x)[None])[0]
    xt = np.vstack([x, np.sqrt(lam) * np.eye(k)])
    for row in range(n):
        keep = ~mask[0, row]
        want = np.zeros(k)
        want[keep] = np.linalg.lstsq(xt[:, keep], xt @ w[0, row], rcond=None)[0]
        np.testing.assert_allclose(w_hat[0, row], want, rtol=0, atol=1e-8 * np.abs(w[0, row]).max())
    np.testing.assert_allclose(loss[0], quad(w[0] - w_hat[0], damped_gram(x)), rtol=1e-8)


def test_loss_is_the_damped_quadratic_form_and_above_the_optimum():
    """Any mask (here random, two groups): the returned loss is (w − ŵ)(H+λI)(w − ŵ)ᵀ, and at least
    the optimum's over the same kept set. (Not at most plain zeroing's: with a mask that ignores the
    saliency, an update may move weight into a column pruned later; 1 row of 10 here.)"""
    k, n, g = 24, 5, 2
    xs = [correlated_inputs(200, k, seed) for seed in (2, 3)]
    h = np.stack([x.T @ x for x in xs])
    rng = np.random.default_rng(4)
    w = rng.standard_normal((g, n, k))
    mask = rng.random((g, n, k)) < 0.5
    w_hat, _, loss = reconstruct(w, h, Pattern("unstructured"), mask=mask, block=8)
    for gi in range(g):
        hd = damped_gram(xs[gi])
        np.testing.assert_allclose(loss[gi], quad(w[gi] - w_hat[gi], hd), rtol=1e-8)
        for row in range(n):
            keep = ~mask[gi, row]
            ht = hd[np.ix_(keep, keep)]
            opt = np.zeros(k)
            opt[keep] = np.linalg.solve(ht, hd[keep] @ w[gi, row])
            assert quad((w[gi, row] - opt)[None], hd)[0] <= loss[gi, row] + 1e-9


def test_target_refit_is_the_ridge_fit_of_the_dense_outputs():
    """match_dense: with P = Σ y xᵀ of target outputs y = w t (t: the unpruned model's inputs, x:
    the pruned model's), w' = argmin ||X w'ᵀ − Y||² + λ||w' − w||², the solver's starting point
    (nothing pruned: ŵ = w'); with t = x, w' = w."""
    k, n = 12, 5
    t = correlated_inputs(500, k, 12)
    x = t + 0.2 * np.random.default_rng(13).standard_normal(t.shape)
    w = np.random.default_rng(14).standard_normal((1, n, k))
    g = Gram(1, k, outputs=n)
    g.add(x[None], (t @ w[0].T)[None])
    none = np.zeros((1, n, k), bool)
    got, _, loss = reconstruct(w, g.h, Pattern("unstructured"), mask=none, target=g.targets())
    lam = damping(g.h)[0]
    a = np.vstack([x, np.sqrt(lam) * np.eye(k)])
    want = np.linalg.lstsq(a, np.vstack([t @ w[0].T, np.sqrt(lam) * w[0].T]), rcond=None)[0].T
    np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-5 * np.abs(want).max())   # float32 Gram products
    assert np.all(loss == 0)
    same = Gram(1, k, outputs=n)
    same.add(t[None], (t @ w[0].T)[None])
    got, _, _ = reconstruct(w, same.h, Pattern("unstructured"), mask=none, target=same.targets())
    np.testing.assert_allclose(got, w, rtol=0, atol=1e-5)


def test_lazy_batching_does_not_change_the_result():
    k = 40
    x = correlated_inputs(400, k, 5)
    w = np.random.default_rng(6).standard_normal((1, 9, k))
    for pattern in (Pattern("unstructured", 0.6), Pattern.of("2:4"), Pattern("block4", 0.5)):
        a = reconstruct(w, (x.T @ x)[None], pattern, block=k)    # one block: no lazy updates, one mask block
        b = reconstruct(w, (x.T @ x)[None], pattern, mask=a[1], block=8)
        np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-10)


# ---- masks --------------------------------------------------------------------------------------------
def small_net(seed=0) -> Graph:
    """conv 3x3 (3 -> 8, padding 1) + ReLU -> depthwise 3x3 -> conv 1x1 stride 2, grouped (8 -> 10, 2
    groups) -> global pool -> flatten -> gemm (10 -> 18) + ReLU -> matmul (18 -> 6): He-initialized."""
    rng = np.random.default_rng(seed)
    g = Graph("small")
    x = g.add_input("x", TensorType((1, 3, 8, 8), "float32"))

    def const(shape, name, fan_in):
        return g.add_const((rng.standard_normal(shape) * np.sqrt(2 / fan_in)).astype(np.float32), name)

    conv = lambda a, w, b, name, **kw: g.create_op(     # noqa: E731
        "Conv", [a, w, b], full_attrs("Conv", **{"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0],
                                                 "group": 1, **kw}), name=name).result
    relu = lambda a, name: g.create_op("Relu", [a], name=name).result   # noqa: E731
    h = relu(conv(x, const((8, 3, 3, 3), "w1", 27), const((8,), "b1", 8), "conv1", pads=[1, 1, 1, 1]), "r1")
    h = relu(conv(h, const((8, 1, 3, 3), "w2", 9), const((8,), "b2", 8), "dw", pads=[1, 1, 1, 1], group=8), "r2")
    h = conv(h, const((10, 4, 1, 1), "w3", 4), const((10,), "b3", 10), "pw", strides=[2, 2], group=2)
    h = g.create_op("Flatten", [g.create_op("GlobalAveragePool", [h], name="pool").result], {"axis": 1},
                    name="flat").result
    h = relu(g.create_op("Gemm", [h, const((18, 10), "w4", 10), const((18,), "b4", 18)],
                         full_attrs("Gemm", transB=1), name="fc").result, "r4")
    g.outputs = [g.create_op("MatMul", [h, const((18, 6), "w5", 18)], name="head", result_names=["out"]).result]
    return g


def feeds(n, seed=0):
    """Smooth images (a few random low-frequency waves) with noise: correlated neighbouring pixels."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:8, 0:8] / 8.0
    out = []
    for _ in range(n):
        f = rng.uniform(0.5, 3, (3, 2))
        img = np.stack([np.sin(2 * np.pi * (f[c, 0] * xx + f[c, 1] * yy) + rng.uniform(0, 6)) for c in range(3)])
        out.append({"x": (img + 0.1 * rng.standard_normal(img.shape))[None].astype(np.float32)})
    return out


def pruned(method, calib=None, seed=0, **kw):
    g = small_net(seed)
    po = PruneOptions(**kw)
    ctx = PassContext(options={"prune": po} if method == "magnitude" else
                      {"prune-reconstruct": PruneReconstructOptions(prune=po, calib=calib)})
    PassManager(["prune" if method == "magnitude" else "prune-reconstruct"], ctx=ctx).run(g)
    return g


def mats(g):
    return {l.op.name: l.matrices() for l in layers(g)}


@pytest.mark.parametrize("s", [0.5, 0.75])
def test_exact_zero_counts_as_magnitude(s):
    calib = feeds(32)
    mag, obc = pruned("magnitude", sparsity=s), pruned("obc", calib, sparsity=s)
    rm, ro = mag.meta["sparsity"], obc.meta["sparsity"]
    assert ro["method"] == "obc" and rm["method"] == "magnitude"
    for name, row in rm["layers"].items():
        assert ro["layers"][name]["zeros"] == row["zeros"] and ro["layers"][name]["pruned"] == row["pruned"], name
    assert not ro["layers"]["dw"]["pruned"] and "depthwise" in ro["layers"]["dw"]["skipped"]
    assert {n for n, r in ro["layers"].items() if r["pruned"]} == {"conv1", "pw", "fc", "head"}
    assert all(0 < ro["layers"][n]["reconstruction"]["loss"] < 1 for n in ("conv1", "pw", "fc", "head"))


def test_24_in_the_formats_grouping():
    """K = 27 (conv1: 3·3·3) and 18 (head): groups start at k ≡ 0 mod 4; the short tail group keeps
    min(2, size) weights, as nm_mask does."""
    g = pruned("obc", feeds(32), pattern="2:4", sparsity=0.5)
    for name, m in mats(g).items():
        if name == "dw":
            continue
        k = m.shape[-1]
        keep_nm = nm_mask(np.abs(m) + (m != 0), 2, 4)                 # the kept set, if it is 2:4
        assert np.array_equal(m != 0, keep_nm & (m != 0)), name
        zeros_per_group = [int((m[..., s:s + 4] == 0).sum(-1).min()) for s in range(0, k, 4)]
        assert zeros_per_group == [max(0, min(4, k - s) - 2) for s in range(0, k, 4)], name
        assert is_24(m.reshape(-1, k)), name


def test_block4_whole_blocks():
    s = 0.5
    g = pruned("obc", feeds(32), pattern="block4", sparsity=s)
    for name, m in mats(g).items():
        if name == "dw":
            continue
        k = m.shape[-1]
        kp = -(-k // 4) * 4
        zeros = np.zeros(m.shape[:-1] + (kp,), int)
        zeros[..., :k] = m == 0
        per_block = zeros.reshape(*m.shape[:-1], kp // 4, 4).sum(-1)
        size = np.minimum(4, k - 4 * np.arange(kp // 4))                 # the tail block is short
        assert np.all((per_block == 0) | (per_block == size)), name       # no block partly zero
        zero_blocks = per_block == size
        assert int(zero_blocks.sum()) == round(s * zero_blocks.size), name


# ---- im2col rows --------------------------------------------------------------------------------------
def direct_conv(x, w, strides, pads, dilations, group):
    n, c, hi, wi = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ho = (hi + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    wo = (wi + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    y = np.zeros((n, o, ho, wo))
    og = o // group
    for oc in range(o):
        gi = oc // og
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, gi * cg:(gi + 1) * cg, i * dilations[0]:, j * dilations[1]:]
                patch = patch[:, :, :(ho - 1) * strides[0] + 1:strides[0], :(wo - 1) * strides[1] + 1:strides[1]]
                y[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j])
    return y


@pytest.mark.parametrize("strides,pads,dilations,group", [
    ([1, 1], [0, 0, 0, 0], [1, 1], 1),
    ([2, 1], [1, 2, 0, 1], [1, 1], 1),
    ([1, 2], [2, 2, 2, 2], [2, 1], 2),
    ([2, 2], [1, 1, 1, 1], [1, 1], 6),
])
def test_conv_rows_times_weight_is_the_conv(strides, pads, dilations, group):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 9, 8))
    w = rng.standard_normal((12, 6 // group, 3, 2))
    y = direct_conv(x, w, strides, pads, dilations, group)
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": group}
    rows = conv_rows(x, (3, 2), attrs, y.shape[2:], group)               # g, n·P, K
    got = rows @ conv_matrices(w, group).transpose(0, 2, 1)              # g, n·P, O/g
    n, o, ho, wo = y.shape
    got = got.reshape(group, n, ho * wo, o // group).transpose(1, 0, 3, 2).reshape(y.shape)
    np.testing.assert_allclose(got, y, rtol=1e-12, atol=1e-12)
    pick = np.array([0, 5, 17, ho * wo + 3])                             # a sample of the rows
    np.testing.assert_array_equal(conv_rows(x, (3, 2), attrs, y.shape[2:], group, pick), rows[:, pick])


def test_gram_streams_and_appends_the_bias_column():
    x = correlated_inputs(20000, 7)                       # more than one CHUNK_ROWS chunk
    g = Gram(1, 7)
    g.add(x[None, :12000])
    g.add(x[None, 12000:])
    ones = np.hstack([x, np.ones((len(x), 1))])
    np.testing.assert_allclose(g.with_ones()[0], ones.T @ ones, rtol=1e-5)


# ---- what the re-fit buys -----------------------------------------------------------------------------
def test_bias_refit_lowers_the_output_error():
    """Inputs with a mean (post-ReLU): pruning shifts the output's mean, which the bias absorbs."""
    k, n = 32, 16
    x = correlated_inputs(2000, k, 8)
    w = np.random.default_rng(9).standard_normal((1, n, k))
    b = np.random.default_rng(10).standard_normal(n)
    y = x @ w[0].T + b
    g = Gram(1, k)
    g.add(x[None])
    plain, _, _ = reconstruct(w, g.h, Pattern("unstructured", 0.6))
    wb, _, _ = reconstruct(np.concatenate([w, b[None, :, None]], 2), g.with_ones(), Pattern("unstructured", 0.6),
                           fixed=1)
    err_plain = ((x @ plain[0].T + b - y) ** 2).sum()
    err_bias = ((x @ wb[0, :, :k].T + wb[0, :, k] - y) ** 2).sum()
    print(f"\noutput error: bias kept {err_plain:.1f}, bias re-fitted {err_bias:.1f}")
    assert err_bias <= err_plain
    assert int((wb[0, :, :k] == 0).sum()) == round(0.6 * n * k)          # the bias column is never pruned


def sqnr(ref, got):
    return 10 * np.log10((ref ** 2).sum() / ((ref - got) ** 2).sum())


@pytest.mark.parametrize("pattern,s", [("unstructured", 0.5), ("unstructured", 0.75), ("2:4", 0.5)])
def test_obc_beats_magnitude_on_calibration_and_held_out_data(pattern, s):
    calib, held = feeds(64, 0), feeds(64, 1)
    dense, mag, obc = small_net(), pruned("magnitude", pattern=pattern, sparsity=s), \
        pruned("obc", calib, pattern=pattern, sparsity=s)
    for data in (calib, held):
        def out(g, data=data):
            return np.concatenate([run_values(g, f)["out"] for f in data])
        ref = out(dense)
        s_mag, s_obc = sqnr(ref, out(mag)), sqnr(ref, out(obc))
        print(f"\n{pattern} {s}: output SQNR magnitude {s_mag:.1f} dB, obc {s_obc:.1f} dB")
        assert s_obc > s_mag + 3


# ---- the pass on IR text ------------------------------------------------------------------------------
W = np.array([[0.9, -0.2, 0.4, 0.05], [0.1, 0.7, -0.6, 0.3]], np.float32)
B = np.array([0.5, -1.0], np.float32)
GEMM = f"""graph @g(%x: tensor<1x4xf32>) {{
  %w = const {fmt_dense(W)} : tensor<2x4xf32>
  %b = const {fmt_dense(B)} : tensor<2xf32>
  %y = Gemm(%x, %w, %b) {{alpha = 2.0, beta = 0.5, transA = 0, transB = 1}} : tensor<1x2xf32> loc("fc")
  return %y
}}"""


def test_gemm_ir_in_ir_out():
    """Gemm y = 2·x Wᵀ + 0.5·b: W [2, 4] loses 4 weights, the kept ones and the bias are re-fitted
    as reconstruct() gives for the bias-augmented rows (bias/α as a last input of constant 1); the
    new bias carries β = 1."""
    x = correlated_inputs(64, 4, 11).astype(np.float32)
    calib = [{"x": x[i:i + 1]} for i in range(len(x))]
    ctx = PassContext(options={"prune-reconstruct": PruneReconstructOptions(
        prune=PruneOptions(sparsity=0.5), calib=calib, match_dense=False)})
    g = run_ir(GEMM, "prune-reconstruct", ctx)
    gram = Gram(1, 4)
    gram.add(x[None])
    want, mask, _ = reconstruct(np.concatenate([W, (0.5 * B / 2)[:, None]], 1)[None].astype(np.float64),
                                gram.with_ones(), Pattern("unstructured", 0.5), fixed=1)
    w_new, b_new = want[0, :, :4].astype(np.float32), (2 * want[0, :, 4]).astype(np.float32)
    assert int(mask.sum()) == 4
    expected = f"""graph @g(%x: tensor<1x4xf32>) {{
  %w_pruned = const {fmt_dense(w_new)} : tensor<2x4xf32>
  %b_pruned = const {fmt_dense(b_new)} : tensor<2xf32>
  %y = Gemm(%x, %w_pruned, %b_pruned) {{alpha = 2.0, beta = 1.0, transA = 0, transB = 1}} : tensor<1x2xf32> loc("fc")
  return %y
}}"""
    assert_ir(g, expected)
    y = np.concatenate([run_values(g, f)["y"] for f in calib])
    y0 = np.concatenate([run_values(parse_graph(GEMM), f)["y"] for f in calib])
    assert sqnr(y0, y) > sqnr(y0, 2 * x @ np.where(mask[0], 0, W).T + 0.5 * B)   # better than zeroing


def test_gemm_trans_a_reads_the_same_rows():
    """transA = 1 (A [K, M] per sample): the pass prunes to the same weights as for Aᵀ without it."""
    x = correlated_inputs(64, 4, 11).astype(np.float32)
    text_t = GEMM.replace("tensor<1x4xf32>)", "tensor<4x1xf32>)").replace("transA = 0", "transA = 1")
    got = {}
    for name, text, feed in (("plain", GEMM, lambda r: r[None]), ("transA", text_t, lambda r: r[:, None])):
        ctx = PassContext(options={"prune-reconstruct": PruneReconstructOptions(
            prune=PruneOptions(sparsity=0.5), calib=[{"x": feed(r)} for r in x])})
        g = run_ir(text, "prune-reconstruct", ctx)
        got[name] = {v.name: v.data for v in g.consts.values()}
    assert got["plain"].keys() == got["transA"].keys() == {"w_pruned", "b_pruned"}
    for k in got["plain"]:
        np.testing.assert_allclose(got["transA"][k], got["plain"][k], rtol=1e-6, atol=1e-7)


# ---- the command line ---------------------------------------------------------------------------------
def test_warning_when_pruning_misses_min_sqnr(tmp_path, capsys):
    code = main(["compile", FASHION, "--calib", DATA, "--calib-samples", "64", "--eval-samples", "64",
                 "--sparsity", "0.75", "--min-sqnr", "30", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 0, err
    warn = [line for line in err.splitlines() if line.startswith("qcompile: warning: pruning alone")]
    assert len(warn) == 1, err
    assert "(obc, 75 % unstructured)" in warn[0] and "dB SQNR against the dense model" in warn[0]
    assert "the --min-sqnr budget of 30 dB" in warn[0] and "64 held-back samples" in warn[0]
    assert (tmp_path / "out" / "model.so").exists()

