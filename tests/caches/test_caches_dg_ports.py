"""dKV-Cache's and d²Cache's row rules ported to the tiny random DiffusionGemma (the real
transformers class): K = 1 and a selection of every row give the base's tokens exactly; the
rows a hand-made step recomputes are the rule's; the counters are the rows counted; a
left-padded batch of 3 runs with its sequences topped up to equal counts."""

from types import SimpleNamespace

import pytest
import torch

from tests.posttrain.conftest import CANVAS, VOCAB

from tadm.caches.catalog import D2CACHE_RELEASE, D2CACHE_SPAN
from tadm.caches.diffusiongemma.d2cache import D2CacheDiffusionGemma, d2cache_rows, scaled_current_k
from tadm.caches.diffusiongemma.dkv import DkvCacheDiffusionGemma, dkv_rows
from tadm.caches.diffusiongemma.feature import StepSelectionCache, fill_rows
from tadm.caches.llada.d2cache import LladaD2CacheBackend
from tadm.config import Params
from tadm.config.posttrain import PosttrainConfig
from tadm.errors import ConfigError
from tadm.experiments.diffusiongemma import DecoderLayerCalls
from tadm.posttrain.anchored import sampling_kwargs
from tadm.posttrain.backbone import SplitDiffusionGemma
from tadm.registry import DG_CACHES

SPLIT = (1, 3, 2)
L = sum(SPLIT)
STEPS, CANVASES, PROMPT = 6, 2, 5


def params() -> Params:
    return Params(posttrain=PosttrainConfig(shared_layers=SPLIT[0], anchor_layers=SPLIT[1], denoiser_layers=SPLIT[2]))


def batch(size: int = 2, seed: int = 0):
    """`size` prompts of PROMPT tokens, sequence i left-padded by i (pad id 0)."""
    ids = torch.randint(3, VOCAB, (size, PROMPT), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for i in range(size):
        ids[i, :i], mask[i, :i] = 0, 0
    return ids, mask


def generate(model, ids, mask, seed=11, steps=STEPS, peaked=False, **kw):
    """`peaked`: a temperature of 0.01 -> 0.005 and an entropy bound of 1, so that the random
    model's near-uniform predictions become confident enough for the sampler to accept several
    positions a step and to re-draw the same token where it accepts one again (the rules then keep rows)."""
    torch.manual_seed(seed)
    eta, temperature = (1.0, (0.01, 0.005)) if peaked else (0.1, (0.8, 0.4))
    kwargs = sampling_kwargs(steps, eta, temperature, CANVASES * CANVAS, eos_token_id=None, pad_token_id=None)
    return model.generate(ids, attention_mask=mask, **kwargs, **kw).sequences


def dkv(base, k):
    return DkvCacheDiffusionGemma(SplitDiffusionGemma(base, *SPLIT), k)


class EveryRow(DkvCacheDiffusionGemma):
    """The dKV model with a rule that selects every row (the partial path at full width)."""

    def select(self, ids, decided, prev_ids, prev_decided):
        return torch.ones_like(decided), torch.zeros(decided.shape)


def recording(model):
    """Wrap `model.select` to record each reuse step's (wanted rows, rows run)."""
    seen = []
    inner = model._step_rows

    def step_rows(ids, refresh, new_canvas):
        rows = inner(ids, refresh, new_canvas)
        seen.append((refresh, rows))
        return rows

    model._step_rows = step_rows
    return seen


@pytest.fixture(scope="module")
def base_tokens(tiny_base):
    ids, mask = batch()
    return generate(tiny_base, ids, mask)


# ----------------------------------------------------------------------------- exactness


def test_dkv_refreshed_every_step_is_the_base(tiny_base, base_tokens):
    ids, mask = batch()
    model = dkv(tiny_base, 1)
    assert torch.equal(generate(model, ids, mask), base_tokens)
    c = model.counters
    assert c.steps == c.refreshes == CANVASES * STEPS and model.partial_layer_calls == 0
    assert c.full_layer_calls == CANVASES * STEPS * L


def test_a_selection_of_every_row_is_the_base(tiny_base, base_tokens):
    """K = T: every step after a canvas's first runs every layer, layer 0 included, through the
    partial path with every row selected (V of the selected rows only): the stock kernels on the
    stock shapes, the base's tokens exactly."""
    ids, mask = batch()
    model = EveryRow(SplitDiffusionGemma(tiny_base, *SPLIT), STEPS)
    assert torch.equal(generate(model, ids, mask), base_tokens)
    assert model.counters.refreshes == CANVASES
    assert model.partial_layer_calls == CANVASES * (STEPS - 1) * L


def test_dkv_keeps_rows_when_the_sampler_decides(tiny_base):
    """At the test's sampling (DiffusionGemma's temperatures, entropy bound 0.1) the random model
    is so unsure that the sampler accepts one position a step, re-drawn each time: dKV keeps
    nothing. Sharpened, it keeps rows, and the tokens move away from the base's."""
    ids, mask = batch()
    model = dkv(tiny_base, STEPS)
    generate(model, ids, mask)
    assert model.partial_layer_calls == CANVASES * (STEPS - 1) * L  # every row, every reuse step
    model = dkv(tiny_base, STEPS)
    out = generate(model, ids, mask, peaked=True)
    assert model.partial_layer_calls < CANVASES * (STEPS - 1) * L
    assert not torch.equal(out, generate(tiny_base, ids, mask, peaked=True))


# ----------------------------------------------------------------------------- the rule on hand-made steps


def hand_inputs(base, size=2):
    ids, mask = batch(size)
    with torch.no_grad():
        cache = base.model.encoder(input_ids=ids, attention_mask=mask).cache
    return cache, torch.nn.functional.pad(mask, (0, CANVAS), value=1)


def test_dkv_recomputes_the_rows_not_decided_and_unchanged(tiny_base):
    """Step 0 refreshes; step 1 recomputes every row (nothing is decided in a canvas's first
    input); step 2 the rows not decided in step 1's input or changed since; step 3 tops the
    sequence with fewer rows up with the rows computed longest ago."""
    cache, dec_mask = hand_inputs(tiny_base)
    model = dkv(tiny_base, 10)
    g = torch.Generator().manual_seed(4)
    z0 = torch.randint(0, VOCAB, (2, CANVAS), generator=g)
    sc = torch.randn(2, CANVAS, VOCAB, generator=g)
    z1, z2 = z0.clone(), z0.clone()
    d1 = torch.zeros(2, CANVAS, dtype=torch.bool)
    d1[0, [1, 2, 5]] = True
    d1[1, [0, 1, 2, 3, 4, 6]] = True
    d2 = d1.clone()
    d2[0, 3] = True  # just decided: recomputed (one step delayed)
    d2[1, 4] = False  # re-noised: recomputed
    z2[0, 3] = (z2[0, 3] + 1) % VOCAB
    z2[1, 4] = (z2[1, 4] + 1) % VOCAB
    z2[1, 2] = (z2[1, 2] + 1) % VOCAB  # accepted again with another token: recomputed
    z3, d3 = z2.clone(), d2.clone()  # nothing moves
    with torch.no_grad():
        model(z0, cache, decoder_attention_mask=dec_mask)
        assert model.last_rows is None and model.counters.refreshes == 1
        model.sampler = SimpleNamespace(accepted_token_mask=d1)
        model(z1, cache, sc, decoder_attention_mask=dec_mask)
        assert torch.equal(model.last_rows, torch.arange(CANVAS).expand(2, CANVAS))
        model.sampler.accepted_token_mask = d2
        model(z2, cache, sc, decoder_attention_mask=dec_mask)
        want = dkv_rows(z2, d2, z1, d1)
        assert want[0].nonzero().flatten().tolist() == [0, 3, 4, 6, 7]
        assert want[1].nonzero().flatten().tolist() == [2, 4, 5, 7]
        # sequence 1 topped up to 5 rows: every row was computed at step 1, so the lowest free position
        assert model.last_rows.tolist() == [[0, 3, 4, 6, 7], [0, 2, 4, 5, 7]]
        model.sampler.accepted_token_mask = d3
        model(z3, cache, sc, decoder_attention_mask=dec_mask)
        assert dkv_rows(z3, d3, z2, d2)[0].nonzero().flatten().tolist() == [0, 4, 6, 7]  # row 3 is kept from now on
        assert dkv_rows(z3, d3, z2, d2)[1].nonzero().flatten().tolist() == [4, 5, 7]  # so is row 2
        # sequence 1 topped up to 4 by the row computed longest ago: 1 (step 1; 0 was at step 2)
        assert model.last_rows.tolist() == [[0, 4, 6, 7], [1, 4, 5, 7]]
    c = model.counters
    assert c.steps == 4 and c.refreshes == 1 and c.full_layer_calls == L
    assert model.partial_layer_calls == pytest.approx(L * (8 + 5 + 4) / CANVAS)


def test_kept_rows_on_an_unchanged_input_are_the_stock_output(tiny_base):
    """Nothing moved since the refresh: every cached feature is exact, so a reuse step that
    recomputes some rows returns the base's logits (kept rows bit for bit up to the recomputed
    rows' round-off through attention)."""
    cache, dec_mask = hand_inputs(tiny_base)
    model = dkv(tiny_base, 10)
    z = torch.randint(0, VOCAB, (2, CANVAS), generator=torch.Generator().manual_seed(6))
    sc = torch.randn(2, CANVAS, VOCAB, generator=torch.Generator().manual_seed(7))
    decided = torch.rand(2, CANVAS, generator=torch.Generator().manual_seed(8)) < 0.5
    with torch.no_grad():
        ref = tiny_base(decoder_input_ids=z, cache=cache, self_conditioning_logits=sc,
                        decoder_attention_mask=dec_mask).logits
        model(z, cache, decoder_attention_mask=dec_mask)  # a canvas's first step
        model.sampler = SimpleNamespace(accepted_token_mask=decided)
        model._due = lambda *a: True  # a refresh on the self-conditioned input
        model(z, cache, sc, decoder_attention_mask=dec_mask)
        del model._due
        out = model(z, cache, sc, decoder_attention_mask=dec_mask).logits  # the same input again: a reuse step
    rows = model.last_rows
    assert 0 < rows.shape[1] < CANVAS
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


def test_fill_rows_tops_up_to_equal_counts_by_priority():
    want = torch.tensor([[1, 0, 1, 0, 1], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    priority = torch.tensor([[0.0, 0, 0, 0, 0], [5, 1, 3, 9, 3], [1, 1, 1, 1, 1]])
    assert fill_rows(want, priority).tolist() == [[0, 2, 4], [0, 2, 3], [0, 1, 2]]
    assert fill_rows(torch.zeros(2, 4, dtype=torch.bool), torch.zeros(2, 4)).shape == (2, 0)


# ----------------------------------------------------------------------------- counts, batches


def counted(model, base, k) -> tuple[list, int, float]:
    """Generate with `model` at interval k, checking its step, refresh and stock-layer counters
    against the hooks; returns (the recorded steps, the refreshes, the partial calls they add up to)."""
    ids, mask = batch()
    seen = recording(model)
    counter = DecoderLayerCalls(base)
    try:
        generate(model, ids, mask, peaked=True)
    finally:
        counter.close()
    refreshes = CANVASES * -(-STEPS // k)
    c = model.counters
    assert c.steps == len(seen) == CANVASES * STEPS and c.refreshes == refreshes
    assert counter.calls == c.full_layer_calls == L * refreshes
    return seen, refreshes, sum(L * rows.shape[1] / CANVAS for r, rows in seen if not r)


@pytest.mark.parametrize("k", [2, 3])
def test_dkv_counters_are_the_rows_counted(tiny_base, k):
    model = dkv(tiny_base, k)
    seen, _, partial = counted(model, tiny_base, k)
    assert model.partial_layer_calls == pytest.approx(partial)
    assert all(rows.shape[1] == CANVAS for r, rows in seen[1:2])  # step 1 of a canvas: every row


def test_dkv_runs_a_left_padded_batch_of_three(tiny_base):
    """Each sequence recomputes at least its own rule's rows; the batch runs the largest count."""
    ids, mask = batch(3)
    model = dkv(tiny_base, 3)
    wants = []
    inner = model.select

    def select(ids, decided, prev_ids, prev_decided):
        want, priority = inner(ids, decided, prev_ids, prev_decided)
        wants.append(want)
        return want, priority

    model.select = select
    seen = recording(model)
    out = generate(model, ids, mask, peaked=True)
    assert out.shape == (3, PROMPT + CANVASES * CANVAS)
    assert wants and model.counters.refreshes == CANVASES * 2
    ran = [rows for refresh, rows in seen if not refresh]
    assert len(ran) == len(wants) == CANVASES * (STEPS - 2)
    unequal = False
    for want, rows in zip(wants, ran):
        assert rows.shape == (3, int(want.sum(1).max()))
        got = torch.zeros_like(want).scatter_(1, rows, True)
        assert bool((got | ~want).all()) and torch.equal(rows, rows.sort(1).values)  # the rule's rows, in order
        unequal |= bool((want.sum(1) != want.sum(1).max()).any())
    assert unequal  # the top-up ran
    assert model.partial_layer_calls == pytest.approx(sum(L * int(w.sum(1).max()) / CANVAS for w in wants))


# ----------------------------------------------------------------------------- registry, contract


def test_registry_builds_dkv(tiny_base):
    from tadm.caches.diffusiongemma.base import CacheModel

    unit = DG_CACHES["dkv"]
    model = unit.build(tiny_base, params(), 3)
    assert isinstance(model, DkvCacheDiffusionGemma) and isinstance(model, StepSelectionCache)
    assert isinstance(model, CacheModel) and model.refresh_every == 3 and model.split.split == SPLIT
    assert unit.layer_calls is None  # counted: no closed form
    with pytest.raises(ConfigError, match="posttrain.refresh_every") as e:
        dkv(tiny_base, 0)
    assert "\n" not in str(e.value)


def test_forward_outside_generate_needs_the_sampler(tiny_base):
    cache, dec_mask = hand_inputs(tiny_base)
    model = dkv(tiny_base, 10)
    z = torch.randint(0, VOCAB, (2, CANVAS), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        model(z, cache, decoder_attention_mask=dec_mask)
        with pytest.raises(RuntimeError, match="accepted_token_mask"):
            model(z, cache, torch.zeros(2, CANVAS, VOCAB), decoder_attention_mask=dec_mask)


# ============================================================================= d²Cache


RELEASE = {**D2CACHE_RELEASE, "span": D2CACHE_SPAN}  # what the catalog builds with


def d2(base, k, **kw):
    return D2CacheDiffusionGemma(SplitDiffusionGemma(base, *SPLIT), k, **{**RELEASE, **kw})


class EveryRowD2(D2CacheDiffusionGemma):
    def select(self, ids, decided, prev_ids, prev_decided):
        super().select(ids, decided, prev_ids, prev_decided)  # the rule runs (its inputs are kept)
        return torch.ones_like(decided), torch.zeros(decided.shape)


def test_d2cache_refreshed_every_step_is_the_base(tiny_base, base_tokens):
    ids, mask = batch()
    model = d2(tiny_base, 1)
    assert torch.equal(generate(model, ids, mask), base_tokens)
    assert model.counters.refreshes == CANVASES * STEPS and model.partial_layer_calls == 0


def test_d2cache_with_every_row_selected_is_the_base(tiny_base, base_tokens):
    """The rollout's weights are computed beside the stock attention and change nothing."""
    ids, mask = batch()
    model = EveryRowD2(SplitDiffusionGemma(tiny_base, *SPLIT), STEPS, **RELEASE)
    assert torch.equal(generate(model, ids, mask), base_tokens)
    assert model.partial_layer_calls == CANVASES * (STEPS - 1) * L


def test_current_k_is_scaled_to_the_canvas():
    k, span = D2CACHE_RELEASE["current_k"], D2CACHE_SPAN
    assert (k, span) == (32, 256)
    assert [scaled_current_k(n, k, span) for n in (256, 32, CANVAS, 512, 3)] == [32, 4, 1, 64, 1]
    assert scaled_current_k(CANVAS, 5, None) == 5


def llada_select(ids, decided, prev_decided, conf0, importance, k, sigma, top_p, inflate_w):
    """The LLaDA port's d²Cache selection (tested against the release) on the same canvas as a
    one-block LLaDA region with no prompt: undecided rows hold the mask id."""
    mask_id = VOCAB
    stub = SimpleNamespace(_prompt=0, mask_id=mask_id, _served=(0, ids.shape[1]), _conf0=conf0,
                           _importance=importance, sigma=sigma, current_k=k, rollout_p=top_p, inflate_w=inflate_w,
                           _prev=torch.where(prev_decided, ids, mask_id))
    return LladaD2CacheBackend._select(stub, torch.where(decided, ids, mask_id))[0]


@pytest.mark.parametrize("k, inflate_w", [(1, 0), (3, 0), (2, 2), (8, 0)])
def test_d2cache_rows_are_the_llada_ports_on_llada_like_steps(k, inflate_w):
    """Where decided tokens are final (LLaDA's case: a step only adds decided rows), the rows
    are the LLaDA port's, which its tests match against the release's loop."""
    g = torch.Generator().manual_seed(k + inflate_w)
    for _ in range(20):
        ids = torch.randint(3, VOCAB, (3, CANVAS), generator=g)
        prev = torch.rand(3, CANVAS, generator=g) < 0.4
        decided = prev | (torch.rand(3, CANVAS, generator=g) < 0.3)
        conf0, importance = torch.rand(3, CANVAS, generator=g), torch.rand(3, CANVAS, generator=g) * 2
        want, _ = d2cache_rows(ids, decided, ids, prev, conf0, importance, k, 10.0, 0.1, inflate_w)
        assert torch.equal(want, llada_select(ids, decided, prev, conf0, importance, k, 10.0, 0.1, inflate_w))


def test_d2cache_recomputes_every_moved_row():
    """DiffusionGemma's extra events: a re-noised row and a row accepted again with another token
    are recomputed like a just-decided one; an unchanged decided row is left to the ranking (here
    the one best-scored undecided row, 5, next to the decided rows, and the one row the rollout
    attends to most, 6)."""
    ids = torch.arange(CANVAS).expand(1, CANVAS) + 3
    prev = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    decided = torch.tensor([[1, 0, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)  # 1 re-noised, 4 just decided
    now = ids.clone()
    now[0, 3] += 1  # accepted again with another token
    importance = torch.tensor([[1.0, 1, 2, 1, 1, 1, 9, 3]])
    want, priority = d2cache_rows(now, decided, ids, prev, torch.ones(1, CANVAS), importance, 1, 10.0, 0.1)
    assert want[0].nonzero().flatten().tolist() == [1, 3, 4, 5, 6]
    # current_k = 2: 5 and 6 (the window starts at 4, the first row undecided before, though the
    # re-noised row 1 precedes it); the nucleus of the rest (0, 2, 7) is its most attended row, 7
    want, _ = d2cache_rows(now, decided, ids, prev, torch.ones(1, CANVAS), importance, 2, 10.0, 0.1)
    assert want[0].nonzero().flatten().tolist() == [1, 3, 4, 5, 6, 7]


def test_d2cache_hand_made_steps(tiny_base):
    """Step 0's confidence and rollout are the base's (its eager attention weights rolled out by
    hand); step 1 recomputes the rule's rows on them, topped up by importance + score."""
    import copy

    cache, dec_mask = hand_inputs(tiny_base)
    model = d2(tiny_base, 10)
    g = torch.Generator().manual_seed(12)
    z0 = torch.randint(0, VOCAB, (2, CANVAS), generator=g)
    sc = torch.randn(2, CANVAS, VOCAB, generator=g)
    d1 = torch.rand(2, CANVAS, generator=g) < 0.5
    eager = copy.deepcopy(tiny_base)
    eager.config._attn_implementation = eager.config.text_config._attn_implementation = "eager"
    weights = []
    hooks = [layer.self_attn.register_forward_hook(lambda _m, _i, out: weights.append(out[1]))
             for layer in eager.model.decoder.layers]
    with torch.no_grad():
        ref = eager(decoder_input_ids=z0, cache=cache, decoder_attention_mask=dec_mask).logits
        for h in hooks:
            h.remove()
        out = model(z0, cache, decoder_attention_mask=dec_mask).logits
        assert torch.allclose(out, ref, atol=1e-5)
        rollout = torch.eye(CANVAS).expand(2, CANVAS, CANVAS)
        for w in weights:
            a = w.float().mean(dim=1)[..., -CANVAS:] + torch.eye(CANVAS)
            rollout = (a / a.sum(-1, keepdim=True)) @ rollout
        assert torch.allclose(model._importance, rollout.sum(dim=1), atol=1e-5)
        assert torch.allclose(model._conf0, torch.softmax(ref, -1).max(-1).values, atol=1e-6)
        conf0, importance = model._conf0, model._importance
        model.sampler = SimpleNamespace(accepted_token_mask=d1)
        model(z0, cache, sc, decoder_attention_mask=dec_mask)
    want, priority = d2cache_rows(z0, d1, z0, torch.zeros_like(d1), conf0, importance, 1, 10.0, 0.1)
    assert torch.equal(want, d1 | want)  # every just-decided row
    assert torch.equal(model.last_rows, fill_rows(want, priority))
    assert model.partial_layer_calls == pytest.approx(L * model.last_rows.shape[1] / CANVAS)


@pytest.mark.parametrize("k", [2, 3])
def test_d2cache_counters_are_the_rows_counted(tiny_base, k):
    model = d2(tiny_base, k)
    seen, refreshes, partial = counted(model, tiny_base, k)
    assert model.partial_layer_calls == pytest.approx(partial) and partial < (CANVASES * STEPS - refreshes) * L


def test_d2cache_runs_a_left_padded_batch_of_three(tiny_base):
    ids, mask = batch(3)
    model = d2(tiny_base, 3)
    wants = []
    inner = model.select

    def select(*args):
        want, priority = inner(*args)
        wants.append(want)
        return want, priority

    model.select = select
    seen = recording(model)
    out = generate(model, ids, mask, peaked=True)
    assert out.shape == (3, PROMPT + CANVASES * CANVAS)
    ran = [rows for refresh, rows in seen if not refresh]
    assert len(ran) == len(wants) == CANVASES * (STEPS - 2)
    unequal = False
    for want, rows in zip(wants, ran):
        assert rows.shape == (3, int(want.sum(1).max()))
        got = torch.zeros_like(want).scatter_(1, rows, True)
        assert bool((got | ~want).all())
        unequal |= bool((want.sum(1) != want.sum(1).max()).any())
    assert unequal  # the top-up ran
    assert model.partial_layer_calls == pytest.approx(sum(L * r.shape[1] / CANVAS for r in ran))


def test_registry_builds_d2cache_and_checks_its_constants(tiny_base):
    unit = DG_CACHES["d2cache"]
    model = unit.build(tiny_base, params(), 2)
    assert isinstance(model, D2CacheDiffusionGemma) and model.refresh_every == 2 and unit.layer_calls is None
    assert (model.rollout_p, model.current_k, model.sigma, model.inflate_w, model.span) == (0.1, 32, 10.0, 0, 256)
    for key, kw in (("rollout_p", {"rollout_p": 1.5}), ("current_k", {"current_k": 0}), ("sigma", {"sigma": 0.0}),
                    ("inflate_w", {"inflate_w": -1}), ("span", {"span": 0})):
        with pytest.raises(ConfigError, match=key) as e:
            d2(tiny_base, 2, **kw)
        assert "\n" not in str(e.value)
