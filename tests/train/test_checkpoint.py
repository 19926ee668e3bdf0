"""Checkpoints are atomic, verified on load, and never partly loaded."""

import pytest
import torch

from tadm.train import checkpoint as ck


def _state(step: int, scale: float = 1.0) -> tuple[ck.TrainState, list[str]]:
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    for p in model.parameters():
        p.data.mul_(scale)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    names = [n for n, _ in model.named_parameters()]
    sd = model.state_dict()
    return ck.TrainState(step, sd, {k: v + 1 for k, v in sd.items()}, opt.state_dict(), {"fingerprint": "f", "x": [1]}), names


def test_round_trip_is_exact(tmp_path):
    state, names = _state(3)
    ck.save(tmp_path, state, names)
    back = ck.load(tmp_path / "step_000003", names)
    assert back.step == 3 and back.extra == state.extra
    for k in state.model:
        assert torch.equal(back.model[k], state.model[k]) and torch.equal(back.ema[k], state.ema[k])
    for i, s in state.optimizer["state"].items():
        for key, v in s.items():
            assert torch.equal(torch.as_tensor(back.optimizer["state"][i][key]), torch.as_tensor(v))
    assert back.optimizer["param_groups"] == state.optimizer["param_groups"]


def test_keeps_the_newest_and_points_latest_at_it(tmp_path):
    for step in (1, 2, 3):
        state, names = _state(step)
        ck.save(tmp_path, state, names, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000002", "step_000003"]
    assert (tmp_path / "latest").read_text().strip() == "step_000003"


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage_state"])
def test_corrupted_checkpoint_is_refused_and_the_previous_one_used(tmp_path, damage):
    for step in (1, 2):
        state, names = _state(step)
        ck.save(tmp_path, state, names)
    newest = tmp_path / "step_000002"
    f = newest / "model.safetensors"
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[:50])
    elif damage == "flip":
        data = bytearray(f.read_bytes())
        data[-3] ^= 0xFF
        f.write_bytes(bytes(data))
    else:
        (newest / "state.json").write_text("{not json")
    with pytest.raises(ck.CheckpointCorrupt) as err:
        ck.load(newest, names)
    assert "\n" not in str(err.value) and "step_000002" in str(err.value)
    logs = []
    back = ck.load_latest(tmp_path, names, "f", log=logs.append)
    assert back.step == 1 and any("skipping" in m for m in logs)


def test_a_kill_during_the_write_leaves_no_visible_checkpoint(tmp_path, monkeypatch):
    state, names = _state(1)
    ck.save(tmp_path, state, names)
    calls = {"n": 0}
    real = ck.save_file

    def dying_save(tensors, path):  # the process "dies" after the first file
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        real(tensors, path)

    monkeypatch.setattr(ck, "save_file", dying_save)
    state2, _ = _state(2)
    with pytest.raises(KeyboardInterrupt):
        ck.save(tmp_path, state2, names)
    assert [p.name for p in tmp_path.glob("step_*")] == ["step_000001"]
    assert (tmp_path / "latest").read_text().strip() == "step_000001"
    assert ck.load_latest(tmp_path, names, "f").step == 1


def _files(d):
    """The checkpoint files (the run's lock file, run.lock, is not one: move_aside takes the lock)."""
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file() and p.name != ck.LOCK}


def test_a_checkpoint_of_other_settings_is_refused_naming_them_and_kept(tmp_path):
    settings = {"seed": 0, "train": {"lr": 1e-3, "gamma": 0.5}, "code": "a" * 64}
    state, names = _state(1)
    state.extra.update(fingerprint=ck.fingerprint(settings), settings=settings)
    ck.save(tmp_path, state, names)
    before = _files(tmp_path)
    assert ck.load_latest(tmp_path, names, settings).step == 1
    other = {"seed": 0, "train": {"lr": 2e-3, "gamma": 0.5, "new": 1}, "code": "b" * 64}
    with pytest.raises(ck.SettingsChanged) as err:
        ck.load_latest(tmp_path, names, other, restart="`tadm train x --restart`")
    message = str(err.value)
    assert "\n" not in message and "train.lr (0.001 -> 0.002)" in message and "train.new" in message
    assert "code" in message  # a long value (a hash): named without its values
    assert "`tadm train x --restart`" in message and "gamma" not in message
    assert _files(tmp_path) == before  # nothing deleted
    with pytest.raises(ck.SettingsChanged, match="not recorded"):  # a checkpoint with only a fingerprint
        ck.load_latest(tmp_path, names, "other-fingerprint")


def test_move_aside_renames_and_never_overwrites(tmp_path):
    run = tmp_path / "checkpoints" / "run"
    assert ck.move_aside(run) is None  # nothing there
    for step in (1, 2):
        state, names = _state(step)
        ck.save(run, state, names)
    before = _files(run)
    moved = ck.move_aside(run)
    assert moved == tmp_path / "checkpoints" / "run.old-2" and not run.exists() and _files(moved) == before
    state, names = _state(2)
    ck.save(run, state, names)
    assert ck.move_aside(run) == tmp_path / "checkpoints" / "run.old-2-2" and _files(moved) == before


def test_optimizer_state_resumes_with_the_optimizer_s_own_implementation(tmp_path):
    state, names = _state(1)
    saved = {**state.optimizer, "param_groups": [{**g, "foreach": True} for g in state.optimizer["param_groups"]]}
    ck.save(tmp_path, ck.TrainState(1, state.model, state.ema, saved, {"fingerprint": "f"}), names)
    back = ck.load(tmp_path / "step_000001", names)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ck.restore_optimizer(opt, back.optimizer)
    assert opt.param_groups[0]["foreach"] is False  # the running optimizer's choice, not the saved one
    for i, p in enumerate(model.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt.state[p][key].device == p.device
            assert torch.equal(opt.state[p][key], state.optimizer["state"][i][key])
