"""TADM: Time-Anchored Diffusion Language Models — reference implementation.

Modules are split by concept: `config` (typed params), `data` (corpus, tokenizer, packing,
SFT mixture), and — as the later stages land — the schedule, forward process, models, fusion,
samplers, anchor cache and metrics.
"""

__version__ = "0.1.0"

from tadm import auto as _auto  # noqa: E402  (transformers' Auto classes learn TADM's families, lazily)

_auto.install()
