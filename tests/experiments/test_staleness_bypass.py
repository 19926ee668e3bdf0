"""Anchor staleness with the fusion's own ablation: the bypass prediction D(h_stale),
the recovery against it, and uncertainties from a bootstrap over the SEQUENCES of the recorded
trajectory (its steps are autocorrelated), not over the steps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tadm.experiments import staleness as S
from tadm.experiments.tables import write_table
from tests.experiments.conftest import random_model

V, L = 50, 12
CFG = S.StalenessSettings(steps=L, max_age=3, num_samples=4, seed=1)


def _kl(p_log, q_log, where):
    return float((p_log.exp() * (p_log - q_log)).sum(-1)[where].mean())


def _trajectory(first: torch.Tensor, seed: int = 0) -> list[tuple[float, torch.Tensor]]:
    """A canvas unmasking one position per step, from the fully masked state to `first`."""
    order = torch.randperm(L, generator=torch.Generator().manual_seed(seed))
    z, out = torch.full_like(first, V), []
    for i in range(L):
        out.append((1 - i / L, z.clone()))
        z[:, order[i]] = first[:, order[i]]
    return out


@pytest.fixture(scope="module")
def model():
    return random_model("tadm", V, L, seed=4)


@pytest.fixture(scope="module")
def measured(model):
    return S.measure(model, L, CFG)


def test_every_kl_is_the_prediction_it_names_computed_by_hand(model):
    g = torch.Generator().manual_seed(2)
    traj = _trajectory(torch.randint(0, V, (3, L), generator=g))
    with torch.no_grad():
        m = S._compare(model, traj, CFG)
        lp = lambda x: S._log_probs(model, x)  # noqa: E731
        for row in m.rows:
            i, k = row["step"], row["age"]
            z, z_old = traj[i][1], traj[i - k][1]
            masked = z == V
            h_fresh, h_stale = model.anchor(z), model.anchor(z_old)
            p_fresh = lp(model.denoise_hidden(z, h_fresh))
            fused = _kl(p_fresh, lp(model.denoise_hidden(z, h_stale)), masked)
            bypass = _kl(p_fresh, lp(model.denoiser_blocks(h_stale, model.denoiser_cond())), masked)  # D(h_stale)
            reused = _kl(p_fresh, lp(model.denoise_hidden(z_old, h_stale)), masked)
            assert row["kl_fused"] == pytest.approx(fused, rel=1e-6, abs=1e-12)
            assert row["kl_bypass"] == pytest.approx(bypass, rel=1e-6)
            assert row["kl_reused"] == pytest.approx(reused, rel=1e-6, abs=1e-12)
            assert row["recovery"] == pytest.approx(1 - row["kl_fused"] / row["kl_bypass"])
            if k:
                assert row["recovery_vs_reused"] == pytest.approx(1 - row["kl_fused"] / row["kl_reused"])
            else:  # the fresh anchor: the fused prediction is the fresh one, the bypass is not
                assert row["kl_fused"] == row["kl_reused"] == 0 and row["kl_bypass"] > 0 and row["recovery"] == 1


COLUMNS = ["age", "kl_reused", "kl_reused_se", "kl_fused", "kl_fused_se", "recovery", "recovery_se", "kl_bypass",
           "kl_bypass_se", "recovery_vs_reused", "recovery_vs_reused_se", "growth_reused", "growth_reused_se",
           "growth_bypass", "growth_bypass_se", "growth_fused", "growth_fused_se", "recovery_mean", "recovery_mean_se",
           "recovery_vs_reused_mean", "recovery_vs_reused_mean_se"]


def test_summary_means_are_the_step_means_and_the_csv_has_the_new_columns(measured, tmp_path):
    table = S.summary(measured, bootstrap=50)
    df = measured.frame()
    means = df.groupby("age")[S.QUANTITIES].mean()
    assert np.allclose(means.to_numpy(), table[S.QUANTITIES].to_numpy(), rtol=1e-9, equal_nan=True)
    assert table.growth_bypass[1] == 1 and table.growth_reused[3] == pytest.approx(table.kl_reused[3] / table.kl_reused[1])
    assert table.recovery_mean[1] == pytest.approx(table.recovery[[1, 2, 3]].mean())
    assert table.recovery_vs_reused_mean[1] == pytest.approx(table.recovery_vs_reused[[1, 2, 3]].mean())
    assert (table[[c for c in table.columns if c.endswith("_se")]].loc[2:] > 0).all().all()  # sequences differ
    assert table.growth_bypass_se[1] == 0  # a ratio to itself
    write_table(table, tmp_path, "anchor_staleness", "caption")
    header = (tmp_path / "anchor_staleness.csv").read_text().splitlines()[0].split(",")
    assert set(COLUMNS) <= set(header)
    assert S.summary(measured, bootstrap=50).equals(table)  # seeded
    note = S.growth_note(table)
    assert "fusion bypassed" in note and "grows" in note


def test_identical_sequences_give_zero_se_although_the_steps_differ(model):
    g = torch.Generator().manual_seed(3)
    traj = _trajectory(torch.randint(0, V, (1, L), generator=g).repeat(4, 1))  # 4 copies of one sequence
    with torch.no_grad():
        m = S._compare(model, traj, CFG)
    table = S.summary(m, bootstrap=50)
    steps = m.frame().groupby("age")[S.QUANTITIES].sem()
    assert (steps.loc[1:, ["kl_fused", "kl_bypass", "kl_reused", "recovery"]] > 0).all().all()  # the steps differ
    for c in ["kl_fused", "kl_bypass", "kl_reused", "recovery", "recovery_vs_reused", "growth_bypass", "growth_reused",
              "cosine", "rel_l2", "gate", "correction", "recovery_mean", "recovery_vs_reused_mean"]:
        se, value = table[f"{c}_se"].loc[1:].to_numpy(), table[c].loc[1:].to_numpy()
        assert np.all(np.abs(se) <= 1e-9 * np.maximum(np.abs(value), 1e-12)), c


def test_summary_needs_the_per_sequence_parts(measured):
    with pytest.raises(TypeError, match="per-sequence"):
        S.summary(pd.DataFrame(measured.rows))


def test_sequences_compared_in_chunks_give_the_whole_batchs_result(model, measured, monkeypatch):
    # the paper's L x V does not fit max_age + 1 float64 log-probabilities of 20 sequences (~200 GiB):
    # above a memory budget `_compare` takes the sequences a few at a time; every quantity is per
    # sequence, so the rows and per-sequence parts are the whole batch's
    assert S.sequence_chunk(20, 1024, 50257, 8) == 1 and S.sequence_chunk(20, 64, 301, 8) == 20
    monkeypatch.setattr(S, "MEMORY_BUDGET", (2 * (CFG.max_age + 1) + 4) * L * V * 8 * 3)  # 3 sequences at a time
    assert S.sequence_chunk(CFG.num_samples, L, V, CFG.max_age) == 3
    chunked = S.measure(model, L, CFG)
    assert len(chunked.rows) == len(measured.rows)
    for q in S.BASE:
        np.testing.assert_allclose(chunked.num[q], measured.num[q], rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(chunked.den[q], measured.den[q])
    pd.testing.assert_frame_equal(chunked.frame(), measured.frame(), rtol=1e-10)
