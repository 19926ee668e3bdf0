"""The samplers: valid transitions, ReMDM <-> MDLM, remasking, the loop schedule, seeds,
semi-AR blocks, ddpm_cache exactness and the pieces of the loop."""

from __future__ import annotations

import math

import pytest
import torch

from tadm.sampling import (
    SAMPLER_NAMES, FixedInterval, LoopSchedule, SamplerSettings, StepInfo, dfm_grid, make_adapter, mdlm_posterior,
    remdm_posterior, sample, sigma_max,
)
from tadm.sampling.base import (
    SAMPLERS, Sampler, Transition, block_ranges, nucleus_filter, predict_x0, sample_categorical, time_grid,
)
from tests.sampling.conftest import V, random_model

L = 16
MODEL_TYPES = ["mdlm", "adlm", "tadm"]


@pytest.fixture(scope="module")
def models():
    return {kind: random_model(kind, seq_len=32) for kind in MODEL_TYPES}


def adapter_for(models, kind, K=3):
    return make_adapter(models[kind], FixedInterval(K) if kind == "tadm" else None)


def run(adapter, callback=None, n=2, seq_len=L, **settings):
    settings = {"steps": 24, "nucleus_p": 0.9, **settings}
    return sample(adapter, SamplerSettings(**settings), num_samples=n, seq_len=seq_len, callback=callback)


def random_x_theta(B=3, Lx=7, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, Lx, V + 1, generator=g, dtype=dtype) ** 4
    x[..., V] = 0.0
    x = x / x.sum(-1, keepdim=True)
    z = torch.randint(0, V + 1, (B, Lx), generator=g)
    z[:, :3] = V  # some masked positions for sure
    x = torch.where((z != V).unsqueeze(-1), torch.nn.functional.one_hot(z, V + 1).to(dtype), x)  # SUBS
    return x, z


# --------------------------------------------------------------------------- distributions


@pytest.mark.parametrize("alpha_t, alpha_s", [(0.0, 0.3), (1e-3, 1e-3 + 1 / 4096), (0.4, 0.9), (0.999, 1.0)])
def test_posteriors_are_distributions(alpha_t, alpha_s):
    x, z = random_x_theta()
    smax = sigma_max(alpha_t, alpha_s)
    per_position = torch.rand(z.shape, dtype=torch.float64) * smax
    for probs in (mdlm_posterior(x, z, alpha_t, alpha_s, V), remdm_posterior(x, z, alpha_t, alpha_s, smax, V),
                  remdm_posterior(x, z, alpha_t, alpha_s, 0.5 * smax, V),
                  remdm_posterior(x, z, alpha_t, alpha_s, per_position, V)):
        assert (probs >= 0).all()
        torch.testing.assert_close(probs.sum(-1), torch.ones(z.shape, dtype=torch.float64), rtol=0, atol=1e-12)


def test_posteriors_reject_reversed_time():
    x, z = random_x_theta()
    with pytest.raises(ValueError):
        mdlm_posterior(x, z, 0.6, 0.5, V)
    with pytest.raises(ValueError):
        remdm_posterior(x, z, 1.0, 1.0, 0.0, V)


@pytest.mark.parametrize("sampler", SAMPLER_NAMES)
def test_every_transition_of_a_run_is_a_distribution(models, sampler):
    rows = []

    def check(info: StepInfo):
        tr = info.transition
        assert tr.unmask.dtype == tr.remask.dtype == torch.float64
        assert ((tr.unmask >= 0) & (tr.unmask <= 1) & (tr.remask >= 0) & (tr.remask <= 1)).all()
        p = tr.probs(info.full_x_theta, info.z_t, V)
        assert (p >= 0).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:2], dtype=p.dtype), rtol=0, atol=1e-12)
        torch.testing.assert_close(info.x_theta.sum(-1), torch.ones(info.x_theta.shape[0], dtype=p.dtype))
        rows.append(p.shape[0] * p.shape[1])

    result = run(adapter_for(models, "tadm"), check, sampler=sampler, eta=0.05, lazy_head=False, ddpm_cache=False)
    # 24 steps (T = 24 over the canvas), except DFM, whose released step rule adds steps
    assert len(rows) == (len(dfm_grid(24)) if sampler == "mdlm-dfm" else 24)
    assert result.settings.precision == torch.float64


# --------------------------------------------------------------------------- ReMDM


@pytest.mark.parametrize("strategy", ["remdm-cap", "remdm-rescale"])
def test_remdm_with_sigma_zero_is_mdlm_step_for_step(models, strategy):
    adapter = adapter_for(models, "mdlm")
    steps = {"mdlm": [], strategy: []}
    for name in steps:
        def record(info, log=steps[name]):
            tr = info.transition
            log.append((info.z_s.clone(), tr.unmask.clone(), tr.remask.clone(), tr.probs(info.full_x_theta, info.z_t, V)))

        res = run(adapter, record, sampler=name, eta=0.0, steps=32, n=4, seed=3, lazy_head=False, ddpm_cache=False)
        steps[name].append(res.tokens)
    assert torch.equal(steps["mdlm"][-1], steps[strategy][-1])
    for a, b in zip(steps["mdlm"][:-1], steps[strategy][:-1]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("strategy", ["remdm-cap", "remdm-rescale", "remdm-conf", "remdm-loop"])
def test_remasking_touches_only_decoded_positions(models, strategy):
    seen = {"remasked": 0}

    def check(info: StepInfo):
        z_t, z_s, tr = info.z_t, info.z_s, info.transition
        p = tr.probs(info.full_x_theta, z_t, V)
        decoded = z_t != V
        assert (tr.unmask[decoded] == 0).all() and (tr.remask[~decoded] == 0).all()
        support = p > 0
        allowed = torch.nn.functional.one_hot(z_t, V + 1).bool()
        allowed[..., V] = True
        assert not (support & ~allowed)[decoded].any()  # a decoded token: keep it or mask it
        sigma = info.transition.sigma
        if torch.is_tensor(sigma):  # conf: per-position sigma, zero on masked positions
            assert (sigma[~decoded] == 0).all()
            torch.testing.assert_close(p[..., V][decoded], sigma[decoded].to(p.dtype))
        seen["remasked"] += int((decoded & (z_s == V)).sum())

    eta = 0.1 if strategy == "remdm-loop" else 0.9
    run(adapter_for(models, "mdlm"), check, sampler=strategy, eta=eta, steps=40, n=4, nucleus_p=1.0,
        lazy_head=False, ddpm_cache=False)
    assert seen["remasked"] > 0


def test_conf_sigma_is_softmax_of_negative_decode_confidence(models):
    state = {"conf": None, "checked": 0}

    def check(info: StepInfo):
        if state["conf"] is None:
            state["conf"] = torch.full(info.z_t.shape, float("-inf"), dtype=torch.float64)
        conf, decoded = state["conf"], info.z_t != V
        smax = sigma_max(info.transition.alpha_t, info.transition.alpha_s)
        if decoded.any(dim=-1).all():
            expected = torch.softmax(conf.masked_fill(~decoded, float("-inf")), -1) * smax
            torch.testing.assert_close(info.transition.sigma, expected, rtol=1e-12, atol=0)
            state["checked"] += 1
        newly, remasked = (~decoded) & (info.z_s != V), decoded & (info.z_s == V)
        assert torch.equal(newly, info.decoded)
        p = torch.zeros_like(conf)
        p[newly] = info.x_theta.gather(-1, info.z_s[newly].unsqueeze(-1)).squeeze(-1)
        state["conf"] = torch.where(newly, -p, conf).masked_fill(remasked, float("-inf"))

    run(adapter_for(models, "mdlm"), check, sampler="remdm-conf", steps=32, n=2)
    assert state["checked"] > 5


def test_loop_schedule_switches_at_t_on_and_t_off(models):
    cfg = dict(sampler="remdm-loop", eta=0.05, t_on=0.55, t_off=0.05, alpha_on=0.9, steps=40)
    log = []
    run(adapter_for(models, "tadm"), lambda i: log.append((i.t, i.transition)), **cfg)
    assert [round(t * 40) for t, _ in log] == list(range(40, 0, -1))
    for t, tr in log:
        if t > 0.55:
            assert tr.phase == "ramp" and tr.sigma == 0.0 and tr.alpha_s > tr.alpha_t
        elif t > 0.05:
            assert tr.phase == "loop" and tr.sigma == 0.05
            assert tr.alpha_t == 0.9 and (tr.alpha_s == 0.9 or t - 1 / 40 <= 0.05)
        else:
            assert tr.phase == "finish" and tr.sigma == 0.0 and tr.alpha_s > tr.alpha_t
    phases = [tr.phase for _, tr in log]
    assert phases.count("ramp") == 18 and phases.count("loop") == 20 and phases.count("finish") == 2
    sched = LoopSchedule(0.55, 0.05, 0.9)
    assert sched.alpha(1.0) == 0.0 and sched.alpha(0.0) == 1.0
    assert math.isclose(sched.alpha(0.55), 0.9) and math.isclose(sched.alpha(0.05), 0.9)


# --------------------------------------------------------------------------- seeds, outputs


@pytest.mark.parametrize("kind", MODEL_TYPES)
def test_same_seed_same_samples_different_seed_different(models, kind):
    adapter = adapter_for(models, kind)
    a = run(adapter, sampler="remdm-loop", seed=7).tokens
    b = run(adapter, sampler="remdm-loop", seed=7).tokens
    c = run(adapter, sampler="remdm-loop", seed=8).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("kind", MODEL_TYPES)
@pytest.mark.parametrize("sampler", SAMPLER_NAMES)
def test_outputs_contain_no_mask(models, kind, sampler):
    result = run(adapter_for(models, kind), sampler=sampler, steps=12, n=3)
    assert result.tokens.shape == (3, L) and result.tokens.dtype == torch.long
    assert ((result.tokens >= 0) & (result.tokens < V)).all()


def test_last_step_of_every_sampler_decodes_everything(models):
    for sampler in SAMPLER_NAMES:
        last = []
        run(adapter_for(models, "mdlm"), lambda i: last.append(i), sampler=sampler, steps=8, eta=0.5)
        assert last[-1].s == 0.0 and (last[-1].transition.unmask[last[-1].z_t == V] == 1.0).all()


class Stalling(Sampler):
    names = ("test-stalling",)

    def transition(self, z_t, t, s, active):
        return Transition(*self.rates(z_t, active, 0.0, 0.0), 0.0, 0.0)


def test_a_sampler_that_leaves_masks_is_an_error_not_a_silent_fill(models):
    settings = SamplerSettings(steps=4)
    try:
        adapter = adapter_for(models, "mdlm")
        with pytest.raises(RuntimeError, match="left 32 masked positions at the end of block 0"):
            from tadm.sampling.loop import _trajectory
            _trajectory(adapter, Stalling(settings, V), settings, 2, L, torch.Generator().manual_seed(0), None)
    finally:
        SAMPLERS.unregister("test-stalling")
    with pytest.raises(ValueError, match="rates must lie in"):
        Stalling(settings, V).rates(torch.full((1, 4), V), torch.ones(4, dtype=torch.bool), 1.5, 0.0)


# --------------------------------------------------------------------------- LM head only where needed


@pytest.mark.parametrize("kind", MODEL_TYPES)
@pytest.mark.parametrize("sampler", ["mdlm", "remdm-conf", "mdlm-dfm"])
def test_lazy_head_equals_the_full_computation(models, kind, sampler):
    logs = {}
    for lazy in (True, False):
        log = logs[lazy] = []
        res = run(adapter_for(models, kind), lambda i, log=log: log.append(i), sampler=sampler, eta=0.2,
                  steps=20, n=3, seed=4, lazy_head=lazy, ddpm_cache=False)
        log.append(res)
    lazy, full = logs[True], logs[False]
    assert torch.equal(lazy[-1].tokens, full[-1].tokens)
    for a, b in zip(lazy[:-1], full[:-1]):
        assert torch.equal(a.decoded, b.decoded) and torch.equal(a.z_s, b.z_s)
        # the head on a subset of rows may round differently in fp32 from the head on all rows
        torch.testing.assert_close(a.x_theta, b.full_x_theta[b.decoded], rtol=1e-5, atol=1e-7)
        if kind != "tadm":  # stateless: the full x_theta is predict_x0 of a plain call
            with torch.inference_mode():
                reference = predict_x0(adapter_for(models, kind)(b.z_t, b.step, b.t), b.z_t, V, 0.9, torch.float64)
            torch.testing.assert_close(b.full_x_theta, reference, rtol=1e-5, atol=1e-7)
    c_lazy, c_full = lazy[-1].counters, full[-1].counters
    assert c_lazy.layer_calls == c_full.layer_calls and c_lazy.flops < c_full.flops
    decoded_rows = sum(int(i.decoded.sum()) for i in lazy[:-1])
    assert decoded_rows >= 3 * L  # every position decoded at least once (more with re-masking)


def test_lazy_head_projects_each_position_once_under_mdlm(models):
    from tadm.compute import lm_head_flops

    res = run(adapter_for(models, "mdlm"), sampler="mdlm", steps=20, n=3, ddpm_cache=False)
    full = run(adapter_for(models, "mdlm"), sampler="mdlm", steps=20, n=3, ddpm_cache=False, lazy_head=False)
    head = lm_head_flops(models["mdlm"].cfg.d_model, V + 1)
    assert full.counters.flops - res.counters.flops == (20 - 1) * 3 * L * head  # T projections -> 1 per position


# --------------------------------------------------------------------------- semi-AR blocks


@pytest.mark.parametrize("sampler", ["mdlm", "remdm-loop", "remdm-conf"])
def test_semi_ar_blocks_decode_only_inside_the_current_block(models, sampler):
    seq_len, block = 32, 8
    blocks_seen = []

    def check(info: StepInfo):
        lo, hi = info.block * block, (info.block + 1) * block
        assert torch.equal(info.active, (torch.arange(seq_len) >= lo) & (torch.arange(seq_len) < hi))
        changed = info.z_s != info.z_t
        assert not changed[:, :lo].any() and not changed[:, hi:].any()
        assert (info.z_t[:, :lo] != V).all()  # earlier blocks are finished
        assert (info.z_t[:, hi:] == V).all()  # later blocks untouched
        blocks_seen.append(info.block)

    result = run(adapter_for(models, "tadm"), check, sampler=sampler, seq_len=seq_len, block_size=block,
                 steps=32, eta=0.05)
    assert blocks_seen == [b for b in range(4) for _ in range(8)]  # T / n_blocks steps per block
    assert (result.tokens != V).all()


def test_block_layout_errors(models):
    assert block_ranges(32, 8) == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert block_ranges(32, None) == [(0, 32)]
    with pytest.raises(ValueError):
        block_ranges(30, 8)
    with pytest.raises(ValueError):
        run(adapter_for(models, "mdlm"), seq_len=32, block_size=8, steps=30)


# --------------------------------------------------------------------------- ddpm_cache


@pytest.mark.parametrize("kind", MODEL_TYPES)
def test_ddpm_cache_is_exact_and_saves_calls(models, kind):
    # T >> L: most steps decode nothing, so the network is skipped.
    settings = dict(steps=96, sampler="mdlm", seed=5)
    adapter = adapter_for(models, kind, K=4)
    on = run(adapter, ddpm_cache=True, **settings)
    off = run(adapter, ddpm_cache=False, **settings)
    assert torch.equal(on.tokens, off.tokens)
    assert off.counters.model_calls == 96 and off.counters.reused_calls == 0
    assert on.counters.reused_calls > 0
    assert on.counters.model_calls + on.counters.reused_calls == 96
    assert on.counters.layer_calls < off.counters.layer_calls
    if kind == "tadm":  # reuse never skips or shifts a refresh
        assert on.refresh_steps == off.refresh_steps == [list(range(0, 96, 4))]


# --------------------------------------------------------------------------- pieces


def test_time_grid():
    grid = time_grid(4)
    assert grid == [(1.0, 0.75), (0.75, 0.5), (0.5, 0.25), (0.25, 0.0)]


def test_nucleus_filter():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0]], dtype=torch.float64)
    out = nucleus_filter(p, 0.85)
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.3, 0.0, 0.0, 0.0]], dtype=torch.float64) / 0.8)
    top1 = nucleus_filter(p, 0.1)
    assert torch.equal(top1, torch.tensor([[1.0, 0, 0, 0, 0]], dtype=torch.float64))
    assert nucleus_filter(p, 1.0) is p


@pytest.mark.parametrize("p", [1.0, 0.85, 0.5, 0.1])
def test_draw_nucleus_draws_from_the_filtered_distribution(p):
    from tadm.sampling.nucleus import draw_nucleus

    probs = torch.tensor([0.05, 0.5, 0.0, 0.3, 0.15], dtype=torch.float64).expand(200_000, 5).contiguous()
    tokens, token_prob = draw_nucleus(probs, p, torch.Generator().manual_seed(0))
    target = nucleus_filter(probs[:1], p)[0]
    freq = torch.bincount(tokens, minlength=5).double() / tokens.numel()
    torch.testing.assert_close(freq, target, rtol=0, atol=4e-3)
    assert freq[2] == 0 and torch.allclose(token_prob, target[tokens], rtol=1e-12, atol=0)


def test_sample_categorical_matches_probabilities():
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05, 0.0], dtype=torch.float64).expand(200_000, 5)
    draws = sample_categorical(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).double() / draws.numel()
    torch.testing.assert_close(freq, probs[0], rtol=0, atol=4e-3)
    assert freq[-1] == 0


def test_settings_validation_and_config():
    from tadm.config import SampleConfig

    with pytest.raises(ValueError):
        SamplerSettings(sampler="ddim")
    with pytest.raises(ValueError):
        SamplerSettings(t_on=0.1, t_off=0.2)
    with pytest.raises(ValueError):
        SamplerSettings(precision=torch.float16)
    cfg = SamplerSettings.from_config(SampleConfig(), steps=2048, seed=3)
    assert (cfg.sampler, cfg.steps, cfg.nucleus_p, cfg.block_size, cfg.precision) == (
        "remdm-loop", 2048, 0.9, None, torch.float64)
    assert cfg.as_dict()["precision"] == "float64"
