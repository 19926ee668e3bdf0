"""Table 2's sample metrics: MAUVE (`mauve`, features from `features`), generative perplexity
(`gen_ppl`, evaluators from `evaluator`) and token entropy (`entropy`).

Offline defaults: SmolLM2-135M as evaluator and featurizer (shipped by a pip package); paper
profile: GPT-2 Large for both, through `from_pretrained`. When one model is both, one forward
pass gives Gen PPL and the features (`gen_ppl_and_features`). Every batched metric takes an
optional `tadm.runtime.Dist` and splits its batches over the processes (`shards`).
"""

from tadm.metrics.entropy import mean_entropy, sample_entropy
from tadm.metrics.evaluator import Evaluator, load_evaluator
from tadm.metrics.features import Featurizer, load_featurizer
from tadm.metrics.gen_ppl import GenPPL, decode_samples, gen_ppl, gen_ppl_and_features, gen_ppl_ids
from tadm.metrics.mauve import mauve_from_features, mauve_score, mauve_score_features

__all__ = [
    "Evaluator", "Featurizer", "GenPPL", "decode_samples", "gen_ppl", "gen_ppl_and_features", "gen_ppl_ids",
    "load_evaluator",
    "load_featurizer", "mauve_from_features", "mauve_score", "mauve_score_features", "mean_entropy",
    "sample_entropy",
]
