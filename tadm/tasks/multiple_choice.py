"""Multiple-choice benchmarks: MMLU-Pro (5-shot CoT, options A-J) and GPQA-Diamond (0-shot, A-D).

Both are loaded into one row format, {"id", "question", "options", "answer", "category", "cot"}:
`options` a list of strings, `answer` the correct letter, `cot` a worked solution (MMLU-Pro
validation rows, used for the shots) or "". Sources: the hub (``TIGER-Lab/MMLU-Pro``;
``Idavidrein/gpqa`` config ``gpqa_diamond``, gated: log in first) or a local JSON-lines file
with the hub's field names.

Prompts ask the model to think step by step and finish with "The answer is (X)";
:func:`extract_choice` reads the letter back, with looser fallbacks for other phrasings.
GPQA lists the correct answer first, so its options are shuffled, deterministically per
question (seeded by the seed and the question's id).
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from pathlib import Path

from tadm.errors import DataError
from tadm.tasks.common import load_hub, read_jsonl

LETTERS = "ABCDEFGHIJ"
MMLU_PRO_HUB = "TIGER-Lab/MMLU-Pro"
GPQA_HUB, GPQA_CONFIG = "Idavidrein/gpqa", "gpqa_diamond"
N_SHOTS = 5

MMLU_PRO_INSTRUCTION = (
    "The following are multiple choice questions (with answers) about {category}. Think step by step "
    'and then finish your answer with "The answer is (X)" where X is the correct letter choice.\n\n'
)
GPQA_INSTRUCTION = (
    "Answer the following multiple choice question. Think step by step and then finish your answer "
    'with "The answer is (X)" where X is one of {letters}.\n\n'
)
COT_START = "Answer: Let's think step by step."

__all__ = [
    "load_mmlu_pro", "load_gpqa", "mmlu_pro_shots", "mmlu_pro_prompt", "gpqa_prompt",
    "extract_choice", "score",
]


# --- loading -------------------------------------------------------------------------------


def _mmlu_pro_row(row: dict, i: int, where: str) -> dict:
    options = row.get("options")
    if not (isinstance(options, list) and 2 <= len(options) <= len(LETTERS) and all(isinstance(o, str) for o in options)):
        raise DataError(f"{where}: row {i + 1}: 'options' must be a list of 2 to 10 strings")
    letters = LETTERS[: len(options)]
    answer, index = row.get("answer"), row.get("answer_index")
    if index is not None:
        if not (isinstance(index, int) and 0 <= index < len(options)):
            raise DataError(f"{where}: row {i + 1}: 'answer_index' must be an int in [0, {len(options)})")
        if answer is not None and answer != letters[index]:
            raise DataError(f"{where}: row {i + 1}: 'answer' {answer!r} disagrees with 'answer_index' {index}")
        answer = letters[index]
    if not (isinstance(answer, str) and len(answer) == 1 and answer in letters):
        raise DataError(f"{where}: row {i + 1}: needs 'answer' (one of {letters}) or 'answer_index'")
    if not isinstance(row.get("question"), str):
        raise DataError(f"{where}: row {i + 1}: 'question' must be a string")
    return {
        "id": str(row.get("question_id", f"mmlu-pro-{i}")),
        "question": row["question"],
        "options": list(options),
        "answer": answer,
        "category": str(row.get("category") or "general knowledge"),
        "cot": row.get("cot_content") or "",
    }


def load_mmlu_pro(source: str, split: str = "test") -> list[dict]:
    """MMLU-Pro rows from `source`: "hub" (`split` "test" or "validation") or a jsonl file."""
    if source == "hub":
        raw, where = load_hub(MMLU_PRO_HUB, None, split), f"{MMLU_PRO_HUB}[{split}]"
    else:
        raw, where = read_jsonl(source, ("question", "options")), str(Path(source).expanduser())
    return [_mmlu_pro_row(row, i, where) for i, row in enumerate(raw)]


def _gpqa_row(row: dict, i: int, where: str, seed: int) -> dict:
    keys = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
    for key in keys:
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise DataError(f"{where}: row {i + 1}: field {key!r} must be a non-empty string")
    question = row["Question"].strip()
    qid = str(row.get("Record ID") or hashlib.sha256(question.encode()).hexdigest()[:16])
    correct = row["Correct Answer"].strip()
    options = [correct] + [row[k].strip() for k in keys[2:]]
    random.Random(f"{seed}:{qid}").shuffle(options)
    return {
        "id": qid,
        "question": question,
        "options": options,
        "answer": LETTERS[options.index(correct)],
        "category": str(row.get("High-level domain") or ""),
        "cot": "",
    }


def load_gpqa(source: str, seed: int = 0) -> list[dict]:
    """GPQA-Diamond rows from `source` ("hub" or a jsonl file), options shuffled by `seed`."""
    if source == "hub":
        raw, where = load_hub(GPQA_HUB, GPQA_CONFIG, "train"), f"{GPQA_HUB}/{GPQA_CONFIG}"
    else:
        raw, where = read_jsonl(source, ("Question", "Correct Answer")), str(Path(source).expanduser())
    return [_gpqa_row(row, i, where, seed) for i, row in enumerate(raw)]


# --- prompts -------------------------------------------------------------------------------


def _question_block(row: dict) -> str:
    options = "".join(f"{letter}. {option}\n" for letter, option in zip(LETTERS, row["options"]))
    return f"Question: {row['question']}\nOptions:\n{options}{COT_START}"


def _worked_answer(shot: dict) -> str:
    """A shot's reasoning after "Let's think step by step.", ending in "The answer is (X)."."""
    cot = re.sub(r"^\s*A:\s*", "", shot["cot"])
    cot = re.sub(r"^Let's think step by step\.\s*", "", cot).strip()
    return cot or f"The answer is ({shot['answer']})."


def mmlu_pro_shots(validation: list[dict], category: str, k: int = N_SHOTS) -> list[dict]:
    """The first `k` validation rows of `category` (MMLU-Pro's shots are per category)."""
    shots = [row for row in validation if row["category"] == category][:k]
    if len(shots) < k:
        raise DataError(f"MMLU-Pro validation: only {len(shots)} rows of category {category!r}, need k={k}")
    return shots


def mmlu_pro_prompt(row: dict, shots: list[dict]) -> str:
    """The k-shot chain-of-thought prompt; the model continues after "Let's think step by step."."""
    worked = "".join(f"{_question_block(s)} {_worked_answer(s)}\n\n" for s in shots)
    return MMLU_PRO_INSTRUCTION.format(category=row["category"]) + worked + _question_block(row)


def gpqa_prompt(row: dict) -> str:
    """The 0-shot chain-of-thought prompt for a (shuffled) GPQA row."""
    letters = LETTERS[: len(row["options"])]
    return GPQA_INSTRUCTION.format(letters=", ".join(letters[:-1]) + " or " + letters[-1]) + _question_block(row)


# --- answers -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _patterns(letters: str) -> list[re.Pattern]:
    """Answer patterns, most to least explicit; each captures the letter."""
    L, either_case = f"[{letters}]", f"[{letters}{letters.lower()}]"
    end = r"(?![A-Za-z0-9])"
    return [
        re.compile(rf"(?i:answer\s+is)[\s:*]*\(\s*({either_case})\s*\)"),  # the answer is (B)
        re.compile(rf"(?i:answer\s+is)[\s:*]*({L}){end}"),  # the answer is B
        re.compile(rf"(?i:answer)\**\s*:[\s*]*\(?({L}){end}"),  # Answer: B / **Answer:** (B)
        re.compile(rf"\\boxed\{{\s*(?:\\text\{{)?\s*\(?({L})\)?\s*\}}"),  # \boxed{B}
        re.compile(rf"\(({L})\)"),  # ... (B) ...
        re.compile(rf"(?<![A-Za-z0-9])({L}){end}"),  # ... B ...
    ]


def extract_choice(text: str, n_options: int) -> str | None:
    """The letter a model chose among the first `n_options` letters, or None.

    The most explicit phrasing present wins: "answer is (X)", then "answer is X", "Answer: X",
    "\\boxed{X}", a standalone "(X)", a standalone capital letter. Within one phrasing the last
    occurrence wins (models revise themselves).
    """
    if not 1 <= n_options <= len(LETTERS):
        raise ValueError(f"extract_choice: n_options must be in [1, {len(LETTERS)}], got {n_options}")
    for pattern in _patterns(LETTERS[:n_options]):
        matches = pattern.findall(text)
        if matches:
            return matches[-1].upper()
    return None


def score(row: dict, completion: str) -> bool:
    """Whether `completion` picks the row's answer. A few-shot completion that runs on into a new
    "Question:" is cut there first."""
    return extract_choice(completion.split("\nQuestion:")[0], len(row["options"])) == row["answer"]
