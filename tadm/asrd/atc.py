"""The Anchor Tokens Cache (ATC): generated tokens trusted because their prediction held still.

Each model pass yields, per position, the model's prediction (argmax) and its entropy. The
cache keeps per position a *streak*: the number of consecutive passes in which the prediction
was the same (1 on the first observation, or after a change). A generated, decided token is
*eligible* when its prediction has been the same for at least ``window`` (k) passes and equals
the token on the canvas. The cache holds at most ``capacity`` eligible tokens per sequence,
the ones whose latest prediction had the lowest entropy; membership is recomputed after every
step, so a token whose prediction changes (or that is remasked) leaves at once.

What counts as an observation depends on the model (``observed``): a uniform-state model
(DiffusionGemma) predicts every position, so decided tokens keep being checked; an
absorbing-state model (MDLM, TADM) predicts only masked positions -- its output at a visible
token is untrained (SUBS copies the token) -- so a decided token's streak is the one it had
when it was committed, and it can only leave by being remasked.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tadm.runtime import CPU


class AnchorTokensCache:
    """Per-sequence anchor tokens of one batched trajectory; ``start`` before each trajectory."""

    def __init__(self, capacity: int = 16, window: int = 2):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.capacity, self.window = capacity, window
        self.streak: Tensor | None = None  # (B, L) long
        self.last_pred: Tensor | None = None  # (B, L) long, -1 = never observed
        self.entropy: Tensor | None = None  # (B, L) float, entropy of the latest observed prediction
        self.member: Tensor | None = None  # (B, L) bool

    def start(self, shape: tuple[int, int], device: torch.device | str = CPU) -> None:
        self.streak = torch.zeros(shape, dtype=torch.long, device=device)
        self.last_pred = torch.full(shape, -1, dtype=torch.long, device=device)
        self.entropy = torch.full(shape, float("inf"), dtype=torch.float32, device=device)
        self.member = torch.zeros(shape, dtype=torch.bool, device=device)

    @property
    def size(self) -> Tensor:
        """Anchors per sequence (B,)."""
        return self.member.sum(-1)

    @property
    def empty(self) -> bool:
        return not bool(self.member.any())

    def observe(self, pred: Tensor, entropy: Tensor, observed: Tensor) -> None:
        """One pass: predictions (B, L), their entropies (B, L), and where they count (B, L) bool."""
        same = pred == self.last_pred
        streak = torch.where(same, self.streak + 1, torch.ones_like(self.streak))
        self.streak = torch.where(observed, streak, self.streak)
        self.last_pred = torch.where(observed, pred, self.last_pred)
        self.entropy = torch.where(observed, entropy.to(self.entropy.dtype), self.entropy)

    def forget(self, where: Tensor) -> None:
        """Positions (B, L) bool that were remasked: their history is gone, they leave the cache."""
        self.streak = self.streak.masked_fill(where, 0)
        self.last_pred = self.last_pred.masked_fill(where, -1)
        self.member = self.member & ~where

    def eligible(self, tokens: Tensor, decided: Tensor, region: Tensor) -> Tensor:
        """Decided generated tokens (B, L) whose prediction held for >= window passes and is the token."""
        return region & decided & (self.last_pred == tokens) & (self.streak >= self.window)

    def select(self, tokens: Tensor, decided: Tensor, region: Tensor) -> Tensor:
        """Recompute membership: the <= capacity lowest-entropy eligible tokens of each sequence."""
        eligible = self.eligible(tokens, decided, region)
        k = min(self.capacity, tokens.shape[1])
        score = self.entropy.masked_fill(~eligible, float("inf"))
        # stable ordering: ties (equal entropy) go to the leftmost position
        order = torch.sort(score, dim=-1, stable=True).indices[:, :k]
        member = torch.zeros_like(eligible).scatter_(1, order, True)
        self.member = member & eligible
        return self.member
