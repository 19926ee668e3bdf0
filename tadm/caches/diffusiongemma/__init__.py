"""Training-free caches on the frozen DiffusionGemma (Table 1's cache rows): naive anchor reuse
(`naive`: TADM's split with the fusion bypassed) and the feature cache in dLLM-Cache's style
(`feature`: per-layer K, V and branch outputs, V-verify on reuse steps); the package docstring
of `tadm.caches` gives the matched share."""

from tadm.caches.diffusiongemma.feature import FeatureCacheDiffusionGemma, feature_model
from tadm.caches.diffusiongemma.naive import BypassFusion, naive_model

__all__ = ["BypassFusion", "FeatureCacheDiffusionGemma", "feature_model", "naive_model"]
