"""Naive anchor reuse: TADM's split and refresh schedule with the fusion bypassed, h = H0.

A reuse step runs S and D as TADM does but hands D the cached anchor unchanged. D reads only h,
the step's rotary / mask inputs and the encoder cache, which are the same within a canvas, so a
reuse step's logits are exactly its refresh step's: the row is "reuse the model's output K - 1
times", with only the sampler's temperature and draws moving between the steps. Its S and D calls
buy nothing, but the count keeps them, as the row is defined ("same split, fusion bypassed"), so
its layer calls are TADM's at the same K. K = 1 is the base bit for bit (every step refreshes).
"""

from __future__ import annotations

import torch
from torch import nn

from tadm.posttrain.anchored import TimeAnchoredDiffusionGemma
from tadm.posttrain.backbone import SplitDiffusionGemma


class BypassFusion(nn.Module):
    """Phi(c; C0, H0) = H0, with no parameters; keeps
    :class:`tadm.caches.diffusiongemma.base.AnchorFusion`, what TimeAnchoredDiffusionGemma and
    Table 1 read from a fusion."""

    values = "bypass"
    rank = 0

    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size

    def forward(self, c: torch.Tensor, c0: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        return h0

    def flops(self, tokens: int) -> int:
        return 0

    @property
    def fresh(self) -> bool:
        """Never applied at refresh steps (it would return the fresh anchor anyway)."""
        return False

    @property
    def num_parameters(self) -> int:
        return 0


def naive_model(base, p, refresh_every: int = 1) -> TimeAnchoredDiffusionGemma:
    """The base split as TADM's (posttrain.shared_layers / anchor_layers / denoiser_layers) with a
    :class:`BypassFusion`; ``generate(..., refresh_every=K)`` as TADM's."""
    pt = p.posttrain
    split = SplitDiffusionGemma(base, pt.shared_layers, pt.anchor_layers, pt.denoiser_layers)
    return TimeAnchoredDiffusionGemma(split, BypassFusion(split.hidden_size), refresh_every)
