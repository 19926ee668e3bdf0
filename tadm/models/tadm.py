"""TADM:Pretraining (paper Sec. 3, App. C.2): an anchor computed on a stale state, reused.

    S   shared network     = the token embedding (V+1, d), applied to both z_t and z_t'
    A   anchor network     = anchor_layers DiT blocks:        h_t' = A(S(z_t'))      (cached)
    Phi fusion             = gated residual MLP:              h~ = Phi(S(z_t), h_t')
    D   denoiser network   = denoiser_layers DiT blocks + LM head:  logits = D(h~)

At inference the expensive ``anchor`` runs once every K reverse steps and ``denoise`` runs every
step with the cached h. ``denoise(z_t, h, fusion=False)`` is the fusion ablation: D(h), the
(stale) anchor read as is by the same denoiser, Phi and S(z_t) skipped. ``anchor_head`` (a
final layer on h_t') exists only for the optional anchor cross-entropy of TADM-double-dagger;
it is not part of the inference network (``inference_parameters``). A and D each have their own
constant conditioning vector, as the two DiTs of ADLM do; the anchor head uses the anchor's.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn as nn

from tadm.config import ModelConfig
from tadm.losses import Readout
from tadm.models.base import TadmModel
from tadm.models.dit import ConditionEmbedder, DiTFinalLayer, DiTStack, token_embedding
from tadm.models.fusion import Fusion


class TADM(TadmModel):
    model_type = "tadm"

    def __init__(self, cfg: ModelConfig, vocab_size: int, seq_len: int):
        super().__init__(cfg, vocab_size, seq_len)
        d, n_out = cfg.d_model, vocab_size + 1
        stack = dict(d_model=d, n_heads=cfg.n_heads, mlp_ratio=cfg.mlp_ratio, dropout=cfg.dropout, gelu=cfg.gelu)
        self.embed = token_embedding(n_out, d)  # S
        self.anchor_cond = ConditionEmbedder()
        self.anchor_blocks = DiTStack(cfg.anchor_layers, **stack)  # A
        self.fusion = Fusion(d)  # Phi
        self.denoiser_cond = ConditionEmbedder()
        self.denoiser_blocks = DiTStack(cfg.denoiser_layers, **stack)  # D
        self.final = DiTFinalLayer(d, n_out)  # D's LM head
        self.anchor_head = DiTFinalLayer(d, n_out)  # training only

    def anchor(self, z_tprime: torch.Tensor) -> torch.Tensor:
        """S + A on the (stale) state z_t' (B, L) -> anchor h_t' (B, L, d). The cached state."""
        return self.anchor_blocks(self.embed(z_tprime), self.anchor_cond())

    def denoise_hidden(self, z_t: torch.Tensor, h: torch.Tensor, *, fusion: bool = True) -> torch.Tensor:
        """S, Phi and D's blocks: current state z_t (B, L) and a cached anchor h (B, L, d) ->
        the denoiser's last hidden states (B, L, d).

        ``fusion=False`` is the fusion ablation ("fusion bypassed"): Phi and S(z_t) are
        skipped and D's blocks read the anchor as is, D(h). No weight is touched or replaced (the
        same denoiser, conditioning and head); z_t is then only checked for its shape: between
        refreshes the denoiser does not see the current canvas at all, only the canvas the anchor
        was computed on (through h)."""
        if h.shape[:2] != z_t.shape:
            raise ValueError(f"anchor h has shape {tuple(h.shape)}, expected {tuple(z_t.shape)} + (d,) for z_t")
        return self.denoiser(self.fusion(self.embed(z_t), h) if fusion else h)

    def denoiser(self, x: torch.Tensor) -> torch.Tensor:
        """D's blocks alone on a representation x (B, L, d): a fused h~, or an anchor as is (the
        fusion bypassed) -> the denoiser's last hidden states (B, L, d)."""
        return self.denoiser_blocks(x, self.denoiser_cond())

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """D's LM head on hidden states (..., N, d) -> logits (..., N, V+1); samplers apply it
        only to the positions they read."""
        return self.final(x, self.denoiser_cond())

    def denoise(self, z_t: torch.Tensor, h: torch.Tensor, *, fusion: bool = True) -> torch.Tensor:
        """S, Phi and D: current state z_t (B, L) and a cached anchor h (B, L, d) -> logits (B, L, V+1);
        ``fusion=False``: D(h), the fusion bypassed (`denoise_hidden`)."""
        return self.head(self.denoise_hidden(z_t, h, fusion=fusion))

    def hidden(self, z_t: torch.Tensor, z_tprime: torch.Tensor) -> torch.Tensor:
        """The full network up to D's head: denoise_hidden(z_t, anchor(z_t')) (B, L, d)."""
        return self.denoise_hidden(z_t, self.anchor(z_tprime))

    def forward(self, z_t: torch.Tensor, z_tprime: torch.Tensor, *, return_anchor_logits: bool = False,
                readout: Readout | None = None, anchor_readout: Readout | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x_theta(z_t, z_t') logits (B, L, V+1); z_t' is z_t's equally or more masked stale state.

        With ``return_anchor_logits=True`` returns (logits, anchor_logits(h_t')) from one call,
        so a DDP-wrapped model can train the anchor head (which DDP only sees through forward).
        Training / validation: with a `readout` D's head runs only on its rows and the logits are
        replaced by ``readout(hidden, head)`` (B,); with an `anchor_readout` the anchor head runs
        only on its rows and a second output ``anchor_readout(h_t', anchor head)`` (B,) is returned.
        """
        h = self.anchor(z_tprime)
        hidden = self.denoise_hidden(z_t, h)
        out = self.head(hidden) if readout is None else readout(hidden, self.head)
        if anchor_readout is not None:
            return out, anchor_readout(h, self.anchor_logits)
        return (out, self.anchor_logits(h)) if return_anchor_logits else out

    def anchor_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Training only: vocabulary logits (..., N, V+1) read off the anchor h (..., N, d)."""
        return self.anchor_head(h, self.anchor_cond())

    def inference_parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter sampling uses: all but the training-only anchor head."""
        for name, p in self.named_parameters():
            if not name.startswith("anchor_head."):
                yield p
