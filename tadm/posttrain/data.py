"""SFT canvases as DiffusionGemma training batches, and the arithmetic evaluation set.

The ``sft`` stage stores, per split, the token stream of every example (prompt then response
+ EOS), its offsets, and ``canvases_per_example`` canvases (example, block start, time t).
A canvas becomes one block-diffusion training example:

    context = prompt + response[:start]     (the encoder's causal prefix; last tokens kept; the
                                             prompt is a no-think chat turn, tadm.data.chat)
    target  = response[start : start + C]   (the canvas; past the response it is EOS padding)

Contexts are left-padded to the longest in the batch with a mask, as ``generate`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tadm.runtime import CPU
from tadm.errors import ConfigError, DataError
from tadm.data.sft import load_split_arrays, sft_rows


@dataclass
class CanvasBatch:
    context: torch.Tensor  # (B, P) token ids, left-padded
    context_mask: torch.Tensor  # (B, P) bool, False on padding
    target: torch.Tensor  # (B, C) clean canvas
    t: torch.Tensor  # (B,) the canvas' noise level from the sft stage

    def to(self, device) -> "CanvasBatch":
        return CanvasBatch(*(x.to(device) for x in (self.context, self.context_mask, self.target, self.t)))

    @property
    def decoder_mask(self) -> torch.Tensor:
        """Attention mask over (context, canvas) for the decoder."""
        ones = torch.ones_like(self.target, dtype=torch.bool)
        return torch.cat([self.context_mask, ones], dim=1)


class SftCanvases:
    """One split of ``data/sft`` as canvases of `canvas_length` tokens."""

    def __init__(self, sft_dir: str | Path, split: str, canvas_length: int, max_context: int, pad_id: int):
        sft_dir = Path(sft_dir)
        m, arrays = load_split_arrays(sft_dir, split)  # checked against the sft manifest
        stored = m["params"].get("canvas_length")
        if stored != canvas_length:
            raise ConfigError("posttrain.canvas_length", f"must equal the SFT canvases' length sft.canvas_length ({stored}), got {canvas_length}")
        self.tokens, self.offsets, self.canvases = arrays.tokens, arrays.offsets, arrays.canvases
        self.canvas_length, self.max_context, self.pad_id = canvas_length, max_context, pad_id

    def __len__(self) -> int:
        return len(self.canvases)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(context, target, t) of canvas `i`."""
        ex, start, t = self.canvases[i]
        o = self.offsets[ex]
        seq = self.tokens[o["start"]: o["start"] + o["prompt_len"] + o["response_len"]]
        cut = int(o["prompt_len"]) + int(start)
        context = np.asarray(seq[max(0, cut - self.max_context): cut])
        target = np.full(self.canvas_length, self.pad_id, dtype=np.int64)
        piece = np.asarray(seq[cut: cut + self.canvas_length])
        target[: len(piece)] = piece
        return context, target, float(t)

    def batch(self, indices: list[int]) -> CanvasBatch:
        rows = [self.example(i) for i in indices]
        width = max(1, max(len(c) for c, _, _ in rows))
        context = torch.full((len(rows), width), self.pad_id, dtype=torch.long, device=CPU)
        mask = torch.zeros((len(rows), width), dtype=torch.bool, device=CPU)
        for b, (c, _, _) in enumerate(rows):
            if len(c):
                context[b, width - len(c):] = torch.from_numpy(c.astype(np.int64))
                mask[b, width - len(c):] = True
        target = torch.from_numpy(np.stack([tgt for _, tgt, _ in rows]))
        t = torch.tensor([t for _, _, t in rows], dtype=torch.float32, device=CPU)
        return CanvasBatch(context, mask, target, t)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids, mask), left-padded to the longest (a prompt batch for ``generate``)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=CPU)
    mask = torch.zeros((len(sequences), width), dtype=torch.long, device=CPU)
    for b, s in enumerate(sequences):
        if not s:
            raise DataError(f"prompt {b} of the batch is empty after tokenization")
        ids[b, width - len(s):] = torch.tensor(s, device=CPU)
        mask[b, width - len(s):] = 1
    return ids, mask


def arithmetic_eval_set(sft_dir: str | Path, limit: int = 0) -> list[dict]:
    """The generated arithmetic problems of the SFT validation split (prompt, answer)."""
    path = Path(sft_dir) / "validation.jsonl"
    if not path.is_file():
        raise DataError(f"{path} is missing: run the sft stage first (dvc repro sft)")
    rows = sft_rows(sft_dir, "validation", "arithmetic")
    if not rows:
        raise DataError(f"{path}: holds no arithmetic problems (sft.arithmetic_examples is 0?)")
    return rows[:limit] if limit else rows
