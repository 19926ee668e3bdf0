"""The training replicates' draws (`tadm.experiments.replicates`) and the between-run estimator
(`tadm.metrics.replicates`) against closed forms."""

import math
import subprocess
import sys

import numpy as np
import pytest

from tadm import config
from tadm.errors import ConfigError
from tadm.experiments import replicates as R
from tadm.metrics import replicates as M
from tests.conftest import micro_raw, write_params


def test_pooled_between_is_the_one_way_anova_within_mean_square_less_the_sampling_part():
    runs = [[0.62, 0.55, 0.60], [0.41, 0.47, 0.44], [0.3, 0.3]]
    pool = M.pooled_between(runs, [[0.0001] * 3, [0.0001] * 3, [0.0002] * 2])
    ss = sum(sum((x - np.mean(a)) ** 2 for x in a) for a in runs)
    assert pool.df == 2 + 2 + 1 and pool.runs == 8
    assert pool.var_runs == pytest.approx(ss / 5)
    assert pool.var_within == pytest.approx((6 * 0.0001 + 2 * 0.0002) / 8)
    assert pool.var_between == pytest.approx(ss / 5 - pool.var_within)
    assert M.pooled_between([[1.0, 1.0]], [[0.5, 0.5]]).var_between == 0  # never negative
    with pytest.raises(ValueError, match="no arm has two runs"):
        M.pooled_between([[1.0], [2.0]])


def test_replicated_difference_and_its_critical_value():
    pool = M.pooled_between([[1.0, 2.0, 3.0], [2.0, 3.0, 4.0]])  # s_p^2 = 1 on 4 df
    diff, se = M.replicated_difference([1.0, 2.0, 3.0], [2.0, 3.0, 4.0], 0.01, pool)
    assert diff == -1.0 and se == pytest.approx(math.sqrt(1 * (1 / 3 + 1 / 3) + 0.01))
    _, se_frozen = M.replicated_difference([1.0, 2.0, 3.0], 2.0, 0.0, pool)  # a frozen reference: no training term
    assert se_frozen == pytest.approx(math.sqrt(1 / 3))
    assert M.critical(2.0, None) == 2.0 and M.critical(2.0, 4) == pytest.approx(2.8693, abs=1e-3)
    assert M.critical(2.0, 1e9) == pytest.approx(2.0, abs=1e-6)
    # runs per arm by power at the df those runs give (2 rows pooled: df = 2 (n - 1)), the within-run
    # term shrinking with the runs too: the smallest n that detects, found by brute force here
    from scipy.stats import t as student

    def detects(n, within):
        df = 2 * (n - 1)
        return (M.critical(2.0, df) + student.ppf(0.8, df)) * math.sqrt((2 * 1.0 + within) / n) <= 1.0

    for within in (0.0, 0.5):
        want = next(n for n in range(2, 1000) if detects(n, within))
        assert M.runs_needed(pool, 1.0, 2.0, 0.8, within_one_run=within) == want
    assert M.runs_needed(pool, 1.0, 2.0, 0.8, within_one_run=0.5) > M.runs_needed(pool, 1.0, 2.0, 0.8)
    # fixing t at the pool's 4 df for every n (the old rule) asks for more runs than the df n gives
    assert M.runs_needed(pool, 1.0, 2.0, 0.8) < math.ceil(2 * (M.critical(2.0, 4) + student.ppf(0.8, 4)) ** 2)


def test_replicated_accuracy_delta_adds_the_training_term_to_the_example_bootstrap():
    rng = np.random.default_rng(0)
    a = [(rng.random((2, 400)) < 0.7).astype(int) for _ in range(3)]
    b = [(rng.random((2, 400)) < 0.6).astype(int)]
    d, se0 = M.replicated_accuracy_delta(a, b, None, False)
    assert d == pytest.approx(100 * (np.mean(a) - np.mean(b)))
    pool = M.Pooled(var_between=9.0, var_runs=9.0, var_within=0.0, df=4, runs=6)
    _, se1 = M.replicated_accuracy_delta(a, b, pool, False)
    assert se1 == pytest.approx(math.sqrt(se0 ** 2 + 9.0 / 3))
    _, se2 = M.replicated_accuracy_delta(a, a, pool, True)
    assert se2 ** 2 == pytest.approx(9.0 * (1 / 3 + 1 / 3) + 0.0, abs=1e-9)  # identical arms: the training term alone
    with pytest.raises(ValueError, match="same examples"):
        M.replicated_accuracy_delta(a, [np.zeros((2, 10))], None, False)


def test_every_replicated_row_needs_replicates_of_its_model_and_the_draws_are_listed():
    p = config.from_dict(config.render_profile("default"))
    assert R.draws(p) == [(r, s) for r in ("remdm", "tadm", "tadm_gamma0") for s in (1, 2)]
    R.check(p)
    bad = config.override(p, {"train.replicate_models": ["tadm", "tadm_gamma0"]})
    with pytest.raises(ConfigError, match=r"sample.replicate_rows: row 'remdm' samples model 'mdlm'"):
        R.check(bad)
    with pytest.raises(ConfigError, match="train.replicate_models: 'sedd' is not in train.models"):
        config.override(p, {"train.models": ["mdlm", "tadm"], "train.replicate_models": ["sedd"]})
    with pytest.raises(ConfigError, match="sample.replicate_steps: 96 is not a sampling budget"):
        config.override(p, {"sample.replicate_steps": [96]})


def test_the_stage_refuses_missing_replicates_in_one_line(tmp_path):
    params = write_params(tmp_path / "params.yaml", micro_raw())
    out = subprocess.run([sys.executable, "-m", "tadm", "--params", str(params), "replicates", "--data", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "no trained replicate here" in out.stderr, out.stderr
