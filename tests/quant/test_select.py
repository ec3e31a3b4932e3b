"""select_float_layers: greedy with re-evaluation, prune, exchange and cost, against brute force.

On the small outlier models (tests/quant/mixed_models.py, 8 quantizable layers) every subset is
evaluated (2^8 = 256 reference runs), so the minimal float set for a budget is known exactly; the
selection must meet the budget with a set of that size, for budgets from "plain int8 already
meets it" to "every outlier layer must be float"."""
import itertools
import math

import numpy as np
import pytest

from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.plan.select import Bootstrap, Memo, brute_force, select_float_layers
from qcompiler.plan.sensitivity import Sensitivity

from mixed_models import feeds, outlier_mlp


def sensitivity(severity, seed=0):
    g = outlier_mlp(severity, seed)
    opts = QuantizeOptions(calib=[{"x": feeds(64, 1)}], per_channel=False, bias_correction=False)
    return Sensitivity(g, opts, [({"x": feeds(64, 2)}, None)])


def exhaustive(sens, criterion="point"):
    """score of every subset of the candidates (evaluated once, memoized by Sensitivity): the
    point SQNR or the 95 % bootstrap lower bound (the CLI's default criterion)."""
    c = sens.candidates
    bs = Bootstrap(64)

    def score(S):
        if criterion == "point":
            return sens.scores(S).sqnr_db
        p = sens.per_sample(S)
        return bs.sqnr_db(p.signal, p.noise)
    return {frozenset(s): score(frozenset(s)) for k in range(len(c) + 1) for s in itertools.combinations(c, k)}


def minimal_size(table, budget):
    return min((len(s) for s, v in table.items() if v >= budget), default=None)


@pytest.mark.parametrize("criterion", ["point", "bootstrap"])
@pytest.mark.parametrize("severity,seed", [({"g2": 60, "g4": 25, "g5": 8}, 0),
                                           ({"g1": 40, "g3": 40, "g6": 15}, 1),
                                           ({"g2": 30, "g4": 30, "g5": 30, "g6": 30}, 2)])
def test_greedy_prune_as_small_as_brute_force(severity, seed, criterion):
    """Under either criterion (the point SQNR, or its bootstrap lower bound that the CLI checks)."""
    sens = sensitivity(severity, seed)
    assert len(sens.candidates) == 8 and {"add1", "add2"} <= set(sens.candidates)   # from the plan
    assert frozenset({"g1", "g2", "add1"}) in sens.groups()            # h1 feeds g2 and the residual add1
    table = exhaustive(sens, criterion)
    if criterion == "bootstrap":         # a lower bound: below the point estimate for every set
        assert all(v <= sens.scores(s).sqnr_db + 1e-9 for s, v in table.items())
    plain = table[frozenset()]
    finite = sorted({round(v, 6) for v in table.values() if math.isfinite(v)})
    # budgets: just above plain int8, and between consecutive achievable scores up to the best
    budgets = [plain - 1.0] + [(a + b) / 2 for a, b in zip(finite, finite[1:]) if a >= plain][:12] + [finite[-1]]
    sizes = []
    for budget in budgets:
        for shortlist in (None, 3):
            sel = select_float_layers(lambda s: table[s], sens.candidates, budget, shortlist=shortlist,
                                      prior=sens.prior(), groups=sens.groups() if shortlist else None)
            best = minimal_size(table, budget)
            assert sel.met and table[frozenset(sel.float_layers)] >= budget
            assert len(sel.float_layers) == best, (budget, sel.float_layers, brute_force(lambda s: table[s],
                                                                                           sens.candidates, budget))
            assert sel.score == pytest.approx(table[frozenset(sel.float_layers)])
        sizes.append(best)
    assert sizes[0] == 0 and max(sizes) >= 2          # plain int8 meets the first, the outliers need >= 2 float
    # each float layer's reason is its measured marginal gain
    sel = select_float_layers(lambda s: table[s], sens.candidates, budgets[-2])
    S = frozenset(sel.float_layers)
    for f in S:
        assert sel.gains[f] == pytest.approx(table[S] - table[S - {f}])
        assert sel.reasons()[f].startswith("budget: +")


def cover(sets: dict[str, set], weights: dict[int, float]):
    """A score with overlapping layers: the weight of the error sources their float-ness removes."""
    return lambda S: sum(w for e, w in weights.items() if any(e in sets[n] for n in S))


def test_reevaluation_beats_the_static_ranking():
    """Algorithm 6.2 un-quantizes by ONE ranking: a (7), then b (5.5 alone, but it overlaps a: +2.5),
    then c: three layers. Re-measuring after each move takes c (+4.5) second: two layers."""
    score = cover({"a": {1, 2}, "b": {2, 3}, "c": {4}, "d": set()}, {1: 4, 2: 3, 3: 2.5, 4: 4.5})
    static = sorted("abcd", key=lambda n: -score(frozenset(n)))
    S = frozenset()
    for n in static:                                       # Algorithm 6.2 as written
        if score(S) >= 11:
            break
        S |= {n}
    assert len(S) == 3
    sel = select_float_layers(score, list("abcd"), 11)
    assert set(sel.float_layers) == {"a", "c"} and sel.met and sel.steps[1]["add"] == ["c"]


def test_prune_drops_a_layer_made_redundant():
    """Ties pick a first; {a, b} then {a, b, c}; a is redundant once b and c are float."""
    score = cover({"a": {2, 3}, "b": {1, 2}, "c": {3, 4}}, {1: 1, 2: 1, 3: 1, 4: 1})
    sel = select_float_layers(score, list("abc"), 4, tie=0)
    assert set(sel.float_layers) == {"b", "c"}
    assert [s["phase"] for s in sel.steps][-1] == "prune"
    assert brute_force(score, list("abc"), 4) == frozenset("bc")


def test_cost_prefers_the_cheaper_set_of_the_same_size():
    """a and b fix the same error equally well; b is cheaper (e.g. it sits next to a float op, so
    no Q/DQ boundary): the latency-aware selection takes b, the accuracy-only one a (first by order)."""
    score = cover({"a": {1}, "b": {1}, "c": {2}, "d": {3}}, {1: 5, 2: 3, 3: 0.1})
    lat = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 0.5}

    def cost(S):
        return 10.0 + sum(lat[n] for n in S)
    plain = select_float_layers(score, list("abcd"), 8)
    fast = select_float_layers(score, list("abcd"), 8, cost=cost)
    assert set(plain.float_layers) == {"a", "c"} and set(fast.float_layers) == {"b", "c"}
    assert fast.cost == cost(frozenset("bc")) < cost(frozenset(plain.float_layers))
    assert fast.cost == cost(brute_force(score, list("abcd"), 8, cost=cost))
    # a move that reaches the budget beats a better-scoring but pricier one
    score2 = cover({"a": {1, 2}, "b": {1}}, {1: 5, 2: 1})
    sel = select_float_layers(score2, ["a", "b"], 4, cost=lambda S: sum({"a": 5, "b": 1}[n] for n in S))
    assert sel.float_layers == ("b",)


def test_bootstrap_bound_against_numpy():
    """The bound is the 5th percentile of the resampled dataset SQNR, recomputed here resample by
    resample with numpy's own draws; equal ratios everywhere give a bound equal to the point value;
    the accuracy drop's bound is the 95th percentile of the resampled drop."""
    rng = np.random.default_rng(3)
    n = 40
    sig = rng.uniform(1, 2, n)
    noise = rng.uniform(0, 1, n) ** 8 * 1e-2                 # heavy tailed: a few samples carry the noise
    bs = Bootstrap(n)
    draws = np.random.default_rng(0).multinomial(n, np.full(n, 1 / n), size=1000)
    assert np.array_equal(bs.weights, draws) and bs.weights.sum(1).tolist() == [n] * 1000
    dbs = sorted(10 * math.log10(sum(w * sig) / sum(w * noise)) for w in draws)
    assert bs.sqnr_db(sig, noise) == pytest.approx(dbs[49], abs=1e-12)       # inverted CDF: 50th of 1000
    point = 10 * math.log10(sig.sum() / noise.sum())
    assert bs.sqnr_db(sig, noise) < point - 1.0                # heavy tail: the bound is well below
    assert Bootstrap(n).sqnr_db(sig, sig * 1e-3) == pytest.approx(30.0)         # constant ratio: exact
    assert Bootstrap(n).sqnr_db(sig, np.zeros(n)) == math.inf
    c0, c = np.ones(n), np.ones(n)
    c[:2] = 0                                                    # 2 of 40 flip: a 5-point drop
    drops = sorted(100 * (w @ (c0 - c)) / n for w in draws)
    assert bs.accuracy_drop(c0, c) == pytest.approx(drops[949]) and bs.accuracy_drop(c0, c) > 5.0
    assert Bootstrap(n, level=0.5).accuracy_drop(c0, c) == pytest.approx(5.0, abs=2.6)


def test_unreachable_budget_is_reported():
    score = cover({"a": {1}, "b": {2}}, {1: 1, 2: 1, 3: 5})
    sel = select_float_layers(score, ["a", "b"], 5)
    assert not sel.met and sel.score == 2 and set(sel.float_layers) == {"a", "b"}
    j = sel.to_json()
    assert j["met"] is False and j["float_layers"] and j["iterations"] == len(sel.steps)


def noise_sqnr(noise: dict[str, float], floor: float = 1e-3):
    """SQNR in dB of a model whose int8 layers each add their noise power (signal 1)."""
    return lambda S: 10 * math.log10(1.0 / (floor + sum(w for n, w in noise.items() if n not in S)))


def test_a_far_budget_is_reached_by_bisection_then_elimination():
    """40 layers of equal noise and a budget that leaves at most 10 of them int8: 30 must be float.
    With a cap of 80 evaluations the greedy (10 moves per step) could add 4 layers, so the search
    bisects the prior ranking instead (5 useless layers first: they add no noise) and eliminates
    what the prefix does not need: the 30, in far fewer evaluations than the greedy takes."""
    noisy = {f"n{i}": 1.0 for i in range(40)}
    useless = {f"u{i}": 0.0 for i in range(5)}
    score = noise_sqnr({**noisy, **useless})
    cands = list(noisy) + list(useless)
    prior = list(useless) + list(noisy)
    budget = 10 * math.log10(1.0 / (1e-3 + 10.5))                 # 10 int8 layers meet it, 11 do not
    sel = select_float_layers(score, cands, budget, shortlist=8, prior=prior, max_evaluations=80)
    assert sel.met and len(sel.float_layers) == 30 and not set(sel.float_layers) & set(useless)
    assert [s["phase"] for s in sel.steps] == ["bisect", "eliminate"] and sel.steps[0]["size"] == 35
    assert sel.evaluations <= 80
    greedy = select_float_layers(score, cands, budget, shortlist=8, prior=prior)     # no cap: the greedy
    assert len(greedy.float_layers) == 30 and greedy.evaluations > 3 * sel.evaluations


def test_an_unreachable_budget_stops_at_once_under_a_cap():
    """Not even every candidate float meets it: that set is the answer, said not met, after the
    all-int8, the greedy's-reach and the all-float evaluations."""
    score = noise_sqnr({f"n{i}": 1.0 for i in range(30)}, floor=1.0)
    sel = select_float_layers(score, [f"n{i}" for i in range(30)], 10.0, shortlist=8, max_evaluations=100)
    assert not sel.met and len(sel.float_layers) == 30 and sel.evaluations == 3


def test_one_memo_caps_both_searches():
    """The accuracy-only and the latency-aware searches share one Memo: the second re-walks the
    first's sets for free and the cap bounds their evaluations together."""
    noise = {f"n{i}": 1.0 + 0.1 * i for i in range(12)}
    calls = []

    def score(S):
        calls.append(S)
        return noise_sqnr(noise)(S)
    budget = noise_sqnr(noise)(frozenset(f"n{i}" for i in range(9, 12)))
    memo = Memo()
    a = select_float_layers(score, list(noise), budget, shortlist=4, max_evaluations=40, memo=memo)
    first = len(calls)
    b = select_float_layers(score, list(noise), budget, shortlist=4, max_evaluations=40, memo=memo,
                            cost=lambda S: float(len(S)))
    assert a.met and b.met and len(calls) == len(set(calls)) == len(memo.scores) <= 40
    assert len(calls) - first < first


def test_confirm_keeps_adding_until_both_hold():
    """``confirm`` (a validation split: select on one part, the set must also meet the budget on
    the other): a alone meets the budget on the selection part but not on the confirmation part,
    so the search goes on to {a, c}; moves are still ranked by the selection score."""
    score = cover({"a": {1}, "b": {2}, "c": {3}}, {1: 6, 2: 1, 3: 2})
    check = cover({"a": {1}, "b": {2}, "c": {3}}, {1: 4, 2: 1, 3: 3})
    assert select_float_layers(score, list("abc"), 5).float_layers == ("a",)
    sel = select_float_layers(score, list("abc"), 5, confirm=check)
    assert set(sel.float_layers) == {"a", "c"} and sel.met and check(frozenset("ac")) >= 5


C, N, DB = 16, 32, 2.0          # calibration lines, selection lines (as many held back), budget above plain


def test_rapidocr_cls_selection_and_held_back():
    """rapidocr-cls (80 quantizable layers) on synthetic text lines: 16 calibration lines, the
    selection measured on the next 32 (not calibrated on, as ``qcompile --min-sqnr`` takes them),
    checked on the 32 after those. Budget: plain int8 + 2 dB (point SQNR on the selection lines);
    the selection checks it at the 95 % bootstrap lower bound (the CLI's criterion).

    The held-back assertion is statistical, as the bound is: the held-back lines must not refute
    the budget, i.e. the 95th percentile of their own bootstrap SQNR reaches it, and the selected
    set must gain on them. Not asserted: held-back SQNR >= budget itself. Measured (2026-11-22):
    budget 18.90 dB; the bound takes {Conv@0, Conv@1}: bound 19.22, point 21.55 dB on the selection
    lines, held back 16.47 -> 18.70 dB (0.2 dB short); the point criterion took {Conv@1}: held back
    17.74 dB (1.2 dB short). With 64/64 lines: bound {Conv@0-2} held back 17.99 (budget 18.68),
    point {Conv@0} 19.00. The output noise of this 2-class softmax sits on the few lines near the
    decision boundary, so 32-64 lines do not pin a set's SQNR within 1 dB (README)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from realmodels import rapidocr_models, rapidocr_text_lines
    from qcompiler.frontend import import_onnx
    from qcompiler.passes import PassManager
    models = [m for m in rapidocr_models() if m.name == "rapidocr-cls"]
    if not models:
        pytest.skip("rapidocr package not installed")
    g = import_onnx(models[0].load(), models[0].input_shapes)
    PassManager("default").run(g)
    xs = rapidocr_text_lines(C + 2 * N)
    opts = QuantizeOptions(calib=[{"x": xs[i:i + 1]} for i in range(C)])
    sens = Sensitivity(g, opts, [({"x": xs[C:C + N]}, None)])
    assert len(sens.candidates) == 80
    bs = Bootstrap(N)

    def bound(S):
        p = sens.per_sample(S)
        return bs.sqnr_db(p.signal, p.noise)
    plain = sens.scores(frozenset()).sqnr_db
    budget = plain + DB
    sel = select_float_layers(bound, sens.candidates, budget, shortlist=4, prior=sens.prior(), groups=sens.groups())
    S = frozenset(sel.float_layers)
    point = sens.scores(S).sqnr_db
    assert sel.met and bound(frozenset()) < plain < budget <= sel.score < point and 1 <= len(S) <= 8
    assert sel.evaluations <= 2 * len(sens.candidates)
    held = Sensitivity(g, opts, [({"x": xs[C + N:]}, None)], ranges=sens.ranges)
    h0, h1 = held.scores(frozenset()).sqnr_db, held.scores(S).sqnr_db
    p = held.per_sample(S)
    upper = Bootstrap(N, level=0.95).sqnr_db(p.signal, p.noise)       # the held-back lines' 95th percentile
    print(f"rapidocr-cls: budget {budget:.2f} dB, plain {plain:.2f} -> bound {sel.score:.2f} (point {point:.2f}) dB "
          f"with {sorted(S)} ({sel.evaluations} evaluations); held back: plain {h0:.2f} -> {h1:.2f} dB "
          f"(95th percentile {upper:.2f})")
    assert h1 > h0 and upper >= budget
