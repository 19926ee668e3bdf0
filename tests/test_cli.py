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
    assert "tadm: 224.01M unique inference parameters + 38.85M training-only parameters" in out.stdout


def _default_params(tmp_path):
    """The default profile's params.yaml, written under tmp_path: never the checkout's, which may
    be switched to another profile."""
    return str(config.write_profile("default", tmp_path / "params.yaml"))


def test_train_without_data_is_one_line(tmp_path):
    out = _run("--params", _default_params(tmp_path), "train", "mdlm", "--data", str(tmp_path / "nothing"), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "manifest.json: missing; rerun dvc repro pack" in out.stderr


def test_missing_params_file_is_one_line(tmp_path):
    out = _run("check", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == "error: params.yaml: file does not exist (create it with `python -m tadm profile default`)"


def test_unknown_run_is_one_line(tmp_path):
    out = _run("--params", _default_params(tmp_path), "train", "gpt5", cwd=config.ROOT)
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


# --------------------------------------------------------------------------- profile: the committed run is kept

FIGURES_SCRIPT = """import json, pathlib, yaml
profile = yaml.safe_load(open("params.yaml"))["profile"]
pathlib.Path("paper_figures/runs").mkdir(parents=True, exist_ok=True)
pathlib.Path("metrics").mkdir(exist_ok=True)
pathlib.Path("models").mkdir(exist_ok=True)
pathlib.Path(f"paper_figures/runs/{profile}.md").write_text(f"a run of {profile}\\n")
pathlib.Path("metrics/run.json").write_text(json.dumps({"profile": profile}))
pathlib.Path("models/weights.bin").write_bytes(profile.encode() * 1000)
"""

PIPELINE = """stages:
  figures:
    cmd: python make_figures.py
    deps: [make_figures.py]
    params: [profile]
    outs:
      - paper_figures/runs: {cache: false}
      - metrics/run.json: {cache: false}
      - models/weights.bin
"""


def _env() -> dict:
    import os
    from pathlib import Path

    env = dict(os.environ, DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `python` in dvc.yaml
    return env


def _in(repo, *args):
    proc = subprocess.run(list(args), cwd=repo, capture_output=True, text=True, env=_env())
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _tree(repo) -> dict:
    """Every file of the checkout but git's and DVC's own, byte for byte."""
    return {p.relative_to(repo).as_posix(): p.read_bytes() for p in sorted(repo.rglob("*"))
            if p.is_file() and p.relative_to(repo).parts[0] not in (".git", ".dvc")}


def _one_line_refusal(out, *words):
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    line = out.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("error: ") and all(w in line for w in words), line
    return line


def test_a_switch_away_from_the_committed_run_is_refused_forced_and_restored_byte_for_byte(tmp_path):
    """A checkout whose HEAD commits a run of the default profile (a one-stage pipeline writing a
    git-tracked folder and file and a DVC-cached file): switching to micro is refused in one line,
    --force switches, `dvc repro` overwrites the run, and `profile default --restore` brings every
    file back as committed (what the micro run added removed, the DVC-cached file checked out)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "make_figures.py").write_text(FIGURES_SCRIPT)
    (repo / "dvc.yaml").write_text(PIPELINE)
    _in(repo, "git", "init", "-q")
    _in(repo, sys.executable, "-m", "dvc", "init", "-q")
    assert _run("profile", "micro", cwd=repo).returncode == 0  # no commit yet: nothing to keep
    assert _run("profile", "default", cwd=repo).returncode == 0
    _in(repo, sys.executable, "-m", "dvc", "repro", "-q")
    _in(repo, "git", "add", "-A")
    _in(repo, "git", "-c", "commit.gpgsign=false", "commit", "-q", "-m", "the committed run")
    committed = _tree(repo)
    assert committed["metrics/run.json"] == b'{"profile": "default"}' and "paper_figures/runs/default.md" in committed

    line = _one_line_refusal(_run("profile", "micro", cwd=repo), "error: params.yaml: profile: ", "'default'",
                             "--force", "python -m tadm profile default --restore", "git worktree add")
    assert _tree(repo) == committed, line  # params.yaml untouched
    assert _run("profile", "default", cwd=repo).returncode == 0  # the committed profile itself: no question

    forced = _run("profile", "micro", "--force", cwd=repo)
    assert forced.returncode == 0 and "python -m tadm profile default --restore" in forced.stdout, forced.stderr
    _in(repo, sys.executable, "-m", "dvc", "repro", "-q")
    after = _tree(repo)
    assert after["metrics/run.json"] == b'{"profile": "micro"}' and after["models/weights.bin"].startswith(b"micro")
    assert "paper_figures/runs/micro.md" in after and "paper_figures/runs/default.md" not in after
    _in(repo, "git", "add", "paper_figures")  # even staged, the other run's files go

    _one_line_refusal(_run("profile", "micro", "--restore", cwd=repo), "--restore: the committed run is profile "
                      "'default''s", "python -m tadm profile default --restore")
    restored = _run("profile", "default", "--restore", cwd=repo)
    assert restored.returncode == 0, restored.stderr
    assert "restored params.yaml, dvc.lock, metrics/, paper_figures/" in restored.stdout, restored.stdout
    assert _tree(repo) == committed
    assert _in(repo, "git", "status", "--porcelain").stdout == ""


def test_restore_and_force_refuse_in_one_line_where_there_is_nothing_to_restore(tmp_path):
    _one_line_refusal(_run("profile", "default", "--restore", cwd=tmp_path),
                      "--restore: ", "is not the params.yaml at the top of a git checkout")
    _one_line_refusal(_run("profile", "--force", cwd=tmp_path), "--force: needs a profile name")
    out = _run("profile", "micro", "--force", "--restore", cwd=tmp_path)
    assert out.returncode == 2 and "not allowed with argument" in out.stderr and out.stderr.strip().count("\n") == 0
    assert not (tmp_path / "params.yaml").exists()
