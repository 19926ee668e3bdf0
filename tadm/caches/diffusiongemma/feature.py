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
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
                  n_sel: int, similarity_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A reuse step of one decoder layer (module docstring); updates `state` in place.

    The attention interface is the layer's own (config._attn_implementation) with the stock
    scaling, sliding window and is_causal; position_ids, which the stock layer forwards to it and
    only packed-sequence flash-attention reads, are not passed (the canvas is never packed)."""
    attn = layer.self_attn
    b, n, _ = x.shape
    h = layer.input_layernorm(x)
    heads = (b, n, -1, attn.head_dim)
    raw_k = attn.k_proj(h).view(heads) if attn.v_proj is None else None  # full attention: V from k_proj
    v = attn.v_norm(raw_k if raw_k is not None else attn.v_proj(h).view(heads)).transpose(1, 2)
    idx = least_similar_rows(v, state.v, n_sel, similarity_dtype) if n_sel else None
    state.v = v  # as released: the new V of every row
    if idx is not None:
        cos, sin = (gather_rows(t, idx) for t in inputs.position_embeddings[kind])
        h_sel = gather_rows(h, idx)
        sel = (b, n_sel, -1, attn.head_dim)
        q = attn.q_norm(attn.q_proj(h_sel).view(sel))
        q = mdg.apply_rotary_pos_emb(q, cos, sin, unsqueeze_dim=2).transpose(1, 2)
        k = attn.k_norm(gather_rows(raw_k, idx) if raw_k is not None else attn.k_proj(h_sel).view(sel))
        k = mdg.apply_rotary_pos_emb(k, cos, sin, unsqueeze_dim=2).transpose(1, 2)
        state.k = scatter_rows(state.k, idx, k, dim=2)
        keys, values = (attn.append_to_cache(inputs.cache, state.k, state.v) if inputs.cache is not None
                        else (state.k, state.v))
        mask = inputs.mask_mapping[kind]
        mask = gather_rows(mask, idx, dim=2) if mask is not None else None
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
        refresh = len(layers) == 1 or self._due(x, self_conditioning_logits, prefix)
        if refresh:
            self._cache = _FeatureCache([None] * len(layers), 0, prefix)
        else:
            self._cache.age += 1
        n_sel = selected_rows(self.share, x.shape[1])
        states = self._cache.states
        for i, layer in enumerate(layers):
            if i == 0:
                x = stock_layer(layer, x, inputs, kinds[i])
            elif refresh:
                x, states[i] = capture_layer(layer, x, inputs, kinds[i])
            else:
                x = partial_layer(layer, x, inputs, kinds[i], states[i], n_sel, self.similarity_dtype)
        self._count(refresh, len(layers), n_sel / x.shape[1])
        return mdg.DiffusionGemmaBlockDiffusionOutputWithPast(logits=split.head(x))

    def _count(self, refresh: bool, depth: int, fraction: float) -> None:
        c = self.counters
        c.steps += 1
        c.refreshes += int(refresh)
        c.full_layer_calls += depth if refresh else 1
        c.partial_layer_calls += 0.0 if refresh else (depth - 1) * fraction

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
