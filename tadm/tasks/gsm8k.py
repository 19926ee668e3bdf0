"""GSM8K, re-exported for symmetry with the other benchmarks of this package.

The implementation lives in :mod:`tadm.data.gsm8k` (it also feeds the SFT data); this module
only names its k-shot prompt builder ``prompt`` like the other task modules.
"""

from __future__ import annotations

from tadm.data.gsm8k import extract_answer, few_shot_prompt, load_gsm8k, score

N_SHOTS = 5

__all__ = ["load_gsm8k", "prompt", "score", "extract_answer", "N_SHOTS"]


def prompt(shots: list[dict], question: str) -> str:
    """The k-shot "Question: ... Answer: ..." prompt ending in "Answer:" (see few_shot_prompt)."""
    return few_shot_prompt(shots, question)
