"""The post-train building blocks on a tiny random DiffusionGemma (the real transformers class)."""

import pytest
import torch

from tests.posttrain.conftest import CANVAS, VOCAB

from tadm.errors import ConfigError
from tadm.posttrain.anchored import TimeAnchoredDiffusionGemma, sampling_kwargs
from tadm.posttrain.backbone import SplitDiffusionGemma
from tadm.posttrain.fusion import PairedAttentionFusion

SPLIT = (1, 3, 2)


def encode(base, prompt):
    with torch.no_grad():
        return base.model.encoder(input_ids=prompt).cache


def prompts(b=2, n=5, seed=0):
    return torch.randint(3, VOCAB, (b, n), generator=torch.Generator().manual_seed(seed))


def trained_fusion(hidden=32, rank=16, seed=1):
    """A fusion with every weight random and non-zero (as after training)."""
    torch.manual_seed(seed)
    fusion = PairedAttentionFusion(hidden, rank)
    with torch.no_grad():
        for prm in fusion.parameters():
            prm.normal_(0, 0.5)
    return fusion


def test_split_reproduces_the_base_decoder_bit_for_bit(tiny_base):
    split = SplitDiffusionGemma(tiny_base, *SPLIT)
    cache = encode(tiny_base, prompts())
    g = torch.Generator().manual_seed(3)
    z = torch.randint(0, VOCAB, (2, CANVAS), generator=g)
    for sc in (None, torch.randn(2, CANVAS, VOCAB, generator=g)):
        with torch.no_grad():
            ref = tiny_base(decoder_input_ids=z, cache=cache, self_conditioning_logits=sc).logits
            ours = split(z, cache, sc)
        assert torch.equal(ref, ours)


def test_split_must_cover_the_decoder(tiny_base):
    with pytest.raises(ConfigError, match="add up to the decoder's 6 layers"):
        SplitDiffusionGemma(tiny_base, 2, 2, 1)


def test_split_freezes_the_base(tiny_base):
    SplitDiffusionGemma(tiny_base, *SPLIT)
    assert not any(p.requires_grad for p in tiny_base.parameters())


def test_fusion_at_initialisation_returns_the_cached_anchor_exactly():
    fusion = PairedAttentionFusion(32, 16)
    g = torch.Generator().manual_seed(0)
    c, c0, h0 = (torch.randn(2, 8, 32, generator=g) for _ in range(3))
    assert torch.equal(fusion(c, c0, h0), h0)  # c != c0, yet W_up = 0 makes the correction vanish
    assert torch.sigmoid(fusion.gate.bias).item() == pytest.approx(torch.sigmoid(torch.tensor(-3.0)).item())


def test_trained_correction_is_exactly_zero_when_the_shallow_state_is_unchanged():
    fusion = trained_fusion()
    g = torch.Generator().manual_seed(0)
    c0, h0 = torch.randn(2, 8, 32, generator=g), torch.randn(2, 8, 32, generator=g)
    assert torch.count_nonzero(fusion.correction(c0.clone(), c0, h0)) == 0
    assert torch.equal(fusion(c0.clone(), c0, h0), h0)
    moved = c0.clone()
    moved[0, 3] += 1.0  # one position changes: every position's correction may move
    delta = fusion.correction(moved, c0, h0)
    assert delta.abs().max() > 1e-3


def test_fusion_parameter_count_at_paper_scale():
    with torch.device("meta"):
        fusion = PairedAttentionFusion(2816, 256)
    d, r = 2816, 256
    assert fusion.num_parameters == 5 * d * r + r + 1 + 3 * d


def tadm(base, fusion=None, k=1):
    split = SplitDiffusionGemma(base, *SPLIT)
    return TimeAnchoredDiffusionGemma(split, fusion or PairedAttentionFusion(split.hidden_size, 16), k)


def gen_kwargs(steps=6, new=2 * CANVAS):
    return sampling_kwargs(steps, 0.1, (0.8, 0.4), new, eos_token_id=None, pad_token_id=None)


def test_k1_at_initialisation_generates_exactly_the_base_models_tokens(tiny_base):
    ids = prompts()
    torch.manual_seed(11)
    ref = tiny_base.generate(ids, **gen_kwargs()).sequences
    model = tadm(tiny_base, k=1)
    torch.manual_seed(11)
    ours = model.generate(ids, **gen_kwargs()).sequences
    assert torch.equal(ref, ours)
    assert model.counters.steps == 12 and model.counters.refreshes == 12  # 2 canvases x 6 steps


def test_k1_with_trained_fusion_is_still_the_base(tiny_base):
    """K = 1 never reuses, so even non-zero fusion weights leave the base's tokens."""
    ids = prompts(seed=4)
    torch.manual_seed(2)
    ref = tiny_base.generate(ids, **gen_kwargs()).sequences
    model = tadm(tiny_base, trained_fusion(), 1)
    torch.manual_seed(2)
    ours = model.generate(ids, **gen_kwargs()).sequences
    assert torch.equal(ref, ours)


@pytest.mark.parametrize("k, refreshes", [(2, 6), (3, 4)])
def test_refresh_schedule_and_layer_calls(tiny_base, k, refreshes):
    model = tadm(tiny_base, trained_fusion(), k)
    torch.manual_seed(0)
    model.generate(prompts(), **gen_kwargs())
    c = model.counters
    s, a, d = SPLIT
    # two canvases of 6 steps; every canvas starts with a refresh
    assert c.steps == 12 and c.refreshes == refreshes
    assert c.layer_calls == {"shared": 12 * s, "anchor": refreshes * a, "denoiser": 12 * d}


def test_reused_steps_feed_the_fusion_the_cached_states(tiny_base, monkeypatch):
    """On a reuse step the fusion sees (current c, C0, H0) of the last refresh of this canvas."""
    model = tadm(tiny_base, trained_fusion(), 3)
    seen, anchors = [], []
    real_fusion, real_anchor = model.fusion.forward, model.split.anchor

    def spy_fusion(c, c0, h0):
        seen.append((c0, h0))
        return real_fusion(c, c0, h0)

    def spy_anchor(c, inputs):
        h = real_anchor(c, inputs)
        anchors.append((c, h))
        return h

    monkeypatch.setattr(model.fusion, "forward", spy_fusion)
    monkeypatch.setattr(model.split, "anchor", spy_anchor)
    torch.manual_seed(0)
    model.generate(prompts(), **gen_kwargs())
    # steps per canvas: R U U R U U -> fusion calls 0,1 use refresh 0; 2,3 refresh 1; ...
    assert len(anchors) == 4 and len(seen) == 8
    for i, (c0, h0) in enumerate(seen):
        ref_c, ref_h = anchors[i // 2]
        assert c0 is ref_c and h0 is ref_h


def test_paper_compute_ratios_at_2_20_8():
    """Layer calls per step relative to the base: (10 + 20/K) / 30 -> 1.00 / 0.67 / 0.56 (48 steps)."""
    from tadm.experiments.table1 import Table1Method

    class Split:
        split = (2, 20, 8)

    class Stub:
        split = Split()
        share = 9 / 29  # the feature cache's matched share at 2/20/8

    base = Table1Method("Base", None, None, None, "base", (2, 20, 8)).layer_calls_per_step(48)
    ratios = [Table1Method("k", None, Stub(), k).layer_calls_per_step(48) / base for k in (1, 2, 3)]
    assert [round(r, 2) for r in ratios] == [1.00, 0.67, 0.56]
    # the feature cache at the matched share, 256-row canvases: floor(256 * 9/29) = 79 rows
    feature = [Table1Method("f", None, Stub(), k, "feature").layer_calls_per_step(48, 256) / base for k in (2, 3)]
    assert feature == pytest.approx([(48 + 29 * (24 + 24 * 79 / 256)) / 48 / 30, (48 + 29 * (16 + 32 * 79 / 256)) / 48 / 30])
    assert [round(r, 2) for r in feature] == [0.67, 0.55]


def test_refresh_every_is_validated(tiny_base):
    with pytest.raises(ConfigError, match="posttrain.refresh_every"):
        tadm(tiny_base, k=0)


def test_flop_count_includes_cpu_attention():
    from tadm.experiments.diffusiongemma import count_flops

    q = torch.randn(2, 4, 16, 32)
    assert count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)) == 2 * 2 * 2 * 4 * 16 * 16 * 32
    w = torch.randn(32, 8)
    assert count_flops(lambda: q @ w) == 2 * 2 * 4 * 16 * 32 * 8


def test_flop_count_includes_the_experts_grouped_matmul():
    """torch._grouped_mm (DiffusionGemma's MoE experts): only the rows up to offs[-1] take part."""
    from tadm.experiments.diffusiongemma import count_flops

    a, b = torch.randn(10, 8), torch.randn(3, 8, 12)  # strides: multiples of 16 bytes
    offs = torch.tensor([2, 6, 9], dtype=torch.int32)  # the 10th row belongs to no group
    assert count_flops(lambda: torch._grouped_mm(a, b, offs=offs)) == 2 * 9 * 8 * 12
    assert count_flops(lambda: torch._grouped_mm(torch.randn(3, 4, 8), b)) == 2 * 3 * 4 * 8 * 12


@pytest.mark.parametrize("path", ["grouped_mm", "transformers_fallback", "eager"])
def test_flop_count_of_the_moe_experts_is_the_closed_form(tiny_base, monkeypatch, path):
    """One MoE layer of the tiny DiffusionGemma (the dry run's stand-in sizes: 4 experts, top 2,
    hidden 32, expert width 16): every (token, chosen expert) pair costs gate_up (H -> 2I) and
    down (I -> H), 2 * tokens * top_k * 3 * H * I FLOPs, whichever matmul the experts run:
    torch's grouped matmul (the default), transformers' fallback op (no usable torch kernel) or
    the per-expert loop (experts_implementation eager)."""
    import transformers.integrations.moe as moe

    from tadm.experiments.diffusiongemma import count_flops

    experts = tiny_base.model.decoder.layers[0].experts
    if path == "transformers_fallback":
        monkeypatch.setattr(moe, "_can_use_grouped_mm", lambda *a: False)
    elif path == "eager":
        monkeypatch.setattr(experts.config, "_experts_implementation", "eager")
    cfg = tiny_base.config.text_config
    tokens, hidden, width, top_k = 10, cfg.hidden_size, cfg.moe_intermediate_size, cfg.top_k_experts
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen)
    index = torch.stack([torch.randperm(cfg.num_experts, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    with torch.no_grad():
        counted = count_flops(lambda: experts(x, index, weights))
    assert counted == 2 * tokens * top_k * (hidden * 2 * width + width * hidden)


def test_flop_count_is_torch_counter_plus_the_experts(tiny_base):
    """FlopCount on a whole generate: torch's FlopCounterMode (same formulas, with its module
    tracking and decompositions) plus the experts' grouped matmuls, which torch does not count:
    2 matmuls (gate_up, down) of top_k rows per token, per decoder call."""
    from torch.utils.flop_counter import FlopCounterMode

    from tadm.experiments.diffusiongemma import _cpu_attention_flops, _grouped_mm_flops, count_flops

    ids, kw = prompts(), gen_kwargs()
    torch.manual_seed(0)
    ours = count_flops(lambda: tiny_base.generate(ids, **kw))
    torch.manual_seed(0)
    experts = count_flops_of_grouped_mm(lambda: tiny_base.generate(ids, **kw), _grouped_mm_flops)
    torch.manual_seed(0)
    cpu_sdpa = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}
    with FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as torch_counter:
        tiny_base.generate(ids, **kw)
    assert experts > 0
    assert ours == torch_counter.get_total_flops() + experts


def count_flops_of_grouped_mm(fn, formula) -> int:
    """The grouped matmuls' FLOPs alone, summed from their calls (a patch of torch._grouped_mm)."""
    total, inner = [0], torch._grouped_mm

    def counted(a, b, offs=None, *args, **kwargs):
        total[0] += formula(a, b, offs)
        return inner(a, b, offs, *args, **kwargs)

    torch._grouped_mm = counted
    try:
        fn()
    finally:
        torch._grouped_mm = inner
    return total[0]


def test_flop_bound_of_reuse_is_below_the_base(tiny_base):
    """Counted over whole generate calls: K = 2 costs less than the base, K = 1 the same."""
    from tadm.experiments.diffusiongemma import count_flops

    ids = prompts()
    flops = {}
    for k in (None, 1, 2):
        model = tiny_base if k is None else tadm(tiny_base, trained_fusion(), k)
        kw = gen_kwargs() | ({} if k is None else {"refresh_every": k})
        flops[k] = count_flops(lambda: model.generate(ids, **kw))
    assert flops[1] == flops[None]
    assert flops[2] < flops[None]


def test_layer_call_hooks_count_both_paths(tiny_base):
    from tadm.experiments.diffusiongemma import DecoderLayerCalls

    ids = prompts()
    counter = DecoderLayerCalls(tiny_base)
    torch.manual_seed(0)
    tiny_base.generate(ids, **gen_kwargs())
    assert counter.calls == 12 * 6  # 12 denoising steps x 6 decoder layers
    counter.calls = 0
    model = tadm(tiny_base, trained_fusion(), 3)
    torch.manual_seed(0)
    model.generate(ids, **gen_kwargs())
    counter.close()
    assert counter.calls == model.counters.total_layer_calls == 12 * 3 + 4 * 3
