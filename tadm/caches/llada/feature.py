"""dLLM-Cache's feature cache with V-verify on LLaDA, as released (package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tadm.caches.llada.base import LladaCacheBackend, check_every, tadm_share
from tadm.caches.llada.block import attend, block_forward, heads, mlp, put_rows, rotary_at, take_rows
from tadm.errors import ConfigError
from tadm.models.llada import LladaBlock


@dataclass
class _Features:
    """One layer's cached rows (B = batch, N = canvas)."""

    k: Tensor  # (B, kv_heads, N, head_dim), after RoPE
    v: Tensor  # (B, kv_heads, N, head_dim)
    attn: Tensor  # (B, N, d): the attention branch's output
    ffn: Tensor  # (B, N, d): the FFN branch's output


class LladaFeatureCacheBackend(LladaCacheBackend):
    """dLLM-Cache as released: prompt rows refreshed every `prompt_every` (K_p) passes, response
    rows every `response_every` (K_r), V-verify with share `share` (rho) between (module
    docstring). The response is the canvas from the first block's start on (`begin_block`)."""

    def __init__(self, model, prompt_every: int, response_every: int, share: float):
        super().__init__(model)
        check_every(prompt_every, "asrd.llada_dllm_cache.prompt_every")
        check_every(response_every, "asrd.llada_dllm_cache.response_every")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share <= 1.0:
            raise ConfigError("asrd.llada_dllm_cache.share", f"must be in (0, 1], got {share!r}")
        self.prompt_every, self.response_every, self.share = prompt_every, response_every, float(share)
        if prompt_every == response_every:
            self.budget_x = tadm_share(model.n_layers, response_every)
        self._states: list[_Features] | None = None
        self._step, self._start = 0, None  # passes so far in this generation; the response's first row

    def start(self) -> None:
        super().start()
        self._states, self._step, self._start = None, 0, None

    def begin_block(self, lo: int, hi: int) -> None:
        if self._start is None:
            self._start = lo

    def selected(self, g: int) -> int:
        """floor(rho G), the response rows V-verify computes (1e-9: 0.3 * 10 is 3, not 2)."""
        return min(g, math.floor(self.share * g + 1e-9))

    @torch.no_grad()
    def logits(self, ids: Tensor, delta: Tensor | None = None) -> Tensor:
        e = self._input_embeds(ids, delta)
        b, n = e.shape[:2]
        keys = self.key_mask((b, n), e.device)
        self._step += 1
        prompt_due = self._states is None or (self._step - 1) % self.prompt_every == 0
        response_due = self._states is None or (self._step - 1) % self.response_every == 0
        full = prompt_due and response_due
        start = self._start or 0
        if full:
            self._states = []
        x, weighted = e, 0.0
        for i, block in enumerate(self.blocks):
            if full or i == 0:  # dLLM-Cache's rule: layer 0 always computes every row
                got: dict = {}
                x = block_forward(block, x, keys, capture=got)
                state = _Features(got["k"], got["v"], got["attn"], got["ffn"])
                if full:
                    self._states.append(state)
                else:
                    self._states[0] = state
                weighted += 1.0
                continue
            x, rows = self._partial(block, x, keys, self._states[i], start, prompt_due, response_due)
            weighted += rows / n
        self._advance(full)
        self._count_layers(len(self.blocks), weighted)
        return self._logits(x)

    def _partial(self, block: LladaBlock, x: Tensor, keys: Tensor | None, st: _Features, start: int,
                 prompt_due: bool, response_due: bool) -> tuple[Tensor, int]:
        """One layer >= 1 on the rows due (and V-verify's picks); the others read the cache.
        Returns the layer's output and the number of rows computed per sequence."""
        cfg = block.cfg
        b, n, _ = x.shape
        h = block.attn_norm(x)
        response = torch.arange(start, n, device=x.device)
        if response_due:
            picked = response.expand(b, -1)
        else:  # V-verify: the response rows whose V moved most, per sequence
            v_new = heads(block.v_proj, h[:, start:], cfg.kv_heads, cfg.head_dim)
            sim = F.cosine_similarity(v_new.transpose(1, 2).flatten(2), st.v[:, :, start:].transpose(1, 2).flatten(2), dim=-1)
            pick = sim.topk(self.selected(n - start), dim=-1, largest=False).indices.sort(dim=-1).values
            picked = response[pick]
            st.v[:, :, start:] = v_new  # every response row's V (the picked rows get theirs below)
        parts = ([torch.arange(start, device=x.device).expand(b, -1)] if prompt_due else []) + [picked]
        rows = torch.cat(parts, dim=1).sort(dim=-1).values  # (B, n_rows), in canvas order
        if rows.shape[1] == 0:
            return x + st.attn + st.ffn, 0
        hs = take_rows(h, rows)
        q = rotary_at(heads(block.q_proj, hs, cfg.n_heads, cfg.head_dim), rows, cfg.rope_theta, cfg.rope_full_precision, n)
        k = rotary_at(heads(block.k_proj, hs, cfg.kv_heads, cfg.head_dim), rows, cfg.rope_theta, cfg.rope_full_precision, n)
        put_rows(st.k, k, rows, 2)
        put_rows(st.v, heads(block.v_proj, hs, cfg.kv_heads, cfg.head_dim), rows, 2)
        query_keys = keys if keys is None or keys.shape[2] == 1 else keys.expand(b, -1, -1, -1).gather(
            2, rows[:, None, :, None].expand(-1, 1, -1, n))
        put_rows(st.attn, attend(block, q, st.k, st.v, query_keys), rows, 1)
        x = x + st.attn
        put_rows(st.ffn, mlp(block, take_rows(x, rows)), rows, 1)
        return x + st.ffn, rows.shape[1]


def feature_backend(model, spec) -> LladaFeatureCacheBackend:
    """dLLM-Cache of a `CacheSpec` (tadm.caches.catalog): K_p, K_r and rho."""
    return LladaFeatureCacheBackend(model, spec.prompt_every, spec.every, spec.share)
