"""Training-free caches on LLaDA: the LLaDA group's cache rows of the ASRD table (paper profile).

Each is a backend with `LladaBackend`'s interface, built from LLaDA's own blocks; the block's
maths is repeated here (`block_forward`) with the few options a cache needs, so that
`tadm.models.llada` stays as it is. Written from the papers' and releases' descriptions (the
design note docs/design/training-free-caches.md, §2 and §3.4); no code of theirs is used.

- `LladaPrefixCacheBackend` (Fast-dLLM's prefix cache). A refresh is a full pass that keeps
  every layer's K and V (after RoPE): at the block's first pass (`begin_block`) and, with an
  interval K, whenever age + 1 >= K. A reuse pass runs every layer on the rows lo.. (the
  current block and the masked suffix) only, the kept K/V of the rows before lo in front.
  ``dual=True`` (Fast-dLLM's dual cache): a reuse pass runs the block's rows lo..hi only; the
  suffix's K/V stay as the refresh left them. On a bidirectional model both are approximate
  (the prefix's states depend on the suffix); with a block-causal mask they would be exact.
- `LladaFeatureCacheBackend` (dLLM-Cache as released). Per layer it keeps K, V and the
  attention and FFN branches' outputs of every row. A global pass counter over the whole
  generation refreshes the prompt rows every K_p passes and the response rows (the generated
  span, the canvas's tail) every K_r; layer 0 always computes every row. On a pass where the
  response is not due, each layer >= 1 computes V of every response row, and per sequence only
  the floor(rho G) rows whose V is least cosine-similar to the cached V are computed (V-verify);
  the cached V takes the new V of every row. A row not computed outputs its current input plus
  its cached branch outputs.
- `LladaNaiveReuseBackend`. The depth split (2, 22, 8) of LLaDA's 32 layers, scaled to the
  model's: front layers every pass, the middle layers' output (the residual stream after them)
  computed every K passes and reused in between, back layers and head every pass. As TADM's
  naive row, the back layers then read only the reused state: a reuse pass returns its
  refresh pass's logits.

Rows a prefix or dual reuse pass does not compute return the last full pass's logits; the
low-confidence decoders read only the current block's undecided rows, which every pass computes.

Accounting (`DecodeCounters.layer_calls_weighted`): the unit is one layer over the whole canvas
of N = P + G rows. A full pass is L; a prefix reuse pass L (N - lo) / N; a dual reuse pass
L (hi - lo) / N; a feature-cache pass 1 + (L - 1) n / N with n the rows computed
(P [prompt due] + G [response due] or floor(rho G)); a naive pass s + d, + a on a refresh.
`layer_calls` counts each layer run once per pass (the naive reuse skips the middle ones).
`budget_x` is TADM's share at the same K on this depth, (s + d + a / K) / L, for the rows
matched by refresh interval (None for the rows as released).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from tadm.asrd.backends import Backend, LladaBackend
from tadm.errors import ConfigError
from tadm.models.llada import LladaBlock, padding_keys

SPLIT = (2, 22, 8)  # front / middle / back of LLaDA-8B's 32 layers (TADM's 2/20/8 of 30, scaled)
Method = Literal["prefix", "dual", "feature", "naive"]


# ----------------------------------------------------------------------------- the block's maths


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


def _heads(proj: torch.nn.Linear, h: Tensor, heads: int, head_dim: int) -> Tensor:
    b, n, _ = h.shape
    return proj(h).view(b, n, heads, head_dim).transpose(1, 2)


def _put_rows(cache: Tensor, rows: Tensor, positions: Tensor, dim: int) -> Tensor:
    """`cache` with `rows` written at `positions` ((n,) or (B, n)) along `dim`, in place."""
    if positions.dim() == 1:
        cache.index_copy_(dim, positions, rows)
        return cache
    shape = [positions.shape[0]] + [1] * (cache.dim() - 1)
    shape[dim] = positions.shape[1]
    return cache.scatter_(dim, positions.view(shape).expand_as(rows), rows)


def _take_rows(x: Tensor, positions: Tensor) -> Tensor:
    """Rows `positions` ((n,) or (B, n)) of x (B, N, d)."""
    if positions.dim() == 1:
        return x[:, positions]
    return x.gather(1, positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def _attend(block: LladaBlock, q: Tensor, k: Tensor, v: Tensor, keys: Tensor | None) -> Tensor:
    """LladaBlock.attention after the projections: GQA, SDPA, output projection -> (B, n, d)."""
    cfg = block.cfg
    if cfg.kv_heads != cfg.n_heads:
        k = k.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
        v = v.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, is_causal=False)
    b, _, n, _ = q.shape
    return block.attn_out(out.transpose(1, 2).reshape(b, n, cfg.d_model))


def _mlp(block: LladaBlock, x: Tensor) -> Tensor:
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
    q = rotary_at(_heads(block.q_proj, h, cfg.n_heads, cfg.head_dim), pos, cfg.rope_theta, cfg.rope_full_precision, span)
    k = rotary_at(_heads(block.k_proj, h, cfg.kv_heads, cfg.head_dim), pos, cfg.rope_theta, cfg.rope_full_precision, span)
    v = _heads(block.v_proj, h, cfg.kv_heads, cfg.head_dim)
    if capture is not None:
        capture.update(k=k, v=v)
    if kv is not None:
        k, v = _put_rows(kv[0].clone(), k, pos, 2), _put_rows(kv[1].clone(), v, pos, 2)
    attn = _attend(block, q, k, v, keys)
    x = x + attn
    ffn = _mlp(block, x)
    if capture is not None:
        capture.update(attn=attn, ffn=ffn)
    return x + ffn


# ----------------------------------------------------------------------------- budgets


def scaled_split(n_layers: int, split: tuple[int, int, int] = SPLIT) -> tuple[int, int, int]:
    """`split` (front, middle, back) scaled to `n_layers`: front and back rounded, the back at
    least 1 layer (it and the head run every pass), the middle the rest (at least 1)."""
    total = sum(split)
    s, d = round(split[0] * n_layers / total), max(1, round(split[2] * n_layers / total))
    if n_layers - s - d < 1:
        raise ConfigError("asrd.llada_cache_methods", f"naive reuse needs at least 2 layers, the model has {n_layers}")
    return s, n_layers - s - d, d


def tadm_share(n_layers: int, k: int, split: tuple[int, int, int] = SPLIT) -> float:
    """(s + d + a / K) / L: TADM's layer calls per pass at refresh interval K, relative to the
    full model, with `split` scaled to this depth -- the budget a row refreshed every K matches."""
    s, a, d = scaled_split(n_layers, split)
    return (s + d + a / k) / n_layers


def _check_every(value, name: str, block_ok: bool = False) -> None:
    if block_ok and value == "block":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        allowed = '"block" or an integer >= 1' if block_ok else "an integer >= 1"
        raise ConfigError(name, f"must be {allowed}, got {value!r}")


# ----------------------------------------------------------------------------- backends


class _LladaCacheBackend(LladaBackend):
    """What the LLaDA caches share: the full pass of `LladaModel.forward` with K/V capture, the
    head, and the key mask of the current padding (`key_mask`, one place a test can change)."""

    budget_x: float | None = None

    def _check(self, model) -> None:
        if getattr(model, "model_type", None) != "llada":
            raise ConfigError("asrd model", f"{type(self).__name__} runs a LLaDA model, got {type(model).__name__}")

    @property
    def blocks(self) -> list[LladaBlock]:
        return self.model.blocks

    def key_mask(self, shape: tuple[int, int], device: torch.device) -> Tensor | None:
        """The key mask of a full pass over the canvas: the padding mask's (B, 1, 1, N) or None."""
        return padding_keys(self._padding, shape, device)

    def _logits(self, x: Tensor) -> Tensor:
        """`LladaModel.forward` after the blocks, then LladaBackend's float32 and masked class."""
        t = self.model.transformer
        x = t["ln_f"](x)
        out = (F.linear(x, t["wte"].weight) if self.model.cfg.weight_tying else t["ff_out"](x)).float()
        out[..., self.mask_id] = float("-inf")
        return out


def _query_rows(keys: Tensor | None, lo: int, hi: int) -> Tensor | None:
    return keys if keys is None or keys.shape[2] == 1 else keys[:, :, lo:hi]


class LladaPrefixCacheBackend(_LladaCacheBackend):
    """Fast-dLLM's prefix cache (``dual=True``: its dual cache), refreshed at each block's first
    pass and, with an integer `refresh_every` K, whenever age + 1 >= K (module docstring)."""

    def __init__(self, model, refresh_every: int | Literal["block"] = "block", dual: bool = False):
        super().__init__(model)
        _check_every(refresh_every, "asrd.llada_cache_refresh", block_ok=True)
        self.every, self.dual = refresh_every, dual
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
        return self._kv is None or self._age is None or (self.every != "block" and self._age + 1 >= self.every)

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


@dataclass
class _Features:
    """One layer's cached rows (B = batch, N = canvas)."""

    k: Tensor  # (B, kv_heads, N, head_dim), after RoPE
    v: Tensor  # (B, kv_heads, N, head_dim)
    attn: Tensor  # (B, N, d): the attention branch's output
    ffn: Tensor  # (B, N, d): the FFN branch's output


class LladaFeatureCacheBackend(_LladaCacheBackend):
    """dLLM-Cache as released: prompt rows refreshed every `prompt_every` (K_p) passes, response
    rows every `response_every` (K_r), V-verify with share `share` (rho) between (module
    docstring). The response is the canvas from the first block's start on (`begin_block`)."""

    def __init__(self, model, prompt_every: int, response_every: int, share: float):
        super().__init__(model)
        _check_every(prompt_every, "asrd.llada_dllm_cache.prompt_every")
        _check_every(response_every, "asrd.llada_dllm_cache.response_every")
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
            v_new = _heads(block.v_proj, h[:, start:], cfg.kv_heads, cfg.head_dim)
            sim = F.cosine_similarity(v_new.transpose(1, 2).flatten(2), st.v[:, :, start:].transpose(1, 2).flatten(2), dim=-1)
            pick = sim.topk(self.selected(n - start), dim=-1, largest=False).indices.sort(dim=-1).values
            picked = response[pick]
            st.v[:, :, start:] = v_new  # every response row's V (the picked rows get theirs below)
        parts = ([torch.arange(start, device=x.device).expand(b, -1)] if prompt_due else []) + [picked]
        rows = torch.cat(parts, dim=1).sort(dim=-1).values  # (B, n_rows), in canvas order
        if rows.shape[1] == 0:
            return x + st.attn + st.ffn, 0
        hs = _take_rows(h, rows)
        q = rotary_at(_heads(block.q_proj, hs, cfg.n_heads, cfg.head_dim), rows, cfg.rope_theta, cfg.rope_full_precision, n)
        k = rotary_at(_heads(block.k_proj, hs, cfg.kv_heads, cfg.head_dim), rows, cfg.rope_theta, cfg.rope_full_precision, n)
        _put_rows(st.k, k, rows, 2)
        _put_rows(st.v, _heads(block.v_proj, hs, cfg.kv_heads, cfg.head_dim), rows, 2)
        query_keys = keys if keys is None or keys.shape[2] == 1 else keys.expand(b, -1, -1, -1).gather(
            2, rows[:, None, :, None].expand(-1, 1, -1, n))
        _put_rows(st.attn, _attend(block, q, st.k, st.v, query_keys), rows, 1)
        x = x + st.attn
        _put_rows(st.ffn, _mlp(block, _take_rows(x, rows)), rows, 1)
        return x + st.ffn, rows.shape[1]


class LladaNaiveReuseBackend(_LladaCacheBackend):
    """Naive reuse: front layers every pass, the middle layers' output computed every
    `refresh_every` (K) passes and reused in between, back layers and head every pass."""

    def __init__(self, model, refresh_every: int, split: tuple[int, int, int] = SPLIT):
        _check_every(refresh_every, "asrd.llada_cache_refresh")
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


# ----------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class CacheSpec:
    """A cache row of the LLaDA group: the method and its intervals (`build` makes the backend).

    prefix / dual: `every` = K, or None (refreshed once per block, as released); feature:
    `every` = K_r, `prompt_every` = K_p, `share` = rho; naive: `every` = K."""

    method: Method
    every: int | None = None
    prompt_every: int | None = None
    share: float | None = None

    def build(self, model) -> Backend:
        if self.method in ("prefix", "dual"):
            return LladaPrefixCacheBackend(model, self.every or "block", dual=self.method == "dual")
        if self.method == "feature":
            return LladaFeatureCacheBackend(model, self.prompt_every, self.every, self.share)
        if self.method == "naive":
            return LladaNaiveReuseBackend(model, self.every)
        raise ConfigError("asrd.llada_cache_methods", f"unknown cache method {self.method!r}")
