"""dLLM-Cache's feature cache with V-verify on the frozen DiffusionGemma decoder (training-free).

Per decoder layer the cache holds the canvas's K (after RoPE), V, the attention branch's output
A (after the post-attention norm) and the FFN branch's output F (after the post-FFN norm); the
residual stream itself is never cached. A step of a canvas is

    refresh (TADM's rule with K_r: the first step of a canvas, a new prefix, or age + 1 >= K_r):
        every layer is the stock layer; layers >= 1 record K, V, A, F
    reuse, layer 0:      the stock layer (dLLM-Cache's release always recomputes layer 0)
    reuse, layer i >= 1 (:func:`partial_layer`):
        V of every row; per sequence the n_sel = floor(share * N) rows whose V is least cosine-
        similar to the cached V (heads flattened) are recomputed: their Q and K, attention of those
        queries over [encoder prefix K/V ; canvas K/V] (cached K with the selected rows replaced,
        the new V of every row), and the FFN (dense MLP and MoE) on their rows; the results are
        written into A and F, and the layer returns ((x + A) + F) * layer_scalar, the stock order.

dLLM-Cache's prompt cache (K_p) has nothing to do here: DiffusionGemma's prompt lives in the
encoder's KV cache, computed once per canvas and exact. Stock layer calls are counted by
:class:`tadm.experiments.diffusiongemma.DecoderLayerCalls`'s hooks as for every other row; the partial
work is counted in ``partial_layer_calls`` (sum of n_sel / N over the partial layers).

With K_r = 1 every step takes the stock path, and with share = 1 the partial path recomputes
every row in position order with the stock kernels and shapes; both give the base's tokens
exactly (tested).

The same state and partial layer serve caches that choose one row set per step instead of per
layer (:class:`StepSelectionCache`: dKV-Cache's and d²Cache's rules,
`tadm.caches.diffusiongemma.dkv` and `.d2cache`): :func:`partial_layer` given ``rows`` recomputes
those rows' V only (the others keep their cached V), and such a cache runs every layer, layer 0
included, through it on a reuse step (``full_layers = 0``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from tadm.compat import require_transformers

require_transformers(what="DiffusionGemma paths (tadm.caches.diffusiongemma)")  # before transformers' DiffusionGemma

from transformers.models.diffusion_gemma import modeling_diffusion_gemma as mdg
from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationMixin

from tadm.caches.budget import matched_share, selected_rows
from tadm.errors import ConfigError
from tadm.posttrain.anchored import TimeAnchoredDiffusionGemma
from tadm.posttrain.backbone import DecoderInputs, SplitDiffusionGemma
from tadm.sampling.anchor_cache import FixedInterval


@dataclass
class LayerState:
    """One decoder layer's cached canvas features (B = batch, N = canvas rows)."""

    k: torch.Tensor  # (B, H_kv, N, head_dim), after k_norm and RoPE
    v: torch.Tensor  # (B, H_kv, N, head_dim), after v_norm
    attn: torch.Tensor  # (B, N, d): post_attention_layernorm(o_proj(attention))
    ffn: torch.Tensor  # (B, N, d): post_feedforward_layernorm(MLP + MoE)


@dataclass
class FeatureCacheCounters:
    steps: int = 0  # decoder calls (denoising steps)
    refreshes: int = 0
    full_layer_calls: int = 0  # stock layer calls (what the hooks count)
    partial_layer_calls: float = 0.0  # sum of n_sel / N over partial layers

    @property
    def weighted_layer_calls(self) -> float:
        return self.full_layer_calls + self.partial_layer_calls


@dataclass
class _FeatureCache:
    states: list[LayerState | None] = field(default_factory=list)
    age: int = 0  # steps since the refresh
    prefix: int = 0  # encoder cache length of the canvas it belongs to


# ----------------------------------------------------------------------------- row gather / scatter


def _row_index(idx: torch.Tensor, like: torch.Size, dim: int) -> torch.Tensor:
    """`idx` (B, n) broadcast to `like` with n rows along `dim` (batch first)."""
    view = [idx.shape[0]] + [1] * (len(like) - 1)
    view[dim] = idx.shape[1]
    shape = list(like)
    shape[dim] = idx.shape[1]
    return idx.view(view).expand(shape)


def gather_rows(x: torch.Tensor, idx: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """x's rows `idx` (B, n) along `dim`, per sequence; a batch dimension of 1 is broadcast."""
    x = x.expand(idx.shape[0], *x.shape[1:])
    return x.gather(dim, _row_index(idx, x.shape, dim))


def scatter_rows(x: torch.Tensor, idx: torch.Tensor, src: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """A copy of x with its rows `idx` (B, n) along `dim` replaced by `src`."""
    return x.scatter(dim, _row_index(idx, x.shape, dim), src)


# ----------------------------------------------------------------------------- one decoder layer


def stock_layer(layer: nn.Module, x: torch.Tensor, inputs: DecoderInputs, kind: str) -> torch.Tensor:
    """The stock decoder layer, called as SplitDiffusionGemma.layers calls it (hooks see it)."""
    return layer(x, position_embeddings=inputs.position_embeddings[kind], attention_mask=inputs.mask_mapping[kind],
                 position_ids=inputs.position_ids, cache=inputs.cache)


def capture_layer(layer: nn.Module, x: torch.Tensor, inputs: DecoderInputs, kind: str) -> tuple[torch.Tensor, LayerState]:
    """The stock layer's output and its canvas features, read by forward hooks on k_norm, v_norm
    and the two post-branch norms (each must run exactly once per layer call)."""
    got: dict[str, list[torch.Tensor]] = {"k": [], "v": [], "attn": [], "ffn": []}
    attn = layer.self_attn
    modules = {"k": attn.k_norm, "v": attn.v_norm, "attn": layer.post_attention_layernorm,
               "ffn": layer.post_feedforward_layernorm}
    hooks = [m.register_forward_hook(lambda _m, _i, out, key=key: got[key].append(out)) for key, m in modules.items()]
    try:
        out = stock_layer(layer, x, inputs, kind)
    finally:
        for h in hooks:
            h.remove()
    if any(len(v) != 1 for v in got.values()):  # a transformers change: the capture would be wrong
        raise RuntimeError(f"feature cache: expected one call of each captured norm, got "
                           f"{ {k: len(v) for k, v in got.items()} }")
    cos, sin = inputs.position_embeddings[kind]
    k = mdg.apply_rotary_pos_emb(got["k"][0], cos, sin, unsqueeze_dim=2).transpose(1, 2)
    return out, LayerState(k=k, v=got["v"][0].transpose(1, 2), attn=got["attn"][0], ffn=got["ffn"][0])


def least_similar_rows(v: torch.Tensor, cached: torch.Tensor, n_sel: int, dtype: torch.dtype) -> torch.Tensor:
    """V-verify: per sequence, the n_sel rows whose V (heads flattened) has the lowest cosine
    similarity, computed in `dtype`, to the cached V; (B, n_sel) in position order."""
    now, then = v.transpose(1, 2).flatten(2).to(dtype), cached.transpose(1, 2).flatten(2).to(dtype)
    sim = F.cosine_similarity(now, then, dim=-1)
    return torch.topk(sim, n_sel, dim=-1, largest=False).indices.sort(dim=-1).values


def feed_forward(layer: nn.Module, r: torch.Tensor) -> torch.Tensor:
    """The stock layer's FFN branch on rows r (B, n, d): dense MLP + MoE, post-FFN norm."""
    dense = layer.post_feedforward_layernorm_1(layer.mlp(layer.pre_feedforward_layernorm(r)))
    flat = r.reshape(-1, r.shape[-1])
    _, weights, experts = layer.router(flat)
    moe = layer.experts(layer.pre_feedforward_layernorm_2(flat), experts, weights).reshape(r.shape)
    return layer.post_feedforward_layernorm(dense + layer.post_feedforward_layernorm_2(moe))


def partial_layer(layer: nn.Module, x: torch.Tensor, inputs: DecoderInputs, kind: str, state: LayerState,
                  n_sel: int, similarity_dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None,
                  observe: Callable | None = None) -> torch.Tensor:
    """A reuse step of one decoder layer (module docstring); updates `state` in place.

    `rows` None: V-verify picks the n_sel rows, and the V of every row is recomputed (as released).
    `rows` (B, n), in position order: a selection made once for the step (every layer recomputes
    the same rows; n_sel is not read); only those rows' V is recomputed, every other row keeps its
    cached K, V and branch outputs. `observe(q, keys, mask)`, when given, is called with the
    recomputed rows' queries (B, H, n, head_dim, after RoPE), the keys [encoder prefix ; canvas]
    and the rows' attention mask (None: no mask), for a cache that reads attention weights.

    The attention interface is the layer's own (config._attn_implementation) with the stock
    scaling, sliding window and is_causal; position_ids, which the stock layer forwards to it and
    only packed-sequence flash-attention reads, are not passed (the canvas is never packed)."""
    attn = layer.self_attn
    b, n, _ = x.shape
    h = layer.input_layernorm(x)
    raw_k = None
    if rows is None:  # V-verify
        heads = (b, n, -1, attn.head_dim)
        raw_k = attn.k_proj(h).view(heads) if attn.v_proj is None else None  # full attention: V from k_proj
        v = attn.v_norm(raw_k if raw_k is not None else attn.v_proj(h).view(heads)).transpose(1, 2)
        idx = least_similar_rows(v, state.v, n_sel, similarity_dtype) if n_sel else None
        state.v = v  # as released: the new V of every row
    else:
        idx = rows if rows.shape[1] else None
    if idx is not None:
        n_sel = idx.shape[1]
        cos, sin = (gather_rows(t, idx) for t in inputs.position_embeddings[kind])
        h_sel = gather_rows(h, idx)
        sel = (b, n_sel, -1, attn.head_dim)
        q = attn.q_norm(attn.q_proj(h_sel).view(sel))
        q = mdg.apply_rotary_pos_emb(q, cos, sin, unsqueeze_dim=2).transpose(1, 2)
        k_sel = gather_rows(raw_k, idx) if raw_k is not None else attn.k_proj(h_sel).view(sel)
        if rows is not None:  # the selected rows' V (full attention: from k_proj, as the stock layer)
            v_sel = attn.v_norm(k_sel if attn.v_proj is None else attn.v_proj(h_sel).view(sel)).transpose(1, 2)
            state.v = scatter_rows(state.v, idx, v_sel, dim=2)
        k = attn.k_norm(k_sel)
        k = mdg.apply_rotary_pos_emb(k, cos, sin, unsqueeze_dim=2).transpose(1, 2)
        state.k = scatter_rows(state.k, idx, k, dim=2)
        keys, values = (attn.append_to_cache(inputs.cache, state.k, state.v) if inputs.cache is not None
                        else (state.k, state.v))
        mask = inputs.mask_mapping[kind]
        mask = gather_rows(mask, idx, dim=2) if mask is not None else None
        if observe is not None:
            observe(q, keys, mask)
        interface = mdg.ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation,
                                                              mdg.eager_attention_forward)
        o, _ = interface(attn, q, keys, values, mask, dropout=0.0, scaling=attn.scaling,
                         sliding_window=attn.sliding_window, is_causal=attn.is_causal)
        o = attn.o_proj(o.reshape(b, n_sel, -1).contiguous())
        state.attn = scatter_rows(state.attn, idx, layer.post_attention_layernorm(o))
    x1 = x + state.attn
    if idx is not None:
        state.ffn = scatter_rows(state.ffn, idx, feed_forward(layer, gather_rows(x1, idx)))
    out = x1 + state.ffn
    out *= layer.layer_scalar  # in place, as the stock layer: the output keeps x's dtype
    return out


# ----------------------------------------------------------------------------- the model


class FeatureCacheDiffusionGemma(DiffusionGemmaGenerationMixin, nn.Module):
    """The frozen DiffusionGemma decoding with the feature cache; ``generate(..., refresh_every=K_r)``.

    The same shell as TimeAnchoredDiffusionGemma: transformers' ``generate`` (encoder, canvases,
    sampler) runs unchanged and calls ``forward`` once per denoising step. `share` is the fraction
    of canvas rows a partial layer recomputes (n_sel = floor(share * N); default
    :func:`tadm.caches.budget.matched_share` of the split, TADM's layer calls at the same interval);
    `similarity_dtype` the precision of V-verify's cosine similarity."""

    def __init__(self, split: SplitDiffusionGemma, refresh_every: int = 1, share: float | None = None,
                 similarity_dtype: torch.dtype = torch.float32):
        nn.Module.__init__(self)
        self.split = split
        self.refresh_every = refresh_every
        self.share = matched_share(split.split) if share is None else share
        self.similarity_dtype = similarity_dtype
        self.counters = FeatureCacheCounters()
        self._cache: _FeatureCache | None = None

    # what the generation mixin reads from a DiffusionGemmaForBlockDiffusion: the base's, read
    # through the split exactly as TADM's model reads them (its property objects, reused)
    config = TimeAnchoredDiffusionGemma.config
    model = TimeAnchoredDiffusionGemma.model
    generation_config = TimeAnchoredDiffusionGemma.generation_config
    dtype = TimeAnchoredDiffusionGemma.dtype
    device = TimeAnchoredDiffusionGemma.device

    @property
    def refresh_every(self) -> int:
        return self.refresh.K

    @refresh_every.setter
    def refresh_every(self, k: int) -> None:
        # the features' refresh policy
        self.refresh = FixedInterval.parse(k, "posttrain.refresh_every", "K_r (the feature cache's refresh interval)")

    @property
    def share(self) -> float:
        return self._share

    @share.setter
    def share(self, rho: float) -> None:
        if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0 < rho <= 1:
            raise ConfigError("posttrain.feature_cache_share", f"the recomputed share must be in (0, 1], got {rho!r}")
        self._share = float(rho)

    @property
    def partial_layer_calls(self) -> float:
        """Sum of n_sel / N over the partial layers since the last reset (Table 1's weighting)."""
        return self.counters.partial_layer_calls

    def reset(self) -> None:
        """Forget the cached features and zero the counters."""
        self._cache, self.counters = None, FeatureCacheCounters()

    def _due(self, x: torch.Tensor, self_conditioning_logits, prefix: int) -> bool:
        """TADM's refresh rule with K_r (anchored.py): new canvas, new prefix, or the interval."""
        stale = self._cache
        return (stale is None or self_conditioning_logits is None or stale.prefix != prefix
                or self.refresh.stale(stale.age + 1) or stale.states[-1].attn.shape != x.shape)

    def forward(self, decoder_input_ids: torch.Tensor, cache=None, self_conditioning_logits=None,
                self_conditioning_mask=None, decoder_attention_mask=None, decoder_position_ids=None,
                **unused) -> mdg.DiffusionGemmaBlockDiffusionOutputWithPast:
        """One denoising step's decoder call with the features refreshed or partly recomputed."""
        if unused.get("input_ids") is not None:
            raise ValueError("input_ids: the feature-cache forward runs the decoder only; encode the prompt first")
        split = self.split
        inputs = split.prepare(decoder_input_ids, cache, decoder_attention_mask, decoder_position_ids)
        x = split.embed(decoder_input_ids, self_conditioning_logits, self_conditioning_mask)
        prefix = cache.get_seq_length(layer_idx=0)
        layers, kinds = split.decoder.layers, split.text_config.layer_types
        refresh = len(layers) <= self.full_layers or self._due(x, self_conditioning_logits, prefix)
        if refresh:
            self._cache = _FeatureCache([None] * len(layers), 0, prefix)
        else:
            self._cache.age += 1
        rows = self._step_rows(decoder_input_ids, refresh, self_conditioning_logits is None)
        n_sel = selected_rows(self.share, x.shape[1]) if rows is None else rows.shape[1]
        for i, layer in enumerate(layers):
            x = self._layer(i, layer, x, inputs, kinds[i], refresh, rows, n_sel)
        self._count(refresh, len(layers), n_sel / x.shape[1])
        logits = split.head(x)
        self._step_done(logits, refresh, self_conditioning_logits is None)
        return mdg.DiffusionGemmaBlockDiffusionOutputWithPast(logits=logits)

    # what a cache with a per-step row selection overrides (StepSelectionCache)
    full_layers = 1  # layers [0, full_layers) run whole, uncached, on reuse steps too (the release's layer 0)

    def _step_rows(self, ids: torch.Tensor, refresh: bool, new_canvas: bool) -> torch.Tensor | None:
        """The rows (B, n) that every partial layer of this step recomputes; None (here): each
        layer picks its own n_sel rows by V-verify."""
        return None

    def _layer(self, i: int, layer: nn.Module, x: torch.Tensor, inputs: DecoderInputs, kind: str, refresh: bool,
               rows: torch.Tensor | None, n_sel: int) -> torch.Tensor:
        """Decoder layer i of a step: stock below full_layers, stock and captured on a refresh,
        else :func:`partial_layer`."""
        states = self._cache.states
        if i < self.full_layers:
            return stock_layer(layer, x, inputs, kind)
        if refresh:
            x, states[i] = capture_layer(layer, x, inputs, kind)
            return x
        return partial_layer(layer, x, inputs, kind, states[i], n_sel, self.similarity_dtype, rows=rows)

    def _step_done(self, logits: torch.Tensor, refresh: bool, new_canvas: bool) -> None:
        """Called with each step's logits (nothing here)."""

    def _count(self, refresh: bool, depth: int, fraction: float) -> None:
        c, whole = self.counters, self.full_layers
        c.steps += 1
        c.refreshes += int(refresh)
        c.full_layer_calls += depth if refresh else whole
        c.partial_layer_calls += 0.0 if refresh else (depth - whole) * fraction

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, refresh_every: int | None = None, **kwargs):
        """transformers' DiffusionGemma ``generate`` with the features refreshed every K_r steps."""
        if refresh_every is not None:
            self.refresh_every = refresh_every
        self._cache = None
        try:
            return super().generate(input_ids, **kwargs)
        finally:
            self._cache = None


def fill_rows(want: torch.Tensor, priority: torch.Tensor) -> torch.Tensor:
    """The rows (B, n) of `want` (B, N) bool in position order, n the most any sequence wants: a
    sequence that wants fewer is topped up with its highest-`priority` rows not wanted (ties: the
    lower position), as d²Cache's release tops up a batch. n may be 0 (nothing to recompute)."""
    counts = want.sum(1)
    n = int(counts.max())
    need = n - counts
    if int(need.max()) > 0:
        free = torch.where(want, torch.full_like(priority, float("-inf")), priority.to(torch.float64))
        order = torch.sort(free, dim=1, descending=True, stable=True).indices[:, : int(need.max())]
        take = torch.arange(order.shape[1], device=want.device) < need.unsqueeze(1)
        want = want.clone()
        want[torch.arange(want.shape[0], device=want.device).unsqueeze(1).expand_as(order)[take], order[take]] = True
    return torch.argsort((~want).to(torch.int8), dim=1, stable=True)[:, :n]


class StepSelectionCache(FeatureCacheDiffusionGemma):
    """The feature cache's state and partial layers with one row set per reuse step, chosen by a
    rule from what the sampler has decided (dKV-Cache, d²Cache): on a reuse step every layer, layer
    0 included, recomputes those rows only (their Q, K, V, attention and FFN), and every other row
    keeps its cached K, V and branch outputs; a refresh (TADM's rule with K) captures every layer.

    A position is *decided* in a step's input when the entropy-bound sampler accepted it at the
    end of the previous step (transformers' ``EntropyBoundSampler.accepted_token_mask``, read from
    the sampler ``generate`` builds; every other position holds a fresh random token,
    ``renoise_canvas``); nothing is decided in a canvas's first input. Subclasses give
    :meth:`select`, called on every reuse step with this and the previous step's inputs; a
    batch's sequences are topped up to equal counts by :func:`fill_rows`, and a reuse step counts
    L n / N partial layer calls (n after the top-up). `last_rows` holds the last step's rows (B, n)
    (None on a refresh); `sampler` may be set by hand to drive ``forward`` outside ``generate``."""

    full_layers = 0

    def __init__(self, split: SplitDiffusionGemma, refresh_every: int = 1):
        super().__init__(split, refresh_every, share=1.0)  # V-verify's share: not read here
        self.sampler = None
        self.last_rows: torch.Tensor | None = None
        self._seen: tuple[torch.Tensor, torch.Tensor] | None = None  # (ids, decided) of the last step's input

    def _prepare_sampler(self, generation_config):
        """transformers' sampler for this ``generate``, kept to read its accepted positions."""
        self.sampler = super()._prepare_sampler(generation_config)
        return self.sampler

    def decided(self, ids: torch.Tensor, new_canvas: bool) -> torch.Tensor:
        """(B, N) bool: the positions of this input that the sampler accepted at the last step."""
        if new_canvas:
            return torch.zeros_like(ids, dtype=torch.bool)
        got = getattr(self.sampler, "accepted_token_mask", None)
        if not isinstance(got, torch.Tensor) or got.shape != ids.shape:  # a transformers change, or no generate
            raise RuntimeError(f"{type(self).__name__}: the sampler's accepted_token_mask of shape {tuple(ids.shape)} "
                               f"is needed after a canvas's first step (got {type(got).__name__})")
        return got.to(device=ids.device, dtype=torch.bool)

    def select(self, ids: torch.Tensor, decided: torch.Tensor, prev_ids: torch.Tensor,
               prev_decided: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the rows the rule recomputes (B, N) bool, the top-up priority (B, N)) for a reuse step
        whose input is `ids` with `decided`, after the input `prev_ids` with `prev_decided`."""
        raise NotImplementedError

    def _step_rows(self, ids: torch.Tensor, refresh: bool, new_canvas: bool) -> torch.Tensor | None:
        decided = self.decided(ids, new_canvas)
        seen, self._seen = self._seen, (ids, decided)
        if refresh:
            self.last_rows = None
            return None
        want, priority = self.select(ids, decided, *seen)
        self.last_rows = fill_rows(want, priority)
        return self.last_rows

    def reset(self) -> None:
        super().reset()
        self._seen, self.last_rows = None, None

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, refresh_every: int | None = None, **kwargs):
        self._seen = None
        try:
            return super().generate(input_ids, refresh_every, **kwargs)
        finally:
            self._seen, self.sampler = None, None


def feature_model(base, p, refresh_every: int = 1, share: float | None = None,
                  similarity_dtype: torch.dtype = torch.float32) -> FeatureCacheDiffusionGemma:
    """The base split as TADM's (posttrain.shared_layers / anchor_layers / denoiser_layers; the split
    fixes the matched share) run with the feature cache; `share` None: posttrain.feature_cache_share,
    whose 0 is the matched share."""
    pt = p.posttrain
    split = SplitDiffusionGemma(base, pt.shared_layers, pt.anchor_layers, pt.denoiser_layers)
    if share is None:
        share = pt.feature_cache_share or None
    return FeatureCacheDiffusionGemma(split, refresh_every, share, similarity_dtype)
