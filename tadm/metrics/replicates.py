"""Uncertainty over training runs: a between-run variance pooled from training replicates.

A quality cell of a trained model (MAUVE, Gen PPL, accuracy) moves between training runs of the
same recipe by more than a bootstrap over its samples shows. The pipeline therefore trains the
models that a finding compares several times (seeds seed, seed + 1, ...; ``train.replicates``,
``posttrain.replicates``) and estimates that variation from them, as a one-way random-effects
model: run k of arm a (one model recipe) gives

    y_ak = mu_a + t_ak + e_ak,    t_ak ~ (0, s_between^2)  the training run,
                                   e_ak ~ (0, w_ak)         the within-run (sampling) noise,

with one s_between^2 for every arm (pooled: the recipes differ in their means, not in how much a
seed moves them; with 3 runs an arm alone would give 2 degrees of freedom).

- :func:`pooled_between` estimates it: s_p^2 = sum_a sum_k (y_ak - mean_a)^2 / sum_a (n_a - 1),
  the pooled variance of per-run values, on df = sum_a (n_a - 1) degrees of freedom, and
  s_between^2 = max(0, s_p^2 - mean(w)) (the per-run values' spread includes each run's own
  sampling noise). Without within-run variances (None) nothing is subtracted: the estimate then
  also carries the sampling noise, the conservative side.
- :func:`replicated_difference` gives a finding's effect mean(y_a) - mean(y_b) over the runs and
  its se, sqrt(s_between^2 (1/n_a + 1/n_b) + v_within), v_within being the within-run variance of
  that difference of means (e.g. the paired bootstraps' variances of per-run differences, summed
  and divided by n^2). An arm that is not trained (a frozen base) has n = inf: no training term.
- :func:`critical` is the two-sided critical value a rule's z stands for, at df degrees of
  freedom (Student's t; the normal's z when df is None or infinite).

Example::

    >>> pool = pooled_between([[0.62, 0.55, 0.60], [0.41, 0.47, 0.44]])
    >>> pool.df
    4
    >>> diff, se = replicated_difference([0.62, 0.55, 0.60], [0.41, 0.47, 0.44], 0.0, pool)
    >>> round(diff, 3)
    0.15
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

from tadm.metrics.bootstrap import mean_se


@dataclass(frozen=True)
class Pooled:
    """A between-run variance estimated from replicates pooled over arms."""

    var_between: float  # s_between^2 (>= 0)
    var_runs: float  # s_p^2: the pooled variance of per-run values
    var_within: float  # the mean within-run variance subtracted from it (0: none given)
    df: int  # sum over arms of (runs - 1)
    runs: int  # runs in all

    @property
    def sd_between(self) -> float:
        return math.sqrt(self.var_between)


def pooled_between(runs: Sequence[Sequence[float]], within_var: Sequence[Sequence[float]] | None = None) -> Pooled:
    """The between-run variance of arms' per-run values `runs[a][k]` (an arm with one run adds
    nothing but is allowed), `within_var[a][k]` each run's within-run variance (None: 0).
    ValueError when no arm has two finite runs."""
    ss, df, n, w = 0.0, 0, 0, []
    for a, values in enumerate(runs):
        v = [float(x) for x in values]
        if not all(math.isfinite(x) for x in v):
            raise ValueError(f"pooled_between: arm {a} has a non-finite run value {v}")
        n += len(v)
        if len(v) >= 2:
            m = sum(v) / len(v)
            ss += sum((x - m) ** 2 for x in v)
            df += len(v) - 1
        if within_var is not None:
            w += [float(x) for x in within_var[a]]
    if df < 1:
        raise ValueError("pooled_between: no arm has two runs (no between-run variance can be estimated)")
    var_runs = ss / df
    mean_w = sum(w) / len(w) if w else 0.0
    return Pooled(max(0.0, var_runs - mean_w), var_runs, mean_w, df, n)


def replicated_difference(a: Sequence[float], b: Sequence[float] | float, var_within: float, pooled: Pooled,
                          b_trained: bool = True) -> tuple[float, float]:
    """mean(a) - mean(b) over training runs and its se: the pooled between-run variance times
    (1/n_a + 1/n_b) plus `var_within`, the within-run variance of that difference of means.
    `b` a single number (or `b_trained` False): a reference that is not trained (no training term)."""
    a = [float(x) for x in a]
    bs = [float(b)] if isinstance(b, (int, float)) else [float(x) for x in b]
    if not a or not bs:
        raise ValueError("replicated_difference: an arm has no runs")
    diff = sum(a) / len(a) - sum(bs) / len(bs)
    inv_b = 1.0 / len(bs) if (b_trained and not isinstance(b, (int, float))) else 0.0
    var = pooled.var_between * (1.0 / len(a) + inv_b) + max(0.0, var_within)
    return diff, math.sqrt(var)


def replicated_accuracy_delta(a_runs: Sequence, ref_runs: Sequence, pooled: Pooled | None, ref_trained: bool,
                              B: int = 1000, seed: int = 0xB007, a_trained: bool = True) -> tuple[float, float]:
    """Accuracy of arm a minus the reference's, in points, over training runs: each run a
    (sampling seeds x examples) 0/1 matrix on the same examples. The effect is the per-example
    difference of the means over runs and seeds, averaged over examples; its se combines the
    example bootstrap of those per-example differences (`bootstrap.mean_se`: which examples were
    asked, the decoding noise) with the pooled between-run variance (points^2) times 1/n_a for a
    trained arm (`a_trained`) plus 1/n_ref for a trained reference (`pooled` None: no training term)."""
    a = np.stack([np.asarray(r, np.float64) for r in a_runs])  # (runs, seeds, examples)
    b = np.stack([np.asarray(r, np.float64) for r in ref_runs])
    if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[2] or not a.size:
        raise ValueError(f"replicated_accuracy_delta: runs of shape {a.shape[1:]} against {b.shape[1:]} "
                         "(seeds x examples, the same examples)")
    diffs = 100.0 * (a.mean((0, 1)) - b.mean((0, 1)))
    within = mean_se(diffs, B, seed) ** 2 if len(diffs) > 1 else float("nan")
    train = 0.0 if pooled is None else pooled.var_between * ((1.0 / len(a) if a_trained else 0.0)
                                                             + (1.0 / len(b) if ref_trained else 0.0))
    return float(diffs.mean()), math.sqrt(within + train)


def critical(z: float, df: int | float | None) -> float:
    """The critical value at the two-sided level of `z` (z = 2: 95.45 %) with `df` degrees of
    freedom: Student's t quantile (scipy), or `z` itself for df None / inf."""
    if df is None or not math.isfinite(df):
        return z
    if df < 1:
        return math.inf
    from scipy.stats import t  # lazy: scipy.stats takes ~1 s to import; only a t quantile needs it

    return float(t.ppf(NormalDist().cdf(z), df))


def runs_needed(pooled: Pooled, target: float, z: float, power: float, *, within_one_run: float = 0.0,
                trained_arms: int = 2, limit: int = 1_000_000) -> int | None:
    """Training runs per arm at which a difference of `target` would be detected with probability
    `power`: the smallest n with (crit(z, df_n) + t_power(df_n)) se_n <= target, where
    se_n^2 = (s_between^2 trained_arms + within_one_run) / n (each arm's n runs drawn as now:
    `within_one_run` is the within-run variance of one run's difference) and df_n = r (n - 1) for
    the r rows the between-run variance is pooled over (pooled.runs - pooled.df). None when there is
    no between-run variance or no target, or beyond `limit`."""
    if pooled.var_between <= 0 or target <= 0:
        return None
    rows = max(1, pooled.runs - pooled.df)
    per_run = pooled.var_between * trained_arms + max(0.0, within_one_run)

    def detects(n: int) -> bool:
        df = rows * (n - 1)
        return (critical(z, df) + _quantile(power, df)) * math.sqrt(per_run / n) <= target

    lo, hi = 2, 2
    while not detects(hi):  # doubling, then bisection: detects() is monotone in n
        lo, hi = hi + 1, hi * 2
        if hi > limit:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if detects(mid) else (mid + 1, hi)
    return hi


def _quantile(q: float, df: int | float | None) -> float:
    """Student's t quantile at `df` (the normal's for None / inf)."""
    if df is None or not math.isfinite(df):
        return NormalDist().inv_cdf(q)
    from scipy.stats import t  # lazy: scipy.stats takes ~1 s to import; only a t quantile needs it

    return float(t.ppf(q, df))


__all__ = ["Pooled", "pooled_between", "replicated_difference", "replicated_accuracy_delta",
           "critical", "runs_needed"]
