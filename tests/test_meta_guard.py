"""GPU readiness checked on the CPU: with torch's default device set to "meta", any tensor the
code creates without naming a device lands on meta and the CPU computation fails. Every path
that runs on a GPU (a training step, a resume, a sampling trajectory of MDLM and TADM, a scoring
batch, a post-train step) runs here on CPU tensors with that default in effect, so a forgotten
`device=` cannot hide until the first GPU run."""

import dataclasses

import numpy as np
import pytest
import torch

from tadm import config

CPU = torch.device("cpu")


@pytest.fixture
def meta_default():
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def _params(**changes) -> config.Params:
    p = config.from_dict(config.render_profile("micro"))
    return config.override(p, {"runtime.device": "cpu", **changes})


def _packed(root, vocab: int, seq_len: int):
    from tadm.data.packing import write_random

    return write_random(root / "packed", vocab, seq_len, {"train": 32, "validation": 4})


@pytest.mark.parametrize("run", ["mdlm", "tadm"])
def test_training_step_and_resume(tmp_path, meta_default, run):
    from tadm.train.trainer import train

    p = _params(**{"train.steps": 1, "train.schedule": "constant", "train.global_batch": 4, "train.micro_batch": 2, "train.eval_sequences": 2,
                   "train.checkpoint_every": 1, "train.log_every": 1, "train.eval_every": 1})
    data = _packed(tmp_path, p.tokenizer.vocab_size, p.packing.seq_len)
    first = train(run, p, data_dir=data, root=tmp_path, log=lambda *_: None)
    resumed = train(run, config.override(p, {"train.steps": 2}), data_dir=data, root=tmp_path, log=lambda *_: None)
    assert (first["steps"], resumed["steps"]) == (1, 2)
    assert np.isfinite(resumed["val_nelbo"])


@pytest.mark.parametrize("kind", ["mdlm", "tadm"])
def test_sampling_trajectory(meta_default, kind):
    from tadm.models import build_model
    from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample

    p = _params()
    with torch.device(CPU):
        model = build_model(kind, p.model, 50, 16).eval()
    adapter = make_adapter(model, FixedInterval(2)) if kind == "tadm" else make_adapter(model)
    with adapter, torch.no_grad():
        result = sample(adapter, SamplerSettings(sampler="remdm-loop", steps=6, ddpm_cache=False, nucleus_p=0.9),
                        num_samples=2, seq_len=16, generator=torch.Generator(CPU).manual_seed(0))
    assert result.tokens.device == CPU and result.tokens.shape == (2, 16)
    assert int(result.tokens.max()) < 50


def test_scoring_batch(meta_default):
    from transformers import GPT2Config, GPT2LMHeadModel

    from tadm.metrics.evaluator import Evaluator
    from tadm.metrics.gen_ppl import gen_ppl_ids

    with torch.device(CPU):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_layer=1, n_embd=16, n_head=2)).eval()
    ev = Evaluator(model=model, tokenizer=None, eos_id=63, context_length=32, name="tiny", source="random")
    rng = np.random.default_rng(0)
    out = gen_ppl_ids([list(map(int, rng.integers(0, 63, n))) for n in (20, 40, 7)], ev, batch_size=2)
    assert np.isfinite(out.ppl) and (out.tokens > 0).all()


def test_posttrain_step(meta_default, monkeypatch):
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.cache_utils import DynamicSlidingWindowLayer

    from tadm.posttrain.data import CanvasBatch
    from tadm.posttrain.model import build_tadm, small_config
    from tadm.posttrain.objective import Rollout, posttrain_loss

    # transformers' sliding-window cache layer makes a scalar on the default device at init and
    # moves it on first use (harmless on a GPU, not our code): build it on the keys' device instead
    init = DynamicSlidingWindowLayer.lazy_initialization

    def lazy_initialization(self, key_states, value_states):
        self._sliding_window_tensor = torch.as_tensor(self.sliding_window, device=key_states.device)
        return init(self, key_states, value_states)

    monkeypatch.setattr(DynamicSlidingWindowLayer, "lazy_initialization", lazy_initialization)
    p = _params()
    pt, vocab = p.posttrain, 64
    with torch.device(CPU):
        torch.manual_seed(0)
        base = DiffusionGemmaForBlockDiffusion(small_config(p, vocab, eos_id=1, pad_id=0)).eval().requires_grad_(False)
    tadm = build_tadm(base, p)
    gen = torch.Generator(CPU).manual_seed(0)
    B, P, C = 2, 6, pt.canvas_length
    batch = CanvasBatch(torch.randint(2, vocab, (B, P), generator=gen, device=CPU),
                        torch.ones(B, P, dtype=torch.bool, device=CPU),
                        torch.randint(2, vocab, (B, C), generator=gen, device=CPU), torch.full((B,), 0.5, device=CPU))
    rollout = Rollout(pt.sample_steps, pt.entropy_bound, tuple(pt.temperature), C, vocab)
    cfg = dataclasses.replace(pt, cache_age_probs=[0.0, 0.0, 1.0], self_cond_p=1.0)  # every pass of the rollout
    loss, _ = posttrain_loss(tadm.split, tadm.fusion, batch, gen, cfg, rollout)
    loss.backward()
    assert torch.isfinite(loss) and any(q.grad is not None for q in tadm.fusion.parameters())
