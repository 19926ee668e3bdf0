"""The nucleus draw's host path gives the old full-sort draw bit for bit, and the tables the
models now keep between calls equal freshly built ones.

`old_draw_nucleus` below is the draw as it was before the host path (verbatim): every test
compares against it, not against the module's own reference, so the module cannot drift from
what produced the committed samples."""

from __future__ import annotations

import collections

import pytest
import torch

import tadm.sampling.nucleus as nucleus
from tadm.models.dit import (
    ConditionEmbedder, DiTStack, _ROPE_TABLES, apply_rotary, constant_conditioning, rotary_cos_sin,
)
from tadm.sampling import SamplerSettings, make_adapter, sample, FixedInterval
from tadm.sampling.base import x_theta_rows
from tests.sampling.conftest import TINY, random_model
from tadm.models import build_model


def old_draw_nucleus(probs, p, generator):
    """tadm.sampling.nucleus.draw_nucleus before the host path, verbatim."""
    if p >= 1.0:
        order, ranked = None, probs
    else:
        ranked, order = probs.sort(dim=-1, descending=True)
    csum = ranked.cumsum(-1)
    if p >= 1.0:
        mass = csum[:, -1]
    else:
        kept = (csum <= p).sum(-1).clamp_min(1)  # always keep the most likely token
        mass = csum.gather(-1, (kept - 1).unsqueeze(-1)).squeeze(-1)
    u = torch.rand(mass.shape, generator=generator, device=probs.device, dtype=probs.dtype)
    x = torch.minimum(u * mass, torch.nextafter(mass, torch.zeros_like(mass)))  # strictly below the kept mass
    idx = torch.searchsorted(csum, x.unsqueeze(-1), right=True)
    token_prob = ranked.gather(-1, idx).squeeze(-1) / mass
    tokens = idx.squeeze(-1) if order is None else order.gather(-1, idx).squeeze(-1)
    return tokens, token_prob


@pytest.fixture
def paths(monkeypatch):
    """Counts the rows each way of the host path draws (tiers by k, the full sort, the reference)."""
    seen = collections.Counter()
    topk, sorted_values, by_sort = torch.Tensor.topk, nucleus.sorted_values, nucleus.draw_by_sort

    def counting_topk(self, k, *args, **kwargs):
        seen[f"top{k}"] += self.shape[0]
        return topk(self, k, *args, **kwargs)

    def counting_sorted(rows):
        seen["full"] += rows.shape[0]
        return sorted_values(rows)

    def counting_by_sort(probs, p, u):
        seen["reference"] += probs.shape[0]
        return by_sort(probs, p, u)

    monkeypatch.setattr(torch.Tensor, "topk", counting_topk)
    monkeypatch.setattr(nucleus, "sorted_values", counting_sorted)
    monkeypatch.setattr(nucleus, "draw_by_sort", counting_by_sort)
    return seen


def same_draw(probs: torch.Tensor, p: float, seed: int) -> None:
    """draw_nucleus == old_draw_nucleus, tokens and probabilities bit for bit (NaN where NaN), and
    both leave the generator in the same state."""
    g_old, g_new = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    old = old_draw_nucleus(probs, p, g_old)
    new = nucleus.draw_nucleus(probs, p, g_new)
    assert new[0].dtype == old[0].dtype == torch.long and new[1].dtype == old[1].dtype == probs.dtype
    assert torch.equal(new[0], old[0]), (p, (new[0] != old[0]).nonzero().flatten().tolist())
    assert torch.equal(new[1], old[1]) or torch.allclose(new[1], old[1], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(g_new.get_state(), g_old.get_state())  # one uniform per row, as before


def logits_of(kind: str, rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """fp32 logits (as the head returns them) of a kind of row: flat (a random model's, the nucleus
    at p = 0.9 is 90% of the vocabulary), gaussian at a scale, peaked, rounded (many exact ties),
    all equal (every value tied), one dominant token, or a mix of all in one batch."""
    z = torch.randn(rows, vocab, generator=g)
    if kind == "flat":
        return z * 0.025
    if kind.startswith("scale"):
        return z * float(kind[5:])
    if kind == "rounded":  # logits on a grid of 0.5: thousands of exact ties in every row
        return (z * 6).round() / 2
    if kind == "equal":
        return torch.zeros(rows, vocab)
    if kind == "dominant":
        z[:, 7] = 80.0
        return z
    if kind == "mixed":
        parts = ["flat", "scale1.5", "scale4", "scale8", "rounded", "equal", "dominant"]
        return torch.cat([logits_of(k, 1, vocab, g) for k in parts] * (rows // len(parts) + 1))[:rows]
    raise ValueError(kind)


KINDS = ["flat", "scale1.5", "scale3", "scale4", "scale8", "rounded", "equal", "dominant", "mixed"]
PS = [1.0, 0.999999, 0.9, 0.5, 1e-9]


@pytest.mark.parametrize("precision", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("kind", KINDS)
def test_host_draw_is_the_old_draw_bit_for_bit(kind, precision, paths):
    g = torch.Generator().manual_seed(KINDS.index(kind))
    vocab = 20_001  # the tiers (256, 4096) and the full sort all apply
    probs = x_theta_rows(logits_of(kind, 24, vocab, g), vocab - 1, precision)  # SUBS: the mask column is 0
    for i, p in enumerate(PS):
        same_draw(probs, p, seed=i)
    assert paths, "the host path was not taken"


def test_every_way_of_the_host_path_is_exercised(paths):
    """The equality above covers each tier, the full sort and the reference (tied draws)."""
    g = torch.Generator().manual_seed(0)
    vocab = 20_001
    for kind in KINDS:
        for precision in (torch.float64, torch.float32):
            probs = x_theta_rows(logits_of(kind, 24, vocab, g), vocab - 1, precision)
            for i, p in enumerate(PS):
                same_draw(probs, p, seed=i)
    assert {"top256", "top4096", "full", "reference"} <= set(paths), dict(paths)


@pytest.mark.parametrize("vocab", [nucleus.HOST_MIN_CLASSES, 257, 300, 4097, 50_258])
def test_host_draw_at_the_tier_edges_and_the_paper_vocabulary(vocab, monkeypatch):
    monkeypatch.setattr(nucleus, "HOST_MIN_CLASSES", 1)
    g = torch.Generator().manual_seed(vocab)
    for kind in ("flat", "scale3", "rounded", "mixed"):
        probs = x_theta_rows(logits_of(kind, 9, vocab, g), vocab - 1, torch.float64)
        for i, p in enumerate(PS):
            same_draw(probs, p, seed=i)


def test_host_draw_on_hand_made_rows(monkeypatch):
    """Edge rows: the nucleus boundary exactly at p (in float32, whose p differs from float64's),
    a row that is one token, all-equal rows, zeros, one row, and exactly k candidates holding
    the mass; a NaN row (all logits -inf) fails in both."""
    monkeypatch.setattr(nucleus, "HOST_MIN_CLASSES", 1)
    monkeypatch.setattr(nucleus, "NUCLEUS_CANDIDATES", (4, 16))
    quarter = torch.tensor([[0.25, 0.25, 0.25, 0.25] + [0.0] * 60])
    tenth = torch.full((1, 64), 0.0)
    tenth[0, :10] = 0.1
    point = torch.zeros(1, 64)
    point[0, 5] = 1.0
    staircase = torch.softmax(-torch.arange(64.0).unsqueeze(0) * torch.tensor([[0.5], [3.0], [0.01]]), -1)
    rows = [quarter, tenth, point, staircase, torch.full((3, 64), 1 / 64)]
    for precision in (torch.float64, torch.float32):
        batch = torch.cat(rows).to(precision)
        for p in (0.1, 0.25, 0.5, 0.75, 0.3, 1e-30, 0.9999999, 1.0):
            same_draw(batch, p, seed=3)
            for r in range(len(batch)):
                same_draw(batch[r:r + 1], p, seed=r)
    nan = torch.softmax(torch.full((1, 64), float("-inf")), -1)  # the old draw's gather fails on it
    for draw in (old_draw_nucleus, nucleus.draw_nucleus):
        with pytest.raises(RuntimeError, match="out of bounds"):
            draw(torch.cat([quarter, nan]), 0.9, torch.Generator().manual_seed(0))


def test_the_host_path_reads_only_inside_the_draw_and_the_device_path_not_at_all():
    from tests.sampling.host_sync import count_host_syncs

    probs = x_theta_rows(logits_of("mixed", 14, 5000, torch.Generator().manual_seed(0)), 4999, torch.float64)
    with count_host_syncs() as log:
        nucleus.draw_nucleus(probs, 0.9, torch.Generator().manual_seed(0))
    assert log.total and all(site.startswith("tadm/sampling/nucleus.py") for site in log.by_site), dict(log.by_site)
    with count_host_syncs() as log:
        nucleus.draw_by_sort(probs, 0.9, torch.rand(14, dtype=torch.float64))
    assert log.total == 0, dict(log.by_site)


# --------------------------------------------------------------------------- what the host path relies on


@pytest.mark.parametrize("precision", [torch.float64, torch.float32])
def test_cumsum_of_a_prefix_is_the_prefix_of_the_cumsum(precision):
    """Point 2 of the module docstring: torch's CPU cumsum adds left to right."""
    x = torch.softmax(torch.randn(8, 50_258, dtype=torch.float64) * 2, -1).to(precision)
    x = x.sort(-1, descending=True).values
    full = x.cumsum(-1)
    for k in (1, 2, 255, 256, 4096, 25_000, 50_258):
        assert torch.equal(full[:, :k], x[:, :k].contiguous().cumsum(-1)), k


def test_a_rows_sort_order_does_not_depend_on_its_batch_or_address():
    """Point 5: torch's sort of a row (ties included) is the same alone, in another batch, or at
    another alignment -- so the reference on a subset of rows is the reference on the batch."""
    probs = x_theta_rows(logits_of("rounded", 16, 50_258, torch.Generator().manual_seed(1)), 50_257, torch.float64)
    order = probs.sort(-1, descending=True).indices
    for offset in (0, 1, 3):
        buffer = torch.empty(probs.numel() + offset, dtype=probs.dtype)
        shifted = buffer[offset:].view_as(probs).copy_(probs)
        for rows in ([0], [5], [3, 9, 15], list(range(16))[::-1]):
            picked = shifted.index_select(0, torch.tensor(rows))
            assert torch.equal(picked.sort(-1, descending=True).indices, order[rows])
            assert torch.equal(shifted[rows[0]:rows[0] + 1].sort(-1, descending=True).indices, order[rows[:1]])


def test_sorted_values_are_the_values_of_torchs_sort():
    probs = x_theta_rows(logits_of("mixed", 21, 9000, torch.Generator().manual_seed(2)), 8999, torch.float64)
    probs[3, 11] = float("nan")
    want = probs.sort(-1, descending=True).values
    got = nucleus.sorted_values(probs)
    assert torch.equal(got[torch.arange(21) != 3], want[torch.arange(21) != 3])
    assert torch.isnan(got[3, 0]) and torch.isnan(want[3, 0])  # NaN first in both (then the reference draws it)


# --------------------------------------------------------------------------- in the sampling loop


@pytest.mark.parametrize("kind, sampler, precision, p", [
    ("mdlm", "mdlm", torch.float64, 0.9), ("tadm", "remdm-loop", torch.float64, 0.9),
    ("adlm", "remdm-conf", torch.float64, 0.9), ("mdlm", "remdm-loop", torch.float32, 0.9),
    ("tadm", "mdlm", torch.float32, 1.0), ("sedd", "sedd-analytic", torch.float64, 0.5),
])
def test_samples_with_the_host_draw_are_the_old_samples(kind, sampler, precision, p, monkeypatch):
    """Whole runs, one vocabulary above HOST_MIN_CLASSES: the same tokens with the host path as with
    the old draw patched in (also what the committed samples were drawn with)."""
    import tadm.sampling.loop as loop

    vocab = 3000
    model = build_model(kind, TINY, vocab, 16)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * (0.02 if prm.dim() > 1 else 0.1))
    settings = SamplerSettings(sampler=sampler, steps=8, nucleus_p=p, precision=precision, seed=4, eta=0.1)
    refresh = FixedInterval(2) if kind == "tadm" else None
    runs = {}
    for name, draw in (("host", nucleus.draw_nucleus), ("old", old_draw_nucleus)):
        monkeypatch.setattr(loop, "draw_nucleus", draw)
        with make_adapter(model.eval(), refresh) as adapter:
            runs[name] = sample(adapter, settings, num_samples=5, seq_len=16).tokens
    assert torch.equal(runs["host"], runs["old"])


# --------------------------------------------------------------------------- kept tables


@pytest.mark.parametrize("seq_len", [1, 16, 64, 1024])
def test_kept_rotary_tables_equal_fresh_ones(seq_len):
    stack = DiTStack(1, 64, 2)
    with torch.inference_mode():  # built where sampling builds them first
        kept = stack.rope(seq_len, torch.device("cpu"))
    fresh = rotary_cos_sin(seq_len, 32, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(kept, fresh))
    assert stack.rope(seq_len, torch.device("cpu"))[0] is kept[0]  # kept, not rebuilt
    assert not any(t.is_inference() for t in kept)  # usable by training too


def test_training_after_sampling_backpropagates_through_the_kept_rotary_table():
    model = random_model("mdlm", seq_len=16)
    with make_adapter(model) as adapter:
        sample(adapter, SamplerSettings(steps=4, nucleus_p=0.9), num_samples=2, seq_len=16)
    model.train()
    z = torch.randint(0, 50, (2, 16))
    model(z).float().pow(2).mean().backward()  # an inference tensor in the graph would raise here
    assert model.blocks[0].attn.qkv.weight.grad is not None
    x = torch.randn(2, 2, 16, 32, requires_grad=True)
    apply_rotary(x, *DiTStack(1, 64, 2).rope(16, torch.device("cpu"))).sum().backward()


def test_the_rope_cache_is_bounded():
    stack = DiTStack(1, 32, 2)
    for n in range(200):
        stack.rope(n + 1, torch.device("cpu"))
    assert len(_ROPE_TABLES) <= 64


def test_kept_conditioning_equals_the_fresh_vector_and_follows_the_weights():
    torch.manual_seed(0)
    emb = ConditionEmbedder()
    with torch.no_grad():
        for prm in emb.parameters():
            prm.normal_()
    with torch.no_grad():
        assert emb() is not emb()  # outside constant_conditioning: computed at every call
        with constant_conditioning(emb):
            first = emb()
            assert torch.equal(first, emb.compute()) and emb() is first  # kept, and the fresh value
            emb.mlp[2].bias.add_(1.0)  # an in-place change of the weights: recomputed
            second = emb()
            assert second is not first and torch.equal(second, emb.compute())
            emb.mlp[0].weight = torch.nn.Parameter(emb.mlp[0].weight.detach().clone() * 2)  # a new tensor
            third = emb()
            assert third is not second and torch.equal(third, emb.compute())
            with torch.autocast("cpu", dtype=torch.bfloat16):  # another autocast state: its own c
                cast = emb()
                assert cast.dtype == torch.bfloat16 and torch.equal(cast, emb.compute()) and emb() is cast
            assert emb() is not cast and emb().dtype == torch.float32
        assert emb._memo is None and emb() is not emb()  # dropped on leaving
    with constant_conditioning(emb):
        assert emb().requires_grad  # with gradients: computed, never kept
        assert emb() is not emb()


def test_samples_are_the_same_with_and_without_kept_conditioning(monkeypatch):
    import tadm.sampling.loop as loop

    model = random_model("tadm", seq_len=16)
    settings = SamplerSettings(sampler="remdm-loop", steps=8, nucleus_p=0.9, seed=1)
    with make_adapter(model, FixedInterval(2)) as adapter:
        kept = sample(adapter, settings, num_samples=3, seq_len=16).tokens
        monkeypatch.setattr(loop, "constant_conditioning", lambda m: __import__("contextlib").nullcontext())
        fresh = sample(adapter, settings, num_samples=3, seq_len=16).tokens
    assert torch.equal(kept, fresh)
