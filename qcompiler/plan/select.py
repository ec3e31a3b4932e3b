"""Budgeted selection of float layers (selective unquantization).

Deep Learning Systems (ch. 6.2, Algorithm 6.2) quantizes every layer, then, while the accuracy
error exceeds the budget E, un-quantizes the layer with the highest sensitivity (average Hessian
trace), from ONE static ranking. We improve it in five ways:

1. **greedy with re-evaluation**: each step measures the candidate moves *given the layers already
   float* and takes the one that helps most (errors of int8 layers interact: once the worst layer
   is float, the second worst by the static ranking is often not the next best move);
2. **shortlisted moves** (``shortlist=K``): a step measures only the K moves that scored best when
   last measured (stale scores, as in Minoux's lazy greedy, 1978: exact under diminishing returns,
   a heuristic otherwise) plus K/4 never measured ones in the order of ``prior`` (a cheap ranking,
   e.g. where the SQNR falls most in one all-int8 run; the first step takes K from it). That keeps
   the search about linear in the number of layers; ``shortlist=None`` measures every move;
   ``groups`` add multi-layer moves: a layer with the layers that consume its output. Keeping one
   layer float removes its weight error but not its output's quantization, which the next int8
   layer still applies; only producer and consumers together remove that point. A step compares
   moves by gain per new layer;
3. **prune and exchange** once the budget holds: drop every float layer that is no longer needed
   (greedy's early picks can become redundant), then try replacing two float layers by one
   (a smaller set; the pairs that contribute least first, at most as many tries as one greedy
   step per float layer), repeating both until nothing changes;
4. **latency** (``cost``): among moves that meet the budget, or that come equally close to it
   (scores within ``tie``), the cheaper wins; a final exchange step swaps a float layer for another
   when the budget still holds and the model gets faster (same size, lower cost);
5. **reach** (under an evaluation cap, ``max_evaluations``): the greedy adds one layer per about K
   evaluations, so a budget far above plain int8 (an EfficientNet-B0 at 4 dB asked for 30 dB needs
   over 80 float layers) would spend the cap long before it meets the budget. One evaluation tells:
   if the first k = left / 2K layers of ``prior`` kept float do not meet the budget, the greedy
   cannot afford it; then every candidate float is checked (unreachable: that set, said so), the
   shortest prefix of ``prior`` that meets the budget is found by bisection (log2 n evaluations;
   Polygraphy's ``debug precision`` bisects layers toward higher precision the same way), and a
   backward elimination (first fit, least promising first: |S| evaluations) drops the prefix's
   layers the budget does not need. Exchange and cost swaps, |S|·K evaluations each, are left
   out for sets that large.

Contract (what callers, e.g. the latency-aware benchmark, can rely on)::

    sel = select_float_layers(evaluate, candidates, budget, cost=None)

* ``evaluate(S) -> float``: the score of the build in which exactly the candidate layers in the
  frozenset ``S`` are float (plus whatever the caller keeps float anyway); *higher is better* and
  the budget holds iff ``evaluate(S) >= budget``. ``--min-sqnr DB``: the output SQNR in dB, budget
  DB; ``--max-accuracy-drop P``: minus the accuracy drop in points, budget -P. Called once per
  distinct set (memoized here); it must be deterministic.
* ``candidates``: layer names that may become float (order only breaks ties); ``prior``: an
  optional most-promising-first ordering of them (used with ``shortlist``).
* ``max_evaluations`` (optional): at most about this many distinct sets are evaluated (the
  reasons' marginal gains may take a few more); ``memo`` (a :class:`Memo`) shares the measured sets,
  and the cap, with another search over the same ``evaluate``.
* ``cost(S) -> float`` (optional): the latency in ms of the build with ``S`` float (conversions at
  island boundaries included by the caller); lower is better. ``None``: the smallest set with the
  best score (accuracy-only greedy). The set size is minimized first (prune, exchange); ``cost``
  decides between moves that meet the budget or tie, and between final sets of the same size.
* ``confirm(S) -> float`` (optional): a validation split: the budget holds only if
  ``confirm(S) >= budget`` too (e.g. the SQNR on samples the scores did not come from); moves are
  still ranked by ``evaluate``, so the search goes on adding float layers until both hold.
* Returns :class:`Selection`: the float set, whether the budget holds, its score (and cost), each
  float layer's marginal gain (score with it minus score without it), and the steps taken.

If the budget is unreachable even with every candidate float, ``met`` is False and the set with the
best score found is returned.

**What the score is: a lower confidence bound, not the point estimate** (:class:`Bootstrap`, used by
:mod:`qcompiler.plan.mixed`). The budget is about data the model will see, not about the n
selection samples. The dataset SQNR is a ratio of sums over samples, with per-sample signal and
noise energies s_i = Σ r², e_i = Σ (y - r)² (every output of sample i vs fp32)::

    SQNR = 10 log10( Σ_i s_i / Σ_i e_i )

and its noise is heavy-tailed: on rapidocr-cls a few text lines near the 2-class decision boundary
carry a third of Σ e_i, so the SQNR of two sets of 16 lines differs by ~4 dB and a float set chosen
to meet the budget on the selection samples (the point estimate) misses it on held-back lines. We
check the budget at the one-sided 1 - α percentile-bootstrap lower bound instead (α = 0.05 by
default, ``--budget-confidence 0.95``; Efron & Tibshirani 1993, ch. 13): draw B = 1000 resamples
of the n samples with replacement, once, with a fixed seed (multinomial counts w_bi, shared by
every float set, so the score is a deterministic function of the set and two sets are compared on
the same resamples), and take ::

    bound(S) = α-quantile over b of 10 log10( Σ_i w_bi s_i(S) / Σ_i w_bi e_i(S) )

The budget holds iff bound(S) >= DB: with probability about 1 - α the SQNR over the population
the samples come from is at least DB. The accuracy budget alike: with per-sample top-1
indicators c_i (int8 build) and c0_i (fp32), the drop's (1 - α)-quantile
``100 Σ_i w_bi (c0_i - c_i) / n`` must be at most POINTS. Nothing here looks at held-back data:
the level is fixed beforehand, not tuned. The search above is unchanged (it sees one score per
set), so the brute-force comparison holds for the bound as for any score. What the bound does not
cover: the selection's own optimism (the greedy picks the set that fits these samples best) and
samples unlike the selection samples (another distribution); held-back data still reports that
(report.json ``selection.evaluation``). More samples narrow the bound (it tightens like 1/√n), so
a bound far below the point estimate says: measure on more samples.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

Evaluate = Callable[[frozenset], float]
Cost = Callable[[frozenset], float]
TIE = 0.05                       # scores closer than this count as equal (dB or points)
RESAMPLES, LEVEL = 1000, 0.05    # bootstrap: resamples, one-sided level (the 5th percentile)


@dataclass
class Selection:
    budget: float
    met: bool
    float_layers: tuple[str, ...]          # in the order they became float
    score: float
    baseline: float                        # the all-int8 score
    gains: dict = field(default_factory=dict)   # layer -> score(S) - score(S - {layer})
    steps: list = field(default_factory=list)
    evaluations: int = 0
    cost: float | None = None
    baseline_cost: float | None = None
    unit: str = "dB"

    def reasons(self) -> dict[str, str]:
        """Why each float layer is float: its marginal gain for the budget."""
        unit = " points" if self.unit == "points" else " " + self.unit
        if not self.met and not self.gains:
            return {n: "budget: not met even with every candidate float (the best score)" for n in self.float_layers}
        return {n: f"budget: +{self.gains[n]:.2f}{unit}" if math.isfinite(self.gains.get(n, math.nan))
                else "budget: needed (its removal breaks the budget)" for n in self.float_layers}

    def to_json(self) -> dict:
        def r(x):
            return None if x is None or not math.isfinite(x) else round(float(x), 4)
        return {"budget": r(self.budget), "unit": self.unit, "met": self.met, "score": r(self.score),
                "baseline": r(self.baseline), "float_layers": list(self.float_layers),
                "gains": {k: r(v) for k, v in self.gains.items()}, "reasons": self.reasons(),
                "evaluations": self.evaluations, "iterations": len(self.steps),
                "steps": [{**s, "score": r(s["score"]), **({"cost": r(s["cost"])} if "cost" in s else {})}
                          for s in self.steps],
                **({"cost_ms": r(self.cost), "baseline_cost_ms": r(self.baseline_cost)}
                   if self.cost is not None else {})}


@dataclass
class Memo:
    """The sets measured so far (scores, and ``confirm`` scores), shared by the searches of one
    selection over the same ``evaluate`` (the accuracy-only and the latency-aware one): a set is
    evaluated once, and ``max_evaluations`` bounds the evaluations of all of them together."""
    scores: dict = field(default_factory=dict)
    confirmed: dict = field(default_factory=dict)


class _Search:
    def __init__(self, evaluate: Evaluate, cost: Cost | None, budget: float, tie: float, max_evaluations,
                 confirm: Evaluate | None = None, memo: Memo | None = None):
        self._evaluate, self._cost, self.budget, self.tie = evaluate, cost, budget, tie
        self._confirm = confirm
        self.max_evaluations = max_evaluations
        memo = memo if memo is not None else Memo()
        self.scores: dict[frozenset, float] = memo.scores
        self.confirmed: dict[frozenset, float] = memo.confirmed
        self.costs: dict[frozenset, float] = {}

    def score(self, s: frozenset) -> float:
        if s not in self.scores:
            self.scores[s] = float(self._evaluate(s))
        return self.scores[s]

    def cost(self, s: frozenset) -> float:
        if self._cost is None:
            return 0.0
        if s not in self.costs:
            self.costs[s] = float(self._cost(s))
        return self.costs[s]

    def out_of_budget(self) -> bool:
        return self.max_evaluations is not None and len(self.scores) >= self.max_evaluations

    def left(self) -> float:
        return math.inf if self.max_evaluations is None else self.max_evaluations - len(self.scores)

    def meets(self, s: frozenset) -> bool:
        if self.score(s) < self.budget:
            return False
        if self._confirm is not None and s not in self.confirmed:
            self.confirmed[s] = float(self._confirm(s))
        return self._confirm is None or self.confirmed[s] >= self.budget

    def best(self, sets: list[frozenset], order: dict) -> frozenset:
        """The best of ``sets``: those meeting the budget by (cost, -score); else the highest score,
        scores within ``tie`` of it by (cost, -score)."""
        ok = [s for s in sets if self.meets(s)]
        if ok:
            return min(ok, key=lambda s: (self.cost(s), -self.score(s), order.get(s, 0)))
        top = max(self.score(s) for s in sets)
        near = [s for s in sets if self.score(s) >= top - self.tie]
        return min(near, key=lambda s: (self.cost(s), -self.score(s), order.get(s, 0)))


def select_float_layers(evaluate: Evaluate, candidates: Iterable[str], budget: float, *,
                        cost: Cost | None = None, shortlist: int | None = None, tie: float = TIE,
                        max_evaluations: int | None = None, unit: str = "dB",
                        prior: list[str] | None = None, groups: Iterable[Iterable[str]] | None = None,
                        confirm: Evaluate | None = None, memo: Memo | None = None) -> Selection:
    """The smallest (then cheapest) set of candidate layers to keep float so that
    ``evaluate(set) >= budget``; see the module docstring for the contract and the algorithm."""
    cands = list(dict.fromkeys(candidates))
    rank = {c: i for i, c in enumerate(cands)}
    se = _Search(evaluate, cost, budget, tie, max_evaluations, confirm, memo)
    empty = frozenset()
    steps: list[dict] = []

    def step(phase: str, s: frozenset, **kw) -> None:
        d = {"phase": phase, **kw, "size": len(s), "score": se.score(s), "evaluations": len(se.scores)}
        if cost is not None:
            d["cost"] = se.cost(s)
        steps.append(d)

    def order_of(sets):
        return {s: sum(rank[c] for c in s) for s in sets}

    groups = [frozenset(g) & set(cands) for g in (groups or [])]
    base = se.score(empty)
    S, added = empty, []
    priority: dict[str, float] = {}                  # last measured score of (then) S + {c}
    prior = [c for c in (prior or []) if c in rank] + [c for c in cands if c not in set(prior or [])]
    reached = None
    if not se.meets(S):
        reached = _reach(se, prior, len(_pool(S, cands, rank, priority, prior, shortlist)))
    if reached is not None:
        S, added = reached, [c for c in prior if c in reached]
        step("bisect", S, add=sorted(S, key=rank.get))
        if se.meets(S):
            S = _eliminate(se, S, prior, rank, step)
    while reached is None and not se.meets(S) and len(S) < len(cands) and not se.out_of_budget():
        pool = _pool(S, cands, rank, priority, prior, shortlist)
        moves = [S | {c} for c in pool]
        for c, m in zip(pool, moves):
            priority[c] = se.score(m)
        inpool = set(pool)
        moves += [S | g for g in groups if len(g - S) > 1 and (g - S) & inpool]
        nxt = _greedy_move(se, S, list(dict.fromkeys(moves)), order_of(moves))
        new = sorted(nxt - S, key=rank.get)
        S = nxt
        added += new
        step("greedy", S, add=new)
    if reached is None and se.meets(S):
        S = _shrink(se, S, cands, rank, priority, prior, shortlist, step)
    if reached is None and cost is not None and se.meets(S):
        S = _cheaper(se, S, cands, rank, priority, prior, shortlist, step)
    gains = {}
    for f in S if se.meets(S) or reached is None else ():     # unreachable: no gain to state
        gains[f] = se.score(S) - se.score(S - {f})
    order = [c for c in added if c in S] + sorted(S - set(added), key=rank.get)
    return Selection(budget=budget, met=se.meets(S), float_layers=tuple(order), score=se.score(S), baseline=base,
                     gains=gains, steps=steps, evaluations=len(se.scores),
                     cost=se.cost(S) if cost is not None else None,
                     baseline_cost=se.cost(empty) if cost is not None else None, unit=unit)


def _reach(se: _Search, prior: list[str], width: int) -> frozenset | None:
    """None when the greedy can afford the budget, else the set it starts from instead.

    A greedy step measures about ``width`` moves and adds one layer; with ``left`` evaluations
    left, it can add k = left / (2 width) layers and leave as many evaluations for prune and
    exchange. If the first k layers of ``prior`` kept float meet the budget, it can (its moves are
    re-measured, so it needs no more layers than the static ranking). Else the budget needs more
    layers than the greedy can afford (e.g. an int8 build far below it): if not even every
    candidate float meets it, that set is the answer (unreachable, said so); else the shortest
    prefix of ``prior`` that meets it, found by bisection (log2 n evaluations, as Polygraphy's
    ``debug precision`` bisects layers toward higher precision), assuming the score grows with
    the prefix; :func:`_eliminate` then drops what it does not need."""
    if se.max_evaluations is None or se.out_of_budget():
        return None
    k = max(1, int(se.left() // (2 * max(1, width))))
    if k >= len(prior) or se.meets(frozenset(prior[:k])):
        return None
    if not se.meets(frozenset(prior)):
        return frozenset(prior)
    lo, hi = k, len(prior)                      # prior[:lo] misses the budget, prior[:hi] meets it
    while hi - lo > 1 and not se.out_of_budget():
        mid = (lo + hi) // 2
        if se.meets(frozenset(prior[:mid])):
            hi = mid
        else:
            lo = mid
    return frozenset(prior[:hi])


def _eliminate(se: _Search, S: frozenset, prior: list[str], rank: dict, step) -> frozenset:
    """Backward elimination, first fit: each float layer of ``S``, least promising by ``prior``
    first, leaves it when the budget holds without it: one pass, |S| evaluations (the greedy's
    prune measures |S| per layer it drops, and its exchange |S|·K: too many for a set this size)."""
    start = S
    for f in reversed([c for c in prior if c in S]):
        if se.out_of_budget():
            break
        if se.meets(S - {f}):
            S = S - {f}
    if S != start:
        step("eliminate", S, remove=sorted(start - S, key=rank.get))
    return S


def _greedy_move(se: _Search, S: frozenset, moves: list[frozenset], order: dict) -> frozenset:
    """The next greedy move: of those meeting the budget the fewest new layers, then the cheapest;
    else the highest gain per new layer, gains within ``tie`` of it by cost."""
    reach = [m for m in moves if se.meets(m)]
    if reach:
        return min(reach, key=lambda m: (len(m), se.cost(m), -se.score(m), order.get(m, 0)))
    cur = se.score(S)
    rate = {m: (se.score(m) - cur) / len(m - S) if math.isfinite(cur) else se.score(m) for m in moves}
    top = max(rate.values())
    near = [m for m in moves if rate[m] >= top - se.tie]
    return min(near, key=lambda m: (se.cost(m), -rate[m], len(m), order.get(m, 0)))


def _pool(S: frozenset, cands, rank, priority, prior, shortlist) -> list[str]:
    """The moves a step measures: all candidates not in S, or with ``shortlist=K`` the K best by
    their last measured score plus K/4 never measured ones in ``prior`` order (all K from
    ``prior`` in the first step)."""
    rest = [c for c in cands if c not in S]
    if shortlist is None:
        return rest
    k = max(1, shortlist)
    measured = sorted((c for c in rest if c in priority), key=lambda c: (-priority[c], rank[c]))[:k]
    fresh = [c for c in prior if c not in S and c not in priority][:max(1, k // 4) if measured else k]
    return measured + fresh


def _shrink(se: _Search, S: frozenset, cands, rank, priority, prior, shortlist, step) -> frozenset:
    """Prune (drop a float layer) and 2-for-1 exchange while the budget holds."""
    while not se.out_of_budget():
        drops = [S - {f} for f in sorted(S, key=rank.get)]
        ok = [d for d in drops if se.meets(d)]
        if ok:
            nxt = se.best(ok, {d: rank[next(iter(S - d))] for d in ok})
            step("prune", nxt, remove=sorted(S - nxt, key=rank.get))
            S = nxt
            continue
        if len(S) < 2:
            break
        pool = _pool(S, cands, rank, priority, prior, shortlist)
        gain = {f: se.score(S) - se.score(S - {f}) for f in S}           # measured by the prune step
        pairs = sorted(itertools.combinations(sorted(S, key=rank.get), 2), key=lambda p: gain[p[0]] + gain[p[1]])
        cap, ok, tried = len(pool) * len(S), [], 0                       # one greedy step per float layer
        for f1, f2 in pairs:
            for c in pool:
                swap = S - {f1, f2} | {c}
                tried += 1
                if se.meets(swap):
                    ok.append(swap)
                if tried >= cap or (ok and se._cost is None) or se.out_of_budget():
                    break
            if tried >= cap or (ok and se._cost is None) or se.out_of_budget():
                break
        if not ok:
            break
        nxt = se.best(ok, {s: sum(rank[c] for c in s) for s in ok})
        step("exchange 2-for-1", nxt, remove=sorted(S - nxt, key=rank.get), add=sorted(nxt - S, key=rank.get))
        S = nxt
    return S


def _cheaper(se: _Search, S: frozenset, cands, rank, priority, prior, shortlist, step) -> frozenset:
    """Same-size swaps that keep the budget and lower the cost, until none does."""
    seen = {S}
    while not se.out_of_budget():
        pool = _pool(S, cands, rank, priority, prior, shortlist)
        swaps = [S - {f} | {c} for f in sorted(S, key=rank.get) for c in pool]
        ok = [s for s in swaps if s not in seen and se.cost(s) < se.cost(S) and se.meets(s)]
        if not ok:
            break
        nxt = se.best(ok, {s: sum(rank[c] for c in s) for s in ok})
        seen.add(nxt)
        step("swap (cost)", nxt, remove=sorted(S - nxt, key=rank.get), add=sorted(nxt - S, key=rank.get))
        S = _shrink(se, nxt, cands, rank, priority, prior, shortlist, step)
    return S


class Bootstrap:
    """Percentile-bootstrap lower confidence bounds of dataset metrics over n samples (Efron &
    Tibshirani, An Introduction to the Bootstrap, 1993, ch. 13), with ONE fixed set of resamples:
    ``weights[b, i]`` = how often sample i is drawn in resample b (multinomial(n, 1/n), seed fixed),
    shared by every layer set, so a bound is a deterministic function of the set and two sets are
    compared on the same resamples (common random numbers). See the module docstring."""

    def __init__(self, n: int, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0):
        if n < 1:
            raise ValueError("the bootstrap needs at least one sample")
        self.n, self.level, self.resamples = n, level, resamples
        rng = np.random.default_rng(seed)
        self.weights = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)

    def sqnr_db(self, signal: np.ndarray, noise: np.ndarray) -> float:
        """The ``level`` quantile over resamples of 10 log10(Σ w signal / Σ w noise): the SQNR the
        dataset reaches with probability 1 - level (one-sided)."""
        s, e = self.weights @ np.asarray(signal, np.float64), self.weights @ np.asarray(noise, np.float64)
        db = np.full(len(s), math.inf)
        with np.errstate(divide="ignore"):
            db[e > 0] = 10 * np.log10(s[e > 0] / e[e > 0])
        return float(np.quantile(db, self.level, method="inverted_cdf"))

    def accuracy_drop(self, fp32_correct: np.ndarray, correct: np.ndarray) -> float:
        """The ``1 - level`` quantile over resamples of the top-1 accuracy drop in points,
        100 Σ w (fp32_correct - correct) / n: a drop not exceeded with probability 1 - level."""
        d = 100.0 * (self.weights @ (np.asarray(fp32_correct, np.float64) - np.asarray(correct, np.float64))) / self.n
        return float(np.quantile(d, 1.0 - self.level, method="inverted_cdf"))


def brute_force(evaluate: Evaluate, candidates: Iterable[str], budget: float,
                cost: Cost | None = None) -> frozenset | None:
    """The smallest set meeting the budget (then the cheapest, then the best score) by trying every
    subset in order of size: 2^n evaluations, for tests on small models. None: unreachable."""
    cands = list(candidates)
    for k in range(len(cands) + 1):
        ok = [frozenset(s) for s in itertools.combinations(cands, k) if evaluate(frozenset(s)) >= budget]
        if ok:
            return min(ok, key=lambda s: ((cost(s) if cost else 0.0), -evaluate(s)))
    return None
