"""Sampling: one loop, one adapter call for every model, and TADM's anchor cache (Alg. 1).

    adapter = make_adapter(model, refresh=BudgetSchedule())          # TADM: K from T (Table 2)
    result = sample(adapter, SamplerSettings(sampler="remdm-loop", steps=4096, nucleus_p=0.9),
                    num_samples=16, seq_len=1024)
    result.tokens, result.counters.layer_calls_per_trajectory, result.refresh_steps
"""

from tadm.sampling.adapters import (
    ADLMAdapter, Adapter, MDLMAdapter, SEDDAdapter, SingleNetworkAdapter, TADMAdapter, make_adapter,
)
from tadm.sampling.anchor_cache import (
    PAPER_REFRESH_SCHEDULE, AdaptiveDrift, AnchorCache, BudgetSchedule, FixedInterval, RefreshPolicy,
    StaleAnchorError,
)
from tadm.sampling.base import SamplerSettings, StepInfo, Transition
from tadm.sampling.counters import ComputeCounter, instrument
from tadm.sampling.loop import Paused, SampleResult, sample
from tadm.sampling.mdlm import MDLMSampler, mdlm_posterior
from tadm.sampling.remdm import LoopSchedule, ReMDMSampler, remdm_posterior, sigma_max
from tadm.sampling.correctors import CorrectorSampler, dfm_grid, dfm_posterior, dfm_rates, fb_posterior, fb_rates
from tadm.sampling.sedd import SEDDAnalyticSampler, sedd_analytic_posterior
from tadm.sampling.ar import ARSettings, next_token_probs, sample_ar
from tadm.registry import SAMPLERS

SAMPLER_NAMES = SAMPLERS.names()  # every sampler module above has registered its names

__all__ = [
    "Adapter", "SingleNetworkAdapter", "MDLMAdapter", "ADLMAdapter", "TADMAdapter", "make_adapter",
    "PAPER_REFRESH_SCHEDULE", "AnchorCache", "RefreshPolicy", "FixedInterval", "BudgetSchedule",
    "AdaptiveDrift", "StaleAnchorError",
    "SAMPLER_NAMES", "SamplerSettings", "SampleResult", "Paused", "StepInfo", "Transition", "sample",
    "ComputeCounter", "instrument",
    "MDLMSampler", "mdlm_posterior", "ReMDMSampler", "LoopSchedule", "remdm_posterior", "sigma_max",
    "SEDDAdapter", "CorrectorSampler", "fb_posterior", "dfm_posterior", "fb_rates", "dfm_rates", "dfm_grid",
    "SEDDAnalyticSampler", "sedd_analytic_posterior", "ARSettings", "sample_ar", "next_token_probs",
]
