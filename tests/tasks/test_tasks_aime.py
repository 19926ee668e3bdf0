"""AIME: integer extraction, the prompt, loading hand-written rows, scoring."""

import json

import pytest

from tadm.errors import DataError
from tadm.tasks import aime


@pytest.mark.parametrize(
    "text, expected",
    [
        ("... so the total is \\boxed{33}.", 33),
        ("\\boxed{033}", 33),  # leading zeros, as AIME answers are often written
        ("We try \\boxed{12} first, then correct it: \\boxed{204}", 204),  # the last box
        ("$\\boxed{\\text{n = 204}}$ and 7 other cases", 204),  # nested braces; the box beats later numbers
        ("\\boxed{\\frac{1}{2}} hmm, the answer is 70", 70),
        ("the angle is \\boxed{45^\\circ}", 45),
        ("\\boxed{x + 1} so the last number is 8", 8),  # not an integer in the box: fall back  # ... 2 would be wrong: the box holds a fraction
        ("the answer is 72. Check: 72 - 5 = 67", 72),  # "answer is" beats the last integer
        ("The answer is 12.0", 12),
        ("we get 1, 2, 3 and finally 45.", 45),  # the last integer
        ("there are 1,000 ways", 1000),
        ("x = 3.5 and y = 2.0", 2),
        ("The answer is \\boxed{9", 9),  # cut off before the closing brace
        ("no numbers at all", None),
        ("", None),
    ],
)
def test_extract_integer(text, expected):
    assert aime.extract_integer(text) == expected


def test_prompt_asks_for_a_boxed_answer():
    p = aime.prompt("  Find the number of ordered pairs.\n")
    assert p == "Find the number of ordered pairs.\n\nPlease reason step by step. Put your final answer within \\boxed{}."


def test_load_local_jsonl(tmp_path):
    path = tmp_path / "aime.jsonl"
    rows = [{"id": "2024-I-1", "problem": "P1", "answer": "033"}, {"Problem": "P2", "Answer": 7}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert aime.load_aime(str(path)) == [{"id": "2024-I-1", "problem": "P1", "answer": 33},
                                         {"id": "aime-1", "problem": "P2", "answer": 7}]


@pytest.mark.parametrize("answer, message", [("abc", "must be an integer"), (1000, r"must be in 0\.\.999"),
                                             (None, "must be an integer")])
def test_load_rejects_bad_answers(tmp_path, answer, message):
    path = tmp_path / "aime.jsonl"
    path.write_text(json.dumps({"problem": "P", "answer": answer}) + "\n")
    with pytest.raises(DataError, match=f"aime.jsonl: row 1: 'answer' {message}"):
        aime.load_aime(str(path))


def test_missing_local_file_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        aime.load_aime(str(tmp_path / "missing.jsonl"))


def test_score():
    row = {"id": "x", "problem": "P", "answer": 33}
    assert aime.score(row, "Thus \\boxed{033}.")
    assert not aime.score(row, "Thus \\boxed{34}.")
    assert not aime.score(row, "I give up.")
