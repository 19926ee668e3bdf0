"""Anchor-guided generation: an anchor signal added to the masked positions' input embeddings.

For each sequence the anchor tokens' embeddings are averaged with weights
softmax(-H_a) over the anchors a (H_a the entropy of a's latest prediction: confident anchors
weigh more), giving the *anchor centroid* g (d,). Before the model call, each masked
(undecided) position l of the sequence gets

    e_l  <-  e_l + w * (H_l / log V) * g

where w is the guidance weight and H_l / log V the normalised entropy of l's latest prediction
(1 before l was ever predicted): the more uncertain a position, the more anchor signal it gets.
An empty cache gives g = 0, so the signal is exactly zero; w = 0 turns guidance off.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def anchor_centroid(embeddings: Tensor, member: Tensor, entropy: Tensor) -> Tensor:
    """Entropy-weighted mean of the anchors' embeddings (B, L, d) -> (B, d); 0 with no anchor."""
    logits = (-entropy.to(embeddings.dtype)).masked_fill(~member, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0)  # rows without anchors: 0
    weights = weights.masked_fill(~member, 0.0)
    return torch.einsum("bl,bld->bd", weights, embeddings)


def guidance_signal(centroid: Tensor, targets: Tensor, entropy: Tensor, weight: float, vocab_size: int) -> Tensor:
    """The additive embedding signal (B, L, d): w * (H_l / log V) * g at `targets` (B, L) bool,
    0 elsewhere. `entropy` (B, L) may hold inf for never-predicted positions (strength 1)."""
    strength = (entropy / math.log(vocab_size)).clamp(0.0, 1.0).nan_to_num(1.0)
    strength = torch.where(torch.isfinite(entropy), strength, torch.ones_like(strength))
    scale = (weight * strength * targets).to(centroid.dtype)
    return scale.unsqueeze(-1) * centroid.unsqueeze(1)
