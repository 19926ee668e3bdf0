"""GSM8K through tadm.tasks: the 5-shot format and scoring on the real shared files."""

from pathlib import Path

import pytest

import tadm.config
from tadm.data.gsm8k import few_shot_prompt, load_gsm8k, score
from tadm.tasks import gsm8k

GSM8K_DIR = Path(tadm.config.ROOT).parent / "shared" / "data" / "gsm8k"

pytestmark = pytest.mark.skipif(
    not all((GSM8K_DIR / f"{s}.jsonl").is_file() for s in ("train", "test")),
    reason=f"GSM8K train.jsonl/test.jsonl not found in {GSM8K_DIR} (the shared data folder)",
)


@pytest.fixture(scope="module")
def rows() -> dict[str, list[dict]]:
    return {split: load_gsm8k(str(GSM8K_DIR), split) for split in ("train", "test")}


def test_five_shot_prompt_from_train_rows(rows):
    shots, target = rows["train"][: gsm8k.N_SHOTS], rows["test"][0]
    prompt = gsm8k.prompt(shots, target["question"])
    assert prompt == few_shot_prompt(shots, target["question"])
    assert prompt.endswith(f"Question: {target['question']}\nAnswer:")
    assert prompt.count("Question: ") == 6
    for shot in shots:
        assert f"Question: {shot['question']}\nAnswer: {shot['answer']}\n\n" in prompt


@pytest.mark.parametrize("i", range(5))
def test_gold_solution_scores_correct_and_a_changed_final_number_wrong(rows, i):
    row = rows["test"][i]
    assert gsm8k.score(row["answer"], row["final"])
    body, _, final = row["answer"].rpartition("####")
    changed = f"{body}#### {int(final.strip().replace(',', '')) + 1}"
    assert not score(changed, row["final"])
