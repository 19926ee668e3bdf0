"""Inference models are cast once to the sampling precision: where the samplers' autocast is
bf16, `runtime.cast_for_autocast` casts every Linear's weights to bf16 when the model is loaded,
so no network call casts a weight any more -- and the numbers are those of per-call autocast of
fp32 weights bit for bit (the default profile samples in bf16 on a CPU with native bf16: its
committed samples must not move). fp32 runs are untouched.

Weight casts are counted with a TorchDispatchMode: every aten cast (``_to_copy`` / ``to``)
whose input is one of the model's parameters. bf16 autocast on the CPU is forced on
(`cpu_has_bf16`) so that the tests mean the same on CPUs without native bf16."""

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tadm import config, runtime
from tadm.experiments import sampling
from tadm.models import build_model
from tests.conftest import micro_raw, torch_single_thread

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)

KINDS = ["mdlm", "adlm", "tadm", "sedd", "ar"]
CASTS = {torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout,
         torch.ops.aten.to.device, torch.ops.aten.to.other}
V, L = 61, 16


class WeightCasts(TorchDispatchMode):
    """Counts casts whose input tensor shares storage with a parameter of `model`."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.count = model, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in CASTS and isinstance(args[0], torch.Tensor):
            params = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
            if args[0].untyped_storage().data_ptr() in params:
                self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def bf16_cpu(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: True)
    assert runtime.effective_precision(runtime.CPU, "bf16") == "bf16"


def _model(kind: str, seed: int = 0) -> torch.nn.Module:
    cfg = dataclasses.replace(config.ModelConfig(), d_model=32, n_heads=2, mdlm_layers=2, anchor_layers=2,
                              denoiser_layers=1)
    torch.manual_seed(seed)
    m = build_model(kind, cfg, V, L)
    for p in m.parameters():  # non-degenerate weights (the zero-initialised gates make blocks identities)
        torch.nn.init.normal_(p, std=0.1)
    return m.eval()


def _call(model: torch.nn.Module, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One network call of each kind, the way its sampler makes it (body, then head on rows)."""
    kind = model.model_type
    if kind == "ar":
        cache = model.new_cache()
        return model(z), model.forward_cached(z[:, :5], cache), model.forward_cached(z[:, 5:6], cache)
    if kind == "tadm":
        h = model.anchor(z)
        hidden = model.denoise_hidden(z, h)
        return h, hidden, model.head(hidden[:, :3]), model.denoise_hidden(z, h, fusion=False)
    if kind == "adlm":
        a = model.anchor(z)
        hidden = model.denoise_hidden(a)
        return a, hidden, model.head(hidden[:, :3])
    hidden = model.hidden(z)
    return hidden, model.head(hidden[:, :3])


@pytest.mark.parametrize("kind", KINDS)
def test_cast_once_removes_every_per_call_weight_cast_and_keeps_the_bits(kind, bf16_cpu):
    per_call = _model(kind)
    once = runtime.cast_for_autocast(_model(kind), runtime.CPU, "bf16")
    linear = [m for m in once.modules() if isinstance(m, torch.nn.Linear)]
    assert linear and all(p.dtype == torch.bfloat16 for m in linear for p in m.parameters())
    # norms and embeddings stay fp32 (autocast runs them in fp32 / their input's dtype)
    others = [p for n, p in once.named_parameters() if "norm" in n or n.startswith("embed")]
    assert others and all(p.dtype == torch.float32 for p in others)
    z = torch.randint(0, V if kind == "ar" else V + 1, (2, L), generator=torch.Generator().manual_seed(1))
    counts = {}
    with torch.inference_mode():
        for name, model in (("per_call", per_call), ("once", once)):
            outs, counts[name] = [], []
            for _ in range(3):  # three network calls, each under its own autocast, as the samplers make them
                with WeightCasts(model) as casts, runtime.autocast(runtime.CPU, "bf16"):
                    outs.append(_call(model, z))
                counts[name].append(casts.count)
            if name == "per_call":
                reference = outs
    # before: every call re-cast every Linear weight and bias; after: none
    assert min(counts["per_call"]) >= len(linear) and counts["once"] == [0, 0, 0], counts
    for ref, got in zip(reference, outs):
        for a, b in zip(ref, got):
            assert a.dtype == b.dtype and torch.equal(a, b)  # bit for bit


def test_fp32_models_are_left_alone(bf16_cpu):
    model = _model("tadm")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert runtime.cast_for_autocast(model, runtime.CPU, "fp32") is model
    cpu_without_bf16 = runtime.effective_precision(runtime.CPU, "bf16", cpu_bf16=False)
    assert cpu_without_bf16 == "fp32"
    runtime.cast_for_autocast(model, runtime.CPU, "bf16", cpu_bf16=False)
    for k, v in model.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, before[k]), k


def _save(kind: str, root) -> str:
    path = root / kind
    _model(kind).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("kind", ["mdlm", "tadm", "ar"])
def test_draw_samples_casts_once_and_draws_the_same_tokens(kind, bf16_cpu, tmp_path, monkeypatch):
    """The sample stage's draw: the one cast at load is the only weight cast, whatever the number
    of network calls (T = 4 or 8), and the tokens and record are those of per-call autocast."""
    p = config.from_dict(micro_raw(**{"sample.canvas_length": L, "sample.block_size": L, "sample.num_samples": 4,
                                      "sample.batch_size": 2, "runtime.device": "cpu", "runtime.precision": "bf16"}))
    d = runtime.setup(p.runtime)
    assert sampling.network_autocast(d) == "bf16"
    run = sampling.SampleRun(kind, _save(kind, tmp_path), K=2 if kind == "tadm" else None)
    real_load = sampling.load_pretrained
    loaded = []

    def load(directory, map_location=runtime.CPU):
        loaded.append(real_load(directory, map_location=map_location))
        return loaded[-1]

    monkeypatch.setattr(sampling, "load_pretrained", load)

    def draw(T: int):
        with WeightCasts(_Latest(loaded)) as casts:
            tokens, record = sampling.draw_samples(run, p, T, bos_id=0, dist=d)
        return tokens, record, casts.count

    n_linear = sum(len(list(m.parameters())) for m in _model(kind).modules() if isinstance(m, torch.nn.Linear))
    results = {T: draw(T) for T in (4, 8)}
    for T, (_, _, count) in results.items():
        assert count == n_linear, (T, count)  # the cast at load, once per Linear weight and bias
    assert all(prm.dtype == torch.bfloat16 for m in loaded[-1].modules() if isinstance(m, torch.nn.Linear)
               for prm in m.parameters())
    # per-call autocast of fp32 weights (the code before): casts grow with T, the same tokens
    monkeypatch.setattr(runtime, "cast_for_autocast", lambda model, *a, **k: model)
    for T, (tokens, record, _) in results.items():
        ref_tokens, ref_record, ref_count = draw(T)
        assert ref_count > n_linear
        assert np.array_equal(tokens, ref_tokens), T
        drop = ("seconds", "tokens_per_s", "batch_seconds", "tokens_per_s_se")
        assert {k: v for k, v in record.items() if k not in drop} == {k: v for k, v in ref_record.items() if k not in drop}


class _Latest(torch.nn.Module):
    """The parameters of the model loaded last (the draw loads its own): a stand-in `model` for
    WeightCasts that sees the model draw_samples loads inside the counted block."""

    def __init__(self, loaded: list):
        super().__init__()
        self._loaded = loaded

    def parameters(self, recurse: bool = True):
        return iter(list(self._loaded[-1].parameters())) if self._loaded else iter(())
