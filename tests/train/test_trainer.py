"""The trainer end to end on the micro profile: every method trains, resumes bit-identically
after SIGKILL, and two gloo processes follow the same trajectory as one."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tadm import config
from tadm.models import load_pretrained
from tadm.train.trainer import GlobalBatches, train
from tests.conftest import micro_raw, write_params

RUNS = ["mdlm", "adlm", "tadm", "tadm_gamma0", "sedd", "ar"]


def _env():
    env = dict(os.environ)
    env.pop("WORLD_SIZE", None)
    env["PYTHONPATH"] = str(config.ROOT)
    return env


def _cli(params: Path, run: str, data: Path, cwd: Path, nproc: int = 1) -> subprocess.Popen:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else [sys.executable]
    cmd = [*launcher, "-m", "tadm", "--params", str(params), "train", run, "--data", str(data)]
    return subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    return out


def test_global_batches_cover_each_epoch_once():
    b = GlobalBatches(n=10, global_batch=4, seed=0)
    first_epoch = b.indices(0) + b.indices(1) + b.indices(2)[:2]
    assert sorted(first_epoch) == list(range(10))
    assert b.indices(1) == GlobalBatches(10, 4, 0).indices(1)  # a pure function of (seed, step)
    assert b.indices(0) != GlobalBatches(10, 4, 1).indices(0)


@pytest.mark.parametrize("run", RUNS)
def test_every_method_trains_and_saves_a_loadable_model(run, micro_packed, tmp_path, monkeypatch):
    p = config.from_dict(micro_raw(**{"train.steps": 4, "train.eval_every": 4, "train.checkpoint_every": 2}))
    summary = train(run, p, data_dir=micro_packed, root=tmp_path, log=lambda *_: None)
    assert summary["steps"] == 4 and torch.isfinite(torch.tensor(summary["val_nelbo"]))
    assert json.loads((tmp_path / "metrics/train" / f"{run}.json").read_text()) == summary
    rows = list(csv.DictReader(open(tmp_path / "metrics/train" / f"{run}_eval.csv")))
    assert [int(r["step"]) for r in rows] == [0, 4]
    model = load_pretrained(tmp_path / "models" / run)
    # the model card: the run's numbers, and its example loads the directory through AutoModel and samples
    card = (tmp_path / "models" / run / "README.md").read_text()
    assert f"{summary['val_nelbo']:.4f} nats/token" in card and "| profile | `micro`" in card
    assert f"{summary['steps']:,} steps" in card and (f"FixedInterval({p.sample.budgets[0].K})" in card) == run.startswith("tadm")
    monkeypatch.chdir(tmp_path / "models" / run)
    scope: dict = {}
    exec(card.split("```python\n")[1].split("```")[0], scope)
    assert scope["result"].tokens.shape == (4, model.seq_len)
    assert isinstance(scope["model"].net, type(model))
    assert model.model_type == ("tadm" if run.startswith("tadm") else run)
    if run == "tadm_gamma0":  # gamma = 0: the anchor head never moves from its initialisation
        ck = load_file(str(tmp_path / "checkpoints/tadm_gamma0/step_000004/model.safetensors"))
        torch.manual_seed(0)
        from tadm.methods import get_method
        from tadm.train.trainer import _seed

        torch.manual_seed(_seed(p.seed, 0x1417))
        fresh = get_method(run, p).build_model(model.vocab_size, model.seq_len)
        for k, v in fresh.anchor_head.state_dict().items():
            assert torch.equal(ck[f"anchor_head.{k}"], v), k


def test_a_training_replicate_is_the_same_recipe_with_the_next_seed_under_replicates(micro_packed, tmp_path):
    p = config.from_dict(micro_raw(**{"train.steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2,
                                      "train.replicates": 3}))
    main = train("tadm", p, data_dir=micro_packed, root=tmp_path, log=lambda *_: None)
    rep = train("tadm", p, data_dir=micro_packed, root=tmp_path, log=lambda *_: None, replicate=2)
    assert main["run"] == "tadm" and main["seed"] == p.seed
    assert rep["run"] == "tadm-s2" and rep["seed"] == p.seed + 2 and rep["model_type"] == "tadm"
    tail = Path("replicates") / "tadm-s2"
    assert json.loads((tmp_path / "metrics/train" / tail.with_suffix(".json")).read_text()) == rep
    assert (tmp_path / "metrics/train/replicates/tadm-s2_eval.csv").is_file()
    assert (tmp_path / "checkpoints" / tail / "step_000002").is_dir()
    a = load_file(str(tmp_path / "models/tadm/model.safetensors"))
    b = load_file(str(tmp_path / "models" / tail / "model.safetensors"))
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)  # another seed, other weights
    # the same seed as a main run of seed + 2 (the replicate IS that run, in another directory)
    q = config.from_dict({**micro_raw(**{"train.steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2,
                                         "train.replicates": 3}), "seed": p.seed + 2})
    train("tadm", q, data_dir=micro_packed, root=tmp_path / "other", log=lambda *_: None)
    c = load_file(str(tmp_path / "other/models/tadm/model.safetensors"))
    assert all(torch.equal(b[k], c[k]) for k in b)


def test_how_many_replicates_train_is_not_part_of_a_run_s_identity(micro_packed):
    from tadm.train.trainer import fingerprint

    manifest = micro_packed / "manifest.json"
    p = config.from_dict(micro_raw())
    same = [fingerprint("tadm", config.override(p, {"train.replicates": n, "train.replicate_models": m}), manifest)
            for n, m in ((1, []), (3, ["tadm"]), (2, ["mdlm", "tadm", "tadm_gamma0"]))]
    assert len(set(same)) == 1
    assert fingerprint("tadm", config.override(p, {"seed": 1}), manifest) != same[0]  # the seed is


def test_validation_nelbo_falls_below_initialisation(micro_packed, tmp_path):
    p = config.from_dict(micro_raw(**{"train.steps": 150, "train.eval_every": 150, "train.lr": 3.0e-3,
                                      "train.warmup_steps": 5, "train.ema": 0.5, "train.eval_sequences": 32}))
    s = train("mdlm", p, data_dir=micro_packed, root=tmp_path, log=lambda *_: None)
    assert s["val_nelbo"] < s["val_nelbo_init"] - 1.0, s


def test_sigkill_then_rerun_gives_bit_identical_weights(micro_packed, tmp_path):
    # killed at its first checkpoint (step 25): the resumed run crosses three more checkpoints
    raw = micro_raw(**{"train.steps": 100, "train.checkpoint_every": 25, "train.eval_every": 100,
                       "train.log_every": 25})
    params = write_params(tmp_path / "params.yaml", raw)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _finish(_cli(params, "tadm", micro_packed, tmp_path / "a"))

    proc = _cli(params, "tadm", micro_packed, tmp_path / "b")
    latest = tmp_path / "b/checkpoints/tadm/latest"
    deadline = time.time() + 300
    while not latest.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed; raise train.steps"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = (tmp_path / "b/checkpoints/tadm/latest").read_text().strip()
    assert killed_at != "step_000100"

    out = _finish(_cli(params, "tadm", micro_packed, tmp_path / "b"))
    assert "resumed from step" in out
    for f in ("models/tadm/model.safetensors", "checkpoints/tadm/step_000100/model.safetensors",
              "checkpoints/tadm/step_000100/optimizer.safetensors"):
        a, b = load_file(str(tmp_path / "a" / f)), load_file(str(tmp_path / "b" / f))
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (f, k)
    hist = lambda d: list(csv.DictReader(open(tmp_path / d / "metrics/train/tadm.csv")))
    assert [r["train_loss"] for r in hist("a")] == [r["train_loss"] for r in hist("b")]


def test_two_gloo_processes_follow_the_single_process_trajectory(micro_packed, tmp_path):
    raw = micro_raw(**{"train.steps": 6, "train.global_batch": 4, "train.micro_batch": 2,
                       "train.log_every": 1, "train.eval_every": 6, "train.checkpoint_every": 6})
    params = write_params(tmp_path / "params.yaml", raw)
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()
    _finish(_cli(params, "tadm", micro_packed, tmp_path / "one"))
    _finish(_cli(params, "tadm", micro_packed, tmp_path / "two", nproc=2))
    hist = lambda d: [float(r["train_loss"]) for r in csv.DictReader(open(tmp_path / d / "metrics/train/tadm.csv"))]
    one, two = hist("one"), hist("two")
    assert len(one) == len(two) == 6
    assert one == pytest.approx(two, rel=1e-5, abs=1e-6)
    a = load_file(str(tmp_path / "one/models/tadm/model.safetensors"))
    b = load_file(str(tmp_path / "two/models/tadm/model.safetensors"))
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6), k


def test_learning_rate_schedules_against_their_closed_forms():
    """Warm-up then constant (MDLM), or warm-up then cosine to min_lr_ratio x lr at the last
    step; a cosine run's train.steps is part of its fingerprint (the decay ends there)."""
    import math
    from pathlib import Path

    from tadm import config
    from tadm.train.trainer import learning_rate, run_settings

    p = config.override(config.load(config.PROFILES_DIR / "default.yaml"),
                        {"train.lr": 1e-3, "train.warmup_steps": 10, "train.steps": 110, "train.min_lr_ratio": 0.1})
    const = config.override(p, {"train.schedule": "constant"})
    cos = config.override(p, {"train.schedule": "cosine"})
    assert learning_rate(4, const) == learning_rate(4, cos) == 1e-3 * 5 / 10
    assert learning_rate(60, const) == 1e-3
    assert math.isclose(learning_rate(10, cos), 1e-3)
    assert math.isclose(learning_rate(60, cos), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))))
    assert math.isclose(learning_rate(110, cos), 1e-4)
    assert "steps" in run_settings("mdlm", cos, Path(__file__))["train"]
    assert "steps" not in run_settings("mdlm", const, Path(__file__))["train"]


def test_step_tokens_are_this_process_micro_batches_in_order():
    """step_tokens(...) gives micro-batch j of `mine` = samples idx[j*m:(j+1)*m], stacked, on
    the device; the same tensors the loop used to stack one micro-batch at a time."""
    import numpy as np
    from tadm.train.trainer import step_tokens
    data = [np.arange(i * 4, i * 4 + 4, dtype=np.int64) for i in range(12)]
    idx = [5, 2, 9, 0, 11, 3, 7, 1]  # a global batch of 8, micro-batches of 2
    xs = step_tokens(data, idx, [1, 3], 2, torch.device("cpu"))
    assert [tuple(x.shape) for x in xs] == [(2, 4), (2, 4)]
    for x, j in zip(xs, [1, 3]):
        expected = torch.stack([torch.from_numpy(data[i]) for i in idx[j * 2:(j + 1) * 2]])
        assert torch.equal(x, expected)


@pytest.mark.parametrize("profile", ["default", "paper"])
def test_the_model_card_renders_for_every_family_of_each_profile(profile):
    """The card the trainer writes, for each run the profile trains (the paper profile's runs are
    only ever trained on GPUs: its card is checked here)."""
    from tadm.methods import get_method
    from tadm.train.card import model_card

    p = config.from_dict(config.render_profile(profile))
    counts = {"seq_len": p.packing.seq_len, "vocab_size": p.tokenizer.vocab_size, "bos_id": 0,
              "train": {"tokens": 9_000_000_000, "sequences": 8_800_000}, "validation": {"tokens": 100_000, "sequences": 97}}
    for run in p.train.models:
        method = get_method(run, p)
        summary = {"run": run, "model_type": method.model_type, "seed": p.seed, "steps": p.train.steps,
                   "parameters": 123_456, "val_nelbo": 3.25, "val_ppl_bound": 25.79, "below_unigram": 1.5}
        card = model_card(summary, p, method, counts)
        assert card.startswith("---\nlibrary_name: tadm\n") and f"| profile | `{profile}`" in card
        assert "3.2500 nats/token" in card and f"{p.train.steps:,} steps" in card
        compile(card.split("```python\n")[1].split("```")[0], "card", "exec")  # the example is Python
        # the example samples at the profile's first Table 2 budget's K (default 8, not a fixed 4)
        assert (f"FixedInterval({p.sample.budgets[0].K})" in card) == method.refreshes
        if profile == "paper":
            assert "OpenWebText" in card and "on 97 validation sequences" in card
