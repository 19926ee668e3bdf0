"""MDLM (Sahoo et al., 2024): one DiT over the noisy sequence, no time conditioning.

    z_t (B, L) -> embedding (V+1, d) -> mdlm_layers DiT blocks -> final layer -> (B, L, V+1)

The loss / sampler apply the SUBS parameterisation (mask logit -inf, unmasked positions copied);
this module only produces raw logits (or, given a training `Readout`, runs its head on the
scored rows only).
"""

from __future__ import annotations

import torch

from tadm.config import ModelConfig
from tadm.losses import Readout
from tadm.models.base import TadmModel
from tadm.models.dit import ConditionEmbedder, DiTFinalLayer, DiTStack, token_embedding


class MDLM(TadmModel):
    model_type = "mdlm"

    def __init__(self, cfg: ModelConfig, vocab_size: int, seq_len: int):
        super().__init__(cfg, vocab_size, seq_len)
        d = cfg.d_model
        self.embed = token_embedding(vocab_size + 1, d)  # + the mask token
        self.cond = ConditionEmbedder()
        self.blocks = DiTStack(cfg.mdlm_layers, d, cfg.n_heads, cfg.mlp_ratio, dropout=cfg.dropout, gelu=cfg.gelu)
        self.final = DiTFinalLayer(d, vocab_size + 1)

    def hidden(self, z_t: torch.Tensor) -> torch.Tensor:
        """z_t: (B, L) token ids in 0..V -> the last block's output (B, L, d)."""
        return self.blocks(self.embed(z_t), self.cond())

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The output head on hidden states (..., N, d) -> logits (..., N, V+1); samplers apply
        it only to the positions they read."""
        return self.final(x, self.cond())

    def forward(self, z_t: torch.Tensor, readout: Readout | None = None) -> torch.Tensor:
        """z_t: (B, L) token ids in 0..V -> logits (B, L, V+1).

        With a `readout` (training / validation) the head runs only on the readout's rows and
        the result is ``readout(hidden, head)``, a per-sequence loss sum (B,)."""
        h = self.hidden(z_t)
        return self.head(h) if readout is None else readout(h, self.head)
