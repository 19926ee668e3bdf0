"""The two tasks of the ASRD comparison, as prompt / response pairs with exact-match scoring.

- ``arithmetic``: the generated arithmetic problems of the SFT mixture (``data/sft``; the
  same problems Table 1 scores), answer extracted after ``####``. The paper profile's hub
  mixture has none: they are generated with the same settings instead (``arithmetic_sets``).
- ``spelling``: a generated text task. A number is to be written in English words:

      prompt:   "Write 347 in words."
      response: "three hundred forty-seven"

  Correct when the generated words equal the reference (case and spacing ignored). The
  evaluation numbers are held out: no training example uses them, so the model has to compose
  the words of an unseen number from the parts it learned.

For a masked diffusion model every example becomes one fixed-layout sequence

    [ prompt, left-padded to prompt_tokens | response + EOS, right-padded with EOS to response_tokens ]

so the generated span always starts at the same position.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tadm.runtime import CPU
from tadm.data import arithmetic
from tadm.errors import ConfigError, DataError
from tadm.config import SftConfig
from tadm.data.sft import sft_rows, split_examples
from tadm.io import atomic_write_text, write_manifest

TASKS = ("arithmetic", "spelling")
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_TEMPLATES = ("Write {n} in words.", "Spell out the number {n}.", "How do you write {n} in words?")


@dataclass
class TaskSet:
    name: str
    prompts: list[str]
    responses: list[str]  # references (training targets)
    answers: list[str]  # what the scorer compares against

    def __len__(self) -> int:
        return len(self.prompts)

    def score(self, i: int, text: str) -> bool:
        if self.name == "arithmetic":
            return arithmetic.is_correct(text, self.answers[i])
        return text.lower().split() == self.answers[i].lower().split()


def number_words(n: int) -> str:
    """English words of 0 <= n <= 999 (American style: "three hundred forty-seven")."""
    if not 0 <= n <= 999:
        raise ValueError(f"number_words covers 0..999, got {n}")
    hundreds, rest = divmod(n, 100)
    words = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest or not hundreds:
        tens, ones = divmod(rest, 10)
        words.append(_ONES[rest] if rest < 20 else _TENS[tens] + (f"-{_ONES[ones]}" if ones else ""))
    return " ".join(words)


def spelling_sets(n_train: int, n_eval: int, seed: int, max_number: int) -> tuple[TaskSet, TaskSet]:
    """Train / evaluation sets of the spelling task, deterministic under `seed`; the evaluation
    numbers (one prompt each) never occur in training."""
    if n_eval >= max_number:
        raise ConfigError("asrd.spelling_eval", f"must be below spelling_max ({max_number}) to leave training numbers, got {n_eval}")
    rng = random.Random(seed)
    held = rng.sample(range(1, max_number + 1), n_eval)
    kept = sorted(set(range(1, max_number + 1)) - set(held))

    def make(numbers: list[int]) -> TaskSet:
        prompts = [rng.choice(_TEMPLATES).format(n=n) for n in numbers]
        words = [number_words(n) for n in numbers]
        return TaskSet("spelling", prompts, words, words)

    return make([rng.choice(kept) for _ in range(n_train)]), make(held)


def arithmetic_sets(sft_dir: str | Path, limit: int = 0, sft: SftConfig | None = None,
                    seed: int = 0) -> tuple[TaskSet, TaskSet]:
    """The SFT mixture's arithmetic problems: (train, evaluation) with at most `limit` evaluated.

    A hub mixture (`sft` with source "hub", the paper profile) holds no generated arithmetic:
    the problems are then generated here exactly as the offline mixture holds them
    (sft.arithmetic_* and the global `seed`, split by the same id hash)."""
    if sft is not None and sft.source == "hub":
        examples = arithmetic.generate(sft.arithmetic_examples, sft.arithmetic_max_operand, seed, sft.arithmetic_max_ops,
                                       sft.arithmetic_ops)
        splits = split_examples(examples, sft.validation_fraction)
        out = [splits["train"], splits["validation"][:limit] if limit else splits["validation"]]
        if not all(out):
            raise DataError(f"sft.arithmetic_examples: {sft.arithmetic_examples} problems leave an empty split for asrd")
        return tuple(TaskSet("arithmetic", [r["prompt"] for r in rows], [r["response"] for r in rows],
                             [r["answer"] for r in rows]) for rows in out)
    out = []
    for split in ("train", "validation"):
        path = Path(sft_dir) / f"{split}.jsonl"
        if not path.is_file():
            raise DataError(f"{path} is missing: run the sft stage first (dvc repro sft)")
        rows = sft_rows(sft_dir, split, "arithmetic")
        if not rows:
            raise DataError(f"{path}: holds no arithmetic problems (sft.arithmetic_examples is 0?)")
        if split == "validation" and limit:
            rows = rows[:limit]
        out.append(TaskSet("arithmetic", [r["prompt"] for r in rows], [r["response"] for r in rows],
                           [r["answer"] for r in rows]))
    return out[0], out[1]


class Layout:
    """Encodes prompts (and responses) into the fixed [prompt | response] layout and decodes
    generated spans; `eos` pads both parts."""

    def __init__(self, tokenizer, prompt_tokens: int, response_tokens: int):
        self.tok, self.P, self.R = tokenizer, prompt_tokens, response_tokens
        self.eos = tokenizer.eos_token_id
        if self.eos is None:
            raise DataError("asrd tokenizer: has no EOS token (needed to end and pad responses)")

    @property
    def length(self) -> int:
        return self.P + self.R

    @property
    def region(self) -> torch.Tensor:
        """(L,) bool: the response positions."""
        r = torch.zeros(self.length, dtype=torch.bool, device=CPU)
        r[self.P:] = True
        return r

    def _ids(self, texts: list[str]) -> list[list[int]]:
        return self.tok(list(texts), add_special_tokens=False)["input_ids"]

    def encode(self, prompts: list[str], responses: list[str] | None = None) -> torch.Tensor:
        """(N, P + R) long; without responses the response part is EOS (to be generated)."""
        out = np.full((len(prompts), self.length), self.eos, dtype=np.int64)
        for i, ids in enumerate(self._ids(prompts)):
            if len(ids) > self.P:
                raise ConfigError("asrd.prompt_tokens", f"prompt {i} has {len(ids)} tokens, more than {self.P}: {prompts[i][:60]!r}")
            out[i, self.P - len(ids): self.P] = ids
        if responses is not None:
            for i, ids in enumerate(self._ids(responses)):
                if len(ids) + 1 > self.R:
                    raise ConfigError("asrd.response_tokens", f"response {i} needs {len(ids) + 1} tokens with EOS, more than {self.R}")
                out[i, self.P: self.P + len(ids)] = ids
        return torch.from_numpy(out)

    def decode(self, tokens: torch.Tensor) -> list[str]:
        """The generated responses (up to the first EOS) of (N, P + R) canvases."""
        texts = []
        for row in tokens[:, self.P:].tolist():
            if self.eos in row:
                row = row[: row.index(self.eos)]
            texts.append(self.tok.decode(row, skip_special_tokens=True))
        return texts


def dump(sets: dict[str, TaskSet], out_dir: Path, params: dict) -> dict:
    """Write the task sets to ``<out_dir>/tasks.jsonl`` (one row per example) and the stage's
    ``manifest.json`` (counts per set, `params`, file hashes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"task": s.name, "split": name, "prompt": p, "response": r, "answer": a}
            for name, s in sets.items() for p, r, a in zip(s.prompts, s.responses, s.answers)]
    atomic_write_text(out_dir / "tasks.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return write_manifest(out_dir, "asrd_model", {name: len(s) for name, s in sets.items()}, params,
                          files=[out_dir / "tasks.jsonl"])
