"""Resuming under changed settings: more train.steps resumes (and ends where a longer run ends),
a change of the objective is refused with the changed key named and the checkpoints kept,
`--restart` moves them aside and starts fresh."""

import pytest
import torch
from safetensors.torch import load_file

from tadm import cli, config
from tadm.train import checkpoint as ck
from tadm.train.trainer import run_settings, train
from tests.conftest import micro_raw, torch_single_thread, write_params

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)
QUIET = {"log": lambda *_: None}


def _params(**kw) -> config.Params:
    """Micro settings with the constant (MDLM, paper-profile) lr schedule: there a run's length is
    not part of its objective, so extending it resumes."""
    return config.from_dict(micro_raw(**{"train.checkpoint_every": 2, "train.eval_every": 100,
                                         "train.schedule": "constant", **kw}))


def _weights(root, run="tadm") -> dict:
    return load_file(str(root / "models" / run / "model.safetensors"))


def _files(run_dir) -> dict:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_more_steps_resume_to_the_weights_of_a_longer_run(micro_packed, tmp_path):
    train("tadm", _params(**{"train.steps": 6}), data_dir=micro_packed, root=tmp_path / "straight", **QUIET)
    logs = []
    train("tadm", _params(**{"train.steps": 4}), data_dir=micro_packed, root=tmp_path / "extended", **QUIET)
    train("tadm", _params(**{"train.steps": 6}), data_dir=micro_packed, root=tmp_path / "extended", log=logs.append)
    assert "[tadm] resumed from step 4" in logs
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "extended")
    assert all(torch.equal(a[k], b[k]) for k in a)
    for f in ("model.safetensors", "ema.safetensors", "optimizer.safetensors"):
        a = load_file(str(tmp_path / "straight/checkpoints/tadm/step_000006" / f))
        b = load_file(str(tmp_path / "extended/checkpoints/tadm/step_000006" / f))
        assert all(torch.equal(a[k], b[k]) for k in a), f


def test_a_resumed_run_with_dropout_matches_an_uninterrupted_one(micro_packed, tmp_path):
    """Dropout draws from the global generators; the trainer seeds them per (seed, step, micro)."""
    p = lambda steps: _params(**{"train.steps": steps, "model.dropout": 0.1})  # noqa: E731
    train("mdlm", p(3), data_dir=micro_packed, root=tmp_path / "straight", **QUIET)
    train("mdlm", p(2), data_dir=micro_packed, root=tmp_path / "resumed", **QUIET)
    torch.rand(7)  # whatever the global generator's state is at the restart
    train("mdlm", p(3), data_dir=micro_packed, root=tmp_path / "resumed", **QUIET)
    a, b = _weights(tmp_path / "straight", "mdlm"), _weights(tmp_path / "resumed", "mdlm")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_log_eval_checkpoint_cadence_and_runtime_are_not_part_of_a_run():
    manifest = config.ROOT / "pyproject.toml"  # any file: only its hash enters the settings
    base = run_settings("tadm", _params(), manifest)
    other = _params(**{"train.steps": 9, "train.log_every": 5, "train.eval_every": 7, "train.eval_sequences": 2,
                       "train.checkpoint_every": 3, "train.models": ["tadm"], "train.replicates": 3,
                       "train.replicate_models": ["tadm"], "runtime.nproc": 2,
                       "runtime.compile": True, "runtime.device": "cpu", "runtime.precision": "fp32",
                       "runtime.tf32": False})
    assert run_settings("tadm", other, manifest) == base
    # what changes the objective does
    for key, value in (("train.lr", 1e-4), ("train.precision", "fp32" if _params().train.precision == "bf16" else "bf16"), ("train.gamma", 0.5), ("seed", 3)):
        assert run_settings("tadm", config.override(_params(), {key: value}), manifest) != base, key
    # ADLM ramps its anchor weight over a fraction of train.steps: there the steps are the objective
    assert run_settings("adlm", _params(**{"train.steps": 9}), manifest) != run_settings("adlm", _params(), manifest)
    # a cosine lr decays to its floor at train.steps: there too the steps are the objective
    cosine = {"train.schedule": "cosine"}
    assert run_settings("tadm", _params(**cosine, **{"train.steps": 9}), manifest) != \
        run_settings("tadm", _params(**cosine), manifest)


def test_a_changed_learning_rate_is_refused_naming_it_and_the_checkpoints_are_kept(micro_packed, tmp_path):
    train("tadm", _params(**{"train.steps": 4}), data_dir=micro_packed, root=tmp_path, **QUIET)
    run_dir = tmp_path / "checkpoints" / "tadm"
    before = _files(run_dir)
    with pytest.raises(ck.SettingsChanged) as err:
        train("tadm", _params(**{"train.steps": 6, "train.lr": 1e-4}), data_dir=micro_packed, root=tmp_path, **QUIET)
    message = str(err.value)
    lr = _params().train.lr
    assert "\n" not in message and f"train.lr ({lr} -> 0.0001)" in message and "--restart" in message
    assert "train.steps" not in message  # extending is not a change
    assert _files(run_dir) == before


def test_restart_moves_the_checkpoints_aside_and_starts_fresh(micro_packed, tmp_path, monkeypatch, capsys):
    """Through the CLI: `tadm train tadm --restart` after a settings change."""
    train("tadm", _params(**{"train.steps": 4}), data_dir=micro_packed, root=tmp_path, **QUIET)
    before = _files(tmp_path / "checkpoints" / "tadm")
    params = write_params(tmp_path / "params.yaml", micro_raw(**{"train.steps": 2, "train.lr": 1e-4,
                                                                 "train.checkpoint_every": 2}))
    monkeypatch.chdir(tmp_path)
    argv = ["--params", str(params), "train", "tadm", "--data", str(micro_packed)]
    capsys.readouterr()
    assert cli.main(argv) == 2  # refused: one line naming the key
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "train.lr" in err and "\n" not in err, err
    assert cli.main([*argv, "--restart"]) == 0
    moved = tmp_path / "checkpoints" / "tadm.old-4"
    assert _files(moved) == before  # nothing deleted, nothing changed
    assert (tmp_path / "checkpoints/tadm/latest").read_text().strip() == "step_000002"  # trained fresh
    assert cli.main([*argv, "--restart"]) == 0  # a second restart does not overwrite the first
    assert (tmp_path / "checkpoints" / "tadm.old-2").is_dir() and _files(moved) == before
