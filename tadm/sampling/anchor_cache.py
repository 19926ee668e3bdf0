"""Algorithm 1 (paper Sec. 3.3): the anchor cache and the policies that decide when to refresh it.

At reverse step i (0-based over the whole trajectory, i = 0..T-1) on canvas z_t:

    if policy.due(cache, i, z_t):  h <- A(S(z_t)); cache <- (h, i, z_t)        # refresh
    x_theta <- D(Phi(S(z_t), h))                                                # every step

The anchor served at step i was computed at step i' = cache.step on canvas z_t'; its *age* is
i - i'. Policies:

- `FixedInterval(K)`: refresh when age >= K, i.e. at steps 0, K, 2K, ... -> ceil(T/K) refreshes,
  served ages 0..K-1. K = 1 refreshes every step (no reuse).
- `BudgetSchedule({T: K})`: the K of a run is looked up from its step budget T (Table 2:
  K = {2, 2, 2, 8, 4, 4} for T = {128, ..., 4096}); `resolve(T)` returns the FixedInterval.
- `AdaptiveDrift(threshold, metric, max_age)` (beyond the paper): refresh when the canvas has
  drifted from the anchor's canvas by more than `threshold`:
      changed_fraction   = (1/L) sum_l [z_t^l != z_t'^l]
      shallow_distance   = ||S(z_t) - S(z_t')||_F / ||S(z_t')||_F   (S = the shared network;
                           the post-train fusion keeps the same reference C0 = S(z_t'), App. C.1)
  The anchor is one batched call, so the batch refreshes together: the drift is the maximum
  over the batch (no sequence is served an anchor that drifted past the threshold). `max_age`
  optionally also bounds the age like FixedInterval.

The cache itself checks the bound: `serve(step, max_age)` raises if the anchor is max_age or
more steps old, so a FixedInterval(K) run can never use an anchor older than K - 1 steps.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

from tadm.errors import ConfigError

# Table 2: anchor refresh interval K per sampling budget T.
PAPER_REFRESH_SCHEDULE: dict[int, int] = {128: 2, 256: 2, 512: 2, 1024: 8, 2048: 4, 4096: 4}


class StaleAnchorError(RuntimeError):
    """The cache was asked to serve an anchor older than its policy allows (a sampler bug)."""


@dataclass
class AnchorCache:
    """The cached anchor h_t' (B, L, d), the step it was computed at and the canvas it saw."""

    h: Tensor | None = None
    step: int | None = None
    canvas: Tensor | None = None  # z_t' (B, L)
    shallow: Tensor | None = None  # S(z_t') (B, L, d), kept only for policies that read it
    refresh_steps: list[int] = field(default_factory=list)
    served_ages: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.h is None

    def age(self, step: int) -> int:
        """Steps since the anchor was computed (0 at the refresh step)."""
        if self.step is None:
            raise StaleAnchorError("the anchor cache is empty")
        if step < self.step:
            raise StaleAnchorError(f"step {step} precedes the cached anchor's step {self.step}")
        return step - self.step

    def store(self, h: Tensor, step: int, canvas: Tensor, shallow: Tensor | None = None) -> None:
        """Refresh: h = A(S(canvas)) computed at `step`."""
        self.h, self.step, self.canvas, self.shallow = h, step, canvas.clone(), shallow
        self.refresh_steps.append(step)

    def serve(self, step: int, max_age: int | None = None) -> Tensor:
        """The cached anchor for `step`; raises StaleAnchorError if its age is >= max_age."""
        age = self.age(step)
        if max_age is not None and age >= max_age:
            raise StaleAnchorError(
                f"anchor from step {self.step} is {age} steps old at step {step} (limit {max_age - 1})"
            )
        self.served_ages.append(age)
        return self.h

    def clear(self) -> None:
        self.h = self.step = self.canvas = self.shallow = None
        self.refresh_steps, self.served_ages = [], []


ShallowFn = Callable[[Tensor], Tensor]


class RefreshPolicy(abc.ABC):
    """Decides at each step whether the anchor must be recomputed."""

    max_age: int | None = None  # the cache refuses to serve anchors this old
    uses_shallow: bool = False  # whether `due` reads S(z_t) (the cache then keeps S(z_t'))

    def resolve(self, total_steps: int) -> "RefreshPolicy":
        """The policy for a run of `total_steps` reverse steps (most policies: itself)."""
        return self

    @abc.abstractmethod
    def due(self, cache: AnchorCache, step: int, z_t: Tensor, shallow: ShallowFn) -> bool:
        """True when the anchor must be refreshed before serving step `step` on canvas z_t.
        Pure: it must not change the cache (ddpm_cache asks it without calling the model)."""

    def due_flag(self, cache: AnchorCache, step: int, z_t: Tensor, shallow: ShallowFn) -> bool | Tensor:
        """`due` without reading the device: a bool when the host knows the answer, else a
        0-dim bool tensor (the sampling loop reads it with the rest of the step's values)."""
        return self.due(cache, step, z_t, shallow)


class FixedInterval(RefreshPolicy):
    """Refresh when step - cached_step >= K (Alg. 1): ceil(T/K) refreshes, ages 0..K-1."""

    def __init__(self, K: int):
        if isinstance(K, bool) or not isinstance(K, int) or K < 1:
            raise ValueError(f"refresh interval K must be a positive integer, got {K!r}")
        self.K = self.max_age = K

    def __repr__(self) -> str:
        return f"FixedInterval(K={self.K})"

    @classmethod
    def parse(cls, k, key: str, what: str = "") -> "FixedInterval":
        """The policy of a settable ``refresh_every`` (ASRD's backends, TADM:Post-train, the
        feature cache): FixedInterval(k), or, unless k is an integer >= 1, a one-line
        ConfigError naming the params `key`, "<what> must be an integer >= 1, got <k>"."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(key, f"{what + ' ' if what else ''}must be an integer >= 1, got {k!r}")
        return cls(k)

    def due(self, cache: AnchorCache, step: int, z_t: Tensor, shallow: ShallowFn) -> bool:
        return cache.empty or self.stale(cache.age(step))

    def stale(self, age: int | None) -> bool:
        """The rule itself, for a cache that counts its own age: whether a state `age` steps old
        at this step (None: nothing cached) must be recomputed, age >= K. Every anchor and cache
        refresh by interval reads it: the samplers, TADM:Post-train, the training-free caches,
        ASRD's backends."""
        return age is None or age >= self.K


class BudgetSchedule(RefreshPolicy):
    """K looked up from the run's step budget T, e.g. Table 2's PAPER_REFRESH_SCHEDULE."""

    def __init__(self, table: Mapping[int, int] = PAPER_REFRESH_SCHEDULE):
        if not table:
            raise ValueError("BudgetSchedule needs at least one {T: K} entry")
        self.table = {int(T): int(K) for T, K in table.items()}
        for K in self.table.values():
            FixedInterval(K)  # validates K

    def __repr__(self) -> str:
        return f"BudgetSchedule({self.table})"

    @classmethod
    def from_config(cls, cfg) -> "BudgetSchedule":
        """From a SampleConfig: each budget's K by its T (sample.budgets)."""
        return cls({b.T: b.K for b in cfg.budgets})

    def interval(self, total_steps: int) -> int:
        if total_steps not in self.table:
            raise ValueError(f"no refresh interval for T = {total_steps}; budgets: {sorted(self.table)}")
        return self.table[total_steps]

    def resolve(self, total_steps: int) -> FixedInterval:
        return FixedInterval(self.interval(total_steps))

    def due(self, cache: AnchorCache, step: int, z_t: Tensor, shallow: ShallowFn) -> bool:
        raise RuntimeError("BudgetSchedule must be resolved for a step budget first: policy.resolve(T)")


class AdaptiveDrift(RefreshPolicy):
    """Refresh when the canvas drifted past `threshold` since the anchor's canvas (module doc)."""

    def __init__(self, threshold: float, metric: Literal["changed_fraction", "shallow_distance"] = "changed_fraction",
                 max_age: int | None = None):
        if metric not in ("changed_fraction", "shallow_distance"):
            raise ValueError(f"metric must be 'changed_fraction' or 'shallow_distance', got {metric!r}")
        if not threshold >= 0.0:
            raise ValueError(f"threshold must be >= 0, got {threshold!r}")
        if max_age is not None:
            FixedInterval(max_age)  # validates
        self.threshold, self.metric, self.max_age = float(threshold), metric, max_age
        self.uses_shallow = metric == "shallow_distance"

    def __repr__(self) -> str:
        return f"AdaptiveDrift(threshold={self.threshold}, metric={self.metric!r}, max_age={self.max_age})"

    def drift_tensor(self, cache: AnchorCache, z_t: Tensor, shallow: ShallowFn) -> Tensor:
        """The drift of the batch's most drifted sequence, a 0-dim float64 tensor on z_t's device
        (computed in float32, widened exactly)."""
        if self.metric == "changed_fraction":
            per_seq = (z_t != cache.canvas).float().mean(-1)
        else:
            ref = cache.shallow.float().flatten(1)
            per_seq = (shallow(z_t).float().flatten(1) - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)
        return per_seq.max().double()

    def drift(self, cache: AnchorCache, z_t: Tensor, shallow: ShallowFn) -> float:
        """The drift of the batch's most drifted sequence."""
        return float(self.drift_tensor(cache, z_t, shallow))

    def due_flag(self, cache: AnchorCache, step: int, z_t: Tensor, shallow: ShallowFn) -> bool | Tensor:
        if cache.empty:
            return True
        if self.max_age is not None and cache.age(step) >= self.max_age:
            return True
        return self.drift_tensor(cache, z_t, shallow) > self.threshold  # compared in float64

    def due(self, cache: AnchorCache, step: int, z_t: Tensor, shallow: ShallowFn) -> bool:
        return bool(self.due_flag(cache, step, z_t, shallow))
