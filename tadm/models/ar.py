"""Autoregressive baseline: the same DiT block, causal, at MDLM's width and depth.

    x (B, L) -> embedding (V, d) -> mdlm_layers causal DiT blocks -> final layer -> (B, L, V)

Logits at position i predict token i+1 (the shift is the loss's job). There is no mask token,
so the embedding has V rows and the head V outputs.
"""

from __future__ import annotations

import torch

from tadm.config import ModelConfig
from tadm.models.base import TadmModel
from tadm.models.dit import ConditionEmbedder, DiTFinalLayer, DiTStack, token_embedding


class AR(TadmModel):
    model_type = "ar"

    def __init__(self, cfg: ModelConfig, vocab_size: int, seq_len: int):
        super().__init__(cfg, vocab_size, seq_len)
        d = cfg.d_model
        self.embed = token_embedding(vocab_size, d)
        self.cond = ConditionEmbedder()
        self.blocks = DiTStack(cfg.mdlm_layers, d, cfg.n_heads, cfg.mlp_ratio, dropout=cfg.dropout, causal=True)
        self.final = DiTFinalLayer(d, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L) token ids in 0..V-1 -> next-token logits (B, L, V)."""
        c = self.cond()
        return self.final(self.blocks(self.embed(x), c), c)
