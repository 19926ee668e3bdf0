"""Speed ratios across timing blocks (tadm.metrics.invocations): the mean log ratio, its se on
B - 1 df from the blocks' spread and never below their within-block se, the within / between
parts and Cochran's Q, against closed forms."""

import math

import numpy as np
import pytest
from scipy.stats import chi2

from tadm.metrics.invocations import cochran_q, combine


def test_blocks_that_disagree_beyond_their_rounds_give_the_between_block_se():
    r = combine([1.5, 2.0, 2.5], [0.01, 0.01, 0.01])
    y = np.log([1.5, 2.0, 2.5])
    assert r["ratio"] == pytest.approx(math.exp(y.mean())) and r["df"] == 2
    assert r["log_se"] == pytest.approx(y.std(ddof=1) / math.sqrt(3))
    assert r["se"] == pytest.approx(r["ratio"] * r["log_se"])
    within = math.sqrt(np.mean((np.array([0.01] * 3) / [1.5, 2.0, 2.5]) ** 2))
    assert r["within_sd"] == pytest.approx(within)
    assert r["between_sd"] == pytest.approx(math.sqrt(y.var(ddof=1) - within ** 2))
    q, df, p = cochran_q(y, [0.01 / 1.5, 0.01 / 2.0, 0.01 / 2.5])
    assert (r["q"], r["q_df"], r["q_p"]) == pytest.approx((q, df, p)) and p < 1e-6


def test_blocks_that_agree_by_chance_keep_the_se_their_rounds_show():
    """Three blocks closer together than their own rounds allow: the se is the within-block one
    (a sample variance on 2 df can fall far below it by chance)."""
    r = combine([1.90, 1.95, 1.96], [0.04, 0.10, 0.21])
    w = np.mean((np.array([0.04, 0.10, 0.21]) / [1.90, 1.95, 1.96]) ** 2)
    assert r["log_se"] == pytest.approx(math.sqrt(w / 3)) and r["between_sd"] == 0.0
    assert r["q_p"] > 0.5


def test_cochran_q_is_the_weighted_sum_of_squares_about_the_weighted_mean():
    y, s = np.array([0.1, 0.3, 0.2, 0.6]), np.array([0.1, 0.2, 0.1, 0.3])
    w = 1 / s ** 2
    q = float(np.sum(w * (y - np.sum(w * y) / np.sum(w)) ** 2))
    assert cochran_q(y, s) == pytest.approx((q, 3, chi2.sf(q, 3)))
    assert math.isnan(cochran_q([1.0], [0.1])[0]) and math.isnan(cochran_q([1.0, 2.0], [0.1, 0.0])[0])


def test_one_block_has_no_se_and_bad_ratios_are_refused():
    r = combine([1.7])
    assert r["ratio"] == pytest.approx(1.7) and r["se"] is None and r["df"] == 0
    for bad in ([], [0.0, 1.0], [float("nan")], [-1.0]):
        with pytest.raises(ValueError):
            combine(bad)
    with pytest.raises(ValueError, match="2 block ratios against 1 ses"):
        combine([1.0, 2.0], [0.1])
