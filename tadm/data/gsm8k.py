"""GSM8K (grade-school math word problems) for evaluation.

Rows come from the hub (``openai/gsm8k``, config ``main``) or from a local directory holding
``train.jsonl`` / ``test.jsonl`` with the hub's fields ``question`` and ``answer``. The answer
is the full worked solution ending in ``#### <final>``; scoring extracts the final number with
:func:`tadm.data.arithmetic.extract_answer`, shared with the generated arithmetic task.
"""

from __future__ import annotations

from pathlib import Path

from tadm.data.arithmetic import extract_answer, is_correct
from tadm.errors import DataError
from tadm.io import load_jsonl

HUB_NAME = "openai/gsm8k"
HUB_CONFIG = "main"

__all__ = ["load_gsm8k", "few_shot_prompt", "score", "extract_answer"]


def _final(answer: str) -> str:
    """The final answer of a GSM8K solution: the text after "####", commas removed."""
    return answer.rpartition("####")[2].strip().replace(",", "")


def _read_hub(split: str) -> list[dict]:
    import datasets  # lazy: datasets takes ~0.9 s to import; only the hub's rows need it, not a local copy

    ds = datasets.load_dataset(HUB_NAME, HUB_CONFIG, split=split)
    return [{"question": q, "answer": a} for q, a in zip(ds["question"], ds["answer"])]


def _read_local(directory: Path, split: str) -> list[dict]:
    path = directory / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: GSM8K split file not found (sft.gsm8k must be 'hub' or a directory with {split}.jsonl)")
    rows = load_jsonl(path, ("question", "answer"))
    for i, row in enumerate(rows, 1):
        if not all(isinstance(row[k], str) for k in ("question", "answer")):
            raise DataError(f"{path}: row {i}: expected string fields 'question' and 'answer'")
        if "####" not in row["answer"]:
            raise DataError(f"{path}: row {i}: answer has no '#### <final>' line")
    return rows


def load_gsm8k(source: str, split: str) -> list[dict]:
    """GSM8K `split` ("train" or "test") from `source` ("hub" or a local directory).

    Each row is {"id", "question", "answer" (full solution), "final" (the number after ####)}.
    """
    rows = _read_hub(split) if source == "hub" else _read_local(Path(source).expanduser(), split)
    return [
        {"id": f"gsm8k-{split}-{i}", "question": r["question"], "answer": r["answer"], "final": _final(r["answer"])}
        for i, r in enumerate(rows)
    ]


def few_shot_prompt(shots: list[dict], question: str) -> str:
    """The standard k-shot prompt: solved "Question: ...\\nAnswer: ..." pairs, then the question.

    `shots` are GSM8K rows (their "question" and full-solution "answer"); the model continues
    after the final "Answer:".
    """
    parts = [f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots]
    return "".join(parts) + f"Question: {question}\nAnswer:"


def score(completion: str, final: str) -> bool:
    """Whether a completion's extracted answer equals the row's `final` answer.

    A k-shot completion often runs on into a new "Question:"; only the text before it counts.
    """
    return is_correct(completion.split("Question:")[0], final)
