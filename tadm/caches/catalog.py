"""The training-free cache methods by name, one registry per base: `tadm.registry.DG_CACHES`
(DiffusionGemma: the values of posttrain.cache_methods, Table 1's cache rows) and
`tadm.registry.LLADA_CACHES` (LLaDA: the values of asrd.llada_cache_methods, the LLaDA group's
cache rows of the ASRD table).

An entry's builder is a function of this module that imports its cache's module when it first
builds (a function-level import), so that checking a params file imports neither torch nor
transformers; a unit defined elsewhere (a test, an extension) gives its own function. Registering is the whole of adding a method: the
params check, Table 1's rows and families, the frontier's legend and the LLaDA group's rows all
read the registries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tadm.caches import budget
from tadm.errors import ConfigError
from tadm.registry import DG_CACHES, LLADA_CACHES


# ----------------------------------------------------------------------------- DiffusionGemma


def tadm_calls(steps: int, k: int, split: tuple[int, int, int], model: Any, rows: int) -> float:
    """TADM's layer calls per canvas, (s + d) T + a ceil(T / K): a method whose every step runs S
    and D and whose anchor layers run at refreshes only (the naive reuse)."""
    return budget.tadm_layer_calls(steps, k, split)


def feature_calls(steps: int, k: int, split: tuple[int, int, int], model: Any, rows: int) -> float:
    """The feature cache's weighted layer calls per canvas of `rows` positions at the model's share."""
    return budget.feature_layer_calls(steps, k, sum(split), budget.selected_rows(model.share, rows), rows)


@dataclass(frozen=True)
class CacheMethod:
    """A training-free row family of Table 1 on the frozen DiffusionGemma.

    `name` is the params value and the rows' family, `label` the row label (" K=k" appended),
    `legend` and `marker` the frontier figure's; `builder` ``(base, p, refresh_every) -> model``
    makes a `tadm.caches.diffusiongemma.base.CacheModel` (`base`: the frozen base,
    `tadm.posttrain.model.load_base`; `p`: the run's params); `description` is what Table 1's
    note says of the rows after their label in italics ("is ..., so ..."); `layer_calls`
    ``(steps, k, split, model, rows) -> calls`` is its closed form per canvas (TADM's unless given),
    or None where the rows it recomputes follow the decoding (dKV-Cache, d²Cache): Table 1 then
    reports the calls it counted per denoising step (the model's ``counters.steps`` counts them)."""

    name: str
    label: str
    builder: Callable
    legend: str
    marker: str = "x"
    layer_calls: Callable | None = tadm_calls
    description: str = ""

    def build(self, base, p, refresh_every: int = 1):
        return self.builder(base, p, refresh_every)


def add_dg_cache(unit: CacheMethod) -> CacheMethod:
    """Register `unit` in DG_CACHES under its name; returns it."""
    DG_CACHES.register(unit.name, unit)
    return unit


# the builders import their cache's module (torch, transformers) on the first build, not when params are checked
def _naive_model(base, p, refresh_every: int):
    # lazy: a params check loads this catalog; the DiffusionGemma caches import torch and transformers (~3 s)
    from tadm.caches.diffusiongemma.naive import naive_model
    return naive_model(base, p, refresh_every)


def _feature_model(base, p, refresh_every: int):
    # lazy: a params check loads this catalog; the DiffusionGemma caches import torch and transformers (~3 s)
    from tadm.caches.diffusiongemma.feature import feature_model
    return feature_model(base, p, refresh_every)


def _dkv_model(base, p, refresh_every: int):
    from tadm.caches.diffusiongemma.dkv import dkv_model  # lazy: torch and transformers on the first build only
    return dkv_model(base, p, refresh_every)


def _d2cache_model(base, p, refresh_every: int):
    from tadm.caches.diffusiongemma.d2cache import d2cache_model  # lazy: torch and transformers on the first build only
    return d2cache_model(base, p, refresh_every, **D2CACHE_RELEASE, span=D2CACHE_SPAN)


add_dg_cache(CacheMethod(
    "naive", "Naive reuse", _naive_model, "Naive reuse (fusion bypassed)", "v",
    description="is TADM's split with the fusion bypassed (h = H0); since the denoiser reads only h, a reuse step "
                "returns its refresh step's logits, so the row reuses the model's output K - 1 times."))
add_dg_cache(CacheMethod(
    "feature", "Feature cache", _feature_model, "Feature cache (dLLM-Cache style)",
    "^", feature_calls,
    description="is dLLM-Cache's V-verify cache: every K steps all layers are recomputed; in between, layer 0 runs "
                "whole and every deeper layer recomputes only the canvas rows whose V moved most, at the share that "
                "makes TADM's layer calls ((s + d - 1) / (L - 1)), reusing its cached attention and FFN outputs "
                "elsewhere."))
add_dg_cache(CacheMethod(
    "dkv", "dKV-Cache-Decode", _dkv_model, "dKV-Cache-Decode (decided rows kept)", "D", None,
    description="is dKV-Cache-Decode's rule at TADM's interval: every K steps all layers are recomputed; in between, "
                "every layer recomputes only the canvas rows that were not decided (accepted by the sampler) in the "
                "previous step's input or whose token has changed since, and keeps the others' K, V and branch "
                "outputs; its layer calls are counted, as the rows follow the sampler."))
add_dg_cache(CacheMethod(
    "d2cache", "d²Cache", _d2cache_model, "d²Cache (certainty x attention rows)", "s", None,
    description="is d²Cache's rule at TADM's interval: every K steps all layers are recomputed; in between, every "
                "layer recomputes the still-undecided rows ranked first by first-step confidence x certainty density "
                "(current_k = 32 of 256 scaled to the canvas), the rows whose decided token changed and a top-p 0.1 "
                "of the others by attention rollout, and keeps the others' K, V and branch outputs; its layer calls "
                "are counted."))


# ----------------------------------------------------------------------------- LLaDA


@dataclass(frozen=True)
class CacheSpec:
    """A cache row of the LLaDA group: the method and its intervals (`build` makes the backend).

    prefix / dual: `every` = K, or None (refreshed once per block, as released); feature:
    `every` = K_r, `prompt_every` = K_p, `share` = rho; naive: `every` = K; dkv: `every` = R,
    the reload interval (its rows are at the release's R, `DKV_RELOAD`, whatever the K's);
    d2cache: `prior` = the decoder's certainty-prior sigma (its release decodes with it, one
    block over the whole region: `D2CACHE_RELEASE`)."""

    method: str
    every: int | None = None
    prompt_every: int | None = None
    share: float | None = None
    prior: float | None = None

    @property
    def per_block(self) -> bool:
        """Refreshed once per block (no interval, no prior): such a row runs on low-confidence +
        threshold, its release's cache + parallel recipe; a row with an interval, on
        low-confidence; a row with a prior, on low-confidence with that prior over one block."""
        return self.every is None and self.prior is None

    def build(self, model):
        """The backend of this row on the LLaDA `model`."""
        if self.method not in LLADA_CACHES:
            raise ConfigError("asrd.llada_cache_methods", f"no LLaDA cache {self.method!r} is registered "
                              f"(known: {', '.join(LLADA_CACHES.names())})")
        return LLADA_CACHES[self.method].build(model, self)


@dataclass(frozen=True)
class LladaCache:
    """A training-free cache on LLaDA: `name` (the params value), `builder` ``(model, spec) ->
    backend`` and `rows` ``(ks, released) -> [(label, CacheSpec)]``, its rows of a task's group at
    the intervals `ks` (asrd.llada_cache_refresh) with the task's dLLM-Cache settings as released
    (`released`: an asrd.llada_dllm_cache entry, or None)."""

    name: str
    builder: Callable
    rows: Callable

    def build(self, model, spec: CacheSpec):
        return self.builder(model, spec)


def add_llada_cache(unit: LladaCache) -> LladaCache:
    """Register `unit` in LLADA_CACHES under its name; returns it."""
    LLADA_CACHES.register(unit.name, unit)
    return unit


def _prefix_rows(ks, released) -> list[tuple[str, CacheSpec]]:
    return [("Fast-dLLM prefix cache (per block)", CacheSpec("prefix"))] + [
        (f"Fast-dLLM prefix cache K={k}", CacheSpec("prefix", k)) for k in ks]


def _dual_rows(ks, released) -> list[tuple[str, CacheSpec]]:
    return [("Fast-dLLM dual cache (per block)", CacheSpec("dual"))]


def _feature_rows(ks, released) -> list[tuple[str, CacheSpec]]:
    share = released.share if released else 0.25  # the release's rho on every task
    out = []
    if released:
        r = released
        out.append((f"dLLM-Cache (K_p={r.prompt_every}, K_r={r.response_every}, rho={r.share:g})",
                    CacheSpec("feature", r.response_every, r.prompt_every, r.share)))
    return out + [(f"dLLM-Cache K={k}", CacheSpec("feature", k, k, share)) for k in ks]


def _naive_rows(ks, released) -> list[tuple[str, CacheSpec]]:
    return [(f"Naive reuse K={k}", CacheSpec("naive", k)) for k in ks]


# dKV-Cache-Decode's reload intervals R (horseee/dKV-Cache @49a76fc): 2, the `--cache-steps` default of
# `llada_generate.py`; 8, the `cache_reloading_step` of the README's LLaDA decode example.
DKV_RELOAD = (2, 8)


def _dkv_rows(ks, released) -> list[tuple[str, CacheSpec]]:
    return [(f"dKV-Cache-Decode R={r}", CacheSpec("dkv", r)) for r in DKV_RELOAD]


# d²Cache as released for LLaDA (Kamichanw/d2Cache @72feb60, configs/gen_args.py, case "d2cache"): the
# cache's rollout_p, current_k, sigma and inflate_w; its decoder ranks by confidence x certainty density
# with the same sigma, one block over the whole answer, one token a step
D2CACHE_RELEASE = {"rollout_p": 0.1, "current_k": 32, "sigma": 10.0, "inflate_w": 0}
# the span its current_k is a count of: the 256 positions its GSM8K eval decodes as one block (the
# DiffusionGemma port scales current_k to the canvas: tadm.caches.diffusiongemma.d2cache)
D2CACHE_SPAN = 256


def _d2cache_rows(ks, released) -> list[tuple[str, CacheSpec]]:
    return [("d²Cache (as released)", CacheSpec("d2cache", prior=D2CACHE_RELEASE["sigma"]))]


def _prefix_backend(model, spec: CacheSpec):
    from tadm.caches.llada.prefix import prefix_backend  # lazy: a params check loads this catalog; the LLaDA caches import torch (~1.5 s)
    return prefix_backend(model, spec)


def _dual_backend(model, spec: CacheSpec):
    from tadm.caches.llada.prefix import dual_backend  # lazy: a params check loads this catalog; the LLaDA caches import torch (~1.5 s)
    return dual_backend(model, spec)


def _feature_backend(model, spec: CacheSpec):
    from tadm.caches.llada.feature import feature_backend  # lazy: a params check loads this catalog; the LLaDA caches import torch (~1.5 s)
    return feature_backend(model, spec)


def _naive_backend(model, spec: CacheSpec):
    from tadm.caches.llada.naive import naive_backend  # lazy: a params check loads this catalog; the LLaDA caches import torch (~1.5 s)
    return naive_backend(model, spec)


def _dkv_backend(model, spec: CacheSpec):
    from tadm.caches.llada.dkv import dkv_backend  # lazy: a params check loads this catalog; the LLaDA caches import torch (~1.5 s)
    return dkv_backend(model, spec)


add_llada_cache(LladaCache("prefix", _prefix_backend, _prefix_rows))
add_llada_cache(LladaCache("dual", _dual_backend, _dual_rows))
add_llada_cache(LladaCache("feature", _feature_backend, _feature_rows))
add_llada_cache(LladaCache("naive", _naive_backend, _naive_rows))
def _d2cache_backend(model, spec: CacheSpec):
    # lazy: a params check loads this catalog; the LLaDA caches import torch (~1.5 s)
    from tadm.caches.llada.d2cache import LladaD2CacheBackend
    return LladaD2CacheBackend(model, **D2CACHE_RELEASE)


add_llada_cache(LladaCache("dkv", _dkv_backend, _dkv_rows))
add_llada_cache(LladaCache("d2cache", _d2cache_backend, _d2cache_rows))

__all__ = ["D2CACHE_RELEASE", "D2CACHE_SPAN", "DKV_RELOAD", "CacheMethod", "CacheSpec", "LladaCache", "add_dg_cache", "add_llada_cache", "feature_calls",
           "tadm_calls"]
