"""MMLU-Pro and GPQA-Diamond: loading hand-written rows, prompts, answer extraction, scoring."""

import json
from pathlib import Path

import pytest

from tadm.errors import DataError
from tadm.tasks import multiple_choice as mc

OPTIONS10 = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mmlu_row(i: int, category: str = "math", **extra) -> dict:
    row = {"question_id": 100 + i, "question": f"What is {i} + 1?", "options": OPTIONS10,
           "answer": "ABCDEFGHIJ"[(i + 1) % 10], "answer_index": (i + 1) % 10, "category": category,
           "cot_content": f"A: Let's think step by step. {i} + 1 = {i + 1}. The answer is ({'ABCDEFGHIJ'[(i + 1) % 10]}).",
           "src": "hand-written"}
    return row | extra


def gpqa_row(i: int) -> dict:
    return {"Record ID": f"rec{i}", "Question": f"Which particle is number {i}?\n",
            "Correct Answer": f" right {i} ", "Incorrect Answer 1": f"wrong {i}a", "Incorrect Answer 2": f"wrong {i}b",
            "Incorrect Answer 3": f"wrong {i}c", "High-level domain": "Physics"}


@pytest.fixture
def mmlu_files(tmp_path) -> tuple[Path, Path]:
    validation = write_jsonl(tmp_path / "validation.jsonl",
                             [mmlu_row(i) for i in range(6)] + [mmlu_row(9, "law")])
    test = write_jsonl(tmp_path / "test.jsonl", [mmlu_row(7), {"question": "Pick B", "options": ["x", "y", "z"], "answer": "B"}])
    return validation, test


# --- MMLU-Pro ------------------------------------------------------------------------------


def test_mmlu_pro_loads_local_rows(mmlu_files):
    _, test = mmlu_files
    rows = mc.load_mmlu_pro(str(test))
    assert rows[0] == {"id": "107", "question": "What is 7 + 1?", "options": OPTIONS10, "answer": "I",
                       "category": "math", "cot": mmlu_row(7)["cot_content"]}
    assert rows[1]["answer"] == "B" and rows[1]["options"] == ["x", "y", "z"] and rows[1]["id"] == "mmlu-pro-1"


def test_mmlu_pro_five_shot_prompt(mmlu_files):
    validation, test = (mc.load_mmlu_pro(str(p)) for p in mmlu_files)
    shots = mc.mmlu_pro_shots(validation, "math")
    assert [s["id"] for s in shots] == ["100", "101", "102", "103", "104"]  # first 5 of the category
    prompt = mc.mmlu_pro_prompt(test[0], shots)
    assert prompt.startswith("The following are multiple choice questions (with answers) about math. ")
    assert '"The answer is (X)"' in prompt.split("\n")[0]
    assert prompt.count("Question: ") == 6
    assert prompt.count("Answer: Let's think step by step.") == 6
    assert "Let's think step by step. Let's think" not in prompt and "A: Let's" not in prompt
    for s in shots:  # every shot shows its reasoning and closes with its letter
        i = int(s["id"]) - 100
        assert f"Answer: Let's think step by step. {i} + 1 = {i + 1}. The answer is ({s['answer']}).\n\n" in prompt
    last = prompt.split("\n\n")[-1]
    assert last == ("Question: What is 7 + 1?\nOptions:\n" + "".join(f"{letter}. {o}\n" for letter, o in zip("ABCDEFGHIJ", OPTIONS10))
                    + "Answer: Let's think step by step.")


def test_mmlu_pro_shots_need_enough_rows(mmlu_files):
    validation = mc.load_mmlu_pro(str(mmlu_files[0]))
    with pytest.raises(DataError, match="only 1 rows of category 'law'"):
        mc.mmlu_pro_shots(validation, "law")


@pytest.mark.parametrize(
    "row, message",
    [
        ({"question": "q", "options": ["a"], "answer": "A"}, "'options' must be a list of 2 to 10 strings"),
        ({"question": "q", "options": ["a", "b"], "answer": "C"}, "needs 'answer'"),
        ({"question": "q", "options": ["a", "b"], "answer": "A", "answer_index": 1}, "disagrees"),
        ({"question": "q", "options": ["a", "b"], "answer_index": 5}, "'answer_index' must be"),
        ({"question": 3, "options": ["a", "b"], "answer": "A"}, "'question' must be a string"),
        ({"options": ["a", "b"], "answer": "A"}, "missing field"),
    ],
)
def test_mmlu_pro_bad_rows_name_file_and_row(tmp_path, row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(DataError, match=message) as err:
        mc.load_mmlu_pro(str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        mc.load_mmlu_pro(str(tmp_path / "nope.jsonl"))
    (tmp_path / "broken.jsonl").write_text('{"question": \n')
    with pytest.raises(DataError, match=r"broken.jsonl:1: not valid JSON"):
        mc.load_gpqa(str(tmp_path / "broken.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="holds no rows"):
        mc.load_gpqa(str(tmp_path / "empty.jsonl"))


# --- GPQA ----------------------------------------------------------------------------------


def test_gpqa_options_are_shuffled_deterministically(tmp_path):
    path = write_jsonl(tmp_path / "gpqa.jsonl", [gpqa_row(i) for i in range(12)])
    rows = mc.load_gpqa(str(path))
    assert rows == mc.load_gpqa(str(path))  # same seed, same order
    for i, row in enumerate(rows):
        assert row["id"] == f"rec{i}" and row["question"] == f"Which particle is number {i}?"
        assert sorted(row["options"]) == sorted([f"right {i}", f"wrong {i}a", f"wrong {i}b", f"wrong {i}c"])
        assert row["options"]["ABCD".index(row["answer"])] == f"right {i}"
    assert len({r["answer"] for r in rows}) > 1  # the correct answer is not always first
    other = mc.load_gpqa(str(path), seed=1)
    assert [r["options"] for r in other] != [r["options"] for r in rows]
    # the order of a question depends on its id, not on its position in the file
    reversed_rows = mc.load_gpqa(str(write_jsonl(tmp_path / "rev.jsonl", [gpqa_row(i) for i in reversed(range(12))])))
    assert reversed_rows[::-1] == rows


def test_gpqa_prompt(tmp_path):
    row = mc.load_gpqa(str(write_jsonl(tmp_path / "gpqa.jsonl", [gpqa_row(0)])))[0]
    prompt = mc.gpqa_prompt(row)
    assert prompt.startswith("Answer the following multiple choice question.")
    assert "where X is one of A, B, C or D." in prompt
    assert "Question: Which particle is number 0?\nOptions:\n" in prompt
    assert "D. " in prompt and "E. " not in prompt
    assert prompt.endswith("Answer: Let's think step by step.")


def test_gpqa_bad_row(tmp_path):
    row = gpqa_row(0) | {"Incorrect Answer 2": "  "}
    with pytest.raises(DataError, match="row 1: field 'Incorrect Answer 2' must be a non-empty string"):
        mc.load_gpqa(str(write_jsonl(tmp_path / "gpqa.jsonl", [row])))


# --- answers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, n, expected",
    [
        ("... so the answer is (C).", 10, "C"),
        ("The answer is (A). Wait, no: the answer is (B).", 4, "B"),  # the last one counts
        ("the answer is (b)", 4, "B"),
        ("The answer is: D", 4, "D"),
        ("So the answer is **(J)**", 10, "J"),
        ("Answer: C", 4, "C"),
        ("**Answer:** (A)", 4, "A"),
        ("Final: \\boxed{B}", 4, "B"),
        ("(A) is tempting but (D) is right", 4, "D"),
        ("Between A and B, I choose B", 4, "B"),
        ("The answer is (C) because (A) and (B) fail", 4, "C"),  # an explicit phrase beats a later (X)
        ("The answer is (E).", 4, None),  # out of range for 4 options
        ("The answer is Avogadro's number", 4, None),
        ("no letter here", 4, None),
        ("", 10, None),
    ],
)
def test_extract_choice(text, n, expected):
    assert mc.extract_choice(text, n) == expected


def test_extract_choice_rejects_bad_option_count():
    with pytest.raises(ValueError, match="n_options"):
        mc.extract_choice("A", 11)


def test_score(tmp_path):
    row = mc.load_gpqa(str(write_jsonl(tmp_path / "gpqa.jsonl", [gpqa_row(3)])))[0]
    wrong = next(letter for letter in "ABCD" if letter != row["answer"])
    assert mc.score(row, f"Reasoning... The answer is ({row['answer']}).")
    assert not mc.score(row, f"Reasoning... The answer is ({wrong}).")
    assert not mc.score(row, "I cannot decide.")
    # a few-shot completion that runs on into the next question is cut there
    assert mc.score(row, f"The answer is ({row['answer']}).\nQuestion: next?\nAnswer: The answer is ({wrong}).")
