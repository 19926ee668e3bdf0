"""The sampling loops on a device: at most one host read per reverse step, autocast settings,
the AR KV cache (same tokens as the uncached loop, O(L) position-forwards) and the pieces that
replace boolean indexing."""

from __future__ import annotations

import warnings

import pytest
import torch

from tadm import runtime
from tadm.compute import dit_block_flops, lm_head_flops
from tadm.sampling import (
    SAMPLER_NAMES, AdaptiveDrift, FixedInterval, SamplerSettings, StepInfo, make_adapter, sample, sample_ar,
)
from tadm.sampling.base import (
    SAMPLERS, Sampler, Transition, alpha_at, alpha_grid, build_sampler, decoded_rows, time_grid,
)
from tadm.schedule import LogLinearSchedule
from tests.sampling.conftest import TINY, V, random_model
from tests.sampling.host_sync import count_host_syncs

L, T = 16, 16
# per trajectory: alpha on the time grid, the seed of the mask generator, the end-of-block check;
# per call: the tokens to the host
SETUP_READS = 4


@pytest.fixture(autouse=True)
def device_nucleus_draw(monkeypatch):
    """Count what a GPU runs: on a CPU tensor the nucleus draw reads its own values on the host
    (free there: `tadm.sampling.nucleus`), on any other device it reads nothing. (These tests'
    vocabulary is below HOST_MIN_CLASSES, so the CPU would take the device path anyway.)"""
    import tadm.sampling.nucleus as nucleus

    monkeypatch.setattr(nucleus, "HOST_DRAW", False)


@pytest.fixture(scope="module")
def models():
    return {kind: random_model(kind, seq_len=32) for kind in ("mdlm", "adlm", "tadm", "sedd", "ar")}


def reads_per_step(adapter, **settings) -> tuple[int, list[int], dict]:
    """(total host reads of one sample call, reads between consecutive steps, where they were)."""
    marks = []
    with count_host_syncs() as log:
        sample(adapter, SamplerSettings(**{"steps": T, "nucleus_p": 0.9, **settings}), num_samples=2, seq_len=L,
               callback=lambda info: marks.append(log.total))
    return log.total, [b - a for a, b in zip(marks, marks[1:])], dict(log.by_site)


CASES = [("mdlm", None), ("adlm", None), ("tadm", FixedInterval(4)), ("tadm", AdaptiveDrift(0.2)),
         ("tadm", AdaptiveDrift(0.1, "shallow_distance", max_age=4)), ("sedd", None)]


@pytest.mark.parametrize("kind, refresh", CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("sampler", SAMPLER_NAMES)
def test_at_most_one_host_read_per_step(models, kind, refresh, sampler):
    for extra in ({}, {"ddpm_cache": False}, {"lazy_head": False, "ddpm_cache": False}, {"block_size": 4}):
        with make_adapter(models[kind], refresh) as adapter:
            total, per_step, sites = reads_per_step(adapter, sampler=sampler, eta=0.05, **extra)
        # one read per step of the sampler's grid (T steps; DFM's step rule makes more)
        n_blocks = L // extra.get("block_size", L)
        steps = n_blocks * len(build_sampler(SamplerSettings(sampler=sampler, steps=T), V).grid(T // n_blocks))
        assert total <= steps + SETUP_READS, (extra, sites)
        assert max(per_step) <= 1, (extra, sites)  # semi-AR blocks too: the block-end checks are read at the end


@pytest.mark.parametrize("sampler", [name for name in SAMPLER_NAMES if build_sampler(
    SamplerSettings(sampler=name, steps=T), V).masks_only])
@pytest.mark.parametrize("kind, refresh", [("mdlm", None), ("tadm", FixedInterval(4)), ("sedd", None)],
                         ids=lambda c: str(c))
@pytest.mark.parametrize("block_size", [None, 4])
def test_rates_from_the_masks_alone_read_once_per_plan_not_per_step(models, kind, refresh, sampler, block_size):
    """Without ddpm_cache, a sampler whose rates are host numbers (masks_only) and a refresh
    schedule fixed in advance: the masks of up to PLAN_STEPS steps are drawn ahead, so a block
    of T_b steps costs ceil(T_b / PLAN_STEPS) reads, not T_b (here one per block)."""
    from tadm.sampling.loop import PLAN_STEPS

    with make_adapter(models[kind], refresh) as adapter:
        total, _, sites = reads_per_step(adapter, sampler=sampler, eta=0.05, ddpm_cache=False, block_size=block_size)
    n_blocks = L // (block_size or L)
    per_block = len(build_sampler(SamplerSettings(sampler=sampler, steps=T), V).grid(T // n_blocks))
    assert total == n_blocks * -(-per_block // PLAN_STEPS) + SETUP_READS, sites


def test_the_read_is_one_small_tensor_and_nothing_else(models):
    with make_adapter(models["tadm"], AdaptiveDrift(0.2)) as adapter:
        total, per_step, sites = reads_per_step(adapter, sampler="remdm-conf")
    in_loop = {site: n for site, n in sites.items() if n >= T}
    assert len(in_loop) == 1 and list(in_loop.values()) == [T], sites
    assert all(n == 1 for site, n in sites.items() if site not in in_loop), sites


def test_ar_loop_reads_nothing_per_token(models):
    for kv_cache in (True, False):
        with count_host_syncs() as log:
            sample_ar(models["ar"], 2, L, bos_id=0, nucleus_p=0.9, kv_cache=kv_cache)
        assert log.total <= 1, dict(log.by_site)  # the tokens, once, to the host


def test_the_counter_sees_every_kind_of_read():
    x, mask = torch.arange(6.0), torch.tensor([True, False] * 3)
    with count_host_syncs() as log:
        x.sum().item(), x.tolist(), bool(x[0] > 1), int(x[1]), float(x[2]), x.nonzero(), torch.nonzero(x)
        x[mask], torch.equal(x, x), x.masked_select(mask), x.to(runtime.CPU), x.cpu(), [0, 1][x[1].long()]
        x[mask] = 0.0
        x[1:3], x[torch.tensor([0, 2])], x.to(torch.float64)  # not reads
    assert log.total == 14, dict(log.by_site)
    assert x.sum().item() == 9.0 and "__getitem__" not in vars(torch.Tensor)  # restored


# --------------------------------------------------------------------------- pieces


def test_decoded_rows_is_the_boolean_index_order():
    g = torch.Generator().manual_seed(0)
    for shape in ((1, 1), (3, 7), (4, 33)):
        for p in (0.0, 0.3, 1.0):
            decoded = torch.rand(shape, generator=g) < p
            n = int(decoded.sum())
            expected = decoded.reshape(-1).nonzero().squeeze(-1)
            assert torch.equal(decoded_rows(decoded, n), expected)
            x = torch.randn(*shape, 5, generator=g)
            assert torch.equal(x.flatten(0, 1).index_select(0, decoded_rows(decoded, n)), x[decoded])


def test_alpha_grid_equals_alpha_at_bit_for_bit():
    schedule = LogLinearSchedule(1e-3)
    for steps in (1, 7, 128, 1000):
        times = sorted({x for ts in time_grid(steps) for x in ts})
        assert alpha_grid(schedule, times) == [alpha_at(schedule, t) for t in times]


class OutOfRange(Sampler):
    names = ("test-out-of-range",)

    def transition(self, z_t, t, s, active):
        unmask = torch.full(z_t.shape, 1.5, dtype=self.settings.precision)
        return Transition(*self.rates(z_t, active, unmask, 0.0), 0.0, 0.0)


def test_a_per_position_rate_out_of_range_is_still_an_error(models):
    from tadm.sampling.loop import _trajectory

    settings = SamplerSettings(steps=4)
    sampler = OutOfRange(settings, V)
    try:
        message = r"rates must lie in \[0, 1\], got min 1.5"
        with make_adapter(models["mdlm"]) as adapter, pytest.raises(ValueError, match=message):
            _trajectory(adapter, sampler, settings, 2, L, torch.Generator().manual_seed(0), None)
    finally:
        SAMPLERS.unregister("test-out-of-range")
    z, active = torch.full((1, 4), V), torch.ones(4, dtype=torch.bool)
    with pytest.raises(ValueError, match="got min -0.5, max 0.5"):  # outside the loop: checked at once
        sampler.rates(z, active, torch.tensor([[-0.5, 0.5, 0.0, 0.0]], dtype=torch.float64), 0.0)
    assert sampler.pending_checks() == []


def test_autocast_setting(models, monkeypatch):
    with pytest.raises(ValueError, match="autocast"):
        SamplerSettings(autocast="fp16")
    from tadm import runtime

    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: False)  # a CPU without bf16: a no-op
    with make_adapter(models["tadm"], FixedInterval(2)) as adapter:
        a = sample(adapter, SamplerSettings(steps=8, seed=3), num_samples=2, seq_len=L)
        b = sample(adapter, SamplerSettings(steps=8, seed=3, autocast="bf16"), num_samples=2, seq_len=L)
    assert torch.equal(a.tokens, b.tokens) and b.settings.as_dict()["autocast"] == "bf16"
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: True)  # one with bf16: the network runs in it
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
             for m in models["tadm"].modules() if isinstance(m, torch.nn.Linear)]
    try:
        with make_adapter(models["tadm"], FixedInterval(2)) as adapter:
            c = sample(adapter, SamplerSettings(steps=8, seed=3, autocast="bf16"), num_samples=2, seq_len=L)
    finally:
        for h in hooks:
            h.remove()
    assert c.tokens.shape == a.tokens.shape and seen and set(seen) == {torch.bfloat16}


# --------------------------------------------------------------------------- AR KV cache


@pytest.mark.parametrize("precision", [torch.float32, torch.float64])
@pytest.mark.parametrize("nucleus_p", [0.9, 1.0])
def test_kv_cache_gives_the_uncached_tokens(models, precision, nucleus_p):
    ar = models["ar"]
    for seed in range(3):
        args = dict(bos_id=3, nucleus_p=nucleus_p, seed=seed, precision=precision)
        cached = sample_ar(ar, 3, 32, **args)
        uncached = sample_ar(ar, 3, 32, kv_cache=False, **args)
        assert torch.equal(cached.tokens, uncached.tokens)
        assert cached.settings.kv_cache and not uncached.settings.kv_cache


def test_kv_cache_logits_match_the_full_forward(models):
    ar = models["ar"]
    x = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = ar(x)
        cache = ar.new_cache(20)
        one_by_one = torch.cat([ar.forward_cached(x[:, i:i + 1], cache) for i in range(20)], dim=1)
        torch.testing.assert_close(one_by_one, full, rtol=1e-5, atol=1e-5)
        cache = ar.new_cache(20)  # a prefill, then chunks: the causal mask inside a chunk
        chunks = [ar.forward_cached(x[:, :7], cache), ar.forward_cached(x[:, 7:12], cache),
                  ar.forward_cached(x[:, 12:], cache)]
        torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-5, atol=1e-5)
        assert cache.length == 20
        with pytest.raises(ValueError, match="holds 20 positions"):
            ar.forward_cached(x[:, :1], cache)


def test_kv_cache_runs_each_position_once(models):
    ar, B, n = models["ar"], 2, 32
    layers, d, r = len(ar.blocks), TINY.d_model, TINY.mlp_ratio
    cached = sample_ar(ar, B, n, bos_id=0, seed=1).counters
    uncached = sample_ar(ar, B, n, bos_id=0, seed=1, kv_cache=False).counters
    for c in (cached, uncached):  # one forward per generated position either way
        assert c.model_calls == n - 1 and c.layer_calls_per_trajectory == layers * (n - 1)
    assert cached.layer_tokens == layers * B * (n - 1)  # O(L)
    assert uncached.layer_tokens == layers * B * n * (n - 1) // 2  # O(L^2)
    head = lm_head_flops(d, V)
    assert cached.flops == sum(B * (layers * dit_block_flops(d, i, r) + head) for i in range(1, n))
    assert uncached.flops == sum(B * i * (layers * dit_block_flops(d, i, r) + head) for i in range(1, n))


# --------------------------------------------------------------------------- CUDA (skipped without one)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("autocast", ["fp32", "bf16"])
def test_cuda_sampling_syncs_at_most_once_per_step(autocast):
    device = runtime.resolve_device()  # auto: the CUDA device
    for kind, refresh in (("mdlm", None), ("tadm", FixedInterval(4)), ("tadm", AdaptiveDrift(0.2))):
        model = random_model(kind, seq_len=32).to(device)
        with make_adapter(model, refresh) as adapter:
            settings = SamplerSettings(sampler="remdm-conf", steps=T, nucleus_p=0.9, autocast=autocast)
            sample(adapter, settings, num_samples=2, seq_len=L)  # warm-up (lazy CUDA init syncs)
            marks: list[int] = []
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    result = sample(adapter, settings, num_samples=2, seq_len=L,
                                    callback=lambda info: marks.append(len(caught)))
                finally:
                    torch.cuda.set_sync_debug_mode("default")
        steps = [b - a for a, b in zip(marks, marks[1:])]
        assert max(steps) <= 1, [str(w.message) for w in caught]
        assert result.tokens.device == runtime.CPU and (result.tokens < V).all()


@cuda
def test_cuda_kv_cache_matches_the_full_forward_and_runs_in_bf16():
    device = runtime.resolve_device()  # auto: the CUDA device
    ar = random_model("ar", seq_len=32).to(device)
    x = torch.randint(0, V, (2, 32), generator=torch.Generator().manual_seed(1)).to(device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.inference_mode():
            cache = ar.new_cache(32)
            steps = torch.cat([ar.forward_cached(x[:, i:i + 1], cache) for i in range(32)], dim=1)
            torch.testing.assert_close(steps, ar(x), rtol=1e-4, atol=1e-4)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    a = sample_ar(ar, 2, 32, bos_id=0, seed=0, autocast="bf16")
    b = sample_ar(ar, 2, 32, bos_id=0, seed=0, autocast="bf16", kv_cache=False)
    for r in (a, b):
        assert r.tokens.shape == (2, 32) and r.tokens.device == runtime.CPU and (r.tokens < V).all()
    assert a.settings.autocast == "bf16" and a.counters.layer_tokens < b.counters.layer_tokens


@pytest.mark.parametrize("sampler", ["mdlm", "remdm-loop", "sedd-analytic", "mdlm-dfm"])
def test_masks_drawn_ahead_give_the_step_by_step_trajectory(models, monkeypatch, sampler):
    """The plan draws the same uniforms from the trajectory's mask generator as one step at a
    time would: the same tokens with PLAN_STEPS = 1, 3 and the default, with and without a
    callback, across semi-AR blocks, and with a TADM anchor refreshed every 4 steps."""
    import tadm.sampling.loop as loop

    kind = "sedd" if sampler == "sedd-analytic" else "tadm"
    out = {}
    for plan_steps in (1, 3, loop.PLAN_STEPS):
        monkeypatch.setattr(loop, "PLAN_STEPS", plan_steps)
        for with_callback in (False, True):
            with make_adapter(models[kind], FixedInterval(4) if kind == "tadm" else None) as adapter:
                cfg = SamplerSettings(sampler=sampler, steps=T, nucleus_p=0.9, ddpm_cache=False, block_size=8, eta=0.05)
                result = sample(adapter, cfg, num_samples=3, seq_len=L,
                                callback=(lambda info: None) if with_callback else None)
            out[plan_steps, with_callback] = result.tokens
    first = next(iter(out.values()))
    assert all(torch.equal(first, tokens) for tokens in out.values())
