"""d²Cache on LLaDA (tadm.caches.llada.d2cache) against a small reference of the release's loop
(tests/caches/release_refs.py: ref_vanilla_d2cache, written from Kamichanw/d2Cache @72feb60, its
decoder ranking by confidence) on a random LLaDA in float32: the same tokens and the same row set
at every pass, over the whole span and with semi-AR blocks, at batch 1 and on a left-padded batch
of 3; the certainty density against the release's FFT form; the counts."""

import pytest
import torch

from tadm.asrd.decode import DecodeSettings, decode
from tadm.caches.llada import d2cache as D
from tadm.errors import ConfigError
from tadm.models import llada
from tests.caches.release_refs import ref_certainty_density, ref_vanilla_d2cache

from tests.caches.test_caches_llada import tiny_model

P, G = 6, 16
N = P + G
PADS = (0, 2, 3)
LAYERS = 4


def tiny(seed: int = 0, kv_heads: int | None = None) -> llada.LladaModel:
    """The suite's random LLaDA, by default with 2 heads of their own K/V."""
    return tiny_model(seed, kv_heads=kv_heads)


@pytest.fixture(scope="module")
def model():
    return tiny()


def prompts(batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 40, (batch, P), generator=g)
    pad = torch.ones(batch, N, dtype=torch.bool)
    for r in range(batch):
        ids[r, : PADS[r]], pad[r, : PADS[r]] = 1, False
    return ids, pad


class Recording(D.LladaD2CacheBackend):
    def start(self):
        super().start()
        self.passes: list[torch.Tensor] = []

    def logits(self, ids, delta=None):
        out = super().logits(ids, delta)
        self.passes.append(self.last_rows.clone())
        return out


def run(backend, model, batch: int, block: int | None, seed: int = 0):
    ids, pad = prompts(batch, seed)
    canvas = torch.cat([ids, torch.full((batch, G), model.mask_id)], dim=1)
    backend.set_padding(pad)
    return decode(backend, canvas, torch.arange(N) >= P,
                  DecodeSettings(method="low-confidence", steps=G, block_size=block))


@pytest.mark.parametrize("sigma", [10.0, 3.0])
def test_certainty_density_is_the_releases_fft(sigma):
    g = torch.Generator().manual_seed(0)
    for n in (1, 5, 16, 40):
        mask = torch.rand(6, n, generator=g) < 0.5
        mask[0], mask[1] = True, False
        torch.testing.assert_close(D.certainty_density(mask, sigma), ref_certainty_density(mask, sigma),
                                   rtol=1e-5, atol=1e-6)


SETTINGS = {  # (block, rollout_p, current_k, sigma, inflate_w)
    "whole-span-k4": (None, 0.1, 4, 10.0, 0),
    "whole-span-k32": (None, 0.1, 32, 10.0, 0),
    "whole-span-p0.3-sigma3": (None, 0.3, 6, 3.0, 0),
    "semi-ar-8-w4": (8, 0.1, 4, 10.0, 4),
}


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_d2cache_matches_release(model, name, batch):
    """The same tokens and, at every pass, the same row set (after the top-up) as the release's
    loop; at batch 3 both mask pad keys and place rows at unshifted positions."""
    block, rollout_p, current_k, sigma, inflate_w = SETTINGS[name]
    for seed in range(3):
        ids, pad = prompts(batch, seed)
        ref, ref_passes = ref_vanilla_d2cache(model, ids, G, block or G, rollout_p, current_k, sigma, inflate_w,
                                              pad=pad if batch > 1 else None)
        backend = Recording(model, rollout_p, current_k, sigma, inflate_w)
        r = run(backend, model, batch, block, seed)
        assert torch.equal(r.tokens, ref), (seed, r.tokens[:, P:], ref[:, P:])
        assert r.counters.calls == len(ref_passes) == G
        for i, (got, want) in enumerate(zip(backend.passes, ref_passes)):
            assert torch.equal(got, want), (seed, i, got.int(), want.int())
        assert r.counters.refreshes == 1 and backend.passes[0].all() and not backend.passes[-1].all()


@pytest.mark.parametrize("batch", [1, 3])
def test_the_row_as_released_decodes_with_the_certainty_prior_like_the_release(model, batch):
    """The LLaDA group's d²Cache row: the release's cache settings (`D2CACHE_RELEASE`) and its
    decoder (confidence x certainty density with the same sigma, one block over the region, one
    token a step: `DecodeSettings.certainty_sigma`): the release's tokens and row sets."""
    from tadm.caches.catalog import D2CACHE_RELEASE as R

    for seed in range(3):
        ids, pad = prompts(batch, seed)
        ref, ref_passes = ref_vanilla_d2cache(model, ids, G, G, R["rollout_p"], R["current_k"], R["sigma"],
                                              R["inflate_w"], pad=pad if batch > 1 else None, prior=R["sigma"])
        backend = Recording(model, **R)
        canvas = torch.cat([ids, torch.full((batch, G), model.mask_id)], dim=1)
        backend.set_padding(pad)
        r = decode(backend, canvas, torch.arange(N) >= P,
                   DecodeSettings(method="low-confidence", steps=G, certainty_sigma=R["sigma"]))
        assert torch.equal(r.tokens, ref), (seed, r.tokens[:, P:], ref[:, P:])
        for i, (got, want) in enumerate(zip(backend.passes, ref_passes)):
            assert torch.equal(got, want), (seed, i)
    # the prior decides the order: at a narrow sigma the first pick is the position next to the prompt
    backend = Recording(model, **R)
    ids, pad = prompts(1)
    canvas = torch.cat([ids, torch.full((1, G), model.mask_id)], dim=1)
    backend.set_padding(pad)
    seen: list = []
    decode(backend, canvas, torch.arange(N) >= P, DecodeSettings(method="low-confidence", steps=G, certainty_sigma=0.5),
           callback=seen.append)
    assert seen[0].committed[0, P] and int(seen[0].committed.sum()) == 1
    with pytest.raises(ConfigError, match=r"asrd.certainty_sigma: must be None or > 0, got 0.0"):
        DecodeSettings(certainty_sigma=0.0)


def test_shifted_positions_effect(model):
    """The release's LLaDA places left-padded rows at positions shifted by their padding. Over 8
    padded batches of 3 (whole span, current_k 4), the reference with shifted and with unshifted
    positions: the shares of generated tokens and of passes' row sets that differ (the deviation)."""
    tokens = passes = 0
    n_tok = n_pass = 0
    for seed in range(8):
        ids, pad = prompts(3, seed)
        a, pa = ref_vanilla_d2cache(model, ids, G, G, 0.1, 4, 10.0, 0, pad=pad, shifted=True)
        b, pb = ref_vanilla_d2cache(model, ids, G, G, 0.1, 4, 10.0, 0, pad=pad, shifted=False)
        assert torch.equal(a[0], b[0])  # the unpadded row
        tokens += int((a[1:, P:] != b[1:, P:]).sum())
        n_tok += a[1:, P:].numel()
        passes += sum(int(not torch.equal(x[1:], y[1:])) for x, y in zip(pa, pb))
        n_pass += len(pa)
    assert tokens / n_tok < 0.05 and passes / n_pass < 0.05  # measured: none differ (docs/deviations.md)


def test_counts_are_the_row_sets(model):
    """The first pass is L; every later pass L |Q| / N; one refresh."""
    backend = Recording(model, 0.1, 4, 10.0, 0)
    r = run(backend, model, 3, None)
    expected = LAYERS + sum(LAYERS * int(q.sum(1).max()) / N for q in backend.passes[1:])
    assert r.counters.layer_calls_weighted == pytest.approx(expected) and expected < LAYERS * G
    assert r.counters.layer_calls == LAYERS * G and r.counters.refreshes == 1
    assert all(int(q.sum(1).min()) == int(q.sum(1).max()) for q in backend.passes)  # topped up


def test_confidence_is_frozen_at_the_first_pass(model):
    backend = D.LladaD2CacheBackend(model, 0.1, 4, 10.0, 0)
    run(backend, model, 1, None)
    ids, _ = prompts(1)
    canvas = torch.cat([ids, torch.full((1, G), model.mask_id)], dim=1)
    first = model(canvas).float()
    first[..., model.mask_id] = float("-inf")
    torch.testing.assert_close(backend._conf0, torch.softmax(first[:, P:], -1).max(-1).values, rtol=1e-5, atol=1e-6)


def test_a_gqa_model_runs(model):
    """Not in the release's tests (LLaDA-8B is MHA): grouped K/V heads decode without error and
    the first pass equals the model's."""
    gqa = tiny(1, kv_heads=1)
    r = run(D.LladaD2CacheBackend(gqa, 0.1, 4, 10.0, 0), gqa, 3, None)
    assert r.counters.calls == G and not (r.tokens[:, P:] == gqa.mask_id).any()


def test_helpers():
    q = torch.tensor([[True, False, False, True, False, False, False, True]])
    assert D.inflate(q, 3).int().tolist() == [[1, 1, 1, 1, 0, 0, 0, 1]]
    assert D.inflate(q, 4).int().tolist() == [[1, 1, 1, 1, 1, 1, 1, 1]]
    scores = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.0, 0.0, 1.0, 0.0]])
    allowed = torch.tensor([[True, True, True, True], [True, True, False, True]])
    # the second row's allowed scores are all 0: the running share stays 0, so every allowed row is kept
    assert D.nucleus(scores, 0.6, allowed).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 1]]
    assert D.nucleus(scores, 0.9, allowed).int().tolist()[0] == [1, 1, 0, 0]
    topped = D.top_up(torch.tensor([[True, False, False], [True, True, False]]), torch.tensor([[0., 2., 1.], [0., 0., 5.]]))
    assert topped.int().tolist() == [[1, 1, 0], [1, 1, 0]]


@pytest.mark.parametrize("kwargs, expected", [
    ({"rollout_p": 1.5}, "rollout_p: must be in [0, 1]"),
    ({"current_k": 0}, "current_k: must be an integer >= 1"),
    ({"sigma": 0.0}, "sigma: must be > 0"),
    ({"inflate_w": -1}, "inflate_w: must be an integer >= 0"),
])
def test_bad_settings_are_one_line_naming_the_parameter(model, kwargs, expected):
    with pytest.raises(ValueError) as e:
        D.LladaD2CacheBackend(model, **kwargs)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)
