"""The trainer's runtime side: the multi-tensor EMA equals the per-tensor one bit for bit, the
EMA and AdamW state land on the model's device, torch.compile leaves state_dict names alone,
and `runtime.nproc: 2` in params makes `tadm train` run two processes that end where one does."""

import functools
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tadm import config, runtime
from tadm.train.trainer import EMA, adamw, train
from tests.conftest import micro_raw, torch_single_thread, write_params

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)


def test_the_multi_tensor_ema_is_bit_identical_to_the_per_tensor_loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    model[2].to(torch.bfloat16)  # a low-precision parameter: its shadow stays fp32
    ema = EMA(model, 0.999)
    reference = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    for _ in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update(model)
        for n, p in model.named_parameters():  # the update as it was written before (one tensor at a time)
            reference[n].mul_(0.999).add_(p.detach().float(), alpha=1 - 0.999)
    for n in reference:
        assert ema.shadow[n].dtype == torch.float32 and torch.equal(ema.shadow[n], reference[n]), n


def test_ema_load_keeps_the_shadow_where_the_model_is():
    model = torch.nn.Linear(3, 2)
    ema = EMA(model, 0.9)
    shadow = ema.shadow["weight"]
    saved = {"weight": torch.full((2, 3), 2.0, dtype=torch.bfloat16), "bias": torch.ones(2)}
    ema.load(saved)
    assert ema.shadow["weight"] is shadow and shadow.dtype == torch.float32 and torch.equal(shadow, saved["weight"].float())
    assert shadow.device == next(model.parameters()).device


def test_adamw_is_fused_only_on_a_gpu():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert not adamw(params, runtime.CPU, lr=1e-3).param_groups[0]["fused"]
    if torch.cuda.is_available():
        gpu = runtime.resolve_device("auto")
        assert adamw([torch.nn.Parameter(torch.zeros(2, device=gpu))], gpu, lr=1e-3).param_groups[0]["fused"]


def test_compile_trains_the_same_weights_under_the_same_names(micro_packed, tmp_path, monkeypatch):
    """runtime.compile wraps the training forward in torch.compile (here its eager backend: no
    C++ toolchain needed); checkpoints and the saved model keep the module's own names."""
    calls = []
    real = torch.compile

    def eager_compile(module, **kw):
        calls.append(type(module).__name__)
        return real(module, backend="eager")

    monkeypatch.setattr(torch, "compile", eager_compile)
    raw = micro_raw(**{"train.steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2})
    plain = train("mdlm", config.from_dict(raw), data_dir=micro_packed, root=tmp_path / "plain", log=lambda *_: None)
    raw["runtime"]["compile"] = True
    compiled = train("mdlm", config.from_dict(raw), data_dir=micro_packed, root=tmp_path / "compiled", log=lambda *_: None)
    assert calls and plain["val_nelbo"] == pytest.approx(compiled["val_nelbo"], rel=1e-6)
    for f in ("models/mdlm/model.safetensors", "checkpoints/mdlm/step_000002/model.safetensors",
              "checkpoints/mdlm/step_000002/optimizer.safetensors"):
        a, b = load_file(str(tmp_path / "plain" / f)), load_file(str(tmp_path / "compiled" / f))
        assert a.keys() == b.keys(), f
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_nproc_2_in_params_runs_two_processes_through_the_cli(micro_packed, tmp_path):
    raw = micro_raw(**{"train.steps": 4, "train.global_batch": 4, "train.micro_batch": 2, "train.eval_every": 4,
                       "train.checkpoint_every": 4})
    train("tadm", config.from_dict(raw), data_dir=micro_packed, root=tmp_path / "one", log=lambda *_: None)
    raw["runtime"]["nproc"] = 2
    params = write_params(tmp_path / "params.yaml", raw)
    (tmp_path / "two").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(config.ROOT)
    proc = subprocess.run([sys.executable, "-m", "tadm", "--params", str(params), "train", "tadm", "--data",
                           str(micro_packed)], cwd=tmp_path / "two", env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[tadm] 2 processes" in proc.stdout, proc.stdout
    a = load_file(str(tmp_path / "one/models/tadm/model.safetensors"))
    b = load_file(str(tmp_path / "two/models/tadm/model.safetensors"))
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6), k
