"""Bootstrap uncertainties of the quality metrics: zero for identical samples, shrinking as
1/sqrt(n), close to the closed-form standard error of a mean, and deterministic; paired
speed-ups."""

import numpy as np
import pytest

from tadm.metrics import bootstrap
from tadm.metrics.bootstrap import paired_speedup


def test_identical_samples_have_no_spread():
    assert bootstrap.mean_se(np.full(50, 3.1), B=50) < 1e-12
    assert bootstrap.gen_ppl_se(np.full(50, 20.3), np.full(50, 10), B=50) < 1e-9


def test_mean_se_matches_the_closed_form_and_shrinks_with_n():
    rng = np.random.default_rng(1)
    x = rng.normal(size=400)
    se = bootstrap.mean_se(x, B=2000)
    assert abs(se - x.std(ddof=1) / np.sqrt(len(x))) < 0.1 * se
    assert bootstrap.mean_se(x[:100], B=2000) > 1.6 * se  # 4x fewer samples: about 2x the spread


def test_gen_ppl_se_is_deterministic_and_follows_the_corpus_level_definition():
    rng = np.random.default_rng(2)
    tokens = rng.integers(10, 60, size=256)
    nll = tokens * rng.normal(4.0, 0.5, size=256)
    a, b = bootstrap.gen_ppl_se(nll, tokens, B=100), bootstrap.gen_ppl_se(nll, tokens, B=100)
    assert a == b and a > 0
    ppl = np.exp(nll.sum() / tokens.sum())
    assert a < 0.2 * ppl  # a spread, not a scale error


def test_mauve_se_is_small_for_one_distribution_and_deterministic():
    rng = np.random.default_rng(3)
    p, q = rng.normal(size=(120, 8)).astype(np.float32), rng.normal(size=(120, 8)).astype(np.float32)
    a = bootstrap.mauve_se(p, q, B=8)
    assert a == bootstrap.mauve_se(p, q, B=8)
    assert 0 <= a < 0.2


def test_the_speed_up_is_paired_batch_by_batch_so_a_common_slowdown_cancels():
    # the machine halves its speed between batches: both methods' times grow alike, the ratio holds
    base, tadm = [1.0, 2.0, 4.0, 8.0], [0.5, 1.0, 2.0, 4.0]
    assert paired_speedup(base, tadm) == (pytest.approx(2.0), pytest.approx(0.0))
    ratio, se = paired_speedup([1.0, 1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 1.0, 0.25])
    assert ratio == pytest.approx(2.0) and 0 < se < 2  # median of 2, 2, 2, 1, 4; spread from the outliers
    assert paired_speedup([3.0], [1.5]) == (pytest.approx(2.0), pytest.approx(float("nan"), nan_ok=True))
    with pytest.raises(ValueError, match="3 base batch times against 2"):
        paired_speedup([1.0, 1.0, 1.0], [1.0, 1.0])


def test_the_paired_accuracy_delta_resamples_examples_so_two_equal_seeds_still_have_noise():
    # 87 examples, 2 seeds; the method misses example 0 on both seeds that the reference gets:
    # the per-seed differences are equal (their sd is 0), but one example in 87 is noise
    ref = np.zeros((2, 87), dtype=int)
    ref[:, :30] = 1
    method = ref.copy()
    method[:, 0] = 0
    delta, se = bootstrap.paired_accuracy_delta(method, ref, B=2000)
    assert delta == pytest.approx(-100 / 87)
    diffs = np.r_[-100.0, np.zeros(86)]  # per example, averaged over the seeds
    assert se == pytest.approx(diffs.std(ddof=1) / np.sqrt(87), rel=0.15) and se > 0.5
    assert bootstrap.paired_accuracy_delta(ref, ref) == (0.0, 0.0)
    # an example right on one seed only counts half: the differences are averaged over seeds
    half = ref.copy()
    half[0, 40] = 1
    assert bootstrap.paired_accuracy_delta(half, ref)[0] == pytest.approx(50 / 87)
    with pytest.raises(ValueError, match=r"shape \(2, 87\) against \(2, 86\)"):
        bootstrap.paired_accuracy_delta(ref, ref[:, 1:])


def test_a_table1_row_delta_reads_correct_seeds_and_an_old_row_is_one_line():
    from tadm.errors import DataError

    row = {"correct_seeds": [[1, 0, 1, 1], [1, 0, 0, 1]]}
    ref = {"correct_seeds": [[1, 1, 1, 1], [1, 0, 1, 1]]}
    assert bootstrap.row_accuracy_delta(row, ref) == bootstrap.paired_accuracy_delta(row["correct_seeds"],
                                                                                      ref["correct_seeds"])
    assert all(np.isnan(bootstrap.row_accuracy_delta(row, None)))  # no reference row
    with pytest.raises(DataError, match=r"results/table1.json: .*correct_seeds.*rerun dvc repro table1"):
        bootstrap.row_accuracy_delta(row, {"accuracy": 50.0})
