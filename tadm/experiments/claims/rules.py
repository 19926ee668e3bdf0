"""The verdict rules: the one-sided tests that decide a finding (direction, equivalence,
non-inferiority), Holm's adjustment within a family of findings that share a trained checkpoint,
the exact test of an implementation check, and each finding's sensitivity (its minimum detectable
effect and the n that would detect the paper's effect). Pure functions of the numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from tadm.config import Params
from tadm.experiments.claims.claim import (CONTRADICTED, DIRECTION, EQUIVALENCE, FAIL, INCONCLUSIVE, NON_INFERIORITY,
                                           NOT_RUN, NOT_TESTABLE, PASS, REPRODUCED, Claim)
from tadm.metrics.replicates import critical, runs_needed


def _cdf(x: float, df: float | None) -> float:
    if df is None or not math.isfinite(df):
        return NormalDist().cdf(x)
    from scipy.stats import t

    return float(t.cdf(x, df))


@dataclass(frozen=True)
class Rules:
    z: float = 2.0
    equivalence_level: float = 0.90
    power: float = 0.8
    family_rule: str = "holm"

    @property
    def z_level(self) -> float:
        """The normal quantile of the equivalence interval (1.645 at 90 %)."""
        return NormalDist().inv_cdf(0.5 + self.equivalence_level / 2)

    @property
    def z_power(self) -> float:
        return NormalDist().inv_cdf(self.power)

    def alpha(self, kind: str) -> float:
        """Each one-sided test's level: 1 - Phi(z) for direction (0.0228 at z = 2), (1 - level) / 2
        for equivalence and non-inferiority (0.05 at 90 %)."""
        return 1 - NormalDist().cdf(self.z) if kind == DIRECTION else (1 - self.equivalence_level) / 2

    def crit(self, kind: str, df: float | None = None) -> float:
        """The critical value of one finding alone at `df` degrees of freedom."""
        return critical(self.z if kind == DIRECTION else self.z_level, df)

    @classmethod
    def of(cls, p: Params) -> "Rules":
        c = p.claims
        return cls(c.z, c.equivalence_level, c.power, c.family_rule)


def usable(x: float | None) -> bool:
    """A number to test: neither missing nor nan / inf."""
    return x is not None and math.isfinite(x)


def p_values(kind: str, value: float, se: float, margin: float | None = None,
             df: float | None = None) -> tuple[float, float]:
    """(p of "reproduced", p of "contradicted"): the one-sided tests whose rejection gives each."""
    F = lambda x: _cdf(x, df)  # noqa: E731
    if se <= 0:
        se = 1e-300
    if kind == DIRECTION:
        return 1 - F(value / se), F(value / se)
    if kind == EQUIVALENCE:  # inside: diff > -m and diff < m; outside: diff > m or diff < -m
        lo, hi = (value + margin) / se, (value - margin) / se
        return max(1 - F(lo), F(hi)), min(1 - F(hi), F(lo))
    if kind == NON_INFERIORITY:  # improvement > -m
        x = (value + margin) / se
        return 1 - F(x), F(x)
    raise ValueError(f"p_values: no test for {kind!r}")


def _decide(kind: str, value, se, margin=None, rules: Rules = Rules(), df=None) -> str:
    if not usable(value):
        return NOT_RUN
    if not usable(se):
        return INCONCLUSIVE
    rep, con = p_values(kind, value, se, margin, df)
    a = rules.alpha(kind)
    return REPRODUCED if rep <= a else CONTRADICTED if con <= a else INCONCLUSIVE


def direction(effect: float | None, se: float | None, rules: Rules = Rules(), df: float | None = None) -> str:
    """`effect` > 0 is the paper's direction (one finding alone)."""
    return _decide(DIRECTION, effect, se, None, rules, df)


def equivalence(diff: float | None, se: float | None, margin: float, rules: Rules = Rules(),
                df: float | None = None) -> str:
    """Two one-sided tests: the equivalence_level interval of `diff` against +-`margin`."""
    return _decide(EQUIVALENCE, diff, se, margin, rules, df)


def non_inferiority(improvement: float | None, se: float | None, margin: float, rules: Rules = Rules(),
                    df: float | None = None) -> str:
    """`improvement` > 0 is better; the claim is "not worse by more than `margin`"."""
    return _decide(NON_INFERIORITY, improvement, se, margin, rules, df)


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (in the input's order)."""
    m = len(ps)
    out, running = [1.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=ps.__getitem__)):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def families(cs: list[Claim]) -> dict[str, list[Claim]]:
    """The testable findings grouped by shared trained checkpoints (connected components of
    `rests_on`); a finding resting on none is a family of its own."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for c in cs:
        for m in c.rests_on[1:]:
            parent[find(m)] = find(c.rests_on[0])
    out: dict[str, list[Claim]] = {}
    for c in cs:
        key = f"checkpoints {find(c.rests_on[0])}" if c.rests_on else f"alone: {c.id}"
        out.setdefault(key, []).append(c)
    return {("checkpoints " + ", ".join(sorted({m for c in g for m in c.rests_on})) if k.startswith("checkpoints")
             else k): g for k, g in out.items()}


def decide(cs: list[Claim], rules: Rules) -> None:
    """Every testable finding's verdict from its p-values, Holm-adjusted within its family
    (claims.family_rule); not testable / not run stay as they are."""
    live = [c for c in cs if c.finding and c.verdict not in (NOT_TESTABLE,) and usable(c.value)]
    for c in cs:
        if c.finding and c.verdict != NOT_TESTABLE and not usable(c.value):
            c.verdict = NOT_RUN
    for c in live:
        if not usable(c.se):
            c.verdict = INCONCLUSIVE
    live = [c for c in live if usable(c.se)]
    for name, group in families(live).items():
        raw = [p_values(c.kind, c.value, c.se, c.margin, c.df) for c in group]
        if rules.family_rule == "holm" and len(group) > 1:
            rep, con = holm([r for r, _ in raw]), holm([k for _, k in raw])
        else:
            rep, con = [r for r, _ in raw], [k for _, k in raw]
        for c, (r0, k0), r, k in zip(group, raw, rep, con):
            a = rules.alpha(c.kind)
            c.verdict = REPRODUCED if r <= a else CONTRADICTED if k <= a else INCONCLUSIVE
            c.extra.update(family=name, family_size=len(group), p_reproduced=r0, p_contradicted=k0,
                           p_reproduced_adjusted=r, p_contradicted_adjusted=k)


def paper_position(value: float, se: float | None, lo: float, hi: float | None = None, rules: Rules = Rules(),
                   df: float | None = None) -> str:
    """Where the paper's figure (or range lo..hi) lies against this run's interval value +- crit se."""
    hi = lo if hi is None else hi
    if not usable(se):
        return "no interval"
    c = rules.crit(DIRECTION, df)
    a, b = value - c * se, value + c * se
    if hi < a:
        return "below this run's interval"
    if lo > b:
        return "above this run's interval"
    return "inside this run's interval"


def exact(value: float | None, expected: float | None, rel: float = 1e-9) -> str:
    """An implementation check: a counted quantity equals its design value."""
    if value is None or expected is None:
        return NOT_RUN
    return PASS if abs(value - expected) <= rel * max(1.0, abs(expected)) else FAIL


def mde(c: Claim, rules: Rules) -> float | None:
    """The smallest effect (direction) or margin (equivalence, non-inferiority) this run detects
    with probability `rules.power`, the finding alone."""
    if not c.finding or not usable(c.se):
        return None
    return (rules.crit(c.kind, c.df) + rules.z_power) * c.se


def _target(c: Claim) -> float | None:
    """The paper's effect as a detection target (equivalence: its distance from the margin)."""
    if c.paper_value is None:
        return None
    target = abs(c.paper_value)
    if c.kind in (EQUIVALENCE, NON_INFERIORITY):
        if c.margin is None or c.margin <= abs(c.paper_value):
            return None
        target = c.margin - abs(c.paper_value)
    return target if target > 0 else None


def n_for_paper(c: Claim, rules: Rules) -> tuple[int, str] | None:
    """(n, unit) at which the paper's effect would be detected with `rules.power`: samples (the
    within-run part of se shrinking as 1 / sqrt(n), the training term fixed) while that can get
    there, else training runs per arm (the sampling term taken to 0)."""
    m, target = mde(c, rules), _target(c)
    if m is None or c.n is None or target is None:
        return None
    factor = rules.crit(c.kind, c.df) + rules.z_power
    need = (target / factor) ** 2  # the se^2 that detects the target
    train = 0.0
    if c.training is not None and c.training_arms is not None:
        na, nb = c.training_arms
        train = c.training.var_between * ((1 / na if na else 0) + (1 / nb if nb else 0))
    within = c.se ** 2 - train
    if train >= need:
        runs = runs_needed(c.training, target, rules.z if c.kind == DIRECTION else rules.z_level, rules.z_power, c.df)
        return (runs, "training runs per arm") if runs else None
    if within <= 0:
        return None
    return max(1, math.ceil(c.n * within / (need - train))), c.n_unit

