"""GSM8K loading, prompting and scoring, on the real files in the shared data folder."""

import json
import re
from pathlib import Path

import pytest

import tadm.config
from tadm.data.arithmetic import extract_answer
from tadm.data.gsm8k import few_shot_prompt, load_gsm8k, score
from tadm.errors import DataError

GSM8K_DIR = Path(tadm.config.ROOT).parent / "shared" / "data" / "gsm8k"
SIZES = {"train": 7473, "test": 1319}

needs_gsm8k = pytest.mark.skipif(
    not all((GSM8K_DIR / f"{s}.jsonl").is_file() for s in SIZES), reason=f"GSM8K not found in {GSM8K_DIR}"
)


@pytest.fixture(scope="module")
def gsm8k() -> dict[str, list[dict]]:
    return {split: load_gsm8k(str(GSM8K_DIR), split) for split in SIZES}


@needs_gsm8k
@pytest.mark.parametrize("split", list(SIZES))
def test_loads_both_splits(gsm8k, split):
    rows = gsm8k[split]
    assert len(rows) == SIZES[split]
    assert [r["id"] for r in rows[:2]] == [f"gsm8k-{split}-0", f"gsm8k-{split}-1"]
    for r in rows:
        assert set(r) == {"id", "question", "answer", "final"}
        assert re.fullmatch(r"-?\d+(\.\d+)?", r["final"]), r["id"]
        float(r["final"])
        # the shared scorer reads the same final answer off the reference solution
        assert extract_answer(r["answer"]) == r["final"], r["id"]
        assert score(r["answer"], r["final"]), r["id"]


@needs_gsm8k
def test_few_shot_prompt_format(gsm8k):
    shots, target = gsm8k["train"][:3], gsm8k["test"][0]
    prompt = few_shot_prompt(shots, target["question"])
    assert prompt.startswith("Question: " + shots[0]["question"] + "\nAnswer: " + shots[0]["answer"] + "\n\n")
    assert prompt.endswith("Question: " + target["question"] + "\nAnswer:")
    assert prompt.count("\nAnswer:") == 4
    assert few_shot_prompt([], "Q?") == "Question: Q?\nAnswer:"


@needs_gsm8k
def test_score_ignores_a_runaway_next_question(gsm8k):
    row = gsm8k["test"][0]
    wrong = str(int(row["final"]) + 1)
    completion = f" The result is {row['final']}.\n#### {row['final']}\n\nQuestion: more?\nAnswer: #### {wrong}"
    assert score(completion, row["final"])
    assert not score(f"#### {wrong}", row["final"])


def test_missing_directory_raises_data_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DataError, match=re.escape(str(missing / "test.jsonl"))):
        load_gsm8k(str(missing), "test")


@pytest.mark.parametrize("content, problem", [
    ('{"question": "q", "answer": "a #### 1"}\nnot json\n', ":2: not valid JSON"),
    ('{"question": "q"}\n', ":1: missing field(s) 'answer'"),
    ('{"question": "q", "answer": 3}\n', "row 1: expected string fields"),
    ('{"question": "q", "answer": "no final"}\n', "row 1: answer has no"),
    ("\n", "holds no rows"),
])
def test_malformed_file_raises_data_error(tmp_path, content, problem):
    (tmp_path / "train.jsonl").write_text(content)
    with pytest.raises(DataError, match=re.escape(problem)) as err:
        load_gsm8k(str(tmp_path), "train")
    assert str(tmp_path / "train.jsonl") in str(err.value) and "\n" not in str(err.value)


def test_local_rows_convert(tmp_path):
    rows = [{"question": "two and two?", "answer": "2+2=<<2+2=4>>4\n#### 1,004"}]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (row,) = load_gsm8k(str(tmp_path), "test")
    assert row == {"id": "gsm8k-test-0", "question": "two and two?", "answer": rows[0]["answer"], "final": "1004"}
