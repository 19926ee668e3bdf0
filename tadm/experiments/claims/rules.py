"""The verdict rules: the power rule that marks a finding underpowered before its effect is read,
the one-sided tests that decide a finding (direction, equivalence, non-inferiority), Holm's
adjustment within a family of findings declared in the catalog, the conditions a "reproduced"
needs besides its test (a speed-up's size against its FLOP bound, the sweep's compute), the exact
test of an implementation check, and each finding's sensitivity (its minimum detectable effect and
the n that would detect the paper's effect). Pure functions of the numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from tadm.config import Params
from tadm.experiments.claims.claim import (CONTRADICTED, DIRECTION, EQUIVALENCE, FAIL, INCONCLUSIVE, NON_INFERIORITY,
                                           NOT_RUN, NOT_TESTABLE, PASS, REPRODUCED, UNDERPOWERED, Claim)
from tadm.metrics.replicates import critical, runs_needed


def _cdf(x: float, df: float | None) -> float:
    if df is None or not math.isfinite(df):
        return NormalDist().cdf(x)
    from scipy.stats import t  # lazy: scipy.stats takes ~1 s to import; only a t-based rule needs it

    return float(t.cdf(x, df))


def _ppf(q: float, df: float | None) -> float:
    if df is None or not math.isfinite(df):
        return NormalDist().inv_cdf(q)
    if df < 1:
        return math.inf
    from scipy.stats import t  # lazy: scipy.stats takes ~1 s to import; only a t-based rule needs it

    return float(t.ppf(q, df))


@dataclass(frozen=True)
class Rules:
    z: float = 2.0
    equivalence_level: float = 0.90
    power: float = 0.8
    family_rule: str = "holm"
    power_rule: str = "mde"
    speed_bound_lo: float = 0.85
    speed_bound_hi: float = 1.25

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

    def power_quantile(self, kind: str, df: float | None = None) -> float:
        """The quantile that power adds to the critical value: t (or z) at `power` for one
        one-sided test; at (1 + power) / 2 for equivalence, whose two one-sided tests must both
        reject (a true difference of 0 sits at distance margin from each side)."""
        return _ppf((1 + self.power) / 2 if kind == EQUIVALENCE else self.power, df)

    @classmethod
    def of(cls, p: Params) -> "Rules":
        c = p.claims
        return cls(c.z, c.equivalence_level, c.power, c.family_rule, c.power_rule, c.speed_bound_lo, c.speed_bound_hi)


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


def holm(ps: list[float], m: int | None = None) -> list[float]:
    """Holm's step-down adjusted p-values (in the input's order) in a family of `m` hypotheses
    (default: len(ps)); members not tested (m > len(ps)) count as p = 1, so the family's size is
    the declared one whatever a precondition or the power rule removed."""
    k = len(ps)
    m = k if m is None else max(m, k)
    out, running = [1.0] * k, 0.0
    for rank, i in enumerate(sorted(range(k), key=ps.__getitem__)):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def families(cs: list[Claim]) -> dict[str, list[Claim]]:
    """The findings grouped by their declared family (`Entry.family`); a finding with none is a
    family of its own ("alone: <id>")."""
    out: dict[str, list[Claim]] = {}
    for c in cs:
        out.setdefault(c.family or f"alone: {c.id}", []).append(c)
    return out


def target(c: Claim) -> tuple[float, str] | None:
    """What the power rule holds the minimum detectable effect against, and its name: the margin
    (equivalence); the margin plus the paper's improvement (non-inferiority); the paper's effect,
    else the metric's smallest effect of interest, its margin (direction; none: never underpowered)."""
    if c.kind == EQUIVALENCE and usable(c.margin):
        return c.margin, "the equivalence margin"
    if c.kind == NON_INFERIORITY and usable(c.margin):
        gain = max(c.paper_value or 0.0, 0.0)
        return c.margin + gain, "the margin plus the paper's improvement" if gain else "the margin"
    if c.kind == DIRECTION:
        if c.paper_value is not None and abs(c.paper_value) > 0:
            return abs(c.paper_value), "the paper's effect"
        smallest = c.extra.get("smallest_effect")
        if usable(smallest):
            return smallest, "the smallest effect of interest (the metric's margin)"
    return None


def underpowered(c: Claim, rules: Rules) -> bool:
    """The power rule (claims.power_rule "mde"), read from the se alone: the minimum detectable
    effect at this run's n exceeds the finding's `target`."""
    t, m = target(c), mde(c, rules)
    return rules.power_rule == "mde" and t is not None and m is not None and m > t[0]


def decide(cs: list[Claim], rules: Rules) -> None:
    """Every finding's verdict. In order: not run (no effect), not testable (a precondition failed:
    set before), underpowered (the power rule, from the se alone), then the tests: each side's
    p-values Holm-adjusted within the finding's declared family (claims.family_rule), m the
    family's declared size; a "reproduced" then needs every condition of the finding (e.g. a
    speed-up's measured / FLOP bound inside claims.speed_bound_*), else the condition's verdict."""
    declared = {name: len(group) for name, group in families([c for c in cs if c.finding]).items()}
    live = []
    for c in cs:
        if not c.finding or c.verdict == NOT_TESTABLE:
            continue
        if not usable(c.value):
            c.verdict = NOT_RUN
        elif not usable(c.se):
            c.verdict = INCONCLUSIVE
        else:
            if underpowered(c, rules):
                c.verdict = UNDERPOWERED
            else:
                live.append(c)
            # p-values for the record (an underpowered finding's are shown, not used)
            r0, k0 = p_values(c.kind, c.value, c.se, c.margin, c.df)
            c.extra.update(p_reproduced=r0, p_contradicted=k0)
    for name, group in families(live).items():
        raw = [p_values(c.kind, c.value, c.se, c.margin, c.df) for c in group]
        m = declared.get(name, len(group))
        if rules.family_rule == "holm" and m > 1:
            rep, con = holm([r for r, _ in raw], m), holm([k for _, k in raw], m)
        else:
            rep, con = [r for r, _ in raw], [k for _, k in raw]
        for c, r, k in zip(group, rep, con):
            a = rules.alpha(c.kind)
            c.verdict = REPRODUCED if r <= a else CONTRADICTED if k <= a else INCONCLUSIVE
            c.extra.update(p_reproduced_adjusted=r, p_contradicted_adjusted=k)
            for what, met, otherwise in c.conditions:  # an unmet counted fact contradicts whatever the test says
                if not met and (c.verdict == REPRODUCED or otherwise == CONTRADICTED):
                    c.verdict = otherwise
                    c.notes = (c.notes + "; " if c.notes else "") + f"{otherwise}: {what}"
                    break
    for c in cs:
        if c.finding:
            name = c.family or f"alone: {c.id}"
            c.extra.update(family=name, family_size=declared.get(name, 1))


def paper_position(value: float, se: float | None, lo: float, hi: float | None = None, rules: Rules = Rules(),
                   df: float | None = None) -> str:
    """Where the paper's figure (or range lo..hi) lies against this run's interval value +- crit se,
    saying which interval lies inside which."""
    hi = lo if hi is None else hi
    if not usable(se):
        return "no interval"
    c = rules.crit(DIRECTION, df)
    a, b = value - c * se, value + c * se
    run = f"this run's interval [{a:.2f}, {b:.2f}]"
    paper = f"the paper's {'figure' if hi == lo else 'range'}"
    if hi < a:
        return f"{paper} lies below {run}"
    if lo > b:
        return f"{paper} lies above {run}"
    if a <= lo and hi <= b:
        return f"{paper} lies inside {run}"
    if lo <= a and b <= hi:
        return f"{run} lies inside {paper}"
    return f"{run} overlaps {paper} in part"


def exact(value: float | None, expected: float | None, rel: float = 1e-9) -> str:
    """An implementation check: a counted quantity equals its design value."""
    if value is None or expected is None:
        return NOT_RUN
    return PASS if abs(value - expected) <= rel * max(1.0, abs(expected)) else FAIL


def mde(c: Claim, rules: Rules) -> float | None:
    """The smallest effect (direction), margin (equivalence) or margin plus improvement
    (non-inferiority) this run detects with probability `rules.power`, the finding alone:
    (crit + power quantile) se at the se's df (`Rules.power_quantile`)."""
    if not c.finding or not usable(c.se):
        return None
    return (rules.crit(c.kind, c.df) + rules.power_quantile(c.kind, c.df)) * c.se


def _target(c: Claim) -> float | None:
    """The paper's effect as a detection target: its size (direction), its distance from the
    margin (equivalence), the margin plus it (non-inferiority: the improvement the paper reports
    over the margin's floor)."""
    if c.paper_value is None:
        return None
    target = abs(c.paper_value)
    if c.kind == EQUIVALENCE:
        if c.margin is None or c.margin <= abs(c.paper_value):
            return None
        target = c.margin - abs(c.paper_value)
    elif c.kind == NON_INFERIORITY:
        if c.margin is None:
            return None
        target = c.margin + c.paper_value
    return target if target > 0 else None


def n_for_paper(c: Claim, rules: Rules) -> tuple[int, str] | None:
    """(n, unit) at which the paper's effect would be detected with `rules.power`: samples (the
    within-run part of se shrinking as 1 / sqrt(n), the training term fixed) while that can get
    there, else training runs per arm (`runs_needed`: the between-run and the within-run terms both
    shrinking with the runs, the df growing with them)."""
    m, target = mde(c, rules), _target(c)
    if m is None or c.n is None or target is None:
        return None
    factor = rules.crit(c.kind, c.df) + rules.power_quantile(c.kind, c.df)
    need = (target / factor) ** 2  # the se^2 that detects the target
    train = 0.0
    if c.training is not None and c.training_arms is not None:
        na, nb = c.training_arms
        train = c.training.var_between * ((1 / na if na else 0) + (1 / nb if nb else 0))
    within = c.se ** 2 - train
    if train >= need:
        na, nb = c.training_arms
        runs = runs_needed(c.training, target, rules.z if c.kind == DIRECTION else rules.z_level,
                           (1 + rules.power) / 2 if c.kind == EQUIVALENCE else rules.power,
                           within_one_run=max(within, 0.0) * max(na, nb), trained_arms=(na > 0) + (nb > 0))
        return (runs, "training runs per arm") if runs else None
    if within <= 0:
        return None
    return max(1, math.ceil(c.n * within / (need - train))), c.n_unit
