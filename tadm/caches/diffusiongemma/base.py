"""The contract of a training-free cache on the frozen DiffusionGemma (Table 1's cache rows).

A cache is registered as a :class:`tadm.caches.catalog.CacheMethod` whose builder
``(base, p, refresh_every) -> model`` returns a :class:`CacheModel`. Table 1 then decodes with
``model.generate(ids, attention_mask=mask, refresh_every=K, **sampling_kwargs)`` beside TADM at
the same K, counts the stock decoder-layer calls with hooks on the base's decoder layers, adds
the model's ``partial_layer_calls`` where it recomputes part of a layer, and reads its split
(``model.split.split``: shared, anchor and denoiser layers) for the closed-form layer calls.

The quickest cache reuses TADM's split and refresh schedule and replaces only the fusion: give
`tadm.posttrain.anchored.TimeAnchoredDiffusionGemma` a module that keeps :class:`AnchorFusion`
(naive reuse does: `tadm.caches.diffusiongemma.naive.BypassFusion`, h = H0)::

    class SkipFusion(BypassFusion):                       # the denoiser reads the fresh c
        values = "skip"
        def forward(self, c, c0, h0):
            return c

    def skip_model(base, p, refresh_every=1):
        pt = p.posttrain
        split = SplitDiffusionGemma(base, pt.shared_layers, pt.anchor_layers, pt.denoiser_layers)
        return TimeAnchoredDiffusionGemma(split, SkipFusion(split.hidden_size), refresh_every)

A cache with its own decoding loop (the feature cache,
`tadm.caches.diffusiongemma.feature.FeatureCacheDiffusionGemma`) subclasses transformers'
``DiffusionGemmaGenerationMixin`` and ``nn.Module`` and keeps :class:`CacheModel` itself.
``tests/caches/test_caches_diffusiongemma.py`` checks every registered cache against it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class CacheModel(Protocol):
    """What Table 1 reads from a cache's model.

    ``split``          a `tadm.posttrain.backbone.SplitDiffusionGemma`: the frozen base cut into
                       shared / anchor / denoiser layers (``split.split``, a (s, a, d) tuple);
    ``refresh_every``  K, settable: every K-th denoising step of a canvas recomputes what the
                       cache reuses in between (K = 1: every step, the base's tokens exactly);
    ``generate``       transformers' ``generate(input_ids, attention_mask=..., refresh_every=K,
                       **kwargs)`` returning an output with ``.sequences``;
    ``partial_layer_calls`` (optional, float) decoder layers run on part of the canvas, summed as
                       the fraction of rows each recomputed (0 when absent);
    ``counters.steps`` (int; needed where the catalog entry has no closed form, ``layer_calls``
                       None) the denoising steps run, over which Table 1 reports the counted calls.
    """

    split: Any
    refresh_every: int

    def generate(self, input_ids, refresh_every: int | None = None, **kwargs) -> Any: ...


@runtime_checkable
class AnchorFusion(Protocol):
    """What `TimeAnchoredDiffusionGemma` and Table 1 read from a fusion, trained or not.

    ``forward(c, c0, h0) -> h``  the denoiser's input: c the shared layers' output now, c0 and h0
                                 the shared and anchor outputs cached at the last refresh, each
                                 (B, N, hidden_size);
    ``fresh``                    True: applied at refresh steps too (the fresh-anchor control);
    ``values``                   a short name of what it feeds the denoiser (recorded with the run);
    ``rank``                     its low-rank width (0 without parameters);
    ``hidden_size``              the base's hidden size;
    ``num_parameters``           its trainable parameters (Table 1's fusion column);
    ``flops(tokens)``            its FLOPs over `tokens` positions (the compute column).
    """

    values: str
    rank: int
    hidden_size: int

    @property
    def fresh(self) -> bool: ...

    @property
    def num_parameters(self) -> int: ...

    def flops(self, tokens: int) -> int: ...

    def forward(self, c, c0, h0): ...


__all__ = ["AnchorFusion", "CacheModel"]
