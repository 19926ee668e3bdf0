"""Anchor-perturbed verification: shake an uncertain candidate's input; remask it if it flips.

A decided, not yet trusted token x at position l (a *pending candidate*) is fed with a
perturbation delta_l orthogonal to its own embedding e(x):

    delta_l = rho * ||e(x)|| * u / ||u||,   u = n - (n.e / e.e) e,   n ~ N(0, I_d)

so the push carries no component along (or against) the token itself: only the context of
the candidate, and the candidate's robustness to noise in unrelated directions, decide
whether the model still predicts x at l. One extra model pass reads all pending candidates of
the batch at once; a candidate *survives* when the model's argmax at l is still x, otherwise
it is remasked (and leaves the anchor cache).

How l is read depends on the model: a uniform-state model (DiffusionGemma) is trained to
predict every position, so l keeps its token, e(x) + delta_l; an absorbing-state model
(MDLM, TADM) is trained to predict masked positions only, so l is presented as the mask,
e(m) + delta_l (still orthogonal to e(x)), and the check is whether the model, without seeing
x and under the push, re-derives it. rho = 0 turns verification off (no pass is made).
"""

from __future__ import annotations

import torch
from torch import Tensor


def orthogonal_perturbation(embeddings: Tensor, scale: float, generator: torch.Generator) -> Tensor:
    """delta (N, d) with delta_i . e_i = 0 and ||delta_i|| = scale * ||e_i|| for rows e_i of
    `embeddings` (N, d); computed in float64 and returned in the embeddings' dtype."""
    e = embeddings.detach().to(torch.float64)
    noise = torch.randn(e.shape, generator=generator, dtype=torch.float64, device=e.device)
    norm2 = (e * e).sum(-1, keepdim=True)
    along = torch.where(norm2 > 0, (noise * e).sum(-1, keepdim=True) / norm2.clamp_min(1e-300), torch.zeros_like(norm2))
    u = noise - along * e
    u = u / u.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return (scale * e.norm(dim=-1, keepdim=True) * u).to(embeddings.dtype)


def survivors(logits: Tensor, tokens: Tensor) -> Tensor:
    """Candidates (N,) whose prediction under perturbation is still their token: the argmax of
    their logits (N, V) equals `tokens` (N,)."""
    return logits.argmax(-1) == tokens
