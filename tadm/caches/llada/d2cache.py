"""d²Cache on LLaDA, as released (Kamichanw/d2Cache @72feb60: `src/cache/d2cache.py`, the helpers
`certainty_density`, `nucleus_select` and `top_up_mask_` of `src/utils/common.py`, and the loop
`src/generation/vanilla.py`), written from reading them; no code of theirs is used.

One cache for the whole generation (never dropped). The first pass is full and keeps every
layer's K and V. Every later pass computes one row set Q at every layer: each layer writes the
K, V of Q into the cache, Q's queries attend (eager softmax) to all N keys, and the FFN runs on Q;
rows outside Q get zero logits (the mask class −inf). Q is chosen from the step that the last
pass served, here at the start of the next pass (`logits`), from the previous input and the
current one. With G the generated positions (the region, after the prompt's P):

- conf0 (B, G): the confidence (softmax max) of the first pass, kept for the whole generation
  (the release's later writes go to a copy);
- score = conf0 · density(decided, σ), density the Gaussian-kernel mean of "decided" over G
  (`certainty_density`), plus max(score) over the batch at the positions of the last step's
  block that were masked before the step (blk);
- the current_k best-scored still-masked positions between blk's first position and the block
  boundary (multiples of |blk|) at or after the position where current_k masked positions are
  reached, plus the positions the step decoded;
- plus a nucleus (top-p = rollout_p, at least 1) of the other canvas rows by the column sums of
  the last pass's attention rollout (per layer A = I with Q's rows replaced by the head-mean
  attention rows, R <- rownorm(A + I) R);
- with inflate_w > 0, every row in a gap of at most inflate_w between two selected rows.

Sequences with fewer rows are topped up to the batch's most by the still-masked positions of
highest score, then by rollout importance (the release's `top_up_mask`).

Where this differs from the release: the mask class's logit is −inf (this project's LLaDA
convention: uncomputed rows read confidence 1/(V−1), not 1/V); the batch's padding key mask
applies with unshifted positions (the release shifts positions by the padding; RoPE is relative,
so only the pad rows' own attention, and through the rollout the nucleus, can differ). The
release's decoder also ranks by conf · density (its `sigma`); `decode` ranks by confidence.

Accounting: the first pass is L layer calls, every later one L |Q| / N (|Q| after the top-up).
The rollout's (N × N) products per layer are not counted. `budget_x` is None.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tadm.asrd.certainty import certainty_density
from tadm.caches.llada.base import LladaCacheBackend
from tadm.caches.llada.block import heads, mlp, put_rows, rotary_at, take_rows


def nucleus(scores: Tensor, top_p: float, allowed: Tensor, min_k: int = 1) -> Tensor:
    """(B, N) bool: per row, the allowed entries of `scores` whose share of the allowed total,
    taken in descending order, keeps the running sum <= top_p, and the min_k largest."""
    s = torch.where(allowed, scores, torch.zeros_like(scores))
    share = s / (s.sum(-1, keepdim=True) + 1e-9)
    ordered, order = torch.sort(share, dim=-1, descending=True)
    keep = (ordered.cumsum(-1) <= top_p) | (torch.arange(s.shape[-1], device=s.device) < min(min_k, s.shape[-1]))
    keep &= torch.gather(allowed, 1, order)
    return torch.zeros_like(allowed).scatter_(1, order, keep)


def inflate(q: Tensor, width: int) -> Tensor:
    """q (B, N) bool with every row of a gap of length <= width between two selected rows added."""
    b, n = q.shape
    idx = torch.arange(n, device=q.device).expand(b, n)
    nxt = torch.flip(torch.cummin(torch.flip(torch.where(q, idx, n), dims=[-1]), dim=-1).values, dims=[-1])
    prv = torch.cummax(torch.where(q, idx, -1), dim=-1).values
    return q | (((nxt - idx) + (idx - prv) <= width) & (prv >= 0) & (nxt < n))


def top_up(q: Tensor, scores: Tensor) -> Tensor:
    """q (B, N) with each row filled to the batch's largest count by its best-`scores` free rows."""
    counts = q.sum(-1)
    need = (int(counts.max()) - counts).clamp(min=0)
    if int(need.max()) == 0:
        return q
    q = q.clone()
    picks = torch.topk(torch.where(q, torch.full_like(scores, float("-inf")), scores), int(need.max()), dim=-1).indices
    take = torch.arange(picks.shape[1], device=q.device) < need.unsqueeze(-1)
    rows = torch.arange(q.shape[0], device=q.device).unsqueeze(-1).expand_as(picks)
    q[rows[take], picks[take]] = True
    return q


def _check(name: str, ok: bool, allowed: str, value) -> None:
    if not ok:
        raise ValueError(f"{name}: must be {allowed}, got {value!r}")


class LladaD2CacheBackend(LladaCacheBackend):
    """d²Cache (module docstring) with the release's `rollout_p`, `current_k`, `sigma` and
    `inflate_w` (its class defaults 0.1, 32, 10.0, 4; its configs set inflate_w 0 for a decode
    over the whole span and 4 with semi-AR blocks of 32)."""

    def __init__(self, model, rollout_p: float = 0.1, current_k: int = 32, sigma: float = 10.0, inflate_w: int = 0):
        super().__init__(model)
        _check("rollout_p", isinstance(rollout_p, (int, float)) and 0.0 <= rollout_p <= 1.0, "in [0, 1]", rollout_p)
        _check("current_k", isinstance(current_k, int) and not isinstance(current_k, bool) and current_k >= 1,
               "an integer >= 1", current_k)
        _check("sigma", isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0, "> 0", sigma)
        _check("inflate_w", isinstance(inflate_w, int) and not isinstance(inflate_w, bool) and inflate_w >= 0,
               "an integer >= 0", inflate_w)
        self.rollout_p, self.current_k, self.sigma, self.inflate_w = float(rollout_p), current_k, float(sigma), inflate_w
        self.start()

    def start(self) -> None:
        super().start()
        self._kv: list[tuple[Tensor, Tensor]] | None = None
        self._prompt: int | None = None  # P: the first block's start
        self._block: tuple[int, int] | None = None  # the block of the coming pass
        self._served: tuple[int, int] | None = None  # the block of the last pass
        self._prev: Tensor | None = None  # the last pass's input ids
        self._conf0: Tensor | None = None  # (B, G)
        self._importance: Tensor | None = None  # (B, N): column sums of the last pass's rollout
        self.last_rows: Tensor | None = None  # (B, N) bool: the rows the last pass computed

    def begin_block(self, lo: int, hi: int) -> None:
        if self._prompt is None:
            self._prompt = lo
        self._block = (lo, hi)

    # -- the row set --------------------------------------------------------------------

    def _select(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """(Q (B, N) bool, the scores (B, G)) for this pass, from the step the last pass served."""
        p, mask_id = self._prompt, self.mask_id
        b, n = ids.shape
        g = n - p
        rem = ids[:, p:] == mask_id
        before = self._prev[:, p:] == mask_id
        cols = torch.arange(g, device=ids.device)
        lo, hi = self._served
        blk = before & (cols >= lo - p) & (cols < hi - p)
        decoded = before & ~rem
        score = self._conf0 * certainty_density(~rem, self.sigma)
        score = score + torch.where(blk, score.max(), torch.zeros_like(score))
        reached = rem.int().cumsum(1) >= self.current_k
        m = torch.where(reached.any(1, keepdim=True), reached.int().argmax(1, keepdim=True),
                        torch.full_like(cols[:1], g - 1))
        size = blk.sum(1, keepdim=True).clamp(min=1)  # >= 1 after any step (a step decodes in its block)
        end = (m // size + 1) * size - 1
        start = blk.int().argmax(1, keepdim=True)
        window = (cols >= start) & (cols <= end) & rem
        picks = torch.topk(torch.where(window, score, torch.full_like(score, float("-inf"))),
                           min(self.current_k, g), dim=-1).indices
        chosen = torch.zeros_like(rem).scatter_(1, picks, True) & rem
        q = F.pad(chosen | decoded, (p, 0), value=False)
        q |= nucleus(self._importance, self.rollout_p, ~q)
        if self.inflate_w > 0:
            q = inflate(q, self.inflate_w)
        return q, score

    # -- a pass -------------------------------------------------------------------------

    def _layer(self, block, x: Tensor, pos: Tensor | None, kv: tuple[Tensor, Tensor] | None, keys: Tensor | None):
        """One block over the rows x at `pos` ((B, n); None: the whole canvas), eager attention over
        every key: (x out, (K, V) of the canvas, head-mean attention weights (B, n, N))."""
        cfg = block.cfg
        positions = torch.arange(x.shape[1], device=x.device) if pos is None else pos
        span = x.shape[1] if kv is None else kv[0].shape[2]
        h = block.attn_norm(x)
        q = rotary_at(heads(block.q_proj, h, cfg.n_heads, cfg.head_dim), positions, cfg.rope_theta,
                      cfg.rope_full_precision, span)
        k = rotary_at(heads(block.k_proj, h, cfg.kv_heads, cfg.head_dim), positions, cfg.rope_theta,
                      cfg.rope_full_precision, span)
        v = heads(block.v_proj, h, cfg.kv_heads, cfg.head_dim)
        if kv is None:
            kv = (k, v)
        else:
            put_rows(kv[0], k, pos, 2)
            put_rows(kv[1], v, pos, 2)
        k_all, v_all = kv
        if cfg.kv_heads != cfg.n_heads:
            k_all = k_all.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
            v_all = v_all.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
        logits = q @ k_all.transpose(2, 3) / math.sqrt(cfg.head_dim)
        if keys is not None:
            logits = logits.masked_fill(~keys, torch.finfo(logits.dtype).min)
        weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(q.dtype)
        out = weights @ v_all
        b, _, rows, _ = q.shape
        x = x + block.attn_out(out.transpose(1, 2).reshape(b, rows, cfg.d_model))
        return x + mlp(block, x), kv, weights.mean(dim=1)

    @torch.no_grad()
    def logits(self, ids: Tensor, delta: Tensor | None = None) -> Tensor:
        if self._prompt is None:
            raise RuntimeError("LladaD2CacheBackend: decode calls begin_block before the first pass")
        e = self._input_embeds(ids, delta)
        b, n = ids.shape
        layers = self.model.n_layers
        keys = self.key_mask((b, n), e.device)
        eye = torch.eye(n, device=e.device, dtype=e.dtype)
        rollout = eye.expand(b, n, n)
        full = self._kv is None
        if full:
            x, self._kv = e, []
            for block in self.blocks:
                x, kv, attn = self._layer(block, x, None, None, keys)
                self._kv.append(kv)
                rollout = self._roll(rollout, attn, eye)
            out = self._logits(x)
            self._conf0 = torch.softmax(out[:, self._prompt:], dim=-1).max(-1).values  # decode's confidence
            q = torch.ones(b, n, dtype=torch.bool, device=e.device)
            computed = n
        else:
            q, score = self._select(ids)
            if bool((q.sum(1) != q.sum(1).max()).any()):
                g = n - self._prompt
                combined = torch.where(q, torch.full_like(self._importance, float("-inf")), self._importance)
                combined[:, -g:] += combined.max() + score
                q = top_up(q, combined)
            computed = int(q.sum(1).max())
            pos = torch.argsort((~q).to(torch.int8), dim=1, stable=True)[:, :computed]  # Q's rows in order
            x = take_rows(e, pos)
            for block, kv in zip(self.blocks, self._kv):
                x, _, attn = self._layer(block, x, pos, kv, keys)
                full_attn = eye.repeat(b, 1, 1)
                full_attn.scatter_(1, pos.unsqueeze(-1).expand(-1, -1, n), attn)
                rollout = self._roll(rollout, full_attn, eye)
            lg = self._logits(x)
            out = torch.zeros(b, n, lg.shape[-1], dtype=lg.dtype, device=lg.device)
            out[..., self.mask_id] = float("-inf")
            out.scatter_(1, pos.unsqueeze(-1).expand_as(lg), lg)
        self._importance = rollout.sum(dim=1)
        self._prev, self._served, self.last_rows = ids, self._block, q
        self._advance(full)
        self._count_layers(layers, layers * computed / n)
        return out

    @staticmethod
    def _roll(rollout: Tensor, attn: Tensor, eye: Tensor) -> Tensor:
        """One layer of the rollout: rownorm(A + I) @ R (A: (B, N, N) head-mean attention rows)."""
        a = attn + eye
        return (a / a.sum(dim=-1, keepdim=True)) @ rollout
