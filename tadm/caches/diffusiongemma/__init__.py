"""Training-free caches on the frozen DiffusionGemma (Table 1's cache rows): naive anchor reuse
(`naive`: TADM's split with the fusion bypassed), the feature cache in dLLM-Cache's style
(`feature`: per-layer K, V and branch outputs, V-verify on reuse steps) and, on its state,
dKV-Cache's row rule (`dkv`: the rows not decided and unchanged since the previous input are
recomputed at every layer); the package docstring of `tadm.caches` gives the matched share."""

from tadm.caches.diffusiongemma.dkv import DkvCacheDiffusionGemma, dkv_model
from tadm.caches.diffusiongemma.feature import FeatureCacheDiffusionGemma, StepSelectionCache, feature_model
from tadm.caches.diffusiongemma.naive import BypassFusion, naive_model

__all__ = ["BypassFusion", "DkvCacheDiffusionGemma", "FeatureCacheDiffusionGemma", "StepSelectionCache", "dkv_model",
           "feature_model", "naive_model"]
