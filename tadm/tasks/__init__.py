"""Task evaluation for the post-training table (paper Table 1).

One module per benchmark, each giving prompt construction, answer extraction and scoring;
the model side is a ``generate(prompts: list[str]) -> list[str]`` function supplied elsewhere.

* :mod:`~tadm.tasks.gsm8k` -- GSM8K, 5-shot (re-exports :mod:`tadm.data.gsm8k`).
* :mod:`~tadm.tasks.multiple_choice` -- MMLU-Pro (5-shot CoT) and GPQA-Diamond (0-shot CoT).
* :mod:`~tadm.tasks.aime` -- AIME, integer answers in ``\\boxed{}``.
* :mod:`~tadm.tasks.humaneval` -- HumanEval, 0-shot completion, pass@k by execution.
* :mod:`~tadm.tasks.livecodebench` -- LiveCodeBench, programs run on stdin/functional tests.
* :mod:`~tadm.tasks.sandbox` -- runs generated code as an unprivileged uid in its own namespaces
  (mount, PID, network), with a read-only file-system view and rlimits; refuses where it cannot.

:mod:`~tadm.tasks.suite` builds each benchmark's prompts and scorer by name (``build_task``); no
module imports ``datasets`` until a hub source is asked for.
"""

from __future__ import annotations
