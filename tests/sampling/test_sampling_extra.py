"""Predictor-corrector (FB, DFM) samplers, SEDD's analytic sampler and the AR loop."""

from __future__ import annotations

import pytest
import torch

from tadm.losses import sedd_log_scores
from tadm.sampling import (
    SamplerSettings, SEDDAdapter, StepInfo, dfm_posterior, fb_posterior, make_adapter, mdlm_posterior, sample,
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


@pytest.mark.parametrize("posterior", [fb_posterior, dfm_posterior])
@pytest.mark.parametrize("alpha_t, alpha_s", [(0.0, 0.3), (1e-3, 1e-3 + 1 / 4096), (0.4, 0.9), (0.999, 1.0)])
@pytest.mark.parametrize("eta", [0.0, 0.02, 0.5, 1.0])
def test_corrector_rows_are_distributions(posterior, alpha_t, alpha_s, eta):
    x, z = random_x_theta()
    probs = posterior(x, z, alpha_t, alpha_s, eta, V)
    assert (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(z.shape, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("sampler", ["mdlm-fb", "mdlm-dfm"])
def test_corrector_transitions_of_a_run_are_distributions_and_remask(models, sampler):
    remasked = []

    def check(info: StepInfo):
        tr = info.transition
        p = tr.probs(info.full_x_theta, info.z_t, V)
        assert p.dtype == torch.float64 and (p >= 0).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:2], dtype=p.dtype), rtol=0, atol=1e-12)
        at, as_, eta = tr.alpha_t, tr.alpha_s, (0.0 if info.s <= 0 else 1.0)
        closed = (fb_posterior if sampler == "mdlm-fb" else dfm_posterior)(info.full_x_theta, info.z_t, at, as_, eta, V)
        torch.testing.assert_close(p, closed, rtol=0, atol=1e-14)  # the factored form is the closed form
        remasked.append(int(((info.z_t != V) & (info.z_s == V)).sum()))

    result = run(make_adapter(models["mdlm"]), check, sampler=sampler, eta=1.0, steps=32, n=4, lazy_head=False,
                 ddpm_cache=False)
    assert sum(remasked) > 0  # the corrector does re-mask decoded tokens
    assert ((result.tokens >= 0) & (result.tokens < V)).all()


@pytest.mark.parametrize("sampler", ["mdlm-fb", "mdlm-dfm"])
def test_corrector_off_is_mdlm_token_for_token(models, sampler):
    adapter = make_adapter(models["mdlm"])
    a = run(adapter, sampler="mdlm", seed=5, n=4).tokens
    b = run(adapter, sampler=sampler, eta=0.0, seed=5, n=4).tokens
    assert torch.equal(a, b)


def test_fb_and_dfm_closed_forms():
    x, z = random_x_theta()
    at, as_, eta = 0.3, 0.6, 0.25
    masked, decoded = z == V, z != V
    u = (as_ - at) / (1 - at)
    c = eta * (1 - at / as_)
    fb = fb_posterior(x, z, at, as_, eta, V)
    torch.testing.assert_close(fb[masked][:, :V], (1 - c) * u * x[masked][:, :V])
    torch.testing.assert_close(fb[decoded][:, V], torch.full((int(decoded.sum()),), c, dtype=torch.float64))
    dfm = dfm_posterior(x, z, at, as_, eta, V)
    torch.testing.assert_close(dfm[masked][:, :V], (1 + eta) * u * x[masked][:, :V])
    b = eta * (as_ - at) / as_
    torch.testing.assert_close(dfm[decoded][:, V], torch.full((int(decoded.sum()),), b, dtype=torch.float64))


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
