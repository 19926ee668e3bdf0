"""Fast-dLLM's prefix cache and, with ``dual=True``, its dual cache on LLaDA (package docstring)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from tadm.caches.llada.base import LladaCacheBackend, check_every, tadm_share
from tadm.caches.llada.block import block_forward
from tadm.sampling.anchor_cache import FixedInterval


def _query_rows(keys: Tensor | None, lo: int, hi: int) -> Tensor | None:
    return keys if keys is None or keys.shape[2] == 1 else keys[:, :, lo:hi]


class LladaPrefixCacheBackend(LladaCacheBackend):
    """Fast-dLLM's prefix cache (``dual=True``: its dual cache), refreshed at each block's first
    pass and, with an integer `refresh_every` K, whenever age + 1 >= K (module docstring).

    Refreshed per block (as released), a block takes at least 2 passes (`min_block_passes`):
    the release's loop (`generate_with_prefix_cache` / `generate_with_dual_cache` @24cc59e)
    runs a cached pass after the block's full pass before it checks whether the block is
    decided, so a block the full pass decided still costs one cached pass, which decides
    nothing. At an integer K (not in the release) a block ends once it is decided, as in the
    base's loop, so that K = 1 is the base."""

    def __init__(self, model, refresh_every: int | Literal["block"] = "block", dual: bool = False):
        super().__init__(model)
        check_every(refresh_every, "asrd.llada_cache_refresh", block_ok=True)
        self.every, self.dual = refresh_every, dual
        self.min_block_passes = 2 if refresh_every == "block" else 1
        self.budget_x = None if refresh_every == "block" else tadm_share(model.n_layers, refresh_every)
        self._kv: list[tuple[Tensor, Tensor]] | None = None
        self._last: Tensor | None = None  # the last full pass's logits
        self._block: tuple[int, int] | None = None

    def start(self) -> None:
        super().start()
        self._kv = self._last = self._block = None

    def begin_block(self, lo: int, hi: int) -> None:
        self._block, self._age = (lo, hi), None  # the block's first pass refreshes

    def _refresh_due(self) -> bool:
        if self._kv is None or self._age is None:
            return True
        return self.every != "block" and FixedInterval(self.every).stale(self._age + 1)

    @torch.no_grad()
    def logits(self, ids: Tensor, delta: Tensor | None = None) -> Tensor:
        e = self._input_embeds(ids, delta)
        n, layers = e.shape[1], self.model.n_layers
        keys = self.key_mask(tuple(e.shape[:2]), e.device)
        refreshed = self._refresh_due()
        if refreshed:
            x, self._kv = e, []
            for block in self.blocks:
                got: dict = {}
                x = block_forward(block, x, keys, capture=got)
                self._kv.append((got["k"], got["v"]))
            out = self._last = self._logits(x)
            computed = n
        else:
            lo, hi = self._block or (0, n)
            hi = hi if self.dual else n
            pos = torch.arange(lo, hi, device=e.device)
            x, rows = e[:, lo:hi], _query_rows(keys, lo, hi)
            for block, kv in zip(self.blocks, self._kv):
                x = block_forward(block, x, rows, kv=kv, positions=pos)
            out = self._last.clone()
            out[:, lo:hi] = self._logits(x)
            computed = hi - lo
        self._advance(refreshed)
        self._count_layers(layers, layers * computed / n)
        return out


def prefix_backend(model, spec) -> LladaPrefixCacheBackend:
    """The prefix cache of a `CacheSpec` (tadm.caches.catalog): every K, or per block."""
    return LladaPrefixCacheBackend(model, spec.every or "block")


def dual_backend(model, spec) -> LladaPrefixCacheBackend:
    """The dual cache of a `CacheSpec` (tadm.caches.catalog): every K, or per block."""
    return LladaPrefixCacheBackend(model, spec.every or "block", dual=True)
