"""Naive reuse on LLaDA: the middle layers' output refreshed every K passes (package docstring)."""

from __future__ import annotations

import torch
from torch import Tensor

from tadm.caches.llada.base import SPLIT, LladaCacheBackend, check_every, scaled_split, tadm_share


class LladaNaiveReuseBackend(LladaCacheBackend):
    """Naive reuse: front layers every pass, the middle layers' output computed every
    `refresh_every` (K) passes and reused in between, back layers and head every pass."""

    def __init__(self, model, refresh_every: int, split: tuple[int, int, int] = SPLIT):
        check_every(refresh_every, "asrd.llada_cache_refresh")
        super().__init__(model, refresh_every)
        self.split = scaled_split(model.n_layers, split)
        self.budget_x = tadm_share(model.n_layers, refresh_every, split)
        self._h: Tensor | None = None

    def start(self) -> None:
        super().start()
        self._h = None

    @torch.no_grad()
    def logits(self, ids: Tensor, delta: Tensor | None = None) -> Tensor:
        e = self._input_embeds(ids, delta)
        keys = self.key_mask(tuple(e.shape[:2]), e.device)
        s, a, d = self.split
        blocks = self.blocks
        x = e
        for block in blocks[:s]:
            x = block(x, keys)
        refreshed = self._refresh_due() or self._h is None or self._h.shape != x.shape
        if refreshed:
            for block in blocks[s: s + a]:
                x = block(x, keys)
            self._h = x
        x = self._h
        for block in blocks[s + a:]:
            x = block(x, keys)
        self._advance(refreshed)
        self._count_layers(s + d + (a if refreshed else 0))
        return self._logits(x)


def naive_backend(model, spec) -> LladaNaiveReuseBackend:
    """Naive reuse of a `CacheSpec` (tadm.caches.catalog) every K."""
    return LladaNaiveReuseBackend(model, spec.every)
