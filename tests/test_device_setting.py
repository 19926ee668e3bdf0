"""The device is one setting (params `runtime`, tadm.runtime): no module names a device type by
itself, and the code paths that run on a GPU create no tensor without an explicit device."""

import ast
from pathlib import Path

import pytest
import torch

from tadm import config, runtime
from tadm.errors import ConfigError

PACKAGE = Path(__file__).resolve().parent.parent / "tadm"


def _device_literals(path: Path) -> list[int]:
    """Lines of `path` that hold a "cpu" / "cuda" string constant (docstrings and comments aside)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings and n.value.split(":")[0] in ("cpu", "cuda")]


def test_no_module_hard_codes_a_device():
    # the device modules: the runtime and its CUDA-graph replay (CUDA only)
    device_modules = (PACKAGE / "runtime.py", PACKAGE / "cuda_graphs.py")
    offenders = {str(f.relative_to(PACKAGE.parent)): lines for f in sorted(PACKAGE.rglob("*.py"))
                 if f not in device_modules and (lines := _device_literals(f))}
    assert not offenders, (f"device strings outside tadm/runtime.py and tadm/cuda_graphs.py (use runtime.setup / "
                           f"tensor.device): {offenders}")


def test_auto_resolves_to_the_cpu_here_and_cuda_is_refused_without_one():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    assert runtime.resolve_device("auto") == runtime.CPU
    with pytest.raises(ConfigError, match="runtime.device"):
        runtime.resolve_device("cuda")
    with pytest.raises(ConfigError, match="runtime.device"):
        config.override(config.from_dict(config.render_profile("default")), {"runtime.device": "gpu0"})


def test_every_profile_has_the_runtime_section():
    for name in config.available_profiles():
        p = config.from_dict(config.render_profile(name))
        assert p.runtime.device == "auto"
    assert config.from_dict(config.render_profile("paper")).runtime.nproc > 1


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_the_cpu_follows_native_support(monkeypatch, native):
    """runtime.precision bf16 autocasts on a CPU that multiplies bf16 natively and leaves every
    other CPU in fp32; fp32 is fp32 everywhere, and CUDA always honours bf16."""
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: native)
    layer = torch.nn.Linear(8, 8)
    with runtime.autocast(runtime.CPU, "bf16"):
        out = layer(torch.randn(2, 8))
    assert runtime.effective_precision(runtime.CPU, "bf16") == ("bf16" if native else "fp32")
    assert out.dtype == (torch.bfloat16 if native else torch.float32)
    assert layer.weight.dtype == torch.float32  # autocast never casts the weights themselves
    with runtime.autocast(runtime.CPU, "fp32"):
        assert layer(torch.randn(2, 8)).dtype == torch.float32
    assert runtime.effective_precision(runtime.CPU, "fp32") == "fp32"
    assert runtime.effective_precision(torch.device("cuda", 0), "bf16") == "bf16"
    assert runtime.effective_precision(torch.device("meta"), "bf16") == "fp32"
    # computations that refuse bf16 on a CPU (the scorers) stay fp32 there, and not on CUDA
    assert runtime.effective_precision(runtime.CPU, "bf16", cpu_bf16=False) == "fp32"
    assert runtime.effective_precision(torch.device("cuda", 0), "bf16", cpu_bf16=False) == "bf16"
    with runtime.autocast(runtime.CPU, "bf16", cpu_bf16=False):
        assert layer(torch.randn(2, 8)).dtype == torch.float32


def test_scorers_run_fp32_on_every_cpu(monkeypatch):
    """Table 2's Scorer runs no autocast on a CPU, even one with native bf16 that the samplers
    use (bf16 features moved MAUVE(data, data) under its 0.9 sanity line); bf16 on a GPU."""
    from types import SimpleNamespace

    from tadm.experiments.table2 import Scorer

    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: True)
    scorer = SimpleNamespace(dist=runtime.Dist(0, 1, runtime.CPU, "bf16"))
    with Scorer.autocast(scorer):
        assert torch.nn.Linear(8, 8)(torch.randn(2, 8)).dtype == torch.float32
    assert Scorer.precision.fget(scorer) == "fp32"
    gpu = SimpleNamespace(dist=runtime.Dist(0, 1, torch.device("cuda", 0), "bf16"))
    assert Scorer.precision.fget(gpu) == "bf16"


def test_shard_and_gather_put_items_back_in_order():
    n = 11
    parts = [runtime.shard(n, runtime.Dist(rank=r, world=3)) for r in range(3)]
    assert sorted(i for p in parts for i in p) == list(range(n))
    # what gather does across processes, done by hand: rank r's j-th item is item r + 3 j
    out = [None] * n
    for r, part in enumerate(parts):
        for j, item in enumerate(part):
            out[r + j * 3] = item
    assert out == list(range(n))
