"""Compute counters from real sampling runs: Table 2's compute column, layer split, FLOPs."""

from __future__ import annotations

import math

import pytest
import torch

from tadm.compute import cached_layer_calls, dense_flops, dit_block_flops, fusion_flops, lm_head_flops
from tadm.models.dit import DiTBlock
from tadm.sampling import BudgetSchedule, ComputeCounter, SamplerSettings, make_adapter, sample
from tests.sampling.conftest import PAPER_DEPTH, TINY, V, random_model

# Table 2, compute column (Transformer-layer calls per generation, MDLM = 12 x T).
TABLE2 = {
    2048: {"mdlm": 24576, "adlm": 36864, "tadm": 18432},
    4096: {"mdlm": 49152, "adlm": 73728, "tadm": 36864},
}


def layer_calls(kind: str, T: int, cfg=PAPER_DEPTH, K: int = 1) -> int:
    """The paper's formula, C = T (L_S + L_D) + ceil(T/K) L_A, per model type."""
    if kind == "mdlm":
        return cached_layer_calls(T, 1, 0, cfg.mdlm_layers)
    return cached_layer_calls(T, K if kind == "tadm" else 1, cfg.anchor_layers, cfg.denoiser_layers)


def count(kind: str, model, T: int, **settings) -> ComputeCounter:
    adapter = make_adapter(model, BudgetSchedule() if kind == "tadm" else None)
    settings = {"steps": T, "ddpm_cache": False, **settings}
    result = sample(adapter, SamplerSettings(**settings), num_samples=1, seq_len=4)
    assert (result.tokens != V).all()
    if kind == "tadm":
        K = BudgetSchedule().interval(T)
        assert result.refresh_steps == [list(range(0, T, K))]
    return result.counters


def identity_blocks(model):
    """Skip the arithmetic inside each DiT block (x -> x) but keep the block modules, their
    stacks and the counting hooks: every layer call still happens and is counted, at a
    fraction of the cost, so 4096-step runs at the paper's depths take a second or two."""
    for module in model.modules():
        if isinstance(module, DiTBlock):
            module.forward = lambda x, c, rope: x
    return model


@pytest.mark.parametrize("T", [2048, 4096])
@pytest.mark.parametrize("kind", ["mdlm", "adlm", "tadm"])
def test_table2_compute_column_from_real_sampling_runs(kind, T):
    # Table 2's budgets with the block arithmetic skipped (18-50 s per run with it, beside the
    # other test worker); the blocks compute for real at T = 128 below, and the DVC stage
    # `compute_column` runs T = 1024 ... 4096 for real (tadm.sampling.accounting)
    model = identity_blocks(random_model(kind, PAPER_DEPTH, seq_len=4))
    counter = count(kind, model, T)
    assert counter.layer_calls == TABLE2[T][kind] == layer_calls(kind, T, K=4)
    assert counter.model_calls == T and counter.trajectories == 1
    assert counter.layer_calls_per_trajectory == TABLE2[T][kind]
    if kind == "tadm":
        assert counter.anchor_calls == math.ceil(T / 4) and counter.denoiser_layer_calls == 6 * T
        assert counter.layer_calls / TABLE2[T]["mdlm"] == 0.75
    elif kind == "adlm":
        assert counter.anchor_calls == T and counter.anchor_layer_calls == 12 * T
    else:
        assert counter.anchor_calls == counter.anchor_layer_calls == 0


@pytest.mark.parametrize("kind", ["mdlm", "adlm", "tadm"])
def test_paper_depth_counts_with_real_blocks_at_t128(kind):
    # Table 2's smallest budget (T = 128, K = 2) with the blocks computing for real.
    counter = count(kind, random_model(kind, PAPER_DEPTH, seq_len=4), 128, sampler="remdm-loop")
    assert counter.layer_calls == layer_calls(kind, 128, K=2) == {"mdlm": 1536, "adlm": 2304, "tadm": 1536}[kind]


def test_batches_are_separate_trajectories():
    adapter = make_adapter(random_model("tadm"), BudgetSchedule({16: 4}))
    result = sample(adapter, SamplerSettings(steps=16, ddpm_cache=False, batch_size=2), num_samples=5, seq_len=8)
    c = result.counters
    assert result.tokens.shape == (5, 8) and c.trajectories == 3 and c.tokens == 5 * 8
    assert result.refresh_steps == [[0, 4, 8, 12]] * 3
    assert c.layer_calls_per_trajectory == layer_calls("tadm", 16, TINY, K=4)


@pytest.mark.parametrize("lazy_head", [True, False])
@pytest.mark.parametrize("kind", ["mdlm", "adlm", "tadm"])
def test_flops_match_the_analytic_count(kind, lazy_head):
    B, L, T, K, d, r = 2, 16, 12, 5, TINY.d_model, TINY.mlp_ratio
    adapter = make_adapter(random_model(kind, seq_len=L), BudgetSchedule({T: K}) if kind == "tadm" else None)
    settings = SamplerSettings(steps=T, ddpm_cache=False, lazy_head=lazy_head)
    c = sample(adapter, settings, num_samples=B, seq_len=L).counters
    block, head = dit_block_flops(d, L, r), lm_head_flops(d, V + 1)
    heads = 1 if lazy_head else T  # MDLM's sampler decodes each position exactly once
    if kind == "mdlm":
        per_token = T * TINY.mdlm_layers * block + heads * head
    elif kind == "adlm":  # the anchor's head feeds the denoiser at every position, every step
        per_token = T * ((TINY.anchor_layers + TINY.denoiser_layers) * block + head + dense_flops(V + 1, d))
        per_token += heads * head
    else:
        per_token = T * (TINY.denoiser_layers * block + fusion_flops(d)) + heads * head
        per_token += math.ceil(T / K) * TINY.anchor_layers * block
    assert c.flops == B * L * per_token
    assert c.flops_per_token == per_token
    assert fusion_flops(768) == 28 * 768**2


def test_calls_outside_the_adapter_are_not_counted_and_close_unhooks():
    model = random_model("mdlm")
    adapter = make_adapter(model)
    z = torch.full((1, 16), V)
    with torch.no_grad():
        model(z)
    assert adapter.counter.layer_calls == 0 and adapter.counter.flops == 0
    adapter(z, 0, 1.0)
    assert adapter.counter.layer_calls == TINY.mdlm_layers and adapter.counter.model_calls == 1
    adapter.close()
    adapter(z, 1, 1.0)
    assert adapter.counter.layer_calls == TINY.mdlm_layers and adapter.counter.model_calls == 2


def test_compute_column_rows_and_table():
    from tadm.sampling.accounting import compute_column, to_markdown

    depths = dict(mdlm_layers=4, anchor_layers=4, denoiser_layers=2)
    rows = list(compute_column([16, 32], {16: 2, 32: 4}, depths))
    got = {(r["T"], r["model"]): r["layer_calls"] for r in rows}
    assert got == {(16, "mdlm"): 64, (16, "adlm"): 96, (16, "tadm"): 32 + 32,
                   (32, "mdlm"): 128, (32, "adlm"): 192, (32, "tadm"): 64 + 32}
    assert all(r["layer_calls"] == r["formula"] and r["published"] is None for r in rows)
    assert [r["refreshes"] for r in rows if r["model"] == "tadm"] == [8, 8]
    table = to_markdown(rows)
    assert "| 32 | TADM | 4 | 96 | 0.75x | 96 | - | - |" in table
    with pytest.raises(ValueError, match="no refresh interval"):
        list(compute_column([64], {16: 2}, depths))
