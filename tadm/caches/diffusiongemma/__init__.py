"""Training-free caches on the frozen DiffusionGemma (Table 1's cache rows): naive anchor reuse
(`naive`: TADM's split with the fusion bypassed), the feature cache in dLLM-Cache's style
(`feature`: per-layer K, V and branch outputs, V-verify on reuse steps) and, on its state,
dKV-Cache's row rule (`dkv`: the rows not decided and unchanged since the previous input are
recomputed at every layer) and d²Cache's (`d2cache`: ranked undecided rows, the rows that moved and
an attention-rollout nucleus); the package docstring of `tadm.caches` gives the matched share."""

from tadm.caches.diffusiongemma.d2cache import D2CacheDiffusionGemma, d2cache_model
from tadm.caches.diffusiongemma.dkv import DkvCacheDiffusionGemma, dkv_model
from tadm.caches.diffusiongemma.feature import FeatureCacheDiffusionGemma, StepSelectionCache, feature_model
from tadm.caches.diffusiongemma.naive import BypassFusion, naive_model

__all__ = ["BypassFusion", "D2CacheDiffusionGemma", "DkvCacheDiffusionGemma", "FeatureCacheDiffusionGemma",
           "StepSelectionCache", "d2cache_model", "dkv_model", "feature_model", "naive_model"]
