"""Table 2's sampling runs in one process: per-batch seeding, AR drawn once for every budget,
a saved draw reused only when it is exactly the run's, the device setting honoured, the
samples layout tables.py reads."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from tadm import config, runtime
from tadm.data.tokenizer import load_tokenizer
from tadm.experiments import sampling, table2
from tadm.experiments.sampling import SampleRun, batch_seed, batch_sizes, draw_samples
from tadm.models import load_pretrained
from tadm.sampling import SamplerSettings, make_adapter, sample
from tests.experiments.conftest import random_model, table2_raw


@pytest.fixture(scope="module")
def params(table2_workspace, evaluator_dir):
    return config.from_dict(table2_raw(table2_workspace, evaluator_dir))


def test_batch_seed_keeps_the_run_seed_for_the_first_batch_and_hashes_the_others():
    assert batch_seed(7, 0) == 7
    seeds = {batch_seed(s, i) for s in range(5) for i in range(1, 50)}
    assert len(seeds) == 5 * 49 and all(0 <= s < 2 ** 63 for s in seeds)
    assert batch_seed(3, 4) == batch_seed(3, 4) != batch_seed(4, 3)
    assert batch_sizes(5, 2) == [2, 2, 1] and batch_sizes(4, 4) == [4]


def test_each_batch_is_its_own_run_seeded_with_seed_and_index(table2_workspace, params, micro_packed):
    run = SampleRun("tadm", str(table2_workspace / "models" / "tadm"), "remdm-loop")
    tokens, record = draw_samples(run, params, 8, bos_id=0, dist=runtime.Dist())
    assert tokens.shape == (6, 32) and tokens.dtype == np.int64
    assert record["batch_seeds"] == [batch_seed(params.seed, i) for i in range(3)]
    assert record["settings"]["seed"] == params.seed and record["processes"] == 1
    model = load_pretrained(run.model_dir)
    settings = SamplerSettings.from_config(params.sample, steps=8, seed=params.seed, ddpm_cache=False,
                                           sampler="remdm-loop")
    refresh = run.policy(params, 8)
    for i in range(3):
        with make_adapter(model, refresh) as adapter:
            alone = sample(adapter, dataclasses.replace(settings, seed=batch_seed(params.seed, i)), num_samples=2,
                           seq_len=32)
        np.testing.assert_array_equal(tokens[2 * i: 2 * i + 2], alone.tokens.numpy())
    # batch 0 is what the former single-generator run drew first
    with make_adapter(model, refresh) as adapter:
        former = sample(adapter, settings, num_samples=6, seq_len=32)
    np.testing.assert_array_equal(tokens[:2], former.tokens[:2].numpy())
    # counters are summed over the batches: 3 trajectories of T = 8 with K = 4
    assert record["counters"]["trajectories"] == 3 and record["counters"]["anchor_calls"] == 3 * 2
    assert record["refreshes_per_trajectory"] == [2, 2, 2]


def test_ar_is_sampled_once_and_saved_under_every_budget(table2_workspace, params, micro_packed, monkeypatch,
                                                         tmp_path):
    calls = []
    real = sampling.sample_ar

    def counting(*args, **kwargs):
        calls.append(kwargs["seed"])
        return real(*args, **kwargs)

    monkeypatch.setattr(sampling, "sample_ar", counting)
    scored = []
    real_score = table2.Scorer.score_samples
    monkeypatch.setattr(table2.Scorer, "score_samples", lambda self, t: scored.append(1) or real_score(self, t))
    tok = load_tokenizer(micro_packed.parent / "tokenizer")
    scorer = table2.Scorer(params, tok, micro_packed, dist=runtime.Dist())
    result = table2.run_row("ar", params, scorer, models_dir=table2_workspace / "models", samples_dir=tmp_path,
                            out=tmp_path / "ar.json")
    assert calls == [batch_seed(params.seed, i) for i in range(3)]  # one run: three batches
    assert len(scored) == 1
    a, b = np.load(tmp_path / "ar" / "T8.npy"), np.load(tmp_path / "ar" / "T16.npy")
    np.testing.assert_array_equal(a, b)
    r8, r16 = (json.loads((tmp_path / "ar" / f"T{T}.json").read_text()) for T in (8, 16))
    assert (r8["T"], r16["T"], r16["drawn_at_T"]) == (8, 16, 8)
    m8, m16 = result["budgets"]["8"], result["budgets"]["16"]
    assert {k: m8[k] for k in ("mauve", "gen_ppl", "entropy")} == {k: m16[k] for k in ("mauve", "gen_ppl", "entropy")}
    assert json.loads((tmp_path / "ar.json").read_text()) == result
    ppl = np.load(tmp_path / "ar" / "T8_gen_ppl.npy")
    assert ppl.shape == (6, 2) and np.isclose(np.exp(ppl[:, 0].sum() / ppl[:, 1].sum()), m8["gen_ppl"])


def test_a_saved_draw_is_reused_only_when_it_is_exactly_this_run(table2_workspace, params, micro_packed,
                                                                   monkeypatch, tmp_path):
    model_dir = tmp_path / "models" / "tadm"
    shutil.copytree(table2_workspace / "models" / "tadm", model_dir)
    tok = load_tokenizer(micro_packed.parent / "tokenizer")
    scorer = table2.Scorer(params, tok, micro_packed, dist=runtime.Dist())
    first = table2.run_row("tadm", params, scorer, models_dir=tmp_path / "models", samples_dir=tmp_path / "t2",
                           steps=[8])
    K = params.sample.refresh_every(8)
    drawn = []
    monkeypatch.setattr(table2, "draw_samples", lambda *a, **k: drawn.append(k) or draw_samples(*a, **k))
    again = table2.run_row("tadm", params, scorer, models_dir=tmp_path / "models", samples_dir=tmp_path / "sweep",
                           steps=[8], K=K, reuse_dir=tmp_path / "t2")
    assert drawn == []
    np.testing.assert_array_equal(np.load(tmp_path / "sweep/tadm/T8.npy"), np.load(tmp_path / "t2/tadm/T8.npy"))
    record = json.loads((tmp_path / "sweep/tadm/T8.json").read_text())
    assert record["reused_from"] == str(tmp_path / "t2/tadm/T8.npy")
    assert again["budgets"]["8"]["mauve"] == first["budgets"]["8"]["mauve"]
    # anything that changes the draw is drawn afresh
    run = SampleRun("tadm", str(model_dir), "remdm-loop", K=K)
    saved = tmp_path / "t2" / "tadm"
    d = runtime.Dist()
    assert sampling.reusable_samples(run, params, 8, saved, d) is not None
    assert sampling.reusable_samples(dataclasses.replace(run, K=K + 1), params, 8, saved, d) is None
    assert sampling.reusable_samples(dataclasses.replace(run, sampler="mdlm"), params, 8, saved, d) is None
    assert sampling.reusable_samples(run, config.override(params, {"seed": params.seed + 1}), 8, saved, d) is None
    assert sampling.reusable_samples(run, config.override(params, {"sample.nucleus_p": 0.5}), 8, saved, d) is None
    assert sampling.reusable_samples(run, params, 16, saved, d) is None  # no draw at T = 16
    counts = json.loads((micro_packed / "manifest.json").read_text())["counts"]
    random_model("tadm", counts["vocab_size"], counts["seq_len"], seed=9).save_pretrained(model_dir)  # retrained
    assert sampling.reusable_samples(run, params, 8, saved, d) is None


def test_the_data_row_is_scored_once(table2_workspace, params, micro_packed, tmp_path):
    tok = load_tokenizer(micro_packed.parent / "tokenizer")
    scorer = table2.Scorer(params, tok, micro_packed, dist=runtime.Dist())
    result = table2.run_row("data", params, scorer, samples_dir=tmp_path)
    np.testing.assert_array_equal(np.load(tmp_path / "data" / "T8.npy"), scorer.data_tokens())
    assert result["budgets"]["8"]["mauve"] == result["budgets"]["16"]["mauve"]


def test_the_runtime_device_setting_reaches_the_model_and_the_evaluator(table2_workspace, params, micro_packed,
                                                                        monkeypatch):
    seen = []
    real = sampling.load_pretrained
    monkeypatch.setattr(sampling, "load_pretrained", lambda d, map_location: seen.append(map_location) or real(d, map_location))
    p = config.override(params, {"runtime.device": "cpu", "runtime.precision": "fp32"})
    run = SampleRun("mdlm", str(table2_workspace / "models" / "mdlm"), "mdlm")
    _, record = draw_samples(run, p, 8, bos_id=0, num_samples=2)  # dist from runtime.setup(p.runtime)
    assert seen == [runtime.CPU] and record["device"] == str(runtime.CPU) and record["precision"] == "fp32"
    scorer = table2.Scorer(p, load_tokenizer(micro_packed.parent / "tokenizer"), micro_packed)
    assert scorer.dist.device == runtime.CPU and scorer.dtype == torch.float32
    assert next(scorer.evaluator.model.parameters()).dtype == torch.float32


def test_no_device_type_string_literals_outside_the_runtime_module():
    from tadm.config import ROOT

    files = [*sorted((ROOT / "tadm" / "experiments").rglob("*.py")), *sorted((ROOT / "tadm" / "metrics").glob("*.py")),
             ROOT / "tadm" / "asrd" / "backends.py"]  # the ASRD comparison is under experiments/
    for f in files:
        text = f.read_text()
        for literal in ('"cpu"', "'cpu'", '"cuda"', "'cuda'"):
            assert literal not in text, f"{f.relative_to(ROOT)} names a device type: {literal}"
