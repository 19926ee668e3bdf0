"""LLaDA's block maths with the options a cache needs (`block_forward`), repeated from
`tadm.models.llada.LladaBlock` so that `tadm.models.llada` stays as it is; at no option it is the
block bit for bit (tested). `rotary_at` places rows at arbitrary canvas positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tadm.models.llada import LladaBlock


def rotary_at(x: Tensor, positions: Tensor, theta: float, full_precision: bool, span: int | None = None) -> Tensor:
    """`llada.rotary` of x (B, heads, n, head_dim) with row i at canvas position positions[i]
    ((n,) for the batch, or (B, n) per sequence) instead of i. The angles are llada.rotary's
    table for positions 0..span-1 (span: the canvas length; default max + 1), indexed, so at
    positions = arange(n) this is llada.rotary bit for bit."""
    dim = x.shape[-1]
    work = torch.float32 if full_precision else x.dtype
    span = int(positions.max()) + 1 if span is None else span
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(span, device=x.device, dtype=torch.float32), inv_freq)
    cos, sin = angles.cos().to(work)[positions], angles.sin().to(work)[positions]
    if positions.dim() == 2:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, n, dim / 2): one table per sequence
    h = x.to(work)
    first, second = h[..., : dim // 2], h[..., dim // 2:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).to(x.dtype)


def heads(proj: torch.nn.Linear, h: Tensor, heads: int, head_dim: int) -> Tensor:
    b, n, _ = h.shape
    return proj(h).view(b, n, heads, head_dim).transpose(1, 2)


def put_rows(cache: Tensor, rows: Tensor, positions: Tensor, dim: int) -> Tensor:
    """`cache` with `rows` written at `positions` ((n,) or (B, n)) along `dim`, in place."""
    if positions.dim() == 1:
        cache.index_copy_(dim, positions, rows)
        return cache
    shape = [positions.shape[0]] + [1] * (cache.dim() - 1)
    shape[dim] = positions.shape[1]
    return cache.scatter_(dim, positions.view(shape).expand_as(rows), rows)


def take_rows(x: Tensor, positions: Tensor) -> Tensor:
    """Rows `positions` ((n,) or (B, n)) of x (B, N, d)."""
    if positions.dim() == 1:
        return x[:, positions]
    return x.gather(1, positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def attend(block: LladaBlock, q: Tensor, k: Tensor, v: Tensor, keys: Tensor | None) -> Tensor:
    """LladaBlock.attention after the projections: GQA, SDPA, output projection -> (B, n, d)."""
    cfg = block.cfg
    if cfg.kv_heads != cfg.n_heads:
        k = k.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
        v = v.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, is_causal=False)
    b, _, n, _ = q.shape
    return block.attn_out(out.transpose(1, 2).reshape(b, n, cfg.d_model))


def mlp(block: LladaBlock, x: Tensor) -> Tensor:
    h = block.ff_norm(x)
    return block.ff_out(F.silu(block.ff_proj(h)) * block.up_proj(h))


def block_forward(block: LladaBlock, x: Tensor, keys: Tensor | None = None, kv: tuple[Tensor, Tensor] | None = None,
                  positions: Tensor | None = None, capture: dict | None = None) -> Tensor:
    """`LladaBlock.forward` of the rows x (B, n, d), with the options a cache needs:

    - `positions`: the rows' canvas positions, (n,) or (B, n) (None: 0..n-1, x is the canvas);
    - `kv`: cached (K, V) of the whole canvas (B, kv_heads, N, head_dim), after RoPE; the rows'
      fresh K/V replace theirs at `positions` (in a copy), so the keys stay in canvas order;
    - `keys`: the key mask, (B, 1, 1, N) or one row per query (B, 1, n, N); None: every key;
    - `capture`: a dict that receives the fresh ``k``, ``v`` (after RoPE, before the GQA
      repeat) and the branches' outputs ``attn`` and ``ffn`` added to the residual stream.

    With no options it is ``block(x, keys)`` bit for bit (tested)."""
    cfg = block.cfg
    pos = torch.arange(x.shape[1], device=x.device) if positions is None else positions
    span = kv[0].shape[2] if kv is not None else x.shape[1] if positions is None else None
    h = block.attn_norm(x)
    q = rotary_at(heads(block.q_proj, h, cfg.n_heads, cfg.head_dim), pos, cfg.rope_theta, cfg.rope_full_precision, span)
    k = rotary_at(heads(block.k_proj, h, cfg.kv_heads, cfg.head_dim), pos, cfg.rope_theta, cfg.rope_full_precision, span)
    v = heads(block.v_proj, h, cfg.kv_heads, cfg.head_dim)
    if capture is not None:
        capture.update(k=k, v=v)
    if kv is not None:
        k, v = put_rows(kv[0].clone(), k, pos, 2), put_rows(kv[1].clone(), v, pos, 2)
    attn = attend(block, q, k, v, keys)
    x = x + attn
    ffn = mlp(block, x)
    if capture is not None:
        capture.update(attn=attn, ffn=ffn)
    return x + ffn
