"""The registries: a unit defined in a test file registers itself, the name lists and the params
check derive from the registry, and a name registered twice is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tadm.config import ConfigError, from_dict, override, render_profile
from tadm.registry import DG_CACHES, LLADA_CACHES, SAMPLERS, Registry
from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample
from tadm.sampling.mdlm import MDLMSampler
from tests.sampling.conftest import V, random_model


def load():
    """The default profile's params (the checkout's params.yaml may be switched to another)."""
    return from_dict(render_profile("default"))


@pytest.fixture
def eager():
    """A sampler added the way docs/extending.md shows: one subclass, no name list edited."""

    class EagerMDLMSampler(MDLMSampler):
        names = ("mdlm-eager-test",)

        def transition(self, z_t, t, s, active):  # MDLM's step, unmasking at twice its rate
            step = super().transition(z_t, t, s, active)
            return dataclasses.replace(step, unmask=(2 * step.unmask).clamp(max=1.0))

    yield EagerMDLMSampler
    SAMPLERS.unregister("mdlm-eager-test")


def test_a_new_sampler_is_one_subclass(eager):
    assert SAMPLERS["mdlm-eager-test"] is eager and "mdlm-eager-test" in SAMPLERS.names()
    assert override(load(), {"sample.sampler": "mdlm-eager-test"}).sample.sampler == "mdlm-eager-test"
    model = random_model("tadm", seq_len=16)

    def draw(sampler, seed=0):
        settings = SamplerSettings(sampler=sampler, steps=8, seed=seed)
        return sample(make_adapter(model, FixedInterval(2)), settings, num_samples=2, seq_len=16).tokens

    eager_tokens = draw("mdlm-eager-test")
    assert eager_tokens.shape == (2, 16) and (eager_tokens != V).all()
    assert torch.equal(eager_tokens, draw("mdlm-eager-test"))  # seeded
    assert not torch.equal(eager_tokens, draw("mdlm"))  # its own transition ran


def test_params_refuse_an_unregistered_name():
    with pytest.raises(ConfigError) as e:
        override(load(), {"sample.sampler": "nope"})
    assert str(e.value).endswith(f"sample.sampler: no sampler 'nope' is registered (known: {', '.join(SAMPLERS.names())})")


def test_sampler_names_derive_from_the_registry():
    from tadm.sampling import SAMPLER_NAMES
    assert SAMPLER_NAMES == SAMPLERS.names()[:len(SAMPLER_NAMES)]  # the home package's, in registration order


def test_a_name_registered_twice_is_refused():
    r = Registry("widget", home="tadm.registry")

    class A: ...

    class B: ...

    r.register("w", A)
    with pytest.raises(ValueError, match="widget 'w' is registered twice"):
        r.register("w", B)


@pytest.mark.parametrize("key, registry", [("posttrain.cache_methods", DG_CACHES), ("asrd.llada_cache_methods", LLADA_CACHES)])
def test_params_refuse_an_unregistered_cache(key, registry):
    with pytest.raises(ConfigError) as e:
        override(load(), {key: ["nope"]})
    known = f"{registry.concept} 'nope' is registered (known: {', '.join(registry.names())})"
    assert str(e.value).endswith(f"{key}[0]: no {known}") and "\n" not in str(e.value)
