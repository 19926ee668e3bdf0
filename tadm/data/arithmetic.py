"""A generated arithmetic task with checkable answers.

Each example mixes 1-3 integer operations (+, -, *) in one of two phrasings:

* ``expression``: "What is 12 + 7 * 3?" -- evaluated with the usual precedence
  (multiplications first, then additions and subtractions left to right);
* ``chain``: "Start with 12. Add 7, then multiply by 3. What number do you get?"
  -- the operations apply one after another, left to right.

The response shows one line per operation and ends with ``#### <int>``, the same final-answer
convention as GSM8K, so :func:`extract_answer` scores both.
"""

from __future__ import annotations

import random
import re

OPS = ("+", "-", "*")

# A number as written in a solution: optional sign (only when the "-" is not a binary minus
# glued to a word or digit), digits with optional thousands separators, optional decimals.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?|(?<=[\w.])\d+(?:,\d{3})*(?:\.\d+)?")

_EXPRESSION_TEMPLATES = (
    "What is {expr}?",
    "Compute {expr}.",
    "Evaluate the expression {expr}.",
    "Calculate the value of {expr}.",
)
_CHAIN_VERBS = {"+": "add {n}", "-": "subtract {n}", "*": "multiply by {n}"}
_CHAIN_ENDINGS = ("What number do you get?", "What is the result?", "What is the final number?")


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _step(a: int, op: str, b: int) -> tuple[int, str]:
    """Apply one operation; return the value and the working line that shows it."""
    c = _apply(a, op, b)
    return c, f"{a} {op} {b} = {c}"


def _solve_expression(nums: list[int], ops: list[str]) -> tuple[int, list[str]]:
    """Evaluate with precedence: reduce every `*` (leftmost first), then +/- left to right."""
    nums, ops, lines = list(nums), list(ops), []
    while "*" in ops:
        i = ops.index("*")
        c, line = _step(nums[i], "*", nums[i + 1])
        lines.append(line)
        nums[i : i + 2] = [c]
        del ops[i]
    value = nums[0]
    for op, b in zip(ops, nums[1:]):
        value, line = _step(value, op, b)
        lines.append(line)
    return value, lines


def _solve_chain(nums: list[int], ops: list[str]) -> tuple[int, list[str]]:
    """Apply the operations strictly left to right."""
    value, lines = nums[0], []
    for op, b in zip(ops, nums[1:]):
        value, line = _step(value, op, b)
        lines.append(line)
    return value, lines


def _example(rng: random.Random, max_operand: int, max_ops: int = 3, op_set: tuple[str, ...] = OPS) -> tuple[str, list[str], int]:
    """Draw one problem with 1..max_ops operations from `op_set`; return (prompt, working lines, answer)."""
    n_ops = rng.randint(1, max_ops)
    ops = [rng.choice(op_set) for _ in range(n_ops)]
    nums = [rng.randint(1, max_operand) for _ in range(n_ops + 1)]
    if rng.random() < 0.5:
        expr = " ".join([str(nums[0])] + [f"{op} {n}" for op, n in zip(ops, nums[1:])])
        prompt = rng.choice(_EXPRESSION_TEMPLATES).format(expr=expr)
        answer, lines = _solve_expression(nums, ops)
        if "*" in ops and n_ops > 1:
            lines[0] = "Multiply first: " + lines[0]
    else:
        steps = [_CHAIN_VERBS[op].format(n=n) for op, n in zip(ops, nums[1:])]
        steps[0] = steps[0][0].upper() + steps[0][1:]
        prompt = f"Start with {nums[0]}. {', then '.join(steps)}. {rng.choice(_CHAIN_ENDINGS)}"
        answer, lines = _solve_chain(nums, ops)
    return prompt, lines, answer


def generate(n: int, max_operand: int, seed: int, max_ops: int = 3, ops: tuple[str, ...] | list[str] = OPS) -> list[dict]:
    """`n` arithmetic examples with operands in [1, max_operand] and 1..max_ops operations
    drawn from `ops` (a subset of + - *), deterministic under `seed`."""
    if n < 0 or max_operand < 1 or max_ops < 1:
        raise ValueError(f"need n >= 0, max_operand >= 1 and max_ops >= 1, got n={n}, max_operand={max_operand}, max_ops={max_ops}")
    if not ops or set(ops) - set(OPS):
        raise ValueError(f"ops must be a non-empty subset of {OPS}, got {ops!r}")
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        prompt, lines, answer = _example(rng, max_operand, max_ops, tuple(ops))
        examples.append({
            "id": f"arith-{i}",
            "source": "arithmetic",
            "category": "math",
            "prompt": prompt,
            "response": "\n".join(lines + [f"#### {answer}"]),
            "answer": str(answer),
        })
    return examples


# --------------------------------------------------------------------------- scoring


def _normalize(number: str) -> str:
    """Canonical form of a written number: no separators, no trailing decimal zeros."""
    number = number.replace(",", "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    if number in ("-0", ""):
        number = "0"
    return number


def extract_answer(text: str) -> str | None:
    """The number after the last ``####``; failing that, the last number in `text`.

    Returned in canonical form ("1,234.50" -> "1234.5", "5.00" -> "5"); None if `text` holds
    no number at all.
    """
    head, sep, tail = text.rpartition("####")
    if sep:
        match = _NUMBER.search(tail)
        if match:
            return _normalize(match.group())
    numbers = _NUMBER.findall(text)
    return _normalize(numbers[-1]) if numbers else None


def is_correct(text: str, answer: str | int) -> bool:
    """Whether the answer extracted from `text` equals the reference `answer`."""
    predicted = extract_answer(text)
    reference = extract_answer(str(answer))
    return predicted is not None and predicted == reference
