"""TADM:Pretraining's fusion module Phi (paper App. C.2): a gated residual MLP.

    s = LN(c_t)          current shallow state (the token embedding of z_t)
    a = LN(h_t')         the cached, possibly stale anchor
    u = [s; a]           (2d)
    h~ = h_t' + sigmoid(W_g u + b_g) * Delta(u),   Delta = Linear(2d, 4d) -> GELU -> Linear(4d, d)

The residual is on the anchor: Phi keeps the deep cached state and corrects it, per channel,
with what the current canvas says. No time conditioning. Sizes at d = 768: 8.27M parameters.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class Fusion(nn.Module):
    def __init__(self, d_model: int, hidden_ratio: int = 4):
        super().__init__()
        self.norm_c = nn.LayerNorm(d_model)
        self.norm_h = nn.LayerNorm(d_model)
        self.gate = nn.Linear(2 * d_model, d_model)
        self.delta = nn.Sequential(
            nn.Linear(2 * d_model, hidden_ratio * d_model),
            nn.GELU(),
            nn.Linear(hidden_ratio * d_model, d_model),
        )

    def correction(self, c_t: torch.Tensor, h_tprime: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate, Delta), both (B, L, d): h~ = h_t' + gate * Delta (for inspection)."""
        u = torch.cat([self.norm_c(c_t), self.norm_h(h_tprime)], dim=-1)
        return torch.sigmoid(self.gate(u)), self.delta(u)

    def forward(self, c_t: torch.Tensor, h_tprime: torch.Tensor) -> torch.Tensor:
        """c_t, h_tprime: (B, L, d) -> fused representation h~ (B, L, d)."""
        gate, delta = self.correction(c_t, h_tprime)
        return h_tprime + gate * delta
