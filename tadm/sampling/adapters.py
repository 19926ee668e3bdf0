"""One call for every model: the network body, then its output head where the sampler reads.

    hidden = adapter.features(z_t, step, t)        # (B, L, d): the network up to the LM head
    logits = adapter.project(hidden, rows)         # (N, V+1) at rows: flat indices (N,) into (B, L), or a
                                                   # (B, L) bool mask; rows=None: (B, L, V+1)
    logits = adapter(z_t, step, t)                 # both, on every position

The samplers only ever see these calls. An adapter wraps a loaded model, puts it in eval mode,
owns the `ComputeCounter` that its hooks fill (only during the adapter's own calls), and keeps
whatever state the model carries across steps:

- `SingleNetworkAdapter`  any one-network model: hidden(z_t), then its head
- `MDLMAdapter`   MDLM(z_t)                                            (12 denoiser layers)
- `SEDDAdapter`   SEDD(z_t)    (its "analytic" sampler: tadm.sampling.sedd)
- `ADLMAdapter`   anchor + denoiser every step (12 + 6 layers; the anchor's own head runs on
                  every position, since the denoiser reads its distribution everywhere)
- `TADMAdapter`   Alg. 1: h = A(S(z_t)) when the refresh policy says so (cached in an
                  `AnchorCache`), then D(Phi(S(z_t), h)) every step (6 layers + the anchor's 12
                  once per refresh). `bypass_fusion=True` is the fusion ablation: the same cache
                  and policy, but D(h) every step (Phi and S(z_t) skipped, no weight changed), so
                  between refreshes the denoiser never sees the current canvas

LM head only where needed: the output projection (d x (V+1), about a quarter of a step's FLOPs
at the paper's size) is applied by `project` to the rows the sampler will read, the positions
it decodes this step; a decoded token is carried over and a position that stays masked does not
depend on x_theta, so nothing else is ever read (`tadm.sampling.loop`).

None of the models is time-conditioned; `t` is part of the call so a time-conditioned model
could be adapted without touching the samplers. `step` counts reverse steps from 0 over the
whole trajectory (all semi-AR blocks), and must not decrease within a trajectory.

ddpm_cache (MDLM's exact skip, see `tadm.sampling.loop`): the loop asks `can_reuse(z_t, step)`
before skipping the network (nothing to decode) or reusing the last hidden states for an
unchanged canvas. It is always exact for MDLM / ADLM. For TADM the last output D(Phi(S(z), h))
is what the model would return now only if the policy would *not* refresh at this step (same
canvas, same h), so `can_reuse` returns False exactly when a refresh is due; a skipped step
never touches the cache (no refresh, no age bookkeeping), so refreshes happen at the same
steps with and without ddpm_cache.

Host reads: whether a refresh is due can depend on the data (`AdaptiveDrift`). The loop asks
`due_flag(z_t, step)` first (a bool, or a 0-dim tensor it reads together with the rest of the
step's values, `tadm.sampling.loop`) and hands the answer back with `decide`; `can_reuse` and
`hidden` at that step then use it instead of reading the device again.

Pause and resume (`tadm.sampling.loop`, point 8): `state()` is what a paused trajectory keeps of
the adapter (TADM: a copy of its anchor cache; None for the stateless ones), `restore(state)`
takes it back after `start`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import torch
from torch import Tensor

from tadm.models import TadmModel
from tadm.registry import method_for
from tadm.sampling.anchor_cache import AnchorCache, FixedInterval, RefreshPolicy
from tadm.sampling.counters import ComputeCounter, instrument


class Adapter(abc.ABC):
    """Base adapter: counting, the reuse question and the per-trajectory reset."""

    model_type: str = ""

    def __init__(self, model: TadmModel):
        if self.model_type and model.model_type != self.model_type:
            raise ValueError(f"{type(self).__name__} needs a {self.model_type!r} model, got {model.model_type!r}")
        self.model = model.eval()
        self.mask_id: int = model.mask_id
        self.vocab_size: int = model.vocab_size
        self.counter = ComputeCounter()
        self._hooks = instrument(model, self.counter)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def start(self, total_steps: int) -> None:
        """Begin a new reverse trajectory of `total_steps` steps (drops per-trajectory state)."""

    def state(self) -> Any:
        """The per-trajectory state a paused trajectory keeps (`tadm.sampling.loop.Paused`); None
        for stateless models."""
        return None

    def restore(self, state: Any) -> None:
        """Take back `state()` after `start` (a resumed trajectory); `state` is not written."""

    def __call__(self, z_t: Tensor, step: int, t: float) -> Tensor:
        """Logits (B, L, V+1) for the canvas z_t (B, L) at reverse step `step`, time t."""
        return self.project(self.features(z_t, step, t))

    def features(self, z_t: Tensor, step: int, t: float) -> Tensor:
        """One network call (counted): the hidden states (B, L, d) that feed the output head."""
        self.counter.model_calls += 1
        with self.counter.counting():
            return self.hidden(z_t, step, t)

    def project(self, hidden: Tensor, rows: Tensor | None = None) -> Tensor:
        """The output head (counted) on every position, (B, L, V+1), or only at `rows`, (N, V+1):
        `rows` the flat indices (N,) into (B, L) (gathered without a host read), or a (B, L)
        bool mask (row-major order; boolean indexing reads the device)."""
        with self.counter.counting():
            if rows is None:
                return self.model.head(hidden)
            picked = hidden[rows] if rows.dtype == torch.bool else hidden.flatten(0, 1).index_select(0, rows)
            return self.model.head(picked.unsqueeze(0)).squeeze(0)

    @abc.abstractmethod
    def hidden(self, z_t: Tensor, step: int, t: float) -> Tensor:
        """The model call proper, up to the output head."""

    def can_reuse(self, z_t: Tensor, step: int) -> bool:
        """Whether the previous output, computed on this same canvas, is exactly what a call
        at `step` would return (ddpm_cache). True for stateless models."""
        return True

    def due_flag(self, z_t: Tensor, step: int) -> bool | Tensor:
        """Whether the model's state must be recomputed before serving `step` (TADM: an anchor
        refresh): a bool, or a 0-dim bool tensor when it depends on data the host has not read.
        False for stateless models. Pure."""
        return False

    def decide(self, z_t: Tensor, step: int, due: bool) -> None:
        """The host value of `due_flag(z_t, step)`, for `can_reuse` / `hidden` at this step."""

    @property
    def refresh_steps(self) -> list[int] | None:
        """Steps at which the anchor cache was refreshed this trajectory (None: no cache)."""
        return None

    def close(self) -> None:
        """Remove the counting hooks from the model."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self) -> "Adapter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SingleNetworkAdapter(Adapter):
    """Any model that is one network over the canvas, ``model.hidden(z_t)`` then ``model.head``
    (every layer booked as a denoiser layer); a new baseline of that shape uses it as it is."""

    def hidden(self, z_t: Tensor, step: int, t: float) -> Tensor:
        return self.model.hidden(z_t)


class MDLMAdapter(SingleNetworkAdapter):
    model_type = "mdlm"


class SEDDAdapter(SingleNetworkAdapter):
    """SEDD (absorbing): the same network as MDLM, so logits = SEDD(z_t) and the same counting;
    its sampler is "sedd-analytic" (or any MDLM one)."""

    model_type = "sedd"


class ADLMAdapter(Adapter):
    model_type = "adlm"

    def hidden(self, z_t: Tensor, step: int, t: float) -> Tensor:
        self.counter.anchor_calls += 1
        return self.model.hidden(z_t)


class TADMAdapter(Adapter):
    """Alg. 1 with a refresh policy; `refresh=None` is FixedInterval(1) (a fresh anchor every step).

    `bypass_fusion=True` (Table 2's "fusion bypassed" ablation): every step serves D(h) instead of
    D(Phi(S(z_t), h)) -- the cached anchor reused as is by the same denoiser, refreshed by the
    same policy (`TADM.denoise_hidden(..., fusion=False)`). Even at a refresh step (age 0) the
    fusion is skipped, so with K = 1 it still differs from TADM."""

    model_type = "tadm"

    def __init__(self, model: TadmModel, refresh: RefreshPolicy | None = None, bypass_fusion: bool = False):
        super().__init__(model)
        self.refresh = refresh if refresh is not None else FixedInterval(1)
        self.bypass_fusion = bool(bypass_fusion)
        self.policy: RefreshPolicy | None = None  # resolved for the run's T by start()
        self.cache = AnchorCache()
        self._decision: tuple[Tensor, int, bool] | None = None  # (canvas, step, due) from `decide`

    def start(self, total_steps: int) -> None:
        self.policy = self.refresh.resolve(total_steps)
        self.cache.clear()
        self._decision = None

    def state(self) -> AnchorCache:
        """A copy of the anchor cache (its tensors shared: the cache replaces them, never writes them)."""
        return _copy_cache(self.cache)

    def restore(self, state: AnchorCache) -> None:
        self.cache, self._decision = _copy_cache(state), None

    def shallow(self, z_t: Tensor) -> Tensor:
        """S(z_t): the shared network (the token embedding)."""
        return self.model.embed(z_t)

    def _policy(self) -> RefreshPolicy:
        if self.policy is None:
            raise RuntimeError("TADMAdapter.start(total_steps) must be called before sampling")
        return self.policy

    def due_flag(self, z_t: Tensor, step: int) -> bool | Tensor:
        return self._policy().due_flag(self.cache, step, z_t, self.shallow)

    def decide(self, z_t: Tensor, step: int, due: bool) -> None:
        self._decision = (z_t, step, bool(due))

    def _due(self, z_t: Tensor, step: int) -> bool:
        decision = self._decision
        if decision is not None and decision[0] is z_t and decision[1] == step:
            return decision[2]
        return self._policy().due(self.cache, step, z_t, self.shallow)

    def hidden(self, z_t: Tensor, step: int, t: float) -> Tensor:
        due, self._decision = self._due(z_t, step), None  # a decision serves one call: a refresh changes the cache
        if due:
            self.counter.anchor_calls += 1
            shallow = self.shallow(z_t) if self.policy.uses_shallow else None
            self.cache.store(self.model.anchor(z_t), step, z_t, shallow)
        h = self.cache.serve(step, self.policy.max_age)
        if self.bypass_fusion:
            return self.model.denoise_hidden(z_t, h, fusion=False)
        return self.model.denoise_hidden(z_t, h)

    def can_reuse(self, z_t: Tensor, step: int) -> bool:
        return not self._due(z_t, step)

    @property
    def refresh_steps(self) -> list[int]:
        return list(self.cache.refresh_steps)


def _copy_cache(cache: AnchorCache) -> AnchorCache:
    return dataclasses.replace(cache, refresh_steps=list(cache.refresh_steps), served_ages=list(cache.served_ages))


def make_adapter(model: TadmModel, refresh: RefreshPolicy | None = None, *, bypass_fusion: bool = False) -> Adapter:
    """The adapter for a loaded model, as its method's unit makes it (tadm.methods:
    `Method.adapter`); `refresh` (TADM only) is its anchor refresh policy and `bypass_fusion`
    (TADM only) samples D(h), the fusion skipped (`TADMAdapter`)."""
    return method_for(model.model_type).make_adapter(model, refresh, bypass_fusion=bypass_fusion)
