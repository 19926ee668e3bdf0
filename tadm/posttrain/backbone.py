"""DiffusionGemma's canvas decoder split into shared / anchor / denoiser (paper Sec. 4).

The real model class is ``transformers.DiffusionGemmaForBlockDiffusion``: a causal prompt
encoder fills a KV cache, and a bidirectional canvas decoder of N layers (30 at 26B) reads it.
TADM:Post-train cuts that decoder, without touching a weight, into

    shared   S: token embedding + self-conditioning + decoder layers [0, s)
    anchor   A: decoder layers [s, s + a)                          (cached, refreshed every K)
    denoiser D: decoder layers [s + a, N) + final norm + LM head + logit soft-capping

so that ``D(A(S(z)))`` is exactly the base decoder's forward pass (tested bit for bit). The
base stays frozen; only the fusion module between A and D trains.

:class:`DecoderInputs` holds what every decoder layer reads besides the hidden state (rotary
embeddings, attention masks, the encoder KV cache, positions); it is built once per call
following ``DiffusionGemmaDecoderModel.forward``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tadm.compat import require_transformers
from tadm.errors import ConfigError

require_transformers(what="DiffusionGemma paths (tadm.posttrain.backbone)")


@dataclass
class DecoderInputs:
    """Per-call side inputs of the decoder layers (shared by S, A and D in one step)."""

    position_embeddings: dict[str, Any]
    mask_mapping: dict[str, Any]
    cache: Any
    position_ids: torch.Tensor


class SplitDiffusionGemma(nn.Module):
    """A frozen ``DiffusionGemmaForBlockDiffusion`` run as S -> A -> D.

    `shared`, `anchor`, `denoiser` are decoder-layer counts; they must add up to the decoder's
    depth. The wrapped model's parameters get ``requires_grad = False``.
    """

    def __init__(self, base: nn.Module, shared: int, anchor: int, denoiser: int):
        super().__init__()
        depth = base.config.text_config.num_hidden_layers
        if min(shared, anchor, denoiser) < 1 or shared + anchor + denoiser != depth:
            raise ConfigError(
                "posttrain.shared_layers/anchor_layers/denoiser_layers",
                f"{shared}+{anchor}+{denoiser} must be positive and add up to the decoder's {depth} layers",
            )
        self.base = base.requires_grad_(False)
        self.split = (shared, anchor, denoiser)
        self.bounds = {"shared": (0, shared), "anchor": (shared, shared + anchor), "denoiser": (shared + anchor, depth)}

    # ------------------------------------------------------------------ pieces of the base

    @property
    def decoder(self) -> nn.Module:
        return self.base.model.decoder

    @property
    def text_config(self):
        return self.base.config.text_config

    @property
    def hidden_size(self) -> int:
        return self.text_config.hidden_size

    def prepare(self, decoder_input_ids: torch.Tensor, cache, decoder_attention_mask=None,
                decoder_position_ids: torch.Tensor | None = None) -> DecoderInputs:
        """Rotary embeddings, masks and positions for one decoder call (as the base computes them)."""
        dec = self.decoder
        if cache is None:
            raise ValueError("cache: the decoder reads the encoder prefix from the KV cache; got None")
        length = decoder_input_ids.shape[1]
        if decoder_position_ids is None:
            start = cache.get_seq_length(layer_idx=0)
            decoder_position_ids = torch.arange(start, start + length, device=decoder_input_ids.device)[None]
        dummy = dec.embed_tokens.weight.new_empty(*decoder_input_ids.shape, 0)
        mask_mapping = decoder_attention_mask
        if not isinstance(mask_mapping, dict):
            mask_mapping = dec.create_diffusion_decoder_attention_mask(
                config=self.text_config, inputs_embeds=dummy, cache=cache, decoder_attention_mask=decoder_attention_mask)
        probe = dec.embed_tokens.weight.new_empty(1, 1, self.hidden_size)
        position_embeddings = {kind: dec.rotary_emb(probe, decoder_position_ids, kind) for kind in dec.unique_layer_types}
        return DecoderInputs(position_embeddings, mask_mapping, cache, decoder_position_ids)

    def embed(self, decoder_input_ids: torch.Tensor, self_conditioning_logits: torch.Tensor | None = None,
              self_conditioning_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Token embedding plus the self-conditioning signal (the decoder's input)."""
        dec = self.decoder
        inputs_embeds = dec.embed_tokens(decoder_input_ids)
        if self_conditioning_logits is not None:
            weight = dec.embed_tokens.weight
            soft = (self_conditioning_logits.softmax(dim=-1, dtype=torch.float32).to(weight.dtype) @ weight)
            soft = soft * dec.embed_tokens.embed_scale.to(inputs_embeds.dtype)
            if self_conditioning_mask is not None:
                soft = soft * self_conditioning_mask.to(soft.dtype)[:, None, None]
        else:
            soft = torch.zeros_like(inputs_embeds)
        return dec.self_conditioning(inputs_embeds, soft)

    def layers(self, hidden: torch.Tensor, inputs: DecoderInputs, part: str) -> torch.Tensor:
        """Run the decoder layers of `part` ("shared", "anchor" or "denoiser")."""
        lo, hi = self.bounds[part]
        kinds = self.text_config.layer_types
        for i in range(lo, hi):
            hidden = self.decoder.layers[i](
                hidden, position_embeddings=inputs.position_embeddings[kinds[i]],
                attention_mask=inputs.mask_mapping[kinds[i]], position_ids=inputs.position_ids, cache=inputs.cache)
        return hidden

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head and soft-capping: float32 logits, as the base returns them."""
        logits = self.base.lm_head(self.decoder.norm(hidden)).to(torch.float32)
        cap = self.base.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    # ------------------------------------------------------------------ S, A, D

    def shared(self, ids, inputs: DecoderInputs, self_conditioning_logits=None, self_conditioning_mask=None):
        """c_t = S(z_t): embedding, self-conditioning, the first decoder layers."""
        return self.layers(self.embed(ids, self_conditioning_logits, self_conditioning_mask), inputs, "shared")

    def anchor(self, c: torch.Tensor, inputs: DecoderInputs) -> torch.Tensor:
        """h = A(c): the expensive middle of the decoder."""
        return self.layers(c, inputs, "anchor")

    def denoise(self, h: torch.Tensor, inputs: DecoderInputs) -> torch.Tensor:
        """logits = D(h): the last decoder layers and the LM head."""
        return self.head(self.layers(h, inputs, "denoiser"))

    def forward(self, decoder_input_ids, cache, self_conditioning_logits=None, self_conditioning_mask=None,
                decoder_attention_mask=None, decoder_position_ids=None) -> torch.Tensor:
        """The base decoder's logits, computed as D(A(S(z)))."""
        inputs = self.prepare(decoder_input_ids, cache, decoder_attention_mask, decoder_position_ids)
        c = self.shared(decoder_input_ids, inputs, self_conditioning_logits, self_conditioning_mask)
        return self.denoise(self.anchor(c, inputs), inputs)
