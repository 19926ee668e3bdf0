"""Autoregressive baseline: the same DiT block, causal, at MDLM's width and depth.

    x (B, L) -> embedding (V, d) -> mdlm_layers causal DiT blocks -> final layer -> (B, L, V)

Logits at position i predict token i+1 (the shift is the loss's job). There is no mask token,
so the embedding has V rows and the head V outputs.

Incremental decoding (`new_cache`, `forward_cached`): position i's output depends on x_{<=i}
only, so a left-to-right sampler can keep, per block, the rotated keys and the values of the
positions it has run (`KVCache`, (B, H, L, head_dim) each, filled in place) and run each new
position alone: its query attends to the cached keys 0..i. That is one position per layer per
generated token, O(L) position-forwards per sequence instead of the O(L^2) of re-running the
prefix. `forward_cached` computes exactly what `DiTBlock.forward` computes for those positions
(same modules, same order: adaLN, LN, rotary from the same table, attention, MLP); only the
attention's reduction runs over the cached keys instead of a causally masked full matrix, so
the logits agree with `forward` to float rounding (tests: token for token in fp32).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tadm.config import ModelConfig
from tadm.models.base import TadmModel
from tadm.models.dit import (
    ConditionEmbedder, DiTBlock, DiTFinalLayer, DiTStack, apply_rotary, modulate, rotary_cos_sin, token_embedding,
)


@dataclass
class KVCache:
    """Per-layer keys (rotary applied) and values of the first `length` positions of a batch.

    Buffers (B, H, max_len, head_dim) are allocated on the first write, in the dtype the
    attention produced (bf16 under autocast). The conditioning vector, each block's adaLN
    parameters and the rotary table are the same at every position, so they are computed once
    per cache (`prepare`)."""

    max_len: int
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    length: int = 0
    cond: torch.Tensor | None = None
    mods: list[tuple[torch.Tensor, ...]] = field(default_factory=list)
    rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H, n, hd) at positions start..start+n-1 of `layer`; return the keys
        and values of positions 0..start+n-1 (views)."""
        end = start + k.shape[2]
        if layer == len(self.keys):
            B, H, _, hd = k.shape
            self.keys.append(k.new_empty(B, H, self.max_len, hd))
            self.values.append(v.new_empty(B, H, self.max_len, hd))
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


class AR(TadmModel):
    model_type = "ar"

    def __init__(self, cfg: ModelConfig, vocab_size: int, seq_len: int):
        super().__init__(cfg, vocab_size, seq_len)
        d = cfg.d_model
        self.embed = token_embedding(vocab_size, d)
        self.cond = ConditionEmbedder()
        self.blocks = DiTStack(cfg.mdlm_layers, d, cfg.n_heads, cfg.mlp_ratio, dropout=cfg.dropout, causal=True, gelu=cfg.gelu)
        self.final = DiTFinalLayer(d, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L) token ids in 0..V-1 -> next-token logits (B, L, V)."""
        c = self.cond()
        return self.final(self.blocks(self.embed(x), c), c)

    # ------------------------------------------------------------------ incremental decoding

    def new_cache(self, max_len: int | None = None) -> KVCache:
        """An empty cache for up to `max_len` positions (default: the model's seq_len)."""
        return KVCache(self.seq_len if max_len is None else max_len)

    def _prepare(self, cache: KVCache, device: torch.device) -> None:
        if cache.cond is None:
            cache.cond = self.cond()
            cache.mods = [tuple(block.adaLN_modulation(cache.cond)[:, None].chunk(6, dim=-1)) for block in self.blocks]
            cache.rope = rotary_cos_sin(cache.max_len, self.blocks.head_dim, device)

    def forward_cached(self, x_new: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Next-token logits (B, n, V) for the n positions x_new (B, n) that follow the
        `cache.length` positions already in `cache`; their keys / values are appended.
        Equal (to rounding) to ``forward(x)[:, start:start + n]`` for the whole prefix x."""
        start, n = cache.length, x_new.shape[1]
        if start + n > cache.max_len:
            raise ValueError(f"KV cache holds {cache.max_len} positions, asked for {start + n}")
        self._prepare(cache, x_new.device)
        cos, sin = cache.rope
        rope = (cos[start:start + n], sin[start:start + n])
        h = self.embed(x_new)
        for layer, block in enumerate(self.blocks):
            h = self._block_cached(block, layer, h, cache, rope, start)
        cache.length = start + n
        return self.final(h, cache.cond)

    @staticmethod
    def _block_cached(block: DiTBlock, layer: int, x: torch.Tensor, cache: KVCache,
                      rope: tuple[torch.Tensor, torch.Tensor], start: int) -> torch.Tensor:
        """`DiTBlock.forward` for positions start..start+n-1, attending to the cached ones."""
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = cache.mods[layer]
        attn = block.attn
        a_in = modulate(block.norm1(x), shift_a, scale_a)
        B, n, d = a_in.shape
        q, k, v = attn.qkv(a_in).view(B, n, 3, attn.n_heads, d // attn.n_heads).permute(2, 0, 3, 1, 4)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.write(layer, start, k, v)
        if n == 1:  # one query: every cached key is at or before it
            y = F.scaled_dot_product_attention(q, keys, values)
        elif start == 0:
            y = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
        else:  # query i (at start + i) sees keys 0..start + i
            qpos = torch.arange(start, start + n, device=x.device)
            mask = torch.arange(start + n, device=x.device)[None, :] <= qpos[:, None]
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        y = attn.out(y.transpose(1, 2).reshape(B, n, d))
        x = x + gate_a * block.dropout(y)
        x = x + gate_m * block.dropout(block.mlp(modulate(block.norm2(x), shift_m, scale_m)))
        return x
