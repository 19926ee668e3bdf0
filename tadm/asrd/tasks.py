"""The two tasks of the ASRD comparison, as prompt / response pairs with exact-match scoring.

- ``arithmetic``: the generated arithmetic problems of the SFT mixture (``data/sft``; the
  same problems Table 1 scores), answer extracted after ``####``.
- ``reversal``: a generated text task. A line of `min_words`..`max_words` words drawn from
  the corpus' most frequent words is to be written back in reverse word order:

      prompt:   "Reverse the words: good night sweet prince"
      response: "prince sweet night good"

  Correct when the generated words equal the reversed line exactly. Train and evaluation
  lines are drawn from one seeded stream and never overlap.

For a masked diffusion model every example becomes one fixed-layout sequence

    [ prompt, left-padded to prompt_tokens | response + EOS, right-padded with EOS to response_tokens ]

so the generated span always starts at the same position.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tadm.data import arithmetic
from tadm.errors import ConfigError, DataError
from tadm.io import atomic_write_text, read_jsonl

TASKS = ("arithmetic", "reversal")
REVERSAL_PREFIX = "Reverse the words: "
_WORD = re.compile(r"[a-z]+")


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
        return text.split() == self.answers[i].split()


def frequent_words(corpus_file: str | Path, n: int, min_length: int = 2) -> list[str]:
    """The `n` most frequent lowercase alphabetic words of a JSON-lines corpus (ties by word)."""
    path = Path(corpus_file)
    if not path.is_file():
        raise DataError(f"{path} is missing: run the corpus stage first (dvc repro corpus)")
    counts: Counter[str] = Counter()
    for row in read_jsonl(path):
        counts.update(w for w in _WORD.findall(row["text"].lower()) if len(w) >= min_length)
    words = sorted(counts, key=lambda w: (-counts[w], w))[:n]
    if len(words) < n:
        raise DataError(f"{path}: only {len(words)} distinct words, asrd.reversal_vocabulary asks for {n}")
    return words


def reversal_sets(words: list[str], n_train: int, n_eval: int, seed: int, min_words: int, max_words: int
                  ) -> tuple[TaskSet, TaskSet]:
    """Disjoint train / evaluation sets of the reversal task, deterministic under `seed`."""
    rng, seen, lines = random.Random(seed), set(), []
    space = len(words) ** min_words
    if n_train + n_eval > space // 2:
        raise ConfigError("asrd.reversal_train", f"{n_train + n_eval} lines asked from a space of about {space}")
    while len(lines) < n_train + n_eval:
        line = tuple(rng.choice(words) for _ in range(rng.randint(min_words, max_words)))
        if line not in seen:
            seen.add(line)
            lines.append(line)

    def make(chunk: list[tuple[str, ...]]) -> TaskSet:
        rev = [" ".join(reversed(line)) for line in chunk]
        return TaskSet("reversal", [REVERSAL_PREFIX + " ".join(line) for line in chunk], rev, rev)

    return make(lines[:n_train]), make(lines[n_train:])


def arithmetic_sets(sft_dir: str | Path, limit: int = 0) -> tuple[TaskSet, TaskSet]:
    """The SFT mixture's arithmetic problems: (train, evaluation) with at most `limit` evaluated."""
    out = []
    for split in ("train", "validation"):
        path = Path(sft_dir) / f"{split}.jsonl"
        if not path.is_file():
            raise DataError(f"{path} is missing: run the sft stage first (dvc repro sft)")
        rows = [r for r in read_jsonl(path) if r.get("source") == "arithmetic"]
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
        r = torch.zeros(self.length, dtype=torch.bool)
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


def manifest(sets: dict[str, TaskSet]) -> dict:
    return {name: len(s) for name, s in sets.items()}


def dump(sets: dict[str, TaskSet], path: Path) -> None:
    rows = [{"task": s.name, "split": name, "prompt": p, "response": r, "answer": a}
            for name, s in sets.items() for p, r, a in zip(s.prompts, s.responses, s.answers)]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
