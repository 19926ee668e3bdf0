"""The training-free caches on a tiny random DiffusionGemma (the real transformers class).

T1 the partial layer with every row selected is the stock layer; T2 / T3 the feature cache at
K_r = 1 and at share = 1 gives the base's tokens; T4 its layer calls follow the closed form and
match TADM's; T5 the naive reuse; T6 Fast-dLLM's prefix cache is built into the base.
"""

import copy
import math

import pytest
import torch
from torch.nn import functional as F

from tests.posttrain.conftest import CANVAS, VOCAB

from tadm.caches.budget import feature_layer_calls, matched_share, selected_rows, tadm_layer_calls
from tadm.caches.diffusiongemma import BypassFusion, FeatureCacheDiffusionGemma, naive_model
from tadm.caches.diffusiongemma.feature import capture_layer, least_similar_rows, partial_layer, stock_layer
from tadm.registry import DG_CACHES
from tadm.config import Params
from tadm.config.posttrain import PosttrainConfig
from tadm.errors import ConfigError
from tadm.posttrain.anchored import TimeAnchoredDiffusionGemma, sampling_kwargs
from tadm.posttrain.backbone import SplitDiffusionGemma
from tadm.posttrain.fusion import PairedAttentionFusion
from tadm.experiments.diffusiongemma import DecoderLayerCalls

SPLIT = (1, 3, 2)  # L = 6 layers: 5 sliding, the last full attention
L = sum(SPLIT)
STEPS, CANVASES = 6, 2
PROMPT = 5
SHARE = matched_share(SPLIT)  # (1 + 2 - 1) / 5 = 0.4 -> n_sel = floor(3.2) = 3 of 8


def params() -> Params:
    return Params(posttrain=PosttrainConfig(shared_layers=SPLIT[0], anchor_layers=SPLIT[1], denoiser_layers=SPLIT[2]))


def batch(padded: bool = True, seed: int = 0):
    """Two prompts of PROMPT tokens; the second left-padded by two (pad id 0) when `padded`."""
    ids = torch.randint(3, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    if padded:
        ids[1, :2], mask[1, :2] = 0, 0
    return ids, mask


def gen_kwargs():
    return sampling_kwargs(STEPS, 0.1, (0.8, 0.4), CANVASES * CANVAS, eos_token_id=None, pad_token_id=None)


def generate(model, ids, mask, seed=11, **kw):
    torch.manual_seed(seed)
    return model.generate(ids, attention_mask=mask, **gen_kwargs(), **kw).sequences


def feature(base, k, share=SHARE):
    return FeatureCacheDiffusionGemma(SplitDiffusionGemma(base, *SPLIT), k, share)


@pytest.fixture(scope="module")
def base_tokens(tiny_base):
    ids, mask = batch()
    return generate(tiny_base, ids, mask)


# ----------------------------------------------------------------------------- T1


def layer_inputs(base, padded: bool):
    """A split, the encoder cache of a (left-padded) prompt batch and one step's side inputs."""
    split = SplitDiffusionGemma(base, *SPLIT)
    ids, mask = batch(padded)
    with torch.no_grad():
        cache = base.model.encoder(input_ids=ids, attention_mask=mask).cache
    z = torch.randint(0, VOCAB, (2, CANVAS), generator=torch.Generator().manual_seed(1))
    dec_mask = F.pad(mask, (0, CANVAS), value=1) if padded else None
    return split, split.prepare(z, cache, dec_mask)


def layer_copy(split, index: int):
    """A copy of decoder layer `index` with every parameter and its layer_scalar scaled by 1 +- 0.3
    noise: a fresh model's norm gains and scalar are all 1, which would hide a swapped norm or a
    missing scalar."""
    layer = copy.deepcopy(split.decoder.layers[index])
    g = torch.Generator().manual_seed(index)
    with torch.no_grad():
        for t in (*layer.parameters(), layer.layer_scalar):
            t.mul_(1 + 0.3 * torch.randn(t.shape, generator=g))
    return layer, split.text_config.layer_types[index]


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("index", [2, 5])  # a sliding and the full-attention layer
def test_partial_layer_with_every_row_selected_is_the_stock_layer(tiny_base, index, padded):
    """Rows in position order, the stock kernels on the stock shapes: equal bit for bit, and the
    cache it leaves is what the stock layer on the new input would have recorded."""
    split, inputs = layer_inputs(tiny_base, padded)
    layer, kind = layer_copy(split, index)
    assert kind == ("full_attention" if index == 5 else "sliding_attention")
    assert (inputs.mask_mapping[kind] is not None) == padded
    g = torch.Generator().manual_seed(2)
    x0, x1 = torch.randn(2, CANVAS, 32, generator=g), torch.randn(2, CANVAS, 32, generator=g)
    with torch.no_grad():
        _, state = capture_layer(layer, x0, inputs, kind)
        before = vars(state).copy()
        ref, want = capture_layer(layer, x1, inputs, kind)
        out = partial_layer(layer, x1, inputs, kind, state, CANVAS)
    assert torch.equal(out, ref)
    assert torch.equal(ref, stock_layer(layer, x1, inputs, kind))  # capturing changes nothing
    for name in ("k", "v", "attn", "ffn"):
        assert torch.equal(getattr(state, name), getattr(want, name)), name
        assert not torch.allclose(before[name], getattr(want, name)), name  # the input moved every feature


@pytest.mark.parametrize("index", [2, 5])
def test_partial_layer_on_an_unchanged_input_is_the_stock_layer(tiny_base, index):
    """With nothing moved every cached feature is exact, so any selection returns the stock
    output: the rows left out bit for bit (cached branches, the stock additions), the recomputed
    rows to fp32 round-off (their matmuls and attention run on 3 of 8 rows, with other kernel
    blockings: measured up to 2.6e-6 on outputs of size ~2)."""
    split, inputs = layer_inputs(tiny_base, True)
    layer, kind = layer_copy(split, index)
    x = torch.randn(2, CANVAS, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref, state = capture_layer(layer, x, inputs, kind)
        v = state.v
        state.v = v.clone()
        state.v[0, :, 6] += 1.0  # rows 6 (sequence 0) and 1 (sequence 1) now look moved
        state.v[1, :, 1] -= 2.0
        idx = least_similar_rows(v, state.v, 3, torch.float32)
        out = partial_layer(layer, x, inputs, kind, state, 3)
    assert 6 in idx[0] and 1 in idx[1]
    assert torch.equal(state.v, v)  # every row's V refreshed
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    for b in range(2):
        kept = [r for r in range(CANVAS) if r not in idx[b]]
        assert torch.equal(out[b, kept], ref[b, kept])


# ----------------------------------------------------------------------------- T2, T3


def test_feature_cache_refreshed_every_step_is_the_base(tiny_base, base_tokens):
    ids, mask = batch()
    model = feature(tiny_base, 1)
    assert torch.equal(generate(model, ids, mask), base_tokens)
    c = model.counters
    assert c.steps == c.refreshes == CANVASES * STEPS and model.partial_layer_calls == 0


def test_feature_cache_recomputing_every_row_is_the_base(tiny_base, base_tokens):
    """share = 1, K_r = T: every step after a canvas's first goes through the partial path."""
    ids, mask = batch()
    model = feature(tiny_base, STEPS, share=1.0)
    assert torch.equal(generate(model, ids, mask), base_tokens)
    assert model.counters.refreshes == CANVASES
    assert model.partial_layer_calls == CANVASES * (STEPS - 1) * (L - 1)


# ----------------------------------------------------------------------------- T4


def test_matched_share_equates_the_layer_calls_for_every_interval():
    """C_fc(rho*) = C_TADM for any K and T (before flooring n_sel)."""
    assert matched_share((2, 20, 8)) == pytest.approx(9 / 29) and matched_share((1, 10, 4)) == pytest.approx(4 / 14)
    for split in ((2, 20, 8), (1, 10, 4), SPLIT):
        rho = matched_share(split)
        for steps in (6, 48):
            for k in (1, 2, 3, 4):
                assert feature_layer_calls(steps, k, sum(split), rho, 1) == pytest.approx(tadm_layer_calls(steps, k, split))
    assert selected_rows(0.3, 10) == 3 and selected_rows(4 / 14, 32) == 9 and selected_rows(9 / 29, 256) == 79


@pytest.mark.parametrize("k", [2, 3])
def test_feature_cache_layer_calls(tiny_base, k):
    ids, mask = batch()
    model = feature(tiny_base, k)
    counter = DecoderLayerCalls(tiny_base)
    try:
        generate(model, ids, mask)
    finally:
        counter.close()
    n_sel, r = math.floor(SHARE * CANVAS), -(-STEPS // k)
    assert n_sel == 3
    assert counter.calls == model.counters.full_layer_calls == CANVASES * (STEPS + (L - 1) * r)
    weighted = counter.calls + model.partial_layer_calls
    per_canvas = STEPS + (L - 1) * (r + (STEPS - r) * n_sel / CANVAS)  # 26.625 at K = 2, 23.5 at K = 3
    assert weighted == pytest.approx(CANVASES * per_canvas)
    s, a, d = SPLIT
    tadm = (s + d) * STEPS + a * r  # 27, 24
    assert 0 <= tadm - per_canvas <= (L - 1) * (STEPS - r) / CANVAS


# ----------------------------------------------------------------------------- T5


def test_bypass_fusion_is_free_and_returns_the_anchor():
    fusion = BypassFusion(32)
    c, c0, h0 = (torch.randn(2, CANVAS, 32) for _ in range(3))
    assert fusion(c, c0, h0) is h0
    assert fusion.num_parameters == 0 and not list(fusion.parameters()) and fusion.flops(CANVAS) == 0
    assert not fusion.fresh and fusion.values == "bypass"


def test_naive_reuse_refreshed_every_step_is_the_base(tiny_base, base_tokens):
    ids, mask = batch()
    assert torch.equal(generate(naive_model(tiny_base, params(), 1), ids, mask), base_tokens)


@pytest.mark.parametrize("k", [2, 3])
def test_naive_reuse_makes_tadms_layer_calls(tiny_base, k):
    ids, mask = batch()
    calls = {}
    for name, model in (("naive", naive_model(tiny_base, params(), k)),
                        ("tadm", TimeAnchoredDiffusionGemma(SplitDiffusionGemma(tiny_base, *SPLIT),
                                                            PairedAttentionFusion(32, 16), k))):
        counter = DecoderLayerCalls(tiny_base)
        try:
            generate(model, ids, mask)
        finally:
            counter.close()
        calls[name] = counter.calls
    s, a, d = SPLIT
    assert calls["naive"] == calls["tadm"] == CANVASES * ((s + d) * STEPS + a * -(-STEPS // k))


def test_naive_reuse_step_returns_the_refresh_steps_logits(tiny_base):
    ids, mask = batch(padded=False)
    with torch.no_grad():
        cache = tiny_base.model.encoder(input_ids=ids).cache
        g = torch.Generator().manual_seed(5)
        z0, z1 = (torch.randint(0, VOCAB, (2, CANVAS), generator=g) for _ in range(2))
        sc = torch.randn(2, CANVAS, VOCAB, generator=g)
        model = naive_model(tiny_base, params(), 2)
        refresh = model(z0, cache).logits  # no self-conditioning yet: a new canvas, a refresh
        reuse = model(z1, cache, sc).logits
        fresh = tiny_base(decoder_input_ids=z1, cache=cache, self_conditioning_logits=sc).logits
    assert model.counters.refreshes == 1 and model.counters.steps == 2
    assert torch.equal(reuse, refresh)
    assert not torch.allclose(fresh, refresh)  # the base would have moved


# ----------------------------------------------------------------------------- T6


def test_prefix_kv_cache_is_built_into_the_base(tiny_base):
    """Per canvas one encoder call over the new positions only (the prompt, then the last
    canvas); every decoder layer sees the canvas alone, the prefix only through the cache."""
    ids, mask = batch()
    for model in (tiny_base, feature(tiny_base, 2)):
        encoded, decoded = [], set()
        enc = tiny_base.model.encoder.register_forward_pre_hook(
            lambda _m, args, kw: encoded.append((kw.get("input_ids") if "input_ids" in kw else args[0]).shape[1]),
            with_kwargs=True)
        dec = [layer.register_forward_pre_hook(
            lambda _m, args, kw: decoded.add((args[0] if args else kw["hidden_states"]).shape[1]), with_kwargs=True)
            for layer in tiny_base.model.decoder.layers]
        try:
            out = generate(model, ids, mask)
        finally:
            for h in (enc, *dec):
                h.remove()
        assert out.shape[1] == PROMPT + CANVASES * CANVAS
        assert encoded == [PROMPT, CANVAS]  # == canvases calls, PROMPT + CANVAS * (CANVASES - 1) positions
        assert decoded == {CANVAS}


# ----------------------------------------------------------------------------- parameters, registry


@pytest.mark.parametrize("key, kwargs", [("posttrain.feature_cache_share", {"share": 0.0}),
                                         ("posttrain.feature_cache_share", {"share": 1.5}),
                                         ("posttrain.refresh_every", {"k": 0})])
def test_parameters_are_validated(tiny_base, key, kwargs):
    with pytest.raises(ConfigError, match=key) as e:
        feature(tiny_base, **{"k": 2, **kwargs})
    assert "\n" not in str(e.value)


def test_registry_builds_each_method_on_the_split(tiny_base):
    """Every registered cache builds a model that keeps the contract Table 1 relies on
    (tadm.caches.diffusiongemma.base.CacheModel), at the K it was built with; the two shipped ones
    are what they say."""
    from tadm.caches.diffusiongemma.base import CacheModel

    for k, name in enumerate(DG_CACHES.names(), start=2):
        unit = DG_CACHES[name]
        model = unit.build(tiny_base, params(), k)
        assert isinstance(model, CacheModel) and model.refresh_every == k, name
        assert unit.label and unit.description and unit.legend, name
    naive = DG_CACHES["naive"].build(tiny_base, params(), 2)
    fc = DG_CACHES["feature"].build(tiny_base, params(), 3)
    assert isinstance(naive.fusion, BypassFusion) and naive.split.split == SPLIT and naive.refresh_every == 2
    assert isinstance(fc, FeatureCacheDiffusionGemma) and fc.share == SHARE and fc.refresh_every == 3
