"""The command line prints what the paper says and fails with one line on bad input."""

import subprocess
import sys

from tadm import config


def _run(*args, cwd=config.ROOT):
    return subprocess.run([sys.executable, "-m", "tadm", *args], capture_output=True, text=True, cwd=cwd)


def test_count_at_the_paper_profile_prints_the_paper_numbers(tmp_path):
    params = tmp_path / "params.yaml"
    assert _run("--params", str(params), "profile", "paper").returncode == 0
    out = _run("--params", str(params), "count")
    assert out.returncode == 0, out.stderr
    assert "tadm: 224.01M unique inference parameters + 38.85M training-only anchor LM head" in out.stdout


def test_train_without_data_is_one_line(tmp_path):
    out = _run("--params", str(config.PARAMS_FILE), "train", "mdlm", "--data", str(tmp_path / "nothing"), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "manifest.json: missing; rerun dvc repro pack" in out.stderr


def test_missing_params_file_is_one_line(tmp_path):
    out = _run("check", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == "error: params.yaml: file does not exist (create it with `python -m tadm profile default`)"


def test_unknown_run_is_one_line(tmp_path):
    out = _run("train", "gpt5", cwd=config.ROOT)
    assert out.returncode == 2 and "unknown run 'gpt5'" in out.stderr and "Traceback" not in out.stderr


def test_sample_a_trained_tadm_with_anchor_reuse(micro_packed, tmp_path):
    from tadm.train.trainer import train
    from tests.conftest import micro_raw, write_params

    raw = micro_raw(**{"train.steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2})
    params = write_params(tmp_path / "params.yaml", raw)
    train("tadm", config.load(params), data_dir=micro_packed, root=tmp_path, log=lambda *_: None)
    out = _run("--params", str(params), "sample", str(tmp_path / "models/tadm"), "--steps", "8",
               "--refresh-every", "2", "--num", "2", "--tokenizer", str(micro_packed.parent / "tokenizer"),
               "--sampler", "mdlm")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("--- sample ") == 2
    import json

    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["anchor_calls"] == 4  # ceil(T / K) refreshes of one trajectory
    assert summary["settings"]["precision"] == "float64"
