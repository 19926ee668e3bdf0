"""The generated arithmetic task: deterministic, correct, and scorable by extract_answer."""

import re

import pytest

from tadm.data.arithmetic import extract_answer, generate, is_correct

EXPRESSION = re.compile(r"\d+(?: [-+*] \d+)+")
CHAIN_START = re.compile(r"^Start with (\d+)\.")
CHAIN_STEP = re.compile(r"(add|subtract|multiply by) (\d+)", re.IGNORECASE)


def independent_answer(prompt: str) -> int:
    """Recompute the answer from the question text alone, without the generator's solver."""
    start = CHAIN_START.match(prompt)
    if start:  # chain: apply operations in order
        value = int(start.group(1))
        for verb, n in CHAIN_STEP.findall(prompt):
            verb, n = verb.lower(), int(n)
            value = value + n if verb == "add" else value - n if verb == "subtract" else value * n
        return value
    (expr,) = EXPRESSION.findall(prompt)  # expression: Python's own precedence rules
    return eval(expr, {"__builtins__": {}})


def operations(prompt: str) -> int:
    if CHAIN_START.match(prompt):
        return len(CHAIN_STEP.findall(prompt))
    return len(re.findall(r" [-+*] ", prompt))


def test_deterministic_under_seed():
    assert generate(40, 99, seed=3) == generate(40, 99, seed=3)
    assert generate(40, 99, seed=3) != generate(40, 99, seed=4)
    assert generate(0, 99, seed=3) == []


def test_schema_and_ids():
    examples = generate(25, 50, seed=0)
    assert [e["id"] for e in examples] == [f"arith-{i}" for i in range(25)]
    for e in examples:
        assert set(e) == {"id", "source", "category", "prompt", "response", "answer"}
        assert e["source"] == "arithmetic" and e["category"] == "math"
        assert e["response"].splitlines()[-1] == f"#### {e['answer']}"


def test_answers_are_correct_and_operands_bounded():
    examples = generate(400, 30, seed=1)
    for e in examples:
        assert int(e["answer"]) == independent_answer(e["prompt"]), e
        assert all(1 <= int(n) <= 30 for n in re.findall(r"\d+", e["prompt"])), e
        assert 1 <= operations(e["prompt"]) <= 3, e
    # the mixture really mixes: 1, 2 and 3 operations, both phrasings, every operator
    assert {operations(e["prompt"]) for e in examples} == {1, 2, 3}
    assert any(CHAIN_START.match(e["prompt"]) for e in examples)
    assert any(not CHAIN_START.match(e["prompt"]) for e in examples)
    for op in ("+", "-", "*"):
        assert any(f" {op} " in e["response"] for e in examples)


def test_working_lines_are_true_equations():
    for e in generate(200, 99, seed=2):
        for line in e["response"].splitlines()[:-1]:
            lhs, rhs = line.split(":")[-1].split("=")
            assert eval(lhs, {"__builtins__": {}}) == int(rhs), line


def test_extract_answer_round_trips():
    for e in generate(100, 99, seed=5):
        assert extract_answer(e["response"]) == e["answer"]
        assert is_correct(e["response"], e["answer"])
        assert not is_correct(e["response"], str(int(e["answer"]) + 1))


@pytest.mark.parametrize("text, expected", [
    ("so 3 + 4 = 7\n#### 1,234", "1234"),
    ("#### -33", "-33"),
    ("#### $5.00 total", "5"),
    ("#### 2.50", "2.5"),
    ("12 - 7 is 5, then 12-7 again", "7"),
    ("x=-5", "-5"),
    ("The answer is 42.", "42"),
    ("first #### 3 then #### 9", "9"),
    ("#### 6 is after the marker", "6"),
    ("8 apples, then a bare ####", "8"),
    ("no digits at all", None),
    ("", None),
])
def test_extract_answer_cases(text, expected):
    assert extract_answer(text) == expected


def test_is_correct_normalizes_reference():
    assert is_correct("#### 1234", "1,234")
    assert is_correct("the total is 7", 7)
    assert not is_correct("no answer", "7")


def test_operation_subset_and_count_are_respected():
    examples = generate(200, 9, seed=3, max_ops=1, ops=["+"])
    for e in examples:
        a, op, b = e["response"].splitlines()[0].split(" = ")[0].split()
        assert op == "+" and 1 <= int(a) <= 9 and 1 <= int(b) <= 9
        assert int(e["answer"]) == int(a) + int(b)
    with pytest.raises(ValueError, match="subset"):
        generate(1, 9, seed=0, ops=["/"])
