"""dKV-Cache-Decode on LLaDA, as released (horseee/dKV-Cache @49a76fc: the loop
`generation_utils/llada_dkv_cache_decode.py`, the model `models/modeling_llada_dkv_cache_decode.py`),
written from reading them; no code of theirs is used.

The cache is delayed by one pass: the K and V of a decided position are those computed at the
first pass whose input held its token, and are reused from the pass after that until the next
full pass. With R the reload interval (the release's `cache_reloading_step`) and i the pass
index within the semi-AR block (the cache is dropped at each block's start):

- i = 0, i = 1 and every i with i mod R = 0: a full pass over the canvas; every layer keeps the
  K, V of every position;
- otherwise a cached pass: every layer runs only the rows C that were undecided in the previous
  pass's input (they include every row still undecided now and those decided by the previous
  pass), each attending to its fresh K, V at C and the kept K, V elsewhere; the kept K, V of C
  are then replaced by the fresh ones (the rows of C that are decided in this input are the
  ones the release adds to its cache; the others are computed again at the next pass).

Rows outside C are decided, so the decoder never reads them: their logits are zeros (the mask
class −inf). R = 1 makes every pass full: the base, token for token.

Keys stay in canvas order (the release orders them [computed; kept]: the same softmax up to the
rounding of its sum), and K is kept after RoPE (the release keeps it before and rotates it
again at every pass: the same values, position for position). The padding key mask of the batch
applies on every pass (the release attends to pads: docs/deviations.md).

Accounting: a full pass is L layer calls, a cached pass L |C| / N (|C| the widest row set of the
batch: rows with fewer are filled with a repeat of one of their rows, which is exact).
`budget_x` is None: the rows run at the release's reload intervals, not matched to TADM.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tadm.caches.llada.base import LladaCacheBackend
from tadm.caches.llada.block import block_forward, put_rows, take_rows


def check_reload(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"reload_every: must be an integer >= 1, got {value!r}")
    return value


def cached_rows(recompute: Tensor) -> Tensor:
    """The positions (B, n) of the rows `recompute` (B, N) marks, in canvas order, n the most any
    sequence has; a sequence with fewer repeats its first one (a duplicate query: the same
    values). A sequence with none gets its position 0 recomputed: it is wholly decided, so
    nothing of it is read before the cache is dropped at the next block."""
    n = max(int(recompute.sum(1).max()), 1)
    order = torch.argsort((~recompute).to(torch.int8), dim=1, stable=True)[:, :n]
    valid = torch.arange(n, device=recompute.device) < recompute.sum(1, keepdim=True)
    return torch.where(valid, order, order[:, :1])


class LladaDkvBackend(LladaCacheBackend):
    """dKV-Cache-Decode with reload interval `reload_every` (R; module docstring)."""

    def __init__(self, model, reload_every: int):
        super().__init__(model)
        self.every = check_reload(reload_every)
        self._kv: list[tuple[Tensor, Tensor]] | None = None
        self._kept: Tensor | None = None  # (B, N) bool: rows whose kept K/V the next cached pass reads
        self._step = 0

    def start(self) -> None:
        super().start()
        self._kv, self._kept, self._step = None, None, 0

    def begin_block(self, lo: int, hi: int) -> None:
        self._kv, self._kept, self._step = None, None, 0  # the release drops its cache per block

    def _full_due(self) -> bool:
        i = self._step
        return self._kv is None or self._kept is None or i <= 1 or i % self.every == 0

    @torch.no_grad()
    def logits(self, ids: Tensor, delta: Tensor | None = None) -> Tensor:
        e = self._input_embeds(ids, delta)
        b, n_rows = ids.shape
        layers = self.model.n_layers
        keys = self.key_mask((b, n_rows), e.device)
        decided = ids != self.mask_id
        full = self._full_due()
        if full:
            x, self._kv = e, []
            for block in self.blocks:
                got: dict = {}
                x = block_forward(block, x, keys, capture=got)
                self._kv.append((got["k"], got["v"]))
            out = self._logits(x)
            computed = n_rows
        else:
            pos = cached_rows(~self._kept)
            x = take_rows(e, pos)
            for block, (k_kept, v_kept) in zip(self.blocks, self._kv):
                got = {}
                x = block_forward(block, x, keys, kv=(k_kept, v_kept), positions=pos, capture=got)
                put_rows(k_kept, got["k"], pos, 2)  # the rows of C: their fresh K/V from now on
                put_rows(v_kept, got["v"], pos, 2)
            lg = self._logits(x)
            out = torch.zeros(b, n_rows, lg.shape[-1], dtype=lg.dtype, device=lg.device)
            out[..., self.mask_id] = float("-inf")
            out.scatter_(1, pos.unsqueeze(-1).expand_as(lg), lg)
            computed = pos.shape[1]
        self._kept = decided if self._step >= 1 else torch.zeros_like(decided)  # pass 1 is full anyway
        self._step += 1
        self._advance(full)
        self._count_layers(layers, layers * computed / n_rows)
        return out


def dkv_backend(model, spec) -> LladaDkvBackend:
    """dKV-Cache-Decode of a `CacheSpec` (tadm.caches.catalog): reload every `spec.every` passes."""
    return LladaDkvBackend(model, spec.every)
