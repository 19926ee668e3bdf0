"""Pausing and resuming one trajectory (`sample(..., stop=i)` / `sample(..., start=paused)`,
tadm.sampling.base, point 8): a resumed run is the uninterrupted one, bit for bit, and a piece
start..stop runs exactly those steps, with TADM's refreshes where the whole run has them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tadm.sampling import AdaptiveDrift, FixedInterval, SamplerSettings, make_adapter, sample
from tests.sampling.conftest import random_model

L = 16


@pytest.fixture(scope="module")
def models():
    return {kind: random_model(kind, seq_len=L, seed=i) for i, kind in enumerate(("mdlm", "adlm", "tadm"))}


def adapter_for(models, kind, policy=None):
    return make_adapter(models[kind], policy) if kind == "tadm" else make_adapter(models[kind])


CASES = [("mdlm", "mdlm", None, None), ("adlm", "remdm-loop", None, None), ("tadm", "remdm-loop", 3, None),
         ("tadm", "remdm-conf", 4, 8), ("mdlm", "mdlm-dfm", None, 8), ("tadm", "mdlm-fb", "adaptive", None)]


@pytest.mark.parametrize("kind, sampler, K, block", CASES)
@pytest.mark.parametrize("ddpm_cache", [False, True])
def test_a_resumed_trajectory_is_the_uninterrupted_one(models, kind, sampler, K, block, ddpm_cache):
    policy = None if K is None else AdaptiveDrift(0.2) if K == "adaptive" else FixedInterval(K)
    cfg = SamplerSettings(sampler=sampler, steps=12, nucleus_p=0.9, seed=5, block_size=block, ddpm_cache=ddpm_cache)
    with adapter_for(models, kind, policy) as ad:
        full = sample(ad, cfg, num_samples=3, seq_len=L)
        canvases = []
        sample(ad, cfg, num_samples=3, seq_len=L, callback=lambda info: canvases.append(info.z_s.clone()))
        total = len(canvases)  # 12, or DFM's longer grid
        for stop in (1, 5, total - 1):
            first = sample(ad, cfg, num_samples=3, seq_len=L, stop=stop)
            paused = first.paused
            assert paused.step == stop and paused.total == total and first.counters.trajectories == 1
            assert torch.equal(first.tokens, canvases[stop - 1].cpu())
            before = paused.z.clone()
            for _ in range(2):  # the same state resumes to the same tokens every time
                rest = sample(ad, cfg, num_samples=3, seq_len=L, start=paused)
                assert rest.paused is None and torch.equal(rest.tokens, full.tokens)
                if kind == "tadm":
                    assert rest.refresh_steps == full.refresh_steps
                assert rest.counters.trajectories == 0 and rest.counters.tokens == 0
                if not ddpm_cache:
                    assert rest.counters.model_calls == total - stop
            assert torch.equal(paused.z, before)
            # a piece: steps stop..stop+2 only, ending on the uninterrupted run's canvas
            if stop + 3 <= total:
                piece = sample(ad, cfg, num_samples=3, seq_len=L, start=paused, stop=stop + 3)
                assert piece.paused.step == stop + 3 and torch.equal(piece.tokens, canvases[stop + 2].cpu())


def test_a_window_of_whole_refresh_cycles_refreshes_once_per_cycle(models):
    """Resumed at a multiple of K, a window of 2K steps refreshes the anchor at its first step and
    K steps later, as the whole run does there (the throughput stage's timed unit)."""
    K = 4
    cfg = SamplerSettings(sampler="remdm-loop", steps=16, nucleus_p=0.9, seed=1, ddpm_cache=False)
    with adapter_for(models, "tadm", FixedInterval(K)) as ad:
        paused = sample(ad, cfg, num_samples=2, seq_len=L, stop=4).paused
        assert paused.adapter.refresh_steps == [0]
        window = sample(ad, cfg, num_samples=2, seq_len=L, start=paused, stop=4 + 2 * K)
    assert window.refresh_steps == [[0, 4, 8]] and window.counters.anchor_calls == 2
    assert window.counters.model_calls == 2 * K
    assert paused.adapter.refresh_steps == [0]  # the paused state is not written


def test_pausing_and_resuming_refuse_what_they_cannot_do(models):
    cfg = SamplerSettings(sampler="mdlm", steps=8, seed=0)
    with adapter_for(models, "mdlm") as ad:
        paused = sample(ad, cfg, num_samples=2, seq_len=L, stop=4).paused
        with pytest.raises(ValueError, match="cannot resume with steps=16"):
            sample(ad, dataclasses.replace(cfg, steps=16), num_samples=2, seq_len=L, start=paused)
        with pytest.raises(ValueError, match="must fit one batch"):
            sample(ad, dataclasses.replace(cfg, batch_size=1), num_samples=2, seq_len=L, stop=4)
        with pytest.raises(ValueError, match="cannot run steps 4..1"):
            sample(ad, cfg, num_samples=2, seq_len=L, start=paused, stop=2)
        with pytest.raises(ValueError, match="paused canvas is"):
            sample(ad, cfg, num_samples=3, seq_len=L, start=paused)
