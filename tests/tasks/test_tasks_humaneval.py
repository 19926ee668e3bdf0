"""HumanEval: real problems from the pip package, their canonical solutions run in the sandbox."""

import pytest

from tadm.tasks import humaneval

CANONICAL = ["HumanEval/0", "HumanEval/2", "HumanEval/4", "HumanEval/7", "HumanEval/12"]


@pytest.fixture(scope="module")
def problems() -> dict[str, dict]:
    return humaneval.load_problems()


def test_loads_all_problems(problems):
    assert len(problems) == 164
    assert set(problems["HumanEval/0"]) == {"task_id", "prompt", "canonical_solution", "test", "entry_point"}


def test_prompt_is_the_signature_and_docstring(problems):
    p = problems["HumanEval/0"]
    assert humaneval.prompt(p) == p["prompt"]
    assert "def has_close_elements(" in humaneval.prompt(p) and humaneval.prompt(p).rstrip().endswith('"""')


@pytest.mark.parametrize("task_id", CANONICAL)
def test_canonical_solution_passes(problems, task_id):
    assert humaneval.score(problems[task_id], problems[task_id]["canonical_solution"])


@pytest.mark.parametrize("completion", ["", "    return None\n", "    pass\n", "    return 1 +\n"])
def test_empty_wrong_or_broken_completion_fails(problems, completion):
    assert not humaneval.score(problems["HumanEval/2"], completion)


def test_wrong_completion_fails_on_another_problem(problems):
    assert not humaneval.score(problems["HumanEval/0"], "    return False\n")


def test_completion_is_cut_at_stop_sequences(problems):
    p = problems["HumanEval/4"]
    good = p["canonical_solution"]
    # each tail would fail the run if it were kept
    for tail in ["\nprint(undefined_name)\n", "\nif __name__ == '__main__':\n    raise SystemExit(1)\n",
                 "\ndef helper():\n    pass\nraise SystemExit(1)\n", "\nclass X:\n    pass\nraise SystemExit(1)\n",
                 "\n# tests\nraise SystemExit(1)\n"]:
        assert humaneval.truncate(good + tail) == good
        assert humaneval.score(p, good + tail), tail
    assert humaneval.truncate("    def inner():\n        return 1\n    return inner()\n").count("def inner") == 1


def test_the_checked_programs_layout(problems):
    """The completion's program holds no test; the checker's holds the prompt (its helpers), the
    entry point's name bound to the completion's function, the tests and the check call."""
    p = problems["HumanEval/7"]
    solution, checker = humaneval.checked_programs(p, "    return []\ndef more(): pass\n")
    assert solution == p["prompt"] + "    return []"  # cut at the stop sequence
    assert p["test"] not in solution and "return []" not in checker
    assert checker.startswith(p["prompt"]) and p["test"] in checker
    assert f"{p['entry_point']} = __sandbox_candidate__" in checker
    assert checker.rstrip().endswith(f"check({p['entry_point']})")


def test_every_canonical_solution_passes_and_every_empty_body_fails(problems):
    """All 164 problems: the canonical solution passes (some tests call the entry point by name,
    or use the prompt's helpers) and the prompt alone -- a body of its docstring -- does not."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        canonical = list(pool.map(lambda q: humaneval.score(q, q["canonical_solution"], timeout_s=20), problems.values()))
        empty = list(pool.map(lambda q: humaneval.score(q, "", timeout_s=20), problems.values()))
    assert [k for k, ok in zip(problems, canonical) if not ok] == []
    assert [k for k, ok in zip(problems, empty) if ok] == []


def test_infinite_loop_completion_fails_by_timeout(problems):
    assert not humaneval.score(problems["HumanEval/2"], "    while True:\n        pass\n", timeout_s=1.0)


@pytest.mark.parametrize(
    "n, c, k, expected",
    [(5, 0, 1, 0.0), (5, 5, 1, 1.0), (5, 5, 5, 1.0), (10, 3, 1, 0.3), (10, 3, 2, 1 - 21 / 45), (10, 9, 2, 1.0),
     (1, 1, 1, 1.0), (200, 13, 10, 1 - __import__("math").comb(187, 10) / __import__("math").comb(200, 10))],
)
def test_pass_at_k_closed_form(n, c, k, expected):
    assert humaneval.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n, c, k, param", [(5, 6, 1, "c"), (5, -1, 1, "c"), (5, 2, 0, "k"), (5, 2, 6, "k")])
def test_pass_at_k_rejects_bad_arguments(n, c, k, param):
    with pytest.raises(ValueError, match=rf"pass_at_k: {param} must be"):
        humaneval.pass_at_k(n, c, k)


@pytest.mark.parametrize("completion", [
    "    import sys; sys.exit(0)\n",
    "    raise SystemExit\n",
    "    import os; os._exit(0)\n",
    "    import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n",
    "    import os; os.close(4)\n",
    "    print('done:'); import os; os._exit(0)\n",
])
def test_a_completion_that_ends_the_program_before_the_check_fails(problems, completion):
    """`sys.exit(0)` in the function body used to score HumanEval/0 solved (the program exited 0
    before check() ran): only a program whose last line -- the check call -- ran has passed."""
    assert not humaneval.score(problems["HumanEval/0"], completion)
    # the same, at the top level after the function (what a model writes after its function)
    assert not humaneval.score(problems["HumanEval/0"], problems["HumanEval/0"]["canonical_solution"]
                               + "\nimport sys\nsys.exit(0)\n")
