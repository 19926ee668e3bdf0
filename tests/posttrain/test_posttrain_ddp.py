"""The post-train loop under torchrun: two gloo processes with grad_accum 1 train the same fusion
as one process with grad_accum 2 (the same global batch: batch_size x grad_accum x processes),
and a run killed mid-way resumes to the same weights (through the `tadm dg-posttrain` CLI)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import micro_raw, write_params
from tests.posttrain.conftest import tiny_config

from tadm import config

pytestmark = pytest.mark.slow


def _env():
    env = dict(os.environ)
    env.pop("WORLD_SIZE", None)
    env["PYTHONPATH"] = str(config.ROOT)
    return env


@pytest.fixture(scope="module")
def workdir(micro_packed, tmp_path_factory) -> tuple[Path, Path]:
    """A micro SFT stage and a tiny random DiffusionGemma (the micro tokenizer's vocabulary)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from tadm.data import sft
    from tadm.data.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("dg")
    raw = micro_raw(**{"posttrain.steps": 8, "posttrain.grad_accum": 2, "posttrain.batch_size": 2,
                       "posttrain.checkpoint_every": 2, "posttrain.log_every": 1,
                       "posttrain.shared_layers": 1, "posttrain.anchor_layers": 3, "posttrain.denoiser_layers": 2})
    params = write_params(root / "params.yaml", raw)
    p = config.load(params)
    tok = load_tokenizer(micro_packed.parent / "tokenizer")
    sft.build(p, tok, root / "sft")
    torch.manual_seed(0)
    base = DiffusionGemmaForBlockDiffusion(tiny_config(vocab=len(tok), canvas=p.posttrain.canvas_length))
    base.save_pretrained(root / "base" / "models" / "dg_base")
    tok.save_pretrained(root / "base" / "models" / "dg_base")
    return root, params


def _cmd(workdir, nproc: int, params: Path | None = None) -> list[str]:
    root, default = workdir
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else [sys.executable]
    return [*launcher, "-m", "tadm", "--params", str(params or default), "dg-posttrain", "--sft", str(root / "sft")]


def _run(workdir, name: str, nproc: int = 1, params: Path | None = None) -> tuple[Path, str]:
    cwd = workdir[0] / name
    if not cwd.exists():
        shutil.copytree(workdir[0] / "base", cwd)
    proc = subprocess.run(_cmd(workdir, nproc, params), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cwd, proc.stdout


@pytest.fixture(scope="module")
def straight(workdir) -> Path:
    """One process, grad_accum 2, uninterrupted."""
    return _run(workdir, "straight")[0]


def _fusion(cwd: Path) -> dict:
    return load_file(str(cwd / "models" / "dg_tadm" / "fusion.safetensors"))


def _losses(cwd: Path) -> list[float]:
    return [r["loss"] for r in json.loads((cwd / "metrics" / "posttrain" / "dg_posttrain.json").read_text())["history"]]


def test_two_gloo_processes_train_the_fusion_like_one_with_their_global_batch(workdir, straight):
    raw = yaml.safe_load(workdir[1].read_text())
    raw["posttrain"]["grad_accum"] = 1  # 2 processes x 1 micro-batch = 1 process x 2
    two, out = _run(workdir, "two", nproc=2, params=write_params(workdir[0] / "params_two.yaml", raw))
    assert "2 processes on cpu, 1 micro-batches of 2 each per step (global batch 4)" in out
    assert _losses(straight) == pytest.approx(_losses(two), rel=1e-5, abs=1e-6)
    a, b = _fusion(straight), _fusion(two)
    assert any(a["up.weight"].abs().flatten() > 0)  # it trained
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6), k


def test_a_killed_run_resumes_to_the_same_fusion(workdir, straight):
    cwd = workdir[0] / "killed"
    shutil.copytree(workdir[0] / "base", cwd)
    proc = subprocess.Popen(_cmd(workdir, 1), cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = cwd / "checkpoints" / "dg_posttrain" / "step_000002"
    while not first.exists() and proc.poll() is None:
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    assert not (cwd / "models" / "dg_tadm").exists(), "the run finished before it could be killed"
    _, out = _run(workdir, "killed")
    assert "resumed from step" in out
    assert _losses(straight) == _losses(cwd)
    a, b = _fusion(straight), _fusion(cwd)
    assert all(torch.equal(a[k], b[k]) for k in a)
