"""Algorithm 1: the anchor cache, its refresh policies, and TADM sampling through it."""

from __future__ import annotations

import math

import pytest
import torch

from tadm.sampling import (
    PAPER_REFRESH_SCHEDULE, AdaptiveDrift, Adapter, AnchorCache, BudgetSchedule, FixedInterval, SamplerSettings,
    StaleAnchorError, TADMAdapter, make_adapter, sample,
)
from tests.sampling.conftest import V, random_model

L = 16


@pytest.fixture(scope="module")
def tadm():
    return random_model("tadm", seq_len=32)


class UncachedTADM(Adapter):
    """Reference: the full model x_theta(z_t, z_t') with z_t' = z_t, at every step."""

    model_type = "tadm"

    def hidden(self, z_t, step, t):
        return self.model.hidden(z_t, z_t)


def run(adapter, seq_len=L, **settings):
    settings = {"steps": 30, "nucleus_p": 0.9, "ddpm_cache": False, **settings}
    return sample(adapter, SamplerSettings(**settings), num_samples=3, seq_len=seq_len)


@pytest.mark.parametrize("sampler", ["mdlm", "remdm-loop", "remdm-conf"])
@pytest.mark.parametrize("ddpm_cache", [False, True])
def test_k1_gives_exactly_the_uncached_tokens(tadm, sampler, ddpm_cache):
    cached = run(TADMAdapter(tadm, FixedInterval(1)), sampler=sampler, ddpm_cache=ddpm_cache, seed=11)
    reference = run(UncachedTADM(tadm), sampler=sampler, ddpm_cache=ddpm_cache, seed=11)
    assert torch.equal(cached.tokens, reference.tokens)
    assert cached.refresh_steps == [list(range(30))] and reference.refresh_steps is None


def test_k_greater_than_one_actually_serves_a_stale_anchor(tadm):
    preds = {}
    for K in (1, 8):
        log = preds[K] = []

        def record(info, log=log):
            log.append((info.z_t.clone(), info.full_x_theta.clone()))

        sample(TADMAdapter(tadm, FixedInterval(K)), SamplerSettings(steps=24, ddpm_cache=False, seed=11, lazy_head=False),
               num_samples=2, seq_len=L, callback=record)
    assert torch.equal(preds[1][0][1], preds[8][0][1])  # step 0: both anchors fresh
    assert torch.equal(preds[1][7][0], preds[8][7][0])  # step 7: same canvas, but the K = 8 run
    assert not torch.allclose(preds[1][7][1], preds[8][7][1])  # still uses the anchor of step 0


@pytest.mark.parametrize("K", [1, 2, 3, 4, 7, 30, 31])
@pytest.mark.parametrize("block_size", [None, 8])
def test_fixed_interval_refreshes_ceil_t_over_k_times_and_never_serves_older(tadm, K, block_size):
    T = 30 if block_size is None else 32
    adapter = TADMAdapter(tadm, FixedInterval(K))
    result = run(adapter, steps=T, block_size=block_size, seq_len=32, sampler="remdm-loop")
    (refreshes,) = result.refresh_steps
    assert refreshes == list(range(0, T, K)) and len(refreshes) == math.ceil(T / K)
    ages = adapter.cache.served_ages
    assert len(ages) == T and max(ages) == min(K, T) - 1
    assert result.counters.anchor_calls == math.ceil(T / K)


def test_cache_refuses_an_anchor_older_than_k():
    cache = AnchorCache()
    with pytest.raises(StaleAnchorError):
        cache.serve(0)
    h, z = torch.zeros(1, 4, 8), torch.zeros(1, 4, dtype=torch.long)
    cache.store(h, step=5, canvas=z)
    assert cache.serve(5, max_age=3) is h and cache.serve(7, max_age=3) is h
    with pytest.raises(StaleAnchorError):
        cache.serve(8, max_age=3)
    with pytest.raises(StaleAnchorError):
        cache.serve(4)  # before the anchor was computed
    assert cache.refresh_steps == [5] and cache.served_ages == [0, 2]


def test_policies_are_pure_and_fixed_interval_is_exact():
    cache, policy = AnchorCache(), FixedInterval(3)
    z = torch.zeros(1, 4, dtype=torch.long)
    assert policy.due(cache, 0, z, None)
    cache.store(torch.zeros(1, 4, 8), 0, z)
    assert [policy.due(cache, s, z, None) for s in range(5)] == [False, False, False, True, True]
    assert cache.step == 0 and cache.refresh_steps == [0]
    with pytest.raises(ValueError):
        FixedInterval(0)


@pytest.mark.parametrize("what, prefix", [("", ""), ("K", "K ")])
def test_fixed_interval_parse_is_the_one_check_of_a_settable_refresh_every(what, prefix):
    from tadm.errors import ConfigError

    policy = FixedInterval.parse(4, "some.key", what)
    assert isinstance(policy, FixedInterval) and policy.K == policy.max_age == 4
    for bad in (0, -1, True, 1.5, "2", None):
        with pytest.raises(ConfigError) as e:
            FixedInterval.parse(bad, "some.key", what)
        assert e.value.key == "some.key" and e.value.detail == f"{prefix}must be an integer >= 1, got {bad!r}"


def test_the_refresh_every_setters_share_fixed_interval_parse():
    """ASRD's backends, TADM:Post-train and the feature cache: one check, each naming its key."""
    import types

    from tadm.asrd.backends import Backend
    from tadm.caches.diffusiongemma.feature import FeatureCacheDiffusionGemma
    from tadm.errors import ConfigError
    from tadm.posttrain.anchored import TimeAnchoredDiffusionGemma

    for cls, message in [(Backend, "params.yaml: asrd.refresh_every: must be an integer >= 1, got 0"),
                         (TimeAnchoredDiffusionGemma, "params.yaml: posttrain.refresh_every: K must be an integer >= 1, got 0"),
                         (FeatureCacheDiffusionGemma, "params.yaml: posttrain.refresh_every: K_r (the feature cache's "
                                                      "refresh interval) must be an integer >= 1, got 0")]:
        obj = types.SimpleNamespace()
        cls.refresh_every.fset(obj, 3)
        assert repr(obj.refresh) == "FixedInterval(K=3)" and cls.refresh_every.fget(obj) == 3
        with pytest.raises(ConfigError) as e:
            cls.refresh_every.fset(obj, 0)
        assert str(e.value) == message


def test_budget_schedule_resolves_k_from_t(tadm):
    assert PAPER_REFRESH_SCHEDULE == {128: 2, 256: 2, 512: 2, 1024: 8, 2048: 4, 4096: 4}
    schedule = BudgetSchedule()
    assert [schedule.resolve(T).K for T in (128, 256, 512, 1024, 2048, 4096)] == [2, 2, 2, 8, 4, 4]
    with pytest.raises(ValueError, match="no refresh interval"):
        schedule.resolve(100)
    with pytest.raises(RuntimeError):
        schedule.due(AnchorCache(), 0, None, None)
    result = run(make_adapter(tadm, BudgetSchedule({30: 4, 60: 8})), steps=30)
    assert result.refresh_steps == [list(range(0, 30, 4))]
    from tadm.config import SampleConfig

    assert BudgetSchedule.from_config(SampleConfig()).table == {2048: 4, 4096: 4}


@pytest.mark.parametrize("metric, thresholds", [("changed_fraction", [0.0, 0.1, 0.3, 1.0]),
                                                ("shallow_distance", [0.0, 0.2, 0.6, 10.0])])
def test_adaptive_drift_refreshes_more_often_with_a_smaller_threshold(tadm, metric, thresholds):
    counts = []
    for threshold in thresholds:
        adapter = TADMAdapter(tadm, AdaptiveDrift(threshold, metric))
        result = run(adapter, steps=40, sampler="remdm-loop", eta=0.05, seed=2)
        (refreshes,) = result.refresh_steps
        counts.append(len(refreshes))
        assert refreshes[0] == 0 and (result.tokens != V).all()
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    assert counts[-1] == 1  # a threshold nothing reaches: the first anchor is kept throughout


def test_adaptive_drift_changed_fraction_and_max_age(tadm):
    policy = AdaptiveDrift(0.25)
    cache = AnchorCache()
    z = torch.full((2, 8), V)
    cache.store(torch.zeros(2, 8, 4), 0, z)
    moved = z.clone()
    moved[0, :2] = 1  # 2/8 changed in one sequence: not above 0.25
    assert policy.drift(cache, moved, None) == 0.25 and not policy.due(cache, 1, moved, None)
    moved[1, :3] = 1  # 3/8 in the other: the batch refreshes
    assert policy.due(cache, 1, moved, None)
    capped = TADMAdapter(tadm, AdaptiveDrift(10.0, max_age=5))
    result = run(capped, steps=30)
    assert result.refresh_steps == [list(range(0, 30, 5))] and max(capped.cache.served_ages) == 4
    with pytest.raises(ValueError):
        AdaptiveDrift(0.1, metric="kl")


def test_make_adapter_dispatch(tadm):
    assert isinstance(make_adapter(tadm), TADMAdapter)
    assert make_adapter(tadm).refresh.K == 1  # default: a fresh anchor every step
    with pytest.raises(ValueError, match="only applies to TADM"):
        make_adapter(random_model("mdlm"), FixedInterval(2))
    assert type(make_adapter(random_model("sedd"))).__name__ == "SEDDAdapter"
    with pytest.raises(ValueError, match="no sampling adapter"):
        make_adapter(random_model("ar"))  # AR samples with its own loop (tadm.sampling.ar)
    with pytest.raises(RuntimeError, match="start"):
        TADMAdapter(tadm)(torch.full((1, 8), V), 0, 1.0)


def test_the_paper_profiles_budgets_are_the_paper_refresh_schedule():
    """One schedule: the paper profile's (T, K) budgets are PAPER_REFRESH_SCHEDULE, the library's
    home of the paper's Table 2 refresh intervals (docs/glossary.md's K table)."""
    from tadm import config
    from tadm.config.loader import render_profile

    p = config.from_dict(render_profile("paper"))
    assert {b.T: b.K for b in p.sample.budgets} == PAPER_REFRESH_SCHEDULE
