"""Guards of a training run. A diverged run stops: a non-finite loss or
gradient norm ends training in one line naming the step and the value, with a non-zero exit,
keeping the last good checkpoint; a checkpoint is never written with, nor resumed from,
non-finite weights. A model that cannot fit is refused before anything is allocated."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tadm import config
from tadm.train import checkpoint as ck
from tadm import methods
from tadm.train.divergence import Diverged, FiniteWatch, first_non_finite
from tadm.train.trainer import train
from tests.conftest import micro_raw, torch_single_thread, write_params
from tests.train.test_checkpoint import _state

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)
QUIET = {"log": lambda *_: None}


def test_the_watch_keeps_the_first_non_finite_step_and_names_it():
    watch = FiniteWatch("run", torch.device("cpu"))
    watch.observe(1, torch.tensor(2.0, dtype=torch.float64), torch.tensor(0.5))
    watch.check(1, "no checkpoint had been written yet")  # all finite: nothing raised
    watch.observe(2, torch.tensor(3.0, dtype=torch.float64), torch.tensor(float("inf")))
    watch.observe(3, torch.tensor(float("nan"), dtype=torch.float64), torch.tensor(1.0))
    with pytest.raises(Diverged, match=r"^train\[run\]: the gradient norm is inf at step 2 \(the run diverged\); "
                                       r"stopped, the last good checkpoint is kept \(x\)"):
        watch.check(1, "the last good checkpoint is kept (x)")
    nan_loss = FiniteWatch("run", torch.device("cpu"))
    nan_loss.observe(4, torch.tensor(float("nan"), dtype=torch.float64), torch.tensor(float("nan")))
    with pytest.raises(Diverged, match="the loss is nan at step 4"):
        nan_loss.check(1, "")


def test_a_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(micro_packed, tmp_path, monkeypatch):
    """The loss turns NaN at step 5 (checkpoints every 2): the run stops at the next sync (step 6,
    a checkpoint step) without saving it; step 4 is kept and still resumes."""
    real = methods.MDLMMethod.loss
    calls = {"n": 0}

    def loss(self, net, x, gen, progress=0.0):
        calls["n"] += 1
        out = real(self, net, x, gen, progress=progress)
        return out * float("nan") if calls["n"] >= 5 else out

    monkeypatch.setattr(methods.MDLMMethod, "loss", loss)
    p = config.from_dict(micro_raw(**{"train.steps": 8, "train.checkpoint_every": 2, "train.eval_every": 100,
                                      "train.log_every": 100, "train.global_batch": 8, "train.micro_batch": 8}))
    with pytest.raises(Diverged) as err:
        train("mdlm", p, data_dir=micro_packed, root=tmp_path, **QUIET)
    message = str(err.value)
    assert "\n" not in message and "the loss is nan at step 5" in message, message
    run_dir = tmp_path / "checkpoints/mdlm"
    assert f"kept ({run_dir / 'step_000004'})" in message, message
    assert sorted(p.name for p in run_dir.glob("step_*")) == ["step_000002", "step_000004"]
    state = ck.load(run_dir / "step_000004", list(load_file(str(run_dir / "step_000004/model.safetensors"))))
    assert first_non_finite(state.model) is None and first_non_finite(state.ema) is None
    assert not (tmp_path / "models/mdlm").exists()  # nothing released


def test_a_huge_learning_rate_exits_non_zero_in_one_line(micro_packed, tmp_path):
    """`train.lr: 10000` used to train to the end, exit 0, write val_nelbo NaN and save the model."""
    raw = micro_raw(**{"train.lr": 10000.0, "train.steps": 12, "train.warmup_steps": 1, "train.log_every": 2,
                       "train.checkpoint_every": 4, "train.eval_every": 100})
    params = write_params(tmp_path / "params.yaml", raw)
    env = {**os.environ, "PYTHONPATH": str(config.ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "tadm", "--params", str(params), "train", "mdlm",
                           "--data", str(micro_packed)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "diverged" in last and "at step" in last and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "models/mdlm").exists() and not (tmp_path / "metrics/train/mdlm.json").exists()
    for kept in (tmp_path / "checkpoints/mdlm").glob("step_*"):  # whatever was kept is finite
        assert first_non_finite(load_file(str(kept / "model.safetensors"))) is None, kept


def test_a_checkpoint_with_non_finite_weights_is_neither_written_nor_resumed(tmp_path, monkeypatch):
    state, names = _state(1)
    state.model["0.weight"][0, 0] = float("nan")
    with pytest.raises(Diverged, match=r"refusing to save step 1: the weights hold NaN or inf \(tensor 0.weight\); "
                                       "no checkpoint had been written yet"):
        ck.save(tmp_path, state, names)
    assert not list(tmp_path.glob("step_*")) and not list(tmp_path.glob(".step_*"))
    # one written anyway (by older code, or planted) is refused at resume, in one line, and kept
    monkeypatch.setattr(ck, "first_non_finite", lambda tensors: None)
    ck.save(tmp_path, state, names)
    monkeypatch.undo()
    logged = []
    with pytest.raises(ck.CheckpointCorrupt, match="no checkpoint verifies"):
        ck.load_latest(tmp_path, names, "f", log=logged.append)
    assert len(logged) == 1 and "model.safetensors tensor 0.weight holds NaN or inf" in logged[0], logged
    assert (tmp_path / "step_000001").is_dir()


def test_the_post_training_loop_stops_on_a_nan_loss_too(tmp_path):
    from tadm import runtime
    from tadm.posttrain.train import _loop

    torch.manual_seed(0)
    module = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    calls = {"n": 0}

    def loss_fn(net, examples, gen):
        calls["n"] += 1
        x = torch.randn(len(examples), 4, generator=gen)
        loss = net(x).pow(2).mean()
        return (loss * float("nan") if calls["n"] == 3 else loss), {}

    d = runtime.setup(config.from_dict(micro_raw()).runtime)
    with pytest.raises(Diverged, match=r"train\[toy\]: the loss is nan at step 3 .*kept \(.*step_000002\)"):
        _loop("toy", module, loss_fn, steps=6, batch=2, micro=1, n_data=8, lr_at=lambda s: 1e-2, opt=opt, clip=1.0,
              run_dir=tmp_path, settings={"toy": 1}, seed=0, log_every=10, checkpoint_every=2, d=d, **QUIET)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000002"]


# --- the memory estimate at every entry point that builds a model ---------------------------


def test_train_refuses_a_model_that_cannot_fit_before_allocating(micro_packed, tmp_path):
    """`model.d_model: 1048576` used to end in a raw allocator traceback."""
    p = config.from_dict(micro_raw(**{"model.d_model": 1048576, "model.n_heads": 1}))
    with pytest.raises(config.ConfigError) as err:
        train("mdlm", p, data_dir=micro_packed, root=tmp_path, **QUIET)
    message = str(err.value)
    assert "\n" not in message and message.startswith("params: model: train mdlm needs about"), message
    assert "GiB of RAM" in message and "shrink the model" in message, message
    assert not (tmp_path / "checkpoints").exists()  # refused before the run directory is touched


def test_the_post_training_base_and_the_judge_refuse_too(micro_packed, tmp_path, monkeypatch):
    from tadm import memory_estimate as me
    from tadm import runtime
    from tadm.metrics import trained_evaluator as te
    from tadm.posttrain import train as pt_train

    monkeypatch.setattr(me, "machine_memory", lambda p: (1 << 10, "RAM", False))  # a 1 KiB machine
    monkeypatch.chdir(tmp_path)  # the judge's checkpoints are relative to the working directory
    p = config.from_dict(micro_raw())
    with pytest.raises(config.ConfigError, match=r"posttrain.base: train posttrain base \(dg_base\) needs about"):
        pt_train.train_base(p, tokenizer=None, sft_dir=tmp_path, root=tmp_path, **QUIET)
    d = runtime.setup(p.runtime)
    with pytest.raises(config.ConfigError, match=r"eval.trained: train evaluator needs about .* of RAM"):
        te._train(p, micro_packed, micro_packed.parent / "tokenizer", False, lambda *_: None, d)


# --- what a save killed mid-write leaves behind ---------------------------------------------


def test_resume_clears_the_temporaries_of_a_killed_save(tmp_path):
    from tadm import runtime
    from tadm.train.trainer import resume_state

    state, names = _state(2)
    ck.save(tmp_path, state, names)
    partial = tmp_path / ".step_000004.k3j2x.tmp" / "step_000004"  # killed while writing step 4
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"\0" * 100)
    (tmp_path / ".latest.abc.tmp").mkdir()
    (tmp_path / ".latest.abc.tmp" / "latest").write_text("step_000004\n")
    aside = tmp_path / ".step_000003.old"  # a swap killed after setting the old copy aside
    aside.mkdir()
    logged = []
    got = resume_state(tmp_path, names, "f", steps=10, steps_key="steps", restart=False, hint="x", d=runtime.Dist(),
                       log=logged.append)
    assert got is not None and got.step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000002", "step_000003"], list(tmp_path.iterdir())
    assert logged and "cleared what an interrupted save left: .latest.abc.tmp, .step_000003.old, .step_000004.k3j2x.tmp" in logged[0]


# --- the heads' logits: kept where they fit, checkpointed where only that fits ---------------


def test_the_heads_are_checkpointed_only_where_their_logits_do_not_fit(monkeypatch):
    from tadm import losses
    from tadm import memory_estimate as me
    assert me.HEAD_CHUNK_ELEMENTS == losses.CHUNK_ELEMENTS
    p = config.from_dict(micro_raw())
    tokens, v1 = p.train.micro_batch * p.packing.seq_len, p.tokenizer.vocab_size + 1
    monkeypatch.setattr(me, "HEAD_CHUNK_ELEMENTS", 7 * v1)  # a 7-row chunk: less than the micro-batch's rows
    kept = me.training_estimate("tadm", p).total
    checkpointed = me.training_estimate("tadm", p, keep_logits=False)
    assert "heads checkpointed" in checkpointed.note
    # the closed form: k V' values per token for each of the two heads, against one chunk's
    assert kept - checkpointed.total == 4 * me.LOGIT_COPIES * 2 * (tokens - 7) * v1
    for available, expected in ((kept, False), (kept - 1, True), (checkpointed.total, True)):
        monkeypatch.setattr(me, "machine_memory", lambda p, a=available: (a, "RAM", False))
        assert me.require_training("tadm", p) is expected
    monkeypatch.setattr(me, "machine_memory", lambda p: (checkpointed.total - 1, "RAM", False))
    with pytest.raises(config.ConfigError, match=r"^params: model: train tadm needs about .*heads checkpointed"):
        me.require_training("tadm", p)


def test_the_largest_micro_batch_is_the_largest_divisor_that_fits(monkeypatch):
    from tadm import memory_estimate as me
    p = config.from_dict(micro_raw())
    g, nproc = p.train.global_batch, p.runtime.nproc
    need = {m: me.training_estimate("tadm", _with_micro(p, m)).total for m in range(1, g + 1) if g % m == 0}
    assert me.largest_micro_batch("tadm", p, max(need.values()), False) == g // nproc
    some = sorted(need)[len(need) // 2]
    assert me.largest_micro_batch("tadm", p, need[some], False) == some  # the estimate grows with the batch
    assert me.largest_micro_batch("tadm", p, min(need.values()) - 1, False) == 0


def _with_micro(p, m):
    import dataclasses
    return dataclasses.replace(p, train=dataclasses.replace(p.train, micro_batch=m))
