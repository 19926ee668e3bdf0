"""The DVC pipeline end to end on the micro profile, in a scratch copy of the repository:
repro (data, training, the papermill notebooks that sample and score every Table 2 row, the
refresh sweep, anchor staleness, the paper tables), up-to-date status, a no-op second repro,
byte-identical data and weights from scratch, a papermill run with another K, and a push /
pull round trip through a local DVC remote."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tadm.config import ROOT

pytestmark = pytest.mark.slow

RUNS = ("mdlm", "adlm", "tadm", "tadm_gamma0", "sedd", "ar")
DATA_STAGES = ("corpus", "tokenizer", "pack", "sft")
TRAIN_STAGES = DATA_STAGES + ("train",)
ROWS = ("data", "ar", "sedd", "mdlm", "mdlm_fb", "mdlm_dfm", "remdm", "adlm", "tadm_gamma0", "tadm", "tadm_nofusion")
STAGES = (TRAIN_STAGES + tuple(f"sample@{r}" for r in ROWS)
          + ("replicates", "throughput", "sweep", "staleness", "tables", "compute_column")
          + tuple(f"throughput_block@b{i}" for i in range(3)) + ("table1_speed@b1", "table1_speed@b2")
          + ("table1", "asrd", "claims", "stage_times"))
FIGURES = ("table2.md", "table2.csv", "table2_runs.md", "table2_runs.csv", "refresh_sweep.md", "refresh_sweep.csv", "tradeoff.png", "tradeoff.pdf",
           "anchor_staleness.png", "anchor_staleness.pdf", "anchor_staleness.md", "table2_compute.md",
           "table1.md", "table1.csv", "table1_frontier.png", "table1_frontier.pdf", "asrd.md", "asrd.csv", "asrd_sweeps.md", "asrd_sweeps.csv", "claims.md", "claims.csv", "claims_summary.md",
           "table2_throughput.md", "stage_times.md")
DATA_OUTS = ("data/corpus", "data/tokenizer", "data/packed", "data/sft", "data/asrd")
MODELS = tuple(f"models/{r}" for r in RUNS) + ("models/dg_base", "models/dg_tadm", "models/dg_fresh", "models/asrd_mdlm",
                                                "models/evaluator")
OUTS = DATA_OUTS + MODELS + ("models/replicates",) + tuple(
    f"checkpoints/{r}" for r in RUNS + ("dg_base", "dg_posttrain", "dg_posttrain_fresh", "asrd_mdlm", "evaluator", "replicates"))
# the micro profile's training replicates (train.replicates 2) and their draws
REPLICATES = tuple(f"{r}-s1" for r in ("mdlm", "tadm", "tadm_gamma0"))
REPLICATE_DRAWS = tuple(f"{r}-s1" for r in ("remdm", "tadm", "tadm_gamma0"))


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `python` in dvc.yaml
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", DVC_NO_ANALYTICS="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    env.pop("PYTHONPATH", None)
    return env


def run(args, cwd, check=True) -> str:
    proc = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def dvc(*args, cwd, check=True) -> str:
    return run([sys.executable, "-m", "dvc", *args], cwd, check)


def tree_hashes(repo: Path, dirs=OUTS) -> dict[str, str]:
    out = {}
    for d in dirs:
        for p in sorted((repo / d).rglob("*")):
            if p.is_file():
                out[p.relative_to(repo).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def wipe(repo: Path) -> None:
    for d in OUTS:
        shutil.rmtree(repo / d, ignore_errors=True)
    shutil.rmtree(repo / ".dvc" / "cache", ignore_errors=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A fresh copy of the working tree (tracked + untracked, not ignored) on the micro profile."""
    dst = tmp_path_factory.mktemp("clone") / "repo"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    run(["git", "init", "-q"], dst)
    run([sys.executable, "-m", "tadm", "profile", "micro"], dst)
    params = yaml.safe_load((dst / "params.yaml").read_text())
    params["eval"]["cache_dir"] = str(ROOT / ".cache" / "evaluators")  # SmolLM2 dequantized once, shared
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "add", "-A"], dst)
    run(["git", "commit", "-q", "-m", "scratch"], dst)
    log = dvc("repro", cwd=dst)
    for stage in STAGES:
        assert f"Running stage '{stage}'" in log, log
    return dst


def test_repro_then_status_clean_and_second_repro_is_a_noop(repo):
    assert "up to date" in dvc("status", cwd=repo)
    log = dvc("repro", cwd=repo)
    assert "Running stage" not in log, log
    for stage in STAGES:
        assert f"Stage '{stage}' didn't change, skipping" in log, log
    for d in DATA_OUTS:
        assert (repo / d / "manifest.json").is_file()
    for r in RUNS:
        assert (repo / "models" / r / "model.safetensors").is_file()
        assert (repo / "metrics" / "train" / f"{r}.json").is_file()
    for r in REPLICATES:
        assert (repo / "models" / "replicates" / r / "model.safetensors").is_file()
        assert (repo / "metrics" / "train" / "replicates" / f"{r}.json").is_file()
        assert (repo / "metrics" / "train" / "replicates" / f"{r}_eval.csv").is_file()
    for r in REPLICATE_DRAWS:
        assert (repo / "results" / "replicates" / f"{r}.json").is_file()
        assert (repo / "samples" / "replicates" / "s1" / r.split("-")[0] / "T16_features.npy").is_file()
    for f in FIGURES:
        assert (repo / "paper_figures" / f).stat().st_size > 0, f
    for report in [f"sample_{r}" for r in ROWS] + ["refresh_sweep", "anchor_staleness", "paper_tables", "table1"]:
        assert (repo / "reports" / f"{report}.ipynb").is_file(), report


def test_table2_has_every_row_with_numbers_and_data_sits_where_data_should(repo):
    import json

    import pandas as pd

    t2 = pd.read_csv(repo / "paper_figures" / "table2.csv", header=[0, 1], index_col=0)
    labels = ["Data", "AR", "SEDD", "MDLM", "MDLM+FB", "MDLM+DFM", "ReMDM", "ADLM", "TADM† (γ=0)", "TADM‡ (γ=3e-3)",
              "TADM‡, fusion bypassed"]
    assert list(t2.index) == labels
    for T in ("8", "16"):
        assert t2[("mauve", T)].notna().all() and t2[("gen_ppl", T)].notna().all() and t2[("entropy", T)].notna().all()
        models = t2.drop(index="Data")
        assert models[("layer_calls", T)].notna().all() and models[("tokens_per_s", T)].gt(0).all()
        assert t2.loc["TADM‡ (γ=3e-3)", ("layer_calls", T)] < t2.loc["MDLM", ("layer_calls", T)]
    metrics = json.loads((repo / "metrics" / "table2.json").read_text())
    assert metrics["tadm_T16_layer_calls"] == 16 * 1 + (16 // 4) * 2  # 1 denoiser layer every step, 2 anchor every K=4


def test_papermill_with_another_k_changes_the_report(repo, tmp_path):
    import json

    records = {}
    for K in (1, 4):
        out = tmp_path / f"K{K}.json"
        run([sys.executable, "-m", "papermill", "--no-progress-bar", "notebooks/sample.ipynb", str(tmp_path / f"K{K}.ipynb"),
             "-p", "row", "tadm", "-p", "T", "16", "-p", "K", str(K), "-p", "out", str(out),
             "-p", "samples_dir", str(tmp_path / f"samples{K}")], repo)
        records[K] = json.loads(out.read_text())["budgets"]["16"]
    assert records[1]["layer_calls"] == 16 * (1 + 2) and records[4]["layer_calls"] == 16 * 1 + 4 * 2
    assert records[1]["anchor_calls"] == 2 * 16 and records[4]["anchor_calls"] == 2 * 4  # 2 batches of 2 samples
    assert records[1]["policy"] != records[4]["policy"]


def test_table1_has_the_base_and_every_k_with_numbers(repo):
    import json

    import pandas as pd

    t1 = pd.read_csv(repo / "paper_figures" / "table1.csv")
    assert list(t1.method) == ["Base", "Control (fresh anchor)", "TADM K=1", "TADM K=2", "TADM K=3", "Naive reuse K=2",
                               "Naive reuse K=3", "Feature cache K=2", "Feature cache K=3"]
    assert t1.accuracy.between(0, 100).all() and t1.tokens_per_s.gt(0).all() and t1.flop_bound_x.gt(0).all()
    base, control, k1 = t1.iloc[0], t1.iloc[1], t1.iloc[2]
    assert base.compute_x == 1 and k1.compute_x == 1 and k1.accuracy == base.accuracy  # K = 1 is the base
    assert control.compute_x == 1 and control.delta_control_pts == 0  # the control never reuses its anchor
    n = json.loads((repo / "results" / "table1.json").read_text())["tasks"]["arithmetic"]["n"]
    # the paired bootstrap over examples has no se from one example (the control against itself: 0)
    others = t1.delta_control_se.drop(index=1)
    assert t1.delta_control_pts.notna().all() and (others.ge(0) if n > 1 else others.isna()).all()
    assert control.delta_control_se == 0
    assert (t1.delta_pts - t1.delta_control_pts).round(9).eq(round(control.accuracy - base.accuracy, 9)).all()
    T, (s, a, d) = 4, (1, 2, 1)  # the micro profile's steps and split
    for row, K in ((3, 2), (4, 3)):  # decoder-layer calls counted during the runs, as Alg. 1 predicts
        assert t1.compute_x.iloc[row] == ((s + d) * T + a * -(-T // K)) / ((s + a + d) * T) < 1
    results = json.loads((repo / "results" / "table1.json").read_text())
    assert results["split"] == [1, 2, 1]
    record = json.loads((repo / "models" / "dg_tadm" / "fusion.json").read_text())
    assert record["split"] == [1, 2, 1] and record["parameters"] == results["fusion_parameters"]
    control = json.loads((repo / "models" / "dg_fresh" / "fusion.json").read_text())
    assert control["values"] == "state" and control["parameters"] == record["parameters"]
    assert json.loads((repo / "metrics" / "posttrain" / "dg_posttrain_fresh.json").read_text())["steps"] == \
        json.loads((repo / "metrics" / "posttrain" / "dg_posttrain.json").read_text())["steps"]
    assert "Δ vs control" in (repo / "paper_figures" / "table1.md").read_text()
    caches = t1[t1.family.isin(["naive", "feature"])]  # each against TADM at its K, paired
    assert caches.delta_tadm_pts.notna().all() and t1[~t1.family.isin(["naive", "feature"])].delta_tadm_pts.isna().all()
    assert (t1.set_index("method").compute_x[["Naive reuse K=2", "Naive reuse K=3"]].values == t1.compute_x.iloc[[3, 4]].values).all()


def test_papermill_table1_with_another_k(repo, tmp_path):
    import json

    out = tmp_path / "t1.json"
    run([sys.executable, "-m", "papermill", "--no-progress-bar", "notebooks/table1.ipynb", str(tmp_path / "t1.ipynb"),
         "-p", "K", "4", "-p", "results_path", str(out), "-p", "out_dir", str(tmp_path / "fig"),
         "-p", "metrics_path", str(tmp_path / "m.json"), "-p", "speed_blocks_dir", ""], repo)
    methods = json.loads(out.read_text())["tasks"]["arithmetic"]["methods"]
    # the training-free caches follow K: they run at TADM's budget
    assert sorted(methods) == ["Base", "Control (fresh anchor)", "Feature cache K=4", "Naive reuse K=4", "TADM K=4"]
    assert methods["TADM K=4"]["refresh_every"] == methods["Feature cache K=4"]["refresh_every"] == 4
    assert (tmp_path / "fig" / "table1_frontier.png").stat().st_size > 0


def test_asrd_table_has_every_method_on_every_task_and_model_with_numbers(repo, tmp_path):
    import json

    import pandas as pd

    t = pd.read_csv(repo / "paper_figures" / "asrd.csv")
    groups = [("arithmetic", "masked"), ("spelling", "masked"), ("arithmetic", "diffusiongemma")]
    assert list(dict.fromkeys(zip(t.task, t.model))) == groups
    methods = ["Plain (MDLM ancestral)", "ReMDM-loop", "Low-confidence (LLaDA)", "Low-confidence + threshold", "ASRD",
               "ASRD, guidance only", "ASRD, verification only"]
    for task, model in groups:
        rows = t[(t.task == task) & (t.model == model)]
        assert list(rows.method)[:7] == methods
    assert list(t.method)[-2:] == ["Low-confidence + threshold + TADM K=2", "ASRD + TADM K=2"]
    assert t[t.method == "ASRD + TADM K=2"].base.tolist() == ["Low-confidence + threshold + TADM K=2"]
    assert t.accuracy.between(0, 100).all() and t.tokens_per_s.gt(0).all() and t.calls.gt(0).all()
    asrd = t[t.method.str.startswith("ASRD") & ~t.method.str.contains("guidance only")]
    assert asrd.checked.gt(0).any()  # the checks happen (inside the generation passes: no extra call)
    s = pd.read_csv(repo / "paper_figures" / "asrd_sweeps.csv")
    assert set(s.sweep) == {"capacity", "window", "block_size"} and set(s.task) == {"arithmetic", "spelling"}
    assert s.accuracy.between(0, 100).all() and s.calls.gt(0).all()
    # papermill with another K: the time-anchored row follows it, and its refreshes are Alg. 1's
    out = tmp_path / "asrd.json"
    run([sys.executable, "-m", "papermill", "--no-progress-bar", "notebooks/asrd.ipynb", str(tmp_path / "a.ipynb"),
         "-p", "K", "4", "-p", "results_path", str(out), "-p", "out_dir", str(tmp_path / "fig"),
         "-p", "metrics_path", str(tmp_path / "m.json")], repo)
    rows = json.loads(out.read_text())["groups"][-1]["methods"]
    assert rows["ASRD + TADM K=4"]["refresh_every"] == 4
    table, aup = (tmp_path / "fig" / "asrd.md").read_text().split("**AUP**")
    assert table.count("ASRD + TADM K=4") == 1 and "| ASRD | ASRD / ASRD + TADM K=4 |" in aup  # its AUP family


def test_from_scratch_twice_gives_identical_bytes(repo):
    """Data stages byte for byte, and the trained weights (training is deterministic; the
    checkpoints' state.json also records wall-clock throughput, so it differs)."""
    stable = DATA_OUTS + MODELS
    first = tree_hashes(repo, stable)
    assert len(first) >= 20
    wipe(repo)
    log = dvc("repro", "--no-run-cache", *TRAIN_STAGES, cwd=repo)
    for stage in TRAIN_STAGES:
        assert f"Running stage '{stage}'" in log, log
    assert tree_hashes(repo, stable) == first


def test_push_wipe_pull_restores_the_same_bytes(repo, tmp_path):
    dvc("commit", "--force", cwd=repo)  # the from-scratch test emptied the cache of the later stages' outputs
    before = tree_hashes(repo)
    dvc("remote", "add", "-f", "-d", "scratch", str(tmp_path / "remote"), cwd=repo)
    dvc("push", cwd=repo)
    wipe(repo)
    assert not (repo / "data" / "corpus").exists()
    dvc("pull", cwd=repo)
    assert tree_hashes(repo) == before
    assert "up to date" in dvc("status", cwd=repo)


def test_a_changed_param_reruns_only_its_stage_and_dependents(repo):
    """`dvc exp run -S` is the documented one-off override (runs last: it edits params.yaml).
    The new data reaches the training stages, whose checkpoints belong to the old settings: they
    refuse in one line naming what changed and keep the checkpoints; `--restart` starts over."""
    out = dvc("exp", "run", "-S", "packing.seq_len=64", "-S", "sample.canvas_length=64", "-S", "sample.block_size=64",
              cwd=repo, check=False)
    assert "Running stage 'pack'" in out, out
    for untouched in ("corpus", "tokenizer", "sft"):
        assert f"Running stage '{untouched}'" not in out, out
    assert (repo / "data/packed/train/shard_00000.npy").exists()
    assert np.load(repo / "data/packed/train/shard_00000.npy").shape[1] == 64
    assert "Running stage 'train'" in out, out  # downstream of pack
    assert "trained with other settings (changed: data)" in out and "--restart" in out, out
    kept = sorted(p.name for p in (repo / "checkpoints/mdlm").glob("step_*"))
    assert kept, "a settings change must never delete checkpoints"
    run([sys.executable, "-m", "tadm", "train", "mdlm", "--restart"], cwd=repo)
    assert sorted(p.name for p in next((repo / "checkpoints").glob("mdlm.old-*")).glob("step_*")) == kept
    assert (repo / "models/mdlm/model.safetensors").exists()
