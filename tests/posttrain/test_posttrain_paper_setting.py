"""The paper's post-train setting (App. C.1, Sec. 6.1): seed 42 and global batch 16 in the paper
profile, the post-train runs seeded by posttrain.seed, and the fusion's parameter count."""

import json

import pytest

from tadm.config import from_dict, override, render_profile
from tadm.posttrain import fusion
from tadm.posttrain.train import _settings


def test_paper_profile_trains_with_seed_42_at_global_batch_16():
    p = from_dict(render_profile("paper"))
    pt = p.posttrain
    assert pt.seed == 42
    assert pt.batch_size * pt.grad_accum * p.runtime.nproc == 16  # paper: 1 x 4 x 4 GPUs
    assert pt.task_sources["aime"] == "MathArena/aime_2026"
    assert from_dict(render_profile("default")).posttrain.seed == 0  # the default keeps its seed's value


def test_post_train_runs_are_seeded_by_posttrain_seed(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"counts": {}}))
    p = from_dict(render_profile("default"))
    for kind in ("dg_base", "dg_posttrain"):
        here = _settings(kind, p, tmp_path, {})
        assert here["posttrain"]["seed"] == 0
        assert _settings(kind, override(p, {"posttrain.seed": 42}), tmp_path, {}) != here
        assert _settings(kind, override(p, {"seed": 7}), tmp_path, {}) == here  # the global seed is the data's


@pytest.mark.parametrize("d,r", [(32, 64), (48, 128), (40, 16)])
def test_fusion_parameter_formula_matches_the_module(d, r):
    assert fusion.PairedAttentionFusion(d, r).num_parameters == fusion.parameter_count(d, r)


def test_fusion_count_at_diffusiongemma_size_beside_the_papers():
    ours = fusion.paper_size_count()  # built on the meta device
    d, r = fusion.DIFFUSIONGEMMA_HIDDEN, fusion.PAPER_RANK
    assert ours == fusion.parameter_count(d, r) == 3_613_185
    # the parameterisation that gives the paper's ~3.1M: four d x r blocks, three r x r, the norms
    assert round((4 * d * r + 3 * r * r + 3 * d) / 1e5) == 31 and round(ours / 1e5) == 36


def test_count_command_states_both(capsys, tmp_path):
    from tadm import cli, config

    params = config.write_profile("default", tmp_path / "params.yaml")  # not the checkout's (any profile)
    assert cli.main(["--params", str(params), "count"]) == 0
    out = capsys.readouterr().out
    assert "at DiffusionGemma-26B (d = 2816, r = 256): 3.61M, the paper quotes ~3.1M" in out
