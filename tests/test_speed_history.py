"""The throughput's ± against the runs before it: the eight TADM‡ / ADLM figures docs/history.md
records for the AMD machine (each one invocation of the single-process design) are tested for
consistency with the committed run's spread between invocations (its timing blocks, each its own
process) by Cochran's Q, and docs/history.md states that test's Q, df, p and verdict as computed
here. Everything is read as committed (tests/committed.py)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
from scipy.stats import chi2

from tests.committed import read_text as read_committed

# docs/history.md's TADM‡ / ADLM figures of the single-process throughput stage on the AMD EPYC,
# in the order it gives them (each "x.xxx ± y.yyx" appears there as written)
HISTORY = ((1.83, 0.08), (2.03, 0.06), (1.62, 0.05), (1.59, 0.07), (1.78, 0.10), (1.86, 0.06), (1.86, 0.09),
           (1.97, 0.14))
ALPHA = 0.05  # the claims' level (claims.z 1.96, two-sided)


def _committed_entry() -> dict:
    """The committed run's TADM‡ / ADLM comparison at the claim's budget (T = L): its blocks."""
    inputs = json.loads(read_committed("paper_figures/claims_inputs.json"))
    result, L = inputs["throughput"], inputs["params"]["sample"]["canvas_length"]
    return result["budgets"][str(L)]["rows"]["tadm"]["vs"]["adlm"]


def history_test() -> tuple[float, int, float, float]:
    """(Q, df, p, sd): the history's log ratios about their mean, each with the sd of one
    invocation's log ratio that the committed run shows -- its blocks' sample sd, never below
    their within-block sd (the rule of tadm.metrics.invocations)."""
    entry = _committed_entry()
    sd = math.sqrt(max(float(np.var(np.log(entry["blocks"]), ddof=1)), entry["within_sd"] ** 2))
    y = np.log([r for r, _ in HISTORY])
    q = float(np.sum((y - y.mean()) ** 2) / sd ** 2)
    df = len(HISTORY) - 1
    return q, df, float(chi2.sf(q, df)), sd


def test_the_history_figures_are_the_ones_docs_history_records():
    text = read_committed("docs/history.md")
    for r, se in HISTORY:
        assert f"{r:.2f}x ± {se:.2f}x" in text, (r, se)


def test_docs_state_the_history_test_as_computed():
    q, df, p, sd = history_test()
    verdict = "consistent" if p >= ALPHA else "not consistent"
    text = " ".join(read_committed("docs/history.md").split())
    m = re.search(r"Cochran's Q = ([\d.]+) on (\d+) df, p = ([\d.e+-]+): (consistent|not consistent) "
                  r"with a between-invocation sd of ([\d.]+) on the log scale", text)
    assert m, "docs/history.md does not state the history test"
    assert float(m.group(1)) == round(q, 1) and int(m.group(2)) == df, (m.group(0), q, df)
    assert math.isclose(float(m.group(3)), float(f"{p:.2g}"), rel_tol=1e-9), (m.group(0), p)
    assert m.group(4) == verdict and float(m.group(5)) == round(sd, 3), (m.group(0), verdict, sd)
