"""Predictor-corrector (FB, DFM) samplers, SEDD's analytic sampler and the AR loop."""

from __future__ import annotations

import pytest
import torch

from tadm.losses import sedd_log_scores
from tadm.sampling import (
    SamplerSettings, SEDDAdapter, StepInfo, dfm_grid, dfm_posterior, dfm_rates, fb_posterior, fb_rates, make_adapter,
    mdlm_posterior, sample,
    sample_ar, sedd_analytic_posterior,
)
from tests.sampling.conftest import V, random_model
from tests.sampling.test_sampling_loop import random_x_theta

L = 16
BOS = 3


@pytest.fixture(scope="module")
def models():
    return {kind: random_model(kind, seq_len=L) for kind in ("mdlm", "sedd", "ar")}


def run(adapter, callback=None, n=2, **settings):
    settings = {"steps": 16, "nucleus_p": 0.9, **settings}
    return sample(adapter, SamplerSettings(**settings), num_samples=n, seq_len=L, callback=callback)


# --------------------------------------------------------------------------- correctors


def _posterior(sampler, x, z, t, at, as_):
    return fb_posterior(x, z, at, as_, V) if sampler == "mdlm-fb" else dfm_posterior(x, z, t, at, as_, V)


@pytest.mark.parametrize("sampler", ["mdlm-fb", "mdlm-dfm"])
@pytest.mark.parametrize("t, alpha_t, alpha_s", [(1.0, 0.0, 0.3), (1.0, 1e-3, 1e-3 + 1 / 4096), (0.6, 0.4, 0.9),
                                                 (0.5, 0.5, 0.5 + 1 / 128), (0.01, 0.99, 0.995), (0.001, 0.999, 1.0)])
def test_corrector_rows_are_distributions(sampler, t, alpha_t, alpha_s):
    x, z = random_x_theta()
    probs = _posterior(sampler, x, z, t, alpha_t, alpha_s)
    assert (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(z.shape, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("sampler", ["mdlm-fb", "mdlm-dfm"])
def test_corrector_transitions_of_a_run_are_the_closed_forms_and_remask(models, sampler):
    remasked, steps = [], []

    def check(info: StepInfo):
        tr = info.transition
        p = tr.probs(info.full_x_theta, info.z_t, V)
        assert p.dtype == torch.float64 and (p >= 0).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:2], dtype=p.dtype), rtol=0, atol=1e-12)
        closed = _posterior(sampler, info.full_x_theta, info.z_t, info.t, tr.alpha_t, tr.alpha_s)
        torch.testing.assert_close(p, closed, rtol=0, atol=1e-14)  # the factored form is the closed form
        remasked.append(int(((info.z_t != V) & (info.z_s == V)).sum()))
        steps.append((info.t, info.s))

    result = run(make_adapter(models["mdlm"]), check, sampler=sampler, steps=32, n=4, lazy_head=False,
                 ddpm_cache=False)
    assert sum(remasked) > 0  # the corrector does re-mask decoded tokens
    assert ((result.tokens >= 0) & (result.tokens < V)).all()
    assert steps == (dfm_grid(32) if sampler == "mdlm-dfm" else [(i / 32, (i - 1) / 32) for i in range(32, 0, -1)])
    assert result.counters.model_calls == len(steps)  # DFM's extra steps are network calls (no cache here)


def test_fb_rows_as_released():
    """kuleshov-group/remdm diffusion.py, sampler == 'forward-backward': sigma = (alpha_s -
    alpha_t) / alpha_t; decoded: p_x0 (1 - sigma) + sigma m; masked: p_x0 (alpha_s - (1 - sigma)
    alpha_t) / (1 - alpha_t) + (1 - alpha_s - sigma alpha_t) / (1 - alpha_t) m."""
    x, z = random_x_theta()
    masked, decoded = z == V, z != V
    at, as_ = 0.3, 0.4
    sigma = (as_ - at) / at
    fb = fb_posterior(x, z, at, as_, V)
    torch.testing.assert_close(fb[masked][:, :V], x[masked][:, :V] * (as_ - (1 - sigma) * at) / (1 - at))
    torch.testing.assert_close(fb[masked][:, V], torch.full((int(masked.sum()),), (1 - as_ - sigma * at) / (1 - at),
                                                            dtype=torch.float64))
    torch.testing.assert_close(fb[decoded][:, V], torch.full((int(decoded.sum()),), sigma, dtype=torch.float64))
    assert fb_rates(at, as_) == pytest.approx((2 * (as_ - at) / (1 - at), sigma))
    # late steps: the stay-masked weight would be negative; the release's argmax-of-p/Exp draw
    # then always decodes, i.e. the decode rate is 1
    assert fb_rates(0.7, 0.9)[0] == 1.0
    assert fb_rates(0.0, 0.25) == (0.25, 1.0)  # alpha_t = 0: sigma = 1 as released


def test_dfm_rows_and_step_rule_as_released():
    """kuleshov-group/remdm diffusion.py `_dfm_caching_update`: a_t = 10 t^.25 (1-t)^.25 + 1,
    b_t = a_t - 1; masked: p_x0 a_t (alpha_s - alpha_t) / (1 - alpha_t); decoded: mask with
    b_t (alpha_s / alpha_t - 1); dt = min(1/T, 1 / (a_t / t + b_t / (1 - t))), first step 1/T."""
    x, z = random_x_theta()
    masked, decoded = z == V, z != V
    t, at, as_ = 0.3, 0.7, 0.71
    a = 10 * t ** 0.25 * (1 - t) ** 0.25 + 1
    dfm = dfm_posterior(x, z, t, at, as_, V)
    torch.testing.assert_close(dfm[masked][:, :V], x[masked][:, :V] * a * (as_ - at) / (1 - at))
    torch.testing.assert_close(dfm[decoded][:, V], torch.full((int(decoded.sum()),), (a - 1) * (as_ / at - 1),
                                                              dtype=torch.float64))
    assert dfm_rates(1.0, 1e-3, 0.1) == ((0.1 - 1e-3) / (1 - 1e-3), 0.0)  # t = 1: MDLM's step
    T = 64
    grid = dfm_grid(T)
    assert grid[0] == (1.0, 1.0 - 1 / T) and grid[-1][1] == 0.0
    assert all(abs(s1 - t2) < 1e-15 for (_, s1), (t2, _) in zip(grid, grid[1:]))  # contiguous
    for t, s in grid[1:-1]:
        a = 10 * t ** 0.25 * (1 - t) ** 0.25 + 1
        assert t - s == pytest.approx(min(1 / T, 1 / (a / t + (a - 1) / (1 - t))), rel=1e-12)
    assert grid[-2][1] <= 1 / T + 1e-12 < grid[-2][0]  # stops once t <= 1/T
    assert len(grid) > T  # the step rule adds steps near t = 0


def test_released_fb_remasks_about_once_per_position():
    """The expected number of re-mask events per position over a trajectory, sum over steps of
    P(decoded) * sigma with P(decoded) ~ alpha_t, is about 1 for FB (the eta-scaled rate this
    module had before gave ~0.02)."""
    from tadm.schedule import LogLinearSchedule

    sched, T = LogLinearSchedule(1e-3), 1024
    events = 0.0
    for t, s in [(i / T, (i - 1) / T) for i in range(T, 1, -1)]:
        at, as_ = (float(sched.alpha(torch.tensor(v, dtype=torch.float64))) for v in (t, s))
        events += at * fb_rates(at, as_)[1]
    assert 0.9 < events < 1.1


# --------------------------------------------------------------------------- SEDD


def test_sedd_analytic_equals_mdlm_posterior_on_normalised_scores(models):
    g = torch.Generator().manual_seed(1)
    z = torch.randint(0, V + 1, (3, L), generator=g)
    z[:, ::2] = V
    with torch.no_grad():
        logits = models["sedd"](z)
    for at, as_ in [(0.1, 0.2), (0.5, 0.9), (0.9, 1.0)]:
        probs = sedd_analytic_posterior(logits, z, at, as_, V)
        e = sedd_log_scores(logits, V, torch.float64).exp()
        x_theta = torch.zeros(3, L, V + 1, dtype=torch.float64)
        x_theta[..., :V] = e / e.sum(-1, keepdim=True)
        torch.testing.assert_close(probs, mdlm_posterior(x_theta, z, at, as_, V), rtol=0, atol=1e-14)
        torch.testing.assert_close(probs.sum(-1), torch.ones(3, L, dtype=torch.float64), rtol=0, atol=1e-12)


def test_sedd_sampler_runs_counts_and_is_seeded(models):
    adapter = SEDDAdapter(models["sedd"])

    def check(info: StepInfo):  # the loop's x_theta is normalise(exp(l)) at the decoded rows
        logits = models["sedd"](info.z_t)
        e = sedd_log_scores(logits, V, torch.float64).exp()
        torch.testing.assert_close(info.x_theta[:, :V], (e / e.sum(-1, keepdim=True))[info.decoded])

    a = run(adapter, check, sampler="sedd-analytic", nucleus_p=1.0, seed=2, ddpm_cache=False)
    b = run(adapter, sampler="sedd-analytic", nucleus_p=1.0, seed=2, ddpm_cache=False)
    c = run(adapter, sampler="sedd-analytic", nucleus_p=1.0, seed=3, ddpm_cache=False)
    assert a.tokens.shape == (2, L) and ((a.tokens >= 0) & (a.tokens < V)).all()
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    n_layers = len(models["sedd"].blocks)
    assert a.counters.model_calls == 16 and a.counters.layer_calls_per_trajectory == n_layers * 16
    with pytest.raises(ValueError):
        SEDDAdapter(models["mdlm"])


# --------------------------------------------------------------------------- AR


def test_ar_is_seeded_and_counts(models):
    a = sample_ar(models["ar"], 3, L, bos_id=BOS, nucleus_p=0.9, seed=4)
    b = sample_ar(models["ar"], 3, L, bos_id=BOS, nucleus_p=0.9, seed=4)
    c = sample_ar(models["ar"], 3, L, bos_id=BOS, nucleus_p=0.9, seed=5)
    assert a.tokens.shape == (3, L) and a.tokens.dtype == torch.long
    assert (a.tokens[:, 0] == BOS).all() and ((a.tokens >= 0) & (a.tokens < V)).all()
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    n_layers = len(models["ar"].blocks)
    assert a.counters.model_calls == L - 1
    assert a.counters.layer_calls_per_trajectory == n_layers * (L - 1)
    assert a.seconds > 0 and a.settings.precision == torch.float64 and a.refresh_steps is None


@pytest.mark.parametrize("i", [2, 9])
def test_ar_positions_up_to_i_ignore_later_randomness(models, i):
    base = sample_ar(models["ar"], 4, L, bos_id=BOS, seed=6).tokens
    gen = torch.Generator().manual_seed(6)

    def reseed(j, x):
        if j == i:
            gen.manual_seed(1234)

    other = sample_ar(models["ar"], 4, L, bos_id=BOS, generator=gen, callback=reseed).tokens
    assert torch.equal(base[:, : i + 1], other[:, : i + 1])
    assert not torch.equal(base[:, i + 1:], other[:, i + 1:])


def test_ar_model_is_causal(models):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (2, L), generator=g)
    y = x.clone()
    y[:, 8:] = torch.randint(0, V, (2, L - 8), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(models["ar"](x)[:, :8], models["ar"](y)[:, :8])


def test_ar_tiny_nucleus_is_greedy(models):
    result = sample_ar(models["ar"], 2, L, bos_id=BOS, nucleus_p=1e-9, seed=0).tokens
    x = torch.full((2, L), BOS, dtype=torch.long)
    with torch.no_grad():
        for i in range(1, L):
            x[:, i] = models["ar"](x[:, :i])[:, -1].double().argmax(-1)
    assert torch.equal(result, x)
