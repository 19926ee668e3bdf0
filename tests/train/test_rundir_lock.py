"""A run directory is never wiped: one run at a time holds it (a second is refused naming the
holder, and leaves the first run's checkpoints as they were), a killed holder does not block the
next run, and every field of state.json is covered by a verified hash (an edited step or a
malformed file is refused in one line naming the file)."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from tadm import cli, config
from tadm.train import checkpoint as ck
from tadm.train.trainer import train
from tests.conftest import micro_raw, torch_single_thread, write_params
from tests.train.test_checkpoint import _state

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)
QUIET = {"log": lambda *_: None}


def _params(**kw) -> config.Params:
    return config.from_dict(micro_raw(**{"train.checkpoint_every": 2, "train.eval_every": 100,
                                         "train.schedule": "constant", **kw}))


def _checkpoint_files(run_dir) -> dict:
    """Every file of the run directory but the lock file, with its bytes."""
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ck.LOCK}


def _holder(run_dir, tmp_path) -> subprocess.Popen:
    """A child process that takes the run's lock (as a training run does), says so and waits."""
    code = textwrap.dedent(f"""
        import sys, time
        from tadm.train import checkpoint
        checkpoint.RunLock({str(run_dir)!r}, "first run").acquire()
        print("locked", flush=True)
        time.sleep(120)
    """)
    env = {**os.environ, "PYTHONPATH": str(config.ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_run_on_a_held_directory_fails_naming_the_holder_and_changes_nothing(
        micro_packed, tmp_path, monkeypatch, capsys):
    train("tadm", _params(**{"train.steps": 2}), data_dir=micro_packed, root=tmp_path, **QUIET)
    run_dir = tmp_path / "checkpoints" / "tadm"
    before = _checkpoint_files(run_dir)
    first = _holder(run_dir, tmp_path)
    try:
        params = write_params(tmp_path / "params.yaml", micro_raw(**{"train.steps": 4, "train.lr": 1e-4,
                                                                     "train.checkpoint_every": 2}))
        monkeypatch.chdir(tmp_path)
        argv = ["--params", str(params), "train", "tadm", "--data", str(micro_packed)]
        for extra in ([], ["--restart"]):  # not even --restart may move a held directory aside
            capsys.readouterr()
            assert cli.main([*argv, *extra]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith("error:") and "\n" not in err, err
            assert f"pid {first.pid} on {socket.gethostname()} since " in err and "first run" in err, err
            assert "lock file checkpoints/tadm/run.lock" in err, err
        assert _checkpoint_files(run_dir) == before  # byte-identical
        assert not list(tmp_path.glob("checkpoints/tadm.old-*"))
    finally:
        first.kill()
        first.wait()


def test_a_killed_holder_does_not_block_the_next_run(micro_packed, tmp_path):
    run_dir = tmp_path / "checkpoints" / "tadm"
    first = _holder(run_dir, tmp_path)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (run_dir / ck.LOCK).read_text()  # the lock file is still there, naming the dead holder
    logs = []
    train("tadm", _params(**{"train.steps": 2}), data_dir=micro_packed, root=tmp_path, log=logs.append)
    assert (run_dir / "latest").read_text().strip() == "step_000002"
    assert (run_dir / ck.LOCK).read_text() == ""  # released at the end of the run


def test_lock_is_exclusive_within_a_process_and_released_on_exception(tmp_path):
    with pytest.raises(RuntimeError):
        with ck.RunLock(tmp_path, "x"):
            with pytest.raises(ck.RunLocked, match="pid .* since .*x"):
                ck.RunLock(tmp_path, "y").acquire()
            raise RuntimeError
    with ck.RunLock(tmp_path, "z"):  # free again
        pass


def _two_checkpoints(tmp_path):
    for step in (1, 2):
        state, names = _state(step)
        ck.save(tmp_path, state, names)
    return names


def _edit(path, fn):
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta, indent=1, sort_keys=True))


@pytest.mark.parametrize("edit", ["step", "scalar", "extra", "state_hash_removed"])
def test_an_edited_state_json_fails_verification_and_the_previous_checkpoint_is_used(tmp_path, edit):
    names = _two_checkpoints(tmp_path)
    newest = tmp_path / "step_000002" / "state.json"
    change = {"step": lambda m: m.update(step=1),
              "scalar": lambda m: m["optimizer"]["param_groups"][0].update(lr=1.0),
              "extra": lambda m: m["extra"].update(x=[2]),
              "state_hash_removed": lambda m: m.pop("state_sha256")}[edit]
    _edit(newest, change)
    with pytest.raises(ck.CheckpointCorrupt) as err:
        ck.load(newest.parent, names)
    assert "\n" not in str(err.value) and str(newest) in str(err.value)
    logs = []
    assert ck.load_latest(tmp_path, names, "f", log=logs.append).step == 1  # the module's policy: fall back
    assert any(str(newest) in m for m in logs)


def test_a_step_edited_with_its_hash_recomputed_still_disagrees_with_the_directory(tmp_path):
    names = _two_checkpoints(tmp_path)
    path = tmp_path / "step_000002" / "state.json"
    _edit(path, lambda m: (m.update(step=7), m.update(state_sha256=ck._state_hash(m))))
    with pytest.raises(ck.CheckpointCorrupt, match="does not match the directory"):
        ck.load(path.parent, names)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"step"', "",
                                  "EDIT:step=str", "EDIT:optimizer=list", "EDIT:step=bool"])
def test_a_malformed_state_json_is_refused_in_one_line_naming_it(tmp_path, text):
    names = _two_checkpoints(tmp_path)
    path = tmp_path / "step_000002" / "state.json"
    if text.startswith("EDIT:"):
        key, kind = text[5:].split("=")
        value = {"str": "2", "list": [], "bool": True}[kind]
        _edit(path, lambda m: m.update({key: value}))
    else:
        path.write_text(text)
    with pytest.raises(ck.CheckpointCorrupt) as err:
        ck.load(path.parent, names)
    assert "\n" not in str(err.value) and str(path) in str(err.value), err.value


def test_when_no_checkpoint_verifies_the_run_is_refused_and_nothing_is_overwritten(micro_packed, tmp_path):
    train("tadm", _params(**{"train.steps": 2}), data_dir=micro_packed, root=tmp_path, **QUIET)
    run_dir = tmp_path / "checkpoints" / "tadm"
    _edit(run_dir / "step_000002" / "state.json", lambda m: m.update(step=1))
    before = _checkpoint_files(run_dir)
    with pytest.raises(ck.CheckpointCorrupt) as err:
        train("tadm", _params(**{"train.steps": 4}), data_dir=micro_packed, root=tmp_path, **QUIET)
    assert "\n" not in str(err.value) and "no checkpoint verifies" in str(err.value) and "--restart" in str(err.value)
    assert _checkpoint_files(run_dir) == before


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ck.LOCK).symlink_to(target)
    with pytest.raises(ck.RunLocked, match="is a symbolic link .*refusing to write through it"):
        ck.RunLock(run_dir, "x").acquire()
    assert target.read_text() == "keep me\n"
    (run_dir / ck.LOCK).unlink()
    (run_dir / ck.LOCK).mkdir()  # not a regular file either
    with pytest.raises(ck.RunLocked, match="is a directory"):
        ck.RunLock(run_dir, "x").acquire()
