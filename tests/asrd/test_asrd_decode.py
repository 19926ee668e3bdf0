"""The decoding loop: ASRD reduces to its base step for step, the baselines' schedules, the
backends on the real model classes (MDLM, TADM with anchor reuse, DiffusionGemma)."""

import pytest
import torch

from tadm.asrd.backends import DiffusionGemmaBackend, MaskedBackend
from tadm.asrd.decode import DecodeSettings, decode
from tadm.errors import ConfigError

REGION = torch.zeros(12, dtype=torch.bool)
REGION[4:] = True  # 4 prompt tokens, 8 generated (2 blocks of 4)


def _trace(backend, cfg, canvas=None, region=REGION):
    canvas = torch.randint(0, 11, (3, len(region)), generator=torch.Generator().manual_seed(1)) if canvas is None else canvas
    steps = []
    result = decode(backend, canvas, region, cfg, callback=lambda s: steps.append(s))
    return result, steps


def _same_steps(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.decided, y.decided)
        assert torch.equal(x.committed, y.committed) and x.calls == y.calls


@pytest.mark.parametrize("kind, refresh", [("mdlm", 1), ("tadm", 2)])
@pytest.mark.parametrize("threshold, temperature", [(None, 0.0), (0.2, 0.0), (None, 1.0)])
def test_asrd_with_zero_guidance_and_perturbation_is_its_base_step_for_step(tiny_models, kind, refresh, threshold,
                                                                             temperature):
    base = DecodeSettings(method="low-confidence", steps=8, block_size=4, threshold=threshold, temperature=temperature, seed=3)
    r0, s0 = _trace(MaskedBackend(tiny_models[kind], refresh), base)
    r1, s1 = _trace(MaskedBackend(tiny_models[kind], refresh), base.replace(method="asrd", guidance=0.0, perturbation=0.0))
    _same_steps(s0, s1)
    assert torch.equal(r0.tokens, r1.tokens) and r0.counters == r1.counters
    assert s1[-1].anchors.any()  # the cache was kept (and read by nothing)
    on, _ = _trace(MaskedBackend(tiny_models[kind], refresh), base.replace(method="asrd", guidance=3.0, perturbation=2.0))
    assert on.verified > 0  # checks happen, inside the generation passes
    assert on.counters.calls == on.steps  # one pass per step


def test_asrd_reduces_on_diffusiongemma_too(dg_split):
    backend = DiffusionGemmaBackend(dg_split)
    backend.set_context(torch.tensor([[5, 6, 7], [0, 8, 9]]), torch.tensor([[1, 1, 1], [0, 1, 1]]))
    base = DecodeSettings(method="low-confidence", steps=4, block_size=4, threshold=0.05, seed=0)
    region, canvas = torch.ones(8, dtype=torch.bool), torch.zeros(2, 8, dtype=torch.long)
    r0, s0 = _trace(backend, base, canvas, region)
    r1, s1 = _trace(backend, base.replace(method="asrd"), canvas, region)
    _same_steps(s0, s1)
    assert torch.equal(r0.tokens, r1.tokens)


def test_low_confidence_keeps_the_llada_schedule_and_the_most_confident(tiny_models):
    backend = MaskedBackend(tiny_models["mdlm"])
    r, steps = _trace(backend, DecodeSettings(method="low-confidence", steps=4, block_size=4))  # 2 steps per block: 2 + 2
    assert [int(s.committed.sum()) for s in steps] == [6, 6, 6, 6]  # 3 sequences x 2
    assert r.counters.calls == 4 and r.steps == 4
    # the first step keeps, per sequence, the 2 most confident predictions of block 1
    canvas = torch.randint(0, 11, (3, 12), generator=torch.Generator().manual_seed(1))
    z = canvas.masked_fill(REGION, backend.mask_id)
    probs = torch.softmax(tiny_models["mdlm"](z)[..., :11], -1)[:, 4:8]
    top = probs.max(-1).values.topk(2, dim=-1).indices + 4
    committed = steps[0].committed.nonzero()[:, 1].view(3, 2).sort(-1).values
    assert torch.equal(committed, top.sort(-1).values)


def test_the_prompt_is_kept_and_every_generated_position_decided(tiny_models):
    canvas = torch.randint(0, 11, (3, 12), generator=torch.Generator().manual_seed(1))
    for method in ("plain", "remdm", "low-confidence", "asrd"):
        r, _ = _trace(MaskedBackend(tiny_models["mdlm"]), DecodeSettings(method=method, steps=8, block_size=4,
                                                                         guidance=1.0, perturbation=1.0), canvas)
        assert torch.equal(r.tokens[:, :4], canvas[:, :4])
        assert bool((r.tokens[:, 4:] < 11).all())


def test_plain_makes_no_call_when_nothing_decodes_and_blocks_are_semi_autoregressive(tiny_models):
    r, steps = _trace(MaskedBackend(tiny_models["mdlm"]), DecodeSettings(method="plain", steps=16, block_size=4))
    calls = [s.calls for s in steps]
    decoded_any = [bool(s.committed.any()) for s in steps]
    assert all((b - a == 1) == d for a, b, d in zip([0] + calls, calls, decoded_any))
    for s in steps:  # nothing of block 2 is decided while block 1 is being generated
        if s.block == 0:
            assert not s.decided[:, 8:].any()


def test_remdm_remasks_inside_its_loop_window(tiny_models):
    cfg = DecodeSettings(method="remdm", steps=64, block_size=8, eta=0.5)
    r, steps = _trace(MaskedBackend(tiny_models["mdlm"]), cfg)
    assert r.remasked > 0 and any(s.revoked.any() for s in steps)
    assert len(steps) == 64  # ReMDM walks its whole schedule


def test_same_seed_same_tokens_other_seed_other_tokens(tiny_models):
    cfg = DecodeSettings(method="asrd", steps=8, block_size=4, temperature=1.0, guidance=1.0, perturbation=1.0, seed=0)
    a, _ = _trace(MaskedBackend(tiny_models["mdlm"]), cfg)
    b, _ = _trace(MaskedBackend(tiny_models["mdlm"]), cfg)
    c, _ = _trace(MaskedBackend(tiny_models["mdlm"]), cfg.replace(seed=1))
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)


def test_guidance_reaches_the_model_only_at_masked_positions_once_there_are_anchors(tiny_models):
    backend = MaskedBackend(tiny_models["mdlm"])
    seen = []
    inner = backend.logits
    backend.logits = lambda ids, delta=None: (seen.append((ids, delta)), inner(ids, delta))[1]
    _, steps = _trace(backend, DecodeSettings(method="asrd", steps=8, block_size=4, guidance=2.0, capacity=16, window=1))
    assert seen[0][1] is None  # the first pass: an empty cache injects nothing
    guided = [(ids, d) for ids, d in seen[1:] if d is not None]
    assert guided
    for ids, d in guided:
        assert torch.count_nonzero(d[ids != backend.mask_id]) == 0 and torch.count_nonzero(d[ids == backend.mask_id]) > 0


def test_time_anchored_backend_refreshes_every_k_passes_checks_included(tiny_models):
    model = tiny_models["tadm"]
    cfg = DecodeSettings(method="asrd", steps=8, block_size=4, guidance=1.0, perturbation=5.0, verify_below=1.0)
    r, _ = _trace(MaskedBackend(model, refresh_every=3), cfg)
    assert r.verified > 0 and r.counters.calls == 8
    assert r.counters.refreshes == -(-r.counters.calls // 3)
    c = model.cfg
    assert r.counters.layer_calls == c.denoiser_layers * r.counters.calls + c.anchor_layers * r.counters.refreshes


def test_masked_backend_is_the_model(tiny_models):
    z = torch.randint(0, 12, (2, 12), generator=torch.Generator().manual_seed(0))
    backend = MaskedBackend(tiny_models["mdlm"])
    assert torch.equal(backend.logits(z), tiny_models["mdlm"](z)[..., :11].float())
    backend = MaskedBackend(tiny_models["tadm"], refresh_every=2)
    backend.start()
    assert torch.equal(backend.logits(z), tiny_models["tadm"](z, z)[..., :11].float())


def test_diffusiongemma_backend_is_the_base_decoder_and_reuses_the_anchor_with_the_fusion(tiny_base, dg_split):
    from tadm.posttrain.fusion import PairedAttentionFusion

    context, mask = torch.tensor([[5, 6, 7]]), torch.tensor([[1, 1, 1]])
    z = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    backend = DiffusionGemmaBackend(dg_split)
    backend.set_context(context, mask)
    cache = tiny_base.model.encoder(input_ids=context, attention_mask=mask).cache
    reference = dg_split(z, cache, decoder_attention_mask=torch.cat([mask.bool(), torch.ones_like(z, dtype=torch.bool)], 1))
    assert torch.equal(backend.logits(z), reference.float())
    torch.manual_seed(0)
    fusion = PairedAttentionFusion(dg_split.hidden_size, 8).eval()
    anchored = DiffusionGemmaBackend(dg_split, fusion, refresh_every=2)
    anchored.set_context(context, mask)
    anchored.start()
    for _ in range(4):
        anchored.logits(z)
    assert anchored.counters.refreshes == 2  # passes 0 and 2
    s, a, d = dg_split.split
    assert anchored.counters.layer_calls == 4 * (s + d) + 2 * a


@pytest.mark.parametrize("change, key", [(dict(method="greedy"), "asrd.method"), (dict(steps=0), "asrd.steps"),
                                         (dict(perturbation=-1.0), "asrd.perturbation"),
                                         (dict(verify_below=0.0), "asrd.verify_below"),
                                         (dict(threshold=1.5), "asrd.threshold")])
def test_bad_settings_name_the_parameter(change, key):
    with pytest.raises(ConfigError, match=key):
        DecodeSettings(**change)


def test_a_span_that_blocks_do_not_tile_is_refused(tiny_models):
    with pytest.raises(ConfigError, match="asrd.block_size"):
        decode(MaskedBackend(tiny_models["mdlm"]), torch.zeros(1, 12, dtype=torch.long), REGION,
               DecodeSettings(steps=6, block_size=3 * 2 + 1))
    with pytest.raises(ConfigError, match="asrd.steps"):
        decode(MaskedBackend(tiny_models["mdlm"]), torch.zeros(1, 12, dtype=torch.long), REGION,
               DecodeSettings(steps=5, block_size=4))
    with pytest.raises(ConfigError, match="refresh_every"):
        MaskedBackend(tiny_models["mdlm"], refresh_every=2)


def _count_forwards(model):
    """Forwards of the real network: one call of its output layer per model pass."""
    calls = []
    return calls, model.final.register_forward_hook(lambda *_: calls.append(1))


@pytest.mark.parametrize("kind, refresh", [("mdlm", 1), ("tadm", 2)])
def test_asrd_checks_inside_the_generation_pass_as_many_forwards_as_its_base(tiny_models, kind, refresh):
    model = tiny_models[kind]
    calls, hook = _count_forwards(model)
    try:
        base = DecodeSettings(method="low-confidence", steps=8, block_size=4, seed=3)
        _trace(MaskedBackend(model, refresh), base)
        plain = len(calls)
        calls.clear()
        r, steps = _trace(MaskedBackend(model, refresh), base.replace(method="asrd", guidance=1.0, perturbation=2.0,
                                                                     verify_below=1.0))
    finally:
        hook.remove()
    assert r.verified > 0 and r.remasked > 0  # candidates were checked and some revoked
    assert len(calls) == plain == 8 == r.counters.calls  # ... at no extra forward
    assert [s.calls for s in steps] == list(range(1, len(steps) + 1))  # one forward per step


def test_with_the_threshold_every_step_is_one_forward_and_a_decided_block_waits_for_its_checks(tiny_models):
    model = tiny_models["mdlm"]
    calls, hook = _count_forwards(model)
    try:
        base = DecodeSettings(method="low-confidence", steps=8, block_size=4, threshold=1e-3, seed=3)
        r0, s0 = _trace(MaskedBackend(model), base)  # the threshold decides each block in one step
        calls.clear()
        r1, s1 = _trace(MaskedBackend(model), base.replace(method="asrd", perturbation=0.01, verify_below=1.0))
    finally:
        hook.remove()
    assert [s.block for s in s0] == [0, 1]
    assert len(calls) == r1.counters.calls == r1.steps == len(s1)
    # block 0, decided at its first step, waits one pass for the check of its commits (held twice:
    # anchors, k = 2); block 1's predictions already held over block 0's passes: anchors at once
    assert [s.block for s in s1] == [0, 0, 1] and not s1[1].committed.any()
    assert r1.verified > 0 and r1.remasked == 0 and torch.equal(r0.tokens, r1.tokens)
