"""Where a training run writes: a full disk at a checkpoint and an unwritable output place are
one line, never a traceback after the work."""

import errno

import pytest
from safetensors import SafetensorError

from tadm import config
from tadm.errors import DataError
from tadm.train import checkpoint as ck
from tadm.train.trainer import train
from tests.conftest import micro_raw, torch_single_thread
from tests.train.test_checkpoint import _state

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)
QUIET = {"log": lambda *_: None}


@pytest.mark.parametrize("failure", [
    SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'),
    OSError(errno.ENOSPC, "No space left on device"),
])
def test_a_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_last_one(tmp_path, monkeypatch, failure):
    """A full checkpoints/ used to end the run in a 21-line SafetensorError: now one line naming
    the directory, the free space and the checkpoint a rerun resumes from; nothing half-written
    is left and `latest` still names the good one."""
    state, names = _state(1)
    ck.save(tmp_path, state, names)
    state.step = 2
    calls = {"n": 0}
    real = ck.save_file

    def save_file(tensors, path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second file of the checkpoint: a half-written directory
            raise failure
        return real(tensors, path, *args, **kwargs)

    monkeypatch.setattr(ck, "save_file", save_file)
    with pytest.raises(ck.CheckpointWriteFailed) as err:
        ck.save(tmp_path, state, names)
    message = str(err.value)
    assert "\n" not in message and "cannot write checkpoint step_000002" in message, message
    assert "No space left on device" in message and "MiB free on its disk" in message, message
    assert f"kept ({tmp_path / 'step_000001'})" in message, message
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".step", "step"))) == ["step_000001"]
    assert (tmp_path / "latest").read_text().strip() == "step_000001"
    monkeypatch.undo()
    assert ck.load_latest(tmp_path, names, "f").step == 1  # and it still resumes


@pytest.mark.parametrize("blocked", ["models", "metrics/train", "checkpoints"])
def test_an_unwritable_output_place_is_refused_before_any_step(micro_packed, tmp_path, blocked):
    """Read-only models/ or metrics/ used to let training run to the end, then fail with an
    OSError traceback. A file standing where the directory must be (root ignores permissions,
    a file in the way stops everyone) is now refused in one line before the first step."""
    (tmp_path / blocked).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / blocked).write_text("in the way")
    p = config.from_dict(micro_raw(**{"train.steps": 4, "train.checkpoint_every": 2, "train.eval_every": 100,
                                      "train.log_every": 100, "train.global_batch": 8, "train.micro_batch": 8}))
    with pytest.raises(DataError) as err:
        train("mdlm", p, data_dir=micro_packed, root=tmp_path, **QUIET)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / blocked) in message and "nothing was done" in message, message
    assert not (tmp_path / "checkpoints/mdlm").exists() or not list((tmp_path / "checkpoints/mdlm").glob("step_*"))
