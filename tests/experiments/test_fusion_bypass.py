"""The fusion's own ablation: TADM with the fusion bypassed, D(h) -- the (stale) anchor
read as is by the same denoiser, refreshed by the same policy -- and Table 2's tadm_nofusion row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tadm import config
from tadm.experiments.sampling import SampleRun, draw_samples, reusable_samples, save_samples
from tadm.experiments.table2 import ROWS
from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample
from tests.conftest import micro_raw
from tests.experiments.conftest import random_model

V, L = 50, 32


@pytest.fixture(scope="module")
def tadm_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nofusion") / "tadm"
    random_model("tadm", V, L, seed=3).save_pretrained(path)
    return path


def _params(**overrides):
    return config.from_dict(micro_raw(**{"runtime.device": "cpu", "sample.num_samples": 3, "sample.batch_size": 2,
                                         "sample.canvas_length": L,
                                         "sample.budgets": [{"T": 8, "K": 4}, {"T": 16, "K": 2}], **overrides}))


def test_the_bypass_is_D_of_h_by_hand_ignores_z_t_and_touches_no_weight():
    model = random_model("tadm", V, 12, seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    z_t, z_old = torch.randint(0, V + 1, (2, 12), generator=g), torch.randint(0, V + 1, (2, 12), generator=g)
    calls = []
    hook = model.fusion.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        h = model.anchor(z_old)
        bypass = model.denoise_hidden(z_t, h, fusion=False)
        assert not calls  # Phi never runs
        by_hand = model.denoiser_blocks(h, model.denoiser_cond())
        assert torch.equal(bypass, by_hand)
        assert torch.equal(model.denoise(z_t, h, fusion=False), model.final(by_hand, model.denoiser_cond()))
        other = torch.randint(0, V + 1, (2, 12), generator=g)
        assert torch.equal(model.denoise_hidden(other, h, fusion=False), bypass)  # no current canvas
        fused = model.denoise_hidden(z_t, h)  # the default is unchanged: D(Phi(S(z_t), h))
        assert torch.equal(fused, model.denoiser_blocks(model.fusion(model.embed(z_t), h), model.denoiser_cond()))
        assert not torch.allclose(fused, bypass)
    hook.remove()
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def _tokens(model, K, **kw):
    settings = SamplerSettings(sampler="remdm-loop", steps=16, ddpm_cache=False, seed=5)
    with make_adapter(model, FixedInterval(K), **kw) as adapter:
        result = sample(adapter, settings, num_samples=8, seq_len=model.seq_len)
        return result.tokens, adapter.counter.as_dict(), result.refresh_steps


def test_adapter_bypass_off_is_tadm_and_on_is_an_ablation_even_at_K1():
    model = random_model("tadm", V, 16, seed=2)
    tadm, c_tadm, r_tadm = _tokens(model, 1)
    assert torch.equal(_tokens(model, 1, bypass_fusion=False)[0], tadm)
    nofusion, c_nf, r_nf = _tokens(model, 1, bypass_fusion=True)
    assert not torch.equal(nofusion, tadm)
    assert r_nf == r_tadm and c_nf["anchor_calls"] == c_tadm["anchor_calls"]  # the same cache policy
    assert c_nf["flops"] < c_tadm["flops"]  # the fusion's FLOPs are not spent
    # the same anchor cache: K = 4 refreshes at 0, 4, 8, 12
    assert _tokens(model, 4, bypass_fusion=True)[2] == _tokens(model, 4)[2]
    with pytest.raises(ValueError, match="bypass_fusion only applies to TADM"):
        make_adapter(random_model("mdlm", V, 16), bypass_fusion=True)


def test_table2_row_samples_models_tadm_with_the_fusion_bypassed_at_table2_s_K(tadm_dir, tmp_path):
    row = ROWS["tadm_nofusion"]
    assert (row.model, row.sampler, row.bypass_fusion) == ("tadm", "remdm-loop", True) and "bypass" in row.label
    assert ROWS["tadm"].model == "tadm" and not ROWS["tadm"].bypass_fusion
    params = _params()
    base = SampleRun("tadm", str(tadm_dir), "remdm-loop")
    off = SampleRun("tadm_nofusion", str(tadm_dir), "remdm-loop", bypass_fusion=False)
    on = SampleRun("tadm_nofusion", str(tadm_dir), "remdm-loop", bypass_fusion=True)
    for T in (8, 16):  # Table 2's budgets with their K (sample.budgets)
        assert repr(on.policy(params, T)) == repr(base.policy(params, T))
    tokens, record = draw_samples(on, params, 8, bos_id=0)
    ref, ref_record = draw_samples(base, params, 8, bos_id=0)
    assert np.array_equal(draw_samples(off, params, 8, bos_id=0)[0], ref)  # bypass off: TADM token for token
    assert not np.array_equal(tokens, ref)
    assert record["bypass_fusion"] is True and "bypass_fusion" not in ref_record
    assert record["policy"] == ref_record["policy"] == "FixedInterval(K=4)"
    assert record["refreshes_per_trajectory"] == ref_record["refreshes_per_trajectory"]
    # a saved bypass draw is never taken for a fused one of the same name, nor the reverse
    save_samples(tokens, record, tmp_path, 8)
    assert reusable_samples(on, params, 8, tmp_path) is not None
    assert reusable_samples(off, params, 8, tmp_path) is None


def test_the_pipeline_samples_the_row():
    stages = yaml.safe_load((config.ROOT / "dvc.yaml").read_text())["stages"]
    assert stages["sample"]["foreach"]["tadm_nofusion"] == {"dep": "models/tadm"}


def test_run_row_the_sample_notebook_s_call_samples_the_row_with_the_bypass(table2_workspace, evaluator_dir,
                                                                             micro_packed, tmp_path):
    from tadm import runtime
    from tadm.data.tokenizer import load_tokenizer
    from tadm.experiments import table2
    from tests.experiments.conftest import table2_raw

    params = config.from_dict(table2_raw(table2_workspace, evaluator_dir))
    scorer = table2.Scorer(params, load_tokenizer(micro_packed.parent / "tokenizer"), micro_packed, dist=runtime.Dist())
    kw = dict(models_dir=table2_workspace / "models", samples_dir=tmp_path, steps=[8])
    result = table2.run_row("tadm_nofusion", params, scorer, **kw)
    assert result["label"] == ROWS["tadm_nofusion"].label
    record = yaml.safe_load((tmp_path / "tadm_nofusion" / "T8.json").read_text())
    assert record["bypass_fusion"] is True and record["model_dir"] == str(table2_workspace / "models" / "tadm")
    table2.run_row("tadm", params, scorer, **kw)
    assert not np.array_equal(np.load(tmp_path / "tadm_nofusion" / "T8.npy"), np.load(tmp_path / "tadm" / "T8.npy"))
    assert result["budgets"]["8"]["policy"] == "FixedInterval(K=4)"
