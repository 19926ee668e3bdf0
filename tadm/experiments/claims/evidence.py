"""The evidence behind the claims: one evaluator per shape of evidence, registered by its name
(`EVIDENCE`), which a catalog entry (`Entry.evidence`) names. `measure` makes an entry's `Claim`
and hands it to its evaluator, which fills in this run's figure (value, se, df, shown, n, covers,
notes; a check's verdict) from the `Inputs`; findings are decided afterwards, all together
(`rules.decide`). The evaluators live in `evidence_pretrain` (Table 2, the refresh sweep, the
staleness measurements) and `evidence_posttrain` (Table 1), which `catalog` imports."""

from __future__ import annotations

import math
from collections.abc import Callable

from tadm.experiments.claims.claim import DIRECTION, EQUIVALENCE, INCONCLUSIVE, NON_INFERIORITY, Claim, Entry
from tadm.experiments.claims.inputs import Inputs
from tadm.experiments.claims.rules import Rules, usable
from tadm.experiments.table2 import ROWS

PAPER_L = 1024  # the paper's sequence length: its T = 1024 is L, T = 2048 is 2L


def row_model(row: str) -> str:
    """The trained checkpoint (a run of train.models) Table 2 row `row` samples from, read from
    the rows when asked (a row registered later too); KeyError for the Data row or an unknown one."""
    model = ROWS[row].model
    if model is None:
        raise KeyError(row)
    return model


def short(row: str) -> str:
    """How prose names a Table 2 row (`Row.short`), or the key itself."""
    return ROWS[row].short if row in ROWS else row


# the trained fusion each Table 1 family samples with (the base and the training-free caches: none)


MARGIN = {"mauve": lambda cfg: cfg.margin_mauve, "log_ppl": lambda cfg: math.log(1 + cfg.margin_gen_ppl_rel),
          "accuracy": lambda cfg: cfg.margin_accuracy_pts}


JUDGE = {"mauve": "mauve", "log_ppl": "gen_ppl"}

Evaluator = Callable[[Inputs, Entry, Claim, Rules], None]


EVIDENCE: dict[str, Evaluator] = {}


def evaluator(fn: Evaluator) -> Evaluator:
    """Register `fn` as an evaluator under its own name, the name an `Entry.evidence` gives."""
    EVIDENCE[fn.__name__] = fn
    return fn


def measure(e: Entry, inp: Inputs, rules: Rules) -> Claim:
    """The claim entry `e` declares, its templates filled for this profile, measured by its evaluator."""
    cfg = inp.params.claims
    T = None if e.budget is None else inp.budget(e.budget)

    def text(template: str) -> str:
        return template.format(T=T, claims=cfg, comparator=e.comparator)

    c = Claim(e.id, text(e.claim), e.paper, e.kind, test=text(e.test), source=text(e.source), paper_value=e.paper_value,
              margin=MARGIN[e.metric](cfg) if e.kind in (EQUIVALENCE, NON_INFERIORITY) else None, covers=e.covers,
              n_unit=e.n_unit, rests_on=e.rests_on, judged_by=JUDGE.get(e.metric), family=e.family,
              mechanism=e.mechanism, speed=e.speed, metric=e.metric)
    if e.kind == DIRECTION and e.metric in MARGIN:  # a direction finding's smallest effect of interest
        c.extra["smallest_effect"] = MARGIN[e.metric](cfg)
    EVIDENCE[e.evidence](inp, e, c, rules)
    if e.speed and usable(c.value):
        speed_condition(c, rules, e.paper_bound)
    return c


def speed_condition(c: Claim, rules: Rules, paper_bound: str) -> None:
    """A speed finding's size: reproduced only when measured / FLOP-bound (its evaluator's
    c.extra["measured_over_bound"]) lies in [claims.speed_bound_lo, claims.speed_bound_hi]; the
    paper's own measured / bound at its settings in the notes beside it."""
    mb = c.extra.get("measured_over_bound")
    lo, hi = rules.speed_bound_lo, rules.speed_bound_hi
    if usable(mb):
        c.conditions.append((f"measured / FLOP-bound {mb:.2f} outside [{lo:g}, {hi:g}]", lo <= mb <= hi, INCONCLUSIVE))
    else:
        c.conditions.append(("no FLOP bound counted for this speed-up", False, INCONCLUSIVE))
    if paper_bound:
        c.notes = (c.notes + "; " if c.notes else "") + paper_bound + (
            f" (this run's: {mb:.2f})" if usable(mb) else "")


def fmt(v: float | None, se: float | None = None, digits: int = 3, suffix: str = "") -> str:
    if v is None or not math.isfinite(v):
        return "–"
    if se is None or not math.isfinite(se):
        return f"{v:.{digits}f}{suffix}"
    return f"{v:.{digits}f}{suffix} ± {se:.{digits}f}{suffix}"


def pct(log_ratio: float) -> str:
    return f"{100 * (math.exp(log_ratio) - 1):+.1f} %"


def df_note(c: Claim) -> str:
    return "" if c.df is None else f", t with {c.df:g} df"
