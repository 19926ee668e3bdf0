"""One decoding interface for every model ASRD and its baselines run on.

A backend turns a canvas of token ids plus an optional additive signal on the input
embeddings into next-state logits, and counts what that cost:

    e = backend.embed(ids)                  # (B, L, d): the input-embedding space
    ids = backend.fill(z, undecided, gen)   # what an undecided position holds as input
    logits = backend.logits(ids, delta)     # (B, L, V): one model pass, delta (B, L, d) or None

- `MaskedBackend`: the project's absorbing-state models, those of every method unit with
  ``asrd`` (`tadm.methods.base.Method`). MDLM runs its whole network every pass; TADM (a unit
  that ``refreshes``) runs Alg. 1: the anchor A(S(z) + delta) is recomputed on every `refresh_every`-th
  generation pass and reused otherwise, S, the fusion and the denoiser run every pass.
  Undecided positions hold the mask token; the output at a visible token is untrained
  (`reads_decided` False); logits exclude the mask class (SUBS).
- `DiffusionGemmaBackend`: the post-train DiffusionGemma (the frozen base split S / A / D,
  optionally with the trained fusion and an anchor refreshed every K generation passes).
  Uniform-state: an undecided position holds a fresh uniform random token each pass, and the
  model predicts every position (`reads_decided` True). The prompt is encoded once per batch
  (`set_context`) into the encoder cache the canvas decoder reads; no self-conditioning.
- `LladaBackend`: LLaDA (`tadm.models.llada`, e.g. the released LLaDA-8B-Instruct), the seed
  paper's own model family. Absorbing-state like MDLM: undecided positions hold LLaDA's mask
  token (126336 in the release), the whole network runs every pass, no anchor. The mask token is
  a row of LLaDA's vocabulary, so its logit is set to -inf (it is never chosen as a token). A
  left-padded batch sets its padding mask (`set_padding`) so that no position attends to a pad,
  as the release's ``generate`` passes ``attention_mask``. Its training-free caches (Fast-dLLM's
  prefix / dual cache, dLLM-Cache, naive reuse) are backends of `tadm.caches.llada`.

`decode` calls `begin_block(lo, hi)` before each semi-AR block (a no-op here), and after a block
that took fewer passes than the backend's `min_block_passes` (1 here) it makes the rest as passes
on the decided block whose logits nothing reads (Fast-dLLM's per-block caches: 2, as its loop
does; `tadm.caches.llada.prefix`). `layer_calls`
counts layer calls; `layer_calls_weighted` weights each by the share of the canvas it computed
(the same number for every backend here).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
from torch import Tensor

from tadm.errors import ConfigError
from tadm.registry import METHODS, method_for
from tadm.sampling.anchor_cache import FixedInterval
from tadm.schedule import LogLinearSchedule, NoiseSchedule


@dataclass
class DecodeCounters:
    calls: int = 0  # model passes
    refreshes: int = 0  # anchor evaluations (time-anchored models)
    layer_calls: int = 0  # transformer-layer calls, the paper's compute unit
    # each call weighted by the share of the canvas's rows it computed (`tadm.caches.llada`);
    # = layer_calls for every backend that runs whole layers
    layer_calls_weighted: float = 0.0


class Backend(abc.ABC):
    reads_decided: bool = False
    mask_id: int | None = None
    vocab_size: int = 0
    min_block_passes: int = 1  # passes `decode` makes per semi-AR block at least (module docstring)

    def __init__(self, refresh_every: int = 1):
        self.refresh_every = refresh_every
        self.counters = DecodeCounters()
        self._age: int | None = None  # generation passes since the anchor was computed

    @property
    def refresh_every(self) -> int:
        """K: the anchor recomputed on every K-th pass (`refresh`, a FixedInterval policy)."""
        return self.refresh.K

    @refresh_every.setter
    def refresh_every(self, k: int) -> None:
        self.refresh = FixedInterval.parse(k, "asrd.refresh_every")

    def noise_schedule(self, eps: float) -> NoiseSchedule:
        """The alpha_t the decoder's loop window reads: log-linear (the masked models' and
        LLaDA's decoding here); a backend of one of Table 2's methods reads its method's."""
        return LogLinearSchedule(eps)

    @property
    @abc.abstractmethod
    def device(self) -> torch.device: ...

    def start(self) -> None:
        """A new trajectory: the anchor is recomputed at its first pass."""
        self._age = None

    def begin_block(self, lo: int, hi: int) -> None:
        """`decode` calls this before the first step of each semi-AR block (canvas positions
        lo..hi-1). Nothing here; a cache that refreshes per block (`tadm.caches.llada`) uses it."""

    def _refresh_due(self) -> bool:
        return self.refresh.stale(None if self._age is None else self._age + 1)

    def _count_layers(self, calls: int, weighted: float | None = None) -> None:
        """Add `calls` layer calls, worth `weighted` whole-canvas layer calls (default: calls)."""
        self.counters.layer_calls += calls
        self.counters.layer_calls_weighted += calls if weighted is None else weighted

    def _advance(self, refreshed: bool) -> None:
        self.counters.calls += 1
        self.counters.refreshes += int(refreshed)
        if refreshed:
            self._age = 0
        elif self._age is not None:
            self._age += 1

    @abc.abstractmethod
    def embed(self, ids: Tensor) -> Tensor:
        """Input embeddings (B, L, d) of token ids (B, L)."""

    @abc.abstractmethod
    def fill(self, z: Tensor, undecided: Tensor, generator: torch.Generator) -> Tensor:
        """The model input: z with its undecided positions (B, L) bool replaced."""

    @abc.abstractmethod
    def logits(self, ids: Tensor, delta: Tensor | None = None) -> Tensor:
        """One pass: float32 logits (B, L, V) over the generatable tokens."""

    def _input_embeds(self, ids: Tensor, delta: Tensor | None) -> Tensor:
        """The model's input: `embed(ids)`, plus `delta` (cast to its dtype) when there is one."""
        e = self.embed(ids)
        return e if delta is None else e + delta.to(e.dtype)


class _MaskTokenBackend(Backend):
    """An absorbing-state model with ``embed(ids)`` and a ``mask_id`` (MDLM / TADM, LLaDA):
    undecided positions hold the mask token; the output at a visible token is not read."""

    reads_decided = False

    def __init__(self, model, refresh_every: int = 1):
        super().__init__(refresh_every)
        self._check(model)
        self.model = model.eval()
        self.mask_id, self.vocab_size = model.mask_id, model.vocab_size

    @abc.abstractmethod
    def _check(self, model) -> None:
        """ConfigError unless this backend runs `model` with `self.refresh_every`."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def embed(self, ids: Tensor) -> Tensor:
        return self.model.embed(ids)

    def fill(self, z: Tensor, undecided: Tensor, generator: torch.Generator) -> Tensor:
        return z.masked_fill(undecided, self.mask_id)


class MaskedBackend(_MaskTokenBackend):
    """MDLM or TADM (tadm.models): the network of a method unit with ``asrd`` (``unit``); one
    that ``refreshes`` (TADM) has its anchor refreshed every `refresh_every` passes."""

    def __init__(self, model, refresh_every: int = 1):
        super().__init__(model, refresh_every)
        self._h: Tensor | None = None

    def noise_schedule(self, eps: float) -> NoiseSchedule:
        """The schedule its network was trained with (`Method.noise_schedule`)."""
        return self.unit.noise_schedule(eps)

    def _check(self, model) -> None:
        """Also keeps the model's method unit (``unit``)."""
        types = dict.fromkeys(u.model.model_type for u in METHODS.values() if u.asrd)
        if model.model_type not in types:
            raise ConfigError("asrd model", f"ASRD runs on {' or '.join(map(repr, types))} models, "
                                            f"got {model.model_type!r}")
        self.unit = method_for(model.model_type)
        if not self.unit.refreshes and self.refresh_every != 1:
            raise ConfigError("asrd.refresh_every", f"{model.model_type.upper()} has no anchor to reuse; "
                                                    f"refresh_every must be 1, got {self.refresh_every}")

    def start(self) -> None:
        super().start()
        self._h = None

    @torch.no_grad()
    def logits(self, ids: Tensor, delta: Tensor | None = None) -> Tensor:
        m, cfg = self.model, self.model.cfg
        e = self._input_embeds(ids, delta)
        refreshed = False
        if not self.unit.refreshes:  # the whole network (MDLM)
            out = m.head(m.blocks(e, m.cond()))
            layers = self.unit.layers(cfg)
        else:  # Alg. 1 (TADM)
            refreshed = self._refresh_due()
            if refreshed:
                self._h = m.anchor_blocks(e, m.anchor_cond())
            out = m.head(m.denoiser_blocks(m.fusion(e, self._h), m.denoiser_cond()))
            layers = cfg.denoiser_layers + (cfg.anchor_layers if refreshed else 0)
        self._advance(refreshed)
        self._count_layers(layers)
        return out[..., : self.vocab_size].float()


class DiffusionGemmaBackend(Backend):
    """A frozen DiffusionGemma (`tadm.posttrain.backbone.SplitDiffusionGemma`), with the trained
    fusion (`fusion`) and an anchor refreshed every `refresh_every` passes, or without it
    (`fusion=None`, refresh_every 1: the base model itself)."""

    reads_decided = True

    def __init__(self, split, fusion=None, refresh_every: int = 1):
        super().__init__(refresh_every)
        if fusion is None and refresh_every != 1:
            raise ConfigError("asrd.refresh_every", "reusing the anchor needs the trained fusion (models/dg_tadm)")
        self.split, self.fusion = split, fusion
        self.vocab_size = split.text_config.vocab_size
        self._cache = self._mask = self._inputs = None
        self._c0 = self._h0 = None

    @property
    def device(self) -> torch.device:
        return self.split.base.device

    def set_context(self, context: Tensor, context_mask: Tensor) -> None:
        """Encode a batch of left-padded prompts (B, P) once; the canvas decoder reads the cache."""
        with torch.no_grad():
            self._cache = self.split.base.model.encoder(input_ids=context, attention_mask=context_mask).cache
        self._mask, self._inputs = context_mask.bool(), None

    def start(self) -> None:
        super().start()
        self._c0 = self._h0 = None

    def embed(self, ids: Tensor) -> Tensor:
        return self.split.decoder.embed_tokens(ids)

    def fill(self, z: Tensor, undecided: Tensor, generator: torch.Generator) -> Tensor:
        noise = torch.randint(0, self.vocab_size, z.shape, generator=generator, device=z.device)
        return torch.where(undecided, noise, z)

    @torch.no_grad()
    def logits(self, ids: Tensor, delta: Tensor | None = None) -> Tensor:
        split = self.split
        if self._cache is None:
            raise RuntimeError("DiffusionGemmaBackend.set_context(prompt ids, mask) must come before decoding")
        if self._inputs is None or self._inputs.position_ids.shape[-1] != ids.shape[1]:
            mask = torch.cat([self._mask, torch.ones_like(ids, dtype=torch.bool)], dim=1)
            self._inputs = split.prepare(ids, self._cache, mask)
        e = self._input_embeds(ids, delta)
        x = split.decoder.self_conditioning(e, torch.zeros_like(e))  # = split.embed(ids) when delta is None
        c = split.layers(x, self._inputs, "shared")
        s, a, d = split.split
        if self.fusion is None:
            refreshed, h = True, split.anchor(c, self._inputs)  # the base: A on every pass
        else:
            refreshed = self._refresh_due()
            if refreshed:
                self._c0, self._h0 = c, split.anchor(c, self._inputs)
                h = self._h0
            else:
                h = self.fusion(c, self._c0, self._h0)
        self._advance(refreshed)
        self._count_layers(s + d + (a if refreshed else 0))
        return split.denoise(h, self._inputs)[..., : self.vocab_size].float()


class LladaBackend(_MaskTokenBackend):
    """LLaDA (`tadm.models.llada.LladaModel`): one full bidirectional pass per call, the prompt
    in the canvas; `refresh_every` must be 1 (no anchor to reuse). LLaDA is trained to predict
    masked positions only (`reads_decided` False)."""

    def __init__(self, model, refresh_every: int = 1):
        super().__init__(model, refresh_every)
        self._padding: Tensor | None = None

    def set_padding(self, attention_mask: Tensor | None) -> None:
        """The current batch's padding mask (B, L) (1 at a token, 0 at a pad; None: no padding),
        passed to every pass until the next call: each batch sets its own."""
        self._padding = attention_mask

    def _check(self, model) -> None:
        if getattr(model, "model_type", None) != "llada":
            raise ConfigError("asrd model", f"LladaBackend runs a LLaDA model, got {type(model).__name__}")
        if self.refresh_every != 1:
            raise ConfigError("asrd.refresh_every",
                              f"LLaDA has no anchor to reuse; refresh_every must be 1, got {self.refresh_every}")

    @torch.no_grad()
    def logits(self, ids: Tensor, delta: Tensor | None = None) -> Tensor:
        e = self._input_embeds(ids, delta)
        out = self.model(inputs_embeds=e, attention_mask=self._padding).float()
        out[..., self.mask_id] = float("-inf")
        self._advance(False)
        self._count_layers(self.model.n_layers)
        return out
