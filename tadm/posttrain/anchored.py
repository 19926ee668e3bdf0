"""A time-anchored DiffusionGemma: the frozen base, a fusion module, an anchor refreshed every K.

:class:`TimeAnchoredDiffusionGemma` generates through transformers' own
``DiffusionGemmaGenerationMixin.generate`` -- the prompt encoder, the autoregressive loop over
canvases, the entropy-bound sampler, the linear temperature schedule and the stopping rules are
the library's code, unchanged. Only the decoder call that ``generate`` makes once per
denoising step is replaced (Alg. 1 of the paper):

    refresh step (every K-th step of a canvas):  C0 = S(z), H0 = A(C0), logits = D(H0)
    reuse step:                                  c = S(z), logits = D(Phi(c; C0, H0))

S (embedding + self-conditioning + shallow layers), the fusion Phi and the denoiser D run
every step; the anchor A runs once every K steps. A new canvas (no self-conditioning logits
yet, or a longer encoder cache) always starts with a refresh. With K = 1 every step is a
refresh, and with an untrained fusion Phi(c; C0, H0) = H0 exactly, so both give the base
model's tokens (tested). The fresh-anchor control of Table 1 (a fusion with
``values="state"``) is run with K = 1: every step refreshes, and its fusion corrects the fresh
anchor, h = Phi(c; c, A(c)).

Counters (:class:`AnchorCounters`) record decoder steps, refreshes and layer calls of each
part, so compute can be reported in the paper's unit (decoder-layer calls).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from tadm.compat import require_transformers

require_transformers(what="DiffusionGemma paths (tadm.posttrain.anchored)")  # before transformers' DiffusionGemma

from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationMixin,
    EntropyBoundSamplerConfig,
)
from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaBlockDiffusionOutputWithPast

from tadm.posttrain.backbone import SplitDiffusionGemma
from tadm.posttrain.fusion import PairedAttentionFusion
from tadm.sampling.anchor_cache import FixedInterval


@dataclass
class AnchorCounters:
    steps: int = 0  # decoder calls (denoising steps)
    refreshes: int = 0  # anchor evaluations
    layer_calls: dict[str, int] = field(default_factory=lambda: {"shared": 0, "anchor": 0, "denoiser": 0})

    @property
    def total_layer_calls(self) -> int:
        return sum(self.layer_calls.values())


@dataclass
class _AnchorCache:
    c0: torch.Tensor
    h0: torch.Tensor
    age: int  # steps since the refresh
    prefix: int  # encoder cache length of the canvas it belongs to


def sampling_kwargs(steps: int, entropy_bound: float, temperature: tuple[float, float], max_new_tokens: int,
                    eos_token_id: int | None, pad_token_id: int | None) -> dict:
    """``generate`` keyword arguments of the paper's sampler: entropy-bound acceptance, linear
    temperature t_max -> t_min over `steps` denoising steps, adaptive early stop off."""
    t_max, t_min = temperature
    return dict(max_new_tokens=max_new_tokens, max_denoising_steps=steps,
                sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(entropy_bound)),
                t_min=float(t_min), t_max=float(t_max), stability_threshold=None, confidence_threshold=None,
                eos_token_id=eos_token_id, pad_token_id=pad_token_id)


class TimeAnchoredDiffusionGemma(DiffusionGemmaGenerationMixin, nn.Module):
    """Frozen DiffusionGemma + trainable fusion; ``generate(..., refresh_every=K)``."""

    def __init__(self, split: SplitDiffusionGemma, fusion: PairedAttentionFusion, refresh_every: int = 1):
        nn.Module.__init__(self)
        self.split, self.fusion = split, fusion
        self.refresh_every = refresh_every
        self.counters = AnchorCounters()
        self._cache: _AnchorCache | None = None

    # what the generation mixin reads from a DiffusionGemmaForBlockDiffusion
    @property
    def config(self):
        return self.split.base.config

    @property
    def model(self):
        return self.split.base.model

    @property
    def generation_config(self):
        return self.split.base.generation_config

    @property
    def dtype(self) -> torch.dtype:
        return self.split.base.dtype

    @property
    def device(self) -> torch.device:
        return self.split.base.device

    @property
    def refresh_every(self) -> int:
        return self.refresh.K

    @refresh_every.setter
    def refresh_every(self, k: int) -> None:
        self.refresh = FixedInterval.parse(k, "posttrain.refresh_every", "K")  # the anchor's refresh policy

    def reset(self) -> None:
        """Forget the anchor cache and zero the counters."""
        self._cache, self.counters = None, AnchorCounters()

    def _count(self, refresh: bool) -> None:
        s, a, d = self.split.split
        self.counters.steps += 1
        self.counters.refreshes += int(refresh)
        self.counters.layer_calls["shared"] += s
        self.counters.layer_calls["denoiser"] += d
        self.counters.layer_calls["anchor"] += a if refresh else 0

    def forward(self, decoder_input_ids: torch.Tensor, cache=None, self_conditioning_logits=None,
                self_conditioning_mask=None, decoder_attention_mask=None, decoder_position_ids=None,
                **unused) -> DiffusionGemmaBlockDiffusionOutputWithPast:
        """One denoising step's decoder call, with the anchor refreshed or reused."""
        if unused.get("input_ids") is not None:
            raise ValueError("input_ids: the time-anchored forward runs the decoder only; encode the prompt first")
        split = self.split
        inputs = split.prepare(decoder_input_ids, cache, decoder_attention_mask, decoder_position_ids)
        c = split.shared(decoder_input_ids, inputs, self_conditioning_logits, self_conditioning_mask)
        prefix = cache.get_seq_length(layer_idx=0)
        stale = self._cache
        refresh = (stale is None or self_conditioning_logits is None or stale.prefix != prefix
                   or self.refresh.stale(stale.age + 1) or stale.c0.shape != c.shape)
        if refresh:
            h = split.anchor(c, inputs)
            self._cache = _AnchorCache(c, h, 0, prefix)
            if self.fusion.fresh:  # Table 1's fresh-anchor control: its fusion acts on the fresh anchor
                h = self.fusion(c, c, h)
        else:
            stale.age += 1
            h = self.fusion(c, stale.c0, stale.h0)
        self._count(refresh)
        return DiffusionGemmaBlockDiffusionOutputWithPast(logits=split.denoise(h, inputs))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, refresh_every: int | None = None, **kwargs):
        """transformers' DiffusionGemma ``generate`` with the anchor refreshed every K steps."""
        if refresh_every is not None:
            self.refresh_every = refresh_every
        self._cache = None
        try:
            return super().generate(input_ids, **kwargs)
        finally:
            self._cache = None
