"""Post-train replicates: the fusion and the control train again with seeds
posttrain.seed + 1, ... under replicates/, each with its validation curve; Table 1 evaluates every
fusion run on the same frozen base and its ± and Δ se of a trained row cover the fusion's
training run (tadm.metrics.replicates), and says how often TADM writes the fusion-bypassed row's
completion."""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import micro_raw
from tests.posttrain.test_posttrain_control import _row, stats

from tadm import config
from tadm.errors import ConfigError, DataError
from tadm.posttrain import model as dgm
from tadm.experiments import table1, table1_render, table1_stats
from tadm.posttrain import train as pt_train
from tadm.train import checkpoint as ck


def raw(**overrides) -> dict:
    """The micro profile on the CPU, a validation split large enough for 8 canvases per evaluation."""
    # timing.table1_blocks 1: Table 1's speed from its scored pass alone (test_table1_speed times blocks)
    return micro_raw(**{"runtime.device": "cpu", "posttrain.eval_batch_size": 3, "sft.validation_fraction": 0.3,
                        "timing.table1_blocks": 1, **overrides})


@pytest.fixture(scope="module")
def workspace(micro_packed, tmp_path_factory) -> Path:
    """The tokenizer, the micro SFT data and a tiny random DiffusionGemma saved as the trained
    base (models/dg_base), laid out like the repository."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from tadm.data import sft
    from tadm.data.tokenizer import load_tokenizer
    from tests.posttrain.conftest import tiny_config

    root = tmp_path_factory.mktemp("posttrain_replicates")
    shutil.copytree(micro_packed.parent / "tokenizer", root / "data" / "tokenizer")
    p = config.from_dict(raw())
    tok = load_tokenizer(root / "data" / "tokenizer")
    sft.build(p, tok, root / "data" / "sft")
    pt = p.posttrain
    torch.manual_seed(0)
    layers = pt.shared_layers + pt.anchor_layers + pt.denoiser_layers
    base = DiffusionGemmaForBlockDiffusion(tiny_config(layers, vocab=len(tok), canvas=pt.canvas_length)).eval()
    base.save_pretrained(root / dgm.BASE_DIR)
    tok.save_pretrained(root / dgm.BASE_DIR)
    return root


def _fusion(path: Path) -> dict:
    return load_file(str(path / "fusion.safetensors"))


def _curve(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


# ----------------------------------------------------------------------------- jobs and paths


def test_the_train_stage_adds_each_fusion_replicate_after_the_base():
    from tadm import cli

    p = config.from_dict(config.render_profile("default"))
    assert p.posttrain.replicates == 3
    jobs = cli.train_jobs(p, Namespace(runs=[], params="params.yaml", data="data/packed", restart=False))
    names = [name for name, _, _ in jobs]
    seeds = [p.posttrain.seed + k for k in (1, 2)]
    want = [f"{kind}-s{s}" for s in seeds for kind in ("dg_posttrain", "dg_posttrain_fresh")]
    assert names[-len(want):] == want  # after the main runs, one fusion and one control at a time
    assert names[-len(want) - 2:-len(want)] == ["dg_posttrain", "dg_posttrain_fresh"]
    by = {name: (argv, c) for name, argv, c in jobs}
    assert by["dg_posttrain-s2"][0][-3:] == ["dg-posttrain", "--replicate", "2"]
    assert by["dg_posttrain_fresh-s1"][0][-4:] == ["dg-posttrain", "--replicate", "1", "--fresh-anchor"]
    assert all(by[w][1] == by["dg_posttrain"][1] for w in want)  # the main run's cost
    after = cli.posttrain_after(p)
    assert {w: after[w] for w in want} == dict.fromkeys(want, ("dg_base",))
    assert cli.TRAIN_AFTER.items() <= after.items()
    restart = cli.train_jobs(p, Namespace(runs=[], params="params.yaml", data="data/packed", restart=True))
    assert {n: a[-1] for n, a, _ in restart if n in want} == dict.fromkeys(want, "--restart")
    one = config.override(p, {"posttrain.replicates": 1})
    assert not any("-s" in n and n.startswith("dg_") for n, _, _ in
                   cli.train_jobs(one, Namespace(runs=[], params="params.yaml", data="d", restart=False)))
    assert config.from_dict(config.render_profile("micro")).posttrain.replicates == 2


def test_the_main_runs_keep_their_paths_and_replicates_live_under_replicates(tmp_path):
    p = config.from_dict(raw(**{"posttrain.seed": 7, "posttrain.replicates": 3}))
    main, fresh = pt_train.fusion_run(p), pt_train.fusion_run(p, fresh=True)
    assert (main.checkpoints, main.model, main.metrics, main.curve) == (
        Path("checkpoints/dg_posttrain"), Path("models/dg_tadm"), Path("metrics/posttrain/dg_posttrain.json"),
        Path("metrics/posttrain/dg_posttrain_eval.csv"))
    assert (fresh.checkpoints, fresh.model, fresh.curve) == (
        Path("checkpoints/dg_posttrain_fresh"), Path("models/dg_fresh"), Path("metrics/posttrain/dg_posttrain_fresh_eval.csv"))
    rep = pt_train.fusion_run(p, True, 2, tmp_path)
    assert (rep.name, rep.seed, rep.command) == ("dg_posttrain_fresh-s9", 9, "python -m tadm dg-posttrain --fresh-anchor --replicate 2")
    assert rep.checkpoints == tmp_path / "checkpoints/replicates/dg_posttrain_fresh-s9"
    assert rep.model == tmp_path / "models/replicates/dg_fresh-s9"
    assert rep.metrics == tmp_path / "metrics/posttrain/replicates/dg_posttrain_fresh-s9.json"
    assert rep.curve == tmp_path / "metrics/posttrain/replicates/dg_posttrain_fresh-s9_eval.csv"
    assert [r.name for r in pt_train.fusion_runs(p)] == ["dg_posttrain", "dg_posttrain-s8", "dg_posttrain-s9"]
    assert pt_train.replicate_seeds(p) == [8, 9]
    with pytest.raises(ConfigError, match="posttrain.replicates: is 3: there is no fusion replicate 3"):
        pt_train.fusion_run(p, replicate=3)


def test_the_cli_hands_the_replicate_to_torchrun_and_to_the_trainer(monkeypatch):
    from tadm import cli, runtime

    seen = {}
    monkeypatch.setattr(cli.common, "load_params", lambda args: config.from_dict(raw(**{"runtime.nproc": 2})))
    monkeypatch.setattr(runtime, "relaunch", lambda n, argv: (seen.update(argv=argv), True)[1])
    assert cli.main(["dg-posttrain", "--fresh-anchor", "--replicate", "1"]) == 0
    assert seen["argv"][-5:] == ["--sft", "data/sft", "--fresh-anchor", "--replicate", "1"]
    monkeypatch.setattr(runtime, "relaunch", lambda n, argv: False)
    monkeypatch.setattr(pt_train, "train_fusion", lambda p, **kw: (seen.update(kw=kw), {"run": "stub"})[1])
    assert cli.main(["dg-posttrain", "--replicate", "1"]) == 0
    assert seen["kw"]["replicate"] == 1 and seen["kw"]["fresh"] is False


def test_a_replicate_beyond_posttrain_replicates_is_one_line(tmp_path):
    import subprocess

    params = tmp_path / "params.yaml"
    params.write_text(json.dumps(raw()))  # YAML reads JSON
    out = subprocess.run([sys.executable, "-m", "tadm", "--params", str(params), "dg-posttrain", "--replicate", "2"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0
    assert "posttrain.replicates: is 2: there is no fusion replicate 2 (1 .. 1)" in out.stderr


def test_the_table1_keys_are_checked():
    with pytest.raises(ConfigError, match="posttrain.cache_seeds: must include every seed of posttrain.seeds"):
        config.from_dict(raw(**{"posttrain.seeds": [0, 5], "posttrain.cache_seeds": [0, 1, 2]}))
    with pytest.raises(ConfigError, match="posttrain.replicate_refresh_every: 4 is not a K of refresh_every"):
        config.from_dict(raw(**{"posttrain.replicate_refresh_every": [4]}))
    with pytest.raises(ConfigError, match="posttrain.seeds: must not repeat"):
        config.from_dict(raw(**{"posttrain.seeds": [0, 0]}))
    # Table 1's keys, the replicate count and the validation cadence never refuse a fusion's checkpoints
    p = config.from_dict(raw())
    q = config.override(p, {"posttrain.replicates": 5, "posttrain.val_every": 9, "posttrain.val_canvases": 3,
                            "posttrain.cache_seeds": [0, 7], "posttrain.replicate_refresh_every": [2],
                            "posttrain.cache_methods": ["naive"], "claims.training_free_comparator": ["naive"]})
    assert all(k not in pt_train.BASE_KEYS for k in ("replicates", "val_every", "val_canvases"))
    assert set(pt_train.FUSION_IGNORES) >= {"replicates", "val_every", "val_canvases", "cache_seeds",
                                            "replicate_refresh_every"}
    assert {k: v for k, v in vars(q.posttrain).items() if k not in pt_train.FUSION_IGNORES} == \
        {k: v for k, v in vars(p.posttrain).items() if k not in pt_train.FUSION_IGNORES}


# ----------------------------------------------------------------------------- training


def test_a_replicate_is_the_next_seed_writes_its_curve_and_resumes(workspace, tmp_path, monkeypatch):
    p = config.from_dict(raw())
    sft = workspace / "data" / "sft"
    quiet = lambda *_: None  # noqa: E731
    main = pt_train.train_fusion(p, sft_dir=sft, root=workspace, log=quiet)
    rep = pt_train.train_fusion(p, sft_dir=sft, root=workspace, log=quiet, replicate=1)
    assert (main["run"], main["seed"], rep["run"], rep["seed"]) == ("dg_posttrain", 0, "dg_posttrain-s1", 1)
    a, b = _fusion(workspace / "models/dg_tadm"), _fusion(workspace / "models/replicates/dg_tadm-s1")
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)  # another seed, other weights
    record = json.loads((workspace / "models/replicates/dg_tadm-s1/fusion.json").read_text())
    assert record["seed"] == 1 and record["replicate"] == 1
    metrics = json.loads((workspace / "metrics/posttrain/replicates/dg_posttrain-s1.json").read_text())
    assert metrics["run"] == "dg_posttrain-s1" and metrics["final_val_loss"] == metrics["evals"][-1]["val_loss"]
    # the validation curve: steps 0, every val_every, the last; the same fixed canvases and draws in
    # every run, so at step 0 (both fusions start at the base: zero up-projection) the runs agree
    pt = p.posttrain
    for path in (workspace / "metrics/posttrain/dg_posttrain_eval.csv",
                 workspace / "metrics/posttrain/replicates/dg_posttrain-s1_eval.csv"):
        rows = _curve(path)
        assert [int(r["step"]) for r in rows] == list(range(0, pt.steps + 1, pt.val_every))
        assert all(float(r["val_loss"]) > 0 and int(r["val_examples"]) == pt.val_canvases for r in rows)
        assert rows[0]["val_change"] == "" and all(  # the change since the last point, paired over the batches
            float(b["val_change"]) == pytest.approx(float(b["val_loss"]) - float(a["val_loss"]), abs=1e-9)
            and float(b["val_change_se"]) >= 0 for a, b in zip(rows, rows[1:]))
    main_curve = _curve(workspace / "metrics/posttrain/dg_posttrain_eval.csv")
    rep_curve = _curve(workspace / "metrics/posttrain/replicates/dg_posttrain-s1_eval.csv")
    assert main_curve[0]["val_loss"] == rep_curve[0]["val_loss"] and main_curve[-1] != rep_curve[-1]
    # the replicate is a main run of seed + 1 in another directory
    q = config.override(p, {"posttrain.seed": 1})
    pt_train.train_fusion(q, sft_dir=sft, root=_with_base(workspace, tmp_path / "other"), log=quiet)
    c = _fusion(tmp_path / "other/models/dg_tadm")
    assert all(torch.equal(b[k], c[k]) for k in b)
    # killed after its first checkpoint (step 2 of 4), the rerun resumes to the same weights and curve
    root = _with_base(workspace, tmp_path / "killed")
    real_save = ck.save

    def save_then_die(*args, **kw):
        real_save(*args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(ck, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        pt_train.train_fusion(p, sft_dir=sft, root=root, log=quiet, replicate=1)
    monkeypatch.setattr(ck, "save", real_save)
    assert (root / "checkpoints/replicates/dg_posttrain-s1/step_000002").is_dir()
    resumed = []
    pt_train.train_fusion(p, sft_dir=sft, root=root, log=resumed.append, replicate=1)
    assert any("resumed from step 2" in line for line in resumed)
    d = _fusion(root / "models/replicates/dg_tadm-s1")
    assert all(torch.equal(b[k], d[k]) for k in b)
    assert _curve(root / "metrics/posttrain/replicates/dg_posttrain-s1_eval.csv") == rep_curve


def _with_base(workspace: Path, root: Path) -> Path:
    """A fresh root with the workspace's base (models/dg_base) and nothing trained."""
    shutil.copytree(workspace / dgm.BASE_DIR, root / dgm.BASE_DIR)
    return root


# ----------------------------------------------------------------------------- Table 1


@pytest.fixture(scope="module")
def trained(workspace) -> Path:
    """Every fusion run of the micro profile on the workspace: TADM's and the control's main runs
    and their replicate (posttrain.replicates 2)."""
    p = config.from_dict(raw())
    for fresh in (False, True):
        for k in range(p.posttrain.replicates):
            if not (pt_train.fusion_run(p, fresh, k, workspace).model / "fusion.safetensors").is_file():
                pt_train.train_fusion(p, sft_dir=workspace / "data/sft", root=workspace, log=lambda *_: None,
                                      fresh=fresh, replicate=k)
    return workspace


def test_table1_decodes_every_fusion_run_with_two_tasks(trained, tmp_path, monkeypatch):
    """A micro Table 1 on two tasks (the second: the arithmetic problems in another order): per
    task its rows, runs, between-run record and replicated Δs; the caches at their own seeds."""
    p = config.from_dict(raw(**{"posttrain.tasks": ["arithmetic", "gsm8k"]}))
    real = table1.load_task

    def load_task(name, p, sft_dir, unsafe_host_execution=False):
        task = real("arithmetic", p, sft_dir)
        if name == "gsm8k":
            order = list(reversed(range(len(task.prompts))))[:6]
            return table1.Task("gsm8k", [task.prompts[i] for i in order],
                               lambda i, text: task.score(order[i], text), task.max_new_tokens)
        return task

    monkeypatch.setattr(table1, "load_task", load_task)
    results = table1.run(p, root=trained, sft_dir=trained / "data/sft", out=tmp_path / "t1.json", log=lambda *_: None)
    assert json.loads((tmp_path / "t1.json").read_text()) == json.loads(json.dumps(results))
    assert list(results["tasks"]) == ["arithmetic", "gsm8k"]
    pt = p.posttrain
    for name, n in (("arithmetic", 8), ("gsm8k", 6)):
        t = results["tasks"][name]
        rows = t["methods"]
        assert t["n"] == n and list(rows) == ["Base", table1.CONTROL, "TADM K=1", "TADM K=2", "TADM K=3",
                                               "Naive reuse K=2", "Naive reuse K=3", "Feature cache K=2",
                                               "Feature cache K=3"]
        for label, m in rows.items():  # the fields other code reads stay, with the main run's meaning
            for key in ("accuracy", "accuracy_seeds", "correct_seeds", "family", "refresh_every", "control",
                        "throughput_x", "throughput_se", "seconds", "layer_calls", "layer_calls_weighted",
                        "seeds", "accuracy_mean_runs", "delta_vs_base", "delta_vs_base_se", "delta_vs_control",
                        "delta_vs_control_se"):
                assert key in m, (name, label, key)
            cache = m["family"] in ("naive", "feature")
            assert m["seeds"] == (pt.cache_seeds if cache else pt.seeds)
            assert len(m["correct_seeds"]) == len(m["seeds"]) and all(len(c) == n for c in m["correct_seeds"])
            assert m["accuracy"] == pytest.approx(100 * np.mean(m["correct_seeds"]))
            assert len(m["seconds"]) == len(rows["Base"]["seconds"])  # timed at posttrain.seeds only
        # the caches decode twice the seeds, their compute is still counted at posttrain.seeds
        assert rows["Naive reuse K=2"]["layer_calls"] == rows["TADM K=2"]["layer_calls"]
        # the trained rows: the main run first, then the replicate (TADM's at the largest K only)
        k3, k2, ctl = rows["TADM K=3"], rows["TADM K=2"], rows[table1.CONTROL]
        assert [r["seed"] for r in k3["runs"]] == [0, 1] and [r["seed"] for r in ctl["runs"]] == [0, 1]
        assert [r["seed"] for r in k2["runs"]] == [0]
        main = k3["runs"][0]
        assert (main["accuracy"], main["correct_seeds"]) == (k3["accuracy"], k3["correct_seeds"])
        assert k3["accuracy_mean_runs"] == pytest.approx(np.mean([r["accuracy"] for r in k3["runs"]]))
        # does the fusion act? TADM against the fusion-bypassed row at the same K, every run
        for k in (2, 3):
            tadm, naive = rows[f"TADM K={k}"], rows[f"Naive reuse K={k}"]
            assert 0.0 <= tadm["same_output_as_bypass"] <= 1.0
            assert tadm["same_output_as_bypass"] == naive["same_output_as_tadm"]  # the same pairs
            assert tadm["runs"][0]["same_output_as_bypass"] == tadm["same_output_as_bypass"]
        assert 0.0 <= k3["runs"][1]["same_output_as_bypass"] <= 1.0
        assert "same_output_as_bypass" not in rows["TADM K=1"]  # no naive row at K = 1
        between = t["between_run"]
        assert between["df"] == 2 and between["runs"] == 5 and between["arms"] == [table1.CONTROL, "TADM K=2", "TADM K=3"]
        assert between["var_between"] >= 0 and between["var_runs"] >= 0
        assert rows["Base"]["delta_vs_base"] == 0 and rows["Base"]["delta_vs_base_se"] == 0
        assert ctl["delta_vs_control"] == 0
        assert rows["Feature cache K=3"]["delta_vs_tadm"] == pytest.approx(
            rows["Feature cache K=3"]["accuracy_mean_runs"] - k3["accuracy_mean_runs"])
    df = table1_render.frame(results)
    assert set(df.task) == {"arithmetic", "gsm8k"}
    md = table1_render.to_markdown(df)
    assert "**arithmetic, does the fusion act?**" in md and "**gsm8k, fusion runs**" in md
    metrics = table1_render.metrics_dict(df)
    assert "gsm8k_TADMK3_same_output_as_bypass" in metrics and "arithmetic_between_run_df" in metrics


def test_table1_names_a_missing_replicate(trained, tmp_path):
    p = config.from_dict(raw(**{"posttrain.replicates": 3}))
    with pytest.raises(DataError, match=r"models/replicates/dg_tadm-s2: no fusion replicate here .*"
                                        r"python -m tadm dg-posttrain --replicate 2"):
        table1.run(p, root=trained, sft_dir=trained / "data/sft", out=tmp_path / "t1.json", log=lambda *_: None)


# ----------------------------------------------------------------------------- the statistics


def replicated() -> dict:
    """Table 1's rows with three fusion runs of TADM K=2 and of the control, a cache at more seeds."""
    methods = {"Base": _row([20.0, 22.0]),
               table1.CONTROL: _row([30.0, 31.0], control=True, k=1, runs=[[27.0, 30.0], [33.0, 35.0]]),
               "TADM K=1": _row([20.0, 22.0], k=1),
               "TADM K=2": _row([29.0, 31.0], 150.0, 200, k=2, runs=[[24.0, 26.0], [35.0, 36.0]]),
               "Naive reuse K=2": _row([27.0, 26.0, 28.0, 30.0], 150.0, 200, k=2, family="naive")}
    return stats({"steps": 12, "canvas_length": 8, "tasks": {"arithmetic": {"n": 100, "methods": methods}}})


def test_the_training_term_enters_a_trained_rows_delta_and_not_a_caches_vs_the_base():
    from tadm.metrics.bootstrap import mean_se
    from tadm.metrics.replicates import pooled_between

    r = replicated()["tasks"]["arithmetic"]
    rows, between = r["methods"], r["between_run"]
    # the between-run variance pooled over TADM K=2 and the control (df = 2 + 2), each run's
    # sampling variance over its seeds subtracted
    runs = [[x["accuracy"] for x in rows[a]["runs"]] for a in (table1.CONTROL, "TADM K=2")]
    within = [[table1_stats.within_run_var(x["correct_seeds"]) for x in rows[a]["runs"]] for a in (table1.CONTROL, "TADM K=2")]
    pool = pooled_between(runs, within)
    assert between["df"] == 4 and between["arms"] == [table1.CONTROL, "TADM K=2"]
    assert between["var_between"] == pytest.approx(pool.var_between) and pool.var_between > 0
    assert between["var_within"] == pytest.approx(np.mean(within)) and between["var_within"] > 0

    def boot(a, b):  # the example bootstrap of the per-example differences of the means over runs and seeds
        pa = np.mean([np.mean(x, 0) for x in a], 0)
        pb = np.mean([np.mean(x, 0) for x in b], 0)
        return mean_se(100 * (pa - pb), 1000) ** 2

    def runs_of(label):
        return [x["correct_seeds"] for x in rows[label]["runs"]] if "runs" in rows[label] else [rows[label]["correct_seeds"]]

    k2, naive = rows["TADM K=2"], rows["Naive reuse K=2"]
    # TADM vs the base: the training term of TADM's 3 runs
    assert k2["delta_vs_base"] == pytest.approx(np.mean(runs[1]) - 21.0)
    assert k2["delta_vs_base_se"] ** 2 == pytest.approx(boot(runs_of("TADM K=2"), runs_of("Base")) + pool.var_between / 3)
    # TADM vs the control: both trained, 1/3 + 1/3
    assert k2["delta_vs_control_se"] ** 2 == pytest.approx(
        boot(runs_of("TADM K=2"), runs_of(table1.CONTROL)) + pool.var_between * 2 / 3)
    # a cache vs the base: neither trained, no training term; vs TADM: TADM's
    assert naive["delta_vs_base_se"] ** 2 == pytest.approx(boot(runs_of("Naive reuse K=2"), runs_of("Base")))
    assert naive["delta_vs_base"] == pytest.approx(27.75 - 21.0)
    assert naive["delta_vs_tadm_se"] ** 2 == pytest.approx(
        boot(runs_of("Naive reuse K=2"), runs_of("TADM K=2")) + pool.var_between / 3)
    assert naive["delta_vs_tadm"] == pytest.approx(27.75 - np.mean(runs[1]))
    # the base vs the control: the control's training term, the sign of control vs base flipped
    assert rows["Base"]["delta_vs_control"] == pytest.approx(-rows[table1.CONTROL]["delta_vs_base"])
    assert rows["Base"]["delta_vs_control_se"] == pytest.approx(rows[table1.CONTROL]["delta_vs_base_se"])
    # TADM at K = 1 is the base by construction: not a trained arm, no training term
    assert rows["TADM K=1"]["delta_vs_base_se"] == 0 and rows["TADM K=1"]["delta_vs_base"] == 0
    # the table: a trained row's accuracy is the mean over its runs ± one run's pooled sd
    df = table1_render.frame(replicated()).set_index("method")
    assert df.loc["TADM K=2"].accuracy == pytest.approx(np.mean(runs[1]))
    assert df.loc["TADM K=2"].sd == pytest.approx(np.sqrt(pool.var_runs))
    assert df.loc["Base"].sd == 1.0 and df.loc["TADM K=2"].runs == 3 and df.loc["Naive reuse K=2"].seeds == 4
    md = table1_render.to_markdown(df.reset_index())
    assert f"| {np.mean(runs[1]):.1f} ± {np.sqrt(pool.var_runs):.1f} (3 runs) |" in md
    assert "; 4 df)" in md and "TADM K=2 30.0, 25.0, 35.5" in md and "training seeds 0, 1, 2" in md


def test_runs_that_share_their_sampling_seeds_keep_their_whole_spread():
    """Fusion runs decoded with the same sampling seeds share that noise: nothing is subtracted from
    the run-level spread (the conservative side), and the sensitivity line is Welch's on the runs."""
    from tadm.metrics.replicates import pooled_between

    r = replicated()["tasks"]["arithmetic"]
    own = r["between_run"]
    shared = replicated()
    for row in shared["tasks"]["arithmetic"]["methods"].values():
        for run in row.get("runs") or []:
            run["seeds"] = list(range(len(run["seeds"])))
    rows = shared["tasks"]["arithmetic"]["methods"]
    arms = [table1.CONTROL, "TADM K=2"]
    assert table1_stats.shared_seeds(rows, arms) and not table1_stats.shared_seeds(r["methods"], arms)
    pool, _ = table1_stats.between_run(rows)
    runs = [[x["accuracy"] for x in rows[a]["runs"]] for a in arms]
    assert pool.var_within == 0 and pool.var_between == pytest.approx(pooled_between(runs).var_runs)
    assert pool.var_between > own["var_between"]
    d, se, df = table1_stats.welch(runs[1], runs[0])
    assert d == pytest.approx(np.mean(runs[1]) - np.mean(runs[0]))
    assert se == pytest.approx(math.sqrt(np.var(runs[1], ddof=1) / 3 + np.var(runs[0], ddof=1) / 3))
    assert 2 <= df <= 4 and table1_stats.welch([1.0], runs[0]) is None


def test_one_fusion_run_per_row_has_no_training_term():
    r = stats({"tasks": {"arithmetic": {"n": 100, "methods": {
        "Base": _row([20.0, 22.0]), "TADM K=2": _row([29.0, 31.0], 150.0, 200, k=2)}}}})["tasks"]["arithmetic"]
    assert r["between_run"] is None
    k2 = r["methods"]["TADM K=2"]
    assert k2["delta_vs_control"] is None and k2["delta_vs_control_se"] is None
    from tadm.metrics.bootstrap import paired_accuracy_delta

    assert (k2["delta_vs_base"], k2["delta_vs_base_se"]) == pytest.approx(
        paired_accuracy_delta(k2["correct_seeds"], r["methods"]["Base"]["correct_seeds"]))


def test_within_run_var_is_the_sampling_variance_of_a_runs_mean():
    x = [[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 0]]  # 3 seeds x 4 examples
    s2 = np.var(np.asarray(x, float), axis=0, ddof=1)
    assert table1_stats.within_run_var(x) == pytest.approx(1e4 * s2.sum() / (16 * 3))
    assert table1_stats.within_run_var([[1, 0]]) is None  # one seed
