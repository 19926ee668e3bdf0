"""dKV-Cache's row rule on the frozen DiffusionGemma decoder (training-free; Table 1's dKV rows).

The rule ported (dKV-Cache-Decode, horseee/dKV-Cache @49a76fc, as `tadm.caches.llada.dkv` runs
it on LLaDA): a position's K and V are cached once its token is decided, delayed by one step.
A cached pass recomputes, at every layer, exactly the rows that were not decided in the
*previous* pass's input; a token decided by pass t enters pass t + 1's input, is computed there
with its token, and is read from the cache from pass t + 2 on. Here, with "decided" the
entropy-bound sampler's accepted positions (`tadm.caches.diffusiongemma.feature.StepSelectionCache`):

    reuse step t recomputes  C_t = not (decided in input t-1  and  decided in input t with the same token)

at every decoder layer, layer 0 included (their Q, K, V, attention over [encoder prefix ; canvas
with the kept K/V elsewhere], dense MLP and MoE); every other row keeps its cached K, V and the
outputs of its attention and FFN branches (its layer output is x + A + F with the new x). A
refresh (TADM's rule with K: a canvas's first step, or age + 1 >= K) runs every stock layer and
recaptures every row. K = 1 is the base, step for step.

What the port changed from the LLaDA release, and why:

- *Re-noising sampler.* LLaDA's decided tokens are final, so "decided in the previous input"
  implies "the same token now". DiffusionGemma's sampler re-draws the token of an accepted
  position at every step it is accepted again, and re-randomises a position it no longer accepts
  (``accept_canvas`` / ``renoise_canvas``), so the port also recomputes a row decided in the
  previous input whose token changed (re-sampled, or re-noised): a kept row's cached K/V are
  always those of its current token (in older context, as released). On LLaDA's inputs the two
  rules coincide. The release's passes 0 and 1 are full; here step 1 of a canvas recomputes
  every row by the rule (nothing is decided in a canvas's random first input) and then the
  refresh interval K takes the place of the release's reload interval R (the cache is dropped at
  each canvas, the release's block).
- *Self-conditioning.* Each step's input embedding also carries the last step's logits, so a
  kept row's input changes even when its token does not; the kept branch outputs are added to
  the new input (the feature cache's residual rule), where the release does not compute a kept
  row at all: LLaDA's decoder never reads a decided row's logits, DiffusionGemma's sampler reads
  every row's.
- *Encoder-held prompt.* The prompt and earlier canvases are the encoder's exact KV cache
  (read-only, `append_to_cache`), so the rule acts on the canvas rows only; the release caches
  prompt rows as decided positions.
- *Sliding-window layers and MoE.* Nothing changes in the rule: a recomputed row attends with
  the stock layer's mask (its window) to the cached keys, and its FFN is the dense MLP plus the
  routed experts on the recomputed rows only (`tadm.caches.diffusiongemma.feature.feed_forward`).
- *Batches.* The release decodes one sequence; a batch's sequences are topped up to the
  largest count of the step with their rows cached longest ago (ties: the lower position),
  which only refreshes more of them (:func:`staleness`); the LLaDA port repeats a row instead.

Layer calls (counted; no closed form, the rows follow the sampler): a refresh is L stock layer
calls, reuse step t adds L |C_t| / N to ``partial_layer_calls`` (|C_t| after the top-up), so a
canvas of T steps costs L [ceil(T / K) + sum over its reuse steps of |C_t| / N], at most the
base's L T. Table 1 reads the counted calls (`tadm.caches.catalog`: no closed form).
"""

from __future__ import annotations

import torch

from tadm.caches.diffusiongemma.feature import StepSelectionCache
from tadm.posttrain.backbone import SplitDiffusionGemma


def dkv_rows(ids: torch.Tensor, decided: torch.Tensor, prev_ids: torch.Tensor, prev_decided: torch.Tensor
             ) -> torch.Tensor:
    """(B, N) bool: the rows dKV-Cache recomputes on a step with input `ids` (`decided`) after
    the input `prev_ids` (`prev_decided`): all but those decided in the previous input and decided
    in this one with the same token."""
    return ~(prev_decided & decided & (ids == prev_ids))


class DkvCacheDiffusionGemma(StepSelectionCache):
    """The frozen DiffusionGemma decoding with dKV-Cache's rule (module docstring);
    ``generate(..., refresh_every=K)``."""

    def __init__(self, split: SplitDiffusionGemma, refresh_every: int = 1):
        super().__init__(split, refresh_every)
        self._stamp = 0
        self._computed: torch.Tensor | None = None  # (B, N): the step each row's cached state was computed at

    def staleness(self) -> torch.Tensor:
        """The top-up priority: the rows computed longest ago first."""
        return -self._computed.to(torch.float64)

    def select(self, ids, decided, prev_ids, prev_decided):
        return dkv_rows(ids, decided, prev_ids, prev_decided), self.staleness()

    def _step_rows(self, ids: torch.Tensor, refresh: bool, new_canvas: bool) -> torch.Tensor | None:
        self._stamp += 1
        if refresh:
            self._computed = torch.full_like(ids, self._stamp)
        rows = super()._step_rows(ids, refresh, new_canvas)
        if rows is not None:
            self._computed = self._computed.scatter(1, rows, self._stamp)
        return rows


def dkv_model(base, p, refresh_every: int = 1) -> DkvCacheDiffusionGemma:
    """The base split as TADM's (posttrain.shared_layers / anchor_layers / denoiser_layers: Table 1
    reads the split; the cache itself treats every layer alike) run with dKV-Cache's rule."""
    pt = p.posttrain
    split = SplitDiffusionGemma(base, pt.shared_layers, pt.anchor_layers, pt.denoiser_layers)
    return DkvCacheDiffusionGemma(split, refresh_every)
