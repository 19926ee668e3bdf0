"""d²Cache's row rule on the frozen DiffusionGemma decoder (training-free; Table 1's d²Cache rows).

The rule ported (Kamichanw/d2Cache @72feb60, as `tadm.caches.llada.d2cache` runs it on LLaDA):
after each pass, one row set Q is chosen for the next, and the next pass recomputes Q at every
layer (K, V written into the cache, Q's queries over every key, the FFN on Q) while the other
rows keep their cached K/V. Here, on the feature cache's state
(`tadm.caches.diffusiongemma.feature.StepSelectionCache`, "decided" = the entropy-bound sampler's
accepted positions), reuse step t recomputes, at every layer (layer 0 included), the rows

- *ranked*: the current_k still-undecided rows of best score inside the release's search window,
  score = conf0 · density(decided, sigma) + max(score) on the rows undecided in the previous
  input; conf0 the confidence (softmax max of the logits) of the canvas's first step, kept for
  the canvas as the release keeps its first pass's; density `tadm.asrd.certainty.certainty_density`
  of the decided positions over the canvas; the window from the first row undecided in the previous
  input to the boundary (a multiple of their count) at or after the position where current_k
  undecided rows from the window's start are reached (the release counts from the span's start:
  the same where, as on LLaDA, every undecided row was undecided before);
- *moved*: the rows whose decided state or decided token changed between the two inputs (just
  decided, re-noised, or accepted again with another token; the release's "just decoded");
- *attention*: a nucleus (top-p = rollout_p, at least one row) of the other rows by the column
  sums of the last step's attention rollout, per layer R <- rownorm(A + I) R with A the head-mean
  attention of the rows computed (identity rows elsewhere) over the canvas's keys;
- with inflate_w > 0, every row of a gap of at most inflate_w between two selected rows;

and every other row keeps its cached K, V and branch outputs (output x + A + F, as the feature
cache's). A refresh (TADM's rule with K) runs every stock layer, recaptures every row and takes
the full rollout. Constants: `tadm.caches.catalog.D2CACHE_RELEASE` (its LLaDA settings,
`configs/gen_args.py`): rollout_p 0.1 and inflate_w 0 as released; sigma 10 as released (a distance
between tokens, not a count of the span); current_k = 32 is a count of rows out of the release's
256-token span (its GSM8K eval decodes 256 positions as one block), so it is scaled to the
canvas, max(1, round(32 N / 256)): 4 at the default profile's N = 32, 32 at the paper's 256, 1 on
the tests' 8 (:func:`scaled_current_k`; the catalog passes `D2CACHE_SPAN`).

What the port changed from the LLaDA release, and why:

- *Re-noising sampler.* LLaDA's masked rows hold [MASK] and its decided rows are final; here the
  undecided rows hold a fresh random token every step and a decided row can be re-drawn or
  re-noised. Undecided rows are the release's masked rows (their kept K/V are an earlier noise
  draw's, as the release keeps [MASK]'s in older context); "just decoded" becomes the rows whose
  decided state or token moved, so every changed real token is recomputed. The release's single
  cache for the whole generation becomes one per canvas (a canvas is the release's one block), and
  TADM's interval K adds a full refresh every K steps (the release never refreshes); conf0 stays
  the canvas's first step's.
- *Encoder-held prompt.* The prompt and earlier canvases are the encoder's exact KV cache, so Q,
  the density, the window and the rollout are over the canvas rows; a row's attention to the
  prefix is dropped from A (it can only flow to rows the decoder does not compute).
- *Attention weights.* The release runs eager attention to read its weights. Here the layer's own
  attention (SDPA on the tests' model) computes the output, unchanged, and the weights of the
  computed rows are recomputed beside it (float32 softmax of q·k scaled, under the stock mask,
  sliding window included): extra work, in FLOPs not in layer calls, as the release's rollout products.
- *Self-conditioning, sliding windows, MoE, batches*: as for dKV-Cache (`tadm.caches.diffusiongemma.dkv`);
  the batch's top-up is the release's: each sequence's free rows by importance + score.

Layer calls (counted; no closed form, |Q| follows the sampler and the rollout): a refresh is L
stock layer calls, reuse step t adds L |Q_t| / N to ``partial_layer_calls`` (after the top-up);
the weights and the rollout's (N × N) products per layer are not counted. Per canvas
L [ceil(T / K) + sum over its reuse steps of |Q_t| / N]. Table 1 reads the counted calls.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tadm.asrd.certainty import certainty_density
from tadm.caches.diffusiongemma.feature import StepSelectionCache, partial_layer
from tadm.caches.llada.d2cache import inflate, nucleus
from tadm.errors import ConfigError
from tadm.posttrain.backbone import DecoderInputs, SplitDiffusionGemma

from transformers.models.diffusion_gemma import modeling_diffusion_gemma as mdg  # after tadm.compat's check (feature)


def scaled_current_k(rows: int, current_k: int, span: int | None) -> int:
    """The release's current_k, a count of rows of its `span`-token generation, on a canvas of
    `rows` (`span` None: current_k as it is)."""
    return current_k if span is None else max(1, round(current_k * rows / span))


def d2cache_rows(ids: torch.Tensor, decided: torch.Tensor, prev_ids: torch.Tensor, prev_decided: torch.Tensor,
                 conf0: torch.Tensor, importance: torch.Tensor, current_k: int, sigma: float, rollout_p: float,
                 inflate_w: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rows d²Cache recomputes (B, N) bool, the top-up priority (B, N)) on a step with input
    `ids` (`decided`) after `prev_ids` (`prev_decided`), from the canvas's first-step confidence
    `conf0` and the last step's rollout `importance` (module docstring)."""
    n = ids.shape[1]
    rem, before = ~decided, ~prev_decided
    moved = (decided != prev_decided) | (decided & (ids != prev_ids))
    score = conf0 * certainty_density(decided, sigma)
    score = score + torch.where(before, score.max(), torch.zeros_like(score))
    cols = torch.arange(n, device=ids.device)
    start = before.int().argmax(1, keepdim=True)
    reached = (rem & (cols >= start)).int().cumsum(1) >= current_k  # (a re-noised row may sit before start)
    m = torch.where(reached.any(1, keepdim=True), reached.int().argmax(1, keepdim=True),
                    torch.full_like(cols[:1], n - 1))
    size = before.sum(1, keepdim=True).clamp(min=1)
    end = (m // size + 1) * size - 1
    window = (cols >= start) & (cols <= end) & rem
    picks = torch.topk(torch.where(window, score, torch.full_like(score, float("-inf"))), min(current_k, n),
                       dim=-1).indices
    want = (torch.zeros_like(rem).scatter_(1, picks, True) & window) | moved
    want = want | nucleus(importance, rollout_p, ~want)
    if inflate_w > 0:
        want = inflate(want, inflate_w)
    # the release ranks the top-up by importance + (a constant lifting the generated span) + score
    return want, importance + score


def attention_rows(attn: nn.Module, q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None,
                   rows: int) -> torch.Tensor:
    """(B, n, rows) float32: the head-mean softmax attention of the queries q (B, H, n, head_dim)
    over `keys` [prefix ; canvas] under the stock `mask` (bool: True attends; float: added), the
    canvas's last `rows` columns kept."""
    with torch.autocast(q.device.type, enabled=False):
        k = mdg.repeat_kv(keys, attn.num_key_value_groups).float()
        s = torch.matmul(q.float(), k.transpose(2, 3)) * attn.scaling
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
        return torch.softmax(s, dim=-1).mean(dim=1)[..., -rows:]


def _check(name: str, ok: bool, allowed: str, value) -> None:
    if not ok:
        raise ConfigError(name, f"must be {allowed}, got {value!r}", source="d²Cache (tadm.caches.catalog.D2CACHE_RELEASE)")


def _count_ok(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


class D2CacheDiffusionGemma(StepSelectionCache):
    """The frozen DiffusionGemma decoding with d²Cache's rule (module docstring);
    ``generate(..., refresh_every=K)``, with the release's constants (`tadm.caches.catalog.D2CACHE_RELEASE`
    and, for the span its current_k counts rows of, `D2CACHE_SPAN`; `span` None: current_k unscaled)."""

    def __init__(self, split: SplitDiffusionGemma, refresh_every: int = 1, *, rollout_p: float, current_k: int,
                 sigma: float, inflate_w: int, span: int | None):
        super().__init__(split, refresh_every)
        _check("rollout_p", isinstance(rollout_p, (int, float)) and not isinstance(rollout_p, bool)
               and 0.0 <= rollout_p <= 1.0, "in [0, 1]", rollout_p)
        _check("current_k", _count_ok(current_k, 1), "an integer >= 1", current_k)
        _check("span", span is None or _count_ok(span, 1), "None or an integer >= 1", span)
        _check("sigma", isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and math.isfinite(sigma)
               and sigma > 0, "> 0", sigma)
        _check("inflate_w", _count_ok(inflate_w, 0), "an integer >= 0", inflate_w)
        self.rollout_p, self.current_k, self.sigma, self.inflate_w = float(rollout_p), current_k, float(sigma), inflate_w
        self.span = span
        self._conf0: torch.Tensor | None = None  # (B, N): the canvas's first-step confidence
        self._importance: torch.Tensor | None = None  # (B, N): column sums of the last step's rollout
        self._rollout: torch.Tensor | None = None  # (B, N, N): this step's, layer by layer

    def select(self, ids, decided, prev_ids, prev_decided):
        k = scaled_current_k(ids.shape[1], self.current_k, self.span)
        return d2cache_rows(ids, decided, prev_ids, prev_decided, self._conf0, self._importance, k, self.sigma,
                            self.rollout_p, self.inflate_w)

    def _step_rows(self, ids: torch.Tensor, refresh: bool, new_canvas: bool) -> torch.Tensor | None:
        rows = super()._step_rows(ids, refresh, new_canvas)
        b, n = ids.shape
        self._rollout = torch.eye(n, device=ids.device).expand(b, n, n)
        return rows

    def _roll(self, weights: torch.Tensor | None, idx: torch.Tensor | None) -> None:
        """One layer of the rollout: the rows `idx` (None: every row) attend with `weights` (B, n, N),
        the others are identity rows; R <- rownorm(A + I) R."""
        r = self._rollout
        if weights is None:  # nothing recomputed: A = I
            return
        with torch.autocast(r.device.type, enabled=False):
            eye = torch.eye(r.shape[-1], device=r.device)
            a = weights if idx is None else eye.expand_as(r).scatter(
                1, idx.unsqueeze(-1).expand(-1, -1, r.shape[-1]), weights)
            a = a + eye
            self._rollout = (a / a.sum(dim=-1, keepdim=True)) @ r

    def _layer(self, i: int, layer: nn.Module, x: torch.Tensor, inputs: DecoderInputs, kind: str, refresh: bool,
               rows: torch.Tensor | None, n_sel: int) -> torch.Tensor:
        attn, n = layer.self_attn, x.shape[1]
        if not refresh:
            seen: list[torch.Tensor] = []
            x = partial_layer(layer, x, inputs, kind, self._cache.states[i], n_sel, self.similarity_dtype, rows=rows,
                              observe=lambda q, keys, mask: seen.append(attention_rows(attn, q, keys, mask, n)))
            self._roll(seen[0] if seen else None, rows)
            return x
        got: list[torch.Tensor] = []
        hook = attn.q_norm.register_forward_hook(lambda _m, _i, out: got.append(out))
        try:
            x = super()._layer(i, layer, x, inputs, kind, refresh, rows, n_sel)
        finally:
            hook.remove()
        if len(got) != 1:  # a transformers change: the rollout would be wrong
            raise RuntimeError(f"d²Cache: expected one q_norm call per layer, got {len(got)}")
        cos, sin = inputs.position_embeddings[kind]
        q = mdg.apply_rotary_pos_emb(got[0], cos, sin, unsqueeze_dim=2).transpose(1, 2)
        state = self._cache.states[i]
        keys = attn.append_to_cache(inputs.cache, state.k, state.v)[0] if inputs.cache is not None else state.k
        self._roll(attention_rows(attn, q, keys, inputs.mask_mapping[kind], n), None)
        return x

    def _step_done(self, logits: torch.Tensor, refresh: bool, new_canvas: bool) -> None:
        if new_canvas:  # the release keeps its first pass's confidence
            self._conf0 = torch.softmax(logits.float(), dim=-1).max(dim=-1).values
        self._importance, self._rollout = self._rollout.sum(dim=1), None

    def reset(self) -> None:
        super().reset()
        self._conf0 = self._importance = self._rollout = None

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, refresh_every: int | None = None, **kwargs):
        self._conf0 = self._importance = None
        try:
            return super().generate(input_ids, refresh_every, **kwargs)
        finally:
            self._conf0 = self._importance = self._rollout = None


def d2cache_model(base, p, refresh_every: int = 1, **constants) -> D2CacheDiffusionGemma:
    """The base split as TADM's (posttrain.shared_layers / anchor_layers / denoiser_layers: Table 1
    reads the split; the cache treats every layer alike) run with d²Cache's rule at `constants`
    (rollout_p, current_k, sigma, inflate_w, span: the catalog passes the release's)."""
    pt = p.posttrain
    split = SplitDiffusionGemma(base, pt.shared_layers, pt.anchor_layers, pt.denoiser_layers)
    return D2CacheDiffusionGemma(split, refresh_every, **constants)
