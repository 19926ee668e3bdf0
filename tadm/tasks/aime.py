"""AIME: competition math problems whose answers are integers from 0 to 999.

Rows are {"id", "problem", "answer" (int)}, from a local JSON-lines file with fields
``problem`` and ``answer`` or from a hub data set named by the user (AIME sets on the hub are
community uploads; ``Problem``/``Answer`` capitalised is accepted too). The model is asked to
put its final answer in ``\\boxed{}``; :func:`extract_integer` reads it back.
"""

from __future__ import annotations

import re
from pathlib import Path

from tadm.errors import DataError
from tadm.tasks.common import load_hub, read_jsonl

INSTRUCTION = "Please reason step by step. Put your final answer within \\boxed{}."

# A number in running text (thousands separators allowed), not part of a longer number.
_NUMBER = re.compile(r"(?<![\d.,])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d)")
_ANSWER_IS = re.compile(r"(?i:answer\s+is)[\s:*$]*(?:\\boxed\{)?\s*(-?\d+(?:\.\d+)?)")

__all__ = ["load_aime", "prompt", "extract_integer", "score"]


def _field(row: dict, name: str):
    return row[name] if name in row else row.get(name.capitalize())


def _aime_row(row: dict, i: int, where: str) -> dict:
    problem, answer = _field(row, "problem"), _field(row, "answer")
    if not isinstance(problem, str) or not problem.strip():
        raise DataError(f"{where}: row {i + 1}: 'problem' must be a non-empty string")
    try:
        value = int(str(answer).strip())
    except ValueError:
        raise DataError(f"{where}: row {i + 1}: 'answer' must be an integer, got {answer!r}") from None
    if not 0 <= value <= 999:
        raise DataError(f"{where}: row {i + 1}: 'answer' must be in 0..999, got {value}")
    ident = _field(row, "id") or (f"aime-{row['problem_idx']}" if row.get("problem_idx") is not None else f"aime-{i}")
    return {"id": str(ident), "problem": problem, "answer": value}


def load_aime(source: str, split: str = "train") -> list[dict]:
    """AIME rows from a local jsonl file, or else from the hub data set id `source` (`split`)."""
    path = Path(source).expanduser()
    if path.suffix == ".jsonl" or path.exists():
        return [_aime_row(row, i, str(path)) for i, row in enumerate(read_jsonl(path))]
    return [_aime_row(row, i, f"{source}[{split}]") for i, row in enumerate(load_hub(source, None, split))]


def prompt(problem: str) -> str:
    """The 0-shot prompt: the problem, then the instruction to box the final answer."""
    return f"{problem.strip()}\n\n{INSTRUCTION}"


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, nested braces included, or None."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        depth, i = 1, start + len("\\boxed{")
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len("\\boxed{") : i - 1]
        start = text.rfind("\\boxed{", 0, start)  # unclosed (cut-off) box: try the one before
    return None


def _as_integer(number: str) -> int | None:
    """`number` as an int ("033" -> 33, "1,000" -> 1000, "33.0" -> 33), or None if not whole."""
    value = float(number.replace(",", ""))
    return int(value) if value.is_integer() else None


def _boxed_integer(content: str) -> int | None:
    """The integer a box holds ("33", "033", "n = 33", "\\text{33}", "33^\\circ"), or None when it
    holds something else (a fraction, an expression, a word)."""
    content = re.sub(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}", r"\1", content)
    content = re.sub(r"\$|\\[,!;: ]|\s|\^\{?\\circ\}?|\\%", "", content)
    content = re.sub(r"^[A-Za-z]\w*=", "", content)
    return _as_integer(content) if _NUMBER.fullmatch(content) else None


def _last_integer(text: str) -> int | None:
    for number in reversed(_NUMBER.findall(text)):
        value = _as_integer(number)
        if value is not None:
            return value
    return None


def extract_integer(text: str) -> int | None:
    """The model's final integer answer: the last ``\\boxed{}`` if it holds an integer, else the
    number after the last "answer is", else the last integer in the text; None if none."""
    boxed = _last_boxed(text)
    if boxed is not None and (value := _boxed_integer(boxed)) is not None:
        return value
    for number in reversed(_ANSWER_IS.findall(text)):
        if (value := _as_integer(number)) is not None:
            return value
    return _last_integer(text)


def score(row: dict, completion: str) -> bool:
    """Whether the completion's final integer equals the row's answer."""
    return extract_integer(completion) == row["answer"]
