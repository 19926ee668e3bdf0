"""d²Cache's certainty prior (Kamichanw/d2Cache @72feb60, `certainty_density` of
`src/utils/common.py`, written from reading it): how surrounded by decided positions each
position of the generated region is. Its decoder ranks the masked positions by confidence x
density (`tadm.asrd.decode`, ``DecodeSettings.certainty_sigma``); its cache ranks the rows it
recomputes by the first pass's confidence x density (`tadm.caches.llada.d2cache`)."""

from __future__ import annotations

import torch
from torch import Tensor


def certainty_density(decided: Tensor, sigma: float) -> Tensor:
    """The release's certainty density of `decided` (B, G) bool: for each position j,
    sum_u ext[u] g(j - u) / Z over u in [-G, 2G), with g(d) = exp(-d^2 / (2 sigma^2)), ext 1 left
    of the span, `decided` on it and, right of it, 1 if the last position is decided else 0;
    Z = sum of g(d) over d in [-3G, 3G) (the release's FFT normalisation)."""
    b, g = decided.shape
    device = decided.device
    u = torch.arange(-g, 2 * g, device=device, dtype=torch.float64)
    j = torch.arange(g, device=device, dtype=torch.float64)
    kernel = torch.exp(-((j[:, None] - u[None, :]) ** 2) / (2 * sigma ** 2))  # (G, 3G)
    d = torch.arange(-3 * g, 3 * g, device=device, dtype=torch.float64)
    z = torch.exp(-(d ** 2) / (2 * sigma ** 2)).sum()
    right = decided[:, -1:].to(torch.float64).expand(b, g)
    ext = torch.cat([torch.ones(b, g, dtype=torch.float64, device=device), decided.to(torch.float64), right], dim=1)
    return (ext @ kernel.T / z).to(torch.float32)
