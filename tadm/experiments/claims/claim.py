"""A claim of the paper as the catalog declares it (`Entry`) and as this run measures and decides
it (`Claim`), with the verdicts and rule kinds they carry."""

from __future__ import annotations

from dataclasses import dataclass, field

from tadm.metrics.replicates import Pooled

# findings
REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
UNDERPOWERED = "underpowered at this profile"  # decided by the power rule before the effect is read
NOT_TESTABLE, NOT_RUN = "not testable", "not run at this profile"
FINDING_VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, UNDERPOWERED, NOT_TESTABLE, NOT_RUN)
# implementation checks
PASS, FAIL = "pass", "fail"

CHECK, DIRECTION, EQUIVALENCE, NON_INFERIORITY = "check", "direction", "equivalence", "non-inferiority"


@dataclass(frozen=True)
class Entry:
    """One claim of the paper, declared before any number is read: what it says, the paper's
    figure, the rule that decides it and the evidence (an evaluator of `evidence.EVIDENCE`, by
    name) that measures this run's figure. `claim`, `test` and `source` are format templates:
    ``{T}`` is this profile's budget T = budget x L, ``{claims.<name>}`` a value of params
    ``claims``, ``{comparator}`` the training-free cache of a per-comparator entry (literal braces
    doubled)."""

    id: str
    claim: str
    paper: str  # the paper's figure, as the paper states it
    evidence: str  # the evaluator that measures it
    kind: str = DIRECTION  # check | direction | equivalence | non-inferiority
    metric: str | None = None  # mauve | log_ppl | accuracy: its margin (claims.margin_*) and its judge
    rows: tuple[str, ...] = ()  # the compared rows, rows[0] against rows[1] (Table 2 rows, Table 1 families)
    budget: int | None = None  # T = budget x L (the paper's T = 1024 = L: 1, T = 2048 = 2L: 2)
    refresh: int | None = None  # a claim at one refresh interval K
    sign: int = 1  # -1: the effect runs rows[1] against rows[0]
    paper_value: float | None = None  # the paper's effect, on this run's scale (a check: its design value)
    paper_ratio: tuple[float, ...] = ()  # a speed-up (or its lo, hi range): placed against this run's interval, not judged
    test: str = ""  # the rule, as applied to this claim
    source: str = ""
    covers: str = ""  # the sources of variation the +- covers, where the evidence does not say
    n_unit: str = ""
    rests_on: tuple[str, ...] = ()  # trained checkpoints, where the evidence has no compared rows to name them
    family: str | None = None  # the Holm family it is tested in, declared here (None: alone)
    mechanism: bool = False  # a mechanism check (Sec. 3's staleness), not one of the paper's comparative claims
    speed: bool = False  # a speed finding: judged on its size too (measured / FLOP bound, claims.speed_bound_*)
    # the paper's own measured / bound at its settings, printed beside this run's (speed findings)
    paper_bound: str = ""
    # one finding per training-free cache of params claims.training_free_comparator: the entry is a
    # template (``{comparator}`` in its id, claim, test) that `catalog.entries` expands, each copy
    # naming its cache here
    per_comparator: bool = False
    comparator: str = ""


@dataclass
class Claim:
    id: str
    claim: str
    paper: str  # the paper's figure, as the paper states it
    kind: str = DIRECTION  # check | direction | equivalence | non-inferiority
    value: float | None = None  # this run's effect (None: not run)
    se: float | None = None
    df: float | None = None  # degrees of freedom of se (None: normal)
    shown: str = ""  # this run's figure as text
    test: str = ""  # the rule, as applied to this claim
    verdict: str = NOT_RUN
    source: str = ""
    paper_value: float | None = None  # the paper's effect on the same scale as `value`
    margin: float | None = None  # equivalence / non-inferiority
    covers: str = ""  # the sources of variation the +- covers
    n: int | None = None
    n_unit: str = ""
    notes: str = ""
    rests_on: tuple[str, ...] = ()  # the trained checkpoints the effect depends on (families, quality gates)
    judged_by: str | None = None  # "mauve" | "gen_ppl": the judge's metric (judge gates)
    training: Pooled | None = None  # the between-run variance in se (None: none)
    training_arms: tuple[int, int] | None = None  # training runs per side behind value (n_a, n_b; 0: not trained)
    family: str | None = None  # its declared Holm family (None: alone)
    mechanism: bool = False
    speed: bool = False
    metric: str | None = None  # mauve | log_ppl | accuracy | None
    # conditions a "reproduced" needs besides the test: (what, met, the verdict when not met)
    conditions: list[tuple[str, bool, str]] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def finding(self) -> bool:
        """Tested (a paper claim or a mechanism check), not an implementation check."""
        return self.kind != CHECK

    @property
    def paper_claim(self) -> bool:
        """One of the paper's comparative claims (counted in the tally)."""
        return self.finding and not self.mechanism
