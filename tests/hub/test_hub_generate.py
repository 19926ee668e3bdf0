"""The hub models' `generate` (`tadm.hub.remote.generation_tadm`) draws, token for token, what
the project's samplers draw (`tadm.sampling.sample`, `tadm.sampling.ar.sample_ar`) from the same
seed: every released sampler, TADM at several K, semi-AR blocks, a vocabulary large enough for
the CPU's nucleus shortcut (`tadm.sampling.nucleus.draw_on_host`); prompts are kept, and bad
keywords are one line."""

from __future__ import annotations

import pytest
import torch

from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample
from tadm.sampling.ar import sample_ar
from tests.hub.test_hub_export import remote_pair
from tests.hub.workspace import L, V

CASES = {  # id: (family, sampler, K, top_p, steps, block_size)
    "mdlm": ("mdlm", "mdlm", None, 0.9, 16, None),
    "remdm-loop": ("mdlm", "remdm-loop", None, 0.9, 32, None),
    "remdm-cap-blocks": ("mdlm", "remdm-cap", None, 0.5, 24, 8),
    "sedd-analytic": ("sedd", "sedd-analytic", None, 1.0, 16, None),
    "adlm": ("adlm", "remdm-loop", None, 0.9, 32, 8),
    "tadm-K1": ("tadm", "remdm-loop", 1, 0.9, 32, None),
    "tadm-K4": ("tadm", "remdm-loop", 4, 0.9, 32, None),
    "tadm-K3-mdlm": ("tadm", "mdlm", 3, 0.9, 12, None),
}


def reference(net, sampler, K, top_p, steps, block, seed, n, seq_len=L, ddpm_cache=True):
    with make_adapter(net, FixedInterval(K) if K else None) as adapter:
        return sample(adapter, SamplerSettings(sampler=sampler, steps=steps, nucleus_p=top_p, seed=seed,
                                               block_size=block, ddpm_cache=ddpm_cache),
                      num_samples=n, seq_len=seq_len).tokens


@pytest.mark.parametrize("case", CASES)
def test_generate_equals_tadm_sampling(case):
    family, sampler, K, top_p, steps, block = CASES[case]
    net, model = remote_pair(family)
    ours = model.generate(num_samples=5, sampler=sampler, steps=steps, top_p=top_p, seed=3, refresh_every=K or 1,
                          block_size=block)
    assert ours.shape == (5, L) and ours.dtype == torch.long and len(ours.unique()) > 10  # not a degenerate model
    for ddpm_cache in (True, False):  # the reference's exact skip changes no token
        assert torch.equal(ours, reference(net, sampler, K, top_p, steps, block, 3, 5, ddpm_cache=ddpm_cache))
    assert not torch.equal(ours, model.generate(num_samples=5, sampler=sampler, steps=steps, top_p=top_p, seed=4,
                                                refresh_every=K or 1, block_size=block))


def test_generate_equals_tadm_sampling_with_batches_and_a_generator():
    net, model = remote_pair("tadm")
    ours = model.generate(num_samples=6, batch_size=4, steps=16, refresh_every=2, top_p=0.9,
                          generator=torch.Generator().manual_seed(9))
    with make_adapter(net, FixedInterval(2)) as adapter:
        ref = sample(adapter, SamplerSettings(sampler="remdm-loop", steps=16, nucleus_p=0.9, batch_size=4),
                     num_samples=6, seq_len=L, generator=torch.Generator().manual_seed(9)).tokens
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("family", ("mdlm", "tadm"))
def test_generate_equals_tadm_sampling_on_the_cpus_nucleus_shortcut(family):
    """V >= 1024: the reference draws from each row's top-k on a CPU (`draw_on_host`); the port
    sorts every row (`draw_by_sort`) -- the same tokens."""
    vocab = 1100
    net, model = remote_pair(family, vocab=vocab)
    ours = model.generate(num_samples=4, sampler="remdm-loop", steps=16, top_p=0.9, seed=1, refresh_every=4)
    assert torch.equal(ours, reference(net, "remdm-loop", 4 if family == "tadm" else None, 0.9, 16, None, 1, 4))


@pytest.mark.parametrize("top_p", (0.9, 1.0))
def test_generate_ar_equals_sample_ar(top_p):
    net, model = remote_pair("ar")
    ours = model.generate(num_samples=5, top_p=top_p, seed=3)
    for kv_cache in (True, False):
        assert torch.equal(ours, sample_ar(net, 5, L, bos_id=0, nucleus_p=top_p, seed=3, kv_cache=kv_cache).tokens)


@pytest.mark.parametrize("family", ("mdlm", "tadm", "ar"))
def test_generate_keeps_a_prompt(family):
    _, model = remote_pair(family)
    prompt = torch.tensor([[0, 5, 6, 7], [0, 1, 2, 3]])
    out = model.generate(prompt, steps=16, seed=0)
    assert out.shape == (2, L) and torch.equal(out[:, :4], prompt)
    if family != "ar":
        assert int((out == V).sum()) == 0


def test_generate_refuses_in_one_line():
    _, model = remote_pair("tadm")
    for kwargs, match in (({"temperature": 0.7}, "temperature must be 1"),
                          ({"num_beams": 4}, "unknown argument.*num_beams"),
                          ({"sampler": "ar"}, "sampler 'ar' does not sample a 'tadm' model"),
                          ({"steps": 0}, "steps must be an integer >= 1"),
                          ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
                          ({"block_size": 5}, "multiple of block_size"),
                          ({"precision": "float16"}, "precision must be one of")):
        with pytest.raises((TypeError, ValueError), match=match) as e:
            model.generate(num_samples=1, **kwargs)
        assert "\n" not in str(e.value)
