"""ADLM (Rout et al., 2025): an anchor DiT that predicts tokens, then a denoiser DiT on its output.

    anchor:   z_t -> embedding (V+1, d) -> anchor_layers DiT blocks -> final layer -> anchor logits (V+1)
    denoiser: anchor logits -> Linear(V+1, d) -> denoiser_layers DiT blocks -> final layer -> logits (V+1)

As released (LituRout/ADLM, `models/denoiser.py`: a `vocab_embed = nn.Linear(vocab_size,
hidden_size)` applied to the backbone's raw logits, `adlm_diffusion.py`: `logits =
self.denoiser(self.backbone(x, sigma), sigma)`), the denoiser reads the anchor's *raw logits*
through a new Linear(V+1, d) -- no softmax, no sample -- so x_theta(z_t) = x_D(y_A(z_t)) is
differentiable end to end and both losses train the anchor. (An earlier version read the
softmax: with the anchor's zero-initialised final layer its Jacobian is ~1/V at the start, and
on the default profile ADLM then never left its unigram plateau, 0.07 nats below it after 800
steps.) z_t itself reaches the denoiser only through SUBS (unmasked positions copied).
"""

from __future__ import annotations

import torch

from tadm.config import ModelConfig
from tadm.losses import Readout
from tadm.models.base import TadmModel
from tadm.models.dit import ConditionEmbedder, DiTFinalLayer, DiTStack, token_embedding


class ADLM(TadmModel):
    model_type = "adlm"

    def __init__(self, cfg: ModelConfig, vocab_size: int, seq_len: int):
        super().__init__(cfg, vocab_size, seq_len)
        d, n_out = cfg.d_model, vocab_size + 1
        stack = dict(d_model=d, n_heads=cfg.n_heads, mlp_ratio=cfg.mlp_ratio, dropout=cfg.dropout, gelu=cfg.gelu)
        # anchor network
        self.embed = token_embedding(n_out, d)
        self.anchor_cond = ConditionEmbedder()
        self.anchor_blocks = DiTStack(cfg.anchor_layers, **stack)
        self.anchor_final = DiTFinalLayer(d, n_out)
        # denoiser network
        self.denoiser_in = torch.nn.Linear(n_out, d)
        self.denoiser_cond = ConditionEmbedder()
        self.denoiser_blocks = DiTStack(cfg.denoiser_layers, **stack)
        self.final = DiTFinalLayer(d, n_out)

    def anchor(self, z_t: torch.Tensor) -> torch.Tensor:
        """z_t (B, L) -> anchor logits (B, L, V+1)."""
        c = self.anchor_cond()
        return self.anchor_final(self.anchor_blocks(self.embed(z_t), c), c)

    def denoise_hidden(self, anchor_logits: torch.Tensor) -> torch.Tensor:
        """Anchor logits (B, L, V+1) -> the denoiser's last hidden states (B, L, d)."""
        return self.denoiser_blocks(self.denoiser_in(anchor_logits), self.denoiser_cond())

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The denoiser's output head on hidden states (..., N, d) -> logits (..., N, V+1)."""
        return self.final(x, self.denoiser_cond())

    def hidden(self, z_t: torch.Tensor) -> torch.Tensor:
        """z_t (B, L) -> the denoiser's last hidden states (B, L, d) (the anchor runs in full:
        the denoiser reads its distribution at every position)."""
        return self.denoise_hidden(self.anchor(z_t))

    def denoise(self, anchor_logits: torch.Tensor) -> torch.Tensor:
        """Anchor logits (B, L, V+1) -> denoiser logits (B, L, V+1)."""
        return self.head(self.denoise_hidden(anchor_logits))

    def forward(self, z_t: torch.Tensor, readout: Readout | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """z_t (B, L) -> (logits, anchor_logits), both (B, L, V+1).

        With a `readout` the denoiser's head runs only on its rows and the first output is
        ``readout(denoiser hidden, head)`` (B,); the anchor logits stay full (the denoiser reads
        the anchor's distribution at every position)."""
        anchor_logits = self.anchor(z_t)
        h = self.denoise_hidden(anchor_logits)
        return (self.head(h) if readout is None else readout(h, self.head)), anchor_logits
